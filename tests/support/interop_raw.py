"""A tiny hand-written MQTT 3.1/3.1.1/5.0 client over a raw socket, for black-box tests.

It deliberately does NOT use broker/mqtt/codec.py: the interop suite checks the broker from the
outside, so the bytes here are encoded straight from the specifications (MQTT 3.1.1 §2-§3,
MQTT 5.0 §2-§3) and can be made malformed on purpose. Only what the tests need is implemented.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field
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


class ConnectionClosed(Exception):
    """The broker closed the connection (EOF or reset)."""


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


@dataclass
class RawPacket:
    ptype: int
    flags: int
    body: bytes


@dataclass
class ReceivedPublish:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int | None
    props: dict[int, Any] = field(default_factory=dict)


def parse_publish(pkt: RawPacket, level: int) -> ReceivedPublish:
    assert pkt.ptype == PUBLISH, f"expected PUBLISH, got packet type {pkt.ptype}"
    qos = (pkt.flags >> 1) & 3
    n = struct.unpack_from("!H", pkt.body, 0)[0]
    topic = pkt.body[2 : 2 + n].decode()
    offset = 2 + n
    packet_id = None
    if qos:
        packet_id = struct.unpack_from("!H", pkt.body, offset)[0]
        offset += 2
    props: dict[int, Any] = {}
    if level == 5:
        props, offset = decode_properties(pkt.body, offset)
    return ReceivedPublish(
        topic, pkt.body[offset:], qos, bool(pkt.flags & 1), bool(pkt.flags & 8), packet_id, props
    )


class RawClient:
    """A blocking socket speaking MQTT by hand; every read is bounded by a timeout."""

    def __init__(self, host: str, port: int, *, level: int = 4, timeout_s: float = 5.0) -> None:
        self.level = level
        self.timeout_s = timeout_s
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _try_parse(self) -> RawPacket | None:
        if len(self.buffer) < 2:
            return None
        length, shift, i = 0, 0, 1
        while True:
            if i >= len(self.buffer):
                return None
            byte = self.buffer[i]
            length += (byte & 0x7F) << shift
            shift += 7
            i += 1
            if not byte & 0x80:
                break
        if len(self.buffer) < i + length:
            return None
        first = self.buffer[0]
        body = bytes(self.buffer[i : i + length])
        del self.buffer[: i + length]
        return RawPacket(first >> 4, first & 0x0F, body)

    def read_packet(self, timeout_s: float | None = None) -> RawPacket:
        """Next packet; raises ConnectionClosed on EOF/reset, TimeoutError when nothing came."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        while True:
            pkt = self._try_parse()
            if pkt is not None:
                return pkt
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no MQTT packet from the broker in time")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no MQTT packet from the broker in time") from None
            except (ConnectionResetError, BrokenPipeError) as exc:
                raise ConnectionClosed(str(exc)) from exc
            if not chunk:
                raise ConnectionClosed("EOF")
            self.buffer += chunk

    def read_until_closed(self, timeout_s: float = 5.0) -> list[RawPacket]:
        """Read until the broker closes the connection; returns the packets seen before the close.

        Raises TimeoutError if the connection is still open after timeout_s.
        """
        deadline = time.monotonic() + timeout_s
        seen: list[RawPacket] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"connection still open after {timeout_s} s; packets seen: {seen}")
            try:
                seen.append(self.read_packet(remaining))
            except ConnectionClosed:
                return seen

    def connect(self, client_id: str, **kwargs: Any) -> tuple[bool, int, dict[int, Any]]:
        """Send CONNECT, return (session_present, return/reason code, CONNACK properties)."""
        self.send(connect_packet(client_id, level=self.level, **kwargs))
        pkt = self.read_packet()
        assert pkt.ptype == CONNACK, f"expected CONNACK, got packet type {pkt.ptype}"
        props: dict[int, Any] = {}
        if self.level == 5 and len(pkt.body) > 2:
            props, _ = decode_properties(pkt.body, 2)
        return bool(pkt.body[0] & 1), pkt.body[1], props

    def subscribe(self, filters: list[tuple[str, int]], packet_id: int = 1, **kwargs: Any) -> list[int]:
        self.send(subscribe_packet(packet_id, filters, level=self.level, **kwargs))
        pkt = self.read_packet()
        assert pkt.ptype == SUBACK, f"expected SUBACK, got packet type {pkt.ptype}"
        offset = 2
        if self.level == 5:
            _, offset = decode_properties(pkt.body, 2)
        return list(pkt.body[offset:])

    def read_publish(self, timeout_s: float | None = None) -> ReceivedPublish:
        """Next PUBLISH (PINGRESPs are skipped)."""
        while True:
            pkt = self.read_packet(timeout_s)
            if pkt.ptype == PINGRESP:
                continue
            return parse_publish(pkt, self.level)
