"""Durability: what the broker acknowledged survives `kill -9` and a restart on the same data dir.

Follows MQTT 3.1.1 §4.1 (session state: QoS 1/2 messages pending for the client) with SkipMQ's
guarantee (design brief "Durable queues", seed 001 §4.1: a message is deleted only when
acknowledged; group commit before PUBACK). kill -9 cases are SkipMQ only: mosquitto 2.0.11 keeps
its state in memory and writes it only on shutdown/autosave, so it legitimately loses it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.interop_broker import IS_MOSQUITTO, BrokerProcess
from tests.support.interop_clients import PahoClient, unique_id
from tests.support.interop_raw import RawClient
from tools.mqtt_raw import PUBACK, ack_packet, publish_packet

PahoFactory = Callable[..., PahoClient]
skipmq_only = pytest.mark.skipif(
    IS_MOSQUITTO, reason="mosquitto 2.0.11 persists only on shutdown/autosave: kill -9 loses its state"
)
N_MESSAGES = 200


@skipmq_only
def test_acknowledged_qos1_messages_survive_kill9(
    fresh_broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    cid = unique_id("durable")
    topic = f"{cid}/q"
    sub = paho_factory(fresh_broker, client_id=cid, clean=False)
    sub.subscribe(topic, 1)
    sub.disconnect()
    # publish from a raw client: each PUBLISH waits for its PUBACK before the next
    with RawClient(fresh_broker.host, fresh_broker.port) as pub:
        assert pub.connect(unique_id("durable-pub"))[1] == 0
        for i in range(N_MESSAGES):
            packet_id = i % 65535 + 1
            pub.send(publish_packet(topic, f"m{i:04d}".encode(), qos=1, packet_id=packet_id))
            ack = pub.read_packet()
            assert ack.ptype == PUBACK and int.from_bytes(ack.body[:2], "big") == packet_id
    fresh_broker.kill()  # kill -9 right after the last PUBACK
    fresh_broker.start()
    with RawClient(fresh_broker.host, fresh_broker.port) as back:
        present, rc, _ = back.connect(cid, clean=False)
        assert (present, rc) == (True, 0), "the persistent session must survive the crash"
        payloads = []
        for _ in range(N_MESSAGES):
            msg = back.read_publish(timeout_s=10.0)
            payloads.append(msg.payload)
            back.send(ack_packet(PUBACK, msg.packet_id or 0))
    assert payloads == [f"m{i:04d}".encode() for i in range(N_MESSAGES)], "lost, duplicated or reordered"


@skipmq_only
def test_retained_survives_kill9(fresh_broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    topic = unique_id("durable-ret")
    pub = paho_factory(fresh_broker)
    pub.publish(topic, b"kept", 1, retain=True)
    pub.publish(f"{topic}/cleared", b"gone", 1, retain=True)
    pub.publish(f"{topic}/cleared", b"", 1, retain=True)
    pub.close()
    fresh_broker.kill()
    fresh_broker.start()
    sub = paho_factory(fresh_broker)
    sub.subscribe(f"{topic}/#", 1)
    got = sub.wait_message()
    assert (got.topic, got.payload, got.retain) == (topic, b"kept", True)
    sub.assert_no_message(0.5)


@skipmq_only
def test_subscriptions_survive_kill9(fresh_broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    """A persistent session's subscription keeps matching after a crash while it is connected."""
    cid = unique_id("durable-sub")
    topic = f"{cid}/t"
    sub = paho_factory(fresh_broker, client_id=cid, clean=False)
    sub.subscribe(topic, 1)
    sub.drop()
    fresh_broker.kill()
    fresh_broker.start()
    back = paho_factory(fresh_broker, client_id=cid, clean=False)
    assert back.session_present
    paho_factory(fresh_broker).publish(topic, b"after-crash", 1)
    assert back.wait_message().payload == b"after-crash"


def test_retained_and_queue_survive_graceful_restart(
    fresh_broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    cid = unique_id("graceful")
    sub = paho_factory(fresh_broker, client_id=cid, clean=False)
    sub.subscribe(f"{cid}/q", 1)
    sub.disconnect()
    pub = paho_factory(fresh_broker)
    pub.publish(f"{cid}/r", b"retained", 1, retain=True)
    pub.publish(f"{cid}/q", b"queued", 1)
    pub.close()
    assert fresh_broker.terminate() == 0
    fresh_broker.start()
    back = paho_factory(fresh_broker, client_id=cid, clean=False)
    assert back.session_present
    assert back.wait_message().payload == b"queued"
    late = paho_factory(fresh_broker)
    late.subscribe(f"{cid}/r", 1)
    assert late.wait_message().payload == b"retained"
