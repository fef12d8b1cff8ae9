"""Replicated durability in a broker (``cluster.replicas`` = N > 1): the glue between the cluster
engine (``broker.cluster.engine``) and the pure core ``broker.cluster.replication``
(docs/notes/replication.md; seed 004 §2.4, §3.3-§3.5 over a replica group).

* :class:`ReplicatedClusterPort` - the core's cluster port when N > 1: the engine, unchanged, with
  each QoS >= 1 publish also appended to this broker's replication log and its PUBACK/PUBREC held
  until the entry is durable on N brokers (the core's ``Durable``: seed 004's
  pre-acknowledgement) as well as committed here. With N = 1 the engine itself is the port: not
  one call more on the publish path.
* :class:`EngineReplication` - one broker incarnation's core and what carries out its actions:
  records to other brokers on the engine's transport (the ``replica`` kind of a link Item),
  merged per peer for one event-loop iteration (one ``ReplicaAppend`` for every publish of the
  iteration, one ``ReplicaAck`` for every append received); the holder's copies in the broker's
  store (:class:`ReplicaStore`, in the group-commit transaction: an ack leaves only after the
  commit of what it acknowledges); a tick every ``cluster.retransmit_ms`` (retransmission,
  failover, membership); the release (seed 004 §3.5): an entry is released once the engine's
  send log holds none of the stream entries it became (every receiver broker took them, or
  nothing needed them); and the failover: a ``TakeOver`` publishes a gone origin's entries again
  through this broker's router (``republish``: local subscribers get them, the other brokers on
  this broker's own streams), and the copy is dropped once they are durable here.

Sessions (the core's ``session_changed``; docs/notes/replication.md): the adapter tells
:meth:`EngineReplication.sessions_committed` which persistent sessions the store wrote after each
commit; their snapshots (with this broker's stream positions for their classes) go to the same
holders as the log. A stream acknowledgement (seed 004's REQ, ``SendAck``) that covers messages
queued into persistent sessions leaves only once those sessions' latest states are durable on N
(:meth:`EngineReplication.gate_acks`): until then the origins keep the messages in their send logs.
A CONNECT (clean start 0) asks the holders for a copy beside the takeover claim
(:meth:`ReplicatedClusterPort.before_attach`); a holder whose home is gone adopts the session
(``AdoptSessions``: it becomes a stored session here, caught up from its positions).
Graceful removal: :meth:`EngineReplication.leave` / :meth:`EngineReplication.drained`.

Membership: the brokers of ``cluster.join`` at start, then every broker the engine hears of
(``ClusterEngine._known_peers``, read on each tick). A peer the transport reports down leaves the
holder sets until it talks again (the core).

The session side (the home's sessions, the acks held for them, the adoption of a gone home's
sessions, the drain) is the mixin ``broker.cluster.engine_replication_sessions``: one object, on
the same core and the same outbox, whose order (an ack after the commit of what it acknowledges)
must hold across all of them.

Size: the origin's log, the holder's copies, the outbox that merges their records and the
take-over act on one core and one outbox; split further they would share most of their state
through attributes.

No I/O here: the store is a port (``broker.adapters.replication_store`` in a broker process), time
and timers come from the engine's scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from broker.cluster.classes import topic_classes
from broker.cluster.engine_replication_sessions import ReplicationSessions
from broker.cluster.messages import StreamPosition
from broker.cluster.replication import Replication
from broker.cluster.replication_messages import (
    REPLICA_KINDS,
    AdoptSessions,
    CopyFound,
    Drop,
    DropSessions,
    Durable,
    LogKey,
    Persist,
    PersistSession,
    ReplicaAck,
    ReplicaAppend,
    ReplicaItem,
    ReplicationAction,
    SendReplica,
    SessionDurable,
    SessionReplica,
    TakeOver,
)
from broker.core.ports import Completion

if TYPE_CHECKING:
    from broker.cluster.engine import ClusterEngine
    from broker.cluster.stream_sender import StreamSender
    from broker.core.messages import Message
    from broker.core.ports import SessionSnapshot, TimerHandle

log = logging.getLogger("skipmq.cluster")

MAX_MERGED_ENTRIES = 1024  # entries of one ReplicaAppend merged from an event-loop iteration's
# a take-over publishes a gone broker's entries again at most this many every this often (500/s)
TAKE_OVER_CHUNK = 50
TAKE_OVER_PACE_S = 0.1
RELEASE_EVERY_S = 0.1  # how often the holders hear what they may drop (``_release_tick``)
StreamEntry = tuple[tuple[str, str], int]  # ((origin, class), SEQ) in the engine's send log
HeldSession = tuple[LogKey, "SessionSnapshot", tuple[StreamPosition, ...]]


class ReplicaStore(Protocol):
    """What a holder keeps of other brokers' logs (durable with the broker's next commit)."""

    def persist(self, key: LogKey, first_seq: int, messages: tuple[Message, ...]) -> None: ...

    def drop(self, key: LogKey, below_seq: int | None) -> None: ...

    def load(self) -> list[tuple[LogKey, int, Message]]: ...

    def persist_session(
        self,
        key: LogKey,
        client_id: str,
        snapshot: SessionSnapshot | None,
        positions: tuple[StreamPosition, ...],
    ) -> None: ...

    def drop_sessions(self, key: LogKey) -> None: ...

    def load_sessions(self) -> list[HeldSession]: ...


class MemoryReplicaStore:
    """A :class:`ReplicaStore` in memory (in-process engines, tests)."""

    def __init__(self) -> None:
        self.rows: dict[LogKey, dict[int, Message]] = {}
        self.sessions: dict[LogKey, dict[str, tuple[SessionSnapshot, tuple[StreamPosition, ...]]]] = {}

    def persist_session(
        self,
        key: LogKey,
        client_id: str,
        snapshot: SessionSnapshot | None,
        positions: tuple[StreamPosition, ...],
    ) -> None:
        held = self.sessions.setdefault(key, {})
        if snapshot is None:
            held.pop(client_id, None)
        else:
            held[client_id] = (snapshot, positions)

    def drop_sessions(self, key: LogKey) -> None:
        self.sessions.pop(key, None)

    def load_sessions(self) -> list[HeldSession]:
        return [
            (key, snapshot, positions)
            for key in sorted(self.sessions)
            for snapshot, positions in self.sessions[key].values()
        ]

    def persist(self, key: LogKey, first_seq: int, messages: tuple[Message, ...]) -> None:
        held = self.rows.setdefault(key, {})
        for offset, message in enumerate(messages):
            held[first_seq + offset] = message

    def drop(self, key: LogKey, below_seq: int | None) -> None:
        if below_seq is None:
            self.rows.pop(key, None)
            return
        held = self.rows.get(key, {})
        for seq in [seq for seq in held if seq < below_seq]:
            del held[seq]

    def load(self) -> list[tuple[LogKey, int, Message]]:
        return [
            (key, seq, self.rows[key][seq]) for key in sorted(self.rows) for seq in sorted(self.rows[key])
        ]


class _Append:
    """A ``ReplicaAppend`` being merged in the outbox (built into the record when sent)."""

    __slots__ = ("first_seq", "incarnation", "messages", "released")

    def __init__(self, item: ReplicaAppend) -> None:
        self.incarnation = item.incarnation
        self.first_seq = item.first_seq
        self.messages = list(item.messages)
        self.released = item.released

    def record(self) -> ReplicaAppend:
        return ReplicaAppend(self.incarnation, self.first_seq, tuple(self.messages), self.released)


class EngineReplication(ReplicationSessions):
    """See the module docstring. Construct with the engine (bound), ``start`` after the engine's
    start, route the transport's inputs through :meth:`on_receive` / :meth:`on_peer_down`."""

    def __init__(
        self,
        engine: ClusterEngine,
        *,
        started_empty: bool,
        failover_after_s: float,
        store: ReplicaStore | None = None,
    ) -> None:
        self.engine = engine
        self.started_empty = started_empty
        self.failover_after_s = failover_after_s
        self.store: ReplicaStore = store if store is not None else MemoryReplicaStore()
        # publishes a gone origin's entry again here (the router's publish; set by the runtime)
        self.republish: Callable[[Message], Completion[bool] | None] | None = None
        self.core: Replication | None = None
        self.stopped = True
        self._waiting: dict[int, Completion[bool]] = {}  # log seq -> the PUBACK it holds
        self._stream_entries: dict[int, list[StreamEntry]] = {}  # log seq -> its send-log entries
        self._appended_end = 1  # the next log seq
        self._release_from = 1  # entries below are released
        self._outbox: dict[str, list[ReplicaItem | _Append]] = {}
        self._flush_armed = False
        self._persisted = False  # rows written since the last flush: committed before acks leave
        self._timer: TimerHandle | None = None
        self._release_timer: TimerHandle | None = None
        self.taken_over_total = 0  # entries of gone origins published again here
        self.takeovers_total = 0  # gone origin logs taken over
        self._session_slots: dict[tuple[str, str], int] = {}  # (peer, client) -> outbox index
        self._init_sessions()

    # ------------------------------------------------------------------ life
    def start(self, contacts: list[str]) -> None:
        engine = self.engine
        cluster = engine.cluster
        core = self.core = Replication(
            engine.peer_id,
            engine.incarnation,
            replicas=cluster.replicas,
            retransmit_s=engine.retransmit_s,
            failover_after_s=self.failover_after_s,
            retention_s=float(cluster.send_log_retention_s),
            started_empty=self.started_empty,
        )
        rows = self.store.load()
        for key, seq, message in rows:
            core.restore_held(key, seq, [message])
        held_sessions = self.store.load_sessions()
        for key, snapshot, positions in held_sessions:
            core.restore_held_session(key, snapshot, positions)
        self.stopped = False
        now = self._now()
        self._apply(core.start([peer for peer in contacts if peer != engine.peer_id], now))
        if rows or held_sessions:
            log.info(
                "replication_restored %d entries of %d logs, %d sessions",
                len(rows),
                len(core.held_logs()),
                len(held_sessions),
            )
        self._timer = engine.scheduler.call_later(engine.retransmit_s, self._tick)
        self._release_timer = engine.scheduler.call_later(RELEASE_EVERY_S, self._release_tick)
        broker = engine.broker
        sessions = getattr(broker, "sessions", None)
        if sessions:  # this incarnation's restored persistent sessions: replicated under it
            self._give_sessions(list(sessions))

    def stop(self) -> None:
        if self.stopped:
            return
        self._flush()
        self.stopped = True
        self._check_suback_waits()  # (aborted: the SUBACKs they hold leave)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None

    def _now(self) -> float:
        return self.engine.scheduler.time()

    # ------------------------------------------------------------------ transport inputs
    def on_receive(self, sender: str, item: object) -> None:
        """The transport's ``on_receive``: replication records here, everything else to the engine."""
        if type(item) not in REPLICA_KINDS:
            self.engine.on_receive(sender, item)
            return
        core = self.core
        if core is None or self.stopped:
            return
        try:
            self._apply(core.on_item(sender, item, self._now()))  # type: ignore[arg-type]
        except Exception:
            log.exception("replication: failed to handle %s from %s", type(item).__name__, sender)

    def on_peer_down(self, peer: str) -> None:
        self.engine.on_peer_down(peer)
        core = self.core
        if core is not None and not self.stopped:
            self._apply(core.on_peer_down(peer, self._now()))
            self._release_acks()

    # ------------------------------------------------------------------ the origin's log
    def append(self, message: Message, entries: list[StreamEntry]) -> Completion[bool]:
        """A QoS >= 1 publish accepted here (``entries``: the send-log entries it became): done
        once durable on N brokers."""
        core = self.core
        assert core is not None
        durable: Completion[bool] = Completion()
        seq, actions = core.append(message, self._now())
        self._appended_end = seq + 1
        self._waiting[seq] = durable
        if entries:
            self._stream_entries[seq] = entries
        self._apply(actions)
        return durable

    def _release(self, now: float) -> None:
        """Seed 004 §3.5: entries none of whose stream entries the send log still holds."""
        sender = self.engine.sender
        core = self.core
        if sender is None or core is None:
            return
        first_logged: dict[tuple[str, str], int] = {}
        # nobody cut off or down: an entry every known receiver acknowledged is released although
        # the send log keeps it ``send_log_min_retention_ms`` more (for a receiver it has not heard
        # of: one cut off, which makes ``absent`` true) - else a take-over publishes those seconds
        # of entries again and each receiver gets them twice (docs/notes/replication-in-brokers.md)
        needed = _first_logged if sender._absent_since() is not None else _first_needed
        start = seq = self._release_from
        end = self._appended_end
        entries_of = self._stream_entries
        while seq < end:
            entries = entries_of.get(seq)
            if entries is not None:
                still = False
                for key, stream_seq in entries:
                    first = first_logged.get(key)
                    if first is None:
                        first = first_logged[key] = needed(sender, key)
                    if stream_seq >= first:
                        still = True
                        break
                if still:
                    break
                del entries_of[seq]
            seq += 1
        if seq > start:
            self._release_from = seq
            self._apply(core.released(seq, now))

    # ------------------------------------------------------------------ time
    def _release_tick(self) -> None:
        """The holders hear what they may drop every ``RELEASE_EVERY_S`` (not only each
        ``cluster.retransmit_ms``): what they still hold when this broker is lost is published
        again by them, and reaches the receivers that had it a second time."""
        self._release_timer = None
        if self.stopped or self.core is None:
            return
        try:
            self._release(self._now())
            self._positions_moved()
        except Exception:
            log.exception("replication: release failed")
        self._release_timer = self.engine.scheduler.call_later(RELEASE_EVERY_S, self._release_tick)

    def _tick(self) -> None:
        self._timer = None
        if self.stopped or self.core is None:
            return
        engine = self.engine
        now = self._now()
        try:
            self._apply(self.core.meet(engine._known_peers(), now))
            self._apply(self.core.tick(now))
            self._release(now)
            self._release_acks()
        except Exception:
            log.exception("replication: tick failed")
        self._timer = engine.scheduler.call_later(engine.retransmit_s, self._tick)

    # ------------------------------------------------------------------ actions
    def _apply(self, actions: list[ReplicationAction]) -> None:
        for action in actions:
            if isinstance(action, SendReplica):
                self._queue(action.peer, action.item)
            elif isinstance(action, Durable):
                waiting = self._waiting
                for seq in range(action.first_seq, action.end_seq):
                    completion = waiting.pop(seq, None)
                    if completion is not None:
                        completion.set_result(True)
            elif isinstance(action, Persist):
                self.store.persist(action.key, action.first_seq, action.messages)
                self._persisted = True
            elif isinstance(action, Drop):
                self.store.drop(action.key, action.below_seq)
                self._persisted = True
            elif isinstance(action, TakeOver):
                self._take_over(action)
            elif isinstance(action, SessionDurable):
                client_id = action.client_id
                if action.version > self._durable_version.get(client_id, 0):
                    self._durable_version[client_id] = action.version
                if client_id not in self._given and action.version >= self._given_version.get(client_id, 0):
                    self._durable_version.pop(client_id, None)  # ended here, and its holders know
                    self._given_version.pop(client_id, None)
                if self._held_acks:
                    self._release_acks()
                else:
                    self._check_suback_waits()
            elif isinstance(action, PersistSession):
                self.store.persist_session(action.key, action.client_id, action.snapshot, action.positions)
                self._persisted = True
            elif isinstance(action, DropSessions):
                self.store.drop_sessions(action.key)
                self._persisted = True
            elif isinstance(action, AdoptSessions):
                self._adopt(action)
            elif isinstance(action, CopyFound):
                # kept for a CONNECT still waiting (not "no copy here", nor late: never taken)
                open_ = self.core is not None and self.core.lookup_open(action.lookup_id)
                if action.copy.snapshot is not None and open_:
                    self.copies.setdefault(action.lookup_id, action)
                self._check_copy_waits()

    def _take_over(self, action: TakeOver) -> None:
        """Publish a gone origin's entries again as this broker's own (the failover), in order,
        ``TAKE_OVER_CHUNK`` every ``TAKE_OVER_PACE_S`` at most: all at once, a backlog larger than
        a subscriber's queue limit reached a connected persistent session faster than its client
        took it and overflowed the queue (the subscriber's broker drops by its queue policy)."""
        republish = self.republish
        core = self.core
        assert core is not None
        if republish is None:
            log.error("replication: cannot take over %s (no republish)", action.key)
            return
        self.taken_over_total += len(action.messages)
        self.takeovers_total += 1
        log.warning(
            "replication_take_over origin=%s incarnation=%s entries=%d (its broker is gone: published here)",
            action.key[0],
            action.key[1],
            len(action.messages),
        )
        messages = list(action.messages)
        waits: list[Completion[bool]] = []

        def all_done() -> None:
            pending = [len(waits)]

            def one_done(_done: object) -> None:
                pending[0] -= 1
                if pending[0] == 0 and not self.stopped and self.core is not None:
                    self._apply(self.core.taken_over(action.key))

            if not waits:
                if not self.stopped and self.core is not None:
                    self._apply(self.core.taken_over(action.key))
                return
            for wait in waits:
                wait.add_done_callback(one_done)

        def next_chunk(first: int) -> None:
            if self.stopped:
                return  # the copy stays in the store: taken over again after a restart
            for message in messages[first : first + TAKE_OVER_CHUNK]:
                wait = republish(replace(message, retain=False))
                if wait is not None:
                    waits.append(wait)
            if first + TAKE_OVER_CHUNK < len(messages):
                self.engine.scheduler.call_later(TAKE_OVER_PACE_S, next_chunk, first + TAKE_OVER_CHUNK)
            else:
                all_done()

        next_chunk(0)

    def _queue(self, peer: str, item: ReplicaItem) -> None:
        """Into the outbox of ``peer``, merged with the records of this event-loop iteration."""
        items = self._outbox.get(peer)
        if items is None:
            items = self._outbox[peer] = []
        if items:
            last = items[-1]
            kind = type(item)
            if kind is ReplicaAppend and type(last) is _Append:
                assert isinstance(item, ReplicaAppend)
                if (
                    last.incarnation == item.incarnation
                    and last.first_seq + len(last.messages) == item.first_seq
                    and len(last.messages) + len(item.messages) <= MAX_MERGED_ENTRIES
                ):
                    last.messages.extend(item.messages)
                    last.released = max(last.released, item.released)
                    return
            elif kind is SessionReplica:
                assert isinstance(item, SessionReplica)
                slot = self._session_slots.get((peer, item.client_id))
                if slot is not None:
                    items[slot] = item  # the latest state of the session supersedes the earlier one
                    return
                self._session_slots[(peer, item.client_id)] = len(items)
            elif kind is ReplicaAck and type(last) is ReplicaAck:
                assert isinstance(item, ReplicaAck) and isinstance(last, ReplicaAck)
                if last.incarnation == item.incarnation:
                    items[-1] = ReplicaAck(item.incarnation, max(last.next_seq, item.next_seq))
                    return
        elif type(item) is SessionReplica:
            assert isinstance(item, SessionReplica)
            self._session_slots[(peer, item.client_id)] = 0
        items.append(_Append(item) if isinstance(item, ReplicaAppend) else item)
        if not self._flush_armed:
            self._flush_armed = True
            self.engine.scheduler.call_soon(self._flush)

    def _flush(self) -> None:
        """Send the outbox; what was persisted is committed first (acks never run ahead of disk)."""
        self._flush_armed = False
        outbox, self._outbox = self._outbox, {}
        self._session_slots = {}
        if not outbox:
            return
        engine = self.engine
        broker = engine.broker
        if self._persisted:
            self._persisted = False
            if broker is not None and broker.store_pending() and not broker.commit_now():
                # the commit failed: nothing it would acknowledge leaves (the origin sends again)
                outbox = {
                    peer: [i for i in items if type(i) is not ReplicaAck] for peer, items in outbox.items()
                }
        transport = engine.transport
        if transport is None:
            return
        for peer, items in outbox.items():
            for entry in items:
                item = entry.record() if type(entry) is _Append else entry
                try:
                    transport.send(peer, item)
                except (ValueError, RuntimeError) as exc:  # WireError is a ValueError
                    log.error("replication: cannot send %s to %s: %s", type(item).__name__, peer, exc)

    # ------------------------------------------------------------------ introspection
    def gauges(self) -> dict[str, int]:
        core = self.core
        if core is None:
            return {
                "under_replicated": 0,
                "held_entries": 0,
                "held_logs": 0,
                "under_replicated_sessions": 0,
                "held_sessions": 0,
            }
        return {
            "under_replicated": core.under_replicated(),
            "held_entries": core.held_count(),
            "held_logs": len(core.held_logs()),
            "under_replicated_sessions": core.under_replicated_sessions(),
            "held_sessions": sum(len(ids) for ids in core.held_sessions().values()),
            "leaving": int(core.leaving),
        }


class ReplicatedClusterPort:
    """The core's cluster port with ``cluster.replicas`` > 1: ``engine`` plus ``replication``."""

    def __init__(self, engine: ClusterEngine, replication: EngineReplication) -> None:
        self.engine = engine
        self.replication = replication

    def on_publish(self, message: Message, from_client_id: str | None) -> Completion[bool] | None:
        engine = self.engine
        sender = engine.sender
        replication = self.replication
        if (
            not message.qos
            or sender is None
            or engine.stopped
            or replication.stopped
            or message.topic.startswith("$SYS")
        ):
            return engine.on_publish(message, from_client_id)
        classes = engine._classes_of.get(message.topic) or topic_classes(
            message.topic, engine.interest.class_levels
        )
        before = [(cls, sender.position(cls)) for cls in classes]
        wait = engine.on_publish(message, from_client_id)
        origin = sender.origin
        entries = [((origin, cls), seq) for cls, seq in before if sender.position(cls) > seq]
        durable = replication.append(message, entries)
        return both_done(wait, durable)

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        self.engine.on_subscribe(client_id, topic_filter, share_group, qos)

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        self.engine.on_unsubscribe(client_id, topic_filter, share_group)

    def before_attach(
        self, client_id: str, clean_start: bool, username: str | None = None
    ) -> Completion[SessionSnapshot | None] | None:
        replication = self.replication
        engine = self.engine
        if replication.stopped or replication.core is None:
            return engine.before_attach(client_id, clean_start, username)
        replication.claimed(client_id)  # a copy held here of a gone home: a local session now
        wait = self.engine.before_attach(client_id, clean_start, username)
        if clean_start or wait is None:
            return wait
        # beside the claim: a holder's copy, used if the claim finds no session (its home did
        # not answer within the CONNECT's wait - gone, or not yet reported down)
        result: Completion[SessionSnapshot | None] = Completion()
        lookup_id = replication.lookup(client_id, result)
        takeover = engine.takeover
        deadline = replication._now() + (takeover.wait_s if takeover is not None else 0.0)

        def claim_done(done: Completion[SessionSnapshot | None]) -> None:
            error = done.exception()
            if error is not None:
                replication.copies.pop(lookup_id, None)
                replication.end_lookup(lookup_id)
                replication.adopted_at_claim.discard(client_id)
                result.set_exception(error)
                return
            snapshot = done.result()
            if snapshot is None and client_id not in replication.adopted_at_claim:
                # a holder's copy may still be on its way (its claim answer said "no session")
                replication.when_no_copy_can_come(lookup_id, deadline, take_copy)
                return
            replication.copies.pop(lookup_id, None)
            replication.end_lookup(lookup_id)
            replication.adopted_at_claim.discard(client_id)
            result.set_result(snapshot)  # the CONNECT imports it (``client_connect._claimed``)

        def take_copy() -> None:
            snapshot = replication.take_copy(lookup_id, client_id)
            replication.adopted_at_claim.discard(client_id)
            result.set_result(snapshot)  # the CONNECT imports it (``client_connect._claimed``)
            if snapshot is not None:
                # the copy's positions catch the session up right after its import, as a claim
                # reply's do (``EngineReceiving._on_envelope``), not at the CONNACK: the CONNACK
                # waits for the subscriptions' classes (``subscriptions_ready``), and a message
                # published here in between went live into the session ahead of what the positions
                # fetch - out of order (seeds 197, 759 and 849 of the --sessions sweep; the
                # simulation's adapter does the same)
                engine.scheduler.call_soon(engine._apply_moved_positions, client_id)

        wait.add_done_callback(claim_done)
        return result

    def owns_share_group(self, group: str, topic_filter: str) -> bool:
        return self.engine.owns_share_group(group, topic_filter)

    def subscriptions_ready(
        self, topic_filters: list[tuple[str, str | None]], client_id: str | None = None
    ) -> Completion[bool] | None:
        ready = self.engine.subscriptions_ready(topic_filters)
        if client_id is None:
            return ready
        copied = self.replication.session_copied(client_id)  # seed 004's "durable on N"
        return copied if ready is None else both_done(ready, copied) if copied is not None else ready

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        self.engine.on_client_connected(client_id, session_present)

    def on_client_disconnected(self, client_id: str) -> None:
        self.engine.on_client_disconnected(client_id)


def _first_logged(sender: StreamSender, key: tuple[str, str]) -> int:
    """The lowest SEQ of stream ``key`` the send log still holds (its next SEQ when it holds none;
    a stream it no longer has holds nothing). Read from the sender's streams directly:
    ``StreamSender.logged_from(key, 1)`` gives it too, but builds the list of the whole log (6.8 %
    of a publisher's broker's CPU under a QoS 1 stream), and stream_sender.py is at its size limit."""
    stream = sender._streams.get(key)
    if stream is None:
        return 2**63
    return stream.entries.peekitem(0)[0] if stream.entries else stream.next_seq


def _first_needed(sender: StreamSender, key: tuple[str, str]) -> int:
    """The lowest SEQ of stream ``key`` that some receiver may still need from this broker: not
    confirmed by the overlay, not acknowledged by every known receiver, confirmed without reaching
    another broker (``blind``), or kept for a receiver that left; its next SEQ when none. What lies
    below is kept by the send log's minimum retention only (seed 004 §3.5: acknowledged)."""
    stream = sender._streams.get(key)
    if stream is None:
        return 2**63
    needed = stream.next_seq
    if stream.kept_for_left is not None:
        needed = min(needed, stream.kept_for_left[0])
    if not stream.receivers:
        return needed  # no broker receives the class, none is cut off: nobody needs them
    needed = min(needed, min(stream.receivers.values()))
    if stream.unconfirmed:
        needed = min(needed, int(stream.unconfirmed[0]))
    if stream.blind:
        needed = min(needed, int(stream.blind[0]))
    return needed


def both_done(first: Completion[bool] | None, second: Completion[bool]) -> Completion[bool]:
    """Done when both are (``first`` None: ``second``)."""
    if first is None or first.done():
        return second
    if second.done():
        return first
    both: Completion[bool] = Completion()
    pending = [2]

    def one_done(_done: object) -> None:
        pending[0] -= 1
        if pending[0] == 0:
            both.set_result(True)

    first.add_done_callback(one_done)
    second.add_done_callback(one_done)
    return both
