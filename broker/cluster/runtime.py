"""The cluster runtime: drives the pure overlay core with the real clock and the gRPC transport,
and gives the broker core MQTT semantics across brokers (issue #4; docs/cluster.md).

One object, on the broker's event-loop thread, owns the ``overlay.node.OverlayNode`` (seed 003
SG-TBPS + FRT): every event (a transport receive, a timer, a local subscription change, a
publish) goes through :meth:`ClusterRuntime._handle`, which feeds the node with ``loop.time()``,
carries out the returned actions in order and re-arms the single timer from
``next_deadline()`` (the aioquic / etcd-raft driver shape).

Mapping MQTT onto the overlay:

* **Topic classes** (``broker.cluster.classes``): the overlay routes on classes, each broker
  matches filters exactly. Local subscriptions are counted per class; only 0→1 joins the class
  as a subscriber and only 1→0 leaves it (UNSUB), SIONet-style aggregation (seed 000).
* **Forwarding**: a local publish is published on each of its classes whose rendezvous point
  reports subscribers, as a :class:`ForwardedMessage` numbered per (this broker incarnation,
  class). Receivers restore that order (held up to ``cluster.reorder_hold_ms`` for a gap) and
  drop duplicates, so per-publisher per-topic order survives one-hop/multi-hop switches.
* **QoS 1/2**: the overlay reports ``PublishDone`` when every subscriber broker of the class
  stored the message (the runtime commits the store after each Deliver before it sends
  anything else); the publisher's PUBACK/PUBREC waits for that, at most
  ``cluster.publish_ack_wait_ms``.
* **Control class** ``!ctl``: every broker subscribes it; retained updates (last writer wins on
  (wall-clock ms, peer id)) and session claims are published there, so they reach every broker.
* **Session takeover**: a CONNECT publishes a claim; the broker holding the client disconnects
  it and answers with a directed :class:`Envelope` carrying the session (seed 002 envelope).
* **Shared subscriptions**: a broker with members of ``$share/g/f`` joins the class
  ``!share/g/f``; the broker whose virtual node heads that run at level 0 delivers the group's
  copy (one delivery per group cluster-wide).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from sortedcontainers import SortedDict

from broker.cluster.classes import filter_class, topic_classes
from broker.cluster.messages import (
    DEFAULT_ENVELOPE_TTL,
    ClaimReply,
    Envelope,
    ForwardedMessage,
    RetainedSyncReply,
    RetainedSyncRequest,
    RetainedUpdate,
    SessionClaim,
)
from broker.cluster.stats import ClusterCollector, ClusterStats
from broker.mqtt.session import Message, SessionSnapshot
from overlay import api
from overlay.api import Role
from overlay.config import OverlayConfig
from overlay.keys import ANCHOR_TOPIC, PUBLISHER, SUBSCRIBER, make_key
from overlay.node import OverlayNode

log = logging.getLogger("skipmq.cluster")

CONTROL_CLASS = "!ctl"  # every broker subscribes: retained updates and session claims
SHARE_PREFIX = "!share/"  # "!share/<group>/<filter>": the run of brokers with members of a group
RETAINED_SYNC_CHUNK = 256
RETAINED_SYNC_TIMEOUT_S = 5.0  # then the next contact is asked for the retained store
PUBLISHER_IDLE_S = 600.0  # a publisher virtual node unused this long leaves its class
SWEEP_INTERVAL_S = 30.0
STREAM_IDLE_S = 900.0  # receive-order state of a silent (origin, class) stream is dropped
# sequence numbers below a stream's first received one that were delivered late (out of order)
# are remembered so their retransmissions are dropped; the oldest are forgotten beyond this
LATE_SEEN_LIMIT = 1024


@dataclass
class _Stream:
    """Receive order of one (origin incarnation, class) stream."""

    next_seq: int = 0  # 0 = nothing received yet
    first_seq: int = 0  # the sequence number the stream started at here
    # earlier messages that arrived after the first one (they overtook nothing: delivered late)
    late_seen: set[int] = field(default_factory=set)
    held: SortedDict = field(default_factory=SortedDict)  # seq -> (ForwardedMessage, hops)
    hold_timer: asyncio.TimerHandle | None = None
    last_seen: float = 0.0


@dataclass
class _PublishWait:
    """The overlay publications of one QoS>0 message (one per class it was sent on)."""

    future: asyncio.Future[bool]
    outstanding: set[int]
    sealed: bool = True  # False while on_publish is still handing publications to the overlay
    complete: bool = True
    timer: asyncio.TimerHandle | None = None


@dataclass
class _Claim:
    future: asyncio.Future[SessionSnapshot | None]
    waiting_for: set[str]
    timer: asyncio.TimerHandle | None = None


def overlay_config_for(cluster: Any) -> OverlayConfig:
    """The overlay tunables a broker uses (faster crash detection than the simulator's defaults)."""
    return OverlayConfig(
        table_size=cluster.table_size,
        ping_interval_s=cluster.ping_interval_ms / 1000.0,
        failure_timeout_s=cluster.failure_timeout_ms / 1000.0,
        # a crashed or departed broker is not re-learned from other brokers' stale routing entries
        # for this long; one that comes back is taken back as soon as it sends us anything
        dead_peer_memory_s=600.0,
        # end-to-end completion: the PUBACK of a QoS>0 publish waits for the overlay's PublishDone
        publish_done_enabled=True,
        publish_done_timeout_s=max(0.5, cluster.publish_ack_wait_ms / 1000.0),
    )


class ClusterRuntime:
    """ClusterHooks implementation + overlay driver. Create, pass as the broker's hooks, then
    ``await start(broker)``; ``await stop()`` before the broker shuts down."""

    def __init__(self, config: Any, *, transport_factory: Callable[..., Any] | None = None) -> None:
        self.config = config
        self.cluster = config.cluster
        self.class_levels: int = self.cluster.class_levels
        self.stats = ClusterStats()
        self._transport_factory = transport_factory
        self.transport: Any = None
        self.node: OverlayNode | None = None
        self.broker: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.peer_id = ""
        self.incarnation = os.urandom(6).hex()
        self.stopped = True
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        # subscription aggregation (seed 000 counters): (client, group, filter) -> class
        self._subscriptions: dict[tuple[str, str | None, str], str] = {}
        self._class_counts: dict[str, int] = {}
        self._share_counts: dict[str, int] = {}  # "!share/g/f" -> local members
        self._filter_classes: dict[str, str] = {}
        # publishing
        self._published: dict[str, float] = {}  # class -> last publish (loop time)
        self._send_seq: dict[str, int] = {}
        self._publication_id = 0
        self._waits: dict[int, _PublishWait] = {}  # publication id -> wait of its message
        # receiving
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._retained_versions: dict[str, tuple[int, str]] = {}
        # takeover
        self._claim_id = 0
        self._claims: dict[int, _Claim] = {}
        # client id -> (claim id, peer id) of the claim its current local connection made: a
        # claim orders connections cluster-wide (claim ids are wall-clock ns), older claims lose
        self._connection_claims: dict[str, tuple[int, str]] = {}
        # client id -> the newest claim seen from another broker (a local CONNECT still waiting
        # for its own claim's answers must not win against it)
        self._newest_remote_claims: dict[str, tuple[int, str]] = {}
        self._request_id = 0
        self._retained_sync_contacts: list[str] = []
        self._retained_sync_request = 0
        self._retained_sync_timer: asyncio.TimerHandle | None = None
        self._deliver_pending_commit = False

    # ================================================================== lifecycle
    async def start(self, broker: Any) -> int:
        """Bind the cluster port, enter the overlay through ``cluster.join``; returns the port."""
        self.broker = broker
        self.loop = asyncio.get_running_loop()
        cluster = self.cluster
        advertise = cluster.advertise_host or (
            cluster.host if cluster.host not in ("0.0.0.0", "::", "") else _hostname()
        )
        factory = self._transport_factory
        if factory is None:
            from broker.transport import GrpcTransport

            factory = GrpcTransport
        self.transport = factory(
            advertise_host=advertise, on_receive=self._on_receive, on_peer_down=self._on_peer_down
        )
        port = int(await self.transport.start(cluster.host, cluster.port))
        self.peer_id = self.transport.self_id
        seed = int.from_bytes(os.urandom(8), "big")
        self.node = OverlayNode(self.peer_id, rng=random.Random(seed), config=overlay_config_for(cluster))
        self.stopped = False
        contacts = await self._resolve_contacts(cluster.join)
        self._handle(api.Bootstrap(tuple(contacts)))
        self._handle(api.JoinTopic(CONTROL_CLASS, Role.SUBSCRIBER))
        self._handle(api.JoinTopic(CONTROL_CLASS, Role.PUBLISHER))
        # subscriptions restored from the store before the runtime started
        for cls in list(self._class_counts):
            self._handle(api.JoinTopic(cls, Role.SUBSCRIBER))
        for share in list(self._share_counts):
            self._handle(api.JoinTopic(share, Role.SUBSCRIBER))
        self._retained_sync_contacts = list(contacts)
        self._request_retained_copy()
        self._sweeper = self.loop.call_later(SWEEP_INTERVAL_S, self._sweep)
        self.broker.log_event(logging.INFO, "cluster_started", peer_id=self.peer_id, contacts=contacts)
        return port

    def _request_retained_copy(self) -> None:
        """Ask the next contact for its retained store; try the one after if no answer comes."""
        if self.stopped or not self._retained_sync_contacts or self.loop is None:
            return
        contact = self._retained_sync_contacts.pop(0)
        self._request_id += 1
        self._retained_sync_request = self._request_id
        self._send_envelope(contact, "", 0, RetainedSyncRequest(self._request_id))
        self._retained_sync_timer = self.loop.call_later(RETAINED_SYNC_TIMEOUT_S, self._request_retained_copy)

    async def stop(self) -> None:
        """Graceful leave: UNSUB/LEAVE every virtual node, drain the links, close."""
        if self.stopped:
            return
        with contextlib.suppress(Exception):
            self._handle(api.Shutdown())
        self.stopped = True
        for handle in (self._timer, self._sweeper, self._retained_sync_timer):
            if handle is not None:
                handle.cancel()
        self._timer = self._sweeper = self._retained_sync_timer = None
        self._timer_at = None
        for wait in list(self._waits.values()):
            self._finish_wait(wait, False)
        for claim_id in list(self._claims):
            self._finish_claim(claim_id, None)
        for stream in self._streams.values():  # nothing is delivered after stop
            if stream.hold_timer is not None:
                stream.hold_timer.cancel()
                stream.hold_timer = None
        if self.transport is not None:
            await self.transport.stop(drain_timeout_s=2.0)

    async def _resolve_contacts(self, join: str) -> list[str]:
        """host:port entries; a DNS name resolving to several addresses gives several contacts."""
        assert self.loop is not None
        contacts: list[str] = []
        for entry in (item.strip() for item in join.split(",")):
            if not entry:
                continue
            host, _, port_text = entry.rpartition(":")
            host = host.strip("[]")
            addresses = [host]
            with contextlib.suppress(OSError):
                infos = await self.loop.getaddrinfo(host, int(port_text), type=0, proto=6)
                resolved = sorted(
                    {str(info[4][0]) for info in infos if info[0].name in ("AF_INET", "AF_INET6")}
                )
                if resolved and not _is_ip(host):
                    addresses = resolved
            for address in addresses:
                peer = f"[{address}]:{port_text}" if ":" in address else f"{address}:{port_text}"
                if peer != self.peer_id and peer not in contacts:
                    contacts.append(peer)
        return contacts

    # ================================================================== the overlay driver
    def _now(self) -> float:
        assert self.loop is not None
        return self.loop.time()

    def _handle(self, event: Any) -> None:
        node = self.node
        if node is None or (self.stopped and not isinstance(event, api.Shutdown)):
            return
        try:
            self._carry_out(node.handle(event, self._now()))
        finally:
            self._arm_timer()  # the overlay's deadline may have moved even if handling failed

    def _carry_out(self, actions: list[Any]) -> None:
        for action in actions:
            try:
                self._carry_out_one(action)
            except Exception:
                # one bad action (a malformed payload from a peer, a bug) must not drop the ones
                # behind it: they may be the DONE a publisher's broker waits for
                log.exception("cluster: failed to carry out %s", type(action).__name__)

    def _carry_out_one(self, action: Any) -> None:
        if isinstance(action, api.Send):
            if self._deliver_pending_commit:
                # a Deliver before this Send must be durable first: the Send may be the DONE
                # that lets the publisher's broker acknowledge its client
                self._deliver_pending_commit = False
                if self.broker.store_pending():
                    self.broker.commit_now()
            try:
                self.transport.send(action.dest, action.message)
            except (ValueError, RuntimeError) as exc:  # WireError is a ValueError
                log.error(
                    "cluster: cannot send %s to %s: %s", type(action.message).__name__, action.dest, exc
                )
        elif isinstance(action, api.Deliver):
            self._on_deliver(action)
        elif isinstance(action, api.SubscriberPresence):
            pass  # read back with node.subscriber_presence when publishing
        elif isinstance(action, api.PublishDone):
            self._on_publish_done(action.publication_id, action.complete)

    def _arm_timer(self) -> None:
        node = self.node
        if node is None or self.stopped or self.loop is None:
            return
        deadline = node.next_deadline()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            self._timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._handle(api.Tick())

    def _on_receive(self, sender: str, item: Any) -> None:
        if self.stopped:
            return
        try:
            if isinstance(item, Envelope):
                self._on_envelope(sender, item)
            else:
                self._handle(api.Receive(sender, item))
        except Exception:
            log.exception("cluster: failed to handle %s from %s", type(item).__name__, sender)
        self.broker.after_batch()

    def _on_peer_down(self, peer: str) -> None:
        if self.stopped:
            return
        self._handle(api.PeerUnreachable(peer))
        self.transport.drop_queued(peer)  # the overlay re-sends what matters around it
        for claim_id, claim in list(self._claims.items()):
            claim.waiting_for.discard(peer)
            if not claim.waiting_for:
                self._finish_claim(claim_id, None)

    def _sweep(self) -> None:
        """Leave idle publisher classes; forget silent receive streams."""
        if self.stopped:
            return
        now = self._now()
        for cls, last in list(self._published.items()):
            if now - last > PUBLISHER_IDLE_S and cls != CONTROL_CLASS:
                del self._published[cls]
                self._handle(api.LeaveTopic(cls, Role.PUBLISHER))
        sessions = self.broker.sessions
        for client_id in [c for c in self._connection_claims if c not in sessions]:
            del self._connection_claims[client_id]
        self._newest_remote_claims.clear()  # only races within a sweep period matter
        for key, stream in list(self._streams.items()):
            if now - stream.last_seen > STREAM_IDLE_S and not stream.held:
                del self._streams[key]
        assert self.loop is not None
        self._sweeper = self.loop.call_later(SWEEP_INTERVAL_S, self._sweep)

    # ================================================================== hooks: subscriptions
    def class_of(self, topic_filter: str) -> str:
        cls = self._filter_classes.get(topic_filter)
        if cls is None:
            cls = self._filter_classes[topic_filter] = filter_class(topic_filter, self.class_levels)
        return cls

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        key = (client_id, share_group, topic_filter)
        if key in self._subscriptions:
            return  # a replaced subscription: same class
        cls = self.class_of(topic_filter)
        self._subscriptions[key] = cls
        self._count_up(self._class_counts, cls)
        if share_group is not None:
            self._count_up(self._share_counts, f"{SHARE_PREFIX}{share_group}/{topic_filter}")

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        cls = self._subscriptions.pop((client_id, share_group, topic_filter), None)
        if cls is None:
            return
        self._count_down(self._class_counts, cls)
        if share_group is not None:
            self._count_down(self._share_counts, f"{SHARE_PREFIX}{share_group}/{topic_filter}")

    def _count_up(self, counts: dict[str, int], topic: str) -> None:
        """SIONet-style aggregation: only the first local subscriber joins the overlay topic."""
        counts[topic] = counts.get(topic, 0) + 1
        if counts[topic] == 1:
            self._handle(api.JoinTopic(topic, Role.SUBSCRIBER))

    def _count_down(self, counts: dict[str, int], topic: str) -> None:
        """... and only the last one leaving sends UNSUB (seed 003 §3.5.3)."""
        left = counts.get(topic, 0) - 1
        if left > 0:
            counts[topic] = left
            return
        counts.pop(topic, None)
        self._handle(api.LeaveTopic(topic, Role.SUBSCRIBER))

    def owns_share_group(self, group: str, topic_filter: str) -> bool:
        """The head of the group's level-0 run delivers (one delivery per group per cluster)."""
        node = self.node
        if node is None or self.stopped:
            return True
        key = make_key(f"{SHARE_PREFIX}{group}/{topic_filter}", SUBSCRIBER, self.peer_id)
        if key not in node.vnodes:
            return True  # still joining: deliver rather than risk losing the message
        left, _right = node.level0_neighbors(key)
        return left is None or left[0] != key[0] or left[1] != key[1]

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        mine = self._connection_claims.get(client_id)
        newer = self._newest_remote_claims.get(client_id)
        if mine is not None and newer is not None and newer > mine:
            # a newer CONNECT of this client id elsewhere was claimed while ours waited: it wins
            assert self.loop is not None
            self.loop.call_soon(self.broker.kick, client_id, 0x8E)

    def on_client_disconnected(self, client_id: str) -> None:
        return None  # its claim record is dropped by the sweep once the session is gone

    # ================================================================== hooks: publishing
    def on_publish(self, message: Message, from_client_id: str | None) -> asyncio.Future[bool] | None:
        if self.stopped or self.node is None or message.topic.startswith("$SYS"):
            return None
        node = self.node
        now = self._now()
        wait: _PublishWait | None = None
        if message.qos:
            assert self.loop is not None
            # registered before the overlay sees the Publish: its PublishDone may come at once
            wait = _PublishWait(self.loop.create_future(), set(), sealed=False)
        sent = 0
        for cls in topic_classes(message.topic, self.class_levels):
            if cls not in self._published:
                self._handle(api.JoinTopic(cls, Role.PUBLISHER))
            self._published[cls] = now
            if node.subscriber_presence(cls) is False:
                continue  # the rendezvous point says nobody subscribes (exhaust data, §3.2)
            seq = self._send_seq.get(cls, 0) + 1
            self._send_seq[cls] = seq
            self._publication_id += 1
            pid = self._publication_id
            payload = ForwardedMessage(f"{self.peer_id}/{self.incarnation}", cls, seq, message)
            sent += 1
            self.stats.forwarded += 1
            if wait is not None:
                wait.outstanding.add(pid)
                self._waits[pid] = wait
            self._handle(api.Publish(cls, payload, pid))
        if message.retain:
            self._publish_retained(message)
        if wait is None or not sent:
            return None
        wait.sealed = True
        if not wait.outstanding:  # every publication completed synchronously
            self._finish_wait(wait, wait.complete)
            return None
        assert self.loop is not None
        wait.timer = self.loop.call_later(
            self.cluster.publish_ack_wait_ms / 1000.0, self._finish_wait, wait, False
        )
        return wait.future

    def _on_publish_done(self, publication_id: int, complete: bool) -> None:
        wait = self._waits.pop(publication_id, None)
        if wait is None:
            return
        wait.outstanding.discard(publication_id)
        wait.complete = wait.complete and complete
        if not wait.outstanding and wait.sealed:
            self._finish_wait(wait, wait.complete)

    def _finish_wait(self, wait: _PublishWait, complete: bool) -> None:
        if wait.future.done():
            return
        if wait.timer is not None:
            wait.timer.cancel()
        for pid in wait.outstanding:
            self._waits.pop(pid, None)
        self.stats.publish_done["true" if complete else "false"] += 1
        wait.future.set_result(complete)

    def _publish_retained(self, message: Message) -> None:
        # this write follows every version of the topic seen here: stamp it above all of them
        # (two writes in one millisecond, or after an update from a broker whose clock runs
        # ahead), or other brokers would keep the older value while this one holds the newer
        version_ms = time.time_ns() // 1_000_000
        current = self._retained_versions.get(message.topic)
        if current is not None and current[0] >= version_ms:
            version_ms = current[0] + 1
        version = (version_ms, self.peer_id)
        self._retained_versions[message.topic] = version
        update = RetainedUpdate(self.peer_id, version[0], message)
        self._publish_control(update)

    def _publish_control(self, payload: Any) -> None:
        self._publication_id += 1
        self._published[CONTROL_CLASS] = self._now()
        self._handle(api.Publish(CONTROL_CLASS, payload, self._publication_id))

    # ================================================================== receiving
    def _on_deliver(self, action: Any) -> None:
        payload = action.payload
        if action.publisher == self.peer_id:
            return  # our own publication: local subscribers already have it
        if isinstance(payload, ForwardedMessage):
            self._receive_forwarded(payload, int(action.hops))
        elif isinstance(payload, RetainedUpdate):
            self._apply_retained(payload)
        elif isinstance(payload, SessionClaim):
            self._on_claim(payload)

    def _receive_forwarded(self, forwarded: ForwardedMessage, hops: int) -> None:
        key = (forwarded.origin, forwarded.stream)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream()
        stream.last_seen = self._now()
        seq = forwarded.seq
        if stream.next_seq == 0:
            stream.next_seq = stream.first_seq = seq  # the first message of a stream sets its start
        if seq < stream.first_seq and seq not in stream.late_seen:
            # earlier than the message that started the stream here and never seen: it was
            # overtaken (one-hop / multi-hop switch as this broker joined); late beats lost
            stream.late_seen.add(seq)
            if len(stream.late_seen) > LATE_SEEN_LIMIT:
                stream.late_seen.discard(min(stream.late_seen))
            self.stats.reordered += 1
            self._deliver_forwarded(forwarded, hops)
            return
        if seq < stream.next_seq or seq in stream.held:
            self.stats.duplicates_dropped += 1
            return
        if seq > stream.next_seq:
            stream.held[seq] = (forwarded, hops)
            self.stats.reordered += 1
            if stream.hold_timer is None:
                assert self.loop is not None
                stream.hold_timer = self.loop.call_later(
                    self.cluster.reorder_hold_ms / 1000.0, self._skip_gap, key
                )
            return
        self._deliver_forwarded(forwarded, hops)
        stream.next_seq = seq + 1
        self._drain(key, stream)

    def _drain(self, key: tuple[str, str], stream: _Stream) -> None:
        held = stream.held
        while held and held.peekitem(0)[0] == stream.next_seq:
            _seq, (forwarded, hops) = held.popitem(0)
            self._deliver_forwarded(forwarded, hops)
            stream.next_seq += 1
        if not held and stream.hold_timer is not None:
            stream.hold_timer.cancel()
            stream.hold_timer = None
        elif held and stream.hold_timer is None and self.loop is not None:
            stream.hold_timer = self.loop.call_later(
                self.cluster.reorder_hold_ms / 1000.0, self._skip_gap, key
            )

    def _skip_gap(self, key: tuple[str, str]) -> None:
        """An earlier message never came within reorder_hold_ms: continue after the gap."""
        stream = self._streams.get(key)
        if stream is None or self.stopped:
            return
        stream.hold_timer = None
        if not stream.held:
            return
        first = stream.held.peekitem(0)[0]
        self.stats.gaps_skipped += first - stream.next_seq
        log.warning("cluster_gap_skipped stream=%s missing=%d", key, first - stream.next_seq)
        stream.next_seq = first
        self._drain(key, stream)
        self.broker.after_batch()

    def _deliver_forwarded(self, forwarded: ForwardedMessage, hops: int) -> None:
        self.stats.received += 1
        self.stats.observe_hops(hops)
        stream_class = forwarded.stream
        message = forwarded.message
        self.broker.deliver_remote(
            replace(message),
            message.origin,
            accept_filter=lambda flt: self.class_of(flt) == stream_class,
            store_retained=False,
        )
        if not self.broker.route_matched:
            self.stats.wasted += 1  # the class reached us, no local filter matched the topic
        self._deliver_pending_commit = True

    def _apply_retained(self, update: RetainedUpdate) -> None:
        topic = update.message.topic
        version = (update.version_ms, update.origin)
        current = self._retained_versions.get(topic)
        if current is not None and current >= version:
            return
        self._retained_versions[topic] = version
        self.broker.set_retained(replace(update.message))
        self.stats.retained_updates_applied += 1
        self._deliver_pending_commit = True

    # ================================================================== takeover
    def before_attach(
        self, client_id: str, clean_start: bool
    ) -> asyncio.Future[SessionSnapshot | None] | None:
        if self.stopped or self.node is None or self.loop is None:
            return None
        peers = set(self.transport.connected_peers())
        if not peers:
            return None
        # wall-clock nanoseconds, strictly increasing here: with the peer id as tie-breaker they
        # order two CONNECTs of one client id on different brokers the same way everywhere
        self._claim_id = max(self._claim_id + 1, time.time_ns())
        claim_id = self._claim_id
        self._connection_claims[client_id] = (claim_id, self.peer_id)
        self.stats.claims_sent += 1
        self._publish_control(SessionClaim(self.peer_id, client_id, claim_id, clean_start))
        if clean_start or self.cluster.takeover_wait_ms == 0:
            return None  # nothing to wait for: the old connection is closed when the claim arrives
        claim = _Claim(self.loop.create_future(), peers)
        claim.timer = self.loop.call_later(
            self.cluster.takeover_wait_ms / 1000.0, self._finish_claim, claim_id, None
        )
        self._claims[claim_id] = claim
        return claim.future

    def _finish_claim(self, claim_id: int, snapshot: SessionSnapshot | None) -> None:
        claim = self._claims.pop(claim_id, None)
        if claim is None:
            return
        if claim.timer is not None:
            claim.timer.cancel()
        if not claim.future.done():
            claim.future.set_result(snapshot)

    def _on_claim(self, claim: SessionClaim) -> None:
        if claim.origin == self.peer_id:
            return
        mine = self._connection_claims.get(claim.client_id)
        incoming = (claim.claim_id, claim.origin)
        if incoming > self._newest_remote_claims.get(claim.client_id, (0, "")):
            self._newest_remote_claims[claim.client_id] = incoming
        session = self.broker.sessions.get(claim.client_id)
        if (
            mine is not None
            and mine > (claim.claim_id, claim.origin)
            and ((session is not None and session.connection is not None) or mine[0] in self._claims)
        ):
            # our connection is the newer one (attached, or its CONNECT still waiting for its own
            # claim's answers): it keeps the client and the session; the claimant's connection is
            # closed when our own claim reaches it
            self._send_envelope(
                claim.origin,
                claim.client_id,
                claim.claim_id,
                ClaimReply(claim.claim_id, claim.client_id, False, None),
            )
            return
        had, snapshot = self.broker.hand_over(claim.client_id, transfer=not claim.clean_start)
        if had:
            self.stats.sessions_handed_over += 1
            self._deliver_pending_commit = True
        self._send_envelope(
            claim.origin,
            claim.client_id,
            claim.claim_id,
            ClaimReply(claim.claim_id, claim.client_id, had, snapshot),
        )

    # ================================================================== directed messages
    def _send_envelope(self, dest: str, to_client: str, ref: int, body: Any) -> None:
        if self.broker is not None and self.broker.store_pending():
            self.broker.commit_now()
        envelope = Envelope(self.peer_id, dest, "", to_client, ref, DEFAULT_ENVELOPE_TTL, body)
        self.transport.send(dest, envelope)

    def _on_envelope(self, sender: str, envelope: Envelope) -> None:
        if envelope.dest != self.peer_id:
            if envelope.ttl <= 1:
                log.warning("cluster_envelope_dropped ttl orig=%s dest=%s", envelope.orig, envelope.dest)
                return
            self.transport.send(envelope.dest, replace(envelope, ttl=envelope.ttl - 1))
            return
        body = envelope.body
        if isinstance(body, ClaimReply):
            claim = self._claims.get(body.claim_id)
            if claim is None:
                if body.snapshot is not None:  # came after the wait ended: keep its messages anyway
                    self._adopt_late_snapshot(body.snapshot)
                return
            claim.waiting_for.discard(envelope.orig)  # the answering broker (sender may be a relay)
            if body.snapshot is not None:
                self.stats.sessions_received += 1
                self._finish_claim(body.claim_id, body.snapshot)
            elif not claim.waiting_for:
                self._finish_claim(body.claim_id, None)
        elif isinstance(body, RetainedSyncRequest):
            self._send_retained_copy(envelope.orig, body.request_id)
        elif isinstance(body, RetainedSyncReply):
            for update in body.updates:
                self._apply_retained(update)
            if body.last and body.request_id == self._retained_sync_request:
                self._retained_sync_contacts = []
                if self._retained_sync_timer is not None:
                    self._retained_sync_timer.cancel()
                    self._retained_sync_timer = None

    def _adopt_late_snapshot(self, snapshot: SessionSnapshot) -> None:
        """A session arrived after the client's CONNECT stopped waiting: queue its messages into the
        client's current session so nothing acknowledged is lost."""
        session = self.broker.sessions.get(snapshot.client_id)
        self.stats.sessions_received += 1
        if session is None:
            self.broker.import_session(snapshot)
            return
        self.broker.adopt_entries(session, snapshot.pending)

    def _send_retained_copy(self, dest: str, request_id: int) -> None:
        updates = list(self._retained_updates())
        chunks = [updates[i : i + RETAINED_SYNC_CHUNK] for i in range(0, len(updates), RETAINED_SYNC_CHUNK)]
        for index, chunk in enumerate(chunks or [[]]):
            last = index == max(0, len(chunks) - 1)
            self._send_envelope(dest, "", request_id, RetainedSyncReply(request_id, tuple(chunk), last))

    def _retained_updates(self) -> Iterator[RetainedUpdate]:
        """Every retained message held here, and a deletion for every topic known to be deleted
        (a broker that was down when a topic was deleted still holds it on disk)."""
        retained = self.broker.retained
        for topic in list(retained.topics()):
            message = retained.get(topic)
            if message is not None:
                version_ms, origin = self._retained_versions.get(topic, (0, ""))
                yield RetainedUpdate(origin or self.peer_id, version_ms, message)
        for topic, (version_ms, origin) in list(self._retained_versions.items()):
            if retained.get(topic) is None:
                tombstone = Message(topic, b"", qos=0, retain=True, origin=origin)
                yield RetainedUpdate(origin, version_ms, tombstone)

    # ================================================================== introspection
    def state(self) -> dict[str, Any]:
        node = self.node
        joined = False
        presence: dict[str, bool | None] = {}
        vnodes = 0
        if node is not None:
            anchor = make_key(ANCHOR_TOPIC, PUBLISHER, self.peer_id)
            joined = anchor in node.vnodes and anchor not in node.joining_keys()
            vnodes = len(node.vnodes)
            for cls in self._published:
                presence[cls] = node.subscriber_presence(cls)
        return {
            "peer_id": self.peer_id,
            "joined": joined,
            "connected_peers": sorted(self.transport.connected_peers()) if self.transport else [],
            "subscribed_classes": sorted(self._class_counts),
            "published_classes": sorted(self._published),
            "presence": presence,
            "vnodes": vnodes,
        }

    def gauges(self) -> dict[str, int]:
        node = self.node
        return {
            "peers_connected": len(self.transport.connected_peers()) if self.transport else 0,
            "virtual_nodes": len(node.vnodes) if node is not None else 0,
            "subscribed_classes": len(self._class_counts),
            "published_classes": len(self._published),
            "held_messages": sum(len(stream.held) for stream in self._streams.values()),
        }

    def collector(self) -> ClusterCollector:
        return ClusterCollector(self.stats, self.gauges)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _hostname() -> str:
    return socket.gethostname()
