"""Broker core: MQTT 5 features (topic aliases, message expiry, properties, packet size, responses).

MQTT 5 §3.3.2.3 (PUBLISH properties), §3.1.2.11 / §3.2.2.3 (CONNECT / CONNACK properties).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from broker.adapters.server import ThreadedBroker
from broker.mqtt.packets import Disconnect, Puback, ReasonCode
from tests.support.core import MQTT_5, PahoClient, RawClient, start_broker

__all__ = ["start_broker"]
Start = Callable[..., ThreadedBroker]


def test_topic_alias_from_client(start_broker: Start) -> None:
    broker = start_broker(limits__topic_alias_maximum=5)
    port = broker.ports["tcp"]
    sub = RawClient(port)
    sub.connect("alias-sub")
    sub.subscribe("al/#", 0)
    pub = RawClient(port, MQTT_5)
    assert pub.connect("alias-pub").properties["topic_alias_maximum"] == 5
    pub.publish("al/t", b"1", properties={"topic_alias": 3})
    pub.publish("", b"2", properties={"topic_alias": 3})
    assert [(m.topic, m.payload) for m in (sub.expect_publish(), sub.expect_publish())] == [
        ("al/t", b"1"),
        ("al/t", b"2"),
    ]
    pub.publish("", b"3", properties={"topic_alias": 4})  # never defined
    packets = pub.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.TOPIC_ALIAS_INVALID
    over = RawClient(port, MQTT_5)
    over.connect("alias-over")
    over.publish("al/x", b"x", properties={"topic_alias": 6})
    packets = over.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.TOPIC_ALIAS_INVALID


def test_topic_alias_to_client(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port, MQTT_5)
    sub.connect("alias-to", properties={"topic_alias_maximum": 1})
    sub.subscribe("at/#", 1)
    pub = RawClient(port)
    pub.connect("alias-to-pub")
    pub.publish("at/one", b"a")
    pub.publish("at/one", b"b")
    pub.publish("at/two", b"c")
    first, second, third = sub.expect_publish(), sub.expect_publish(), sub.expect_publish()
    assert (first.topic, first.properties.get("topic_alias")) == ("at/one", 1)
    assert (second.topic, second.properties.get("topic_alias")) == ("", 1)
    assert (third.topic, "topic_alias" in third.properties) == ("at/two", False)  # alias space full
    plain = RawClient(port, MQTT_5)
    plain.connect("alias-none")
    plain.subscribe("at/#", 0)
    pub.publish("at/one", b"d")
    message = plain.expect_publish()
    assert message.topic == "at/one" and "topic_alias" not in message.properties


def test_message_expiry_decremented_and_expired_dropped(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port, MQTT_5)
    sub.connect("exp-sub", clean=False, properties={"session_expiry_interval": 60})
    sub.subscribe("exp/#", 1)
    sub.disconnect()
    pub = RawClient(port, MQTT_5)
    pub.connect("exp-pub")
    pub.publish_acked("exp/short", b"s", 1, packet_id=1, properties={"message_expiry_interval": 1})
    pub.publish_acked("exp/long", b"l", 1, packet_id=2, properties={"message_expiry_interval": 30})
    time.sleep(1.6)
    back = RawClient(port, MQTT_5)
    back.connect("exp-sub", clean=False, properties={"session_expiry_interval": 60})
    message = back.expect_publish()
    assert message.topic == "exp/long"
    assert 1 <= message.properties["message_expiry_interval"] <= 29
    back.ack(message)
    back.expect_nothing(0.3)
    assert broker.call(lambda: broker.broker.stats.messages_dropped["expired"]) == 1


def test_publish_properties_forwarded_unchanged(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port, MQTT_5)
    sub.connect("props-sub")
    sub.subscribe("props/t", 1)
    pub = RawClient(port, MQTT_5)
    pub.connect("props-pub")
    properties = {
        "payload_format_indicator": 1,
        "content_type": "application/json",
        "response_topic": "props/reply",
        "correlation_data": b"\x00\x01corr",
        "user_property": [("a", "1"), ("a", "2"), ("b", "x")],
    }
    pub.publish_acked("props/t", b"{}", 1, properties=dict(properties))
    message = sub.expect_publish()
    for key, value in properties.items():
        assert message.properties[key] == value
    sub.ack(message)


def test_request_response_information(start_broker: Start) -> None:
    broker = start_broker()
    client = RawClient(broker.ports["tcp"], MQTT_5)
    connack = client.connect("rri", properties={"request_response_information": 1})
    assert connack.properties["response_information"]
    plain = RawClient(broker.ports["tcp"], MQTT_5)
    assert "response_information" not in plain.connect("no-rri").properties


def test_client_maximum_packet_size_respected(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port, MQTT_5)
    sub.connect("small-packets", properties={"maximum_packet_size": 100})
    sub.subscribe("mps/#", 1)
    pub = RawClient(port)
    pub.connect("mps-pub")
    pub.publish("mps/big", b"x" * 200)
    pub.publish_acked("mps/big1", b"y" * 200, 1)
    pub.publish("mps/small", b"ok")
    message = sub.expect_publish()
    assert message.payload == b"ok"
    sub.expect_nothing(0.3)
    assert broker.call(lambda: broker.broker.stats.messages_dropped["packet_too_large"]) == 2


def test_puback_no_matching_subscribers_and_connack_properties(start_broker: Start) -> None:
    broker = start_broker()
    client = RawClient(broker.ports["tcp"], MQTT_5)
    connack = client.connect("nms")
    assert connack.properties["receive_maximum"] >= 1
    assert connack.properties["maximum_packet_size"] >= 1000
    client.publish("nobody/here", b"x", qos=1, packet_id=9)
    assert client.expect(Puback).reason_code == ReasonCode.NO_MATCHING_SUBSCRIBERS


def test_paho_v5_request_response_round_trip(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    responder = PahoClient(port, "responder", v5=True).start()
    responder.subscribe("svc/req", 1)
    requester = PahoClient(port, "requester", v5=True).start()
    requester.subscribe("svc/reply/requester", 1)
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = "svc/reply/requester"
    props.CorrelationData = b"id-42"
    props.UserProperty = [("k", "v")]
    requester.publish("svc/req", b"ping", 1, properties=props)
    request = responder.get()
    request_props: Any = request.properties
    assert request_props.ResponseTopic == "svc/reply/requester"
    reply_props = Properties(PacketTypes.PUBLISH)
    reply_props.CorrelationData = request_props.CorrelationData
    responder.publish(request_props.ResponseTopic, b"pong", 1, properties=reply_props)
    reply = requester.get()
    reply_received: Any = reply.properties
    assert reply.payload == b"pong" and reply_received.CorrelationData == b"id-42"
    assert request_props.UserProperty == [("k", "v")]
    responder.stop()
    requester.stop()
