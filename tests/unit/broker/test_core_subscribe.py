"""Broker core: subscriptions, retained messages, shared subscriptions and ACL (MQTT §3.8, §3.10, §4.7, §4.8).

Real broker, raw-socket clients using the project's codec, plus paho for a cross-check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from broker.adapters.server import ThreadedBroker
from broker.mqtt.packets import Disconnect, Puback, Pubrec, ReasonCode, Unsuback, Unsubscribe
from tests.support.core import MQTT_5, PahoClient, RawClient, start_broker

__all__ = ["start_broker"]
Start = Callable[..., ThreadedBroker]


def test_invalid_filters_get_failure_codes(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    v5 = RawClient(port, MQTT_5)
    v5.connect("f5")
    assert v5.subscribe("a/#/b", 1).reason_codes == [ReasonCode.TOPIC_FILTER_INVALID]
    assert v5.subscribe("a+", 1, packet_id=2).reason_codes == [ReasonCode.TOPIC_FILTER_INVALID]
    assert v5.subscribe("$share/g", 1, packet_id=3).reason_codes == [ReasonCode.TOPIC_FILTER_INVALID]
    v3 = RawClient(port)
    v3.connect("f3")
    assert v3.subscribe("x/#/y", 1).reason_codes == [0x80]
    assert v3.subscribe("x/+/y", 1, packet_id=2).reason_codes == [1]


def test_wildcards_and_dollar_rule(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port)
    sub.connect("wild")
    sub.subscribe("#", 0)
    sub.subscribe("+/b", 0, packet_id=2)
    pub = RawClient(port)
    pub.connect("wild-pub")
    pub.publish("$SYS/x", b"hidden")
    pub.publish("a/b", b"seen")
    message = sub.expect_publish()
    assert (message.topic, message.payload) == ("a/b", b"seen")  # one copy despite two matching filters
    sub.expect_nothing(0.3)


def test_overlapping_subscriptions_one_copy_max_qos_all_identifiers(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port, MQTT_5)
    sub.connect("overlap")
    sub.subscribe("o/+", 0, properties={"subscription_identifier": 5})
    sub.subscribe("o/#", 1, packet_id=2, properties={"subscription_identifier": 9})
    sub.subscribe("o/x", 0, packet_id=3)
    pub = RawClient(port)
    pub.connect("overlap-pub")
    pub.publish_acked("o/x", b"m", 2)
    message = sub.expect_publish()
    assert message.qos == 1
    assert sorted(message.properties["subscription_identifier"]) == [5, 9]
    sub.ack(message)
    sub.expect_nothing(0.3)


def test_resubscribe_replaces_options_and_resends_retained(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    pub = RawClient(port)
    pub.connect("rs-pub")
    pub.publish("rs/t", b"kept", retain=True)
    sub = RawClient(port)
    sub.connect("rs-sub")
    sub.subscribe("rs/t", 0)
    assert sub.expect_publish().retain is True
    sub.subscribe("rs/t", 1, packet_id=2)
    again = sub.expect_publish()
    assert again.retain is True and again.qos == 0  # retained QoS 0 message, min(0, 1)
    pub.publish_acked("rs/t", b"live", 1)
    live = sub.expect_publish()
    assert (live.qos, live.retain, live.payload) == (1, False, b"live")
    sub.ack(live)
    assert broker.call(lambda: broker.broker.sessions["rs-sub"].subscriptions["rs/t"].qos) == 1


def test_unsubscribe_reason_codes(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port, MQTT_5)
    sub.connect("unsub")
    sub.subscribe("u/t", 0)
    sub.send(Unsubscribe(4, ["u/t", "u/none"]))
    unsuback = sub.expect(Unsuback)
    assert unsuback.reason_codes == [0x00, ReasonCode.NO_SUBSCRIPTION_EXISTED]
    pub = RawClient(port)
    pub.connect("unsub-pub")
    pub.publish("u/t", b"gone")
    sub.expect_nothing(0.3)
    v3 = RawClient(port)
    v3.connect("unsub3")
    v3.send(Unsubscribe(5, ["nothing"]))
    assert v3.expect(Unsuback).packet_id == 5


def test_no_local_and_retain_as_published(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    client = RawClient(port, MQTT_5)
    client.connect("nl")
    client.subscribe("nl/t", 0, no_local=True)
    client.subscribe("rap/t", 0, packet_id=2, retain_as_published=True)
    client.subscribe("norap/t", 0, packet_id=3)
    client.publish("nl/t", b"mine")
    client.expect_nothing(0.3)
    other = RawClient(port)
    other.connect("nl-other")
    other.publish("nl/t", b"theirs")
    assert client.expect_publish().payload == b"theirs"
    other.publish("rap/t", b"r", retain=True)
    assert client.expect_publish().retain is True
    other.publish("norap/t", b"n", retain=True)
    assert client.expect_publish().retain is False


def test_retain_handling_0_1_2(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    pub = RawClient(port)
    pub.connect("rh-pub")
    pub.publish("rh/t", b"ret", retain=True)
    client = RawClient(port, MQTT_5)
    client.connect("rh")
    client.subscribe("rh/t", 0, retain_handling=2)
    client.expect_nothing(0.3)
    client.subscribe("rh/+", 0, packet_id=2, retain_handling=1)
    assert client.expect_publish().payload == b"ret"
    client.subscribe("rh/+", 0, packet_id=3, retain_handling=1)  # not new: nothing
    client.expect_nothing(0.3)
    client.subscribe("rh/#", 0, packet_id=4, retain_handling=0)
    assert client.expect_publish().retain is True


def test_retained_set_replace_clear_and_not_on_connect(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    pub = RawClient(port)
    pub.connect("ret-pub")
    pub.publish("ret/a", b"1", retain=True)
    pub.publish_acked("ret/a", b"2", 1, retain=True)
    pub.publish("ret/b", b"b", retain=True)
    pub.publish_acked("ret/b", b"", 1, retain=True)  # zero-length payload clears
    persistent = RawClient(port)
    persistent.connect("ret-persist", clean=False)
    persistent.subscribe("ret/#", 1)
    message = persistent.expect_publish()
    assert (message.topic, message.payload, message.retain) == ("ret/a", b"2", True)
    persistent.ack(message)
    persistent.expect_nothing(0.3)
    persistent.disconnect()
    back = RawClient(port)
    assert back.connect("ret-persist", clean=False).session_present is True
    back.expect_nothing(0.4)  # retained messages are never re-sent on CONNECT
    assert broker.call(lambda: len(broker.broker.retained)) == 1


def test_retain_not_available_disconnects_0x9a(start_broker: Start) -> None:
    broker = start_broker(limits__retain_available=False)
    client = RawClient(broker.ports["tcp"], MQTT_5)
    assert client.connect("noret").properties["retain_available"] == 0
    client.publish("nr/t", b"x", retain=True)
    packets = client.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.RETAIN_NOT_SUPPORTED


def test_shared_subscription_round_robin_and_no_retained(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    pub = RawClient(port)
    pub.connect("sh-pub")
    pub.publish("sh/t", b"retained", retain=True)
    members = []
    for name in ("m1", "m2"):
        member = RawClient(port, MQTT_5)
        member.connect(name)
        assert member.subscribe("$share/g/sh/#", 1).reason_codes == [1]
        members.append(member)
    members[0].expect_nothing(0.2)  # no retained messages for shared subscriptions
    plain = RawClient(port)
    plain.connect("plain")
    plain.subscribe("sh/#", 0)
    plain.expect_publish()  # the retained one, normal subscription
    for index in range(6):
        pub.publish("sh/t", str(index).encode())
    counts = []
    for member in members:
        got = []
        while True:
            try:
                got.append(member.expect_publish(timeout_s=0.5).payload)
            except TimeoutError:
                break
        counts.append(len(got))
    assert counts == [3, 3]
    assert [plain.expect_publish().payload for _ in range(6)] == [str(i).encode() for i in range(6)]


def test_shared_group_all_offline_queues_for_one_persistent_member(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    for name in ("s1", "s2"):
        member = RawClient(port, MQTT_5)
        member.connect(name, clean=False, properties={"session_expiry_interval": 60})
        member.subscribe("$share/grp/off/t", 1)
        member.disconnect()
    pub = RawClient(port)
    pub.connect("off-pub")
    for index in range(4):
        pub.publish_acked("off/t", str(index).encode(), 1, packet_id=index + 1)
    total = 0
    for name in ("s1", "s2"):
        back = RawClient(port, MQTT_5)
        back.connect(name, clean=False, properties={"session_expiry_interval": 60})
        while True:
            try:
                message = back.expect_publish(timeout_s=0.5)
            except TimeoutError:
                break
            back.ack(message)
            total += 1
    assert total == 4  # each message queued exactly once within the group


def test_acl_publish_subscribe_receive(start_broker: Start, tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite open/#\ntopic read ro/#\ntopic write wo/#\n")
    broker = start_broker(auth__acl_file=str(acl))
    port = broker.ports["tcp"]
    v5 = RawClient(port, MQTT_5)
    v5.connect("acl5")
    assert v5.subscribe("open/#", 1).reason_codes == [1]
    assert v5.subscribe("wo/#", 1, packet_id=2).reason_codes == [ReasonCode.NOT_AUTHORIZED]
    v5.publish("ro/x", b"x", qos=1, packet_id=3)
    assert v5.expect(Puback).reason_code == ReasonCode.NOT_AUTHORIZED
    v5.publish("ro/x", b"x", qos=2, packet_id=4)
    assert v5.expect(Pubrec).reason_code == ReasonCode.NOT_AUTHORIZED
    v3 = RawClient(port)
    v3.connect("acl3")
    assert v3.subscribe("wo/#", 0).reason_codes == [0x80]
    v3.subscribe("ro/#", 0, packet_id=2)
    v3.publish("ro/denied", b"d", qos=1, packet_id=7)
    assert v3.expect(Puback).reason_code == 0  # v3: acked, silently dropped
    v3.expect_nothing(0.3)
    v5.publish_acked("open/ok", b"ok", 1, packet_id=8)
    assert v5.expect_publish().payload == b"ok"
    assert broker.call(lambda: broker.broker.stats.messages_dropped["acl_denied"]) >= 3


def test_paho_wildcard_subscription_v311(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = PahoClient(port, "paho-wild").start()
    sub.subscribe("sensors/+/temp", 1)
    pub = PahoClient(port, "paho-wild-pub", v5=True).start()
    pub.publish("sensors/k1/temp", b"21", 1)
    pub.publish("sensors/k1/hum", b"40", 1)
    message = sub.get()
    assert (message.topic, message.payload, message.qos) == ("sensors/k1/temp", b"21", 1)
    sub.get_nothing(0.3)
    sub.stop()
    pub.stop()


def test_delivery_plan_follows_subscription_changes(start_broker: Start) -> None:
    """A topic's deliveries are planned once (Router._plan) and kept until the subscriptions
    change: a new subscriber, a re-subscription at another QoS, an unsubscribe and a no_local
    subscription all take effect on the next publish to an already published topic."""
    broker = start_broker()
    port = broker.ports["tcp"]
    pub = RawClient(port, MQTT_5)
    pub.connect("plan-pub")
    first = RawClient(port)
    first.connect("plan-1")
    first.subscribe("plan/t", 0)
    pub.publish("plan/t", b"m1")
    assert first.expect_publish().payload == b"m1"  # the plan of plan/t exists now
    second = RawClient(port)
    second.connect("plan-2")
    second.subscribe("plan/+", 1)
    pub.publish_acked("plan/t", b"m2", 1)
    assert first.expect_publish().qos == 0
    to_second = second.expect_publish()
    assert (to_second.payload, to_second.qos) == (b"m2", 1)
    second.ack(to_second)
    first.subscribe("plan/t", 1, packet_id=2)  # options replaced: QoS 1 from now on
    second.send(Unsubscribe(packet_id=3, topic_filters=["plan/+"]))
    second.expect(Unsuback)
    pub.publish_acked("plan/t", b"m3", 1, packet_id=2)
    again = first.expect_publish()
    assert (again.payload, again.qos) == (b"m3", 1)
    first.ack(again)
    second.expect_nothing(0.3)
    pub.subscribe("plan/t", 0, packet_id=4, no_local=True)  # the publisher's own: not to itself
    pub.publish_acked("plan/t", b"m4", 1, packet_id=5)
    assert first.expect_publish().payload == b"m4"
    pub.expect_nothing(0.3)
