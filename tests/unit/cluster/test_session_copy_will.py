"""The will, the session expiry and the QoS 2 state in a replicated session copy (docs/cluster.md,
Replicas; ``SessionSnapshot.will`` / ``will_fire_at`` / ``disconnected_at``; issue #34).

Real brokers and real MQTT clients: broker A's session is exported as a replica holder gets it
(``export_session``), goes through the replica store's own encoding (``skipmq.v1.SessionReplica``
in a real SQLite file, ``SqliteReplicaStore``), and is adopted by broker B as a holder adopts a gone
home's copy (``receive_late_session(..., adopted=True)``). B publishes the will after its delay
unless the client reconnects first (MQTT-3.1.3-9), runs the session expiry from when the client
left A, and completes the client's QoS 2 flows from A without delivering anything twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from broker.adapters.replication_store import SqliteReplicaStore
from broker.adapters.server import ThreadedBroker
from broker.adapters.sqlite_store import Store
from broker.cluster.messages import StreamPosition
from broker.core.messages import STATE_PUBREL_SENT, SessionSnapshot
from broker.mqtt.packets import MQTT_5, Pubcomp, Publish, Pubrec, Pubrel, ReasonCode, Will
from tests.support.core import RawClient, start_broker, wait_for

__all__ = ["start_broker"]  # the fixture
Start = Callable[..., ThreadedBroker]

WILL_TOPIC = "status/dev-1"


def _through_replica_store(tmp_path: Path, snapshot: SessionSnapshot) -> SessionSnapshot:
    """What a holder keeps on its disk and adopts: the snapshot through ``SqliteReplicaStore``."""
    store = Store(str(tmp_path / "holder.db"))
    try:
        replicas = SqliteReplicaStore(store)
        positions = (StreamPosition("a/1", "status", 7),)
        replicas.persist_session(("a", "1"), snapshot.client_id, snapshot, positions)
        store.commit()
        [(key, held, held_positions)] = replicas.load_sessions()
    finally:
        store.close()
    assert key == ("a", "1") and held_positions == positions
    return held


def _export(threaded: ThreadedBroker, client_id: str) -> SessionSnapshot:
    snapshot = threaded.call(lambda: threaded.broker.export_session(client_id))
    assert snapshot is not None
    return snapshot


def _adopt(threaded: ThreadedBroker, snapshot: SessionSnapshot) -> None:
    threaded.call(lambda: threaded.broker.receive_late_session(snapshot, adopted=True))


def _watcher(threaded: ThreadedBroker) -> RawClient:
    watcher = RawClient(threaded.ports["tcp"], MQTT_5)
    watcher.connect("watcher")
    watcher.subscribe("status/#", 1)
    return watcher


def _device(threaded: ThreadedBroker, delay_s: int, expiry_s: int = 600) -> RawClient:
    device = RawClient(threaded.ports["tcp"], MQTT_5)
    will = Will(
        WILL_TOPIC, b"offline", 1, False, {"will_delay_interval": delay_s, "content_type": "text/plain"}
    )
    connack = device.connect(
        "dev-1", clean=False, will=will, properties={"session_expiry_interval": expiry_s}
    )
    assert connack.reason_code == 0
    return device


def test_the_will_and_its_delay_survive_the_replica_store(start_broker: Start, tmp_path: Path) -> None:
    a = start_broker(tmp_path / "a")
    device = _device(a, delay_s=3)
    wait_for(lambda: a.call(lambda: "dev-1" in a.broker.sessions), what="the session on A")
    connected = _through_replica_store(tmp_path, _export(a, "dev-1"))
    assert connected.will is not None
    assert (connected.will.topic, connected.will.payload, connected.will.qos) == (WILL_TOPIC, b"offline", 1)
    assert connected.will.properties == {"will_delay_interval": 3, "content_type": "text/plain"}
    assert connected.will_fire_at is None and connected.disconnected_at is None  # still connected
    device.close()  # the network connection is lost (no DISCONNECT): the delay runs on A
    wait_for(lambda: _export(a, "dev-1").will_fire_at is not None, what="the delayed will on A")
    left = _through_replica_store(tmp_path, _export(a, "dev-1"))
    assert left.will == connected.will
    assert left.disconnected_at is not None and left.will_fire_at is not None
    assert abs(left.will_fire_at - (left.disconnected_at + 3)) < 0.01
    device = RawClient(a.ports["tcp"], MQTT_5)
    device.connect("dev-1", clean=False, properties={"session_expiry_interval": 600})
    device.disconnect()  # a normal DISCONNECT: no will, and the copy says so
    wait_for(lambda: _export(a, "dev-1").disconnected_at is not None, what="the normal disconnect on A")
    assert _through_replica_store(tmp_path, _export(a, "dev-1")).will is None


def test_the_adopter_publishes_the_will_once_after_its_delay(start_broker: Start, tmp_path: Path) -> None:
    """The device was connected to A when A was lost: the adopter B starts the delay at the
    adoption (the connection's end is not known more precisely) and publishes the will once."""
    a = start_broker(tmp_path / "a")
    b = start_broker(tmp_path / "b")
    device = _device(a, delay_s=2)
    wait_for(lambda: a.call(lambda: "dev-1" in a.broker.sessions), what="the session on A")
    copy = _through_replica_store(tmp_path, _export(a, "dev-1"))
    a.stop()  # A is gone with the device's connection (its own store keeps the will: not B's concern)
    device.close()
    watcher = _watcher(b)
    adopted_at = time.monotonic()
    _adopt(b, copy)
    watcher.expect_nothing(1.2)  # within the delay: no will
    will = watcher.expect_publish(timeout_s=10)
    waited_s = time.monotonic() - adopted_at
    assert (will.topic, will.payload, will.qos) == (WILL_TOPIC, b"offline", 1)
    assert will.properties.get("content_type") == "text/plain"
    assert waited_s >= 1.9, f"the will came {waited_s:.2f} s after the adoption, before its 2 s delay"
    watcher.ack(will)
    watcher.expect_nothing(1.0)  # once
    # the session itself stays (expiry 600 s) and the device resumes it at B
    device = RawClient(b.ports["tcp"], MQTT_5)
    assert device.connect("dev-1", clean=False, properties={"session_expiry_interval": 600}).session_present


def test_a_reconnect_within_the_delay_cancels_the_adopted_will(start_broker: Start, tmp_path: Path) -> None:
    a = start_broker(tmp_path / "a")
    b = start_broker(tmp_path / "b")
    device = _device(a, delay_s=2)
    wait_for(lambda: a.call(lambda: "dev-1" in a.broker.sessions), what="the session on A")
    copy = _through_replica_store(tmp_path, _export(a, "dev-1"))
    a.stop()
    device.close()
    watcher = _watcher(b)
    _adopt(b, copy)
    device = RawClient(b.ports["tcp"], MQTT_5)
    assert device.connect("dev-1", clean=False, properties={"session_expiry_interval": 600}).session_present
    watcher.expect_nothing(3.5)  # past the delay: no will (MQTT-3.1.3-9)
    device.close()  # this connection's own will: none (the reconnect's CONNECT had none)
    watcher.expect_nothing(0.5)


def test_the_adopted_session_expires_from_when_its_client_left(start_broker: Start, tmp_path: Path) -> None:
    """Expiry 4 s and a will delay of 60 s (capped at the expiry): the device leaves A at t0, B
    adopts the copy at about t0 + 2.5 s; the session ends (and the will goes) at t0 + 4 s, not 4 s
    after the adoption."""
    a = start_broker(tmp_path / "a")
    b = start_broker(tmp_path / "b")
    device = _device(a, delay_s=60, expiry_s=4)
    device.close()
    left_at = time.monotonic()
    wait_for(lambda: _export(a, "dev-1").will_fire_at is not None, what="the delayed will on A")
    copy = _through_replica_store(tmp_path, _export(a, "dev-1"))
    a.stop()  # A's delayed will stays in its store: A is gone
    watcher = _watcher(b)
    time.sleep(max(0.0, left_at + 2.5 - time.monotonic()))  # the holder adopts later
    _adopt(b, copy)
    assert b.call(lambda: "dev-1" in b.broker.sessions)
    will = watcher.expect_publish(timeout_s=10)
    ended_s = time.monotonic() - left_at
    assert will.topic == WILL_TOPIC
    assert ended_s < 5.5, (
        f"the will came {ended_s:.2f} s after the client left: the expiry ran from the adoption"
    )
    wait_for(lambda: b.call(lambda: "dev-1" not in b.broker.sessions), what="the session ended on B")
    watcher.ack(will)
    watcher.expect_nothing(0.5)


def test_the_adopter_completes_the_clients_qos2_flows_without_delivering_twice(
    start_broker: Start, tmp_path: Path
) -> None:
    """Incoming: the device's QoS 2 PUBLISH got its PUBREC on A (delivered there), no PUBREL yet.
    Outgoing: A's QoS 2 message to the device got its PUBREC, A sent PUBREL, no PUBCOMP yet. At
    the adopter B the device resends its PUBLISH (dup) - B answers PUBREC and routes nothing -
    then PUBREL, answered with PUBCOMP 0x00 (not 0x92, packet identifier not found); B sends the
    PUBREL again on the reconnect, never the message (MQTT-4.3.3, MQTT-4.4.0-1)."""
    a = start_broker(tmp_path / "a")
    b = start_broker(tmp_path / "b")
    device = RawClient(a.ports["tcp"], MQTT_5)
    device.connect("dev-1", clean=False, properties={"session_expiry_interval": 600})
    device.subscribe("cmd/#", 2)
    sender = RawClient(a.ports["tcp"], MQTT_5)
    sender.connect("sender")
    sender.publish_acked("cmd/reboot", b"once", 2, packet_id=3)
    delivered = device.expect_publish()
    assert delivered.payload == b"once" and delivered.packet_id is not None
    device.send(Pubrec(delivered.packet_id))
    assert device.take(Pubrel).packet_id == delivered.packet_id  # no PUBCOMP: PUBREL pending on A
    device.publish("up/reading", b"42", 2, packet_id=7)
    assert device.take(Pubrec).packet_id == 7  # no PUBREL: the id is received-not-released on A

    def settled() -> bool:
        snapshot = _export(a, "dev-1")
        return 7 in snapshot.incoming_qos2 and any(
            e.packet_id == delivered.packet_id for e in snapshot.pending
        )

    wait_for(settled, what="A's QoS 2 state")
    copy = _through_replica_store(tmp_path, _export(a, "dev-1"))
    assert copy.incoming_qos2 == {7}
    [entry] = copy.pending
    assert (entry.packet_id, entry.state, entry.message.payload) == (
        delivered.packet_id,
        STATE_PUBREL_SENT,
        b"once",
    )
    a.stop()
    device.close()
    watcher = RawClient(b.ports["tcp"], MQTT_5)
    watcher.connect("watcher")
    watcher.subscribe("up/#", 2)
    _adopt(b, copy)
    device = RawClient(b.ports["tcp"], MQTT_5)
    assert device.connect("dev-1", clean=False, properties={"session_expiry_interval": 600}).session_present
    pubrel = device.recv()
    assert isinstance(pubrel, Pubrel) and pubrel.packet_id == delivered.packet_id, pubrel
    device.send(Pubcomp(delivered.packet_id))
    device.publish("up/reading", b"42", 2, packet_id=7, dup=True)
    assert device.take(Pubrec).packet_id == 7
    device.send(Pubrel(7))
    pubcomp = device.take(Pubcomp)
    assert (pubcomp.packet_id, pubcomp.reason_code) == (7, ReasonCode.SUCCESS)
    device.expect_nothing(0.5)  # the command is not delivered again
    watcher.expect_nothing(0.5)  # the reading is not routed again
    assert not any(isinstance(p, Publish) for p in device.pending)
