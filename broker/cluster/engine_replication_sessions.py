"""The session side of the replication glue (``broker.cluster.engine_replication``): a broker's
persistent sessions on N brokers and its graceful removal (docs/cluster.md, Replicas;
docs/notes/replication-in-brokers.md). A mixin of :class:`EngineReplication`, in its own module
for size: the home's sessions given to the core after the store's commits (at most every
``SESSION_FLUSH_S``), the stream acknowledgements held until the sessions they cover are durable
on N (seed 004's REQ after the holders' acceptance), the lookup and adoption of a gone home's
sessions at a CONNECT, and the drain (``leave`` / ``drained``).

No I/O here: time and timers come from the engine's scheduler.
"""

from __future__ import annotations

import copy as _copy
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from broker.cluster.messages import StreamPosition
from broker.cluster.replication_messages import AdoptSessions, CopyFound, ReplicationAction, SendReplica
from broker.cluster.stream_receiver import SendAck
from broker.cluster.subscribe_waits import SessionCopyWaits
from broker.core.ports import Completion

if TYPE_CHECKING:
    from broker.cluster.engine import ClusterEngine
    from broker.cluster.replication import Replication
    from broker.core.ports import SessionSnapshot

log = logging.getLogger("skipmq.cluster")

LOOKUP_AGAIN_S = 0.1  # a session lookup is sent again this often while the CONNECT waits (a lost one)
# sessions written by the store are given to the core (exported, replicated) at most this often:
# the stream acks that cover them wait up to this much longer (docs/notes/replication-in-brokers.md)
SESSION_FLUSH_S = 0.05
# a copy is the session's whole state, its queue included: the flushes are spaced so that at most
# about this many queued messages per second are copied (encoded here, decoded and written at each
# holder, ~15 us each; docs/benchmarks-cluster.md, "Session copies"). Every 50 ms, a session whose
# client fell 500-1,000 behind cost its broker half its CPU in copies, and it drained 2.3x slower
# than before the move that made it long (test_disk_loss.py with 5 brokers, docs/notes/replication.md)
SESSION_COPY_MESSAGES_PER_S = 4000
# why a SUBACK / UNSUBACK of a persistent session left without its state on N brokers
UNCOPIED_REASONS = ("timed_out", "fewer_than_n_live", "stopping")


class ReplicationSessions:
    """See the module docstring (what :class:`EngineReplication` provides is declared here)."""

    engine: ClusterEngine
    core: Replication | None
    stopped: bool

    def _now(self) -> float:
        raise NotImplementedError

    def _apply(self, actions: list[ReplicationAction]) -> None:
        raise NotImplementedError

    def _init_sessions(self) -> None:
        # sessions (home side): the state last given to the core, its version (the core numbers
        # each session_changed 1, 2, ...: mirrored here), and the version durable on N
        self._given: dict[str, SessionSnapshot] = {}
        self._given_positions: dict[str, tuple[StreamPosition, ...]] = {}
        self._last_positions: dict[tuple[str, str], int] = {}  # ``_positions_moved``'s last look
        self._given_version: dict[str, int] = {}
        self._durable_version: dict[str, int] = {}
        self._versions = 0
        # stream acknowledgements waiting for session states to be durable on N: (needs, acks)
        # (None: their sessions are not given to the core yet - the next session flush does it)
        self._held_acks: list[tuple[dict[str, int] | None, list[SendAck]]] = []
        self._dirty: set[str] = set()  # sessions committed since the last session flush
        self._session_flush_armed = False
        self._last_session_flush = float("-inf")
        self._session_flush_gap_s = SESSION_FLUSH_S  # after the last flush (its copies' size)
        self._session_flushes = 0
        self._send_acks: Callable[[list[Any]], None] | None = None  # the engine's own
        self.copies: dict[int, CopyFound] = {}  # lookup id -> the first copy a holder sent
        # lookup id -> (deadline, what to do) of a CONNECT whose claim found no session, waiting
        # until no copy can still come (:meth:`when_no_copy_can_come`)
        self._copy_waits: dict[int, tuple[float, Callable[[], None]]] = {}
        self._claiming = False  # adopting for a claim answered here (or a CONNECT here)
        self._claim_from_elsewhere = False  # ... for another broker's claim (handed on at once)
        self.adopted_total = 0  # sessions of gone homes adopted here
        self.adopted_at_claim: set[str] = set()  # adopted here by the CONNECT being answered
        # SUBACKs of persistent sessions held until the state with their subscriptions is on N
        self._suback_waits = SessionCopyWaits(self.engine.cluster.subscribe_wait_ms / 1000.0)
        self._suback_completions: dict[int, tuple[Completion[bool], str, int]] = {}
        # SUBACKs / UNSUBACKs of persistent sessions that waited for their copy, and those that
        # left without it, by reason (``skipmq_cluster_replication_session_copy_waits_total`` and
        # ``..._session_acks_uncopied_total``): ``timed_out`` (after subscribe_wait_ms),
        # ``fewer_than_n_live`` (no N brokers live in this broker's view: no wait, or released),
        # ``stopping`` (the broker stops)
        self.copy_waits_total = 0
        self.acks_uncopied: dict[str, int] = dict.fromkeys(UNCOPIED_REASONS, 0)

    @property
    def suback_waits_timed_out(self) -> int:
        """SUBACKs / UNSUBACKs sent after ``subscribe_wait_ms`` without N copies."""
        return self.acks_uncopied["timed_out"]

    def gate_acks(self) -> None:
        """Hold the engine's stream acknowledgements until the session states they cover are
        durable on N (the engine's ``_receiver_actions`` wrapped: an observation point, as the
        simulation wraps the store's commit)."""
        engine: Any = self.engine
        self._send_acks = original = engine._receiver_actions

        def gated(actions: list[Any]) -> None:
            acks = [action for action in actions if type(action) is SendAck]
            if not acks:
                original(actions)
                return
            original([action for action in actions if type(action) is not SendAck])
            self._hold_acks(acks)

        engine._receiver_actions = gated

    # ------------------------------------------------------------------ the home's sessions
    def sessions_committed(self, client_ids: Iterable[str]) -> None:
        """The store committed writes of these sessions: they are given to the core at the next
        session flush, at most every ``SESSION_FLUSH_S`` (a snapshot is the session's whole state,
        its queue included: one per commit would cost O(queue) per delivered message)."""
        self._dirty.update(client_ids)
        if self._session_flush_armed or self.stopped:
            return
        self._session_flush_armed = True
        delay = max(0.0, self._last_session_flush + self._session_flush_gap_s - self._now())
        self.engine.scheduler.call_later(delay, self._flush_sessions)

    def _flush_sessions(self) -> None:
        self._session_flush_armed = False
        if self.stopped:
            return
        self._last_session_flush = self._now()
        dirty, self._dirty = self._dirty, set()
        self._give_sessions(dirty)
        self._session_flushes += 1
        if self._suback_waits.waiting() and self.core is not None:
            self._suback_waits.numbered(self.core.session_version)
        pending: dict[str, int] | None = None
        for index, (needs, acks) in enumerate(self._held_acks):
            if needs is None:  # held before this flush gave their sessions to the core
                if pending is None:
                    pending = self._pending_versions()
                self._held_acks[index] = (pending, acks)
        self._release_acks()

    def _positions_moved(self) -> None:
        """The streams of given sessions' classes moved on here (messages received, or published
        here): those sessions are given again at the next session flush with their new positions,
        although a client that keeps up leaves its snapshot unchanged and the store wrote nothing
        of it. Called every ``engine_replication.RELEASE_EVERY_S``: a copy's positions lag by
        about that much, and so many messages at most reach an adopted session twice."""
        given = self._given
        engine = self.engine
        sender = engine.sender
        if not given or self.stopped or sender is None:
            return
        class_of = engine.interest.class_of
        classes_of = {
            client_id: {class_of(sub.match_filter) for sub in snapshot.subscriptions}
            for client_id, snapshot in given.items()
        }
        every = set().union(*classes_of.values())
        now_at = {key: seq for key, seq in engine.receiver.positions().items() if key[1] in every}
        for cls in every:
            now_at[(sender.origin, cls)] = sender.position(cls)
        last = self._last_positions
        changed = {key[1] for key, seq in now_at.items() if last.get(key) != seq}
        self._last_positions = now_at
        if changed:
            moved = [client_id for client_id, classes in classes_of.items() if classes & changed]
            if moved:
                self.sessions_committed(moved)

    def _give_sessions(self, client_ids: Iterable[str]) -> None:
        """Each persistent session whose state changed since it was last given to the core is
        given again (ended ones as None)."""
        core = self.core
        broker: Any = self.engine.broker
        if core is None or self.stopped or broker is None or core.replicas <= 1:
            return
        now = self._now()
        actions: list[ReplicationAction] = []
        copied = 0  # queued messages copied by this flush (they space the next one)
        for client_id in sorted(set(client_ids)):
            snapshot = broker.export_session(client_id)
            if snapshot is not None and snapshot.expiry_interval_s > 0:
                # the positions too: a session whose client keeps up has the same snapshot (an
                # empty queue) flush after flush while its streams move on; a copy with its first
                # positions made the adopter fetch the whole send log again from there (thousands
                # of duplicates after the home's disk loss, docs/notes/replication-in-brokers.md)
                positions = self._positions(snapshot)
                if (
                    self._given.get(client_id) == snapshot
                    and self._given_positions.get(client_id) == positions
                ):
                    continue
                self._given[client_id] = snapshot
                self._given_positions[client_id] = positions
                copied += len(snapshot.pending)
                actions += core.session_changed(client_id, snapshot, now, positions)
            elif client_id in self._given:
                del self._given[client_id]
                self._given_positions.pop(client_id, None)
                actions += core.session_changed(client_id, None, now)
            else:
                continue
            self._versions += 1
            self._given_version[client_id] = self._versions
        self._session_flush_gap_s = max(SESSION_FLUSH_S, copied / SESSION_COPY_MESSAGES_PER_S)
        self._apply(actions)

    def _positions(self, snapshot: SessionSnapshot) -> tuple[StreamPosition, ...]:
        """Where this broker stands in the streams of the session's classes (what
        ``ClusterEngine._hand_over_positions`` names for a session that moves)."""
        engine = self.engine
        sender = engine.sender
        if sender is None:
            return ()
        classes = {engine.interest.class_of(sub.match_filter) for sub in snapshot.subscriptions}
        at = {key: seq for key, seq in engine.receiver.positions().items() if key[1] in classes}
        for cls in classes:
            at[(sender.origin, cls)] = sender.position(cls)
        return tuple(StreamPosition(origin, stream, seq) for (origin, stream), seq in sorted(at.items()))

    def _pending_versions(self) -> dict[str, int]:
        durable = self._durable_version
        return {
            client_id: version
            for client_id, version in self._given_version.items()
            if durable.get(client_id, 0) < version
        }

    def _hold_acks(self, acks: list[SendAck]) -> None:
        """Seed 004's REQ for messages queued into persistent sessions leaves once their states
        are on N brokers: a broker that loses its disk meanwhile loses nothing the origins freed."""
        broker = self.engine.broker
        if broker is not None and broker.store_pending():
            broker.commit_now()  # the deliveries these acks cover: their sessions given to the core
        if not self._can_be_durable():
            self._release_acks()
            if self._send_acks is not None:
                self._send_acks(list(acks))
            return
        if self._dirty:  # their sessions go to the core at the next session flush
            self._held_acks.append((None, acks))
            return
        needs = self._pending_versions()
        if not needs and not self._held_acks:
            if self._send_acks is not None:
                self._send_acks(list(acks))
            return
        self._held_acks.append((needs, acks))
        self._release_acks()

    def _can_be_durable(self) -> bool:
        """Live holders enough for N copies in this broker's view. With fewer (a holder down and
        none to replace it, a partition) a session change cannot be durable on N until one is
        back: the acks then leave at once rather than stall the streams until then - a disk lost
        meanwhile is a second fault, which N = 2 does not promise to survive."""
        core = self.core
        return core is not None and len(core.holders_of(core.peer_id)) >= core.replicas - 1

    # ------------------------------------------------------------------ SUBACKs held for N copies
    def session_copied(self, client_id: str) -> Completion[bool] | None:
        """A completion done once the persistent session ``client_id``'s state as committed now
        (a SUBSCRIBE's or an UNSUBSCRIBE's) is on N brokers, at most ``cluster.subscribe_wait_ms``;
        None when there is nothing to wait for (replicas 1, the state is on N already, not a
        replicated session) or nothing to wait with (fewer than N brokers live: counted)."""
        core = self.core
        if core is None or self.stopped or core.replicas <= 1:
            return None
        # the caller committed the change (``handle_subscribe`` / ``handle_unsubscribe``'s
        # ``commit_now``: on the loop, through ``Store.commit``, under every durability setting -
        # tests/unit/cluster/test_session_copy_settings.py): its session is in ``_dirty``, given
        # below, and the wait is for the state with the change, not for the one before it
        if client_id in self._dirty:
            # given now, not at the next session flush: that one waited up to SESSION_FLUSH_S
            # (a SUBACK p50 of 50 ms, bench/suback_latency.py); one copy per SUBSCRIBE, and the
            # flushes keep their spacing
            gap_s = self._session_flush_gap_s
            self._dirty.discard(client_id)
            self._give_sessions([client_id])
            self._session_flush_gap_s = max(gap_s, self._session_flush_gap_s)
        version = core.session_version(client_id)
        if not self._can_be_durable():
            if not core.session_on_n(client_id, version):
                self.acks_uncopied["fewer_than_n_live"] += 1
            return None
        if core.session_durable_from(client_id, version):
            return None
        completion: Completion[bool] = Completion()
        wait_id = self._suback_waits.add(client_id, version, self._now())
        self._suback_completions[wait_id] = (completion, client_id, version)
        self.copy_waits_total += 1
        self.engine.scheduler.call_later(self._suback_waits.timeout_s, self._check_suback_waits)
        return completion

    def _check_suback_waits(self) -> None:
        waits = self._suback_waits
        if not waits.waiting():
            return
        core = self.core
        if core is None or self.stopped:
            finished, reason = waits.abort_all(), "stopping"
        else:
            finished, reason = waits.poll(core.session_durable_from) + waits.tick(self._now()), "timed_out"
        for wait_id, durable in finished:
            waited = self._suback_completions.pop(wait_id, None)
            if waited is None:
                continue
            completion, client_id, version = waited
            if not durable:
                self.acks_uncopied[reason] += 1
            elif core is not None and not core.session_on_n(client_id, version):
                self.acks_uncopied["fewer_than_n_live"] += 1  # released: a holder reported down
            if not completion.done():
                completion.set_result(durable)

    def _release_acks(self) -> None:
        self._check_suback_waits()
        held = self._held_acks
        if not held:
            return
        durable = self._durable_version
        given = self._given_version
        released = len(held) if not self._can_be_durable() else 0
        for needs, _acks in held[released:]:
            if needs is None or any(durable.get(c, 0) < v and given.get(c, 0) >= v for c, v in needs.items()):
                break
            released += 1
        if not released:
            return
        ready, self._held_acks = held[:released], held[released:]
        send = self._send_acks
        if send is not None:
            send([ack for _needs, acks in ready for ack in acks])

    def lookup(self, client_id: str, until: Completion[SessionSnapshot | None]) -> int:
        """Ask the holders for a copy of ``client_id``'s session; asked again every
        ``LOOKUP_AGAIN_S`` until a copy came or ``until`` is done."""
        core = self.core
        assert core is not None
        lookup_id, actions = core.lookup(client_id)
        self._apply(actions)
        scheduler = self.engine.scheduler

        def again() -> None:
            self._check_copy_waits()  # (a member asked may have been reported down meanwhile)
            if not self.stopped and not until.done() and lookup_id not in self.copies:
                unanswered = set(core.lookup_unanswered(lookup_id))
                self._apply([a for a in actions if isinstance(a, SendReplica) and a.peer in unanswered])
                scheduler.call_later(LOOKUP_AGAIN_S, again)
            else:
                core.lookup_ended(lookup_id)

        scheduler.call_later(LOOKUP_AGAIN_S, again)
        return lookup_id

    def end_lookup(self, lookup_id: int) -> None:
        """The CONNECT that asked ``lookup_id`` is answered: copies that come later are not kept."""
        if self.core is not None:
            self.core.lookup_ended(lookup_id)

    def when_no_copy_can_come(self, lookup_id: int, deadline: float, then: Callable[[], None]) -> None:
        """The takeover claim of the CONNECT that asked ``lookup_id`` found no session: ``then``
        (which takes the copy, if one came) once no copy can still come - a copy came, or every
        member asked that is live in our view answered (most with "no copy here"), or ``deadline``
        (the CONNECT's own wait, ``cluster.takeover_wait_ms`` after it) passed. Taken at once, the
        copy of a holder that answered the claim "no session" - its home still live in its view -
        came just after the claim was done, and the client had no session present (3,473 of 5,000
        lost in one CI run of test_replicated_sessions.py; docs/notes/replication.md)."""
        self._copy_waits[lookup_id] = (deadline, then)
        self._check_copy_waits()
        if lookup_id in self._copy_waits:
            delay = max(0.0, deadline - self._now())
            self.engine.scheduler.call_later(delay, self._check_copy_waits)

    def _check_copy_waits(self) -> None:
        waits = self._copy_waits
        if not waits:
            return
        core = self.core
        now = self._now()
        for lookup_id, (deadline, then) in list(waits.items()):
            if (
                self.stopped
                or core is None
                or lookup_id in self.copies
                or core.lookup_answered(lookup_id)
                or now >= deadline
            ):
                if waits.pop(lookup_id, None) is None:
                    continue  # (answered by a call that ``then`` made)
                if core is not None:
                    core.lookup_ended(lookup_id)
                then()

    def take_copy(self, lookup_id: int, client_id: str) -> SessionSnapshot | None:
        """The copy a holder sent for ``lookup_id`` as the client's session here (the claim found
        none); its positions go to the engine as a moved session's."""
        found = self.copies.pop(lookup_id, None)
        core = self.core
        if core is None or self.stopped:
            return None
        if client_id not in self.adopted_at_claim:
            # this broker may hold the newest copy itself (a current holder of the home, which
            # did not answer the claim but is still live in our view): adopted here, not taken
            # from another member's answer (``Replication.claimed``'s ``home_silent``)
            self._claiming = True
            try:
                self._apply(core.claimed(client_id, home_silent=True))
            finally:
                self._claiming = False
            if client_id in self.adopted_at_claim:
                log.warning(
                    "replication_session_copy_own client_id=%s (its home did not answer the claim;"
                    " this broker, its holder, has the newest copy)",
                    client_id,
                )
        if found is None:
            self.adopted_at_claim.discard(client_id)
            return None
        if client_id in self.adopted_at_claim:
            # this broker held the session's newest copy and adopted it at this CONNECT: another
            # copy is an older one (a holder from before the holders changed, e.g. while this
            # broker was down) - taken, its positions restarted the catch-up from there: 1,500
            # duplicates, and the queue limit dropped live messages (test_disk_loss.py)
            self.adopted_at_claim.discard(client_id)
            log.info(
                "replication_session_copy_ignored client_id=%s holder=%s (adopted here already)",
                client_id,
                found.holder,
            )
            return None
        copy = found.copy
        log.warning(
            "replication_session_copy_taken client_id=%s home=%s holder=%s (its home did not answer)",
            client_id,
            copy.home,
            found.holder,
        )
        if copy.positions:
            self.engine._moved_positions[client_id] = copy.positions
        self.adopted_total += 1
        self._apply(core.copy_taken(found.holder, copy, client_id))
        return _copy.deepcopy(copy.snapshot)

    def claimed(self, client_id: str, *, from_elsewhere: bool = False) -> None:
        """A takeover claim for ``client_id`` (``from_elsewhere``: another broker's, answered here)
        or a CONNECT here: a held copy whose home is gone is adopted first, so that the claim
        finds it."""
        core = self.core
        if core is None or self.stopped:
            return
        self._claiming = True
        self._claim_from_elsewhere = from_elsewhere
        try:
            self._apply(core.claimed(client_id))
        finally:
            self._claiming = False
            self._claim_from_elsewhere = False

    def _adopt(self, action: AdoptSessions) -> None:
        core = self.core
        engine = self.engine
        broker = engine.broker
        if core is None or broker is None:
            return
        holders = core.holders_of(action.key[0])
        if holders and core.peer_id not in holders:
            # a copy left here from before the home's holders changed (this broker held it while
            # the home's next broker was down; that one is back and holds the newest copy, and
            # adopts it): adopted here too, its older queue and positions were handed to the
            # client's broker and delivered again - ~1,000 duplicates (test_disk_loss.py)
            skipped = [snapshot.client_id for snapshot in action.snapshots]
            log.info(
                "replication_sessions_left_to_holder home=%s holder=%s sessions=%d (an older copy)",
                action.key[0],
                holders[0],
                len(skipped),
            )
            self._apply(core.sessions_adopted(action.key, skipped, keep_copy=False))
            return
        for index, snapshot in enumerate(action.snapshots):
            existed = broker.has_session(snapshot.client_id)
            # merged into a session the client made here meanwhile (nothing queued is lost); its
            # will kept (published after its delay) unless a CONNECT of the client is adopting it:
            # the client is back, which cancels the will (MQTT-3.1.3-9; docs/cluster.md, Replicas)
            broker.receive_late_session(_copy.deepcopy(snapshot), adopted=not self._claiming)
            positions = action.positions[index] if index < len(action.positions) else ()
            if positions and self._claim_from_elsewhere and not existed:
                # adopted for another broker's claim and handed on at once: the copy's positions go
                # with the session, named in the hand-over as a moved session's. Caught up here
                # instead, the hand-over named none of the streams still being fetched, and the
                # claimant sent its whole retained log again (885 duplicates of 5,000, 660 of them
                # dropped by the queue limit: test_replicated_sessions.py). For a CONNECT here the
                # catch-up starts at once (deferred to the CONNACK: 218-351 duplicates of the
                # subscriber's broker's loss in test_disk_loss.py instead of 0-47)
                engine._moved_positions[snapshot.client_id] = positions
            elif positions:
                # what the gone home had not received yet: from the origins' send logs
                filters = [sub.match_filter for sub in snapshot.subscriptions] if existed else None
                engine._catch_up(snapshot.client_id, positions, filters)
        self.adopted_total += len(action.snapshots)
        client_ids = [snapshot.client_id for snapshot in action.snapshots]
        if self._claiming:
            self.adopted_at_claim.update(client_ids)
        log.warning(
            "replication_sessions_adopted home=%s incarnation=%s sessions=%d (its broker is gone)",
            action.key[0],
            action.key[1],
            len(client_ids),
        )
        self._apply(core.sessions_adopted(action.key, client_ids))
        if broker.store_pending():
            broker.commit_now()  # replicated as this broker's own (the commit gives them to the core)
        else:
            self.sessions_committed(client_ids)
        if self._claiming:
            return  # the claim being answered (or the CONNECT here) takes it
        takeover = engine.takeover
        for client_id in client_ids:
            # the client connected to a live broker before the copy was adopted: it goes there
            newer = takeover.newest_remote_claim(client_id) if takeover is not None else None
            if newer is not None and newer[1] != action.key[0] and core.is_live(newer[1]):
                engine._pass_on_if_claimed_elsewhere(client_id)

    # ------------------------------------------------------------------ graceful removal
    def leave(self) -> None:
        """This broker is being removed (a drain): its log and sessions go to the others."""
        core = self.core
        if core is None or self.stopped:
            return
        self._apply(core.leave(self._now()))
        log.warning("replication_leaving: handing this broker's log and sessions over")

    def drained(self) -> bool:
        """Leaving, and nothing is lost when this process exits now (the core's ``drained``)."""
        core = self.core
        return core is not None and core.drained()
