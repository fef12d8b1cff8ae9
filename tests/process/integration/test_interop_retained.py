"""Interop: retained messages.

Follows MQTT 3.1.1 §3.3.1.3 (MQTT-3.3.1-5..12: store/replace, zero-length payload clears,
RETAIN=1 only on copies sent because of a new subscription, RETAIN=0 on live forwarding) and
MQTT 5 §3.3.1.3 / §3.8.3.1 (retain handling, retain as published).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from amqtt.client import MQTTClient
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.support.interop_broker import BrokerProcess
from tests.support.interop_clients import (
    MosquittoSub,
    PahoClient,
    mosquitto_pub,
    run_amqtt,
    unique_id,
    v5_props,
)

PahoFactory = Callable[..., PahoClient]


@pytest.mark.parametrize("version", [4, 5])
def test_retained_set_replace_clear(broker: BrokerProcess, paho_factory: PahoFactory, version: int) -> None:
    topic = unique_id("ret")
    pub = paho_factory(broker, version=version)
    pub.publish(topic, b"first", 1, retain=True)
    pub.publish(topic, b"second", 1, retain=True)
    late = paho_factory(broker, version=version)
    late.subscribe(topic, 1)
    got = late.wait_message()
    assert (got.payload, got.retain, got.qos) == (b"second", True, 1)
    late.assert_no_message(0.4)  # only the latest retained message
    pub.publish(topic, b"", 1, retain=True)  # clear
    live = late.wait_message()  # the clearing publish itself is forwarded live, RETAIN=0
    assert (live.payload, live.retain) == (b"", False)
    later = paho_factory(broker, version=version)
    later.subscribe(topic, 1)
    later.assert_no_message(0.6)


def test_retained_qos_is_min_of_message_and_subscription(
    broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    topic = unique_id("retqos")
    paho_factory(broker).publish(topic, b"q2", 2, retain=True)
    sub = paho_factory(broker)
    sub.subscribe(topic, 1)
    got = sub.wait_message()
    assert (got.payload, got.qos, got.retain) == (b"q2", 1, True)


def test_retained_matches_wildcards(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    root = unique_id("retwild")
    pub = paho_factory(broker)
    topics = [f"{root}/a", f"{root}/a/b", f"{root}/c/b"]
    for topic in topics:
        pub.publish(topic, topic.encode(), 1, retain=True)
    everything = paho_factory(broker)
    everything.subscribe(f"{root}/#", 1)
    assert {m.topic for m in everything.wait_messages(3)} == set(topics)
    single = paho_factory(broker)
    single.subscribe(f"{root}/+/b", 1)
    assert {m.topic for m in single.wait_messages(2)} == {f"{root}/a/b", f"{root}/c/b"}
    single.assert_no_message(0.4)


def test_retain_flag_zero_on_live_forwarding_and_only_new_subscription_gets_it(
    broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    topic = unique_id("retlive")
    existing = paho_factory(broker)
    existing.subscribe(topic, 1)
    paho_factory(broker).publish(topic, b"kept", 1, retain=True)
    live = existing.wait_message()
    assert (live.payload, live.retain) == (b"kept", False), "live forwarding must clear RETAIN (MQTT-3.3.1-9)"
    newcomer = paho_factory(broker)
    newcomer.subscribe(topic, 1)
    got = newcomer.wait_message()
    assert (got.payload, got.retain) == (b"kept", True)
    existing.assert_no_message(0.5)  # another client's new subscription does not resend to us


def test_retained_not_resent_on_reconnect(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    """On CONNECT with a present session, retained messages are not replayed to existing filters."""
    cid = unique_id("retconn")
    topic = f"{cid}/t"
    paho_factory(broker).publish(topic, b"once", 1, retain=True)
    first = paho_factory(broker, client_id=cid, clean=False)
    first.subscribe(topic, 1)
    assert first.wait_message().payload == b"once"
    first.disconnect()
    again = paho_factory(broker, client_id=cid, clean=False)
    assert again.session_present
    again.assert_no_message(0.7)


def test_retained_with_amqtt_and_mosquitto_cli(broker: BrokerProcess) -> None:
    topic = unique_id("retcli")
    mosquitto_pub(broker.host, broker.port, topic, "from-cli", qos=1, retain=True, version=5)

    async def amqtt_reads() -> tuple[bytes, bool]:
        client = MQTTClient(client_id=unique_id("amqtt"))
        await client.connect(f"mqtt://{broker.host}:{broker.port}/")
        try:
            await client.subscribe([(topic, 1)])
            msg = await client.deliver_message(timeout_duration=5)
            assert msg is not None
            return bytes(msg.data), bool(msg.publish_packet and msg.publish_packet.retain_flag)
        finally:
            await client.disconnect()

    assert run_amqtt(amqtt_reads()) == (b"from-cli", True)
    with MosquittoSub(broker.host, broker.port, topic, qos=1, version=4) as sub:
        got = sub.wait_message()
    assert (got.payload, got.retain) == ("from-cli", True)


def test_v5_retain_handling_and_retain_as_published(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    topic = unique_id("rethandling")
    paho_factory(broker).publish(topic, b"r", 1, retain=True)
    # retain handling 2: do not send retained messages at subscribe time
    never = paho_factory(broker, version=5)
    never.subscribe(topic, SubscribeOptions(qos=1, retainHandling=2))
    never.assert_no_message(0.5)
    # retain handling 1: only if the subscription is new
    once = paho_factory(broker, version=5)
    once.subscribe(topic, SubscribeOptions(qos=1, retainHandling=1))
    assert once.wait_message().retain is True
    once.subscribe(topic, SubscribeOptions(qos=1, retainHandling=1))
    once.assert_no_message(0.5)
    # retain handling 0: every subscribe
    always = paho_factory(broker, version=5)
    always.subscribe(topic, SubscribeOptions(qos=1, retainHandling=0))
    assert always.wait_message().retain is True
    always.subscribe(topic, SubscribeOptions(qos=1, retainHandling=0))
    assert always.wait_message().retain is True
    # retain as published: live forwarding keeps RETAIN=1
    rap = paho_factory(broker, version=5)
    rap.subscribe(topic, SubscribeOptions(qos=1, retainHandling=2, retainAsPublished=True))
    plain = paho_factory(broker, version=5)
    plain.subscribe(topic, SubscribeOptions(qos=1, retainHandling=2))
    paho_factory(broker, version=5).publish(topic, b"r2", 1, retain=True)
    assert rap.wait_message().retain is True
    assert plain.wait_message().retain is False


def test_v5_retained_keeps_properties(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    topic = unique_id("retprops")
    props = v5_props(PacketTypes.PUBLISH, ContentType="text/plain", UserProperty=[("k", "v")])
    paho_factory(broker, version=5).publish(topic, b"p", 1, retain=True, properties=props)
    sub = paho_factory(broker, version=5)
    sub.subscribe(topic, 1)
    got = sub.wait_message()
    assert got.properties.get("ContentType") == "text/plain"
    assert ("k", "v") in got.properties.get("UserProperty", [])
