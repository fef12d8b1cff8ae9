"""No client writes the brokers' ``$SYS`` tree (docs/security.md "The $SYS tree").

A PUBLISH or a will from a client to ``$SYS`` or ``$SYS/...`` is dropped whatever the ACL says:
MQTT 3.1.1 clients get their normal acknowledgement (mosquitto drops them silently too), MQTT 5
clients PUBACK/PUBREC 0x87 Not authorized (MQTT 5 §3.4.2.1). Nothing is delivered or retained, so
no client can forge a broker's statistics for the dashboards that read them. The pipeline's
``$SYS/skipmq/analytics/...`` is the one client-writable subtree, governed by the ACL (SkipMQ only).

``test_clients_cannot_write_sys`` also runs against mosquitto (SKIPMQ_TEST_TARGET=mosquitto),
which behaves the same.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.interop_broker import IS_MOSQUITTO, REPO_ROOT, BrokerOptions, BrokerProcess
from tests.support.interop_clients import WAIT_S, PahoClient, Received, unique_id
from tests.support.interop_raw import RawClient
from tools.mqtt_raw import PUBREC, publish_packet

PahoFactory = Callable[..., PahoClient]
NOT_AUTHORIZED = 0x87
FORGED = b"forged"


class PubackCodes:
    """The reason code of every PUBACK/PUBCOMP a paho client gets, by message id (paho's on_publish)."""

    def __init__(self, client: PahoClient) -> None:
        self.codes: dict[int, int] = {}
        self._done = threading.Condition()
        client.client.on_publish = self._on_publish
        self._client = client

    def _on_publish(self, _client: Any, _userdata: Any, mid: int, reason: Any, _props: Any) -> None:
        with self._done:
            self.codes[mid] = reason.value if hasattr(reason, "value") else int(reason)
            self._done.notify_all()

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool = False) -> int:
        info = self._client.client.publish(topic, payload, qos, retain)
        with self._done:
            assert self._done.wait_for(lambda: info.mid in self.codes, WAIT_S), f"no ack for {topic}"
            return self.codes[info.mid]


def _collect_until(client: PahoClient, marker_topic: str) -> list[Received]:
    """Every message the client receives before the one on ``marker_topic`` (bounded)."""
    seen: list[Received] = []
    while True:
        message = client.wait_message()
        if message.topic == marker_topic:
            return seen
        seen.append(message)


def test_clients_cannot_write_sys(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    uid = unique_id("sys")
    forged_tree = f"$SYS/{uid}"
    marker = f"marker/{uid}"
    watcher = paho_factory(broker, version=5)
    for topic in ("$SYS/broker/version", f"{forged_tree}/#", marker, f"wills/{uid}"):
        assert watcher.subscribe(topic, 1)[0].value <= 1
    # a 3.1.1 attacker: acknowledged as usual, dropped
    v3 = paho_factory(broker, version=4)
    for qos in (0, 1, 2):
        v3.publish("$SYS/broker/version", FORGED, qos, retain=True)
        v3.publish(f"{forged_tree}/v3/{qos}", FORGED, qos, retain=True)
        v3.publish(forged_tree, FORGED, qos, retain=True)
    # an MQTT 5 attacker: PUBACK 0x87 (paho), PUBREC 0x87 (a raw client: paho ignores PUBREC codes)
    v5 = paho_factory(broker, version=5)
    acks = PubackCodes(v5)
    v5.client.publish("$SYS/broker/version", FORGED, 0, True)
    assert acks.publish("$SYS/broker/version", FORGED, 1, retain=True) == NOT_AUTHORIZED
    assert acks.publish(f"{forged_tree}/v5", FORGED, 1, retain=True) == NOT_AUTHORIZED
    with RawClient(broker.host, broker.port, level=5) as raw:
        assert raw.connect(unique_id("raw"))[1] == 0
        raw.send(publish_packet("$SYS/broker/uptime", FORGED, qos=2, packet_id=7, retain=True, level=5))
        rec = raw.read_packet()
    assert rec.ptype == PUBREC and int.from_bytes(rec.body[:2], "big") == 7
    assert rec.body[2] == NOT_AUTHORIZED, f"PUBREC reason {rec.body[2]:#x}, expected 0x87"
    # wills: one to $SYS (dropped), one to an ordinary topic (published: proves wills went out)
    sys_will = paho_factory(broker, version=4, will=(f"{forged_tree}/will", FORGED, 1, True))
    ok_will = paho_factory(broker, version=4, will=(f"wills/{uid}", b"gone", 1, False))
    sys_will.drop()
    ok_will.drop()
    seen = _collect_until(watcher, f"wills/{uid}")
    v5.publish(marker, b"end", 1)
    seen += _collect_until(watcher, marker)
    assert not [m for m in seen if m.payload == FORGED or m.topic.startswith(forged_tree)], seen
    # nothing retained: a new subscriber gets the broker's own values only
    late = paho_factory(broker, version=5)
    for topic in ("$SYS/broker/version", "$SYS/broker/uptime", forged_tree, f"{forged_tree}/#"):
        late.subscribe(topic, 1)
    v5.publish(f"{marker}/late", b"end", 1, retain=True)
    late.subscribe(f"{marker}/late", 1)
    retained = _collect_until(late, f"{marker}/late")
    assert not [m for m in retained if m.payload == FORGED or m.topic.startswith(forged_tree)], retained
    if not IS_MOSQUITTO:
        # the pipeline's findings subtree stays writable (no ACL: every topic is)
        code = acks.publish(f"$SYS/skipmq/analytics/{uid}", b'{"ok":1}', 1, retain=True)
        assert code < 0x80, f"analytics publish refused: {code:#x}"
        late.subscribe(f"$SYS/skipmq/analytics/{uid}", 1)
        assert late.wait_message().payload == b'{"ok":1}'


ACL = """\
user pipeline
topic write $SYS/skipmq/analytics/#

user bob
topic readwrite $SYS/#

user carol
topic readwrite #
topic read $SYS/#
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


@pytest.fixture
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    workdir = tmp_path_factory.mktemp("sys-acl")
    passwd = workdir / "passwd"
    _passwd("-c", "-b", "pipeline-pw", str(passwd), "pipeline")
    _passwd("-b", "bob-pw", str(passwd), "bob")
    _passwd("-b", "carol-pw", str(passwd), "carol")
    (workdir / "acl").write_text(ACL)
    opts = BrokerOptions(allow_anonymous=False, password_file=str(passwd), acl_file=str(workdir / "acl"))
    proc = BrokerProcess(workdir / "broker", opts).start()
    yield proc
    proc.close()


@pytest.mark.skipif(IS_MOSQUITTO, reason="the analytics subtree is SkipMQ's (mosquitto refuses all of $SYS)")
def test_analytics_subtree_follows_the_acl(acl_broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    """Only an explicit ACL grant opens ``$SYS/skipmq/analytics/...``; no grant opens the rest."""
    uid = unique_id("findings")
    topic = f"$SYS/skipmq/analytics/{uid}"
    clients = {
        name: paho_factory(acl_broker, version=5, username=name, password=f"{name}-pw")
        for name in ("pipeline", "bob", "carol")
    }
    acks = {name: PubackCodes(client) for name, client in clients.items()}
    assert acks["carol"].publish(topic, b"carol", 1, retain=True) == NOT_AUTHORIZED  # '#' is not '$'
    assert acks["bob"].publish("$SYS/broker/uptime", FORGED, 1, retain=True) == NOT_AUTHORIZED
    assert acks["pipeline"].publish("$SYS/broker/version", FORGED, 1, retain=True) == NOT_AUTHORIZED
    assert acks["bob"].publish(topic, b"bob", 1, retain=True) < 0x80  # granted by $SYS/#
    assert acks["pipeline"].publish(topic, b"pipeline", 1, retain=True) < 0x80
    reader = clients["carol"]
    reader.subscribe(topic, 1)
    assert reader.wait_message().payload == b"pipeline"
    reader.subscribe("$SYS/broker/uptime", 1)
    assert reader.wait_message().payload != FORGED
