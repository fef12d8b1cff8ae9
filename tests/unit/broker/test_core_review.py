"""Review tests for the broker core: MQTT 3.1.1 / 5.0 normative statements and the durability promise.

Each test reproduces one suspected defect (or pins down one checked behaviour) with real sockets
against a real in-process broker (``ThreadedBroker``, SQLite store in a temporary directory).
Store failures are produced by making a SQLite statement (``COMMIT``, an ``INSERT``) fail the way
a full disk does (the transaction is rolled back and an ``sqlite3.OperationalError`` raised), so
the store's and the broker's own failure handling runs. To put two clients' packets into one
event-loop iteration (before the group commit scheduled for the end of it), a test briefly blocks
the broker's loop thread.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.adapters.server import ThreadedBroker
from broker.mqtt import codec
from broker.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Will,
)
from tests.support.core import MQTT_3_1_1, MQTT_5, RawClient, start_broker, wait_for, wait_store_idle

__all__ = ["start_broker"]
Start = Callable[..., ThreadedBroker]


class _FailingDb:
    """Wraps the store's sqlite3 connection: the next ``failures`` statements starting with
    ``statement`` fail the way a full disk makes them fail (the transaction is rolled back)."""

    def __init__(self, db: sqlite3.Connection, statement: str, failures: int, skip: int) -> None:
        self._db = db
        self.statement = statement
        self.failures = failures
        self.skip = skip

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith(self.statement) and self.skip > 0:
            self.skip -= 1
        elif sql.startswith(self.statement) and self.failures > 0:
            self.failures -= 1
            self._db.execute("ROLLBACK")  # what SQLite does on SQLITE_FULL / SQLITE_IOERR
            raise sqlite3.OperationalError("database or disk is full (injected)")
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def fail_next(threaded: ThreadedBroker, statement: str = "COMMIT", failures: int = 2, skip: int = 0) -> None:
    """Make the ``failures`` store statements starting with ``statement`` after the next ``skip``
    ones fail. The broker retries a failed commit once (after rewriting the store from memory),
    so two COMMIT failures make a group commit fail for good. Installed once the store is idle
    (``wait_store_idle``: an earlier step's commit running late would take the failures)."""

    wait_store_idle(threaded)

    def install() -> None:
        store = threaded.broker.store
        assert store is not None
        store._db = _FailingDb(store._db, statement, failures, skip)

    threaded.call(install)


def block_loop(threaded: ThreadedBroker, seconds: float) -> None:
    """Keep the broker's loop busy so packets sent meanwhile are all handled in one iteration."""
    threaded.loop.call_soon_threadsafe(time.sleep, seconds)
    time.sleep(0.05)


def dropped(threaded: ThreadedBroker) -> dict[str, int]:
    return dict(threaded.call(lambda: dict(threaded.broker.stats.messages_dropped)))


def publish_bytes(topic: str, payload: bytes, qos: int) -> bytes:
    """An encoded MQTT 3.1.1 PUBLISH with packet id 9 (to glue a malformed packet behind it)."""
    return codec.encode(Publish(topic, payload, qos=qos, packet_id=9), MQTT_3_1_1)


def puback_code(client: RawClient, topic: str, payload: bytes, packet_id: int) -> int:
    ack = client.publish_acked(topic, payload, 1, packet_id=packet_id)
    assert isinstance(ack, Puback)
    return ack.reason_code


def persistent_subscriber(port: int, client_id: str, topic_filter: str, qos: int = 1) -> None:
    """Create a persistent (clean session 0) 3.1.1 subscription and go offline."""
    sub = RawClient(port)
    assert sub.connect(client_id, clean=False).reason_code == 0
    sub.subscribe(topic_filter, qos)
    sub.disconnect()


# ============================================================ durability: acks and the group commit
def test_takeover_does_not_release_deferred_acks_before_the_group_commit(start_broker: Start) -> None:
    """A takeover in the same loop iteration as a PUBLISH must not send its PUBACK before the commit.

    The PUBACK of a message that went into a persistent queue may only be sent after the commit
    that made it durable; here that commit fails, so the publisher must never see a PUBACK.
    """
    threaded = start_broker()
    port = threaded.ports["tcp"]
    persistent_subscriber(port, "tk-sub", "tk/t")
    pub = RawClient(port)
    assert pub.connect("tk-pub").reason_code == 0
    thief = RawClient(port)
    fail_next(threaded)
    block_loop(threaded, 0.6)
    pub.publish("tk/t", b"must-not-be-acked", 1, packet_id=5)
    time.sleep(0.1)
    thief.send(Connect(client_id="tk-pub", keep_alive_s=60))
    packets = pub.read_until_closed()
    assert not [p for p in packets if isinstance(p, Puback)], packets
    assert thief.expect(Connack).reason_code == 0


def test_protocol_error_after_publish_sends_ack_only_after_commit(start_broker: Start) -> None:
    """PUBLISH followed by a malformed packet in one read: the PUBACK still waits for the commit."""
    threaded = start_broker()
    port = threaded.ports["tcp"]
    persistent_subscriber(port, "pe-sub", "pe/t")
    ok = RawClient(port)
    assert ok.connect("pe-pub-ok").reason_code == 0
    ok.send_bytes(publish_bytes("pe/t", b"durable", 1) + b"\x00\x00")
    packets = ok.read_until_closed()
    assert [p.packet_id for p in packets if isinstance(p, Puback)] == [9]  # commit succeeded: acked

    bad = RawClient(port)
    assert bad.connect("pe-pub-bad").reason_code == 0
    fail_next(threaded)
    bad.send_bytes(publish_bytes("pe/t", b"lost-commit", 1) + b"\x00\x00")
    packets = bad.read_until_closed()
    assert not [p for p in packets if isinstance(p, Puback)], packets


def test_qos2_resent_after_failed_commit_is_stored_again(start_broker: Start, tmp_path: Path) -> None:
    """A failed commit rolls back the QoS 2 message and its packet id; the re-sent PUBLISH must be
    routed and stored again, otherwise its PUBREC acknowledges a message that is not durable."""
    data_dir = tmp_path / "q2"
    threaded = start_broker(data_dir)
    port = threaded.ports["tcp"]
    persistent_subscriber(port, "q2-sub", "q2/t", qos=2)
    pub = RawClient(port)
    assert pub.connect("q2-pub", clean=False).reason_code == 0
    fail_next(threaded)
    pub.publish("q2/t", b"exactly-once", 2, packet_id=7)
    packets = pub.read_until_closed()
    assert not [p for p in packets if isinstance(p, Pubrec)], packets
    again = RawClient(port)
    assert again.connect("q2-pub", clean=False).session_present
    again.publish("q2/t", b"exactly-once", 2, packet_id=7, dup=True)
    assert again.take(Pubrec).packet_id == 7
    again.send(Pubrel(7))
    assert again.take(Pubcomp).packet_id == 7
    again.disconnect()
    threaded.stop()

    restarted = start_broker(data_dir)
    sub = RawClient(restarted.ports["tcp"])
    assert sub.connect("q2-sub", clean=False).session_present
    message = sub.expect_publish()
    assert (message.payload, message.qos) == (b"exactly-once", 2)
    sub.ack(message)
    sub.expect_nothing(0.3)


# ============================================================ message expiry, drop accounting
def test_expired_message_not_delivered_to_v311_subscriber(start_broker: Start) -> None:
    """MQTT-3.3.2-5: an expired message is deleted for every subscriber, MQTT 3.1.1 ones too."""
    threaded = start_broker()
    port = threaded.ports["tcp"]
    persistent_subscriber(port, "ex-sub", "ex/#")
    pub = RawClient(port, MQTT_5)
    assert pub.connect("ex-pub").reason_code == 0
    pub.publish_acked("ex/short", b"expires", 1, properties={"message_expiry_interval": 1})
    pub.publish_acked("ex/long", b"stays", 1, packet_id=2, properties={"message_expiry_interval": 60})
    time.sleep(2.1)
    sub = RawClient(port)
    assert sub.connect("ex-sub", clean=False).session_present
    message = sub.expect_publish()
    assert message.payload == b"stays"
    sub.ack(message)
    sub.expect_nothing(0.3)
    assert dropped(threaded).get("expired") == 1


def test_queue_overflow_is_not_also_counted_as_no_subscribers(start_broker: Start) -> None:
    """A message dropped because the only subscriber's queue is full is counted once (queue_full_new),
    and a v5 publisher is not told "no matching subscribers" (0x10) when one matched."""
    threaded = start_broker(limits__max_queued_messages=1, limits__queue_overflow="drop_new")
    port = threaded.ports["tcp"]
    persistent_subscriber(port, "of-sub", "of/t")
    before = dropped(threaded)
    pub = RawClient(port, MQTT_5)
    assert pub.connect("of-pub").reason_code == 0
    assert puback_code(pub, "of/t", b"queued", 1) == 0
    assert puback_code(pub, "of/t", b"overflow", 2) == 0
    assert puback_code(pub, "of/none", b"nobody", 3) == 0x10
    after = dropped(threaded)
    assert after.get("queue_full_new", 0) - before.get("queue_full_new", 0) == 1
    assert after.get("no_subscribers", 0) - before.get("no_subscribers", 0) == 1


# ============================================================ shared subscriptions
def test_shared_member_leaving_hands_its_unacked_messages_to_the_group(start_broker: Start) -> None:
    """MQTT 5 §4.8.2: if the chosen member's session ends before it acknowledged a QoS 1 message,
    the Server SHOULD send it to another member of the shared subscription."""
    threaded = start_broker()
    port = threaded.ports["tcp"]
    first = RawClient(port, MQTT_5)
    assert first.connect("sh-a").reason_code == 0
    first.subscribe("$share/g/sh/t", 1)
    second = RawClient(port, MQTT_5)
    assert second.connect("sh-b").reason_code == 0
    second.subscribe("$share/g/sh/t", 1)
    pub = RawClient(port)
    assert pub.connect("sh-pub").reason_code == 0
    pub.publish_acked("sh/t", b"m1", 1, packet_id=1)
    pub.publish_acked("sh/t", b"m2", 1, packet_id=2)
    got_first = first.expect_publish()  # round robin: one each; sh-a never acknowledges
    got_second = second.expect_publish()
    second.ack(got_second)
    assert {got_first.payload, got_second.payload} == {b"m1", b"m2"}
    first.close()  # clean session: its session ends with the message unacknowledged
    handed = second.expect_publish()
    assert handed.payload == got_first.payload
    second.ack(handed)
    second.expect_nothing(0.3)


# ============================================================ connection limit
def test_connection_limit_still_allows_takeover_of_own_client_id(start_broker: Start) -> None:
    """At max_connections a reconnect of an already connected client id replaces the old
    connection (MQTT-3.1.4-3) instead of being refused: the number of connections does not grow."""
    threaded = start_broker(limits__max_connections=1)
    port = threaded.ports["tcp"]
    old = RawClient(port)
    assert old.connect("lim").reason_code == 0
    other = RawClient(port)
    assert other.connect("lim-other").reason_code != 0  # the limit itself works
    new = RawClient(port)
    assert new.connect("lim").reason_code == 0
    old.read_until_closed()
    wait_for(lambda: threaded.call(lambda: threaded.broker.connected_count) == 1, what="one connection")


# ============================================================ checked behaviours (expected to hold)
def test_v5_takeover_with_will_delay_continuing_session_sends_no_will(start_broker: Start) -> None:
    """v5 §3.1.3.2.2 / MQTT-3.1.3-9: takeover continuing the session within the will delay: no will;
    takeover with clean start ends the session: the will is published (session end)."""
    threaded = start_broker()
    port = threaded.ports["tcp"]
    watcher = RawClient(port)
    assert watcher.connect("wd-watch").reason_code == 0
    watcher.subscribe("wd/will", 0)
    will = Will("wd/will", b"gone", 0, False, {"will_delay_interval": 30})
    props = {"session_expiry_interval": 300}
    old = RawClient(port, MQTT_5)
    assert old.connect("wd-client", clean=False, will=will, properties=props).reason_code == 0
    new = RawClient(port, MQTT_5)
    assert new.connect("wd-client", clean=False, properties=props).session_present
    disconnect = old.read_until_closed()
    assert [p.reason_code for p in disconnect if isinstance(p, Disconnect)] == [0x8E]
    watcher.expect_nothing(0.4)
    new.close()  # abnormal close, but this connection has no will
    third = RawClient(port, MQTT_5)
    assert third.connect("wd-client", clean=False, will=will, properties=props).session_present
    fourth = RawClient(port, MQTT_5)
    assert not fourth.connect("wd-client", clean=True).session_present
    assert watcher.expect_publish().payload == b"gone"
    watcher.expect_nothing(0.4)  # exactly once


def test_topic_aliases_to_client_reset_on_reconnect(start_broker: Start) -> None:
    threaded = start_broker()
    port = threaded.ports["tcp"]
    props = {"topic_alias_maximum": 5, "session_expiry_interval": 60}
    sub = RawClient(port, MQTT_5)
    assert sub.connect("al-sub", clean=False, properties=props).reason_code == 0
    sub.subscribe("al/t", 0)
    pub = RawClient(port)
    assert pub.connect("al-pub").reason_code == 0
    pub.publish("al/t", b"1")
    pub.publish("al/t", b"2")
    first, second = sub.expect_publish(), sub.expect_publish()
    assert (first.topic, first.properties.get("topic_alias")) == ("al/t", 1)
    assert second.properties.get("topic_alias") == 1
    sub.close()
    back = RawClient(port, MQTT_5)
    assert back.connect("al-sub", clean=False, properties=props).session_present
    time.sleep(0.1)
    pub.publish("al/t", b"3")
    third = back.expect_publish()
    assert third.topic == "al/t"  # the new connection has no alias mapping yet: full topic again
    assert third.payload == b"3"


def test_sys_topics_not_matched_by_hash_or_plus(start_broker: Start) -> None:
    threaded = start_broker(sys__interval_s=1)
    port = threaded.ports["tcp"]
    everything = RawClient(port)
    assert everything.connect("sys-hash").reason_code == 0
    everything.subscribe("#", 0)
    everything.subscribe("+/broker/#", 0, packet_id=2)
    everything.subscribe("$share/all/#", 0, packet_id=3)
    explicit = RawClient(port)
    assert explicit.connect("sys-explicit").reason_code == 0
    explicit.subscribe("$SYS/broker/version", 0)
    assert explicit.expect_publish(3).topic == "$SYS/broker/version"
    everything.expect_nothing(1.2)


def test_qos2_exactly_once_across_reconnect_with_persistent_session(start_broker: Start) -> None:
    threaded = start_broker()
    port = threaded.ports["tcp"]
    sub = RawClient(port)
    assert sub.connect("x2-sub").reason_code == 0
    sub.subscribe("x2/t", 2)
    pub = RawClient(port)
    assert pub.connect("x2-pub", clean=False).reason_code == 0
    pub.publish("x2/t", b"once", 2, packet_id=11)
    assert pub.take(Pubrec).packet_id == 11
    pub.close()  # PUBREL never sent on this connection
    again = RawClient(port)
    assert again.connect("x2-pub", clean=False).session_present
    again.publish("x2/t", b"once", 2, packet_id=11, dup=True)
    assert again.take(Pubrec).packet_id == 11
    again.send(Pubrel(11))
    assert again.take(Pubcomp).packet_id == 11
    message = sub.expect_publish()
    assert message.payload == b"once"
    sub.ack(message)
    sub.expect_nothing(0.4)


def test_redelivery_keeps_order_and_sets_dup_then_window_refills(start_broker: Start) -> None:
    threaded = start_broker(limits__max_inflight_messages=2)
    port = threaded.ports["tcp"]
    sub = RawClient(port)
    assert sub.connect("rd-sub", clean=False).reason_code == 0
    sub.subscribe("rd/t", 1)
    pub = RawClient(port)
    assert pub.connect("rd-pub").reason_code == 0
    for index in range(5):
        pub.publish_acked("rd/t", str(index).encode(), 1, packet_id=index + 1)
    first = [sub.expect_publish(), sub.expect_publish()]
    sub.expect_nothing(0.3)  # window of 2
    assert [m.payload for m in first] == [b"0", b"1"]
    sub.close()
    back = RawClient(port)
    assert back.connect("rd-sub", clean=False).session_present
    resent = [back.expect_publish(), back.expect_publish()]
    assert [(m.payload, m.dup, m.packet_id) for m in resent] == [
        (m.payload, True, m.packet_id) for m in first
    ]
    back.expect_nothing(0.3)
    payloads: list[bytes] = []
    for message in resent:
        back.ack(message)
    while len(payloads) < 3:
        message = back.expect_publish()
        assert not message.dup
        payloads.append(message.payload)
        back.ack(message)
    assert payloads == [b"2", b"3", b"4"]


def test_too_large_qos1_message_is_dropped_and_window_moves_on(start_broker: Start) -> None:
    threaded = start_broker(limits__max_inflight_messages=1)
    port = threaded.ports["tcp"]
    sub = RawClient(port, MQTT_5)
    assert sub.connect("mp-sub", properties={"maximum_packet_size": 200}).reason_code == 0
    sub.subscribe("mp/t", 1)
    pub = RawClient(port)
    assert pub.connect("mp-pub").reason_code == 0
    pub.publish_acked("mp/t", b"x" * 500, 1, packet_id=1)
    pub.publish_acked("mp/t", b"small", 1, packet_id=2)
    message = sub.expect_publish()
    assert message.payload == b"small"
    sub.ack(message)
    sub.expect_nothing(0.3)
    assert dropped(threaded).get("packet_too_large") == 1


def test_keepalive_zero_is_never_timed_out(start_broker: Start) -> None:
    threaded = start_broker()
    port = threaded.ports["tcp"]
    idle = RawClient(port)
    assert idle.connect("ka0", keep_alive_s=0).reason_code == 0
    short = RawClient(port)
    assert short.connect("ka1", keep_alive_s=1).reason_code == 0
    short.read_until_closed(4.0)  # 1.5 s + sweep: closed
    idle.send_bytes(b"\xc0\x00")  # PINGREQ still answered
    assert idle.recv().__class__.__name__ == "Pingresp"


def test_shared_member_leaving_mid_qos2_delivery_is_not_redistributed(start_broker: Start) -> None:
    """MQTT-4.8.2-5: a QoS 2 message whose delivery to the chosen member started is never sent to
    another member when that member's session ends; its still-queued messages are."""
    threaded = start_broker(limits__max_inflight_messages=1)
    port = threaded.ports["tcp"]
    first = RawClient(port, MQTT_5)
    assert first.connect("s2-a").reason_code == 0
    first.subscribe("$share/g2/s2/t", 2)
    second = RawClient(port, MQTT_5)
    assert second.connect("s2-b").reason_code == 0
    second.subscribe("$share/g2/s2/t", 2)
    pub = RawClient(port)
    assert pub.connect("s2-pub").reason_code == 0
    for index in range(4):  # round robin: s2-a gets 0 and 2 (2 waits behind its window of 1)
        pub.publish_acked("s2/t", str(index).encode(), 2, packet_id=index + 1)
    in_flight = first.expect_publish()
    assert in_flight.payload == b"0"
    payloads: list[bytes] = []
    for _ in range(2):
        message = second.expect_publish()
        payloads.append(message.payload)
        second.ack(message)
    assert payloads == [b"1", b"3"]
    first.close()  # session ends with "0" in flight and "2" still queued
    handed = second.expect_publish()
    assert handed.payload == b"2"
    second.ack(handed)
    second.expect_nothing(0.4)


def test_subscriber_keeps_working_after_a_failed_commit(start_broker: Start, tmp_path: Path) -> None:
    """After a failed commit, messages that memory still holds must be usable and durable: a
    queued message whose store row was rolled back must not break the subscriber's session
    (set_inflight on a lost seq), and it must be on disk again once the next commit succeeds."""
    data_dir = tmp_path / "resync"
    threaded = start_broker(data_dir, limits__max_inflight_messages=1)
    port = threaded.ports["tcp"]
    sub = RawClient(port)
    assert sub.connect("rs-sub", clean=False).reason_code == 0
    sub.subscribe("rs/t", 1)
    pub = RawClient(port)
    assert pub.connect("rs-pub").reason_code == 0
    pub.publish_acked("rs/t", b"first", 1, packet_id=1)
    first = sub.expect_publish()
    fail_next(threaded)
    pub.publish("rs/t", b"second", 1, packet_id=2)  # queued behind the window; its commit fails
    assert not [p for p in pub.read_until_closed() if isinstance(p, Puback)]
    sub.ack(first)
    second = sub.expect_publish()
    assert second.payload == b"second"
    sub.close()  # not acknowledged: must be redelivered after a restart
    wait_for(lambda: not threaded.call(lambda: threaded.broker.store.pending), what="commit")
    threaded.stop()
    restarted = start_broker(data_dir)
    back = RawClient(restarted.ports["tcp"])
    assert back.connect("rs-sub", clean=False).session_present
    again = back.expect_publish()
    assert (again.payload, again.dup) == (b"second", True)
    back.ack(again)
    back.expect_nothing(0.3)


def test_stray_puback_for_qos2_message_does_not_reorder_redelivery(start_broker: Start) -> None:
    """MQTT-4.6.0-1: unacknowledged PUBLISHes are re-sent in the order they were first sent; a
    (wrong) PUBACK for an in-flight QoS 2 message is ignored and must not move it to the back."""
    threaded = start_broker()
    port = threaded.ports["tcp"]
    sub = RawClient(port)
    assert sub.connect("ro-sub", clean=False).reason_code == 0
    sub.subscribe("ro/t", 2)
    pub = RawClient(port)
    assert pub.connect("ro-pub").reason_code == 0
    pub.publish_acked("ro/t", b"a", 2, packet_id=1)
    pub.publish_acked("ro/t", b"b", 2, packet_id=2)
    first, second = sub.expect_publish(), sub.expect_publish()
    assert first.packet_id is not None
    sub.send(Puback(first.packet_id))
    sub.expect_nothing(0.2)
    sub.close()
    back = RawClient(port)
    assert back.connect("ro-sub", clean=False).session_present
    resent = [back.expect_publish(), back.expect_publish()]
    assert [m.payload for m in resent] == [b"a", b"b"]
    assert [m.packet_id for m in resent] == [first.packet_id, second.packet_id]


def test_reason_strings_are_dropped_to_respect_client_maximum_packet_size(start_broker: Start) -> None:
    """MQTT-3.1.2-24 / MQTT-3.14.2-3: the Server never sends a packet above the client's Maximum
    Packet Size; a reason string that would exceed it is left out (the DISCONNECT still goes out)."""
    threaded = start_broker()
    port = threaded.ports["tcp"]
    client = RawClient(port, MQTT_5)
    assert client.connect("mps-dc", properties={"maximum_packet_size": 16}).reason_code == 0
    client.publish("", b"x", properties={"topic_alias": 60000})  # above our topic alias maximum
    client.sock.settimeout(5)
    raw = b""
    while True:
        chunk = client.sock.recv(4096)
        if not chunk:
            break
        raw += chunk
    assert raw[0] == 0xE0, raw  # DISCONNECT
    assert len(raw) <= 16, raw
    assert raw[2] == 0x94  # topic alias invalid


def test_suback_of_persistent_session_only_after_subscription_is_committed(start_broker: Start) -> None:
    """A SUBACK tells a persistent subscriber its subscription exists; if it were sent before the
    commit, a crash right after it would silently drop the subscription (the client sees
    session_present=1 and does not re-subscribe) and every later acknowledged message for it
    would be lost. With the commit failing, no SUBACK may be sent."""
    threaded = start_broker()
    port = threaded.ports["tcp"]
    ok = RawClient(port)
    assert ok.connect("sa-ok", clean=False).reason_code == 0
    assert ok.subscribe("sa/t", 1).reason_codes == [1]  # the normal case still works
    sub = RawClient(port)
    assert sub.connect("sa-sub", clean=False).reason_code == 0
    fail_next(threaded)
    sub.send(Subscribe(1, [Subscription("sa/t", 1)]))
    packets = sub.read_until_closed()
    assert not [p for p in packets if isinstance(p, Suback)], packets


def test_transient_commit_failure_is_retried_and_acked_message_survives_restart(
    start_broker: Start, tmp_path: Path
) -> None:
    """One failed COMMIT (rolled back): the broker rewrites the store from memory and commits again;
    the PUBACK is sent only then, and the message really is on disk."""
    data_dir = tmp_path / "transient"
    threaded = start_broker(data_dir)
    port = threaded.ports["tcp"]
    persistent_subscriber(port, "tr-sub", "tr/t")
    pub = RawClient(port)
    assert pub.connect("tr-pub").reason_code == 0
    fail_next(threaded, failures=1)
    assert puback_code(pub, "tr/t", b"survives", 4) == 0
    # counted for skipmq_store_errors_total (the SkipMQStoreErrors alert)
    assert threaded.broker.stats.store_errors == {"operation": 0, "commit": 1, "resync": 0}
    pub.disconnect()
    threaded.stop()
    restarted = start_broker(data_dir)
    sub = RawClient(restarted.ports["tcp"])
    assert sub.connect("tr-sub", clean=False).session_present
    assert sub.expect_publish().payload == b"survives"


def test_store_statement_failure_does_not_release_acks_of_rolled_back_work(
    start_broker: Start, tmp_path: Path
) -> None:
    """A failing INSERT can make SQLite roll back the whole open transaction, including another
    publisher's message whose PUBACK waits for the group commit. That PUBACK may only be sent once
    the message is on disk again (the store is rewritten from memory before the commit)."""
    data_dir = tmp_path / "stmt"
    threaded = start_broker(data_dir)
    port = threaded.ports["tcp"]
    persistent_subscriber(port, "st-sub", "st/#")
    first = RawClient(port)
    assert first.connect("st-pub-1").reason_code == 0
    second = RawClient(port)
    assert second.connect("st-pub-2").reason_code == 0
    fail_next(threaded, "INSERT INTO queue", failures=1, skip=1)  # the second publisher's insert
    block_loop(threaded, 0.5)  # both PUBLISHes are handled in one iteration, before the commit
    first.publish("st/a", b"from-first", 1, packet_id=1)
    time.sleep(0.1)
    second.publish("st/b", b"from-second", 1, packet_id=1)
    assert first.take(Puback).packet_id == 1
    assert not [p for p in second.read_until_closed() if isinstance(p, Puback)]
    assert threaded.broker.stats.store_errors["operation"] == 1
    first.disconnect()
    threaded.stop()
    restarted = start_broker(data_dir)
    sub = RawClient(restarted.ports["tcp"])
    assert sub.connect("st-sub", clean=False).session_present
    message = sub.expect_publish()
    assert message.payload == b"from-first"
    sub.ack(message)
    sub.expect_nothing(0.3)


def test_connection_limit_also_bounds_connections_that_never_send_connect(start_broker: Start) -> None:
    """limits.max_connections bounds sockets that have not sent CONNECT yet too (at most as many
    again as the limit wait for CONNECT), so a flood of silent sockets cannot pile up for the whole
    CONNECT timeout; a well-behaved client still gets its CONNACK afterwards."""
    threaded = start_broker(limits__max_connections=2, limits__connect_timeout_s=30)
    port = threaded.ports["tcp"]
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]
    closed = 0
    for sock in silent:
        sock.settimeout(1.0)
        try:
            if sock.recv(1) == b"":
                closed += 1
        except TimeoutError:
            pass
        except ConnectionError:
            closed += 1
    assert closed == 3
    for sock in silent:
        sock.close()
    wait_for(lambda: threaded.call(lambda: len(threaded.broker.connections)) == 0, what="sockets gone")
    client = RawClient(port)
    assert client.connect("after-flood").reason_code == 0


def test_acl_checked_on_delivery_live_retained_and_queued(start_broker: Start, tmp_path: Path) -> None:
    """can_receive is applied to every copy: live, retained-on-subscribe and queued for offline
    (the publisher may write a/secret/acl-sub, the subscriber of a/# may not read it)."""
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite a/#\npattern deny a/secret/%c\n")  # a/secret/<own id>: unreadable
    threaded = start_broker(auth__acl_file=str(acl))
    port = threaded.ports["tcp"]
    pub = RawClient(port)
    assert pub.connect("acl-pub").reason_code == 0
    pub.publish("a/open", b"r-open", retain=True)
    pub.publish("a/secret/acl-sub", b"r-secret", retain=True)
    wait_for(lambda: threaded.call(lambda: len(threaded.broker.retained)) == 2, what="both retained")
    sub = RawClient(port)
    assert sub.connect("acl-sub", clean=False).reason_code == 0
    sub.subscribe("a/#", 1)
    assert sub.expect_publish().payload == b"r-open"
    sub.expect_nothing(0.2)
    pub.publish_acked("a/secret/acl-sub", b"live-secret", 1, packet_id=1)
    pub.publish_acked("a/open", b"live-open", 1, packet_id=2)
    live = sub.expect_publish()
    assert live.payload == b"live-open"
    sub.ack(live)
    sub.close()
    time.sleep(0.1)
    pub.publish_acked("a/secret/acl-sub", b"queued-secret", 1, packet_id=3)
    pub.publish_acked("a/open", b"queued-open", 1, packet_id=4)
    back = RawClient(port)
    assert back.connect("acl-sub", clean=False).session_present
    queued = back.expect_publish()
    assert queued.payload == b"queued-open"
    back.ack(queued)
    back.expect_nothing(0.3)


def test_resend_after_reconnect_respects_the_new_receive_maximum(start_broker: Start) -> None:
    """MQTT-3.3.4-9: never more unacknowledged QoS>0 PUBLISHes than the client's Receive Maximum of
    the current connection, resends included (MQTT-4.4.0-1: same packet ids, original order)."""
    threaded = start_broker()
    port = threaded.ports["tcp"]
    props = {"session_expiry_interval": 300, "receive_maximum": 10}
    sub = RawClient(port, MQTT_5)
    assert sub.connect("rm-sub", clean=False, properties=props).reason_code == 0
    sub.subscribe("rm/t", 1)
    pub = RawClient(port)
    assert pub.connect("rm-pub").reason_code == 0
    for index in range(5):
        pub.publish_acked("rm/t", str(index).encode(), 1, packet_id=index + 1)
    first = [sub.expect_publish() for _ in range(5)]
    sub.close()  # nothing acknowledged
    back = RawClient(port, MQTT_5)
    props["receive_maximum"] = 2
    assert back.connect("rm-sub", clean=False, properties=props).session_present
    resent = [back.expect_publish(), back.expect_publish()]
    back.expect_nothing(0.3)  # a third unacknowledged PUBLISH would exceed receive maximum 2
    order = []
    for message in resent:
        order.append(message)
    while len(order) < 5:
        back.ack(order[len(order) - 2])
        order.append(back.expect_publish())
    assert [(m.payload, m.packet_id, m.dup) for m in order] == [(m.payload, m.packet_id, True) for m in first]


def test_pubrel_to_a_subscriber_leaves_only_after_its_state_is_committed(start_broker: Start) -> None:
    """MQTT-4.3.3: once the broker sent PUBREL it must never send that PUBLISH again. The PUBREL
    tells the client to deliver (paho and mosquitto hand a QoS 2 message over at PUBREL and forget
    its packet id); if it left before the commit that records "PUBREL sent", a kill -9 right after
    would restart the broker with the entry still "PUBLISH sent", it would send the PUBLISH again
    (dup) and the client would deliver the message a second time. With that commit failing, the
    subscriber must see no PUBREL (the connection is closed instead, as for any held ack)."""
    threaded = start_broker()
    port = threaded.ports["tcp"]
    sub = RawClient(port)
    assert sub.connect("pr-sub", clean=False).reason_code == 0
    sub.subscribe("pr/t", 2)
    pub = RawClient(port)
    assert pub.connect("pr-pub").reason_code == 0
    assert isinstance(pub.publish_acked("pr/t", b"once", 2, packet_id=3), Pubcomp)
    message = sub.expect_publish()
    assert (message.payload, message.qos) == (b"once", 2)
    time.sleep(0.2)  # the commit of the PUBLISH's in-flight state is done
    fail_next(threaded)
    assert message.packet_id is not None
    sub.send(Pubrec(message.packet_id))
    packets = sub.read_until_closed()
    assert not [p for p in packets if isinstance(p, Pubrel)], packets


# ============================================================ QoS 2: a PUBREL resent, its PUBCOMP lost
def test_pubrel_for_a_completed_packet_id_gets_pubcomp_success_and_no_second_delivery(
    start_broker: Start, tmp_path: Path
) -> None:
    """The broker forgets an inbound QoS 2 packet id in the commit of its PUBREL and sends the
    PUBCOMP after that commit. A kill -9 (or a dropped connection) between the two: the client sends
    the PUBREL again, for an id the broker no longer holds. The flow is complete (the message was
    released once): PUBCOMP success (0x00, as mosquitto answers), not 0x92, which clients report as
    a failed publish - and the message is not delivered again. MQTT 3.1.1 and 5, on the same
    connection and after a restart from the store."""
    data_dir = tmp_path / "pubrel-again"
    threaded = start_broker(data_dir)
    port = threaded.ports["tcp"]
    persistent_subscriber(port, "pa-sub", "pa/t", qos=2)
    v5_session = {"session_expiry_interval": 300}
    for level, packet_id in ((MQTT_5, 21), (MQTT_3_1_1, 22)):
        pub = RawClient(port, protocol_level=level)
        connack = pub.connect(
            f"pa-pub-{level}", clean=False, properties=v5_session if level == MQTT_5 else None
        )
        assert connack.reason_code == 0
        pub.publish("pa/t", f"once-{level}".encode(), 2, packet_id=packet_id)
        assert pub.take(Pubrec).packet_id == packet_id
        pub.send(Pubrel(packet_id))
        first = pub.take(Pubcomp)
        assert (first.packet_id, first.reason_code) == (packet_id, 0)
        pub.send(Pubrel(packet_id))  # the PUBCOMP "lost": the same PUBREL again
        again = pub.take(Pubcomp)
        assert (again.packet_id, again.reason_code) == (packet_id, 0x00), again
        pub.close()
    threaded.stop()

    restarted = start_broker(data_dir)
    port = restarted.ports["tcp"]
    for level, packet_id in ((MQTT_5, 21), (MQTT_3_1_1, 22)):
        pub = RawClient(port, protocol_level=level)
        connack = pub.connect(
            f"pa-pub-{level}", clean=False, properties=v5_session if level == MQTT_5 else None
        )
        assert connack.session_present
        pub.send(Pubrel(packet_id))  # after the restart, the id is gone from the store too
        after = pub.take(Pubcomp)
        assert (after.packet_id, after.reason_code) == (packet_id, 0x00), after
        pub.close()
    sub = RawClient(port)
    assert sub.connect("pa-sub", clean=False).session_present
    payloads = []
    for _ in range(2):
        message = sub.expect_publish()
        sub.ack(message)
        payloads.append(message.payload)
    assert sorted(payloads) == [f"once-{MQTT_3_1_1}".encode(), f"once-{MQTT_5}".encode()]
    sub.expect_nothing(0.4)  # each once, although every PUBREL came twice or three times


class _PubcompDroppingRelay:
    """A TCP relay in front of the broker that closes its first connection instead of forwarding the
    broker's first PUBCOMP (the PUBCOMP a kill -9 right after the commit would never send); later
    connections are relayed unchanged."""

    def __init__(self, broker_port: int) -> None:
        self.broker_port = broker_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.dropped_pubcomp = threading.Event()
        self._sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.broker_port))
            self._sockets += [client, upstream]
            drop = not self.dropped_pubcomp.is_set()
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, drop), daemon=True).start()

    @staticmethod
    def _read_packet(sock: socket.socket) -> bytes:
        data = sock.recv(1)
        length, shift = 0, 0
        while data:
            byte = sock.recv(1)
            if not byte:
                return b""
            data += byte
            length |= (byte[0] & 0x7F) << shift
            shift += 7
            if not byte[0] & 0x80:
                break
        while data and length:
            chunk = sock.recv(length)
            if not chunk:
                return b""
            data += chunk
            length -= len(chunk)
        return data

    def _pipe(self, source: socket.socket, sink: socket.socket, drop_first_pubcomp: bool) -> None:
        try:
            while packet := self._read_packet(source):
                if drop_first_pubcomp and packet[0] >> 4 == 7 and not self.dropped_pubcomp.is_set():
                    self.dropped_pubcomp.set()
                    break
                sink.sendall(packet)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


def test_paho_v5_publish_succeeds_when_its_pubrel_is_resent_after_the_pubcomp_was_lost(
    start_broker: Start,
) -> None:
    """paho (MQTT 5, persistent session) loses the PUBCOMP of a QoS 2 publish, reconnects by itself
    and sends the PUBREL again; the broker no longer holds the id. paho must report the publish as
    successful (its on_publish reason code), and the subscriber receives the message once."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    threaded = start_broker()
    port = threaded.ports["tcp"]
    sub = RawClient(port)
    assert sub.connect("pp-sub").reason_code == 0
    sub.subscribe("pp/t", 2)
    relay = _PubcompDroppingRelay(port)
    published: list[Any] = []
    done = threading.Event()
    connects: list[bool] = []

    def on_publish(client: Any, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        published.append(reason)
        done.set()

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        connects.append(bool(flags.session_present))

    client = paho.Client(
        callback_api_version=CallbackAPIVersion.VERSION2, client_id="pp-pub", protocol=paho.MQTTv5
    )
    client.on_publish = on_publish
    client.on_connect = on_connect
    client.reconnect_delay_set(min_delay=1, max_delay=1)
    connect_props = Properties(PacketTypes.CONNECT)
    connect_props.SessionExpiryInterval = 300
    client.connect("127.0.0.1", relay.port, clean_start=False, properties=connect_props)
    client.loop_start()
    try:
        client.publish("pp/t", b"exactly-once", qos=2)
        assert done.wait(15), "paho never completed the publish"
        assert relay.dropped_pubcomp.is_set() and connects == [False, True], connects
        assert len(published) == 1 and not published[0].is_failure, published
    finally:
        client.disconnect()
        client.loop_stop()
        relay.close()
    message = sub.expect_publish()
    assert message.payload == b"exactly-once"
    sub.ack(message)
    sub.expect_nothing(0.4)
