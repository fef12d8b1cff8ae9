"""The one raw MQTT packet encoder of the project's tests and benchmarks (MQTT 3.1, 3.1.1, 5.0).

It deliberately does NOT use broker/mqtt/codec.py: black-box tests check the broker from the
outside, so the bytes here are encoded straight from the specifications (MQTT 3.1.1 §2-§3,
MQTT 5.0 §2-§3) and can be made malformed on purpose (``packet`` builds any fixed header and
body); the benchmarks' load clients use the same functions. Only what tests and benchmarks need is
implemented. The blocking test client on top of it is ``tests.support.interop_raw.RawClient``.
"""

from __future__ import annotations

import struct
from typing import Any

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15

# MQTT 5 property ids used by the tests (MQTT 5 §2.2.2.2) and their wire types.
PROP_TYPES: dict[int, str] = {
    0x01: "byte",
    0x02: "u32",
    0x03: "str",
    0x08: "str",
    0x09: "bin",
    0x0B: "varint",
    0x11: "u32",
    0x12: "str",
    0x13: "u16",
    0x15: "str",
    0x16: "bin",
    0x17: "byte",
    0x18: "u32",
    0x19: "byte",
    0x1A: "str",
    0x1C: "str",
    0x1F: "str",
    0x21: "u16",
    0x22: "u16",
    0x23: "u16",
    0x24: "byte",
    0x25: "byte",
    0x26: "pair",
    0x27: "u32",
    0x28: "byte",
    0x29: "byte",
    0x2A: "byte",
}


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value % 128, value // 128
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def mqtt_str(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("!H", len(raw)) + raw


def encode_properties(props: list[tuple[int, Any]]) -> bytes:
    body = bytearray()
    for pid, value in props:
        kind = PROP_TYPES[pid]
        body += varint(pid)
        if kind == "byte":
            body.append(value)
        elif kind == "u16":
            body += struct.pack("!H", value)
        elif kind == "u32":
            body += struct.pack("!I", value)
        elif kind == "varint":
            body += varint(value)
        elif kind in ("str", "bin"):
            body += mqtt_str(value)
        elif kind == "pair":
            body += mqtt_str(value[0]) + mqtt_str(value[1])
    return varint(len(body)) + bytes(body)


def decode_properties(data: bytes, offset: int) -> tuple[dict[int, Any], int]:
    """Decode a property block at offset; user properties (0x26) and 0x0B collect into lists."""
    length, offset = read_varint(data, offset)
    end = offset + length
    props: dict[int, Any] = {}
    while offset < end:
        pid, offset = read_varint(data, offset)
        kind = PROP_TYPES[pid]
        value: Any
        if kind == "byte":
            value, offset = data[offset], offset + 1
        elif kind == "u16":
            value, offset = struct.unpack_from("!H", data, offset)[0], offset + 2
        elif kind == "u32":
            value, offset = struct.unpack_from("!I", data, offset)[0], offset + 4
        elif kind == "varint":
            value, offset = read_varint(data, offset)
        elif kind in ("str", "bin"):
            n = struct.unpack_from("!H", data, offset)[0]
            raw = data[offset + 2 : offset + 2 + n]
            value, offset = (raw.decode() if kind == "str" else raw), offset + 2 + n
        else:
            n = struct.unpack_from("!H", data, offset)[0]
            key = data[offset + 2 : offset + 2 + n].decode()
            offset += 2 + n
            m = struct.unpack_from("!H", data, offset)[0]
            val = data[offset + 2 : offset + 2 + m].decode()
            offset += 2 + m
            value = (key, val)
        if pid in (0x26, 0x0B):
            props.setdefault(pid, []).append(value)
        else:
            props[pid] = value
    return props, end


def read_varint(data: bytes, offset: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[offset]
        offset += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, offset


def packet(ptype: int, flags: int, body: bytes) -> bytes:
    return bytes([(ptype << 4) | flags]) + varint(len(body)) + body


def connect_packet(
    client_id: str,
    *,
    level: int = 4,
    clean: bool = True,
    keepalive_s: int = 60,
    username: str | None = None,
    password: bytes | None = None,
    will: tuple[str, bytes, int, bool] | None = None,
    will_props: list[tuple[int, Any]] | None = None,
    props: list[tuple[int, Any]] | None = None,
    protocol_name: str | None = None,
) -> bytes:
    name = protocol_name if protocol_name is not None else ("MQIsdp" if level == 3 else "MQTT")
    flags = 0x02 if clean else 0
    if will:
        flags |= 0x04 | (will[2] << 3) | (0x20 if will[3] else 0)
    if username is not None:
        flags |= 0x80
    if password is not None:
        flags |= 0x40
    body = mqtt_str(name) + bytes([level, flags]) + struct.pack("!H", keepalive_s)
    if level == 5:
        body += encode_properties(props or [])
    body += mqtt_str(client_id)
    if will:
        if level == 5:
            body += encode_properties(will_props or [])
        body += mqtt_str(will[0]) + mqtt_str(will[1])
    if username is not None:
        body += mqtt_str(username)
    if password is not None:
        body += mqtt_str(password)
    return packet(CONNECT, 0, body)


def publish_packet(
    topic: str | bytes,
    payload: bytes,
    *,
    qos: int = 0,
    packet_id: int | None = None,
    retain: bool = False,
    dup: bool = False,
    level: int = 4,
    props: list[tuple[int, Any]] | None = None,
) -> bytes:
    flags = (0x08 if dup else 0) | (qos << 1) | (1 if retain else 0)
    body = mqtt_str(topic)
    if qos:
        body += struct.pack("!H", packet_id or 1)
    if level == 5:
        body += encode_properties(props or [])
    return packet(PUBLISH, flags, body + payload)


def subscribe_packet(
    packet_id: int,
    filters: list[tuple[str, int]],
    *,
    level: int = 4,
    props: list[tuple[int, Any]] | None = None,
) -> bytes:
    """filters: (topic filter, options byte); for 3.1.1 the options byte is the requested QoS."""
    body = struct.pack("!H", packet_id)
    if level == 5:
        body += encode_properties(props or [])
    for topic_filter, options in filters:
        body += mqtt_str(topic_filter) + bytes([options])
    return packet(SUBSCRIBE, 0x02, body)


def ack_packet(ptype: int, packet_id: int) -> bytes:
    return packet(ptype, 0x02 if ptype == PUBREL else 0, struct.pack("!H", packet_id))


def disconnect_packet(level: int = 4, reason_code: int = 0) -> bytes:
    if level == 5 and reason_code:
        return packet(DISCONNECT, 0, bytes([reason_code, 0]))
    return packet(DISCONNECT, 0, b"")


def publish_prefix(topic: str, qos: int, payload_size_bytes: int) -> bytes:
    """Fixed header and topic of a PUBLISH (MQTT 3.1.1 §3.3) whose packet id (QoS > 0) and payload
    of ``payload_size_bytes`` the caller appends: load clients reuse one prefix for every message."""
    remaining = 2 + len(topic.encode()) + (2 if qos else 0) + payload_size_bytes
    return bytes([(PUBLISH << 4) | (qos << 1)]) + varint(remaining) + mqtt_str(topic)
