"""gRPC on the event loop: a minimal gRPC-over-HTTP/2 runtime of SkipMQ's own (docs/notes/links.md).

The broker links (``skipmq.v1.PeerLink/Open``) run on this layer with ``cluster.link_runtime =
h2``; ``grpcio`` (grpc.aio) is the alternative. What it does, and what it leaves to whom:

* ``h2`` (the HTTP/2 state machine grpclib uses) does the connection preface, SETTINGS,
  HEADERS/CONTINUATION with HPACK, PING (keepalive, grpcio's BDP pings), GOAWAY, RST_STREAM, and
  the flow control of every stream that is not a PeerLink stream (the health service, anything
  else a stock client opens, which is answered UNIMPLEMENTED).
* A ``PeerLink/Open`` stream's DATA frames are written and parsed here, by hand, in the
  protocol's ``data_received``: the 9-byte HTTP/2 frame header and the 5-byte gRPC prefix, split at
  the peer's SETTINGS_MAX_FRAME_SIZE and kept within the peer's connection and stream windows
  (tracked here: ``h2`` never sees these frames), window returned per half window consumed. A
  message's length prefix is checked against ``max_message_bytes`` before anything of it is
  buffered: a larger one ends the stream with RESOURCE_EXHAUSTED (``on_oversized`` tells the
  transport, which logs and counts it). Each message goes to the link's receiver in the same
  callback (no queue, no task between the socket and the receiver).
* TLS is ``ssl.SSLContext`` (ALPN h2, client certificates required, the cluster CA; tls.py); the
  peer's certificate is read from the ssl object on both ends, so a dialer can check that the
  answering broker's certificate names the peer id it dialed (:class:`PeerIdentityError`).
* ``grpc.health.v1.Health`` Check and Watch are served by hand (h2_health.py).

The objects mimic the part of grpc.aio's API that link.py uses (``read`` returning
``grpc.aio.EOF``, ``write``, ``abort``, ``peer``, ``auth_context``; errors as
``grpc.aio.AioRpcError``), so the link life cycle above is the same on both runtimes.

Size: ~870 lines, over the house's ~800: one HTTP/2 connection with its hand-made DATA path,
the server and the dialer's channel, which share that connection class; the frame parser and the
window accounting are one state (the health service is in h2_health.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from broker.adapters.transport.h2_health import Health, PlainStream, percent_encode
from broker.adapters.transport.tls import PeerIdentityError

log = logging.getLogger("skipmq.transport")

PEER_LINK_OPEN = "/skipmq.v1.PeerLink/Open"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"

_PREFACE_BYTES = 24
_DATA = 0x0
_WINDOW_UPDATE = 0x8
_END_STREAM = 0x1
_PADDED = 0x8
_MAX_WINDOW = 2**31 - 1
# what this side grants each PeerLink stream and the connection (returned per half consumed)
_RECEIVE_WINDOW_BYTES = 4 * 1024 * 1024
_MAX_INBOUND_FRAME_BYTES = 1024 * 1024  # SETTINGS_MAX_FRAME_SIZE announced to the peer

Status = grpc.StatusCode
Codec = Callable[[Any], Any]
EOF = grpc.aio.EOF


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int
    keepalive_time_s: float
    # (peer address, size, limit): a PeerLink message over max_message_bytes ended its stream
    on_oversized: Callable[[str, int, int], None] | None = None


def _status_of(code: int) -> grpc.StatusCode:
    for status in grpc.StatusCode:
        if status.value[0] == code:
            return status
    return grpc.StatusCode.UNKNOWN


def _window_update(stream_id: int, increment: int) -> bytes:
    return b"\x00\x00\x04\x08\x00" + stream_id.to_bytes(4, "big") + increment.to_bytes(4, "big")


class _Stream:
    """One PeerLink call on a connection, its DATA handled by hand (both ends)."""

    def __init__(self, conn: _Connection, stream_id: int, limit: int) -> None:
        self.conn = conn
        self.id = stream_id
        self.sid = stream_id.to_bytes(4, "big")
        self.limit = limit
        self.send_window = conn.h2.remote_settings.initial_window_size
        self.consumed = 0
        self.buffer = bytearray()
        self.messages: deque[bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.receiver: Callable[[bytes], bool] | None = None
        self.ended: asyncio.Future[None] = conn.loop.create_future()  # the result: the call's end
        self.error: grpc.aio.AioRpcError | None = None  # set when the call ended with a non-OK status
        self.remote_done = False  # the peer half-closed (read() gives EOF after the queued messages)
        self.local_done = False  # our half is closed (trailers / END_STREAM / reset sent)
        self.headers_sent = False  # server side: the response headers

    # ---------------------------------------------------------------- receiving (data_received)
    def take(self, payload: memoryview) -> None:
        buffer = self.buffer
        if buffer:
            buffer += payload
            data: Any = buffer
        else:
            data = payload
        size_all = len(data)
        pos = 0
        while size_all - pos >= 5:
            size = int.from_bytes(data[pos + 1 : pos + 5], "big")
            if size > self.limit:
                self.conn.oversized(self, size)
                return
            if data[pos]:
                self.conn.fail_stream(self, Status.UNIMPLEMENTED, "compressed messages are not accepted")
                return
            end = pos + 5 + size
            if end > size_all:
                break
            self._message(bytes(data[pos + 5 : end]))
            pos = end
            if self.ended.done():
                return
        if buffer:
            del buffer[:pos]
        elif pos < size_all:
            self.buffer = bytearray(data[pos:])

    def _message(self, message: bytes) -> None:
        receiver = self.receiver
        if receiver is not None:
            if not receiver(message):
                self.receiver = None
                self.conn.drop_stream(self)
                self.finish_call(None)  # the reader is done; the link above ends the call
            return
        self.messages.append(message)
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def remote_ended(self) -> None:
        self.remote_done = True
        self._wake()
        if self.receiver is not None and not self.messages:
            self.finish_call(None)

    def finish_call(self, error: grpc.aio.AioRpcError | None) -> None:
        """The call is over for the reader (EOF, or ``error``)."""
        if self.error is None:
            self.error = error
        self.remote_done = True
        self._wake()
        if not self.ended.done():
            self.ended.set_result(None)

    # ---------------------------------------------------------------- the API link.py uses
    async def read(self) -> Any:
        while not self.messages:
            if self.error is not None:
                raise self.error
            if self.remote_done:
                return EOF
            self.waiter = self.conn.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return self.messages.popleft()

    async def deliver_to(self, receiver: Callable[[bytes], bool]) -> None:
        """Hand every message to ``receiver`` from the socket callback until the call ends (or
        ``receiver`` returns False: the rest is dropped); raises the call's error, if any."""
        while self.messages:
            if not receiver(self.messages.popleft()):
                self.conn.drop_stream(self)
                return
        if self.error is None and not self.remote_done:
            self.receiver = receiver
            await asyncio.shield(self.ended)
        if self.error is not None:
            raise self.error

    def try_write(self, data: bytes) -> bool:
        """Write ``data`` as one message now, in one DATA frame, if the windows, the peer's frame
        size and the socket allow it; False (nothing written) otherwise, or if the call is over:
        ``write`` then waits for room, or raises the call's error."""
        conn = self.conn
        size = len(data) + 5
        if (
            size > self.send_window
            or size > conn.send_window
            or size > conn.peer_max_frame
            or not conn.writable
            or self.local_done
            or conn.closed
            or (self.error is not None and self.ended.done())
        ):
            return False
        self.send_window -= size
        conn.send_window -= size
        conn.transport.write(
            b"".join(
                (size.to_bytes(3, "big"), b"\x00\x00", self.sid, b"\x00", (size - 5).to_bytes(4, "big"), data)
            )
        )
        return True

    async def write(self, data: bytes) -> None:
        if self.local_done or (self.ended.done() and self.error is not None):
            raise self.error or rpc_error(Status.CANCELLED, "the stream is closed")
        if self.try_write(data):
            return
        await self._write_slowly(b"\x00" + len(data).to_bytes(4, "big") + data)

    async def _write_slowly(self, message: bytes) -> None:
        conn = self.conn
        view = memoryview(message)
        while view:
            if self.local_done or conn.closed:
                raise self.error or rpc_error(Status.UNAVAILABLE, "the connection closed")
            room = min(self.send_window, conn.send_window, conn.peer_max_frame, len(view))
            if room <= 0 or not conn.writable:
                await conn.wait_for_room()
                continue
            self.send_window -= room
            conn.send_window -= room
            conn.transport.write(room.to_bytes(3, "big") + b"\x00\x00" + self.sid + bytes(view[:room]))
            view = view[room:]


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection (client or server side) with hand-made DATA for PeerLink streams."""

    def __init__(self, *, client_side: bool, limits: Limits, server: H2Server | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.client_side = client_side
        self.limits = limits
        self.server = server
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=client_side, header_encoding=None)
        )
        self.streams: dict[int, _Stream] = {}
        self.plain: dict[int, PlainStream] = {}  # h2-driven streams (health)
        self.send_window = 65_535  # the peer's connection window for us (real; h2 sees only part)
        self.consumed = 0  # received PeerLink DATA not yet returned to the connection window
        self.peer_max_frame = 16_384
        self.writable = True
        self.closed = False
        self.room: asyncio.Event = asyncio.Event()
        self.pending = bytearray()
        self.preface_left = 0 if client_side else _PREFACE_BYTES
        self.transport: Any = None
        self.peer_der: bytes | None = None
        self.peer = ""
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.last_received = self.loop.time()
        self.keepalive: asyncio.TimerHandle | None = None
        self.ping_sent_at = 0.0

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        sslobj = transport.get_extra_info("ssl_object")
        if sslobj is not None:
            self.peer_der = sslobj.getpeercert(binary_form=True)
        name = transport.get_extra_info("peername")
        if isinstance(name, tuple) and len(name) >= 2:
            host, port = name[0], name[1]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
        self.h2.initiate_connection()
        self.h2.update_settings(
            {
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _RECEIVE_WINDOW_BYTES,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: _MAX_INBOUND_FRAME_BYTES,
            }
        )
        self.h2.increment_flow_control_window(_RECEIVE_WINDOW_BYTES - 65_535)
        self.flush()
        if self.server is not None:
            self.server.connections.add(self)
        self._schedule_keepalive()
        if not self.ready.done():
            self.ready.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.keepalive is not None:
            self.keepalive.cancel()
        if self.server is not None:
            self.server.connections.discard(self)
        error = rpc_error(Status.UNAVAILABLE, f"connection lost: {exc}" if exc else "connection closed")
        for stream in list(self.streams.values()):
            stream.local_done = True
            stream.finish_call(error)
        self.streams.clear()
        for plain in list(self.plain.values()):
            plain.closed()
        self.plain.clear()
        self.room.set()
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("connection closed before it was up"))

    def pause_writing(self) -> None:
        self.writable = False
        self.room.clear()

    def resume_writing(self) -> None:
        self.writable = True
        self.room.set()

    async def wait_for_room(self) -> None:
        self.room.clear()
        await self.room.wait()

    def data_received(self, data: bytes) -> None:
        self.last_received = self.loop.time()
        try:
            self._frames(data)
        except h2.exceptions.ProtocolError as exc:
            log.info("HTTP/2 protocol error from %s: %s; closing the connection", self.peer, exc)
            with contextlib.suppress(Exception):
                self.h2.close_connection(h2.errors.ErrorCodes.PROTOCOL_ERROR)
            self.flush()
            self.transport.close()
            return
        self.flush()

    def _frames(self, data: bytes | bytearray) -> None:
        if self.pending:  # a frame in parts (large DATA frames): grown in place, not copied per read
            pending = self.pending
            pending += data
            data = pending
            self.pending = bytearray()
        pos = 0
        if self.preface_left:
            take = min(self.preface_left, len(data))
            self._feed(data[:take])
            self.preface_left -= take
            pos = take
        size_all = len(data)
        view = memoryview(data)
        streams = self.streams
        while size_all - pos >= 9:
            length = int.from_bytes(data[pos : pos + 3], "big")
            if length > _MAX_INBOUND_FRAME_BYTES:
                raise h2.exceptions.FrameTooLargeError(f"a frame of {length} bytes")
            end = pos + 9 + length
            if end > size_all:
                break
            kind = data[pos + 3]
            stream_id = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFF_FFFF
            if kind == _DATA and stream_id in streams:
                self._peer_link_data(streams[stream_id], view[pos + 9 : end], data[pos + 4], length)
            elif kind == _WINDOW_UPDATE and (stream_id == 0 or stream_id in streams) and length == 4:
                self._window_update(stream_id, int.from_bytes(data[pos + 9 : end], "big") & 0x7FFF_FFFF)
            else:
                self._feed(data[pos:end])
            pos = end
        del view
        if pos < size_all:
            self.pending = data if pos == 0 and isinstance(data, bytearray) else bytearray(data[pos:])

    def _peer_link_data(self, stream: _Stream, payload: memoryview, flags: int, length: int) -> None:
        if flags & _PADDED and length:
            payload = payload[1 : len(payload) - payload[0]]
        self.consumed += length
        if self.consumed >= _RECEIVE_WINDOW_BYTES // 2:
            self.transport.write(_window_update(0, self.consumed))
            self.consumed = 0
        if not stream.ended.done():
            stream.consumed += length
            if stream.consumed >= _RECEIVE_WINDOW_BYTES // 2 and not flags & _END_STREAM:
                self.transport.write(_window_update(stream.id, stream.consumed))
                stream.consumed = 0
            if payload:
                stream.take(payload)
        if flags & _END_STREAM:
            # h2 learns of the half-close through an empty DATA frame (no flow control)
            self._feed(b"\x00\x00\x00\x00\x01" + stream.sid)
            if not stream.ended.done():
                stream.remote_ended()

    def _window_update(self, stream_id: int, increment: int) -> None:
        if increment == 0:
            return
        if stream_id == 0:
            self.send_window += increment
            # h2 sends only the plain streams' data: keep its own view of the window from overflowing
            room = _MAX_WINDOW - self.h2.outbound_flow_control_window
            if room > 0:
                self._feed(_window_update(0, min(room, increment)))
        else:
            self.streams[stream_id].send_window += increment
        self.room.set()

    def _feed(self, frame: bytes | bytearray) -> None:
        for event in self.h2.receive_data(bytes(frame)):
            self._event(event)

    def flush(self) -> None:
        out = self.h2.data_to_send()
        if out and self.transport is not None and not self.closed:
            self.transport.write(out)

    # ---------------------------------------------------------------- h2 events
    def _event(self, event: Any) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event.stream_id, dict(event.headers))
        elif isinstance(event, h2.events.ResponseReceived):
            self._response(event.stream_id, dict(event.headers), trailers=False)
        elif isinstance(event, h2.events.TrailersReceived):
            self._response(event.stream_id, dict(event.headers), trailers=True)
        elif isinstance(event, h2.events.DataReceived):
            plain = self.plain.get(event.stream_id)
            if event.flow_controlled_length:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if plain is not None:
                plain.data(event.data)
        elif isinstance(event, h2.events.StreamEnded):
            plain = self.plain.get(event.stream_id)
            if plain is not None:
                plain.ended()
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams.pop(event.stream_id, None)
            if stream is not None:
                stream.local_done = True
                code = Status.CANCELLED if event.error_code in (0, 8) else Status.INTERNAL
                stream.finish_call(
                    rpc_error(code, f"the peer reset the stream (HTTP/2 error {event.error_code})")
                )
            plain = self.plain.pop(event.stream_id, None)
            if plain is not None:
                plain.closed()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            changed = event.changed_settings.get(h2.settings.SettingCodes.INITIAL_WINDOW_SIZE)
            if changed is not None:
                delta = changed.new_value - (changed.original_value or 65_535)
                for stream in self.streams.values():
                    stream.send_window += delta
            self.peer_max_frame = self.h2.remote_settings.max_frame_size
            self.room.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            error = rpc_error(Status.UNAVAILABLE, f"the peer sent GOAWAY (HTTP/2 error {event.error_code})")
            last = event.last_stream_id if event.error_code == 0 else -1
            for stream_id, stream in list(self.streams.items()):
                if last is None or stream_id > last:
                    del self.streams[stream_id]
                    stream.local_done = True
                    stream.finish_call(error)
            if event.error_code != 0 or not self.streams:
                self.flush()
                self.transport.close()

    def _request(self, stream_id: int, headers: dict[bytes, bytes]) -> None:
        server = self.server
        path = headers.get(b":path", b"").decode("latin-1")
        content_type = headers.get(b"content-type", b"")
        if server is None or not content_type.startswith(b"application/grpc"):
            self._trailers_only(stream_id, Status.UNIMPLEMENTED, "not a gRPC request")
        elif path == server.path:
            stream = _Stream(self, stream_id, self.limits.max_message_bytes)
            self.streams[stream_id] = stream
            self.h2.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
            stream.headers_sent = True
            server.serve(_ServerContext(stream, server.decode, server.encode))
        elif path in (HEALTH_CHECK, HEALTH_WATCH):
            self.plain[stream_id] = PlainStream(self, stream_id, server.health, watch=path == HEALTH_WATCH)
        else:
            self._trailers_only(stream_id, Status.UNIMPLEMENTED, f"method {path} not found")

    def _response(self, stream_id: int, headers: dict[bytes, bytes], *, trailers: bool) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        status = headers.get(b"grpc-status")
        if status is None:
            if not trailers and headers.get(b":status", b"200") == b"200":
                return  # the response headers: messages follow
            code = Status.UNKNOWN if trailers else Status.UNAVAILABLE
            details = f"no grpc-status (HTTP {headers.get(b':status', b'?').decode('latin-1')})"
        else:
            code = _status_of(int(status))
            details = headers.get(b"grpc-message", b"").decode("utf-8", "replace")
        del self.streams[stream_id]
        stream.local_done = True
        stream.finish_call(None if code == Status.OK else rpc_error(code, details))

    # ---------------------------------------------------------------- ending streams
    def _trailers_only(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        headers = [
            (b":status", b"200"),
            (b"content-type", b"application/grpc"),
            (b"grpc-status", str(code.value[0]).encode()),
            (b"grpc-message", percent_encode(details)),
        ]
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.send_headers(stream_id, headers, end_stream=True)
        self.flush()

    def finish_server_stream(self, stream: _Stream, code: grpc.StatusCode, details: str) -> None:
        """Server side: end the call with ``code`` (trailers; RST_STREAM NO_ERROR if the client
        is still sending). The first end wins."""
        if stream.local_done or self.closed:
            return
        stream.local_done = True
        self.streams.pop(stream.id, None)
        trailers = [(b"grpc-status", str(code.value[0]).encode())]
        if details:
            trailers.append((b"grpc-message", percent_encode(details)))
        try:
            if not stream.headers_sent:
                trailers = [(b":status", b"200"), (b"content-type", b"application/grpc"), *trailers]
            self.h2.send_headers(stream.id, trailers, end_stream=True)
            if not stream.remote_done:
                self.h2.reset_stream(stream.id, h2.errors.ErrorCodes.NO_ERROR)
        except h2.exceptions.ProtocolError:
            pass
        self.flush()
        stream.finish_call(None if code == Status.OK else rpc_error(code, details))

    def cancel_client_stream(self, stream: _Stream, error: grpc.aio.AioRpcError | None = None) -> None:
        if stream.id in self.streams and not self.closed:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.reset_stream(stream.id, h2.errors.ErrorCodes.CANCEL)
            self.flush()
        stream.local_done = True
        self.streams.pop(stream.id, None)
        stream.finish_call(error or rpc_error(Status.CANCELLED, "cancelled"))

    def fail_stream(self, stream: _Stream, code: grpc.StatusCode, details: str) -> None:
        if self.client_side:
            self.cancel_client_stream(stream, rpc_error(code, details))
        else:
            self.finish_server_stream(stream, code, details)

    def drop_stream(self, stream: _Stream) -> None:
        """The receiver wants nothing more of this stream: its messages are discarded from now on
        (the link above ends it: a server stream with OK, a client stream with a cancel)."""
        stream.limit = 0
        stream.buffer.clear()
        stream.take = lambda payload: None  # type: ignore[method-assign]

    def oversized(self, stream: _Stream, size: int) -> None:
        limit = stream.limit
        details = f"Received message larger than max ({size} vs. {limit})"
        if self.limits.on_oversized is not None:
            try:
                self.limits.on_oversized(self.peer, size, limit)
            except Exception:
                log.exception("on_oversized raised")
        self.drop_stream(stream)
        self.fail_stream(stream, Status.RESOURCE_EXHAUSTED, details)

    # ---------------------------------------------------------------- client side
    def open_stream(self, authority: str, scheme: bytes, path: str = PEER_LINK_OPEN) -> _Stream:
        stream_id = self.h2.get_next_available_stream_id()
        stream = _Stream(self, stream_id, self.limits.max_message_bytes)
        self.streams[stream_id] = stream
        self.h2.send_headers(
            stream_id,
            [
                (b":method", b"POST"),
                (b":scheme", scheme),
                (b":path", path.encode()),
                (b":authority", authority.encode()),
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
                (b"user-agent", b"skipmq-h2"),
            ],
        )
        self.flush()
        return stream

    # ---------------------------------------------------------------- keepalive
    def _schedule_keepalive(self) -> None:
        self.keepalive = self.loop.call_later(self.limits.keepalive_time_s, self._keepalive_due)

    def _keepalive_due(self) -> None:
        if self.closed:
            return
        now = self.loop.time()
        if self.ping_sent_at and self.last_received < self.ping_sent_at:
            log.info("no answer from %s to a keepalive ping; closing the connection", self.peer)
            self.transport.abort()
            return
        self.ping_sent_at = 0.0
        if now - self.last_received >= self.limits.keepalive_time_s * 0.9:
            self.h2.ping(b"skipmqka")
            self.flush()
            self.ping_sent_at = now
            self.keepalive = self.loop.call_later(
                max(1.0, self.limits.keepalive_time_s / 2), self._keepalive_due
            )
            return
        self._schedule_keepalive()


# -------------------------------------------------------------------- server
class _ServerContext:
    """An accepted call, as grpc.aio's ``ServicerContext`` (the part link.py and the federation
    node use); ``decode``/``encode``: the messages' codec (None: bytes, as PeerLink's)."""

    def __init__(self, stream: _Stream, decode: Codec | None = None, encode: Codec | None = None) -> None:
        self.stream = stream
        self.decode = decode
        self.encode = encode

    async def read(self) -> Any:
        message = await self.stream.read()
        return message if message is EOF or self.decode is None else self.decode(message)

    async def write(self, message: Any) -> None:
        await self.stream.write(message if self.encode is None else self.encode(message))

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.stream.conn.finish_server_stream(self.stream, code, details)

    def deliver_to(self, receiver: Callable[[bytes], bool]) -> Awaitable[None]:
        return self.stream.deliver_to(receiver)

    def try_write(self, data: bytes) -> bool:
        """PeerLink (bytes, no codec): ``data`` written now if it fits (``_Stream.try_write``)."""
        return self.encode is None and self.stream.try_write(data)

    def peer(self) -> str:
        return self.stream.conn.peer

    def auth_context(self) -> dict[str, list[bytes]]:
        der = self.stream.conn.peer_der
        if not der:
            return {}
        return {"x509_pem_cert": [ssl.DER_cert_to_PEM_cert(der).encode()]}


class H2Server:
    """Serves one bidirectional-stream method, ``PeerLink/Open`` unless ``path`` says another
    (``handler(None, context)`` per call, like a grpc.aio handler), and the health service, on a
    socket the event loop reads itself."""

    def __init__(
        self,
        handler: Callable[[Any, Any], Awaitable[None]],
        limits: Limits,
        ssl_context: Callable[[], ssl.SSLContext] | None,
        *,
        path: str = PEER_LINK_OPEN,
        decode: Codec | None = None,
        encode: Codec | None = None,
    ) -> None:
        self.handler = handler
        self.path = path
        self.decode = decode
        self.encode = encode
        self.limits = limits
        self.ssl_context = ssl_context
        self.health = Health()
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def bind(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        context = self.ssl_context() if self.ssl_context is not None else None
        self._server = await loop.create_server(
            lambda: _Connection(client_side=False, limits=self.limits, server=self),
            host or None,
            port,
            ssl=context,
            reuse_address=True,
            ssl_handshake_timeout=10.0 if context is not None else None,
        )
        return int(self._server.sockets[0].getsockname()[1])

    def serve(self, context: _ServerContext) -> None:
        task = asyncio.get_running_loop().create_task(self._run(context))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, context: _ServerContext) -> None:
        stream = context.stream
        try:
            await self.handler(None, context)
        except asyncio.CancelledError:
            stream.conn.finish_server_stream(stream, Status.CANCELLED, "the server is stopping")
            raise
        except grpc.aio.AioRpcError as exc:
            stream.conn.finish_server_stream(stream, exc.code(), exc.details() or "")
        except Exception as exc:
            log.exception("PeerLink handler failed")
            stream.conn.finish_server_stream(stream, Status.UNKNOWN, f"{type(exc).__name__}: {exc}")
        else:
            stream.conn.finish_server_stream(stream, Status.OK, "")

    async def stop(self, grace: float | None = None) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            with contextlib.suppress(Exception):
                conn.h2.close_connection()
                conn.flush()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=max(0.01, grace or 0.0))
        for task in list(self.tasks):
            task.cancel()
        for conn in list(self.connections):
            conn.transport.close()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=1.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)


# -------------------------------------------------------------------- dialer
class _Call:
    """A dialed call, as grpc.aio's ``StreamStreamCall`` (the part link.py and the federation
    node use); ``encode``/``decode``: the messages' codec (None: bytes, as PeerLink's)."""

    def __init__(
        self, channel: H2Channel, path: str, encode: Codec | None = None, decode: Codec | None = None
    ) -> None:
        self.channel = channel
        self.path = path
        self.encode = encode
        self.decode = decode
        self.stream: _Stream | None = None
        self.opening: asyncio.Future[_Stream] | None = None
        self.cancelled = False

    async def _open(self) -> _Stream:
        if self.stream is None:
            if self.opening is None:  # a reader and a writer may both be first: one stream
                self.opening = asyncio.ensure_future(self.channel.open_stream(self.path))
            stream = await asyncio.shield(self.opening)
            if self.stream is None:
                self.stream = stream
                if self.cancelled:
                    self.cancel()
        return self.stream

    async def write(self, message: Any) -> None:
        await (await self._open()).write(message if self.encode is None else self.encode(message))

    async def read(self) -> Any:
        message = await (await self._open()).read()
        return message if message is EOF or self.decode is None else self.decode(message)

    def deliver_to(self, receiver: Callable[[bytes], bool]) -> Awaitable[None]:
        assert self.stream is not None
        return self.stream.deliver_to(receiver)

    def try_write(self, data: bytes) -> bool:
        """PeerLink (bytes, no codec): ``data`` written now if it fits (``_Stream.try_write``)."""
        stream = self.stream
        return stream is not None and self.encode is None and stream.try_write(data)

    async def done_writing(self) -> None:
        stream = await self._open()
        conn = stream.conn
        if not stream.local_done and not conn.closed:
            stream.local_done = True
            with contextlib.suppress(h2.exceptions.ProtocolError):
                conn.h2.end_stream(stream.id)
            conn.flush()

    def cancel(self) -> bool:
        self.cancelled = True
        stream = self.stream
        if stream is None or stream.id not in stream.conn.streams:
            return False
        stream.conn.cancel_client_stream(stream)
        return True

    def peer_certificate_names(self) -> set[str]:
        from broker.adapters.transport.tls import peer_ids_of

        stream = self.stream
        der = stream.conn.peer_der if stream is not None else None
        return peer_ids_of(ssl.DER_cert_to_PEM_cert(der).encode()) if der else set()


class H2Channel:
    """One connection to a peer broker, dialed on first use (as ``grpc.aio.Channel``)."""

    def __init__(
        self,
        target: str,
        limits: Limits,
        ssl_context: ssl.SSLContext | None,
        *,
        expect_peer_id: str | None = None,
    ) -> None:
        self.target = target
        self.limits = limits
        self.ssl_context = ssl_context
        self.expect_peer_id = expect_peer_id
        self.conn: _Connection | None = None

    def stream_stream(
        self,
        method: str,
        request_serializer: Codec | None = None,
        response_deserializer: Codec | None = None,
        **_options: Any,
    ) -> Callable[[], _Call]:
        """As grpc.aio's (generated stubs call it so): a bidirectional-stream call of ``method``."""
        return lambda: _Call(self, method, request_serializer, response_deserializer)

    async def open_stream(self, path: str = PEER_LINK_OPEN) -> _Stream:
        from broker.adapters.transport.tls import peer_ids_of, split_peer_id

        if self.conn is None:
            host, port = split_peer_id(self.target)
            loop = asyncio.get_running_loop()
            try:
                _transport, conn = await loop.create_connection(
                    lambda: _Connection(client_side=True, limits=self.limits),
                    host,
                    port,
                    ssl=self.ssl_context,
                    server_hostname=host if self.ssl_context is not None else None,
                )
            except ssl.SSLError as exc:
                raise rpc_error(
                    Status.UNAVAILABLE, f"TLS handshake with {self.target} failed: {exc}"
                ) from None
            except OSError as exc:
                raise rpc_error(Status.UNAVAILABLE, f"cannot connect to {self.target}: {exc}") from None
            self.conn = conn
            if self.ssl_context is not None:
                sslobj = conn.transport.get_extra_info("ssl_object")
                if sslobj is None or sslobj.selected_alpn_protocol() != "h2":
                    conn.transport.abort()
                    raise rpc_error(Status.UNAVAILABLE, f"{self.target} did not negotiate HTTP/2 (ALPN h2)")
                if self.expect_peer_id is not None:
                    names = peer_ids_of(ssl.DER_cert_to_PEM_cert(conn.peer_der or b"").encode())
                    if self.expect_peer_id not in names:
                        conn.transport.abort()
                        raise PeerIdentityError(self.expect_peer_id, names)
        conn = self.conn
        if conn.closed:
            raise rpc_error(Status.UNAVAILABLE, f"the connection to {self.target} closed")
        return conn.open_stream(self.target, b"https" if self.ssl_context is not None else b"http", path)

    async def close(self) -> None:
        conn = self.conn
        if conn is not None and not conn.closed:
            with contextlib.suppress(Exception):
                conn.h2.close_connection()
                conn.flush()
            conn.transport.close()
