"""Broker core: QoS 0/1/2 in both directions, flow control, redelivery, queues (MQTT §4.3, §4.4, §4.9).

Real broker, raw-socket clients using the project's codec.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from broker.adapters.server import ThreadedBroker
from broker.mqtt.packets import Disconnect, Puback, Pubcomp, Publish, Pubrec, Pubrel, ReasonCode
from tests.support.core import MQTT_5, RawClient, start_broker, wait_for

__all__ = ["start_broker"]
Start = Callable[..., ThreadedBroker]


def test_delivered_qos_is_min_of_publish_and_granted(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub1 = RawClient(port)
    sub1.connect("sub-q1")
    assert sub1.subscribe("q/#", 1).reason_codes == [1]
    sub2 = RawClient(port)
    sub2.connect("sub-q2")
    assert sub2.subscribe("q/#", 2).reason_codes == [2]
    pub = RawClient(port)
    pub.connect("pub")
    for qos in (0, 1, 2):
        if qos:
            pub.publish_acked(f"q/{qos}", b"m", qos, packet_id=10 + qos)
        else:
            pub.publish(f"q/{qos}", b"m")
        got1 = sub1.expect_publish()
        got2 = sub2.expect_publish()
        assert (got1.topic, got1.qos) == (f"q/{qos}", min(qos, 1))
        assert (got2.topic, got2.qos) == (f"q/{qos}", qos)
        if got1.qos:
            sub1.ack(got1)
        if got2.qos:
            sub2.ack(got2)


def test_maximum_qos_caps_granted_qos(start_broker: Start) -> None:
    broker = start_broker(limits__maximum_qos=1)
    client = RawClient(broker.ports["tcp"], MQTT_5)
    connack = client.connect("capq")
    assert connack.properties.get("maximum_qos") == 1
    assert client.subscribe("cap/#", 2).reason_codes == [1]
    client.publish("cap/x", b"2", qos=2, packet_id=3)
    packets = client.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.QOS_NOT_SUPPORTED


def test_outgoing_window_is_min_of_inflight_and_client_receive_maximum(start_broker: Start) -> None:
    broker = start_broker(limits__max_inflight_messages=3)
    port = broker.ports["tcp"]
    small = RawClient(port, MQTT_5)
    small.connect("small", properties={"receive_maximum": 2})
    small.subscribe("w/#", 1)
    capped = RawClient(port)
    capped.connect("capped")
    capped.subscribe("w/#", 1)
    pub = RawClient(port)
    pub.connect("wpub")
    for index in range(6):
        pub.publish_acked("w/t", str(index).encode(), 1, packet_id=index + 1)
    first = [small.expect_publish(), small.expect_publish()]
    small.expect_nothing(0.3)
    assert [p.payload for p in first] == [b"0", b"1"]
    third_batch = [capped.expect_publish() for _ in range(3)]
    capped.expect_nothing(0.2)
    assert [p.payload for p in third_batch] == [b"0", b"1", b"2"]
    small.ack(first[0])
    assert small.expect_publish().payload == b"2"
    for message in third_batch:
        capped.ack(message)
    assert [capped.expect_publish().payload for _ in range(3)] == [b"3", b"4", b"5"]


def test_incoming_receive_maximum_exceeded_disconnects_0x93(start_broker: Start) -> None:
    broker = start_broker(limits__receive_maximum=2)
    client = RawClient(broker.ports["tcp"], MQTT_5)
    assert client.connect("flood").properties["receive_maximum"] == 2
    for packet_id in (1, 2, 3):
        client.publish("flood/t", b"x", qos=2, packet_id=packet_id)
    packets = client.read_until_closed()
    assert (
        isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
    )


def test_qos2_exactly_once_receive(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port)
    sub.connect("eo-sub")
    sub.subscribe("eo/t", 2)
    pub = RawClient(port)
    pub.connect("eo-pub")
    pub.publish("eo/t", b"once", qos=2, packet_id=7)
    assert pub.expect(Pubrec).packet_id == 7
    pub.publish("eo/t", b"once", qos=2, packet_id=7, dup=True)  # re-sent before PUBREL
    assert pub.expect(Pubrec).packet_id == 7
    pub.send(Pubrel(7))
    assert pub.expect(Pubcomp).packet_id == 7
    message = sub.expect_publish()
    assert message.payload == b"once"
    sub.ack(message)
    sub.expect_nothing(0.4)
    pub.send(Pubrel(7))  # unknown id now: still completed (3.1.1 has no reason code)
    assert pub.expect(Pubcomp).packet_id == 7


def test_unacked_messages_redelivered_with_dup_and_pubrel_resent(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port)
    sub.connect("redeliver", clean=False)
    sub.subscribe("rd/#", 2)
    pub = RawClient(port)
    pub.connect("rd-pub")
    pub.publish_acked("rd/1", b"one", 1, packet_id=1)
    pub.publish_acked("rd/2", b"two", 2, packet_id=2)
    first = sub.expect_publish()
    second = sub.expect_publish()
    assert (first.qos, second.qos, first.dup, second.dup) == (1, 2, False, False)
    sub.send(Pubrec(second.packet_id or 0))
    assert sub.expect(Pubrel).packet_id == second.packet_id
    sub.close()  # no PUBACK for the first, no PUBCOMP for the second
    back = RawClient(port)
    assert back.connect("redeliver", clean=False).session_present is True
    # the PUBREL first, though its PUBLISH was sent after the unacknowledged one: the client gets
    # the slot of a completed QoS 2 message back before a re-sent PUBLISH counts against its
    # Receive Maximum (libmosquitto counts one it already holds twice; docs/cluster.md)
    assert back.expect(Pubrel).packet_id == second.packet_id
    again = back.expect(Publish)
    assert (again.payload, again.dup, again.packet_id) == (b"one", True, first.packet_id)
    back.send(Puback(first.packet_id or 0))
    back.send(Pubcomp(second.packet_id or 0))
    back.expect_nothing(0.3)
    assert broker.call(lambda: len(broker.broker.sessions["redeliver"].inflight)) == 0


def test_order_preserved_per_topic_through_window(start_broker: Start) -> None:
    broker = start_broker(limits__max_inflight_messages=5)
    port = broker.ports["tcp"]
    sub = RawClient(port)
    sub.connect("order-sub")
    sub.subscribe("order/t", 1)
    pub = RawClient(port)
    pub.connect("order-pub")
    for index in range(60):
        pub.publish("order/t", str(index).encode(), qos=1, packet_id=index + 1)
    received: list[int] = []
    while len(received) < 60:
        message = sub.expect_publish()
        received.append(int(message.payload))
        sub.ack(message)
    assert received == list(range(60))


def test_offline_queue_bounded_drop_oldest(start_broker: Start) -> None:
    broker = start_broker(limits__max_queued_messages=3, limits__queue_overflow="drop_oldest")
    port = broker.ports["tcp"]
    sub = RawClient(port)
    sub.connect("bounded", clean=False)
    sub.subscribe("b/t", 1)
    sub.disconnect()
    pub = RawClient(port)
    pub.connect("bpub")
    for index in range(5):
        pub.publish_acked("b/t", str(index).encode(), 1, packet_id=index + 1)
    back = RawClient(port)
    back.connect("bounded", clean=False)
    payloads = []
    for _ in range(3):
        message = back.expect_publish()
        payloads.append(message.payload)
        back.ack(message)
    back.expect_nothing(0.3)
    assert payloads == [b"2", b"3", b"4"]
    assert broker.call(lambda: broker.broker.stats.messages_dropped["queue_full_oldest"]) == 2


def test_offline_queue_bounded_drop_new(start_broker: Start) -> None:
    broker = start_broker(limits__max_queued_messages=3, limits__queue_overflow="drop_new")
    port = broker.ports["tcp"]
    sub = RawClient(port)
    sub.connect("bounded-new", clean=False)
    sub.subscribe("bn/t", 1)
    sub.disconnect()
    pub = RawClient(port)
    pub.connect("bnpub")
    for index in range(5):
        pub.publish_acked("bn/t", str(index).encode(), 1, packet_id=index + 1)
    back = RawClient(port)
    back.connect("bounded-new", clean=False)
    payloads = [back.expect_publish().payload for _ in range(3)]
    back.expect_nothing(0.3)
    assert payloads == [b"0", b"1", b"2"]


def test_slow_qos0_consumer_does_not_stall_others(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    slow = RawClient(port)
    slow.connect("slow")
    slow.subscribe("fan/t", 0)
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never read from it
    fast = RawClient(port)
    fast.connect("fast")
    fast.subscribe("fan/t", 0)
    pub = RawClient(port)
    pub.connect("fanpub")
    payload = b"x" * 60_000
    count = 200

    def produce() -> None:
        for index in range(count):
            pub.publish("fan/t", payload + index.to_bytes(4, "big"))
            if index % 10 == 9:  # paced so the fast reader keeps up even on a busy machine
                time.sleep(0.02)

    producer = threading.Thread(target=produce)
    producer.start()
    received = 0
    deadline = time.monotonic() + 30
    while received < count and time.monotonic() < deadline:
        message = fast.expect_publish(timeout_s=10)
        assert message.payload[-4:] == received.to_bytes(4, "big")
        received += 1
    producer.join(10)
    assert received == count
    wait_for(
        lambda: broker.call(lambda: broker.broker.stats.messages_dropped["slow_consumer"]) > 0, 5, "drops"
    )
    pub.publish("fan/t", b"end")
    while True:  # the publisher was never paused: the fast subscriber gets the end marker promptly
        message = fast.expect_publish(timeout_s=3)
        if message.payload == b"end":
            break
