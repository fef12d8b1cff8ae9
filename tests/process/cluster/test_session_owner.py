"""Sessions bound to their owner (issue #12; docs/security.md "Sessions and client ids").

alice (may read ``secret/#``) has a persistent session with a queued ``secret/x`` message; bob
(may read only ``public/#``) connects with alice's client id - on the same broker and on another
broker of the cluster, with and without clean start. The rule: bob's CONNECT is refused with
0x87 Not authorized (or, for a clean start on another broker that attached before the refusal
arrived, disconnected with 0x87); alice's session is untouched and she still gets her message.
Real broker processes, paho clients, a password file made by ``skipmq passwd`` and an ACL file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from paho.mqtt.properties import Properties

from tests.support.cluster import ClusterFactory, metric_total, unique_id, wait_until
from tests.support.interop_broker import REPO_ROOT, BrokerOptions, BrokerProcess
from tests.support.interop_clients import PahoClient, v5_props
from tools.launcher import LocalCluster

ACL = """\
user alice
topic readwrite secret/#
topic read public/#

user bob
topic read public/#
topic write public/#
"""
NOT_AUTHORIZED = 0x87


def _passwd(*args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "broker.auth.passwd", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def _auth_settings(workdir: Path) -> dict[str, str]:
    passwd = workdir / "passwd"
    _passwd("-c", "-b", "alice-pw", str(passwd), "alice")
    _passwd("-b", "bob-pw", str(passwd), "bob")
    acl = workdir / "acl"
    acl.write_text(ACL)
    return {
        "auth.allow_anonymous": "false",
        "auth.password_file": str(passwd),
        "auth.acl_file": str(acl),
    }


def _client(cluster: LocalCluster, index: int, user: str, client_id: str, **kwargs: object) -> PahoClient:
    broker = cluster.brokers[index]
    return PahoClient(
        broker.host,
        broker.mqtt_port,
        client_id=client_id,
        version=5,
        username=user,
        password=f"{user}-pw",
        **kwargs,  # type: ignore[arg-type]
    )


def _persistent() -> Properties:
    return v5_props(1, SessionExpiryInterval=300)  # 1 = CONNECT


@pytest.fixture
def auth_cluster(cluster_factory: ClusterFactory, tmp_path: Path) -> LocalCluster:
    return cluster_factory(2, settings=_auth_settings(tmp_path))


def _alice_with_queued_secret(cluster: LocalCluster) -> str:
    """alice's persistent session on broker 0 with one queued secret/x message; its client id."""
    client_id = unique_id("alice")
    alice = _client(cluster, 0, "alice", client_id, clean=False, connect_props=_persistent())
    alice.subscribe("secret/#", qos=1)
    alice.disconnect()
    publisher = _client(cluster, 0, "alice", unique_id("alice-pub"))
    publisher.publish("secret/x", b"for alice only", qos=1)
    publisher.close()
    return client_id


def test_bob_cannot_resume_alices_session_on_any_broker(auth_cluster: LocalCluster) -> None:
    client_id = _alice_with_queued_secret(auth_cluster)
    for index in (0, 1):  # the broker holding the session, and another broker of the cluster
        bob = _client(
            auth_cluster, index, "bob", client_id, clean=False, connect_props=_persistent(),
            expect_success=False,
        )  # fmt: skip
        assert bob.connack_reason is not None and bob.connack_reason.value == NOT_AUTHORIZED, (
            f"broker {index}: bob got {bob.connack_reason}"
        )
        bob.assert_no_message(0.5)
        bob.close()
    # a clean start from another broker attaches before the refusal arrives: then disconnected
    bob = _client(auth_cluster, 1, "bob", client_id, clean=True, expect_success=False)
    if bob.connack_reason is not None and not bob.connack_reason.is_failure:
        bob.wait_disconnected()
        assert bob.disconnect_reason is not None and bob.disconnect_reason.value == NOT_AUTHORIZED
    else:
        assert bob.connack_reason is not None and bob.connack_reason.value == NOT_AUTHORIZED
    bob.assert_no_message(0.5)
    bob.close()
    refused = wait_until(
        lambda: metric_total(auth_cluster.metrics_text(0), "skipmq_cluster_claims_refused_total") >= 2,
        10.0,
        what="broker 0 counted the refused claims",
    )
    assert refused
    # alice's session is intact: she resumes it on the other broker and gets her message
    alice = _client(auth_cluster, 1, "alice", client_id, clean=False, connect_props=_persistent())
    assert alice.session_present
    message = alice.wait_message()
    assert (message.topic, message.payload) == ("secret/x", b"for alice only")
    alice.close()
    log = auth_cluster.brokers[0].log_text()
    assert "session_owner_mismatch" in log


def test_queued_messages_are_checked_against_the_readers_acl_on_resume(tmp_path: Path) -> None:
    """A message queued while alice may read secret/# is not delivered after the ACL (re-read on
    SIGHUP) withdrew her read access: every delivery, queued ones included, is checked."""
    settings = _auth_settings(tmp_path)
    broker = BrokerProcess(
        tmp_path / "broker",
        BrokerOptions(
            allow_anonymous=False, password_file=settings["auth.password_file"],
            acl_file=settings["auth.acl_file"],
        ),
    ).start()  # fmt: skip
    try:
        client_id = unique_id("alice")

        def alice_client(cid: str, **kwargs: object) -> PahoClient:
            return PahoClient(
                broker.host, broker.port, client_id=cid, version=5, username="alice",
                password="alice-pw", **kwargs,  # type: ignore[arg-type]
            )  # fmt: skip

        alice = alice_client(client_id, clean=False, connect_props=_persistent())
        alice.subscribe("secret/#", qos=1)
        alice.subscribe("public/#", qos=1)
        alice.disconnect()
        publisher = alice_client(unique_id("alice-pub"))
        publisher.publish("secret/x", b"queued secret", qos=1)
        publisher.close()
        bob = PahoClient(broker.host, broker.port, version=5, username="bob", password="bob-pw")
        bob.publish("public/y", b"queued public", qos=1)
        bob.close()
        Path(settings["auth.acl_file"]).write_text(
            ACL.replace("topic readwrite secret/#", "topic write secret/#")
        )
        os.kill(broker.pid, signal.SIGHUP)
        broker.wait_log(lambda record: record.get("event") == "auth_reloaded", timeout_s=10.0)
        alice = alice_client(client_id, clean=False, connect_props=_persistent())
        assert alice.session_present
        message = alice.wait_message()
        assert (message.topic, message.payload) == ("public/y", b"queued public")
        alice.assert_no_message(0.5)
        alice.close()
    finally:
        broker.close()
