"""The cluster engine: MQTT semantics across brokers on the overlay (issue #4; docs/cluster.md).

One object per broker composes the pure overlay core (``overlay.node.OverlayNode``, seed 003
SG-TBPS + FRT) with the cluster's pure protocol cores - ``interest`` (which classes to subscribe),
``ordering`` (per-sender FIFO), ``publish_acks`` (remote storage before a PUBACK), ``takeover``
(session claims) and ``retained_sync`` (last writer wins) - and the broker core, reached only
through ``broker.core.ports.BrokerApi``. It is the core's ``ClusterPort``.

It does no I/O: messages to other brokers go to a :class:`PeerTransport`, time and its single
timer come from the core's ``Scheduler`` (armed at the earliest ``next_deadline()`` of the overlay
and the cores - the aioquic / etcd-raft driver shape). The same engine runs in a broker process
(``broker.adapters.cluster_runtime`` over gRPC, on asyncio) and in the whole-cluster simulation
(``simulation``, on a seeded virtual network).

Mapping MQTT onto the overlay:

* **Topic classes** (``broker.cluster.classes``): the overlay routes on classes, each broker
  matches filters exactly; local subscriptions aggregate per class (SIONet, seed 000).
* **Forwarding**: a local publish is published on each of its classes whose rendezvous point
  reports subscribers, as a ``ForwardedMessage`` numbered per (this broker incarnation, class);
  receivers restore that order and drop duplicates.
* **QoS 1/2**: the publisher's PUBACK/PUBREC waits for the overlay's ``PublishDone`` of every
  publication (every subscriber broker stored it: the engine commits the store after a Deliver
  before it sends anything else), at most ``cluster.publish_ack_wait_ms``.
* **Control class** ``!ctl``: every broker subscribes it; retained updates and session claims.
* **Session takeover**: a CONNECT publishes a claim; the holder answers with a directed
  ``Envelope`` carrying the session (seed 002 envelope).
* **Shared subscriptions**: the broker whose virtual node heads the group's run at level 0
  delivers the group's copy (one delivery per group cluster-wide).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster.classes import topic_classes
from broker.cluster.interest import SHARE_PREFIX, Interest, share_topic
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
from broker.cluster.ordering import FifoOrdering, StreamKey
from broker.cluster.publish_acks import Finished, PublishAcks
from broker.cluster.retained_sync import CopyRequest, RetainedSync
from broker.cluster.stats import ClusterStats
from broker.cluster.takeover import ClaimFinished, HandOver, LateSession, Refuse, Takeover
from broker.core.ports import Completion
from overlay import api
from overlay.api import Role
from overlay.config import OverlayConfig
from overlay.keys import ANCHOR_TOPIC, PUBLISHER, SUBSCRIBER, make_key
from overlay.node import OverlayNode

if TYPE_CHECKING:
    from broker.config import ClusterConfig
    from broker.core.ports import BrokerApi, Scheduler, TimerHandle
    from broker.core.session import Message, SessionSnapshot

log = logging.getLogger("skipmq.cluster")

CONTROL_CLASS = "!ctl"  # every broker subscribes: retained updates and session claims
RETAINED_SYNC_TIMEOUT_S = 5.0  # then the next contact is asked for the retained store
PUBLISHER_IDLE_S = 600.0  # a publisher virtual node unused this long leaves its class
SWEEP_INTERVAL_S = 30.0
STREAM_IDLE_S = 900.0  # receive-order state of a silent (origin, class) stream is dropped

__all__ = ["CONTROL_CLASS", "SHARE_PREFIX", "ClusterEngine", "PeerTransport", "overlay_config_for"]


class PeerTransport(Protocol):
    """Messages to other brokers (gRPC streams in a broker, the virtual network in a simulation).
    Best effort and FIFO per peer; ``on_receive`` / ``on_peer_down`` of the engine are its inputs."""

    def send(self, peer: str, item: object) -> None: ...

    def connected_peers(self) -> frozenset[str]: ...

    def drop_queued(self, peer: str) -> int: ...


def overlay_config_for(cluster: ClusterConfig) -> OverlayConfig:
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


class ClusterEngine:
    """See the module docstring. Construct, pass as the core's cluster port, ``bind`` the core and
    a transport, ``start``; ``stop`` before the core closes."""

    def __init__(
        self, cluster: ClusterConfig, scheduler: Scheduler, *, rng: random.Random | None = None
    ) -> None:
        self.cluster = cluster
        self.scheduler = scheduler
        self.rng = rng if rng is not None else random.Random()
        self.stats = ClusterStats()
        self.incarnation = f"{self.rng.getrandbits(48):012x}"
        self.interest = Interest(cluster.class_levels)
        self.ordering = FifoOrdering(
            cluster.reorder_hold_ms / 1000.0, stats=self.stats, on_gap=self._gap_skipped
        )
        self.publish_acks = PublishAcks(cluster.publish_ack_wait_ms / 1000.0)
        self.peer_id = ""
        self.broker: BrokerApi | None = None
        self.transport: PeerTransport | None = None
        self.node: OverlayNode | None = None
        self.takeover: Takeover | None = None
        self.retained_sync: RetainedSync | None = None
        self.stopped = True
        self._timer: TimerHandle | None = None
        self._timer_at: float | None = None
        self._next_sweep: float | None = None
        self._published: dict[str, float] = {}  # class -> last publish (scheduler time)
        self._send_seq: dict[str, int] = {}
        self._publication_id = 0
        self._publish_waits: dict[int, Completion[bool]] = {}  # wait id -> its completion
        self._claim_waits: dict[int, Completion[SessionSnapshot | None]] = {}  # claim id -> completion
        self._deliver_pending_commit = False

    # ================================================================== lifecycle
    def bind(self, broker: BrokerApi, transport: PeerTransport, peer_id: str) -> None:
        """Attach the core and the transport; ``peer_id`` is this broker's address in the cluster."""
        if self.broker is not None:
            raise RuntimeError("ClusterEngine.bind() called twice")
        self.broker = broker
        self.transport = transport
        self.peer_id = peer_id
        seed = self.rng.getrandbits(64)
        self.node = OverlayNode(peer_id, rng=random.Random(seed), config=overlay_config_for(self.cluster))
        self.takeover = Takeover(peer_id, wait_s=self.cluster.takeover_wait_ms / 1000.0)
        self.retained_sync = RetainedSync(peer_id, request_timeout_s=RETAINED_SYNC_TIMEOUT_S)

    def start(self, contacts: list[str]) -> None:
        """Enter the overlay through ``contacts`` (none: found a new cluster)."""
        assert self.broker is not None and self.retained_sync is not None, "bind() first"
        self.stopped = False
        self._handle(api.Bootstrap(tuple(contacts)))
        self._handle(api.JoinTopic(CONTROL_CLASS, Role.SUBSCRIBER))
        self._handle(api.JoinTopic(CONTROL_CLASS, Role.PUBLISHER))
        for topic in self.interest.topics():  # subscriptions restored from the store before start
            self._handle(api.JoinTopic(topic, Role.SUBSCRIBER))
        self._next_sweep = self._now() + SWEEP_INTERVAL_S
        self._send_copy_request(self.retained_sync.start_copy(contacts, self._now()))
        self._arm_timer()
        self.broker.log_event(logging.INFO, "cluster_started", peer_id=self.peer_id, contacts=contacts)

    def stop(self) -> None:
        """Graceful leave (UNSUB/LEAVE every virtual node); nothing is delivered afterwards."""
        if self.stopped:
            return
        try:
            self._handle(api.Shutdown())
        except Exception:
            log.exception("cluster: overlay shutdown failed")
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_at = None
        self._finish_publish_waits(self.publish_acks.abort_all())
        if self.takeover is not None:
            self._finish_claims(self.takeover.abort_all())
        if self.retained_sync is not None:
            self.retained_sync.stop()
        self.ordering.clear_deadlines()

    # ================================================================== driving the overlay
    def _now(self) -> float:
        return self.scheduler.time()

    def _handle(self, event: Any) -> None:
        node = self.node
        if node is None or (self.stopped and not isinstance(event, api.Shutdown)):
            return
        try:
            actions = node.handle(event, self._now())
        except Exception:
            self._arm_timer()  # the overlay's deadline may have moved even if handling failed
            raise
        self._carry_out(actions)

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
                self._commit()
            self._send(action.dest, action.message)
        elif isinstance(action, api.Deliver):
            self._on_deliver(action)
        elif isinstance(action, api.PublishDone):
            self._finish_publish_waits(self.publish_acks.done(action.publication_id, action.complete))
        # SubscriberPresence: read back with node.subscriber_presence when publishing

    def _send(self, dest: str, item: object) -> None:
        assert self.transport is not None
        try:
            self.transport.send(dest, item)
        except (ValueError, RuntimeError) as exc:  # WireError is a ValueError
            log.error("cluster: cannot send %s to %s: %s", type(item).__name__, dest, exc)

    def _commit(self) -> None:
        broker = self.broker
        if broker is not None and broker.store_pending():
            broker.commit_now()

    def _arm_timer(self) -> None:
        """One timer at the earliest deadline of the overlay and the cores."""
        node = self.node
        if node is None or self.stopped:
            return
        # runs after every event (every forwarded message): a plain loop, no generator or list
        deadline = node.next_deadline()
        takeover = self.takeover
        retained_sync = self.retained_sync
        for candidate in (
            self.ordering.next_deadline(),
            self.publish_acks.next_deadline(),
            takeover.next_deadline() if takeover is not None else None,
            retained_sync.next_deadline() if retained_sync is not None else None,
            self._next_sweep,
        ):
            if candidate is not None and (deadline is None or candidate < deadline):
                deadline = candidate
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            self._timer = self.scheduler.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        if self.stopped:
            return
        now = self._now()
        node = self.node
        assert node is not None and self.takeover is not None and self.retained_sync is not None
        deadline = node.next_deadline()
        if deadline is not None and deadline <= now:
            self._handle(api.Tick())
        self._deliver(self.ordering.tick(now))
        self._finish_publish_waits(self.publish_acks.tick(now))
        self._finish_claims(self.takeover.tick(now))
        self._send_copy_request(self.retained_sync.tick(now))
        if self._next_sweep is not None and self._next_sweep <= now:
            self._sweep(now)
        self._after_event()

    def _after_event(self) -> None:
        self._arm_timer()
        if self.broker is not None:
            self.broker.after_batch()

    # ================================================================== transport events
    def on_receive(self, sender: str, item: object) -> None:
        """A message from broker ``sender`` (an overlay query, or a directed envelope)."""
        if self.stopped:
            return
        try:
            if isinstance(item, Envelope):
                self._on_envelope(item)
            else:
                self._handle(api.Receive(sender, item))
        except Exception:
            log.exception("cluster: failed to handle %s from %s", type(item).__name__, sender)
        self._after_event()

    def on_peer_down(self, peer: str) -> None:
        """The transport lost broker ``peer`` (refused, broken link)."""
        if self.stopped:
            return
        self._handle(api.PeerUnreachable(peer))
        assert self.transport is not None and self.takeover is not None
        self.transport.drop_queued(peer)  # the overlay re-sends what matters around it
        self._finish_claims(self.takeover.peer_down(peer))
        self._after_event()

    def _sweep(self, now: float) -> None:
        """Leave idle publisher classes; forget silent receive streams and old claims."""
        self._next_sweep = now + SWEEP_INTERVAL_S
        for cls, last in list(self._published.items()):
            if now - last > PUBLISHER_IDLE_S and cls != CONTROL_CLASS:
                del self._published[cls]
                self._handle(api.LeaveTopic(cls, Role.PUBLISHER))
        assert self.takeover is not None and self.broker is not None
        self.takeover.forget(self.broker.has_session)
        self.ordering.forget_idle(now, STREAM_IDLE_S)

    # ================================================================== ClusterPort: subscriptions
    def class_of(self, topic_filter: str) -> str:
        return self.interest.class_of(topic_filter)

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        self._apply_interest(self.interest.subscribe(client_id, topic_filter, share_group))

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        self._apply_interest(self.interest.unsubscribe(client_id, topic_filter, share_group))

    def _apply_interest(self, changes: list[Any]) -> None:
        if not changes or self.node is None or self.stopped:
            return  # before start: start() joins every counted topic
        for change in changes:
            event = api.JoinTopic if change.joined else api.LeaveTopic
            self._handle(event(change.topic, Role.SUBSCRIBER))
        self._arm_timer()

    def owns_share_group(self, group: str, topic_filter: str) -> bool:
        """The head of the group's level-0 run delivers (one delivery per group per cluster)."""
        node = self.node
        if node is None or self.stopped:
            return True
        key = make_key(share_topic(group, topic_filter), SUBSCRIBER, self.peer_id)
        if key not in node.vnodes:
            return True  # still joining: deliver rather than risk losing the message
        left, _right = node.level0_neighbors(key)
        return left is None or left[0] != key[0] or left[1] != key[1]

    # ================================================================== ClusterPort: publishing
    def on_publish(self, message: Message, from_client_id: str | None) -> Completion[bool] | None:
        if self.stopped or self.node is None or message.topic.startswith("$SYS"):
            return None
        node = self.node
        now = self._now()
        acks = self.publish_acks
        wait_id = acks.open() if message.qos else 0
        published = self._published
        for cls in topic_classes(message.topic, self.interest.class_levels):
            if cls not in published:
                self._handle(api.JoinTopic(cls, Role.PUBLISHER))
            published[cls] = now
            if node.subscriber_presence(cls) is False:
                continue  # the rendezvous point says nobody subscribes (exhaust data, §3.2)
            seq = self._send_seq.get(cls, 0) + 1
            self._send_seq[cls] = seq
            self._publication_id += 1
            pid = self._publication_id
            self.stats.forwarded += 1
            if wait_id:
                acks.add(wait_id, pid)  # before the overlay sees it: its PublishDone may come at once
            payload = ForwardedMessage(f"{self.peer_id}/{self.incarnation}", cls, seq, message)
            self._handle(api.Publish(cls, payload, pid))
        if message.retain:
            self._publish_retained(message)
        self._arm_timer()
        if not wait_id:
            return None
        self._finish_publish_waits(acks.close(wait_id, now))  # all done already: counted, no wait
        if not acks.is_open(wait_id):
            return None
        completion: Completion[bool] = Completion()
        self._publish_waits[wait_id] = completion
        return completion

    def _finish_publish_waits(self, finished: list[Finished]) -> None:
        for wait_id, complete in finished:
            self.stats.publish_done["true" if complete else "false"] += 1
            completion = self._publish_waits.pop(wait_id, None)
            if completion is not None:  # (none yet when it finished inside on_publish)
                # resolved from a scheduled call: its callbacks re-enter the core
                self.scheduler.call_soon(completion.set_result, complete)

    def _publish_retained(self, message: Message) -> None:
        assert self.retained_sync is not None
        wall_ms = int(self.scheduler.wall_time() * 1000)
        self._publish_control(self.retained_sync.local_write(message, wall_ms))

    def _publish_control(self, payload: object) -> None:
        self._publication_id += 1
        self._published[CONTROL_CLASS] = self._now()
        self._handle(api.Publish(CONTROL_CLASS, payload, self._publication_id))

    # ================================================================== receiving
    def _on_deliver(self, action: api.Deliver) -> None:
        payload = action.payload
        if action.publisher == self.peer_id:
            return  # our own publication: local subscribers already have it
        if isinstance(payload, ForwardedMessage):
            self._deliver(self.ordering.receive(payload, int(action.hops), self._now()))
        elif isinstance(payload, RetainedUpdate):
            self._apply_retained(payload)
        elif isinstance(payload, SessionClaim):
            self._on_claim(payload)

    def receive_forwarded(self, forwarded: ForwardedMessage, hops: int) -> None:
        """A forwarded message the overlay delivered here after ``hops`` hops: restore its
        stream's order (``ordering``), then deliver what is ready to local subscribers (what the
        overlay's ``Deliver`` action does; an entry point for tests and tools)."""
        self._deliver(self.ordering.receive(forwarded, hops, self._now()))
        self._after_event()

    def _deliver(self, ready: list[tuple[ForwardedMessage, int]]) -> None:
        broker = self.broker
        assert broker is not None
        stats = self.stats
        for forwarded, hops in ready:
            stats.received += 1
            stats.observe_hops(hops)
            matched = broker.deliver_remote(replace(forwarded.message), self._class_filter(forwarded.stream))
            if not matched:
                stats.wasted += 1  # the class reached us, no local filter matched the topic
            self._deliver_pending_commit = True

    def _class_filter(self, stream_class: str) -> Callable[[str], bool]:
        """A message received on class ``c`` goes to the local subscriptions of class ``c`` only."""
        class_of = self.interest.class_of
        return lambda topic_filter: class_of(topic_filter) == stream_class

    def _gap_skipped(self, key: StreamKey, missing: int) -> None:
        log.warning("cluster_gap_skipped stream=%s missing=%d", key, missing)

    def _apply_retained(self, update: RetainedUpdate) -> None:
        assert self.retained_sync is not None and self.broker is not None
        if not self.retained_sync.accept(update):
            return
        self.broker.set_retained(replace(update.message))
        self.stats.retained_updates_applied += 1
        self._deliver_pending_commit = True

    # ================================================================== takeover
    def before_attach(self, client_id: str, clean_start: bool) -> Completion[SessionSnapshot | None] | None:
        if self.stopped or self.node is None or self.transport is None or self.takeover is None:
            return None
        peers = self.transport.connected_peers()
        if not peers:
            return None
        wall_ns = int(self.scheduler.wall_time() * 1e9)
        claim, waits = self.takeover.claim(client_id, clean_start, peers, self._now(), wall_ns)
        self.stats.claims_sent += 1
        self._publish_control(claim)
        self._arm_timer()
        if not waits:
            return None  # nothing to wait for: the old connection is closed when the claim arrives
        completion: Completion[SessionSnapshot | None] = Completion()
        self._claim_waits[claim.claim_id] = completion
        return completion

    def _on_claim(self, claim: SessionClaim) -> None:
        assert self.takeover is not None and self.broker is not None
        broker = self.broker
        decision = self.takeover.on_claim(claim, connected_here=broker.client_connected(claim.client_id))
        if decision is None:
            return
        if isinstance(decision, Refuse):
            reply = ClaimReply(claim.claim_id, claim.client_id, False, None)
        else:
            assert isinstance(decision, HandOver)
            had, snapshot = broker.hand_over(claim.client_id, transfer=decision.transfer)
            if had:
                self.stats.sessions_handed_over += 1
                self._deliver_pending_commit = True
            reply = ClaimReply(claim.claim_id, claim.client_id, had, snapshot)
        self._send_envelope(claim.origin, claim.client_id, claim.claim_id, reply)

    def _finish_claims(self, finished: list[ClaimFinished]) -> None:
        for outcome in finished:
            completion = self._claim_waits.pop(outcome.claim_id, None)
            if completion is not None:
                self.scheduler.call_soon(completion.set_result, outcome.snapshot)

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        if self.takeover is not None and self.takeover.yields(client_id):
            # a newer CONNECT of this client id elsewhere was claimed while ours waited: it wins
            broker = self.broker
            assert broker is not None
            self.scheduler.call_soon(broker.kick, client_id, 0x8E)

    def on_client_disconnected(self, client_id: str) -> None:
        return None  # its claim record is dropped by the sweep once the session is gone

    # ================================================================== directed messages
    def _send_envelope(self, dest: str, to_client: str, ref: int, body: Any) -> None:
        self._commit()
        self._send(dest, Envelope(self.peer_id, dest, "", to_client, ref, DEFAULT_ENVELOPE_TTL, body))

    def _send_copy_request(self, request: CopyRequest | None) -> None:
        if request is not None:
            self._send_envelope(request.dest, "", 0, request.request)

    def _on_envelope(self, envelope: Envelope) -> None:
        if envelope.dest != self.peer_id:
            if envelope.ttl <= 1:
                log.warning("cluster_envelope_dropped ttl orig=%s dest=%s", envelope.orig, envelope.dest)
                return
            self._send(envelope.dest, replace(envelope, ttl=envelope.ttl - 1))
            return
        body = envelope.body
        assert self.takeover is not None and self.retained_sync is not None and self.broker is not None
        if isinstance(body, ClaimReply):
            outcome = self.takeover.on_reply(envelope.orig, body)  # orig: the answering broker
            if isinstance(outcome, LateSession):
                # came after the wait ended: keep its messages anyway
                self.stats.sessions_received += 1
                self.broker.receive_late_session(outcome.snapshot)
            elif outcome is not None:
                if outcome.snapshot is not None:
                    self.stats.sessions_received += 1
                self._finish_claims([outcome])
        elif isinstance(body, RetainedSyncRequest):
            for reply in self.retained_sync.copy_for(body.request_id, self.broker.retained_messages()):
                self._send_envelope(envelope.orig, "", body.request_id, reply)
        elif isinstance(body, RetainedSyncReply):
            for update in self.retained_sync.reply_received(body):
                self._apply_retained(update)

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
        transport = self.transport
        return {
            "peer_id": self.peer_id,
            "joined": joined,
            "connected_peers": sorted(transport.connected_peers()) if transport is not None else [],
            "subscribed_classes": self.interest.classes(),
            "published_classes": sorted(self._published),
            "presence": presence,
            "vnodes": vnodes,
        }

    def gauges(self) -> dict[str, int]:
        node = self.node
        transport = self.transport
        return {
            "peers_connected": len(transport.connected_peers()) if transport is not None else 0,
            "virtual_nodes": len(node.vnodes) if node is not None else 0,
            "subscribed_classes": len(self.interest.classes()),
            "published_classes": len(self._published),
            "held_messages": self.ordering.held_count(),
        }
