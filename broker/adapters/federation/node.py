"""One broker's federation node: the shared-link streams over gRPC around the pure router.

Every shared link (seed 000 §3.7.1) is one ``skipmq.v1.Federation/Link`` bidirectional stream,
opened by the requesting side; its first frame is the ``LinkRequest``. Frames carry
``FedMessage`` batches in both directions. ``FederationNode`` feeds what arrives into
``FederationRouter.on_message`` and carries out the router's actions: ``Send`` (a
``LinkRequest`` dials), ``Deliver`` (``BrokerApi.deliver_remote`` to the local subscribers),
``Unlink`` (end the stream after what is queued) and ``Note`` (a structured log line). A stream
that ends without a ``Leave`` - the peer was killed, the network failed - is ``link_lost``, and
the router re-links (§3.7.3 (4)). A timer drives ``tick`` (retries, discovery, timeouts).

Who answers a request (docs/federation.md "Security"): with TLS the requester's ``LinkRequest``
carries a fresh challenge, the acceptor's ``LinkAccepted`` answers it with a signature by its
federation certificate's key (``broker.cluster.origin_hello``, federation context), and the
requester checks that the certificate names the name it dialed before the router sees the answer
(``cluster.origin_proofs`` is the mode: required, optional, off). A refused answer ends that
stream as a failed dial (the router tries again), counted and logged as
``federation_identity_refused`` with ``side`` ``dialer``.

Delivery over a link is at most once per hop (a frame written into a stream that breaks is
lost); QoS >= 1 events are in custody (broker/federation/custody.py), kept in the broker's
SQLite store when it has one (``custody_store.py``): an ``EventAck`` leaves only after the
commit that made what it acknowledges durable (the deliveries into persistent sessions, the
custody rows), and a restarted broker restores its custody. docs/federation.md says what that
means and what is not done.

Size: one link adapter for both link runtimes (grpcio and h2), the link request's identity
check and the custody store's commits; its protocol is in broker/federation/ (router, custody).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from typing import TYPE_CHECKING, Any

import grpc

from broker.adapters.federation import wire
from broker.adapters.federation.custody_store import SqliteCustodyStore
from broker.adapters.federation.metrics import FederationCollector
from broker.adapters.origin_keys import federation_link_identity_for
from broker.adapters.transport._pb.skipmq.v1 import federation_pb2 as pb
from broker.adapters.transport._pb.skipmq.v1 import federation_pb2_grpc as pb_grpc
from broker.adapters.transport.tls import ClusterTls, PeerIdentityError, TlsFiles, identity_refusal
from broker.cluster.origin_hello import (
    CHALLENGE_BYTES,
    DIAL_REFUSAL_REASONS,
    UNPROVEN,
    WRONG_PEER_ID,
    DialVerdict,
    LinkIdentity,
)
from broker.core.session import Message
from broker.federation.keys import RoutingMode
from broker.federation.messages import (
    Action,
    Deliver,
    Event,
    EventAck,
    LinkAccepted,
    LinkMessage,
    LinkRequest,
    Note,
    Send,
    StoreRetained,
    Unlink,
)
from broker.federation.router import FederationRouter, LinkError, PlaceSettings

if TYPE_CHECKING:
    from broker.adapters.sqlite_store import Store
    from broker.config import FederationConfig
    from broker.core.ports import BrokerApi

log = logging.getLogger("skipmq.federation")

TICK_INTERVAL_S = 0.25
FIRST_FRAME_TIMEOUT_S = 5.0
_KEEPALIVE_MS = 5000
_OPTIONS = [
    ("grpc.keepalive_time_ms", _KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.use_local_subchannel_pool", 1),
]
_SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", _KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.so_reuseport", 0),
]


_LINK_METHOD = "/skipmq.v1.Federation/Link"


def _h2_limits() -> Any:
    """grpcio's defaults on the shared links: 4 MiB received per message, keepalive every 5 s."""
    from broker.adapters.transport.h2_runtime import Limits

    return Limits(max_message_bytes=4 * 1024 * 1024, keepalive_time_s=_KEEPALIVE_MS / 1000)


class _Link:
    """One shared-link stream; ``outbox`` holds frames to write, None ends our direction."""

    def __init__(self, peer: str, *, dialed: bool) -> None:
        self.peer = peer
        self.dialed = dialed
        self.outbox: asyncio.Queue[pb.FedFrame | None] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []
        self.channel: grpc.aio.Channel | None = None
        self.call: Any = None
        self.closed = False
        self.unlinked = False  # we ended it (Unlink): its end is no news
        self.challenge = b""  # dialed: what our LinkRequest asks; accepted: what the requester asked
        self.answered = False  # dialed: the acceptor's LinkAccepted was checked


class FederationNode(pb_grpc.FederationServicer):
    """Serves and dials shared links for one event place; create and use on the broker's loop."""

    def __init__(
        self, config: FederationConfig, broker: BrokerApi | None = None, *, identity_mode: str = "required"
    ) -> None:
        self.config = config
        self.identity_mode = identity_mode  # cluster.origin_proofs: does a dial check who answers
        self._identity: LinkIdentity | None = None  # the challenge's keys (None: plaintext links)
        # dials refused because the acceptor did not prove the dialed name, by reason (metrics.py)
        self.dial_refusals: dict[str, int] = dict.fromkeys(DIAL_REFUSAL_REASONS, 0)
        self.unproven_links = 0
        # LinkRequest streams this broker refused before a link, by the gRPC status (metrics.py)
        self.refusals: dict[str, int] = {}
        self.broker = broker  # set before start()
        self.store: Store | None = None  # the broker's SQLite store (custody), set before start()
        self._acks_after_commit: dict[str, list[pb.FedMessage]] = {}
        self._acks_scheduled = False
        self._tls: ClusterTls | None = None  # None: plaintext links (federation.insecure)
        self._custody_store: SqliteCustodyStore | None = None
        self.router: FederationRouter | None = None
        self.port = 0
        self._links: dict[str, _Link] = {}
        self._server: grpc.aio.Server | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._subscriptions: set[tuple[str, str]] = set()  # (client id, filter) counted in the router
        self._pending_filters: list[str] = []  # subscriptions restored before start()
        self.events_forwarded = 0
        self.events_received = 0
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ life cycle
    async def start(self) -> int:
        config = self.config
        self._tls = federation_tls(config)
        if self._tls is not None:
            self._identity = federation_link_identity_for(config, self.identity_mode)
        port = await (self._start_h2() if config.link_runtime == "h2" else self._start_grpcio())
        self.port = port
        name = f"{config.advertise_host or config.host}:{port}"
        settings = PlaceSettings(
            place=config.place,
            mode=RoutingMode(config.mode),
            description=config.description,
            ttl=config.ttl,
            class_levels=config.class_levels,
            accept_links=config.accept_links,
            site=config.site,
            probe_hops=config.probe_hops,
            probe_interval_s=config.probe_interval_ms / 1000,
            retry_interval_s=config.retry_ms / 1000,
            link_timeout_s=config.link_timeout_ms / 1000,
            custody_grace_s=config.custody_grace_ms / 1000,
            incarnation=f"{name}/{os.urandom(4).hex()}",
            retained_place=config.retained == "place",
        )
        custody_store = SqliteCustodyStore(self.store) if self.store is not None else None
        self._custody_store = custody_store
        self.router = FederationRouter(name, settings, store=custody_store)
        if self.broker is not None and settings.retained_place:  # what the store held: oldest version
            for message in self.broker.retained_messages():
                if not message.topic.startswith("$"):
                    self.router.retained.seed(message.topic, message.payload, message.qos)
        restored = self.router.restore(time.monotonic())
        if restored:
            self._log("federation_custody_restored", events=str(restored))
        for topic_filter in self._pending_filters:
            self._apply(self.router.subscribe(topic_filter))
        self._pending_filters.clear()
        if config.upstream:
            self._apply(self.router.set_upstream(config.upstream, time.monotonic(), one_way=config.one_way))
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())
        self._log("federation_started", name=name, place=config.place, mode=config.mode)
        return port

    async def _start_grpcio(self) -> int:
        config = self.config
        server = grpc.aio.server(options=_SERVER_OPTIONS)
        pb_grpc.add_FederationServicer_to_server(self, server)
        try:
            address = f"{config.host}:{config.port}"
            if self._tls is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, self._tls.server_credentials())
        except RuntimeError:  # grpc reports a port in use this way
            port = 0
        if port == 0:
            raise OSError(98, f"cannot bind the federation listener {config.host}:{config.port}")
        await server.start()
        self._server = server
        return int(port)

    async def _start_h2(self) -> int:
        """The shared links on SkipMQ's own gRPC runtime on the event loop (transport/h2_runtime.py)."""
        from broker.adapters.transport.h2_runtime import H2Server

        config = self.config
        tls = self._tls
        server = H2Server(
            self.Link,
            _h2_limits(),
            tls.server_ssl_context if tls is not None else None,
            path=_LINK_METHOD,
            decode=pb.FedFrame.FromString,
            encode=pb.FedFrame.SerializeToString,
        )
        try:
            port = await server.bind(config.host, config.port)
        except OSError as exc:
            where = f"{config.host}:{config.port}"
            raise OSError(exc.errno or 98, f"cannot bind the federation listener {where}") from None
        self._server = server
        return port

    async def stop(self, *, leave: bool = True) -> None:
        """Leave the place (children re-link to our parent, §3.7.3) and close everything."""
        if self._ticker is not None:
            self._ticker.cancel()
        router = self.router
        if leave and router is not None and not router.left:
            self._apply(router.leave())
            with contextlib.suppress(Exception):  # let the Leave frames reach the neighbours
                await asyncio.wait_for(self._drain(), timeout=2.0)
        for link in list(self._links.values()):
            self._close(link)
        if self._custody_store is not None and self._custody_store.pending() and self.store is not None:
            self.store.begin()  # the broker's close commits it
        if self._server is not None:
            await self._server.stop(grace=0.5)

    async def _drain(self) -> None:
        while any(not link.outbox.empty() for link in self._links.values()):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL_S)
            if self.router is None:
                continue
            try:
                self._apply(self.router.tick(time.monotonic()))
                self._write_forgotten()
            except Exception:  # a bug must not stop the retries, discovery and custody timers
                log.exception("federation tick failed")

    def _write_forgotten(self) -> None:
        """Completed custody rows wait for the next commit; an idle broker makes one per tick, so
        a restart does not send completed events again (custody_store.py)."""
        custody, store, broker = self._custody_store, self.store, self.broker
        if custody is not None and store is not None and broker is not None and custody.pending():
            store.begin()
            broker.after_batch()

    # ------------------------------------------------------------------ the core's events
    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        if share_group is not None or topic_filter.startswith("$"):
            return  # $share stays inside its site; $SYS and other $ topics are local
        if (client_id, topic_filter) in self._subscriptions:
            return  # a replaced subscription is still one source
        self._subscriptions.add((client_id, topic_filter))
        if self.router is None:
            self._pending_filters.append(topic_filter)
        else:
            self._apply(self.router.subscribe(topic_filter))

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        if (client_id, topic_filter) not in self._subscriptions or share_group is not None:
            return
        self._subscriptions.discard((client_id, topic_filter))
        if self.router is None:
            with contextlib.suppress(ValueError):
                self._pending_filters.remove(topic_filter)
        else:
            self._apply(self.router.unsubscribe(topic_filter))

    def on_publish(self, message: Message) -> None:
        if self.router is None or message.topic.startswith("$"):
            return
        event = Event(message.topic, message.payload, message.qos, message.retain)
        self._apply(self.router.publish(event, time.monotonic(), wall_ms=int(time.time() * 1000)))

    def collector(self) -> FederationCollector:
        """The ``skipmq_federation_*`` metric families (metrics.py), read at each scrape."""
        return FederationCollector(self)

    # ------------------------------------------------------------------ state (GET /federation)
    def state(self) -> dict[str, Any]:
        router = self.router
        if router is None:
            return {"started": False}
        return {
            "name": router.name,
            "place": router.place,
            "mode": router.settings.mode.value,
            "parent": router.parent,
            "children": sorted(router.children),
            "topology": list(router.topology),
            "upstream_known": router.upstream_known(),
            "local_keys": sorted(router.local_keys()),
            "counters": router.counters(),
            "registered_toward": {link: router.registered_toward(link) for link in router.links()},
            "received_from": {link: router.received_from(link) for link in router.links()},
            "sent": dict(router.stats.sent),
            "events_in": router.stats.events_in,
            "events_delivered": router.stats.events_delivered,
            "events_wasted": router.stats.events_wasted,
            "events_forwarded": self.events_forwarded,
            "custody": router.custody_stats(),
            "retained_known": len(router.retained),
        }

    # ------------------------------------------------------------------ actions
    def _apply(self, actions: list[Action]) -> None:
        batches: dict[str, list[pb.FedMessage]] = {}
        for action in actions:
            if isinstance(action, Send):
                if isinstance(action.message, LinkRequest) and action.peer not in self._links:
                    self._flush(batches)
                    self._dial(action.peer)
                if isinstance(action.message, Event):
                    self.events_forwarded += 1
                elif isinstance(action.message, EventAck) and self._store_pending():
                    self._ack_after_commit(action.peer, wire.encode(action.message))
                    continue
                encoded = wire.encode(action.message)
                if isinstance(action.message, (LinkRequest, LinkAccepted)):
                    self._challenge_or_answer(action.peer, encoded)
                batches.setdefault(action.peer, []).append(encoded)
            elif isinstance(action, Deliver):
                self._deliver(action)
            elif isinstance(action, StoreRetained):
                self._store_retained(action)
            elif isinstance(action, Unlink):
                self._flush(batches, only=action.peer)
                link = self._links.pop(action.peer, None)
                if link is not None:
                    link.unlinked = True
                    link.outbox.put_nowait(None)
            elif isinstance(action, Note):
                self._log(action.event, logging.INFO, **dict(action.fields))
        self._flush(batches)

    def _store_pending(self) -> bool:
        return self.broker is not None and self.broker.store_pending()

    def _ack_after_commit(self, peer: str, ack: pb.FedMessage) -> None:
        """An acknowledgement says "durable here": it waits for the group commit (scheduled by
        ``after_batch``, which runs before this callback on the loop)."""
        self._acks_after_commit.setdefault(peer, []).append(ack)
        if not self._acks_scheduled:
            self._acks_scheduled = True
            if self.broker is not None:
                self.broker.after_batch()
            asyncio.get_running_loop().call_soon(self._send_acks)

    def _send_acks(self) -> None:
        self._acks_scheduled = False
        broker = self.broker
        if broker is not None and broker.store_pending() and not broker.commit_now():
            self._acks_scheduled = True  # the commit failed: the broker rewrites its store; retry
            asyncio.get_running_loop().call_later(0.1, self._send_acks)
            return
        acks, self._acks_after_commit = self._acks_after_commit, {}
        for peer, messages in acks.items():
            link = self._links.get(peer)
            if link is not None:
                link.outbox.put_nowait(pb.FedFrame(messages=messages))

    def _flush(self, batches: dict[str, list[pb.FedMessage]], only: str | None = None) -> None:
        for peer in [only] if only is not None else list(batches):
            messages = batches.pop(peer, None)
            link = self._links.get(peer)
            if messages and link is not None:
                link.outbox.put_nowait(pb.FedFrame(messages=messages))

    def _deliver(self, action: Deliver) -> None:
        event = action.event
        self.events_received += 1
        message = Message(topic=event.topic, payload=event.payload, qos=event.qos, origin="federation")
        broker = self.broker
        if broker is not None:
            broker.deliver_remote(message)
            broker.after_batch()

    def _store_retained(self, action: StoreRetained) -> None:
        write = action.write
        broker = self.broker
        if broker is not None:
            broker.set_retained(
                Message(write.topic, write.payload, write.qos, retain=True, origin="federation")
            )
            broker.after_batch()

    # ------------------------------------------------------------------ dialing (the requester)
    def _dial(self, peer: str) -> None:
        link = _Link(peer, dialed=True)
        if self._identity is not None and self._identity.asks:
            link.challenge = secrets.token_bytes(CHALLENGE_BYTES)
        if self.config.link_runtime == "h2":
            from broker.adapters.transport.h2_runtime import H2Channel

            tls = self._tls
            link.channel = H2Channel(
                peer,
                _h2_limits(),
                tls.client_ssl_context() if tls is not None else None,
                expect_peer_id=peer if tls is not None else None,
            )
        elif self._tls is None:
            link.channel = grpc.aio.insecure_channel(peer, options=_OPTIONS)
        else:
            link.channel = grpc.aio.secure_channel(peer, self._tls.channel_credentials(), options=_OPTIONS)
        link.call = pb_grpc.FederationStub(link.channel).Link()
        self._links[peer] = link
        loop = asyncio.get_running_loop()
        link.tasks = [loop.create_task(self._write_dialed(link)), loop.create_task(self._read(link))]

    async def _write_dialed(self, link: _Link) -> None:
        with contextlib.suppress(Exception):
            while True:
                frame = await link.outbox.get()
                if frame is None:
                    await link.call.done_writing()
                    return
                await link.call.write(frame)

    # ------------------------------------------------------------------ accepting
    async def Link(self, request_iterator: Any, context: Any) -> None:
        try:
            first = await asyncio.wait_for(context.read(), timeout=FIRST_FRAME_TIMEOUT_S)
        except TimeoutError:
            await self._refuse(context, grpc.StatusCode.DEADLINE_EXCEEDED, "no LinkRequest within 5 s")
            return
        if first is grpc.aio.EOF:
            return
        try:
            messages = [wire.decode(item) for item in first.messages]
        except wire.FederationWireError as exc:
            self._log("federation_bad_frame", peer=context.peer(), reason=str(exc), level=logging.WARNING)
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        if len(messages) != 1 or not isinstance(messages[0], LinkRequest) or ":" not in messages[0].requester:
            await self._refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, "the first frame must hold one LinkRequest"
            )
            return
        if self.router is None:
            await self._refuse(context, grpc.StatusCode.UNAVAILABLE, "federation is starting")
            return
        peer = messages[0].requester
        refusal = self._identity_refusal(peer, context)
        if refusal is not None:
            self._log(
                "federation_identity_refused", peer=context.peer(), reason=refusal, level=logging.WARNING
            )
            await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, refusal)
            return
        old = self._links.get(peer)
        if old is not None and not old.dialed:  # the peer restarted and requests again
            self._lost(old)
        link = _Link(peer, dialed=False)
        link.challenge = wire.challenge_of(first.messages[0])  # answered in our LinkAccepted
        link.call = context
        self._links[peer] = link
        link.tasks = [asyncio.get_running_loop().create_task(self._read(link))]
        self._receive(link, messages)
        while True:
            frame = await link.outbox.get()
            if frame is None:
                return
            try:
                await context.write(frame)
            except Exception:
                return

    async def _refuse(self, context: Any, code: grpc.StatusCode, detail: str) -> None:
        """End a stream before any link: counted by status (skipmq_federation_link_refused_total)."""
        self.refusals[code.name] = self.refusals.get(code.name, 0) + 1
        await context.abort(code, detail)

    def _identity_refusal(self, claimed: str, context: Any) -> str | None:
        """Why a LinkRequest claiming ``claimed`` is refused on this stream (TLS only): the
        client certificate, checked against the place's CA, must name it."""
        return None if self._tls is None else identity_refusal(context, claimed, "LinkRequest")

    # ------------------------------------------------------------------ who answers a request
    def _challenge_or_answer(self, peer: str, encoded: pb.FedMessage) -> None:
        """Our LinkRequest asks the dialed link's challenge; our LinkAccepted answers the one its
        requester asked (after its client certificate was found to name it), when we have keys."""
        link = self._links.get(peer)
        if link is None or not link.challenge or self.router is None:
            return
        if encoded.HasField("link_request") and link.dialed:
            encoded.link_request.challenge = link.challenge
        elif encoded.HasField("link_accepted") and not link.dialed and self._identity is not None:
            try:
                proof = self._identity.answer(link.challenge, peer, self.router.name)
            except Exception as exc:  # a key that cannot sign: the requester decides what none means
                log.error("cannot answer the link challenge of %s: %s", peer, exc)
                return
            if proof is not None:
                wire.set_answer(encoded, proof)

    def _answer_taken(self, link: _Link, items: Any, messages: list[LinkMessage]) -> bool:
        """Whether a dialed link's frame may go to the router: False when it holds the acceptor's
        LinkAccepted and that does not show the dialed broker answers (refused: counted, logged,
        the stream ends as a failed dial). The answer's topology must end with the dialed name and
        its proof must show it. Before the answer, the router ignores what an unlinked peer sends;
        a LinkRefused needs no proof."""
        for index, message in enumerate(messages):
            if not isinstance(message, LinkAccepted):
                continue
            link.answered = True
            if self._identity is None or self.router is None:
                return True
            if self._identity.asks and message.topology and message.topology[-1] != link.peer:
                verdict = DialVerdict(
                    WRONG_PEER_ID, f"the broker at {link.peer} calls itself {message.topology[-1]!r}"
                )
            else:
                verdict = self._identity.check(
                    link.challenge, self.router.name, link.peer, wire.answer_of(items[index]), time.time()
                )
            if verdict.refused or verdict.outcome == WRONG_PEER_ID:
                self.dial_refusals[verdict.outcome] = self.dial_refusals.get(verdict.outcome, 0) + 1
                self._log(
                    "federation_identity_refused",
                    logging.WARNING,
                    side="dialer",
                    peer=link.peer,
                    code=f"DIAL_{verdict.outcome.upper()}",
                    reason=verdict.problem,
                )
                return False
            if verdict.outcome == UNPROVEN:
                self.unproven_links += 1
                self._log("federation_link_unproven", logging.WARNING, peer=link.peer, reason=verdict.problem)
            return True
        return True

    # ------------------------------------------------------------------ reading (both sides)
    async def _read(self, link: _Link) -> None:
        try:
            while True:
                frame = await link.call.read()
                if frame is grpc.aio.EOF:
                    break
                try:
                    messages = [wire.decode(item) for item in frame.messages]
                except wire.FederationWireError as exc:
                    self._log("federation_bad_frame", peer=link.peer, reason=str(exc), level=logging.WARNING)
                    break
                if (
                    link.dialed
                    and not link.answered
                    and not self._answer_taken(link, frame.messages, messages)
                ):
                    break
                self._receive(link, messages)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, PeerIdentityError):  # h2 runtime: its certificate names another
                self.dial_refusals["certificate"] = self.dial_refusals.get("certificate", 0) + 1
                self._log(
                    "federation_identity_refused",
                    logging.WARNING,
                    side="dialer",
                    peer=link.peer,
                    code="DIAL_CERTIFICATE",
                    reason=str(exc),
                )
            elif not link.closed and not link.unlinked:
                self._log("federation_stream_failed", peer=link.peer, reason=_describe(exc))
        self._lost(link)

    def _receive(self, link: _Link, messages: list[LinkMessage]) -> None:
        router = self.router
        if router is None or link.closed:
            return
        for message in messages:
            try:
                self._apply(router.on_message(link.peer, message, time.monotonic()))
            except LinkError as exc:
                self._log("federation_link_error", peer=link.peer, reason=str(exc), level=logging.WARNING)
        if self._store_pending() and self.broker is not None:
            self.broker.after_batch()  # custody rows of relayed events: commit them soon

    def _lost(self, link: _Link) -> None:
        """The stream ended: without a Leave before it, the router treats it as a crash."""
        was_current = self._links.get(link.peer) is link
        if was_current:
            del self._links[link.peer]
        self._close(link)
        if was_current and self.router is not None:
            self._apply(self.router.link_lost(link.peer, time.monotonic()))

    def _close(self, link: _Link) -> None:
        if link.closed:
            return
        link.closed = True
        link.outbox.put_nowait(None)
        current = asyncio.current_task()
        for task in link.tasks:
            if task is not current and not task.done():
                task.cancel()
        if link.dialed and link.call is not None:
            link.call.cancel()
        if link.channel is not None:
            closing = asyncio.get_running_loop().create_task(link.channel.close())
            self._background.add(closing)
            closing.add_done_callback(self._background.discard)

    def _log(self, event: str, level: int = logging.INFO, **fields: str) -> None:
        if self.broker is not None:
            self.broker.log_event(level, event, **fields)
        else:
            log.log(level, "%s %s", event, fields)


def federation_tls(config: FederationConfig) -> ClusterTls | None:
    """The mutual-TLS credentials of the shared links (the cluster's ``tls.py``: same CA tooling,
    same certificate identity), or None with ``federation.insecure`` - warned about at every start."""
    if config.insecure:
        log.warning(
            "federation.insecure is set: federation links are plaintext and unauthenticated; anyone "
            "who reaches %s:%d can link as any broker, read and inject events (docs/federation.md)",
            config.host,
            config.port,
        )
        return None
    return ClusterTls(TlsFiles(config.tls_ca_file, config.tls_cert_file, config.tls_key_file))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
