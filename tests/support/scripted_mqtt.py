"""A scripted MQTT 5 server for client-behaviour tests: no broker, the test writes every packet.

One connection at a time on a free loopback port. The tests of real clients' QoS 2 behaviour
across a broker restart (paho: tests/process/integration/test_paho_qos2_reconnect_pubrel.py;
libmosquitto: test_libmosquitto_qos2_redelivery.py) accept the client's (re)connection, read its
packets and answer exactly what a broker at that point would, and ``drop`` the connection the way a
broker's kill -9 ends it.
"""

from __future__ import annotations

import socket

WAIT_S = 10.0
CONNECT, PUBLISH, PUBREC, PUBREL, SUBSCRIBE = 1, 3, 5, 6, 8


class ScriptedServer:
    """MQTT 5 connections on one loopback port, one at a time; the test writes the server's packets."""

    def __init__(self, wait_s: float = WAIT_S) -> None:
        self.wait_s = wait_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(wait_s)
        self.port = self.listener.getsockname()[1]
        self.conn: socket.socket | None = None

    def accept(self, *, session_present: bool, suback: bool = False) -> bytes:
        """Accept the client's (re)connection and answer its CONNECT with CONNACK (and, with
        ``suback``, its SUBSCRIBE with SUBACK granting QoS 2); returns the CONNECT's body."""
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(self.wait_s)
        kind, connect = self.read()
        assert kind >> 4 == CONNECT, f"expected CONNECT, got {kind:#x}"
        self.conn.sendall(bytes((0x20, 3, 1 if session_present else 0, 0, 0)))
        if suback:
            kind, body = self.read()
            assert kind >> 4 == SUBSCRIBE, f"expected SUBSCRIBE, got {kind:#x}"
            self.conn.sendall(bytes((0x90, 4)) + body[:2] + b"\x00\x02")
        return connect

    def refuse_once(self) -> None:
        """A failed reconnect attempt, as a restarting broker gives it: the connection ends
        before any CONNACK."""
        conn, _ = self.listener.accept()
        conn.close()

    def read(self) -> tuple[int, bytes]:
        """The client's next packet: (first byte, body)."""
        first = self._exactly(1)[0]
        length, shift = 0, 0
        while True:
            byte = self._exactly(1)[0]
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        return first, self._exactly(length)

    def _exactly(self, size: int) -> bytes:
        assert self.conn is not None
        data = b""
        while len(data) < size:
            chunk = self.conn.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the client closed the connection")
            data += chunk
        return data

    def send(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(data)

    def publish_qos2(self, packet_id: int, payload: bytes, *, dup: bool = False) -> None:
        """PUBLISH QoS 2 on topic ``t`` (no properties)."""
        body = b"\x00\x01t" + packet_id.to_bytes(2, "big") + b"\x00" + payload
        self.send(bytes((0x34 | (0x08 if dup else 0), len(body))) + body)

    def pubrec(self, packet_id: int) -> None:
        self.send(bytes((0x50, 2)) + packet_id.to_bytes(2, "big"))

    def pubrel(self, packet_id: int) -> None:
        self.send(bytes((0x62, 2)) + packet_id.to_bytes(2, "big"))

    def expect(self, kind: int, packet_id: int) -> None:
        """The client's next packet is the first byte ``kind`` for ``packet_id``."""
        got, body = self.read()
        assert (got, body[:2]) == (kind, packet_id.to_bytes(2, "big")), (hex(got), body.hex())

    def drop(self) -> None:
        """The broker's kill -9, as the client sees it: the connection just ends."""
        assert self.conn is not None
        self.conn.close()
        self.conn = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()
