"""A tiny hand-written MQTT 3.1/3.1.1/5.0 client over a raw socket, for black-box tests.

Its packets come from the project's one raw encoder, ``tools.mqtt_raw`` (straight from the
specifications, not from broker/mqtt/codec.py, and malformed on purpose where a test wants).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from tools.mqtt_raw import (  # the encoder lives in tools/; re-exported for the tests
    CONNACK,
    PINGRESP,
    PUBLISH,
    SUBACK,
    connect_packet,
    decode_properties,
    subscribe_packet,
)


class ConnectionClosed(Exception):
    """The broker closed the connection (EOF or reset)."""


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
