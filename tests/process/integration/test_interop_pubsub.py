"""Interop: publish/subscribe at QoS 0/1/2 with paho (3.1.1, 5), amqtt and mosquitto_pub/sub.

Follows MQTT 3.1.1 §3.3/§4.3 and MQTT 5 §3.3/§4.3 (QoS flows), MQTT-3.8.4-6 / v5 §3.8.4 (the
delivered QoS is min(publish QoS, granted QoS)) and §4.7 (wildcards, the $-topic rule
MQTT-4.7.2-1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from amqtt.client import MQTTClient

from tests.support.interop_broker import BrokerProcess
from tests.support.interop_clients import MosquittoSub, PahoClient, mosquitto_pub, run_amqtt, unique_id
from tests.support.interop_raw import RawClient

PahoFactory = Callable[..., PahoClient]


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_paho_roundtrip_each_qos(
    broker: BrokerProcess, paho_factory: PahoFactory, version: int, qos: int
) -> None:
    topic = f"{unique_id('pubsub')}/q{qos}"
    sub = paho_factory(broker, version=version)
    pub = paho_factory(broker, version=version)
    granted = sub.subscribe(topic, 2)
    assert granted[0].value == 2
    payloads = [f"m{i}".encode() for i in range(5)]
    for payload in payloads:
        pub.publish(topic, payload, qos)
    got = sub.wait_messages(len(payloads))
    assert [m.payload for m in got] == payloads, "order or content changed"
    assert {m.qos for m in got} == {qos}
    assert not any(m.retain for m in got)
    sub.assert_no_message(0.3)


@pytest.mark.parametrize("version", [4, 5])
def test_qos_downgrade_to_granted(broker: BrokerProcess, paho_factory: PahoFactory, version: int) -> None:
    """Delivered QoS = min(publish QoS, granted QoS) (MQTT-3.8.4-6); never upgraded."""
    topic = unique_id("downgrade")
    sub1 = paho_factory(broker, version=version)
    sub0 = paho_factory(broker, version=version)
    assert sub1.subscribe(topic, 1)[0].value == 1
    assert sub0.subscribe(topic, 0)[0].value == 0
    pub = paho_factory(broker, version=version)
    for pub_qos in (0, 1, 2):
        pub.publish(topic, f"q{pub_qos}".encode(), pub_qos)
        m1 = sub1.wait_message()
        m0 = sub0.wait_message()
        assert (m1.payload, m1.qos) == (f"q{pub_qos}".encode(), min(pub_qos, 1))
        assert (m0.payload, m0.qos) == (f"q{pub_qos}".encode(), 0)


def test_qos0_publish_arrives_as_qos0_on_the_wire(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    """A raw QoS 1 subscriber sees a QoS 0 header and no packet id for a QoS 0 publish."""
    topic = unique_id("rawdown")
    with RawClient(broker.host, broker.port) as raw:
        assert raw.connect(unique_id("raw"))[1] == 0
        assert raw.subscribe([(topic, 1)]) == [1]
        paho_factory(broker).publish(topic, b"zero", 0)
        got = raw.read_publish()
        assert (got.topic, got.payload, got.qos, got.packet_id) == (topic, b"zero", 0, None)


@pytest.mark.parametrize("sub_qos", [0, 1, 2])
def test_amqtt_subscriber(broker: BrokerProcess, paho_factory: PahoFactory, sub_qos: int) -> None:
    topic = unique_id("amqtt-sub")
    pub = paho_factory(broker)

    async def scenario() -> list[tuple[bytes, int]]:
        client = MQTTClient(client_id=unique_id("amqtt"))
        await client.connect(f"mqtt://{broker.host}:{broker.port}/", cleansession=True)
        try:
            granted = await client.subscribe([(topic, sub_qos)])
            assert granted == [sub_qos]
            out = []
            for pub_qos in (0, 1, 2):
                pub.publish(topic, f"p{pub_qos}".encode(), pub_qos)
                msg = await client.deliver_message(timeout_duration=5)
                assert msg is not None, "amqtt got nothing"
                out.append((bytes(msg.data), int(msg.qos or 0)))
            return out
        finally:
            await client.disconnect()

    got = run_amqtt(scenario())
    assert got == [(f"p{q}".encode(), min(q, sub_qos)) for q in (0, 1, 2)]


def test_amqtt_publisher(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    topic = unique_id("amqtt-pub")
    sub = paho_factory(broker, version=5)
    sub.subscribe(topic, 2)

    async def scenario() -> None:
        client = MQTTClient(client_id=unique_id("amqtt"))
        await client.connect(f"mqtt://{broker.host}:{broker.port}/", cleansession=True)
        try:
            for qos in (0, 1, 2):
                await client.publish(topic, f"a{qos}".encode(), qos=qos)
        finally:
            await client.disconnect()

    run_amqtt(scenario())
    got = sub.wait_messages(3)
    assert [(m.payload, m.qos) for m in got] == [(b"a0", 0), (b"a1", 1), (b"a2", 2)]


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mosquitto_cli_clients(broker: BrokerProcess, version: int, qos: int) -> None:
    topic = unique_id("cli")
    with MosquittoSub(broker.host, broker.port, topic, qos=2, version=version) as sub:
        mosquitto_pub(broker.host, broker.port, topic, f"hello-{qos}", qos=qos, version=version)
        got = sub.wait_message()
    assert (got.topic, got.payload, got.qos, got.retain) == (topic, f"hello-{qos}", qos, False)


def test_cross_client_kinds(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    """mosquitto_pub (v5) -> paho 3.1.1 and mosquitto_sub (3.1.1) at once."""
    topic = unique_id("cross")
    paho_sub = paho_factory(broker, version=4)
    paho_sub.subscribe(topic, 1)
    with MosquittoSub(broker.host, broker.port, topic, qos=1, version=4) as sub:
        mosquitto_pub(broker.host, broker.port, topic, "x", qos=1, version=5)
        assert sub.wait_message().payload == "x"
    got = paho_sub.wait_message()
    assert (got.payload, got.qos) == (b"x", 1)


def _received_topics(client: PahoClient, settle_s: float = 0.6) -> set[str]:
    topics: set[str] = set()
    while True:
        try:
            topics.add(client.wait_message(settle_s).topic)
        except TimeoutError:
            return topics


def test_wildcards(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    root = unique_id("wild")
    published = [f"{root}/a", f"{root}/a/b", f"{root}/a/b/c", f"{root}/x/b", f"{root}//b", f"{root}/a/"]
    filters: dict[str, set[str]] = {
        f"{root}/+": {f"{root}/a"},
        f"{root}/+/b": {f"{root}/a/b", f"{root}/x/b", f"{root}//b"},
        f"{root}/a/#": {f"{root}/a", f"{root}/a/b", f"{root}/a/b/c", f"{root}/a/"},
        f"{root}/#": set(published),
        f"{root}/a/+": {f"{root}/a/b", f"{root}/a/"},
        f"{root}/+/+/+": {f"{root}/a/b/c"},
    }
    subs = {}
    for topic_filter in filters:
        client = paho_factory(broker, version=5)
        client.subscribe(topic_filter, 0)
        subs[topic_filter] = client
    pub = paho_factory(broker)
    for topic in published:
        pub.publish(topic, b"w", 1)
    for topic_filter, expected in filters.items():
        assert _received_topics(subs[topic_filter]) == expected, topic_filter


def test_dollar_topics_not_matched_by_leading_wildcards(
    fresh_broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    """MQTT-4.7.2-1: '#' and '+/...' do not match topics starting with '$'."""
    hash_sub = paho_factory(fresh_broker)
    hash_sub.subscribe("#", 0)
    plus_sub = paho_factory(fresh_broker)
    plus_sub.subscribe("+/interop", 0)
    explicit = paho_factory(fresh_broker)
    explicit.subscribe("$SYS/#", 0)
    dollar = paho_factory(fresh_broker)
    dollar.subscribe("$interop/#", 0)
    # a client may publish to a $-topic that is not $SYS (positive control below)
    paho_factory(fresh_broker).publish("$interop/interop", b"d", 1)
    got = dollar.wait_message()
    assert got.topic == "$interop/interop"
    for client in (hash_sub, plus_sub):
        topics = _received_topics(client, 0.5)
        assert not any(t.startswith("$") for t in topics), topics
    # the '#' subscriber still gets normal topics
    paho_factory(fresh_broker).publish("normal/interop", b"n", 1)
    assert hash_sub.wait_message().topic == "normal/interop"
    assert plus_sub.wait_message().topic == "normal/interop"


def test_unsubscribe_stops_delivery(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    topic = unique_id("unsub")
    sub = paho_factory(broker, version=5)
    pub = paho_factory(broker)
    sub.subscribe(topic, 1)
    pub.publish(topic, b"before", 1)
    assert sub.wait_message().payload == b"before"
    codes = sub.unsubscribe(topic)
    assert [c.value for c in codes] == [0]
    pub.publish(topic, b"after", 1)
    sub.assert_no_message(0.5)
    # unsubscribing again: v5 reason 0x11 no subscription existed
    again: list[Any] = sub.unsubscribe(topic)
    assert [c.value for c in again] == [0x11]
