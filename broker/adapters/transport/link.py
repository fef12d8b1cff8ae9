"""The gRPC transport between brokers: ``service PeerLink { rpc Open(stream Frame) ... }``.

One long-lived bidirectional stream per broker pair carries overlay messages (seed 003 Table 1
queries and maintenance) and seed 002 envelopes in both directions, in batches (``Frame``) of
items encoded by :mod:`broker.adapters.transport.wire` (protos/skipmq/v1/cluster.proto).

Link life cycle:

* Dial: the dialer opens ``Open`` and writes a ``Hello`` frame (its peer id, schema version,
  batch cap, a fresh challenge); the acceptor answers with its own ``Hello`` (with TLS: the
  challenge signed with its certificate's key, which the dialer checks names the dialed id:
  broker/cluster/origin_hello.py); both have ``connect_timeout_s``.
  Only then do data frames flow, so a stream never carries data that a tie-break could discard.
* Tie-break: if both sides dial at once, the acceptor whose id is smaller than the dialer's and
  which is dialing itself (or holds a link it dialed) rejects with ``ALREADY_EXISTS``; the
  larger side accepts and abandons its own dial. The stream dialed by the smaller id remains.
  A ``Hello`` from a peer that already has a link otherwise replaces the old link (the peer
  restarted and knows nothing of it).
* Per peer, one queue (bounded; the oldest item is dropped beyond ``send_queue_limit``), taken
  up to ``max_batch_items`` at a time into one frame. While the link is up and no write waits,
  ``send`` schedules one flush per peer and loop turn (``call_soon``) that writes the frames at
  once when the runtime can without waiting (h2: the stream's windows and the socket have room);
  otherwise the peer's drain task awaits the stream write (HTTP/2 flow control is the
  backpressure; grpcio always takes this path). With no link the drain task dials, retrying with
  jittered exponential backoff while items wait. Items are queued as encoded bytes, so order is
  per-direction FIFO across reconnects; a frame written to a stream that then breaks may be
  lost (at-most-once, like any datagram the overlay sends; the overlay acks what matters).
* ``on_peer_down`` fires once per outage: on a failed dial or a broken established link, and
  again only after a link to that peer has been up again.

The runtime under the life cycle (``TransportConfig.runtime``, ``cluster.link_runtime``): ``h2``,
SkipMQ's own gRPC layer on the event loop (h2_runtime.py: frames read and written in the socket
callbacks, the dialer checks that the answering certificate names the peer id dialed, an oversized
frame is logged and counted by the accepting side), or ``grpcio`` (grpc.aio). Same wire, same
protos: brokers on either runtime link with each other.

The standard health service ``grpc.health.v1.Health`` runs on the same server: SERVING after
:meth:`GrpcTransport.start`, NOT_SERVING once :meth:`GrpcTransport.stop` begins.

Size: one gRPC stream per peer pair with its whole life cycle (dial, handshake, the crossing-dial
rule, batching, backpressure, reconnect, drain); splitting it would spread one state machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from broker.adapters.transport import wire
from broker.adapters.transport.tls import ClusterTls, PeerIdentityError, identity_refusal
from broker.cluster.messages import OriginProof
from broker.cluster.origin_hello import (
    CHALLENGE_BYTES,
    PROVEN,
    UNPROVEN,
    WRONG_PEER_ID,
    DialVerdict,
    LinkIdentity,
)
from broker.logs import log_event

log = logging.getLogger("skipmq.transport")

RUNTIMES = ("h2", "grpcio")
_FRAME_HEADROOM_BYTES = 64  # bytes kept free below max_message_bytes for the frame's own framing


@dataclass(frozen=True)
class TransportConfig:
    max_batch_items: int = 256  # items per Frame
    send_queue_limit: int = 100_000  # per peer; beyond it the OLDEST queued item is dropped (counted)
    connect_timeout_s: float = 3.0  # deadline of dial + Hello
    reconnect_backoff_initial_s: float = 0.05
    reconnect_backoff_max_s: float = 2.0
    keepalive_time_s: float = 10.0  # gRPC keepalive pings on the long-lived stream
    max_message_bytes: int = 64 * 1024 * 1024
    # the gRPC runtime under the links (cluster.link_runtime): "h2", SkipMQ's own on the event
    # loop (h2_runtime.py), or "grpcio" (grpc.aio, with its own threads)
    runtime: str = "h2"

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, got {self.runtime!r}")
        if self.max_batch_items < 1:
            raise ValueError(f"max_batch_items must be >= 1, got {self.max_batch_items}")
        if self.send_queue_limit < 1:
            raise ValueError(f"send_queue_limit must be >= 1, got {self.send_queue_limit}")
        for name in ("connect_timeout_s", "reconnect_backoff_initial_s", "keepalive_time_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.reconnect_backoff_max_s < self.reconnect_backoff_initial_s:
            raise ValueError("reconnect_backoff_max_s must be >= reconnect_backoff_initial_s")
        if self.max_message_bytes < 1024:
            raise ValueError(f"max_message_bytes must be >= 1024, got {self.max_message_bytes}")


@dataclass
class TransportStats:
    items_sent: int = 0
    items_received: int = 0
    frames_sent: int = 0
    frames_received: int = 0
    items_dropped: int = 0  # oldest items pushed out of a full send queue (or unsent at stop)
    reconnects: int = 0  # links established to a peer that had had a link before
    peer_down_events: int = 0
    bytes_sent: int = 0  # frame bytes (gRPC/HTTP2 overhead excluded)
    bytes_received: int = 0
    items_malformed: int = 0  # received items that did not decode (logged and skipped)
    links_refused: int = 0  # PeerLink streams this side refused before a link (see ``refusals``)
    dials_refused: int = 0  # dials refused: the answering certificate did not name the dialed id (h2)
    frames_oversized: int = 0  # PeerLink messages over max_message_bytes that ended their stream (h2)

    def as_dict(self) -> dict[str, int]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


class _LinkRejected(Exception):
    """The peer keeps the stream it dialed itself (tie-break); not a failure of the peer."""


class _DialRefused(Exception):
    """The acceptor's Hello does not show that it is the dialed peer (``reason``: the metric's)."""

    def __init__(self, reason: str, problem: str, claimed: str) -> None:
        super().__init__(problem)
        self.reason = reason
        self.problem = problem
        self.claimed = claimed


class _Link:
    """One established PeerLink stream, dialed by us or accepted from the peer."""

    def __init__(self, peer_id: str, dialed: bool) -> None:
        self.peer_id = peer_id
        self.dialed = dialed
        # the peer proved ``peer_id`` with the key of its cluster certificate: the dialer's
        # certificate named it (accepted, mutual TLS) or the acceptor answered the Hello's
        # challenge (dialed, ``origin_hello``); what arrives on it comes from that broker
        self.proven = False
        self.closed = asyncio.Event()
        self.reader_task: asyncio.Task[None] | None = None

    def source(self) -> Any:
        """The runtime's call or context under this link."""
        raise NotImplementedError

    async def read(self) -> bytes | None:
        raise NotImplementedError

    async def write(self, data: bytes) -> None:
        raise NotImplementedError

    def try_write(self, data: bytes) -> bool:
        """Write ``data`` now, without waiting, if the runtime can (h2: the windows and the socket
        have room); False: nothing written, ``write`` must be awaited."""
        return False

    async def finish_writing(self) -> None:
        """Graceful end of our direction (the peer reads end-of-stream)."""

    def close(self) -> None:
        self.closed.set()
        task = self.reader_task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()


class _DialedLink(_Link):
    def __init__(
        self, peer_id: str, channel: grpc.aio.Channel, call: Any, background: set[asyncio.Task[None]]
    ) -> None:
        super().__init__(peer_id, dialed=True)
        self.channel = channel
        self.call = call
        self.try_write = getattr(call, "try_write", super().try_write)  # type: ignore[method-assign]
        self.background = background  # the transport's set of channel-closing tasks (awaited by stop)

    def source(self) -> Any:
        return self.call

    async def read(self) -> bytes | None:
        data = await self.call.read()
        return None if data is grpc.aio.EOF else bytes(data)

    async def write(self, data: bytes) -> None:
        await self.call.write(data)

    async def finish_writing(self) -> None:
        await self.call.done_writing()

    def close(self) -> None:
        if not self.closed.is_set():
            self.call.cancel()
            task = asyncio.get_running_loop().create_task(self.channel.close())
            self.background.add(task)
            task.add_done_callback(self.background.discard)
        super().close()


class _AcceptedLink(_Link):
    def __init__(self, peer_id: str, context: Any) -> None:
        super().__init__(peer_id, dialed=False)
        self.context = context
        self.try_write = getattr(context, "try_write", super().try_write)  # type: ignore[method-assign]

    def source(self) -> Any:
        return self.context

    async def read(self) -> bytes | None:
        data = await self.context.read()
        return None if data is grpc.aio.EOF else bytes(data)

    async def write(self, data: bytes) -> None:
        await self.context.write(data)

    async def finish_writing(self) -> None:
        self.closed.set()  # the handler returns: the RPC ends with OK after the written frames


class _Peer:
    __slots__ = (
        "backoff_failures",
        "dialing",
        "down_reported",
        "drop_logged",
        "ever_up",
        "flush_due",
        "http_port",
        "id",
        "link",
        "link_changed",
        "pending_accepts",
        "queue",
        "sender_task",
        "wakeup",
        "writing",
    )

    def __init__(self, peer_id: str) -> None:
        self.id = peer_id
        self.queue: deque[bytes] = deque()
        self.wakeup = asyncio.Event()  # queue grew, or the link changed
        self.link_changed = asyncio.Event()  # cuts a reconnect backoff short
        self.link: _Link | None = None
        self.dialing = False
        self.pending_accepts = 0  # incoming Hellos being answered right now
        self.writing = False
        self.down_reported = False
        self.ever_up = False
        self.drop_logged = False
        self.flush_due = False  # a write of the queue is scheduled for the end of this loop turn
        self.backoff_failures = 0
        self.http_port = 0  # from the peer's last Hello; 0 = not announced
        self.sender_task: asyncio.Task[None] | None = None


def _format_peer_id(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class GrpcTransport:
    """Carries overlay messages and envelopes between brokers (see the module docstring).

    Every method runs on the event loop thread; the callbacks are called on it too, in order.
    ``self_id`` (``advertise_host:port``, IPv6 hosts in brackets) is valid after :meth:`start`.
    """

    def __init__(
        self,
        *,
        advertise_host: str,
        on_receive: Callable[[str, object], None],
        on_peer_down: Callable[[str], None],
        config: TransportConfig | None = None,
        tls: ClusterTls | None = None,
        identity: LinkIdentity | None = None,
    ) -> None:
        if not advertise_host:
            raise ValueError("advertise_host must name this broker's address as its peers reach it")
        self.advertise_host = advertise_host
        self.config = config or TransportConfig()
        self.stats = TransportStats()
        self.self_id = ""
        self._on_receive = on_receive
        self._on_peer_down = on_peer_down
        self._peers: dict[str, _Peer] = {}
        self._server: grpc.aio.Server | None = None
        self._health: Any = None
        self._closing = False
        self._stopped = False
        self._background: set[asyncio.Task[None]] = set()
        self._max_item_bytes = self.config.max_message_bytes - _FRAME_HEADROOM_BYTES
        self._tls = tls  # None: plaintext links (cluster.insecure); see tls.py
        # accepted PeerLink streams refused before a link, by gRPC status code name
        # (skipmq_cluster_link_refused_total{code}); the tie-break's ALREADY_EXISTS is no refusal
        self.refusals: dict[str, int] = {}
        # the Hello challenge (origin_hello.py; None: plaintext links, no keys): dials refused
        # because the acceptor did not prove the dialed id (skipmq_cluster_link_dial_refused_total
        # {reason}), and links taken without an answer (mode optional)
        self._identity = identity
        self.dial_refusals: dict[str, int] = {}
        self.unproven_links = 0
        # while ``on_receive`` runs: the sender's id when its link is proven (``_Link.proven``),
        # else None - the cluster engine takes an origin proof of that very sender on its word
        # without the signature arithmetic (``broker.cluster.engine_origin``)
        self.proven_sender: str | None = None
        # announced in every Hello (where peers find this broker's /metrics); set by the runtime
        # before start, or once an ephemeral HTTP port is bound (links up by then announced 0)
        self.http_port = 0

    # ------------------------------------------------------------------ public API

    async def start(self, bind_host: str, bind_port: int) -> int:
        """Bind (``bind_port`` 0 = ephemeral), serve PeerLink and health; returns the port."""
        if self._server is not None:
            raise RuntimeError("GrpcTransport.start() called twice")
        if self.config.runtime == "h2":
            return await self._start_h2(bind_host, bind_port)
        server = grpc.aio.server(options=self._server_options())
        handler = grpc.method_handlers_generic_handler(
            "skipmq.v1.PeerLink", {"Open": grpc.stream_stream_rpc_method_handler(self._serve_open)}
        )
        server.add_generic_rpc_handlers((handler,))
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        address = _format_peer_id(bind_host, bind_port)
        if bind_port:
            _check_port_free(bind_host, bind_port)
        try:
            port = self._add_port(server, address)
        except RuntimeError as exc:
            raise OSError(f"transport cannot bind {address}: {exc}") from None
        if port == 0:
            raise OSError(f"transport cannot bind {address}")
        await server.start()
        self._server = server
        self.self_id = _format_peer_id(self.advertise_host, port)
        for service in ("", "skipmq.v1.PeerLink"):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("transport listening on %s as %s", address, self.self_id)
        return port

    async def _start_h2(self, bind_host: str, bind_port: int) -> int:
        from broker.adapters.transport.h2_runtime import H2Server

        tls = self._tls
        server = H2Server(self._serve_open, self._h2_limits(), tls.server_ssl_context if tls else None)
        self._health = server.health
        address = _format_peer_id(bind_host, bind_port)
        if bind_port:
            _check_port_free(bind_host, bind_port)
        try:
            port = await server.bind(bind_host, bind_port)
        except OSError as exc:
            raise OSError(exc.errno, f"transport cannot bind {address}: {exc.strerror or exc}") from None
        self._server = server
        self.self_id = _format_peer_id(self.advertise_host, port)
        for service in ("", "skipmq.v1.PeerLink"):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("transport listening on %s as %s (runtime h2)", address, self.self_id)
        return port

    def send(self, peer: str, item: object) -> None:
        """Queue ``item`` (overlay message or Envelope) for ``peer``; never blocks.

        Raises WireError if the item cannot be encoded, ValueError for a bad peer id and
        RuntimeError before start() or after stop().
        """
        if self._server is None or self._stopped:
            raise RuntimeError("GrpcTransport.send() needs a started, not stopped transport")
        data = wire.encode_item(item)
        if len(data) > self._max_item_bytes:
            raise wire.WireError(
                f"item {type(item).__name__} is {len(data)} bytes; "
                f"max_message_bytes allows {self._max_item_bytes}"
            )
        if peer == self.self_id:
            decoded = wire.decode_item(data)  # a copy, as a remote peer would see it
            asyncio.get_running_loop().call_soon(self._deliver, peer, decoded)
            return
        state = self._peer(peer)
        queue = state.queue
        if len(queue) >= self.config.send_queue_limit:
            queue.popleft()
            self.stats.items_dropped += 1
            if not state.drop_logged:
                state.drop_logged = True
                log.warning(
                    "send queue to %s is full (%d items): dropping the oldest",
                    peer,
                    self.config.send_queue_limit,
                )
        queue.append(data)
        if state.link is None or state.writing:
            state.wakeup.set()
        elif not state.flush_due:  # one write per peer and loop turn, from the loop, no task wake-up
            state.flush_due = True
            asyncio.get_running_loop().call_soon(self._flush, state)

    def _flush(self, state: _Peer) -> None:
        """Write what is queued for ``state`` now, a frame at a time, while the link's runtime can
        write without waiting (h2); the drain task (woken) takes whatever is left."""
        state.flush_due = False
        link = state.link
        queue = state.queue
        stats = self.stats
        while queue and link is not None and not state.writing and not self._stopped:
            encoded = self._take_batch(queue)
            frame = wire.encode_frame_from_items(encoded)
            if not link.try_write(frame):
                queue.extendleft(reversed(encoded))
                break
            stats.frames_sent += 1
            stats.items_sent += len(encoded)
            stats.bytes_sent += len(frame)
        if queue:
            state.wakeup.set()

    def queued(self, peer: str) -> int:
        state = self._peers.get(peer)
        return len(state.queue) if state is not None else 0

    def drop_queued(self, peer: str) -> int:
        """Forget what is queued for ``peer`` while it has no link (it left or crashed), so the
        transport stops redialing it until something new is sent; returns the items dropped."""
        state = self._peers.get(peer)
        if state is None or state.link is not None:
            return 0
        dropped = len(state.queue)
        state.queue.clear()
        self.stats.items_dropped += dropped
        return dropped

    def connected_peers(self) -> frozenset[str]:
        return frozenset(peer_id for peer_id, state in self._peers.items() if state.link is not None)

    def peer_http_ports(self) -> dict[str, int]:
        """{peer id: HTTP port} of the connected peers that announced one in their Hello."""
        return {
            peer_id: state.http_port
            for peer_id, state in self._peers.items()
            if state.link is not None and state.http_port
        }

    async def stop(self, drain_timeout_s: float = 2.0) -> None:
        """NOT_SERVING, send what is queued (bounded by ``drain_timeout_s``), close every link."""
        if self._server is None or self._stopped:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, drain_timeout_s)
        self._closing = True
        with contextlib.suppress(Exception):
            await self._health.enter_graceful_shutdown()
        while loop.time() < deadline and any(
            (state.queue or state.writing) and not state.down_reported for state in self._peers.values()
        ):
            await asyncio.sleep(0.005)
        self._stopped = True
        for state in self._peers.values():
            if state.sender_task is not None:
                state.sender_task.cancel()
        for state in self._peers.values():
            if state.sender_task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await state.sender_task
            if state.queue:
                log.warning("transport stopping: %d items for %s not sent", len(state.queue), state.id)
                self.stats.items_dropped += len(state.queue)
                state.queue.clear()
        links = [state.link for state in self._peers.values() if state.link is not None]
        for link in links:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(link.finish_writing(), max(0.0, deadline - loop.time()))
        readers = [link.reader_task for link in links if link.reader_task is not None]
        if readers:  # the peers answer our end-of-stream with theirs
            await asyncio.wait(readers, timeout=max(0.01, deadline - loop.time()))
        for link in links:
            link.close()
        await self._server.stop(grace=max(0.0, deadline - loop.time()))
        if self._background:
            await asyncio.wait(set(self._background), timeout=1.0)
        log.info("transport %s stopped", self.self_id)

    # ------------------------------------------------------------------ per-peer sending

    def _peer(self, peer_id: str) -> _Peer:
        state = self._peers.get(peer_id)
        if state is None:
            if not isinstance(peer_id, str) or ":" not in peer_id:
                raise ValueError(f"peer id must be 'host:port', got {peer_id!r}")
            state = _Peer(peer_id)
            self._peers[peer_id] = state
            state.sender_task = asyncio.get_running_loop().create_task(
                self._sender(state), name=f"skipmq-transport-send-{peer_id}"
            )
        return state

    async def _sender(self, state: _Peer) -> None:
        config = self.config
        while not self._stopped:
            state.wakeup.clear()
            link = state.link
            if link is None:
                if not state.queue or state.pending_accepts:
                    await state.wakeup.wait()
                    continue
                if await self._connect(state):
                    continue
                state.link_changed.clear()
                delay = min(
                    config.reconnect_backoff_max_s,
                    config.reconnect_backoff_initial_s * 2 ** min(state.backoff_failures, 30),
                )
                state.backoff_failures += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.link_changed.wait(), delay * random.uniform(0.5, 1.0))
                continue
            if not state.queue:
                await state.wakeup.wait()
                continue
            encoded = self._take_batch(state.queue)
            frame = wire.encode_frame_from_items(encoded)
            state.writing = True
            try:
                await link.write(frame)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("write to %s failed: %s; %d items lost with the link", state.id, exc, len(encoded))
                self._link_lost(state, link, f"write failed: {exc}")
                continue
            finally:
                state.writing = False
            stats = self.stats
            stats.frames_sent += 1
            stats.items_sent += len(encoded)
            stats.bytes_sent += len(frame)

    def _take_batch(self, queue: deque[bytes]) -> list[bytes]:
        batch = [queue.popleft()]
        size = wire.frame_item_overhead_bytes(batch[0])
        cap = self.config.max_batch_items
        while queue and len(batch) < cap:
            extra = wire.frame_item_overhead_bytes(queue[0])
            if size + extra > self._max_item_bytes:
                break
            batch.append(queue.popleft())
            size += extra
        return batch

    async def _connect(self, state: _Peer) -> bool:
        """One dial + Hello exchange; True when a link to the peer exists afterwards."""
        state.dialing = True
        channel = self._open_channel(state.id)
        call = channel.stream_stream(wire.PEER_LINK_OPEN_METHOD)()
        link: _DialedLink | None = None
        challenge = self._challenge()
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                await call.write(
                    wire.encode_hello(
                        self.self_id, self.config.max_batch_items, self.http_port, challenge=challenge
                    )
                )
                reply = await call.read()
            if reply is grpc.aio.EOF:
                raise ConnectionError("the peer ended the stream before its Hello")
            hello = wire.decode_hello(bytes(reply))
            if hello.schema_version != wire.SCHEMA_VERSION:
                raise ConnectionError(
                    f"schema version {hello.schema_version}, this broker speaks {wire.SCHEMA_VERSION}"
                )
            if hello.peer_id != state.id:
                raise _DialRefused(
                    WRONG_PEER_ID, f"the broker at {state.id} calls itself {hello.peer_id!r}", hello.peer_id
                )
            proven = self._check_answer(state, challenge, hello)
            link = _DialedLink(state.id, channel, call, self._background)
            link.proven = proven
            state.http_port = hello.http_port
        except asyncio.CancelledError:
            call.cancel()
            await channel.close()
            raise
        except Exception as exc:
            call.cancel()
            await channel.close()
            if isinstance(exc, PeerIdentityError):
                self._dial_refused(state.id, str(exc))
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                log.debug("dial to %s: the peer keeps its own stream", state.id)
                return state.link is not None
            if isinstance(exc, _DialRefused):
                self._hello_refused(state, exc)
            reason = "timed out" if isinstance(exc, TimeoutError) else _describe(exc)
            if state.link is not None:
                return True
            log.info("dial to %s failed: %s", state.id, reason)
            self._report_down(state)
            return False
        finally:
            state.dialing = False
        if state.link is not None:  # the peer's own dial was accepted meanwhile; it has the smaller id
            link.close()
            return True
        self._install(state, link)
        return True

    # ------------------------------------------------------------------ who answers a dial

    def _challenge(self) -> bytes:
        """Fresh random bytes for a dial's Hello (empty: this broker does not ask)."""
        identity = self._identity
        return secrets.token_bytes(CHALLENGE_BYTES) if identity is not None and identity.asks else b""

    def _answer(self, hello: wire.Hello) -> OriginProof | None:
        """The acceptor's proof for the dialer's challenge (asked only after the dialer's
        certificate was found to name ``hello.peer_id``), or None."""
        if self._identity is None or not hello.challenge:
            return None
        try:
            return self._identity.answer(hello.challenge, hello.peer_id, self.self_id)
        except Exception as exc:  # a key that cannot sign: the dialer decides what no answer means
            log.error("cannot answer the Hello challenge of %s: %s", hello.peer_id, exc)
            return None

    def _check_answer(self, state: _Peer, challenge: bytes, hello: wire.Hello) -> bool:
        """Raise _DialRefused unless the acceptor's Hello shows it is ``state.id``; True when it
        proved it (signed the challenge with the key of a certificate naming ``state.id``)."""
        if self._identity is None:
            return False
        verdict: DialVerdict = self._identity.check(
            challenge, self.self_id, state.id, hello.identity_proof, time.time()
        )
        if verdict.refused:
            raise _DialRefused(verdict.outcome, verdict.problem, hello.peer_id)
        if verdict.outcome == UNPROVEN:
            self.unproven_links += 1
            log_event(log, logging.WARNING, "cluster_link_unproven", peer=state.id, reason=verdict.problem)
        return verdict.outcome == PROVEN

    def _hello_refused(self, state: _Peer, refused: _DialRefused) -> None:
        """Counted by reason (``dial_refusals``) and logged as the structured event
        ``cluster_link_refused`` with ``side`` ``dialer`` (the accepting side logs the same event)."""
        self.dial_refusals[refused.reason] = self.dial_refusals.get(refused.reason, 0) + 1
        log_event(
            log,
            logging.WARNING,
            "cluster_link_refused",
            peer=state.id,
            claimed=refused.claimed,
            code=f"DIAL_{refused.reason.upper()}",
            reason=refused.problem,
            side="dialer",
        )

    # ------------------------------------------------------------------ accepting

    async def _serve_open(self, request_iterator: Any, context: Any) -> None:
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                first = await context.read()
        except TimeoutError:
            await self._refuse(
                context, grpc.StatusCode.DEADLINE_EXCEEDED, "no Hello within connect_timeout_s"
            )
            return
        if first is grpc.aio.EOF:
            return
        try:
            hello = wire.decode_hello(bytes(first))
        except wire.WireError as exc:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        if hello.schema_version != wire.SCHEMA_VERSION:
            await self._refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"schema version {hello.schema_version} not supported; "
                f"this broker speaks {wire.SCHEMA_VERSION}",
                hello.peer_id,
            )
            return
        if self._closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "broker is stopping")
            return
        if ":" not in hello.peer_id or hello.peer_id == self.self_id:
            await self._refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"bad peer id {hello.peer_id!r} in Hello",
                hello.peer_id,
            )
            return
        refusal = self._identity_refusal(hello.peer_id, context)
        if refusal is not None:
            await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, refusal, hello.peer_id)
            return
        state = self._peer(hello.peer_id)
        own_link_dialed = state.link is not None and state.link.dialed
        if self.self_id < state.id and (state.dialing or own_link_dialed):
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS, "the smaller peer id keeps the stream it dialed"
            )
            return
        state.pending_accepts += 1
        try:
            await context.write(
                wire.encode_hello(
                    self.self_id,
                    self.config.max_batch_items,
                    self.http_port,
                    identity_proof=self._answer(hello),
                )
            )
        except Exception as exc:
            log.info("Hello to %s failed: %s", state.id, _describe(exc))
            return
        finally:
            state.pending_accepts -= 1
            state.wakeup.set()
        state.http_port = hello.http_port
        link = _AcceptedLink(state.id, context)
        link.proven = self._tls is not None  # (the client certificate names it: _identity_refusal)
        self._install(state, link)
        await link.closed.wait()

    async def _refuse(self, context: Any, code: grpc.StatusCode, reason: str, claimed: str = "") -> None:
        """End an accepted PeerLink stream before it became a link: counted per status code and
        logged as the structured event ``cluster_link_refused`` (who connected, the peer id its
        Hello claimed, why), then the stream ends with ``code``."""
        self.stats.links_refused += 1
        self.refusals[code.name] = self.refusals.get(code.name, 0) + 1
        log_event(
            log,
            logging.WARNING,
            "cluster_link_refused",
            peer=str(context.peer()),
            claimed=claimed,
            code=code.name,
            reason=reason,
        )
        await context.abort(code, reason)

    def _dial_refused(self, dialed: str, reason: str) -> None:
        """A dial refused before its Hello: the answering broker's certificate does not name the
        peer id dialed (an impostor on that address). Counted and logged like an accepted refusal."""
        self.stats.dials_refused += 1
        self.dial_refusals["certificate"] = self.dial_refusals.get("certificate", 0) + 1
        log_event(
            log,
            logging.WARNING,
            "cluster_link_refused",
            peer=dialed,
            claimed=dialed,
            code="DIAL_CERTIFICATE",
            reason=reason,
            side="dialer",
        )

    def _frame_oversized(self, peer: str, size: int, limit: int) -> None:
        """A PeerLink message over max_message_bytes ended its stream (RESOURCE_EXHAUSTED)."""
        self.stats.frames_oversized += 1
        log_event(
            log,
            logging.WARNING,
            "cluster_link_frame_oversized",
            peer=peer,
            size=size,
            limit=limit,
            reason=f"a frame of {size} bytes; cluster.max_frame_bytes is {limit}",
        )

    # ------------------------------------------------------------------ link up / down

    def _install(self, state: _Peer, link: _Link) -> None:
        old = state.link
        state.link = link
        if old is not None:
            log.info(
                "link to %s replaced by a new %s stream", state.id, "dialed" if link.dialed else "accepted"
            )
            old.close()
        if state.ever_up:
            self.stats.reconnects += 1
        state.ever_up = True
        state.down_reported = False
        state.drop_logged = False
        state.backoff_failures = 0
        link.reader_task = asyncio.get_running_loop().create_task(
            self._read_loop(state, link), name=f"skipmq-transport-read-{state.id}"
        )
        state.wakeup.set()
        state.link_changed.set()
        log.info("link up: %s <-> %s (%s)", self.self_id, state.id, "dialed" if link.dialed else "accepted")

    def _link_lost(self, state: _Peer, link: _Link, reason: str) -> None:
        link.close()
        if state.link is not link:
            return
        state.link = None
        state.wakeup.set()
        if self._closing:
            log.info("link closed: %s (%s)", state.id, reason)
            return
        log.warning("link down: %s (%s)", state.id, reason)
        self._report_down(state)

    def _report_down(self, state: _Peer) -> None:
        if state.down_reported or self._closing:
            return
        state.down_reported = True
        self.stats.peer_down_events += 1
        try:
            self._on_peer_down(state.id)
        except Exception:
            log.exception("on_peer_down(%s) raised", state.id)

    async def _read_loop(self, state: _Peer, link: _Link) -> None:
        reason = "end of stream"
        stopped: list[str] = []

        def take(data: bytes) -> bool:
            outcome = self._take_frame(state, link, data)
            if outcome is not None:
                stopped.append(outcome)
            return outcome is None

        try:
            deliver_to = getattr(link.source(), "deliver_to", None)
            if deliver_to is not None:  # h2: frames handed over in the socket callback, no task hop
                await deliver_to(take)
            else:
                while not stopped:
                    data = await link.read()
                    if data is None:
                        break
                    take(data)
            if stopped:
                reason = stopped[0]
        except asyncio.CancelledError:
            reason = "closed"
            raise
        except Exception as exc:
            reason = _describe(exc)
        finally:
            self._link_lost(state, link, reason)

    def _take_frame(self, state: _Peer, link: _Link, data: bytes) -> str | None:
        """Decode one received frame and deliver its items; a reason to end the link, or None."""
        stats = self.stats
        stats.frames_received += 1
        stats.bytes_received += len(data)
        try:
            raw_items = wire.decode_frame_items(data)
            if len(raw_items) > self.config.max_batch_items:
                raise wire.WireError(
                    f"{len(raw_items)} items in one frame; max_batch_items is {self.config.max_batch_items}"
                )
        except wire.WireError as exc:
            log.error("malformed frame from %s: %s; closing the link", state.id, exc)
            return f"malformed frame: {exc}"
        self.proven_sender = state.id if link.proven else None
        try:
            for raw in raw_items:
                if state.link is not link:
                    return "replaced"  # the peer resent nothing of this stream on the new one
                try:
                    item = wire.item_from_proto(raw)
                except wire.WireError as exc:
                    stats.items_malformed += 1
                    log.error("skipping a malformed item from %s: %s", state.id, exc)
                    continue
                stats.items_received += 1
                self._deliver(state.id, item)
        finally:
            self.proven_sender = None
        return None

    def _deliver(self, peer_id: str, item: object) -> None:
        try:
            self._on_receive(peer_id, item)
        except Exception:
            log.exception("on_receive raised for %s from %s", type(item).__name__, peer_id)

    # ------------------------------------------------------------------ credentials (tls.py)

    def _add_port(self, server: grpc.aio.Server, address: str) -> int:
        if self._tls is None:
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, self._tls.server_credentials()))

    def _open_channel(self, peer_id: str) -> Any:
        if self.config.runtime == "h2":
            from broker.adapters.transport.h2_runtime import H2Channel

            tls = self._tls
            return H2Channel(
                peer_id,
                self._h2_limits(),
                tls.client_ssl_context() if tls is not None else None,
                expect_peer_id=peer_id if tls is not None else None,
            )
        if self._tls is None:
            return grpc.aio.insecure_channel(peer_id, options=self._channel_options())
        return grpc.aio.secure_channel(
            peer_id, self._tls.channel_credentials(), options=self._channel_options()
        )

    def _h2_limits(self) -> Any:
        from broker.adapters.transport.h2_runtime import Limits

        return Limits(self.config.max_message_bytes, self.config.keepalive_time_s, self._frame_oversized)

    def _identity_refusal(self, claimed: str, context: Any) -> str | None:
        """Why a Hello claiming peer id ``claimed`` is refused on this accepted stream (TLS only)."""
        return None if self._tls is None else identity_refusal(context, claimed, "Hello")

    # ------------------------------------------------------------------ gRPC options

    def _common_options(self) -> list[tuple[str, Any]]:
        keepalive_ms = max(1, int(self.config.keepalive_time_s * 1000))
        return [
            ("grpc.max_send_message_length", self.config.max_message_bytes),
            ("grpc.max_receive_message_length", self.config.max_message_bytes),
            ("grpc.keepalive_time_ms", keepalive_ms),
            ("grpc.keepalive_timeout_ms", max(1000, keepalive_ms // 2)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]

    def _channel_options(self) -> list[tuple[str, Any]]:
        # a private subchannel pool: a restarted peer is dialed afresh, not through the
        # process-wide pool's cached connection backoff
        return [*self._common_options(), ("grpc.use_local_subchannel_pool", 1)]

    def _server_options(self) -> list[tuple[str, Any]]:
        keepalive_ms = max(1, int(self.config.keepalive_time_s * 1000))
        return [
            *self._common_options(),
            ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared listener
            ("grpc.http2.min_recv_ping_interval_without_data_ms", max(1, keepalive_ms // 2)),
            ("grpc.http2.min_ping_interval_without_data_ms", max(1, keepalive_ms // 2)),
            ("grpc.http2.max_ping_strikes", 0),
        ]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


def _check_port_free(host: str, port: int) -> None:
    """Raise ``OSError`` (errno EADDRINUSE, ...) if ``host:port`` cannot be bound: a clear error
    before gRPC's C core fails and logs its own lines."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            where = _format_peer_id(host, port)
            raise OSError(exc.errno, f"transport cannot bind {where}: {exc.strerror}") from None
