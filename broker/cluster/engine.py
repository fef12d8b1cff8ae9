"""The cluster engine: MQTT semantics across brokers on the overlay (issue #4; docs/cluster.md).

One object per broker composes the pure overlay core (``overlay.node.OverlayNode``, seed 003
SG-TBPS + FRT) with the cluster's pure protocol cores - ``interest`` (which classes to subscribe),
``interest_table`` (which classes the others subscribe), ``stream_sender`` / ``stream_receiver``
(the reliable streams of seed 004: SEQ, send log, ACK vectors, RET), ``subscribe_waits`` (SUBACKs
held until reachable), ``takeover`` (session claims) and ``retained_sync`` (last writer wins,
anti-entropy) - and the broker core, reached only through ``broker.core.ports.BrokerApi``. It is the
core's ``ClusterPort``.

It does no I/O: messages to other brokers go to a :class:`PeerTransport`, time and its single
timer come from the core's ``Scheduler`` (armed at the earliest ``next_deadline()`` of the overlay
and the cores - the aioquic / etcd-raft driver shape). The same engine runs in a broker process
(``broker.adapters.cluster_runtime`` over gRPC, on asyncio) and in the whole-cluster simulation
(``simulation``, on a seeded virtual network).

Mapping MQTT onto the overlay:

* **Topic classes** (``broker.cluster.classes``): the overlay routes on classes, each broker
  matches filters exactly; local subscriptions aggregate per class (SIONet, seed 000).
* **Forwarding with store and forward** (seed 004, ``stream_sender`` / ``stream_receiver``): a
  local publish is published on each of its classes whose rendezvous point reports subscribers,
  as a ``ForwardedMessage`` numbered per (this broker incarnation, class) and kept in the durable
  send log until the overlay completed it and every receiver broker acknowledged it; receivers
  restore the order, drop duplicates and ask for gaps (RET) instead of skipping them.
* **QoS 1/2**: the publisher's PUBACK/PUBREC leaves once the message is committed here, in the
  send log included: this broker then owns its delivery (docs/cluster.md).
* **Subscriptions and moved sessions**: a SUBACK, and the CONNACK of a session that moved here,
  wait until their classes' virtual nodes joined the overlay (``subscriptions_ready``).
* **Control class** ``!ctl``: every broker subscribes it; retained updates and session claims.
* **Session takeover**: a CONNECT publishes a claim; the holder answers with a directed
  ``Envelope`` carrying the session (seed 002 envelope).
* **Shared subscriptions**: the broker whose virtual node heads the group's run at level 0
  delivers the group's copy (one delivery per group cluster-wide).

Size: the composition root of the overlay node and six pure cores, and the ``ClusterPort`` the broker
core calls; each decision lives in a core, the reliable-stream plumbing in ``streams.py``, the
durable-state port in ``store_port.py``. What remains is the driver loop (one timer, actions carried
out in order) and the entry points, which read best side by side.
"""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster.causal_clock import CausalClock
from broker.cluster.class_stats import ClassCounters, SnapshotBuilder
from broker.cluster.classes import topic_classes
from broker.cluster.inbound import envelope_problem, payload_problem
from broker.cluster.interest import SHARE_PREFIX, Interest, share_topic
from broker.cluster.interest_table import InterestAnnouncer, InterestTable
from broker.cluster.messages import (
    DEFAULT_ENVELOPE_TTL,
    ClaimReply,
    ClassInterest,
    Envelope,
    ForwardedBatch,
    ForwardedMessage,
    RetainedSyncReply,
    RetainedSyncRequest,
    RetainedUpdate,
    SessionClaim,
    StreamPosition,
)
from broker.cluster.origin_checks import OriginChecks, Refusal
from broker.cluster.overlay_figures import OverlayFigures, peer_suspicion, published_classes, routing_entries
from broker.cluster.replies import ReplyHold
from broker.cluster.retained_sync import CopyRequest, RetainedSync
from broker.cluster.stats import RTT_SAMPLE_EVERY, ClusterStats
from broker.cluster.store_port import ClusterStore, MemoryClusterStore
from broker.cluster.stream_receiver import UNLIMITED, StreamReceiver
from broker.cluster.stream_sender import StreamSender
from broker.cluster.streams import CONTROL_CLASS, StreamsMixin
from broker.cluster.subscribe_waits import SubscribeWaits
from broker.cluster.takeover import Answer, ClaimFinished, HandOver, LateSession, NoSession, Refuse, Takeover
from broker.core.ports import Completion
from overlay import api
from overlay.api import Role
from overlay.config import OverlayConfig
from overlay.keys import ANCHOR_TOPIC, PUBLISHER, SUBSCRIBER, make_key
from overlay.messages import ACK, DONE, PING, PONG, PUB
from overlay.node import OverlayNode

if TYPE_CHECKING:
    from broker.config import ClusterConfig
    from broker.core.ports import BrokerApi, Scheduler, TimerHandle
    from broker.core.session import Message, SessionSnapshot

log = logging.getLogger("skipmq.cluster")

RETAINED_SYNC_TIMEOUT_S = 5.0  # then the next contact is asked for the retained store
RETAINED_ASK_MEMORY_S = 300.0  # a retained-store copy is taken from a broker asked this recently
PUBLISHER_IDLE_S = 600.0  # a publisher virtual node unused this long leaves its class
SWEEP_INTERVAL_S = 30.0
ROUTE_OVERLAY, ROUTE_DIRECT, ROUTE_HELD, ROUTE_SKIP = range(4)  # how a message goes out on a class
STREAM_IDLE_S = 900.0  # receive state of a silent (origin, class) stream is dropped
ACK_REFRESH_RETRANSMITS = 2  # receivers acknowledge recent streams again every 2 x retransmit_ms
PROBE_RETRANSMITS = 2  # peers reported down are contacted again every 2 x retransmit_ms ...
CATCH_UP_GIVE_UP_S = 120.0  # a moved session's catch-up that gets no answer is given up (counted)
# a catch-up whose backlog has not shrunk this long goes on without pacing (stream_receiver)
CATCH_UP_STALL_S = 10.0
INTEREST_REFRESH_RETRANSMITS = 5  # the classes we subscribe are announced again every 5 x retransmit_ms
DOWN_PEER_MEMORY_S = 600.0  # ... for this long
MAX_ROUND_TRIPS_TIMED = 1024  # PINGs / sampled PUBs awaiting their answer (peer_rtt_seconds)
RTT_SAMPLE_MASK = RTT_SAMPLE_EVERY - 1
# fast path (issue #11): a class whose publications reach no other broker (or nobody) is re-checked
# through the full path this often (which also lets the overlay's EEXP at publish fill the
# publisher's table)
QUIET_RECHECK_S = 1.0
# the cached reach of a class (``_quiet``): other brokers (the full path); no other broker, while
# some known peer is down or its link is not up (QoS >= 1 into the durable send log, the PUBACK
# waits for its commit); no other broker, every known peer connected (kept in memory only); nobody
# (kept for the presence grace); nobody else, and no other broker ever talked to this one, which
# founded its overlay alone (nobody elsewhere can have a SUBACK yet: nothing kept, whoever
# subscribes here)
QUIET_NOT, QUIET_LOCAL, QUIET_LOCAL_CONNECTED, QUIET_NOBODY, QUIET_NOBODY_ALONE = range(5)
TOPIC_CACHE_LIMIT = 4096  # topics whose classes are cached (cleared when full)

__all__ = ["CONTROL_CLASS", "SHARE_PREFIX", "ClusterEngine", "PeerTransport", "overlay_config_for"]


class PeerTransport(Protocol):
    """Messages to other brokers (gRPC streams in a broker, the virtual network in a simulation).
    Best effort and FIFO per peer; ``on_receive`` / ``on_peer_down`` of the engine are its inputs."""

    def send(self, peer: str, item: object) -> None: ...

    def connected_peers(self) -> frozenset[str]: ...

    def drop_queued(self, peer: str) -> int: ...


def _local_only(topic_filter: str) -> bool:
    """A ``$SYS`` filter: its topics are each broker's own and never forwarded, so it joins no
    class in the overlay and its SUBACK waits for nothing."""
    return topic_filter.startswith("$SYS")


def overlay_config_for(cluster: ClusterConfig) -> OverlayConfig:
    """The overlay tunables a broker uses (faster crash detection than the simulator's defaults)."""
    return OverlayConfig(
        table_size=cluster.table_size,
        ping_interval_s=cluster.ping_interval_ms / 1000.0,
        failure_timeout_s=cluster.failure_timeout_ms / 1000.0,
        # a crashed or departed broker is not re-learned from other brokers' stale routing entries
        # for this long; one that comes back is taken back as soon as it sends us anything
        dead_peer_memory_s=600.0,
        # a join whose search was lost is retried soon: a SUBACK waits for its class to be joined
        search_timeout_s=1.0,
        # brokers started together: a seed founds after two half-second rounds as the lowest
        # reachable seed (overlay.formation); the others join it in the next round
        formation_round_s=0.5,
        # end-to-end completion: the send log frees an entry, or publishes it again, on PublishDone
        publish_done_enabled=True,
        publish_done_timeout_s=max(0.5, cluster.publish_ack_wait_ms / 1000.0),
    )


class ClusterEngine(StreamsMixin):
    """See the module docstring. Construct, pass as the core's cluster port, ``bind`` the core and
    a transport, ``start``; ``stop`` before the core closes."""

    def __init__(
        self, cluster: ClusterConfig, scheduler: Scheduler, *, rng: random.Random | None = None
    ) -> None:
        self.cluster = cluster
        self.scheduler = scheduler
        self.rng = rng if rng is not None else random.Random()
        self.stats = ClusterStats()
        self.class_counters = ClassCounters()  # per-class figures of the $SYS snapshots (issue #13)
        self._snapshots: SnapshotBuilder | None = None
        self.incarnation = f"{self.rng.getrandbits(48):012x}"
        self.interest = Interest(cluster.class_levels)
        self.interest_table = InterestTable()  # which other brokers subscribe which classes
        self.retransmit_s = retransmit_s = cluster.retransmit_ms / 1000.0
        self.announcer = InterestAnnouncer(retransmit_s)  # our classes, until each peer acknowledges
        self.receiver = StreamReceiver(
            ret_delay_s=cluster.reorder_hold_ms / 1000.0,
            retransmit_s=retransmit_s,
            ack_delay_s=cluster.ack_delay_ms / 1000.0,
            refresh_s=ACK_REFRESH_RETRANSMITS * retransmit_s,
            stats=self.stats,
            stall_s=CATCH_UP_STALL_S,
        )
        self.sender: StreamSender | None = None
        groups = [item.strip() for item in cluster.causal_groups.split(",") if item.strip()]
        self.causal: CausalClock | None = CausalClock(groups) if groups else None
        self.subscribe_waits = SubscribeWaits(cluster.subscribe_wait_ms / 1000.0)
        self.store: ClusterStore = MemoryClusterStore()
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
        self._publication_id = 0
        self._ready_waits: dict[int, Completion[bool]] = {}  # subscribe wait id -> its completion
        self._claim_waits: dict[int, Completion[SessionSnapshot | None]] = {}  # claim id -> completion
        # sessions moved here: where their old broker stood in their classes' streams
        self._moved_positions: dict[str, tuple[StreamPosition, ...]] = {}
        # peers reported down -> since when: probed, and claims and undelivered messages go to them
        # when they are back (a heal, a restart)
        self._down_peers: dict[str, float] = {}
        self._next_probe: float | None = None
        self._next_interest: float | None = None
        self._next_catch_up: float | None = None
        self._heard_from: set[str] = set()  # peers this incarnation has heard from
        # peers that left gracefully (their ``ClassInterest.leaving``): nothing is sent to them -
        # no dial to a departed address - until they talk to us again; they stay in
        # ``_down_peers`` meanwhile, so the send log keeps what they miss (a rolling restart)
        self._departed: set[str] = set()
        # (peer, PING nonce or PUB ack id) -> when sent, for skipmq_cluster_peer_rtt_seconds
        self._round_trips: dict[tuple[str, int], float] = {}
        # peer -> {request id: when} of our RetainedSyncRequests (a reply must answer one)
        self._retained_asked: dict[str, dict[int, float]] = {}
        # (origin, class) -> [(next seq, end seq, client)]: messages a moved session still needs
        self._catch_ups: dict[tuple[str, str], list[list[Any]]] = {}
        # (origin, class) -> [(next seq, client, since)]: moved sessions waiting for a stream this
        # broker receives for other subscribers but has not heard from yet
        self._awaiting_start: dict[tuple[str, str], list[tuple[int, str, float]]] = {}
        # ((origin, class), client) -> messages held for a moved session until its catch-up on
        # that stream is done
        self._held_for: dict[tuple[tuple[str, str], str], list[ForwardedMessage]] = {}
        self._deliver_pending_commit = False
        # the overlay's ACK and DONE, held per peer up to ack_delay_ms and sent with the stream
        # acknowledgements (``replies``, issue #11); None: each goes out at once
        ack_delay_s = cluster.ack_delay_ms / 1000.0
        self._replies: ReplyHold | None = ReplyHold(ack_delay_s) if ack_delay_s > 0 else None
        # fast path (issue #11): topic -> its classes, and class -> (until when, QUIET_*): a
        # publication on it reaches no other broker (``_reaches_only_self``), nobody at all
        # (``ROUTE_SKIP``), or other brokers (the full path, without checking again); emptied by
        # every event that could change that (``_handle``, ``_after_event``)
        self._classes_of: dict[str, list[str]] = {}
        self._quiet: dict[str, tuple[float, int]] = {}
        self._founded_alone = False  # started without contacts other than itself (``start``)
        # batching (issue #11, ``StreamsMixin._publish_forwarded``)
        self._outbox: dict[tuple[str, str], list[ForwardedMessage]] = {}
        self._outbox_armed = False
        self._batch_parts: dict[int, list[int]] = {}
        self._route_memos: dict[str, tuple[Any, dict[str, list[Any]]]] | None = None
        # origin proofs (docs/security.md): what we originate is signed, what others originated is
        # checked; set by the runtime before ``start`` (None: off, e.g. with cluster.insecure)
        self.origin_checks: OriginChecks | None = None
        self._receiving_from = ""  # the peer whose item is being handled (who relayed a payload)

    # ================================================================== lifecycle
    def bind(
        self, broker: BrokerApi, transport: PeerTransport, peer_id: str, store: ClusterStore | None = None
    ) -> None:
        """Attach the core, the transport and the cluster's durable state; ``peer_id`` is this
        broker's address in the cluster."""
        if self.broker is not None:
            raise RuntimeError("ClusterEngine.bind() called twice")
        self.broker = broker
        self.transport = transport
        self.peer_id = peer_id
        if store is not None:
            self.store = store
        cluster = self.cluster
        self.sender = StreamSender(
            f"{peer_id}/{self.incarnation}",
            retransmit_s=self.retransmit_s,
            retention_s=float(cluster.send_log_retention_s),
            presence_grace_s=cluster.presence_grace_ms / 1000.0,
            min_retention_s=cluster.send_log_min_retention_ms / 1000.0,
            receivers_of=self.interest_table.peers_of,
            absent_since=self._absent_since,
        )
        self.sender.confirm_seconds = self.stats.publish_confirm_seconds
        self.receiver.budget = self._room_for  # the flow condition of catch-up (stream_receiver)
        if self.origin_checks is not None:
            self.origin_checks.stats = self.stats  # (its counters are the engine's)
        self.receiver.set_causal(peer_id, self.interest.subscribes, cluster.causal_wait_ms / 1000.0)
        seed = self.rng.getrandbits(64)
        self.node = OverlayNode(peer_id, rng=random.Random(seed), config=overlay_config_for(self.cluster))
        self.takeover = Takeover(
            peer_id,
            wait_s=self.cluster.takeover_wait_ms / 1000.0,
            repeat_s=self.retransmit_s,
        )
        self.retained_sync = RetainedSync(
            peer_id,
            request_timeout_s=RETAINED_SYNC_TIMEOUT_S,
            anti_entropy_s=self.cluster.retained_anti_entropy_ms / 1000.0,
        )

    def start(self, contacts: list[str]) -> None:
        """Enter the overlay through ``contacts`` (none: found a new cluster). Listing this broker
        itself among them makes it a seed: with its fellow seeds it founds the overlay when none
        is reachable (the lowest reachable seed founds, overlay.formation)."""
        assert self.broker is not None and self.retained_sync is not None, "bind() first"
        assert self.sender is not None
        self.stopped = False
        self._founded_alone = all(peer == self.peer_id for peer in contacts)
        now = self._now()
        # resume the streams a previous incarnation left: what it had not delivered everywhere is
        # published again, and our positions tell the senders what we missed while down
        logged = self.store.load_log()
        positions = self.store.load_positions()
        self.sender.restore(logged, self.store.load_receivers(), now)
        assert self.takeover is not None
        self.takeover.restore_handed_over(self.store.load_handed_over(), now)
        # claims of ours whose session had not arrived when this broker went down: asked again
        # (``recover``) of every broker that talks to us (``_peer_back``)
        self.takeover.restore_pending(self.store.load_pending_claims(), now)
        self.receiver.restore(positions, now)
        self._restore_catch_ups(now)  # moved sessions caught up when this broker went down
        # our announcements of interest are ordered across restarts: a durable epoch, one more
        # at each start (an older incarnation's announcement still in flight is then ignored);
        # at least the wall clock's milliseconds, for a broker without persistence (its store
        # starts from 0 every time)
        epoch = max(self.store.load_interest_epoch() + 1, int(self.scheduler.wall_time() * 1000))
        self.store.set_interest_epoch(epoch)
        self.announcer.begin(epoch)
        if self.causal is not None:
            self.causal.restore([*positions, *(((f.origin, f.stream), f.seq + 1) for f in logged)])
        self._handle(api.Bootstrap(tuple(contacts)))
        self._handle(api.JoinTopic(CONTROL_CLASS, Role.SUBSCRIBER))
        self._handle(api.JoinTopic(CONTROL_CLASS, Role.PUBLISHER))
        for topic in self.interest.topics():  # subscriptions restored from the store before start
            self._handle(api.JoinTopic(topic, Role.SUBSCRIBER))
        self._next_sweep = self._now() + SWEEP_INTERVAL_S
        self._next_interest = self._now() + self.retransmit_s * INTEREST_REFRESH_RETRANSMITS
        retained_sync = self.retained_sync
        retained_sync.restore(
            self.store.load_retained_versions(),
            [m.topic for m in self.broker.retained_messages()],
            self.store.load_retained_proofs(),
        )
        self._persist_retained_versions()
        others = [peer for peer in contacts if peer != self.peer_id]
        self._send_copy_request(retained_sync.start_copy(others, now))
        self.retained_sync.anti_entropy((), now)  # arms the first round
        self._arm_timer()
        self.broker.log_event(logging.INFO, "cluster_started", peer_id=self.peer_id, contacts=contacts)

    def stop(self) -> None:
        """Graceful leave (UNSUB/LEAVE every virtual node); nothing is delivered afterwards."""
        if self.stopped:
            return
        self._flush_outbox()
        self._send_held_replies(self._replies.take_all() if self._replies is not None else [])
        try:
            self._handle(api.Shutdown())
        except Exception:
            log.exception("cluster: overlay shutdown failed")
        if self.transport is not None:  # (after the overlay's LEAVEs: the last thing they get)
            # the others stop contacting us until we talk again
            for peer in sorted(self.transport.connected_peers()):
                self._send_envelope(peer, "", 0, ClassInterest((), leaving=True))
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_at = None
        self._finish_ready_waits(self.subscribe_waits.abort_all())
        if self.takeover is not None:
            self._finish_claims(self.takeover.abort_all())
        if self.retained_sync is not None:
            self.retained_sync.stop()
        self.receiver.clear_deadlines()

    # ================================================================== driving the overlay
    def _now(self) -> float:
        return self.scheduler.time()

    def _handle(self, event: Any) -> None:
        node = self.node
        if node is None or (self.stopped and not isinstance(event, api.Shutdown)):
            return
        if type(event) is api.Publish:
            checks = self.origin_checks
            if checks is not None:  # our publication carries our origin proof
                event = api.Publish(event.topic, checks.sign_payload(event.payload), event.publication_id)
        elif self._quiet:
            # a publication only sends (its own subscriber learns nothing new); anything else may
            # make another broker's subscriber known
            self._quiet.clear()
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
            message = action.message
            if self._deliver_pending_commit and not self._held_back(message):
                # a Deliver before this Send must be durable first: the Send may be the DONE
                # that lets the publisher's broker acknowledge its client (a held DONE waits for
                # the group commit at the end of this loop iteration: ``_send_held_replies``)
                self._deliver_pending_commit = False
                self._commit()
            self._send(action.dest, message)
        elif isinstance(action, api.Deliver):
            self._on_deliver(action)
        elif isinstance(action, api.PublishDone):
            self.stats.publish_done["true" if action.complete else "false"] += 1
            self._publication_done(action.publication_id, action.complete, action.reached)
        elif isinstance(action, api.SubscriberPresence) and action.present and self.sender is not None:
            # a subscription elsewhere just became reachable: what was kept goes out first
            messages, held = self.sender.presence_on(action.topic, self._now())
            for forwarded in held:
                self._publish_forwarded(forwarded)
            for message, deps in messages:
                if deps is None:
                    self._forward(action.topic, message)
                else:  # a message of a causal group, with the dependencies it had when published
                    self._forward_causal(action.topic, message, deps)

    def _held_back(self, item: object) -> bool:
        """``item`` is a reply that waits in ``_replies``: an overlay ACK or DONE, but the ACK of a
        PUB whose round trip is timed (``RTT_SAMPLE_MASK``), which goes at once."""
        if self._replies is None:
            return False
        kind = type(item)
        if kind is DONE:
            return True
        return kind is ACK and bool(item.ack_id & RTT_SAMPLE_MASK)  # type: ignore[attr-defined]

    def _send(self, dest: str, item: object) -> None:
        kind = type(item)
        self.stats.overlay_sent[kind] += 1
        # round trips to ``dest`` (skipmq_cluster_peer_rtt_seconds), timed when the answer comes:
        # every failure-detector PING (its PONG), one PUB delegation in RTT_SAMPLE_EVERY (its
        # per-hop ACK, which the receiver sends at once; by ack id)
        if kind is PUB:
            ack_id = item.ack_id  # type: ignore[attr-defined]
            if ack_id and not ack_id & RTT_SAMPLE_MASK:
                self._time_round_trip(dest, ack_id)
        elif kind is PING:
            self._time_round_trip(dest, item.nonce)  # type: ignore[attr-defined]
        replies = self._replies
        if replies is not None:
            if self._held_back(item):
                replies.hold(dest, item, self._now())
                return
            if replies.holds_for(dest):  # they go first, in this frame
                self._send_held_replies([(dest, replies.take(dest))])
        self._transmit(dest, item)

    def _send_held_replies(self, held: list[tuple[str, list[object]]]) -> None:
        """Replies that waited in ``_replies``: a DONE among them may answer a Deliver whose
        writes are not committed yet (the driver promise of overlay/api.py)."""
        if not held:
            return
        self._commit()
        for dest, items in held:
            for item in items:
                self._transmit(dest, item)

    def _transmit(self, dest: str, item: object) -> None:
        assert self.transport is not None
        if self._departed and dest in self._departed:
            return  # it left the cluster: no dial until it talks to us again
        try:
            self.transport.send(dest, item)
        except (ValueError, RuntimeError) as exc:  # WireError is a ValueError
            log.error("cluster: cannot send %s to %s: %s", type(item).__name__, dest, exc)

    def _time_round_trip(self, dest: str, request_id: int) -> None:
        round_trips = self._round_trips
        if len(round_trips) > MAX_ROUND_TRIPS_TIMED:  # requests a peer never answered
            round_trips.clear()
        round_trips[(dest, request_id)] = self._now()

    def _round_trip_answered(self, peer: str, request_id: int) -> None:
        sent_at = self._round_trips.pop((peer, request_id), None)
        if sent_at is not None:
            self.stats.peer_rtt_seconds.observe(self._now() - sent_at)

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
        sender = self.sender
        for candidate in (
            self._replies.next_deadline() if self._replies is not None else None,
            self.receiver.next_deadline(),
            sender.next_deadline() if sender is not None else None,
            self.subscribe_waits.next_deadline(),
            takeover.next_deadline() if takeover is not None else None,
            retained_sync.next_deadline() if retained_sync is not None else None,
            self._next_sweep,
            self._next_probe,
            self._next_interest,
            self._next_catch_up,
            self.announcer.next_deadline(),
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
        assert self.sender is not None
        if self._replies is not None:
            self._send_held_replies(self._replies.due(now))
        self._deliver(self.receiver.poll(now))  # catch-ups that waited for room
        self._receiver_actions(self.receiver.tick(now))
        if self.receiver.blocked_count():
            self._deliver(self.receiver.give_up_waits(now))
        self._sender_actions(self.sender.tick(now))
        self._finish_ready_waits(self.subscribe_waits.tick(now))
        self._finish_claims(self.takeover.tick(now))
        for peer, claim in self.takeover.repeats(now):
            self._send_envelope(peer, claim.client_id, claim.claim_id, claim)
        self._send_copy_request(self.retained_sync.tick(now))
        assert self.transport is not None
        self._send_copy_request(self.retained_sync.anti_entropy(self.transport.connected_peers(), now))
        if self._next_sweep is not None and self._next_sweep <= now:
            self._sweep(now)
        if self._next_probe is not None and self._next_probe <= now:
            self._probe_down_peers(now)
        if self._next_catch_up is not None and self._next_catch_up <= now:
            self._next_catch_up = self._repeat_catch_ups(now, self.retransmit_s, CATCH_UP_GIVE_UP_S)
        for peer, ref, interest in self.announcer.tick(now):
            if peer in self._down_peers:
                self.announcer.forget(peer)  # it gets the whole list when it is back
            else:
                self._send_envelope(peer, "", ref, interest)
        if self._next_interest is not None and self._next_interest <= now:
            # announcements are not acknowledged: repeated (as additions: a sender that missed one
            # registers us from its next message on)
            self._next_interest = now + self.retransmit_s * INTEREST_REFRESH_RETRANSMITS
            classes = tuple(self.interest.classes())
            if classes:
                self._announce_interest(ClassInterest(classes))
        self._after_event()

    def _after_event(self) -> None:
        if self._quiet:
            self._quiet.clear()  # receivers and interest may have changed
        if self._catch_ups and self._next_catch_up is None:
            self._next_catch_up = self._now() + self.retransmit_s
        if self.subscribe_waits.waiting():
            self._finish_ready_waits(self.subscribe_waits.poll(self._topic_ready))
        self._arm_timer()
        if self.broker is not None:
            self.broker.after_batch()

    # ================================================================== transport events
    def on_receive(self, sender: str, item: object) -> None:
        """A message from broker ``sender`` (an overlay query, or a directed envelope)."""
        if self.stopped:
            return
        if sender not in self._heard_from or sender in self._down_peers:
            self._departed.discard(sender)
            self._heard_from.add(sender)
            self._peer_back(sender)
        kind = type(item)
        self.stats.overlay_received[kind] += 1
        if kind is ACK:
            if not item.ack_id & RTT_SAMPLE_MASK:  # type: ignore[attr-defined]
                self._round_trip_answered(sender, item.ack_id)  # type: ignore[attr-defined]
        elif kind is PONG:
            self._round_trip_answered(sender, item.nonce)  # type: ignore[attr-defined]
        self._receiving_from = sender
        try:
            if isinstance(item, Envelope):
                problem = envelope_problem(sender, self.peer_id, item)
                if problem is None and isinstance(item.body, RetainedSyncReply):
                    problem = self._unasked_retained_reply(sender, item.body.request_id)
                checks = self.origin_checks
                if problem is not None:
                    self._reject(sender, item.body, problem)
                elif checks is None or not self._origin_refused(checks.check_envelope(item, self._wall_s())):
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
        self._down_peers.setdefault(peer, self._now())
        if self._next_probe is None:
            self._next_probe = self._now() + self.retransmit_s * PROBE_RETRANSMITS
        assert self.transport is not None and self.takeover is not None
        self.transport.drop_queued(peer)  # the overlay re-sends what matters around it
        self._finish_claims(self.takeover.peer_down(peer))
        self.takeover.claimant_down(peer, self._now())
        self.announcer.forget(peer)
        self._after_event()

    def _room_for(self, key: tuple[str, str]) -> int:
        """How many more messages of stream ``key`` the local sessions of its class take now: the
        least room below half its queue limit over those sessions (the other half stays free for
        live messages of other streams meanwhile); seed 004's minBUF of the flow condition."""
        broker = self.broker
        if broker is None:
            return UNLIMITED
        room = UNLIMITED
        for client_id in self.interest.clients_of(key[1]):
            depth = broker.queue_depth(client_id)
            if depth is not None:
                queued, limit = depth
                room = min(room, max(1, limit // 2) - queued)
        return room

    def _peer_left(self, peer: str) -> None:
        """``peer`` stops gracefully (its announcement ``leaving``): absent, as if down - the send
        log keeps what it misses, its claims are not waited for - but not contacted (no probes, no
        resends, no dials to its address) until it talks to us again (``on_receive``)."""
        if peer == self.peer_id:
            return
        self._departed.add(peer)
        self._heard_from.discard(peer)
        self._down_peers.setdefault(peer, self._now())
        assert self.transport is not None and self.takeover is not None
        self.transport.drop_queued(peer)
        self._finish_claims(self.takeover.peer_down(peer))
        self.announcer.forget(peer)
        log.info("cluster_peer_left %s: not contacted until it talks again", peer)

    def _absent_since(self) -> float | None:
        """Since when some peer is reported down (the send log keeps what was sent since for it)."""
        down = self._down_peers
        return min(down.values()) if down else None

    def _peer_back(self, peer: str) -> None:
        """Broker ``peer`` talks to us for the first time, or again after it was reported down (it
        started or restarted - perhaps holding stored sessions of clients now connected here - or
        a partition healed): the claims of our connected clients are repeated to it, so each client
        id ends with one owner, the newest connection (an older session and what was queued for it
        move here)."""
        self._down_peers.pop(peer, None)
        takeover = self.takeover
        broker = self.broker
        sender = self.sender
        retained_sync = self.retained_sync
        if takeover is None or broker is None or sender is None or retained_sync is None:
            return
        claims = takeover.claims_to_repeat(broker.client_connected) + takeover.recovery_claims()
        for claim in claims:
            self._send_envelope(peer, claim.client_id, claim.claim_id, claim)
        takeover.repeat_to(peer, claims, self._now())  # until answered: a repeat may be lost
        full = ClassInterest(tuple(self.interest.classes()), (), True)
        for dest, ref, interest in self.announcer.announce(full, [peer], self._now()):
            self._send_envelope(dest, "", ref, interest)
        self._sender_actions(sender.logged_for(peer))
        # compare retained stores at once; and the answer tells ``peer`` we are back too
        self._send_envelope(peer, "", 0, RetainedSyncRequest(0, retained_sync.digest))

    def _probe_down_peers(self, now: float) -> None:
        """Peers reported down are contacted again every few retransmit periods (for at most
        ``DOWN_PEER_MEMORY_S``): the two sides of a healed partition find each other even when
        their overlay halves do not (a broker that restarted during the split joined only its half)."""
        self._next_probe = None
        assert self.transport is not None and self.retained_sync is not None
        connected = self.transport.connected_peers()
        for peer, since in list(self._down_peers.items()):
            if now - since > DOWN_PEER_MEMORY_S:
                del self._down_peers[peer]
            elif peer not in connected:
                self._send_envelope(peer, "", 0, RetainedSyncRequest(0, self.retained_sync.digest))
        if self._down_peers:
            self._next_probe = now + self.retransmit_s * PROBE_RETRANSMITS

    def _sweep(self, now: float) -> None:
        """Leave idle publisher classes; forget silent receive streams and old claims."""
        self._next_sweep = now + SWEEP_INTERVAL_S
        for cls, last in list(self._published.items()):
            if now - last > PUBLISHER_IDLE_S and cls != CONTROL_CLASS:
                del self._published[cls]
                self._handle(api.LeaveTopic(cls, Role.PUBLISHER))
        assert self.takeover is not None and self.broker is not None
        self.takeover.forget(self.broker.has_session)
        for claim_id, claimant in self.takeover.forget_handed_over(now):
            self.store.set_handed_over(claim_id, claimant, None)
        for claim_id in self.takeover.expire_pending(now):
            self.store.set_pending_claim(claim_id, None)
        expired: list[str] = []
        for key, waiting in list(self._awaiting_start.items()):  # streams that never came
            expired += [entry[1] for entry in waiting if now - entry[2] > CATCH_UP_GIVE_UP_S]
            waiting[:] = [entry for entry in waiting if now - entry[2] <= CATCH_UP_GIVE_UP_S]
            if not waiting:
                del self._awaiting_start[key]
        self._persist_catch_ups(expired)
        forgotten = self.receiver.forget_idle(now, STREAM_IDLE_S)
        if self.causal is not None:
            self.causal.forget(forgotten)
        self._persist_positions()

    # ================================================================== ClusterPort: subscriptions
    def class_of(self, topic_filter: str) -> str:
        return self.interest.class_of(topic_filter)

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        if _local_only(topic_filter):
            return
        self._apply_interest(self.interest.subscribe(client_id, topic_filter, share_group))

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        if _local_only(topic_filter):
            return
        self._apply_interest(self.interest.unsubscribe(client_id, topic_filter, share_group))

    def _apply_interest(self, changes: list[Any]) -> None:
        if not changes or self.node is None or self.stopped:
            return  # before start: start() joins every counted topic
        subscribed: list[str] = []
        unsubscribed: list[str] = []
        for change in changes:
            event = api.JoinTopic if change.joined else api.LeaveTopic
            self._handle(event(change.topic, Role.SUBSCRIBER))
            if not change.topic.startswith(SHARE_PREFIX):
                (subscribed if change.joined else unsubscribed).append(change.topic)
            if not change.joined:
                # no subscriber of the class here any more: its senders stop keeping messages for us
                for positions in self.receiver.leave_class(change.topic):
                    self._send_stream(positions.peer, positions.ack)
                self._persist_positions()
        if subscribed or unsubscribed:
            self._announce_interest(ClassInterest(tuple(subscribed), tuple(unsubscribed)))
        self._arm_timer()

    def _known_peers(self) -> set[str]:
        transport = self.transport
        peers = set(self._heard_from) | set(self._down_peers)
        if transport is not None:
            peers |= transport.connected_peers()
        peers.discard(self.peer_id)
        return peers

    def _announce_interest(self, interest: ClassInterest) -> None:
        """Tell every broker we know which classes we (no longer) subscribe (filter propagation);
        repeated to each reachable one until it acknowledges (``InterestAnnouncer``). A peer reported
        down gets the whole list when it is back."""
        peers = sorted(self._known_peers())
        interest = self.announcer.stamp(interest)  # one version, whoever gets it
        for peer in peers:
            if peer in self._down_peers:
                self._send_envelope(peer, "", 0, interest)
        reachable = [peer for peer in peers if peer not in self._down_peers]
        for peer, ref, body in self.announcer.announce(interest, reachable, self._now()):
            self._send_envelope(peer, "", ref, body)

    def _on_interest(self, peer: str, interest: ClassInterest) -> None:
        sender = self.sender
        assert sender is not None
        if self.interest_table.stale(peer, interest):
            return  # older than a whole list applied (InterestTable): overtaken, changes nothing
        added, removed = self.interest_table.apply(peer, interest)
        now = self._now()
        # a whole list (a broker that comes back, or that a session moved to) registers every
        # class it names, that later news did not drop, from the log's start: a registration
        # still unconfirmed is lowered to it
        if interest.full:
            added = sorted(set(interest.subscribed) & self.interest_table.classes_of(peer))
        for cls in added:
            self._sender_actions(sender.register(peer, cls, now, from_log_start=interest.full))
        for cls in removed:
            self._sender_actions(sender.unregister(peer, cls, now))

    def subscriptions_ready(self, topic_filters: list[tuple[str, str | None]]) -> Completion[bool] | None:
        """A completion done once the classes of ``topic_filters`` ((filter, share group) pairs)
        are joined in the overlay (at most ``cluster.subscribe_wait_ms``), or None when they are."""
        if self.stopped or self.node is None:
            return None
        topics = set()
        for topic_filter, group in topic_filters:
            if _local_only(topic_filter):
                continue
            topics.add(self.interest.class_of(topic_filter))
            if group is not None:
                topics.add(share_topic(group, topic_filter))
        pending = [topic for topic in sorted(topics) if not self._topic_ready(topic)]
        if not pending:
            return None
        wait_id = self.subscribe_waits.add(pending, self._now())
        completion: Completion[bool] = Completion()
        self._ready_waits[wait_id] = completion
        self._arm_timer()
        return completion

    def _topic_ready(self, topic: str) -> bool:
        node = self.node
        if node is None:
            return True
        key = make_key(topic, SUBSCRIBER, self.peer_id)
        return key in node.vnodes and key not in node.pending

    def _finish_ready_waits(self, finished: list[tuple[int, bool]]) -> None:
        for wait_id, ready in finished:
            if not ready:
                self.stats.subscribe_waits_timed_out += 1
            completion = self._ready_waits.pop(wait_id, None)
            if completion is not None:
                self.scheduler.call_soon(completion.set_result, ready)

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
        """Forward ``message`` on each of its classes; the PUBACK waits only for the local commit
        (the send log joins it), never for other brokers."""
        if self.stopped or self.node is None or message.topic.startswith("$SYS"):
            return None
        sender = self.sender
        assert sender is not None
        now = self._now()
        topic = message.topic
        classes = self._classes_of.get(topic)
        if classes is None:
            if len(self._classes_of) >= TOPIC_CACHE_LIMIT:
                self._classes_of.clear()
            classes = self._classes_of[topic] = topic_classes(topic, self.interest.class_levels)
        self.class_counters.published(classes[0])
        causal = self.causal
        groups = causal.groups_of(topic) if causal is not None else ()
        if groups:
            self._publish_causal(message, classes, groups, now)
            slow = True
        else:
            slow = message.retain
            deadline = sender.next_deadline()
            quiet = self._quiet
            for cls in classes:
                state = quiet.get(cls)
                if state is not None and now < state[0]:
                    if state[1] == QUIET_NOBODY_ALONE:
                        continue
                    if state[1] == QUIET_NOBODY:  # kept for the presence grace only
                        sender.skip(cls, message, now)
                        continue
                    if state[1] == QUIET_LOCAL_CONNECTED:
                        # nobody elsewhere, every known broker connected: the local deliveries are
                        # all; QoS >= 1 is kept in the send log in memory (a partition we have not
                        # noticed yet heals: ``logged_for``), not written to the store - the PUBACK
                        # needs no commit, as on a single broker (docs/cluster.md "Fast path")
                        if message.qos:
                            sender.present(cls, now)
                            self._forward(cls, message, overlay=False, stored=False)
                        continue
                    if state[1] == QUIET_LOCAL:
                        # nobody elsewhere that we can hear: QoS >= 1 goes into the durable send
                        # log (its commit holds the PUBACK), for a receiver broker cut off before
                        # we learned of it that is back after a crash of ours
                        if message.qos:
                            sender.present(cls, now)
                            self._forward(cls, message, overlay=False)
                        continue
                    self._send_on_class(cls, message, self._route_of(cls, message, now), now)
                    slow = True
                    continue
                slow = True
                route = self._route_of(cls, message, now)
                self._send_on_class(cls, message, route, now)
                if route == ROUTE_OVERLAY:
                    if not self._reaches_only_self(cls, now):
                        reach = QUIET_NOT
                    elif self._alone():
                        # only our own subscribers, and no other broker ever talked to us: none
                        # can have a SUBACK for this class yet (``_alone``), so there is nothing
                        # to keep for anybody - a one-broker cluster's QoS 1 costs what a single
                        # broker's does (issue #11)
                        reach = QUIET_NOBODY_ALONE
                    elif self.cluster.local_qos1_in_memory and self._every_peer_connected():
                        reach = QUIET_LOCAL_CONNECTED
                    else:
                        reach = QUIET_LOCAL
                    quiet[cls] = (now + QUIET_RECHECK_S, reach)
                elif route == ROUTE_SKIP and not sender.recently_present(cls, now):
                    # (not recently present: a QoS >= 1 message would be held, ``_route_of``)
                    nobody = QUIET_NOBODY_ALONE if self._alone() else QUIET_NOBODY
                    quiet[cls] = (now + QUIET_RECHECK_S, nobody)
            slow = slow or sender.next_deadline() != deadline
        if message.retain:
            self._publish_retained(message)
        if slow and not self._outbox_armed:
            # (a flush of the outbox is scheduled - the forwarded messages of this event-loop
            # iteration - and arms the timer after it: once per batch instead of per message)
            self._arm_timer()
        return None

    def _reaches_only_self(self, cls: str, now: float) -> bool:
        """A publication on ``cls`` reaches no other broker: the overlay knows no other broker's
        subscriber of it (``OverlayNode.reaches_only_self``) and no broker announced it or
        receives our stream of it (``StreamSender.has_receivers``)."""
        node = self.node
        sender = self.sender
        assert node is not None and sender is not None
        return node.reaches_only_self(cls, now) and not sender.has_receivers(cls)

    def _alone(self) -> bool:
        """This broker founded its overlay without contacts and no other broker ever talked to it
        (or was reported down): any broker that joins later reaches us first - its first message
        empties the cache - so no subscription elsewhere can have its SUBACK before that, and a
        class nobody subscribes needs no presence-grace copies (the copies on every publish were
        most of a one-broker cluster's QoS 0 overhead, issue #11)."""
        return self._founded_alone and not self._known_peers()

    def _every_peer_connected(self) -> bool:
        """No broker we know of is reported down, and the transport has a link up to each one we
        have heard from (checked when a class's reach is cached, at most every QUIET_RECHECK_S;
        a peer reported down empties the cache)."""
        if self._down_peers:
            return False
        heard = self._heard_from
        if not heard:
            return True
        transport = self.transport
        assert transport is not None
        connected = transport.connected_peers()
        return all(peer in connected or peer == self.peer_id for peer in heard)

    def _route_of(self, cls: str, message: Message, now: float) -> int:
        """How ``message`` goes out on ``cls`` (one of the ``ROUTE_*``)."""
        node = self.node
        sender = self.sender
        assert node is not None and sender is not None
        self._publishing(cls, now)
        if node.subscriber_presence(cls) is not False:
            sender.present(cls, now)
            return ROUTE_OVERLAY
        if sender.has_receivers(cls):
            # the overlay sees no subscriber, but a receiver that crashed or is cut off still
            # expects the stream: logged, it gets it by resend when it is back
            return ROUTE_DIRECT
        if message.qos and sender.recently_present(cls, now):
            # subscribers a moment ago (one moving or restarting): logged, published when presence
            # returns
            return ROUTE_HELD
        return ROUTE_SKIP  # nobody subscribes (exhaust data, seed 003 §3.2)

    def _send_on_class(
        self,
        cls: str,
        message: Message,
        route: int,
        now: float,
        deps: tuple[StreamPosition, ...] | None = None,
        copies: tuple[tuple[str, int], ...] = (),
    ) -> None:
        if route == ROUTE_OVERLAY:
            self._forward(cls, message, deps=deps or (), copies=copies)
        elif route == ROUTE_DIRECT:
            self._forward(cls, message, overlay=False, deps=deps or (), copies=copies)
        elif route == ROUTE_HELD:
            self._forward(cls, message, held=True, deps=deps or (), copies=copies)
        else:
            assert self.sender is not None
            self.sender.skip(cls, message, now, deps)

    def _publish_causal(
        self, message: Message, classes: list[str], groups: tuple[int, ...], now: float
    ) -> None:
        """A message of a causal group: every copy carries the group's ACK vector (its
        dependencies) and the SEQ of every copy (``broker.cluster.causal_clock``)."""
        causal = self.causal
        sender = self.sender
        assert causal is not None and sender is not None
        routes = [(cls, self._route_of(cls, message, now)) for cls in classes]
        copies = tuple((cls, sender.position(cls)) for cls, route in routes if route != ROUTE_SKIP)
        deps = causal.stamp(groups)
        for cls, route in routes:
            self._send_on_class(cls, message, route, now, deps, copies)
        if copies:
            causal.sent(groups, sender.origin, copies)

    def _forward_causal(self, cls: str, message: Message, deps: tuple[StreamPosition, ...]) -> None:
        """A message of a causal group kept while ``cls`` had no subscriber goes out now."""
        causal = self.causal
        sender = self.sender
        assert causal is not None and sender is not None
        copies = ((cls, sender.position(cls)),)
        self._forward(cls, message, deps=deps, copies=copies)
        causal.sent(causal.groups_of(message.topic), sender.origin, copies)

    def _publish_retained(self, message: Message) -> None:
        assert self.retained_sync is not None
        wall_ms = int(self.scheduler.wall_time() * 1000)
        update = self.retained_sync.local_write(message, wall_ms)
        if self.origin_checks is not None:  # signed once, kept with the version for copies
            update = self.origin_checks.sign_retained(update)
            self.retained_sync.set_proof(message.topic, update.proof)
        self._publish_control(update)
        self._persist_retained_versions()

    def _persist_retained_versions(self) -> None:
        """Retained versions that changed go to the store, in the transaction of the retained rows
        they stamp (a restarted broker's anti-entropy digest then covers what its disk holds)."""
        assert self.retained_sync is not None
        changed = self.retained_sync.changed
        if changed:
            store = self.store
            for topic, (version_ms, origin) in changed.items():
                store.set_retained_version(topic, version_ms, origin)
            changed.clear()
        proofs = self.retained_sync.changed_proofs
        if proofs:
            for topic, proof in proofs.items():
                self.store.set_retained_proof(topic, proof.to_bytes() if proof is not None else None)
            proofs.clear()

    def _publish_control(self, payload: object) -> None:
        self._publication_id += 1
        self._published[CONTROL_CLASS] = self._now()
        self._handle(api.Publish(CONTROL_CLASS, payload, self._publication_id))

    # ================================================================== receiving
    def _on_deliver(self, action: api.Deliver) -> None:
        payload = action.payload
        if action.publisher == self.peer_id:
            return  # our own publication: local subscribers already have it
        problem = payload_problem(action.publisher, payload)
        if problem is not None:
            self._reject(action.publisher, payload, problem)
            return
        checks = self.origin_checks
        if checks is not None and self._origin_refused(checks.check_payload(payload, self._wall_s())):
            return  # (relayed here by ``_receiving_from``; a relay cannot make a proof)
        if isinstance(payload, ForwardedMessage):
            self._receive_forwarded(payload, int(action.hops))
        elif isinstance(payload, ForwardedBatch):
            hops = int(action.hops)
            self._route_memos = {}  # matched once per (class, topic) of the batch (``_deliver``)
            try:
                for forwarded in payload.messages:
                    self._receive_forwarded(forwarded, hops)
            finally:
                self._route_memos = None
                self._persist_positions()  # the batch's receive positions, once (``_deliver``)
        elif isinstance(payload, RetainedUpdate):
            self._apply_retained(payload)
        elif isinstance(payload, SessionClaim):
            self._on_claim(payload)

    def receive_forwarded(self, forwarded: ForwardedMessage, hops: int) -> None:
        """A forwarded message the overlay delivered here after ``hops`` hops: restore its
        stream's order (``stream_receiver``), then deliver what is ready to local subscribers (what the
        overlay's ``Deliver`` action does; an entry point for tests and tools)."""
        self._receive_forwarded(forwarded, hops)
        self._after_event()

    def _apply_retained(self, update: RetainedUpdate) -> None:
        assert self.retained_sync is not None and self.broker is not None
        if self.origin_checks is not None and update.proof is not None:
            update = replace(update, proof=self.origin_checks.kept(update.proof))
        if not self.retained_sync.accept(update):
            return
        self.broker.set_retained(replace(update.message))
        self._persist_retained_versions()
        self.stats.retained_updates_applied += 1
        self._deliver_pending_commit = True

    # ================================================================== takeover
    def before_attach(
        self, client_id: str, clean_start: bool, username: str | None = None
    ) -> Completion[SessionSnapshot | None] | None:
        if self.stopped or self.node is None or self.transport is None or self.takeover is None:
            return None
        peers = self.transport.connected_peers()
        wall_ns = int(self.scheduler.wall_time() * 1e9)
        # recorded even with no peer connected: it is repeated to brokers that come back (one of
        # them may hold a stored session of this client)
        claim, waits = self.takeover.claim(
            client_id,
            clean_start,
            peers,
            self._now(),
            wall_ns,
            unreachable=self._down_peers,
            username=username,
        )
        if self.takeover.pending_claim(claim.claim_id) is not None:
            # durable before it leaves: should the session be handed over and this broker go down
            # before it arrives, the restarted broker asks for it again (``Takeover.restore_pending``)
            self.store.set_pending_claim(claim.claim_id, claim)
            self._commit()
        if peers:
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
        if claim.origin != self.peer_id and broker.owned_by_other(claim.client_id, claim.username):
            # sessions are bound to their owner (docs/security.md): the session stays here, its
            # client stays connected, and the claimant refuses its CONNECT with 0x87
            self.stats.claims_refused += 1
            broker.log_event(
                logging.WARNING,
                "session_owner_mismatch",
                client_id=claim.client_id,
                username=claim.username,
                claimant=claim.origin,
            )
            refusal = ClaimReply(claim.claim_id, claim.client_id, True, None, (), refused=True)
            self._send_envelope(claim.origin, claim.client_id, claim.claim_id, refusal)
            return
        decision = self.takeover.on_claim(claim, connected_here=broker.client_connected(claim.client_id))
        if decision is None:
            return
        if isinstance(decision, Refuse | NoSession):
            reply = ClaimReply(claim.claim_id, claim.client_id, False, None)
        elif isinstance(decision, Answer):
            reply = decision.reply  # the claim was repeated: our reply with the session was lost
            if decision.moved_from is not None:
                # handed over to a broker that went down right after: it goes to this claim now
                self.store.set_handed_over(*decision.moved_from, None)
                self.store.set_handed_over(claim.claim_id, claim.origin, reply)
        else:
            assert isinstance(decision, HandOver)
            before = self.receiver.positions()  # (the hand-over may leave classes)
            had, snapshot = broker.hand_over(claim.client_id, transfer=decision.transfer)
            if had:
                self.stats.sessions_handed_over += 1
                self._deliver_pending_commit = True
            positions = self._hand_over_positions(snapshot, before) if snapshot is not None else ()
            reply = ClaimReply(claim.claim_id, claim.client_id, had, snapshot, positions)
            self._handed_over(claim.claim_id, claim.origin, reply)
        self._send_envelope(claim.origin, claim.client_id, claim.claim_id, reply)

    def _pass_on_if_claimed_elsewhere(self, client_id: str) -> None:
        """A session handed to us arrived after a newer claim for its client came from another
        broker (the client gave up on us and connected there): it is passed on to that broker,
        which merges it (nothing queued in it is lost)."""
        takeover = self.takeover
        broker = self.broker
        if self.stopped or takeover is None or broker is None:
            return
        newer = takeover.newest_remote_claim(client_id)
        if newer is None or broker.client_connected(client_id) or not broker.has_session(client_id):
            return
        before = self.receiver.positions()
        had, snapshot = broker.hand_over(client_id, transfer=True)
        if not had or snapshot is None:
            return
        self.stats.sessions_handed_over += 1
        self._deliver_pending_commit = True
        positions = self._hand_over_positions(snapshot, before)
        claim_id, origin = newer
        reply = ClaimReply(claim_id, client_id, True, snapshot, positions)
        self._handed_over(claim_id, origin, reply)
        self._send_envelope(origin, client_id, claim_id, reply)
        self._after_event()

    def _apply_moved_positions(self, client_id: str) -> None:
        """A session handed to us was imported: catch it up from the positions it brought."""
        broker = self.broker
        if self.stopped or broker is None or not broker.has_session(client_id):
            return  # not imported: kept for the CONNACK, or passed on with the session
        positions = self._moved_positions.pop(client_id, None)
        if positions:
            self._catch_up(client_id, positions)
            self._after_event()

    def _pass_on_late(self, reply: ClaimReply) -> bool:
        """A session answering an old claim of ours arrived after the client had moved on from here
        to a newer connection elsewhere (the old claim went on through the overlay after a heal):
        the session and its old broker's positions go on to that connection's broker as they came,
        instead of staying here as a stored session nobody connects to."""
        takeover = self.takeover
        broker = self.broker
        assert takeover is not None and broker is not None
        client_id = reply.client_id
        newer = takeover.newest_remote_claim(client_id)
        if newer is None or broker.client_connected(client_id) or broker.has_session(client_id):
            return False
        claim_id, origin = newer
        passed = ClaimReply(claim_id, client_id, True, reply.snapshot, reply.positions)
        self._handed_over(claim_id, origin, passed)
        self.stats.sessions_handed_over += 1
        self._send_envelope(origin, client_id, claim_id, passed)
        return True

    def _handed_over(self, claim_id: int, claimant: str, reply: ClaimReply) -> None:
        """``reply`` carries a session to ``claimant``: kept for a repeat of the claim, in memory
        and in the store (in the hand-over's commit: a crash before the reply arrived does not lose
        the session)."""
        assert self.takeover is not None
        if reply.snapshot is None:
            return
        down = claimant in self._down_peers
        self.takeover.handed_over(claim_id, claimant, reply, self._now(), claimant_down=down)
        self.store.set_handed_over(claim_id, claimant, reply)

    def _claim_settled(self, claim_id: int) -> None:
        """The session our claim ``claim_id`` brought is stored here (or went on): nothing of it is
        in flight any more."""
        if self.takeover is not None and self.takeover.settled(claim_id):
            self.store.set_pending_claim(claim_id, None)
            if self.broker is not None:
                self.broker.after_batch()

    def _claim_refused(self, reply: ClaimReply) -> None:
        """Another broker holds the client id's session for another user: the CONNECT waiting for
        the claim is refused (0x87); a connection already attached without waiting (clean start)
        is disconnected with 0x87."""
        assert self.takeover is not None and self.broker is not None
        current = self.takeover.refused(reply.claim_id, reply.client_id)
        completion = self._claim_waits.pop(reply.claim_id, None)
        if completion is not None:
            error = PermissionError(f"client id {reply.client_id!r} belongs to another user")
            self.scheduler.call_soon(completion.set_exception, error)
        elif current and self.broker.client_connected(reply.client_id):
            self.scheduler.call_soon(self.broker.kick, reply.client_id, 0x87)

    def _finish_claims(self, finished: list[ClaimFinished]) -> None:
        for outcome in finished:
            completion = self._claim_waits.pop(outcome.claim_id, None)
            if completion is not None:
                self.scheduler.call_soon(completion.set_result, outcome.snapshot)

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        positions = self._moved_positions.pop(client_id, None)
        if positions:
            self._catch_up(client_id, positions)
        if self.takeover is not None and self.transport is not None:
            # brokers that came back while the CONNECT waited get its claim now (one may hold the
            # client's older session), repeated until they answer
            unasked = self.takeover.unasked(client_id, self.transport.connected_peers())
            if unasked is not None:
                claim, newcomers = unasked
                for peer in newcomers:
                    self._send_envelope(peer, client_id, claim.claim_id, claim)
                    self.takeover.repeat_to(peer, [claim], self._now())
        if self.takeover is not None and self.takeover.yields(client_id):
            # a newer CONNECT of this client id elsewhere was claimed while ours waited: it wins
            broker = self.broker
            assert broker is not None
            self.scheduler.call_soon(broker.kick, client_id, 0x8E)

    def on_client_disconnected(self, client_id: str) -> None:
        return None  # its claim record is dropped by the sweep once the session is gone

    # ================================================================== directed messages
    def _reject(self, sender: str, body: object, problem: str) -> None:
        """A cluster message not valid from the broker that sent it (``broker.cluster.inbound``)."""
        self.stats.inbound_rejected += 1
        log.warning("cluster_message_rejected %s from %s: %s", type(body).__name__, sender, problem)

    def _wall_s(self) -> float:
        return self.scheduler.wall_time()

    def _origin_refused(self, refusal: Refusal | None) -> bool:
        """An item whose origin proof does not hold (``broker.cluster.origin_checks``): dropped,
        counted and logged; True when refused."""
        if refusal is None:
            return False
        self.stats.origin_proofs_rejected[refusal.kind] += 1
        if self.broker is not None:
            self.broker.log_event(
                logging.WARNING,
                "cluster_origin_proof_rejected",
                kind=refusal.kind,
                origin=refusal.origin,
                sender=self._receiving_from,
                reason=refusal.problem,
            )
        return True

    def _prove_own_retained(self, reply: RetainedSyncReply) -> RetainedSyncReply:
        """A copy's updates of our own origin without a proof under our current certificate (a
        version restored from an older store, or signed before a certificate rotation) are signed
        now, and that proof kept."""
        checks = self.origin_checks
        retained_sync = self.retained_sync
        if checks is None or retained_sync is None:
            return reply
        current = checks.certificate()
        updates = list(reply.updates)
        for index, update in enumerate(updates):
            proof = update.proof
            if update.origin != self.peer_id or (proof is not None and proof.certificate == current):
                continue
            update = checks.sign_retained(update)
            updates[index] = update
            retained_sync.set_proof(update.message.topic, update.proof)
        return replace(reply, updates=tuple(updates))

    def _unasked_retained_reply(self, sender: str, request_id: int) -> str | None:
        """A retained-store copy is taken only from a broker this one asked, with that request's
        id, in the last RETAINED_ASK_MEMORY_S: an unsolicited one would plant retained messages."""
        asked = self._retained_asked.get(sender, {})
        asked_at = asked.get(request_id)
        if asked_at is None or self._now() - asked_at > RETAINED_ASK_MEMORY_S:
            return f"RetainedSyncReply to request {request_id}, which was not asked"
        return None

    def _send_envelope(self, dest: str, to_client: str, ref: int, body: Any) -> None:
        if isinstance(body, RetainedSyncRequest):
            asked = self._retained_asked.setdefault(dest, {})
            if len(asked) > 64:  # old requests of a peer that never answered
                asked.clear()
            asked[body.request_id] = self._now()
        self._commit()
        envelope = Envelope(self.peer_id, dest, "", to_client, ref, DEFAULT_ENVELOPE_TTL, body)
        if self.origin_checks is not None:  # our directed messages carry our origin proof
            envelope = self.origin_checks.sign_envelope(envelope)
        self._send(dest, envelope)

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
            if not self.takeover.is_own_claim(body.claim_id, body.client_id) or (
                body.snapshot is not None and body.snapshot.client_id != body.client_id
            ):
                self.stats.inbound_rejected += 1
                log.warning(
                    "cluster_message_rejected ClaimReply from %s: claim %d for %r is not ours",
                    envelope.orig,
                    body.claim_id,
                    body.client_id,
                )
                return
            if body.refused:
                self._claim_refused(body)
                return
            outcome = self.takeover.on_reply(envelope.orig, body)  # orig: the answering broker
            if body.snapshot is None and self.takeover.answered_without_session(body.claim_id, envelope.orig):
                self.store.set_pending_claim(body.claim_id, None)  # nobody has it in flight
            if isinstance(outcome, LateSession) and self._pass_on_late(body):
                self._claim_settled(body.claim_id)  # the client has moved on: the session went on to it
            elif isinstance(outcome, LateSession):
                # came after the wait ended: keep its messages anyway, and what its old broker
                # had not delivered to it
                self.stats.sessions_received += 1
                self.broker.receive_late_session(outcome.snapshot)
                self._claim_settled(body.claim_id)
                if body.positions and self.broker.has_session(body.client_id):
                    self._catch_up(body.client_id, body.positions)
            elif outcome is None and body.had_client and body.positions:
                # an answer (to a repeated claim) from a broker whose copy of the session was empty:
                # what was published after its positions still has to reach the client here
                if self.broker.has_session(body.client_id):
                    self._catch_up(body.client_id, body.positions)
            elif outcome is not None:
                if outcome.snapshot is not None:
                    self.stats.sessions_received += 1
                    if body.positions:
                        self._moved_positions[body.client_id] = body.positions
                self._finish_claims([outcome])  # schedules the completion: the core imports then
                if outcome.snapshot is not None:
                    # scheduled after the import, in its commit: what the old broker had not
                    # delivered is fetched into the session at once (a crash of this broker before
                    # the CONNACK would otherwise lose the positions, kept in memory only)
                    self.scheduler.call_soon(self._apply_moved_positions, body.client_id)
                    self.scheduler.call_soon(self._claim_settled, body.claim_id)  # (in the import's commit)
                    # if a newer CONNECT elsewhere claimed the client meanwhile, the session goes
                    # on to it
                    self.scheduler.call_soon(self._pass_on_if_claimed_elsewhere, body.client_id)
        elif isinstance(body, RetainedSyncRequest):
            if body.digest is not None and not self.retained_sync.differs(body.digest):
                return  # anti-entropy: the same retained versions on both sides
            for reply in self.retained_sync.copy_for(body.request_id, self.broker.retained_messages()):
                self._send_envelope(envelope.orig, "", body.request_id, self._prove_own_retained(reply))
            self._persist_retained_versions()
        elif isinstance(body, RetainedSyncReply):
            checks = self.origin_checks
            for update in self.retained_sync.reply_received(body):
                # each update is checked against its own origin (a copy relays other brokers'),
                # when it would be applied
                if (
                    checks is not None
                    and self.retained_sync.newer(update)
                    and self._origin_refused(checks.check_retained(update, self._wall_s()))
                ):
                    continue
                self._apply_retained(update)
        elif isinstance(body, SessionClaim):  # repeated to us after a partition or a restart
            self._on_claim(body)
        elif isinstance(body, ClassInterest):
            if body.leaving:
                self._peer_left(envelope.orig)
                return
            if not body.subscribed and not body.unsubscribed and not body.full:
                if envelope.ref:  # the acknowledgement of one of our announcements
                    self.announcer.acked(envelope.orig, envelope.ref)
                return
            self._on_interest(envelope.orig, body)
            if envelope.ref:
                self._send_envelope(envelope.orig, "", envelope.ref, ClassInterest(()))
        else:
            self._on_stream_body(envelope.orig, body)

    # ================================================================== introspection
    def joined(self) -> bool:
        """In the overlay (found or founded; see overlay.formation) with the virtual nodes every
        broker holds: the anchor and both sides of the control class (readiness, /readyz)."""
        node = self.node
        if node is None or self.stopped:
            return False
        peer = self.peer_id
        keys = (
            make_key(ANCHOR_TOPIC, PUBLISHER, peer),
            make_key(CONTROL_CLASS, SUBSCRIBER, peer),
            make_key(CONTROL_CLASS, PUBLISHER, peer),
        )
        return all(key in node.vnodes for key in keys)

    def state(self) -> dict[str, Any]:
        node = self.node
        joined = self.joined()
        presence: dict[str, bool | None] = {}
        vnodes = 0
        if node is not None:
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

    def subscriber_brokers(self, cls: str) -> int:
        """How many brokers subscribe ``cls``, this one included, as this broker knows it."""
        return len(self.interest_table.peers_of(cls)) + (1 if self.interest.subscribes(cls) else 0)

    def class_snapshot(self, now_s: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The next per-class snapshot (``broker.cluster.class_stats``) at wall time ``now_s``:
        every class this broker counted, subscribes or knows a subscriber of (not the control
        class)."""
        if self._snapshots is None:
            self._snapshots = SnapshotBuilder(self.peer_id, self.class_counters, self.cluster.table_size)
        counters = self.class_counters.by_class
        for cls in [cls for cls in counters if cls == CONTROL_CLASS or cls.startswith("=$")]:
            del counters[cls]  # the control class, and $-topics (never forwarded)
        known = {
            cls
            for cls in set(self.interest.classes()) | self.interest_table.classes()
            if cls != CONTROL_CLASS and not cls.startswith("=$")
        }
        return self._snapshots.build(now_s, self.subscriber_brokers, known, extra)

    def sender_counters(self) -> dict[str, int]:
        """Counters the send log keeps (scrape time): publishes suppressed, RETs answered."""
        sender = self.sender
        return {
            "publishes_suppressed": sender.skipped_total if sender is not None else 0,
            "rets_received": sender.rets_received if sender is not None else 0,
        }

    def overlay_figures(self) -> OverlayFigures:
        """The overlay's figures for /metrics (``broker.cluster.overlay_figures``; scrape time)."""
        figures = OverlayFigures()
        node = self.node
        if node is None:
            return figures
        figures.routing_entries = routing_entries(node)
        published = [cls for cls in self._published if cls != CONTROL_CLASS and not cls.startswith("=$")]
        figures.published_classes = published_classes(node, published, self.interest_table.peers_of)
        transport = self.transport
        connected = transport.connected_peers() if transport is not None else frozenset()
        figures.peer_suspected, figures.peer_silence_s = peer_suspicion(
            node, self._now(), connected | self._heard_from, self._down_peers
        )
        return figures

    def gauges(self) -> dict[str, int]:
        node = self.node
        transport = self.transport
        return {
            "peers_connected": len(transport.connected_peers()) if transport is not None else 0,
            "virtual_nodes": len(node.vnodes) if node is not None else 0,
            "subscribed_classes": len(self.interest.classes()),
            "published_classes": len(self._published),
            "held_messages": self.receiver.held_count(),
            "causal_blocked_streams": self.receiver.blocked_count(),
            "causal_held_messages": self.receiver.causal_held_count(),
            "routing_table_capacity": self.cluster.table_size,
            "causal_clock_entries": self.causal.size() if self.causal is not None else 0,
            "send_log_messages": self.sender.logged_count() if self.sender is not None else 0,
            "send_log_receivers": self.sender.receiver_count() if self.sender is not None else 0,
        }
