"""Authentication and ACL (SkipMQ only): password file made with `python -m broker.auth.passwd -b`,
anonymous off, mosquitto-style acl_file.

Follows MQTT 3.1.1 §3.1.3.4-5 + §3.2.2.3 (CONNACK 4 bad user name or password / 5 not authorized)
and MQTT 5 §3.2.2.2 (0x86/0x87), §3.4.2.1 (PUBACK 0x87 not authorized), §3.9.3 (SUBACK 0x87;
3.1.1 SUBACK 0x80), and the ACL rules of the core prompt (v3 / QoS0 publishes that are denied
are dropped silently; the ack is still sent).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.interop_broker import IS_MOSQUITTO, REPO_ROOT, BrokerOptions, BrokerProcess
from tests.support.interop_clients import PahoClient, unique_id
from tests.support.interop_raw import RawClient
from tools.mqtt_raw import PUBACK, publish_packet

pytestmark = pytest.mark.skipif(
    IS_MOSQUITTO, reason="uses SkipMQ's password tool (skipmq passwd) and its ACL reason codes"
)
PahoFactory = Callable[..., PahoClient]

ACL = """\
# anonymous clients: nothing (anonymous is off anyway)
user alice
topic readwrite alice/#
topic read public/#

user bob
topic write public/#
topic read bob/#
topic write alice/inbox

pattern readwrite clients/%c/#
"""


def _passwd(*args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "broker.auth.passwd", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, f"broker.auth.passwd {args} failed: {result.stderr}"


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    workdir = tmp_path_factory.mktemp("auth")
    passwd = workdir / "passwd"
    _passwd("-c", "-b", "alice-pw", str(passwd), "alice")
    _passwd("-b", "bob-pw", str(passwd), "bob")
    acl = workdir / "acl"
    acl.write_text(ACL)
    opts = BrokerOptions(allow_anonymous=False, password_file=str(passwd), acl_file=str(acl))
    proc = BrokerProcess(workdir / "broker", opts).start()
    yield proc
    proc.close()


def test_password_file_written_by_cli(tmp_path: Path) -> None:
    passwd = tmp_path / "pw"
    _passwd("-c", "-b", "secret", str(passwd), "carol")
    line = passwd.read_text().strip()
    assert line.startswith("carol:$") and "secret" not in line


@pytest.mark.parametrize("version", [4, 5])
def test_bad_password_refused(auth_broker: BrokerProcess, version: int) -> None:
    with RawClient(auth_broker.host, auth_broker.port, level=version) as raw:
        _, rc, _ = raw.connect(unique_id("bad"), username="alice", password=b"wrong")
        raw.read_until_closed(3.0)
    if version == 5:
        assert rc == 0x86
    else:  # 4 = bad user name or password, 5 = not authorized; both are a refusal in 3.1.1
        assert rc in (4, 5)


@pytest.mark.parametrize("version", [4, 5])
def test_anonymous_refused_when_disabled(auth_broker: BrokerProcess, version: int) -> None:
    with RawClient(auth_broker.host, auth_broker.port, level=version) as raw:
        _, rc, _ = raw.connect(unique_id("anon"))
        raw.read_until_closed(3.0)
    assert rc in ((0x86, 0x87) if version == 5 else (4, 5))


def test_unknown_user_refused(auth_broker: BrokerProcess) -> None:
    with RawClient(auth_broker.host, auth_broker.port, level=5) as raw:
        _, rc, _ = raw.connect(unique_id("who"), username="mallory", password=b"alice-pw")
    assert rc in (0x86, 0x87)


def test_good_password_and_acl_allowed_flow(auth_broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    alice = paho_factory(auth_broker, version=5, username="alice", password="alice-pw")
    bob = paho_factory(auth_broker, version=5, username="bob", password="bob-pw")
    assert alice.subscribe("public/#", 1)[0].value == 1
    bob.publish("public/news", b"hello", 1)
    assert alice.wait_message().payload == b"hello"


@pytest.mark.parametrize("version", [4, 5])
def test_subscribe_denied(auth_broker: BrokerProcess, paho_factory: PahoFactory, version: int) -> None:
    bob = paho_factory(auth_broker, version=version, username="bob", password="bob-pw")
    codes = bob.subscribe("alice/#", 1)
    assert codes[0].value == (0x87 if version == 5 else 0x80)
    # a read rule "bob/#" covers a narrower filter, but not a wider one
    assert bob.subscribe("bob/+/x", 1)[0].value == 1
    assert bob.subscribe("#", 1)[0].value == (0x87 if version == 5 else 0x80)


def test_publish_denied_v5_puback_0x87(auth_broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    bob = paho_factory(auth_broker, version=5, username="bob", password="bob-pw")
    bob.subscribe("bob/#", 1)
    with RawClient(auth_broker.host, auth_broker.port, level=5) as raw:
        assert raw.connect(unique_id("alice"), username="alice", password=b"alice-pw")[1] == 0
        raw.send(publish_packet("bob/private", b"intrusion", qos=1, packet_id=9, level=5))
        ack = raw.read_packet()
    assert ack.ptype == PUBACK and int.from_bytes(ack.body[:2], "big") == 9
    assert ack.body[2] == 0x87, f"PUBACK reason {ack.body[2]:#x}, expected 0x87 not authorized"
    bob.assert_no_message(0.5)


def test_publish_denied_v311_acked_and_dropped(auth_broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    bob = paho_factory(auth_broker, version=5, username="bob", password="bob-pw")
    bob.subscribe("bob/#", 1)
    alice = paho_factory(auth_broker, version=4, username="alice", password="alice-pw")
    alice.publish("bob/private", b"intrusion", 1)  # acknowledged (paho waits for PUBACK) ...
    bob.assert_no_message(0.6)  # ... but not delivered


def test_delivery_checked_with_read_rights(auth_broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    """bob may write alice/inbox; alice (readwrite alice/#) gets it."""
    alice = paho_factory(auth_broker, version=5, username="alice", password="alice-pw")
    alice.subscribe("alice/#", 1)
    paho_factory(auth_broker, version=5, username="bob", password="bob-pw").publish("alice/inbox", b"mail", 1)
    assert alice.wait_message().payload == b"mail"


def test_pattern_with_client_id(auth_broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    cid = unique_id("pat")
    me = paho_factory(auth_broker, client_id=cid, version=5, username="alice", password="alice-pw")
    assert me.subscribe(f"clients/{cid}/#", 1)[0].value == 1
    assert me.subscribe("clients/someone-else/#", 1)[0].value == 0x87
    me.publish(f"clients/{cid}/state", b"mine", 1)
    assert me.wait_message().payload == b"mine"
