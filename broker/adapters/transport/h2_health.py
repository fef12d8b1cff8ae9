"""The standard health service ``grpc.health.v1.Health`` (Check and Watch) for the h2 link
runtime (h2_runtime.py), served by hand: a request and a response of one field each. Its streams
are ``h2``'s own (flow control and all); ``conn`` is the runtime's connection (``h2``, ``flush``,
``plain``, ``send_window``)."""

from __future__ import annotations

import contextlib
from typing import Any

import grpc
import h2.exceptions

Status = grpc.StatusCode
_SERVING, _NOT_SERVING, _SERVICE_UNKNOWN = 1, 2, 3


def percent_encode(text: str) -> bytes:
    out = bytearray()
    for byte in text.encode("utf-8"):
        out += bytes([byte]) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte
    return bytes(out)


class Health:
    """``grpc.health.v1.Health`` state, the calls of grpc_health's ``HealthServicer`` used here."""

    def __init__(self) -> None:
        self.statuses: dict[str, int] = {}
        self.watchers: set[PlainStream] = set()
        self.shutting_down = False

    async def set(self, service: str, status: int) -> None:
        if self.shutting_down:
            return
        self._set(service, int(status))

    def _set(self, service: str, status: int) -> None:
        self.statuses[service] = status
        for watcher in list(self.watchers):
            watcher.status_changed(service)

    async def enter_graceful_shutdown(self) -> None:
        if self.shutting_down:
            return
        for service in list(self.statuses):
            self._set(service, _NOT_SERVING)
        self.shutting_down = True


class PlainStream:
    """A health Check or Watch call, flow control and all by ``h2``."""

    def __init__(self, conn: Any, stream_id: int, health: Health, *, watch: bool) -> None:
        self.conn = conn
        self.id = stream_id
        self.health = health
        self.watch = watch
        self.request = bytearray()
        self.service: str | None = None
        self.sent: int | None = None
        self.done = False

    def data(self, chunk: bytes) -> None:
        if self.service is not None:
            return
        self.request += chunk
        if len(self.request) > 64 * 1024:
            self._end(Status.RESOURCE_EXHAUSTED, "health request too large")
            return
        if len(self.request) >= 5 and len(self.request) >= 5 + int.from_bytes(self.request[1:5], "big"):
            from grpc_health.v1 import health_pb2

            try:
                size = int.from_bytes(self.request[1:5], "big")
                request = health_pb2.HealthCheckRequest.FromString(bytes(self.request[5 : 5 + size]))
            except Exception:
                self._end(Status.INTERNAL, "bad health request")
                return
            self.service = request.service
            self._answer()

    def ended(self) -> None:
        if self.service is None and not self.done:
            self._end(Status.INTERNAL, "no health request")

    def _answer(self) -> None:
        assert self.service is not None
        status = self.health.statuses.get(self.service)
        conn = self.conn
        if not self.watch:
            if status is None:
                self._end(Status.NOT_FOUND, "unknown service")
                return
            self._send(status)
            self._end(Status.OK, "")
            return
        conn.h2.send_headers(self.id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        self.health.watchers.add(self)
        self._send(_SERVICE_UNKNOWN if status is None else status)

    def status_changed(self, service: str) -> None:
        if service == self.service and not self.done:
            self._send(self.health.statuses[service])

    def _send(self, status: int) -> None:
        if status == self.sent:
            return
        self.sent = status
        body = b"\x08" + bytes([status])
        message = b"\x00" + len(body).to_bytes(4, "big") + body
        conn = self.conn
        try:
            if not self.watch:
                conn.h2.send_headers(self.id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
            conn.h2.send_data(self.id, message)
            conn.send_window -= len(message)
        except h2.exceptions.ProtocolError:
            self.closed()
            return
        conn.flush()

    def _end(self, code: grpc.StatusCode, details: str) -> None:
        self.done = True
        self.health.watchers.discard(self)
        self.conn.plain.pop(self.id, None)
        trailers = [(b"grpc-status", str(code.value[0]).encode())]
        if details:
            trailers.append((b"grpc-message", percent_encode(details)))
        if self.sent is None and not self.watch:
            trailers = [(b":status", b"200"), (b"content-type", b"application/grpc"), *trailers]
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.conn.h2.send_headers(self.id, trailers, end_stream=True)
        self.conn.flush()

    def closed(self) -> None:
        self.done = True
        self.health.watchers.discard(self)
