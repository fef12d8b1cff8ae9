"""Interop: malformed packets and protocol errors over raw sockets.

Each case: the offending connection is closed (MQTT 3.1.1 §4.8 / MQTT-4.8.0-1; MQTT 5 §4.13: the
Server MAY first send DISCONNECT with the reason code — SkipMQ must, with the code named here),
a second, well-behaved client on the same broker keeps working, and (SkipMQ only) the broker
logged one event="protocol_error" line for the offending client.

Cases: remaining length longer than 4 bytes (MQTT 1.5.5), reserved fixed-header flags
(MQTT-2.2.2-2), QoS 3 (MQTT-3.3.1-4), ill-formed UTF-8 topic (MQTT-1.5.3-1), wildcard in a
PUBLISH topic (MQTT-3.3.2-2, v5 0x90), reserved packet type 0, PUBLISH before CONNECT
(MQTT-3.1.0-1), second CONNECT (MQTT-3.1.0-2, v5 0x82).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

from tests.support.interop_broker import IS_SKIPMQ, BrokerProcess
from tests.support.interop_clients import PahoClient, unique_id
from tests.support.interop_raw import RawClient, RawPacket
from tools.mqtt_raw import (
    CONNACK,
    DISCONNECT,
    PUBLISH,
    SUBSCRIBE,
    connect_packet,
    mqtt_str,
    packet,
    publish_packet,
)

PahoFactory = Callable[..., PahoClient]
MALFORMED, PROTOCOL_ERROR, TOPIC_NAME_INVALID = 0x81, 0x82, 0x90

# name -> (bytes sent after a successful CONNECT, expected v5 DISCONNECT reason code for SkipMQ)
CASES: dict[str, tuple[bytes, int]] = {
    "remaining_length_5_bytes": (b"\x30\xff\xff\xff\xff\x7f", MALFORMED),
    "subscribe_reserved_flags": (
        packet(SUBSCRIBE, 0x00, struct.pack("!H", 1) + mqtt_str("a/b") + b"\x00"),
        MALFORMED,
    ),
    "pubrel_reserved_flags": (packet(6, 0x00, struct.pack("!H", 1)), MALFORMED),
    "publish_qos3": (packet(PUBLISH, 0x06, mqtt_str("a/b") + struct.pack("!H", 1) + b"x"), MALFORMED),
    "invalid_utf8_topic": (packet(PUBLISH, 0x00, mqtt_str(b"a/\xff\xfe") + b"x"), MALFORMED),
    "wildcard_in_publish_topic": (packet(PUBLISH, 0x00, mqtt_str("a/+/c") + b"x"), TOPIC_NAME_INVALID),
    "reserved_packet_type_0": (b"\x00\x00", MALFORMED),
    "second_connect": (connect_packet("again"), PROTOCOL_ERROR),
}


# where the spec leaves room (malformed vs protocol error), another broker may choose differently:
# mosquitto 2.0.11 answers 0x82 to these two.
ALSO_ACCEPTED: dict[str, set[int]] = {
    "reserved_packet_type_0": {PROTOCOL_ERROR},
    "wildcard_in_publish_topic": {PROTOCOL_ERROR},
}


def _v5_body(case: str, data: bytes) -> bytes:
    """The v5 variant of a case: PUBLISH packets need a property length byte after the topic."""
    if case in ("publish_qos3",):
        return packet(PUBLISH, 0x06, mqtt_str("a/b") + struct.pack("!H", 1) + b"\x00x")
    if case == "invalid_utf8_topic":
        return packet(PUBLISH, 0x00, mqtt_str(b"a/\xff\xfe") + b"\x00x")
    if case == "wildcard_in_publish_topic":
        return packet(PUBLISH, 0x00, mqtt_str("a/+/c") + b"\x00x")
    if case == "subscribe_reserved_flags":
        return packet(SUBSCRIBE, 0x00, struct.pack("!H", 1) + b"\x00" + mqtt_str("a/b") + b"\x00")
    if case == "second_connect":
        return connect_packet("again", level=5)
    return data


def _still_works(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    topic = unique_id("healthy")
    sub = paho_factory(broker, version=5)
    sub.subscribe(topic, 1)
    paho_factory(broker).publish(topic, b"still-fine", 1)
    assert sub.wait_message().payload == b"still-fine"


def _assert_logged(broker: BrokerProcess, client_id: str | None) -> None:
    if not IS_SKIPMQ:
        return
    record = broker.wait_log(
        lambda r: (
            r.get("event") == "protocol_error" and (client_id is None or r.get("client_id") == client_id)
        )
    )
    assert "reason_code" in record


def _close_packets(seen: list[RawPacket]) -> list[RawPacket]:
    return [p for p in seen if p.ptype == DISCONNECT]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("version", [4, 5])
def test_malformed_after_connect(
    broker: BrokerProcess, paho_factory: PahoFactory, case: str, version: int
) -> None:
    data, reason = CASES[case]
    if version == 5:
        data = _v5_body(case, data)
    cid = unique_id(f"bad-{case}")
    with RawClient(broker.host, broker.port, level=version) as raw:
        assert raw.connect(cid)[1] == 0
        raw.send(data)
        seen = raw.read_until_closed(timeout_s=5.0)
    disconnects = _close_packets(seen)
    if version == 4:
        assert not disconnects, "a 3.1.1 server never sends DISCONNECT"
    elif IS_SKIPMQ:
        assert disconnects, f"SkipMQ must send DISCONNECT {reason:#x} before closing; saw {seen}"
    accepted = {reason} if IS_SKIPMQ else {reason} | ALSO_ACCEPTED.get(case, set())
    for pkt in disconnects:
        assert pkt.body[0] in accepted, f"DISCONNECT reason {pkt.body[0]:#x}, expected {reason:#x}"
    _still_works(broker, paho_factory)
    _assert_logged(broker, cid)


@pytest.mark.parametrize("version", [4, 5])
def test_publish_before_connect(broker: BrokerProcess, paho_factory: PahoFactory, version: int) -> None:
    with RawClient(broker.host, broker.port, level=version) as raw:
        raw.send(publish_packet("early/topic", b"x", level=version))
        seen = raw.read_until_closed(timeout_s=5.0)
    assert all(p.ptype != CONNACK for p in seen), "no CONNACK for a connection that never sent CONNECT"
    _still_works(broker, paho_factory)
    _assert_logged(broker, None)


def test_garbage_instead_of_connect(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    with RawClient(broker.host, broker.port) as raw:
        # 'G' = packet type 4 (PUBACK) as the first packet: not a CONNECT (MQTT-3.1.0-1)
        raw.send(b"GET / HTTP/1.1\r\n" + b"X-Padding: aaaaaaaaaaaaaaaa\r\n" * 4 + b"\r\n")
        raw.read_until_closed(timeout_s=5.0)
    _still_works(broker, paho_factory)


def test_truncated_connect_then_close_does_not_hurt(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    with RawClient(broker.host, broker.port) as raw:
        raw.send(connect_packet("half")[:7])
    _still_works(broker, paho_factory)
