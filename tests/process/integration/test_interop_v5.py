"""Interop: MQTT 5 features seen from real clients.

Follows MQTT 5.0: §3.3.2.3 (publish properties: user properties, message expiry decremented and
expired messages not delivered, topic alias §3.3.2.3.4 and 0x94, response topic/correlation data
§4.10), §3.8.3.1 (no local), §3.8.2.1.2 + §3.3.2.3.8 (subscription identifiers), §4.8.2 (shared
subscriptions: one delivery per group), §3.3.4 / §4.9 (receive maximum -> 0x93), §3.1.2.11.4 and
§3.2.2.3.6 (maximum packet size both ways, 0x95), §3.2.2.3.7 (assigned client identifier),
§3.2.2.3.14 (server keep alive).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.support.interop_broker import IS_MOSQUITTO, IS_SKIPMQ, BrokerOptions, BrokerProcess
from tests.support.interop_clients import PahoClient, unique_id, v5_props
from tests.support.interop_raw import RawClient
from tools.mqtt_raw import DISCONNECT, PUBACK, PUBREC, publish_packet

PahoFactory = Callable[..., PahoClient]
BrokerFactory = Callable[[BrokerOptions], BrokerProcess]


def test_user_properties_and_content_fields_forwarded(
    broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    topic = unique_id("userprops")
    sub = paho_factory(broker, version=5)
    sub.subscribe(topic, 1)
    props = v5_props(
        PacketTypes.PUBLISH,
        UserProperty=[("a", "1"), ("b", "2"), ("a", "3")],
        ContentType="application/json",
        PayloadFormatIndicator=1,
    )
    paho_factory(broker, version=5).publish(topic, b'{"x": 1}', 1, properties=props)
    got = sub.wait_message()
    assert got.properties["UserProperty"] == [("a", "1"), ("b", "2"), ("a", "3")], "order/duplicates kept"
    assert got.properties["ContentType"] == "application/json"
    assert got.properties["PayloadFormatIndicator"] == 1


def test_message_expiry(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    cid = unique_id("expiry")
    topic = f"{cid}/t"
    session = v5_props(PacketTypes.CONNECT, SessionExpiryInterval=120)
    sub = paho_factory(broker, client_id=cid, version=5, connect_props=session)
    sub.subscribe(topic, 1)
    sub.disconnect()
    pub = paho_factory(broker, version=5)
    pub.publish(topic, b"short", 1, properties=v5_props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
    pub.publish(topic, b"long", 1, properties=v5_props(PacketTypes.PUBLISH, MessageExpiryInterval=100))
    time.sleep(2.2)
    back = paho_factory(broker, client_id=cid, version=5, clean=False, connect_props=session)
    got = back.wait_message()
    assert got.payload == b"long", "the expired message must not be delivered"
    remaining = got.properties["MessageExpiryInterval"]
    assert 90 <= remaining <= 98, f"expiry must be decremented by the time queued, got {remaining}"
    back.assert_no_message(0.5)


def test_topic_alias_from_client(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    topic = unique_id("alias")
    sub = paho_factory(broker, version=5)
    sub.subscribe(topic, 1)
    with RawClient(broker.host, broker.port, level=5) as raw:
        _, rc, props = raw.connect(unique_id("aliaspub"))
        assert rc == 0
        assert props.get(0x22, 0) >= 1, "broker must allow topic aliases for this test"
        raw.send(publish_packet(topic, b"with-name", qos=1, packet_id=1, level=5, props=[(0x23, 1)]))
        assert raw.read_packet().ptype == PUBACK
        raw.send(publish_packet("", b"by-alias", qos=1, packet_id=2, level=5, props=[(0x23, 1)]))
        assert raw.read_packet().ptype == PUBACK
    got = sub.wait_messages(2)
    assert [(m.topic, m.payload) for m in got] == [(topic, b"with-name"), (topic, b"by-alias")]


def test_topic_alias_out_of_range_is_0x94(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    with RawClient(broker.host, broker.port, level=5) as raw:
        _, _, props = raw.connect(unique_id("badalias"))
        too_big = props.get(0x22, 0) + 1
        raw.send(publish_packet("x/alias", b"x", level=5, props=[(0x23, too_big)]))
        seen = raw.read_until_closed()
    assert seen and seen[-1].ptype == DISCONNECT and seen[-1].body[0] == 0x94, seen
    paho_factory(broker, version=5).publish(unique_id("after"), b"ok", 1)


def test_request_response_round_trip(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    base = unique_id("rr")
    responder = paho_factory(broker, version=5)
    responder.subscribe(f"{base}/request", 1)
    requester = paho_factory(broker, version=5)
    requester.subscribe(f"{base}/reply", 1)
    request_props = v5_props(
        PacketTypes.PUBLISH, ResponseTopic=f"{base}/reply", CorrelationData=b"\x00id-42\xff"
    )
    requester.publish(f"{base}/request", b"ping?", 1, properties=request_props)
    request = responder.wait_message()
    assert request.properties["ResponseTopic"] == f"{base}/reply"
    assert request.properties["CorrelationData"] == b"\x00id-42\xff"
    reply_props = v5_props(PacketTypes.PUBLISH, CorrelationData=request.properties["CorrelationData"])
    responder.publish(request.properties["ResponseTopic"], b"pong", 1, properties=reply_props)
    reply = requester.wait_message()
    assert (reply.payload, reply.properties["CorrelationData"]) == (b"pong", b"\x00id-42\xff")


def test_subscription_identifiers_delivered(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    root = unique_id("subid")
    a = paho_factory(broker, version=5)
    a.subscribe(f"{root}/+", 1, properties=v5_props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=7))
    b = paho_factory(broker, version=5)
    b.subscribe(f"{root}/#", 1, properties=v5_props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=300))
    plain = paho_factory(broker, version=5)
    plain.subscribe(f"{root}/x", 1)
    paho_factory(broker, version=5).publish(f"{root}/x", b"id", 1)
    assert a.wait_message().properties["SubscriptionIdentifier"] == [7]
    assert b.wait_message().properties["SubscriptionIdentifier"] == [300]
    assert "SubscriptionIdentifier" not in plain.wait_message().properties


def test_no_local(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    topic = unique_id("nolocal")
    me = paho_factory(broker, version=5)
    me.subscribe(topic, SubscribeOptions(qos=1, noLocal=True))
    me.publish(topic, b"mine", 1)
    me.assert_no_message(0.6)
    paho_factory(broker, version=5).publish(topic, b"theirs", 1)
    assert me.wait_message().payload == b"theirs"


def test_shared_subscription_one_delivery_per_group(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    topic = unique_id("shared")
    group_a = [paho_factory(broker, version=5) for _ in range(2)]
    for member in group_a:
        assert member.subscribe(f"$share/ga/{topic}", 1)[0].value == 1
    group_b = paho_factory(broker, version=5)
    group_b.subscribe(f"$share/gb/{topic}", 1)
    plain = paho_factory(broker, version=5)
    plain.subscribe(topic, 1)
    pub = paho_factory(broker, version=5)
    total = 20
    for i in range(total):
        pub.publish(topic, f"s{i}".encode(), 1)
    assert len(plain.wait_messages(total)) == total
    assert len(group_b.wait_messages(total)) == total
    per_member = Counter[int]()
    payloads: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(payloads) < total and time.monotonic() < deadline:
        for index, member in enumerate(group_a):
            try:
                payloads.append(member.wait_message(0.05).payload)
                per_member[index] += 1
            except TimeoutError:
                pass
    assert sorted(payloads) == sorted(f"s{i}".encode() for i in range(total)), "each message once per group"
    assert all(per_member[i] >= 1 for i in range(2)), f"round robin expected, got {per_member}"
    for member in group_a:
        member.assert_no_message(0.3)


@pytest.mark.skipif(
    IS_MOSQUITTO, reason="mosquitto 2.0.11 does not enforce its Receive Maximum (PUBRECs receive_maximum+1)"
)
def test_receive_maximum_exceeded(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    """More unacknowledged QoS 2 PUBLISHes than our Receive Maximum -> DISCONNECT 0x93."""
    with RawClient(broker.host, broker.port, level=5) as raw:
        _, rc, props = raw.connect(unique_id("rxmax"))
        assert rc == 0
        receive_maximum = props.get(0x21, 65535)
        assert receive_maximum <= 1000, "test needs a bounded receive maximum"
        burst = b"".join(
            publish_packet(f"rxmax/{i}", b"x", qos=2, packet_id=i + 1, level=5)
            for i in range(receive_maximum + 1)
        )
        raw.send(burst)  # never send PUBREL, so none of them completes
        seen = raw.read_until_closed(timeout_s=5.0)
    assert sum(1 for p in seen if p.ptype == PUBREC) == receive_maximum
    assert seen[-1].ptype == DISCONNECT and seen[-1].body[0] == 0x93, seen[-1]
    paho_factory(broker, version=5).publish(unique_id("after"), b"ok", 1)


def test_assigned_client_identifier(broker: BrokerProcess) -> None:
    with RawClient(broker.host, broker.port, level=5) as raw:
        _, rc, props = raw.connect("")
    assert rc == 0
    assigned = props.get(0x12)
    assert isinstance(assigned, str) and assigned, f"CONNACK must carry an assigned client id: {props}"


def test_limits_packet_size_and_server_keepalive(
    broker_factory: BrokerFactory, paho_factory: PahoFactory
) -> None:
    target = broker_factory(BrokerOptions(max_packet_size_bytes=1024, max_keepalive_s=10))
    with RawClient(target.host, target.port, level=5) as raw:
        _, rc, props = raw.connect(unique_id("big"), keepalive_s=60)
        assert rc == 0
        assert props.get(0x27) == 1024, f"CONNACK must advertise maximum packet size: {props}"
        assert props.get(0x13) == 10, f"CONNACK must carry server keep alive 10: {props}"
        raw.send(publish_packet("big/topic", b"x" * 2000, qos=1, packet_id=1, level=5))
        seen = raw.read_until_closed()
    assert seen and seen[-1].ptype == DISCONNECT and seen[-1].body[0] == 0x95, seen
    small = paho_factory(target, version=5)
    small.subscribe("small/t", 1)
    small.publish("small/t", b"fits", 1)
    assert small.wait_message().payload == b"fits"


def test_client_maximum_packet_size_respected(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    topic = unique_id("clientmax")
    with RawClient(broker.host, broker.port, level=5) as raw:
        assert raw.connect(unique_id("tiny"), props=[(0x27, 200)])[1] == 0
        raw.subscribe([(topic, 1)])
        pub = paho_factory(broker, version=5)
        pub.publish(topic, b"L" * 500, 1)
        pub.publish(topic, b"small", 1)
        got = raw.read_publish()
        assert got.payload == b"small", "a packet above the client's maximum must not be sent"


def test_request_response_information(broker: BrokerProcess) -> None:
    with RawClient(broker.host, broker.port, level=5) as raw:
        _, rc, props = raw.connect(unique_id("respinfo"), props=[(0x19, 1)])
    assert rc == 0
    if IS_SKIPMQ:  # optional in the spec; mosquitto 2.0.11 does not send it
        assert isinstance(props.get(0x1A), str) and props[0x1A], props


@pytest.mark.skipif(
    IS_MOSQUITTO,
    reason="the spec allows one copy per subscription (MQTT-3.3.4-5); mosquitto 2.0.11 does that",
)
def test_overlapping_subscriptions_one_copy_with_all_identifiers(
    broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    """v5 §3.3.4 (MQTT-3.3.4-4): SkipMQ sends ONE copy at the highest granted QoS, carrying every
    matching subscription identifier."""
    root = unique_id("overlap")
    client = paho_factory(broker, version=5)
    client.subscribe(f"{root}/+", 0, properties=v5_props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=11))
    client.subscribe(f"{root}/#", 1, properties=v5_props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=12))
    paho_factory(broker, version=5).publish(f"{root}/x", b"once", 1)
    got = client.wait_message()
    assert (got.payload, got.qos) == (b"once", 1)
    assert sorted(got.properties["SubscriptionIdentifier"]) == [11, 12]
    client.assert_no_message(0.5)


def test_will_sent_at_session_end_when_sooner_than_delay(
    broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    """v5 §3.1.3.2.2: the will is published when the session ends, if that comes before the delay."""
    cid = unique_id("willend")
    watcher = paho_factory(broker, version=5)
    watcher.subscribe(f"{cid}/will", 1)
    client = paho_factory(
        broker,
        client_id=cid,
        version=5,
        will=(f"{cid}/will", b"session-over", 1, False),
        will_props=v5_props(PacketTypes.WILLMESSAGE, WillDelayInterval=30),
        connect_props=v5_props(PacketTypes.CONNECT, SessionExpiryInterval=1),
    )
    client.drop()
    started = time.monotonic()
    got = watcher.wait_message(6.0)
    waited = time.monotonic() - started
    assert got.payload == b"session-over"
    assert waited <= 5.0, f"will after {waited:.1f} s; the session expired after 1 s"
