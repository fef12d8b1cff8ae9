"""The cluster engine's shared base: its state, the constants of its driver and entry points, and
``PeerTransport`` (docs/cluster.md).

``broker.cluster.engine.ClusterEngine`` is split by concern into a chain of bases, one module each,
every method a direct method of ``ClusterEngine`` (no call added on the per-message path):
``engine_base`` (this: state, constants) <- ``streams`` (reliable-stream plumbing) <- ``engine_driver``
(driver loop) <- ``engine_origin`` / ``engine_interest`` / ``engine_retained`` / ``engine_takeover``
(each protocol core's glue) <- ``engine_receiving`` (inputs from other brokers) <- ``engine_entry``
(the ``ClusterPort`` methods the core calls) <- ``engine`` (lifecycle, introspection).
:class:`EngineBase` owns every attribute; the methods one base calls on a later one are declared
below as attributes.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from broker.cluster.causal_clock import CausalClock
from broker.cluster.class_stats import ClassCounters, SnapshotBuilder
from broker.cluster.interest import Interest
from broker.cluster.interest_table import InterestAnnouncer, InterestTable
from broker.cluster.messages import (
    ClassInterest,
    ForwardedMessage,
    StreamPosition,
    StreamResend,
)
from broker.cluster.origin_checks import OriginChecks
from broker.cluster.replies import ReplyHold
from broker.cluster.retained_sync import RetainedSync
from broker.cluster.stats import RTT_SAMPLE_EVERY, ClusterStats
from broker.cluster.store_port import ClusterStore, MemoryClusterStore
from broker.cluster.stream_receiver import StreamReceiver
from broker.cluster.stream_sender import StreamSender
from broker.cluster.subscribe_waits import SubscribeWaits
from broker.cluster.takeover import ClaimFinished, Takeover
from broker.core.ports import Completion
from overlay import api
from overlay.config import OverlayConfig
from overlay.node import OverlayNode

if TYPE_CHECKING:
    from broker.config import ClusterConfig
    from broker.core.ports import BrokerApi, Scheduler, TimerHandle
    from broker.core.session import Message, SessionSnapshot

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


class EngineBase:
    """State of the cluster engine (see the module docstring)."""

    # defined by the later bases of ``ClusterEngine``
    _announce_interest: Callable[[ClassInterest], None]
    _finish_claims: Callable[[list[ClaimFinished]], None]
    _finish_ready_waits: Callable[[list[tuple[int, bool]]], None]
    _forward_causal: Callable[[str, Message, tuple[StreamPosition, ...]], None]
    _on_deliver: Callable[[api.Deliver], None]
    _probe_down_peers: Callable[[float], None]
    _sweep: Callable[[float], None]
    _topic_ready: Callable[[str], bool]

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
        # peer -> (since, resends of streams new here) held for its answer to our claim (streams.py)
        self._resends_held: dict[str, tuple[float, list[StreamResend]]] = {}
        # (origin, class) -> {client: since}: a stream new here held for a client whose older
        # session may still come (streams.py, ``_hold_for_older_sessions``)
        self._older_session_holds: dict[tuple[str, str], dict[str, float]] = {}
        # (origin, class) -> {client: SEQ}: below it, what still arrives of the stream is not
        # delivered to the client (its older session had it; streams.py, ``_skip_had``)
        self._skip_below: dict[tuple[str, str], dict[str, int]] = {}
        # client -> filter -> stream key -> SEQ: where the streams stood when a client whose older
        # session may still arrive (a late session) subscribed here (``catch_up_state.upper_bound``)
        self._subscribed_at: dict[str, dict[str, dict[tuple[str, str], int]]] = {}
        # client -> (its ``_subscribed_at`` record, the filters of the session handed over): kept
        # when a session handed over replaces one here, whose subscriptions the import ends
        # (``EngineReceiving._keep_local_record``, ``_moved_catch_up_filters``)
        self._kept_subscribed_at: dict[str, tuple[dict[str, dict[tuple[str, str], int]], list[str]]] = {}
        # client -> the filters of the session handed over that is about to replace its session
        # here: the replaced session's subscriptions of those filters go on in it, so the import
        # does not leave their classes (``EngineReceiving._continued_by_import``)
        self._replacing: dict[str, set[str]] = {}
        # no head-of-line blocking in a catch-up (``EngineReceiving._room_for``): per stream, the
        # connected sessions that gated it in the current window, those seen absent in it, and
        # those set aside (slower than the live stream: their queue policy applies) until it is live
        self._gated: dict[tuple[str, str], Counter[str]] = {}
        self._absent_in_window: dict[tuple[str, str], set[str]] = {}
        # per stream, the away sessions that gated it in the current window (``_away_holding_back``)
        self._away_gated: dict[tuple[str, str], Counter[str]] = {}
        self._least_behind_at_close: dict[tuple[str, str], int] = {}  # per catch-up (engine_receiving)
        self._set_aside: dict[tuple[str, str], set[str]] = {}
        # client -> the catch-ups set aside by the stall whose backlog is still on its way to it
        # (its queue's allowance stands: ``EngineReceiving._catch_up_stalled``)
        self._backlog_coming: dict[str, set[tuple[str, str]]] = {}
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
        # the contacts this incarnation started with and has not heard from yet, and until when
        # that matters (``EngineEntryPoints._may_miss_subscribers``)
        self._unheard_contacts: set[str] = set()
        self._unheard_until = 0.0
        # batching (issue #11, ``StreamsMixin._publish_forwarded``)
        self._outbox: dict[tuple[str, str], list[ForwardedMessage]] = {}
        self._outbox_armed = False
        self._batch_parts: dict[int, list[int]] = {}
        self._route_memos: dict[str, tuple[Any, dict[str, list[Any]]]] | None = None
        # origin proofs (docs/security.md): what we originate is signed, what others originated is
        # checked; set by the runtime before ``start`` (None: off, e.g. with cluster.insecure)
        self.origin_checks: OriginChecks | None = None
        self._receiving_from = ""  # the peer whose item is being handled (who relayed a payload)

    def _keep_local_record(self, snapshot: SessionSnapshot) -> None:
        """A session handed over is about to replace the client's session here (the core imports
        it; what that one had queued is kept behind it). Its subscriptions end with it, and with
        them the record of where they began to get each stream (``_note_subscribed``): kept here,
        so that the handed-over session's catch-up stops where the session here began to get a
        stream (``_moved_catch_up_filters``) instead of delivering again, on top of its queue,
        what it already has - the queue limit would drop acknowledged messages for it (seed 166
        of ``--faults crash,partition,move --loss 0.05 --finite-clients``)."""
        client_id = snapshot.client_id
        if self.broker is None or not self.broker.has_session(client_id):
            return
        filters = [s.match_filter for s in snapshot.subscriptions if s.share_group is None]
        self._replacing[client_id] = set(filters)
        recorded = self._subscribed_at.get(client_id)
        if recorded:
            self._kept_subscribed_at[client_id] = ({f: dict(at) for f, at in recorded.items()}, filters)

    def _continued_by_import(self, client_id: str, topic_filter: str) -> bool:
        """Whether the end of the client's subscription of ``topic_filter`` here is the import of a
        session handed over that subscribes it too (``_keep_local_record``): the subscription goes
        on, so its class is not left - leaving it forgot the stream positions here and what they
        held back, and the stream started again at its next message: the messages in between were
        lost for the client (seed 166 of ``--faults crash,partition,move --loss 0.05
        --finite-clients``). Its record (``_note_subscribed``) stays too."""
        replacing = self._replacing.get(client_id)
        return replacing is not None and topic_filter in replacing

    def _moved_catch_up_filters(self, client_id: str) -> list[str] | None:
        """For the catch-up of a session handed over and imported: the filters whose catch-up
        stops where the replaced session here began to get their streams (its record is put back
        for ``_late_session_end``); None: no session was replaced, the catch-up is unbounded."""
        self._replacing.pop(client_id, None)  # (imported: its own subscriptions count from here)
        kept = self._kept_subscribed_at.pop(client_id, None)
        if kept is None:
            return None
        self._subscribed_at[client_id] = kept[0]
        return kept[1]
