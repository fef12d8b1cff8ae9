"""Interop: sessions — clean/persistent, offline queueing, redelivery with DUP, takeover, keepalive,
protocol versions at CONNECT.

Follows MQTT 3.1.1 §3.1.2.4 (clean session, session present MQTT-3.2.2-1/2/3), §4.4 (message
delivery retry: unacknowledged PUBLISH re-sent with DUP=1 on reconnect, MQTT-4.4.0-1), §3.1.4
(client id takeover, MQTT-3.1.4-2), §3.1.2.10 (keep alive: close after 1.5 x, MQTT-3.1.2-24),
MQTT-3.1.2-2 (unsupported protocol level -> CONNACK 0x01), MQTT 5 §3.1.2.4/§3.1.2.11.2 (clean
start, session expiry), §3.14 (DISCONNECT 0x8E session taken over, 0x8D keep alive timeout).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from amqtt.client import MQTTClient
from paho.mqtt.packettypes import PacketTypes

from tests.support.interop_broker import IS_MOSQUITTO, BrokerProcess
from tests.support.interop_clients import PahoClient, run_amqtt, unique_id, v5_props
from tests.support.interop_raw import ConnectionClosed, RawClient
from tools.mqtt_raw import (
    CONNACK,
    DISCONNECT,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    ack_packet,
    connect_packet,
    disconnect_packet,
)

PahoFactory = Callable[..., PahoClient]


def test_paho_v311_clean_and_persistent_session(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    cid = unique_id("sess3")
    first = paho_factory(broker, client_id=cid, clean=False)
    assert first.session_present is False
    first.subscribe(f"{cid}/t", 1)
    first.disconnect()
    second = paho_factory(broker, client_id=cid, clean=False)
    assert second.session_present is True, "persistent session was not kept (MQTT-3.2.2-2)"
    second.disconnect()
    third = paho_factory(broker, client_id=cid, clean=True)
    assert third.session_present is False, "clean session must report session_present=0 (MQTT-3.2.2-1)"
    third.disconnect()
    fourth = paho_factory(broker, client_id=cid, clean=False)
    assert fourth.session_present is False, "clean session must have discarded the old session"


def test_paho_v5_session_expiry(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    cid = unique_id("sess5")
    keep = v5_props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    first = paho_factory(broker, client_id=cid, version=5, clean=True, connect_props=keep)
    assert first.session_present is False
    first.subscribe(f"{cid}/t", 1)
    first.disconnect()
    second = paho_factory(broker, client_id=cid, version=5, clean=False, connect_props=keep)
    assert second.session_present is True
    second.disconnect()
    # session expiry 0 (the v5 default): the session ends at disconnect
    third = paho_factory(broker, client_id=cid, version=5, clean=True)
    third.disconnect()
    fourth = paho_factory(broker, client_id=cid, version=5, clean=False)
    assert fourth.session_present is False


def test_amqtt_persistent_session(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    """amqtt with cleansession=False gets what was queued while it was away, without re-subscribing."""
    cid = unique_id("amqtt-sess")
    topic = f"{cid}/t"
    uri = f"mqtt://{broker.host}:{broker.port}/"

    async def subscribe_and_leave() -> None:
        client = MQTTClient(client_id=cid)
        await client.connect(uri, cleansession=False)
        await client.subscribe([(topic, 1)])
        await client.disconnect()

    async def come_back() -> tuple[bytes, int]:
        client = MQTTClient(client_id=cid)
        await client.connect(uri, cleansession=False)
        try:
            msg = await client.deliver_message(timeout_duration=5)
            assert msg is not None, "queued message not delivered to amqtt"
            return bytes(msg.data), int(msg.qos or 0)
        finally:
            await client.disconnect()

    run_amqtt(subscribe_and_leave())
    paho_factory(broker).publish(topic, b"while-away", 1)
    assert run_amqtt(come_back()) == (b"while-away", 1)


@pytest.mark.parametrize("version", [4, 5])
def test_offline_queue_delivered_on_reconnect(
    broker: BrokerProcess, paho_factory: PahoFactory, version: int
) -> None:
    """QoS>0 messages for an offline persistent session arrive on reconnect, in order, RETAIN=0."""
    cid = unique_id("offline")
    topic = f"{cid}/q"
    props = v5_props(PacketTypes.CONNECT, SessionExpiryInterval=300) if version == 5 else None
    sub = paho_factory(broker, client_id=cid, version=version, clean=False, connect_props=props)
    sub.subscribe(topic, 2)
    sub.disconnect()
    pub = paho_factory(broker, version=version)
    sent = [(f"off{i}".encode(), 1 + i % 2) for i in range(10)]
    for payload, qos in sent:
        pub.publish(topic, payload, qos)
    pub.publish(topic, b"zero-qos", 0)  # QoS 0 may or may not be queued (MQTT-3.1.2-5): not asserted
    back = paho_factory(broker, client_id=cid, version=version, clean=False, connect_props=props)
    assert back.session_present
    got = [m for m in back.wait_messages(len(sent)) if m.payload != b"zero-qos"]
    while len(got) < len(sent):
        msg = back.wait_message()
        if msg.payload != b"zero-qos":
            got.append(msg)
    # order is guaranteed per topic and QoS (MQTT 5 MQTT-4.6.0-6), so compare per QoS
    for qos in (1, 2):
        assert [m.payload for m in got if m.qos == qos] == [p for p, q in sent if q == qos]
    assert sorted((m.payload, m.qos) for m in got) == sorted(sent)
    assert not any(m.retain for m in got), "queued non-retained messages must arrive with RETAIN=0"


@pytest.mark.parametrize("version", [4, 5])
def test_unacked_qos1_redelivered_with_dup(
    broker: BrokerProcess, paho_factory: PahoFactory, version: int
) -> None:
    cid = unique_id("dup")
    topic = f"{cid}/t"
    session_props = [(0x11, 300)] if version == 5 else None
    with RawClient(broker.host, broker.port, level=version) as raw:
        # 3.1.1: clean session 0 keeps the session; v5: clean start + session expiry does
        assert raw.connect(cid, clean=version == 5, props=session_props)[1] == 0
        assert raw.subscribe([(topic, 1)]) == [1]
        paho_factory(broker).publish(topic, b"needs-ack", 1)
        first = raw.read_publish()
        assert (first.payload, first.qos, first.dup) == (b"needs-ack", 1, False)
        # vanish without PUBACK
    with RawClient(broker.host, broker.port, level=version) as raw:
        present, rc, _ = raw.connect(cid, clean=False, props=session_props)
        assert (present, rc) == (True, 0)
        again = raw.read_publish()
        assert (again.payload, again.qos, again.dup, again.topic) == (b"needs-ack", 1, True, topic)
        raw.send(ack_packet(PUBACK, again.packet_id or 0))
        raw.send(disconnect_packet(version))
    with RawClient(broker.host, broker.port, level=version) as raw:
        assert raw.connect(cid, clean=False, props=session_props)[:2] == (True, 0)
        with pytest.raises(TimeoutError):
            raw.read_publish(0.7)  # acknowledged: not sent again


def test_qos2_pubrel_resent_after_reconnect(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    """A QoS 2 message that got PUBREC from us is continued with PUBREL (not PUBLISH) on reconnect."""
    cid = unique_id("qos2")
    topic = f"{cid}/t"
    with RawClient(broker.host, broker.port) as raw:
        raw.connect(cid, clean=False)
        raw.subscribe([(topic, 2)])
        paho_factory(broker).publish(topic, b"exactly-once", 2)
        got = raw.read_publish()
        assert got.qos == 2
        raw.send(ack_packet(PUBREC, got.packet_id or 0))
        pubrel = raw.read_packet()
        assert pubrel.ptype == PUBREL
        # vanish without PUBCOMP
    with RawClient(broker.host, broker.port) as raw:
        assert raw.connect(cid, clean=False)[:2] == (True, 0)
        pkt = raw.read_packet()
        assert pkt.ptype == PUBREL, f"expected PUBREL re-sent, got packet type {pkt.ptype}"
        assert int.from_bytes(pkt.body[:2], "big") == got.packet_id
        raw.send(ack_packet(PUBCOMP, got.packet_id or 0))
        with pytest.raises(TimeoutError):
            nxt = raw.read_packet(0.7)
            assert nxt.ptype != PUBLISH, "QoS 2 message delivered twice"


@pytest.mark.parametrize("version", [4, 5])
def test_duplicate_client_id_takeover(broker: BrokerProcess, paho_factory: PahoFactory, version: int) -> None:
    cid = unique_id("takeover")
    old = paho_factory(broker, client_id=cid, version=version)
    new = paho_factory(broker, client_id=cid, version=version)
    reason = old.wait_disconnected()
    if version == 5 and not IS_MOSQUITTO:  # mosquitto 2.0.11 closes without DISCONNECT 0x8E
        assert reason.value == 0x8E, f"old connection should see DISCONNECT 0x8E, got {reason}"
    # the new connection works
    new.subscribe(f"{cid}/t", 1)
    paho_factory(broker).publish(f"{cid}/t", b"to-new", 1)
    assert new.wait_message().payload == b"to-new"
    assert new.client.is_connected()


@pytest.mark.parametrize("version", [4, 5])
def test_keepalive_timeout_closes_and_fires_will(
    broker: BrokerProcess, paho_factory: PahoFactory, version: int
) -> None:
    cid = unique_id("keepalive")
    watcher = paho_factory(broker, version=5)
    watcher.subscribe(f"{cid}/will", 1)
    with RawClient(broker.host, broker.port, level=version) as raw:
        assert raw.connect(cid, keepalive_s=1, will=(f"{cid}/will", b"gone", 1, False))[1] == 0
        started = time.monotonic()
        seen = raw.read_until_closed(timeout_s=9.0)
        elapsed = time.monotonic() - started
    # mosquitto 2.0.11 checks keepalives only every few seconds
    limit_s = 8.0 if IS_MOSQUITTO else 4.5
    assert 1.0 <= elapsed <= limit_s, f"closed after {elapsed:.2f} s; expected ~1.5 x keepalive (1 s)"
    if version == 5 and not IS_MOSQUITTO:  # mosquitto 2.0.11 just closes the socket
        assert seen and seen[-1].ptype == DISCONNECT and seen[-1].body[0] == 0x8D, seen
    will = watcher.wait_message()
    assert (will.topic, will.payload) == (f"{cid}/will", b"gone")


def test_pingreq_keeps_connection_alive(broker: BrokerProcess) -> None:
    from tools.mqtt_raw import PINGREQ, PINGRESP, packet

    with RawClient(broker.host, broker.port) as raw:
        raw.connect(unique_id("ping"), keepalive_s=1)
        for _ in range(4):
            time.sleep(0.6)
            raw.send(packet(PINGREQ, 0, b""))
            assert raw.read_packet(2.0).ptype == PINGRESP


def test_mqtt31_mqisdp_connect_accepted(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    topic = unique_id("mqisdp")
    with RawClient(broker.host, broker.port, level=3) as raw:
        present, rc, _ = raw.connect(unique_id("v31"))
        assert (present, rc) == (False, 0)
        assert raw.subscribe([(topic, 1)]) == [1]
        paho_factory(broker).publish(topic, b"old-protocol", 1)
        got = raw.read_publish()
        assert (got.topic, got.payload, got.qos) == (topic, b"old-protocol", 1)


@pytest.mark.parametrize("level", [2, 6, 9])
def test_unknown_protocol_level_refused(broker: BrokerProcess, paho_factory: PahoFactory, level: int) -> None:
    with RawClient(broker.host, broker.port) as raw:
        raw.send(connect_packet(unique_id("badlevel"), level=level, protocol_name="MQTT"))
        seen = raw.read_until_closed()
    assert seen, "expected a CONNACK before the close"
    assert seen[0].ptype == CONNACK
    assert seen[0].body[-1] in (0x01, 0x84) or seen[0].body[1] in (0x01, 0x84), seen[0]
    # the broker is still fine
    other = paho_factory(broker)
    other.publish(unique_id("after"), b"ok", 1)


def test_connection_closed_after_disconnect(broker: BrokerProcess) -> None:
    with RawClient(broker.host, broker.port) as raw:
        raw.connect(unique_id("bye"))
        raw.send(disconnect_packet())
        with pytest.raises(ConnectionClosed):
            raw.read_packet(3.0)
