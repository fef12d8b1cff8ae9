"""Replicated durability in the simulated broker (``cluster.replicas`` > 1): the adapter of the pure
core ``broker.cluster.replication`` on the simulation's clock, network and a real SQLite file.

* :class:`ReplicaDisk` - what a broker holds of other brokers' logs, in ``replicas.db`` in its
  data directory (committed before the ack that follows it; gone with the directory).
* :class:`ReplicationNode` - one broker incarnation's core, its link to the other brokers (a
  second :class:`~simulation.network.Network` with the same latency, loss and partitions as the
  cluster's, carrying the replication records as they are: they are not in ``protos/`` yet), a
  tick every ``cluster.retransmit_ms``, and the origin's release: an entry is released once the
  engine's send log no longer holds any of the stream entries it became (every receiver broker
  took them, or nothing needed them).
* :class:`ReplicatedCluster` - the cluster port the broker core is given: the real
  :class:`~broker.cluster.engine.ClusterEngine` unchanged, with each QoS >= 1 publish also
  appended to the replication log and its PUBACK/PUBREC held until the entry is durable on N.
* :class:`ReplicatedSimBroker` - :class:`~simulation.process.SimBroker` with the above.

A failover (``TakeOver``) publishes the gone origin's entries again through this broker's router
(``Router.publish``, as a will is): local subscribers get them, and so do the other brokers on
this broker's own streams; the copy is dropped once they are durable here.

Size: one node carries what the broker splits over ``engine_replication`` and
``engine_replication_sessions`` (the log, the sessions, the copies at a CONNECT, the SUBACKs held
for N copies) on one core and one set of actions; the pure parts (``Replication``,
``SessionCopyWaits``) are shared with the broker already.
"""

from __future__ import annotations

import copy as _copy
import os
import pickle
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from broker.cluster.classes import topic_classes
from broker.cluster.engine_replication import both_done
from broker.cluster.messages import StreamPosition
from broker.cluster.replication import Replication
from broker.cluster.replication_messages import (
    AdoptSessions,
    CopyFound,
    Drop,
    DropSessions,
    Durable,
    LogKey,
    Persist,
    PersistSession,
    ReplicaItem,
    ReplicationAction,
    SendReplica,
    TakeOver,
)
from broker.cluster.subscribe_waits import SessionCopyWaits
from broker.core.messages import SessionSnapshot
from broker.core.ports import Completion
from simulation.process import SimBroker

if TYPE_CHECKING:
    from broker.cluster.engine import ClusterEngine
    from broker.core.client import ClientConnection
    from broker.core.messages import Message
    from broker.core.ports import ClusterPort
    from simulation.clients import SimSocket
    from simulation.network import Network, PeerEndpoint
    from simulation.world import World

LOOKUP_AGAIN_S = 0.1  # a session lookup is sent again this often while the CONNECT waits
StreamEntry = tuple[tuple[str, str], int]  # ((origin, class), SEQ) in the engine's send log


class ReplicaDisk:
    """The entries this broker holds for other brokers, in SQLite (one commit per write)."""

    def __init__(self, path: str) -> None:
        self.connection = sqlite3.connect(path)
        self.connection.execute(
            "CREATE TABLE IF NOT EXISTS held (origin TEXT, incarnation TEXT, seq INTEGER, message BLOB,"
            " PRIMARY KEY (origin, incarnation, seq))"
        )
        self.connection.execute(
            "CREATE TABLE IF NOT EXISTS held_sessions (origin TEXT, incarnation TEXT, client_id TEXT,"
            " snapshot BLOB, PRIMARY KEY (origin, incarnation, client_id))"
        )
        self.connection.commit()

    def persist_session(self, action: PersistSession) -> None:
        origin, incarnation = action.key
        if action.snapshot is None:
            self.connection.execute(
                "DELETE FROM held_sessions WHERE origin = ? AND incarnation = ? AND client_id = ?",
                (origin, incarnation, action.client_id),
            )
        else:
            self.connection.execute(
                "INSERT OR REPLACE INTO held_sessions VALUES (?, ?, ?, ?)",
                (origin, incarnation, action.client_id, pickle.dumps((action.snapshot, action.positions))),
            )
        self.connection.commit()

    def drop_sessions(self, action: DropSessions) -> None:
        self.connection.execute("DELETE FROM held_sessions WHERE origin = ? AND incarnation = ?", action.key)
        self.connection.commit()

    def load_sessions(self) -> list[tuple[LogKey, SessionSnapshot, tuple[StreamPosition, ...]]]:
        rows = self.connection.execute(
            "SELECT origin, incarnation, snapshot FROM held_sessions ORDER BY 1, 2"
        )
        return [((origin, inc), *pickle.loads(blob)) for origin, inc, blob in rows]

    def persist(self, action: Persist) -> None:
        origin, incarnation = action.key
        rows = [
            (origin, incarnation, action.first_seq + offset, pickle.dumps(message))
            for offset, message in enumerate(action.messages)
        ]
        self.connection.executemany("INSERT OR REPLACE INTO held VALUES (?, ?, ?, ?)", rows)
        self.connection.commit()

    def drop(self, action: Drop) -> None:
        origin, incarnation = action.key
        if action.below_seq is None:
            self.connection.execute("DELETE FROM held WHERE origin = ? AND incarnation = ?", action.key)
        else:
            self.connection.execute(
                "DELETE FROM held WHERE origin = ? AND incarnation = ? AND seq < ?",
                (origin, incarnation, action.below_seq),
            )
        self.connection.commit()

    def load(self) -> list[tuple[LogKey, int, Message]]:
        rows = self.connection.execute("SELECT origin, incarnation, seq, message FROM held ORDER BY 1, 2, 3")
        return [((origin, inc), seq, pickle.loads(blob)) for origin, inc, seq, blob in rows]

    def close(self) -> None:
        self.connection.close()


class ReplicationNode:
    """One broker incarnation's replication: the pure core and what carries out its actions."""

    def __init__(self, sim: ReplicatedSimBroker, network: Network, members: list[str]) -> None:
        self.sim = sim
        self.scheduler = sim.scheduler
        self.peer_id = sim.peer_id
        self.members = members
        cluster = sim.config.cluster
        self.retransmit_s = cluster.retransmit_ms / 1000.0
        rng = sim.world.rng_for("replication", sim.peer_id, sim.incarnation)
        self.core = Replication(
            sim.peer_id,
            f"{rng.getrandbits(48):012x}",
            replicas=cluster.replicas,
            retransmit_s=self.retransmit_s,
            failover_after_s=sim.failover_after_s,
            retention_s=float(cluster.send_log_retention_s),
            started_empty=sim.started_empty,
        )
        self.disk = ReplicaDisk(os.path.join(sim.data_dir, "replicas.db"))
        for key, seq, message in self.disk.load():
            self.core.restore_held(key, seq, [message])
        for key, snapshot, positions in self.disk.load_sessions():
            self.core.restore_held_session(key, snapshot, positions)
        self.endpoint: PeerEndpoint = network.endpoint(sim.peer_id, self._on_receive, self._on_peer_down)
        self.network = network
        self.waiting: dict[int, Completion[bool]] = {}  # log seq -> the PUBACK it holds
        self.stream_entries: dict[int, list[StreamEntry]] = {}  # log seq -> its send-log entries
        self.release_from = 1
        self.taken_over = 0  # entries published again for a gone origin (figures for the tests)
        self.adopted = 0  # sessions adopted from a gone home
        self.replicated: dict[str, SessionSnapshot] = {}  # the state last given to the core
        self._claiming = False  # adopting for a claim answered here (or a CONNECT here)
        self.copies: dict[int, CopyFound] = {}  # lookup id -> the first copy a holder sent
        # lookup id -> (deadline, what to do): a CONNECT whose claim found no session waits until
        # no copy can still come (``when_no_copy_can_come``, as the broker's adapter does)
        self._copy_waits: dict[int, tuple[float, Callable[[], None]]] = {}
        # SUBACKs of persistent sessions held until the state with their subscriptions is on N
        # (``EngineReplication.session_copied``; the store's commit gave it to the core already)
        self.suback_waits = SessionCopyWaits(cluster.subscribe_wait_ms / 1000.0)
        self._suback_completions: dict[int, Completion[bool]] = {}

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        self.apply(self.core.start(self.members, self.scheduler.time()))
        self.sessions_committed()
        self.scheduler.call_later(self.retransmit_s, self._tick)

    def crash(self) -> None:
        self.network.process_died(self.peer_id)
        self.disk.close()

    def _tick(self) -> None:
        now = self.scheduler.time()
        self.apply(self.core.tick(now))
        self.sessions_committed()
        self._release(now)
        self.scheduler.call_later(self.retransmit_s, self._tick)

    # ------------------------------------------------------------------ SUBACKs held for N copies
    def session_copied(self, client_id: str) -> Completion[bool] | None:
        """Done once ``client_id``'s session state as committed now is on N brokers (at most
        ``cluster.subscribe_wait_ms``); None when there is nothing to wait for."""
        core = self.core
        version = core.session_version(client_id)
        if not self.sim.alive or core.session_durable_from(client_id, version):
            return None
        completion: Completion[bool] = Completion()
        wait_id = self.suback_waits.add(client_id, version, self.scheduler.time())
        self._suback_completions[wait_id] = completion
        self.scheduler.call_later(self.suback_waits.timeout_s, self._check_suback_waits)
        return completion

    def _check_suback_waits(self) -> None:
        waits = self.suback_waits
        if not self.sim.alive:
            finished = waits.abort_all()
        else:
            finished = waits.poll(self.core.session_durable_from) + waits.tick(self.scheduler.time())
        for wait_id, durable in finished:
            if not durable:
                self.sim.history_note("suback_copy_timed_out", wait_id)
            completion = self._suback_completions.pop(wait_id, None)
            if completion is not None and not completion.done():
                completion.set_result(durable)

    # ------------------------------------------------------------------ the origin's log
    def append(self, message: Message, entries: list[StreamEntry]) -> Completion[bool]:
        durable: Completion[bool] = Completion()
        seq, actions = self.core.append(message, self.scheduler.time())
        self.waiting[seq] = durable
        self.stream_entries[seq] = entries
        self.apply(actions)
        return durable

    def _release(self, now: float) -> None:
        sender = self.sim.engine.sender
        if sender is None:
            return
        start = self.release_from
        while self.release_from in self.stream_entries:
            entries = self.stream_entries[self.release_from]
            if any(sender.logged_from(key, seq)[1] <= seq for key, seq in entries):
                break  # still in the send log: a receiver broker may need it
            del self.stream_entries[self.release_from]
            self.release_from += 1
        if self.release_from > start:
            self.apply(self.core.released(self.release_from, now))

    # ------------------------------------------------------------------ the home's sessions
    def sessions_committed(self) -> None:
        """After each group commit of the broker (and each tick): every persistent session whose
        state changed since it was last given to the core is given again (ended ones as None)."""
        if not self.sim.alive:
            return
        broker = self.sim.broker
        now = self.scheduler.time()
        current: dict[str, SessionSnapshot] = {}
        for client_id, session in broker.sessions.items():
            if session.expiry_interval_s > 0 and not session.ended:
                snapshot = broker.export_session(client_id)
                if snapshot is not None:
                    current[client_id] = snapshot
        actions: list[ReplicationAction] = []
        for client_id, snapshot in current.items():
            if self.replicated.get(client_id) != snapshot:
                self.replicated[client_id] = snapshot
                positions = self._positions(snapshot)
                actions += self.core.session_changed(client_id, snapshot, now, positions)
        for client_id in [client_id for client_id in self.replicated if client_id not in current]:
            del self.replicated[client_id]
            actions += self.core.session_changed(client_id, None, now)
        self.apply(actions)

    def _positions(self, snapshot: SessionSnapshot) -> tuple[StreamPosition, ...]:
        """Where this broker stands in the streams of the session's classes (read only: what
        ``ClusterEngine._hand_over_positions`` names for a session that moves, without its
        catch-ups in progress)."""
        engine = self.sim.engine
        sender = engine.sender
        if sender is None:
            return ()
        classes = {engine.interest.class_of(sub.match_filter) for sub in snapshot.subscriptions}
        at = {key: seq for key, seq in engine.receiver.positions().items() if key[1] in classes}
        for cls in classes:
            at[(sender.origin, cls)] = sender.position(cls)
        return tuple(StreamPosition(origin, stream, seq) for (origin, stream), seq in sorted(at.items()))

    def lookup(self, client_id: str, until: Completion[SessionSnapshot | None]) -> int:
        """Ask the holders for a copy of ``client_id``'s session; asked again every
        ``LOOKUP_AGAIN_S`` until a copy came or ``until`` is done (a lost lookup: seed 358)."""
        lookup_id, actions = self.core.lookup(client_id)
        self.apply(actions)

        def again() -> None:
            self._check_copy_waits()
            if self.sim.alive and not until.done() and lookup_id not in self.copies:
                unanswered = set(self.core.lookup_unanswered(lookup_id))
                self.apply([a for a in actions if isinstance(a, SendReplica) and a.peer in unanswered])
                self.scheduler.call_later(LOOKUP_AGAIN_S, again)
            else:
                self.core.lookup_ended(lookup_id)

        self.scheduler.call_later(LOOKUP_AGAIN_S, again)
        return lookup_id

    def when_no_copy_can_come(self, lookup_id: int, deadline: float, then: Callable[[], None]) -> None:
        """The claim of the CONNECT that asked ``lookup_id`` found no session: ``then`` once a copy
        came, every member asked that is live in our view answered, or ``deadline`` passed
        (``EngineReplication.when_no_copy_can_come``)."""
        self._copy_waits[lookup_id] = (deadline, then)
        self._check_copy_waits()
        if lookup_id in self._copy_waits:
            self.scheduler.call_later(max(0.0, deadline - self.scheduler.time()), self._check_copy_waits)

    def _check_copy_waits(self) -> None:
        now = self.scheduler.time()
        for lookup_id, (deadline, then) in list(self._copy_waits.items()):
            if (
                not self.sim.alive
                or lookup_id in self.copies
                or self.core.lookup_answered(lookup_id)
                or now >= deadline
            ):
                if self._copy_waits.pop(lookup_id, None) is None:
                    continue  # (answered by a call that ``then`` made)
                self.core.lookup_ended(lookup_id)
                then()

    def take_copy(self, lookup_id: int, client_id: str) -> SessionSnapshot | None:
        """The copy a holder sent for ``lookup_id`` as the client's session here (the claim found
        none: its home did not answer); its positions go to the engine as a moved session's."""
        found = self.copies.pop(lookup_id, None)
        if not self.sim.alive:
            return None
        self._claiming = True
        try:
            # a copy held here as a current holder of the silent home: the newest (the broker's
            # adapter does the same, ``Replication.claimed``'s ``home_silent``)
            own = self.core.claimed(client_id, home_silent=True)
            self.apply(own)
        finally:
            self._claiming = False
        if found is None or own:
            return None
        copy = found.copy
        self.sim.history_note("copy_taken", copy.home, client_id, found.holder)
        if copy.positions:
            self.sim.engine._moved_positions[client_id] = copy.positions
        self.apply(self.core.copy_taken(found.holder, copy, client_id))
        return _copy.deepcopy(copy.snapshot)

    def claimed(self, client_id: str) -> None:
        """A takeover claim for ``client_id`` (or a CONNECT here): adopt a held copy whose home
        is gone first, so that the claim finds it."""
        if self.sim.alive:
            self._claiming = True
            try:
                self.apply(self.core.claimed(client_id))
            finally:
                self._claiming = False

    def _adopt(self, action: AdoptSessions) -> None:
        broker = self.sim.broker
        engine = self.sim.engine
        for index, snapshot in enumerate(action.snapshots):
            existed = broker.has_session(snapshot.client_id)
            # merged into a session the client made here meanwhile (nothing queued is lost); its
            # will kept unless a CONNECT of the client is adopting it (the client is back)
            broker.receive_late_session(_copy.deepcopy(snapshot), adopted=not self._claiming)
            self.sim.history_note("adopt", action.key[0], snapshot.client_id)
            positions = action.positions[index] if index < len(action.positions) else ()
            if positions:
                # what the gone home had not received yet: from the origins' send logs
                filters = [sub.match_filter for sub in snapshot.subscriptions] if existed else None
                engine._catch_up(snapshot.client_id, positions, filters)
        self.adopted += len(action.snapshots)
        client_ids = [snapshot.client_id for snapshot in action.snapshots]
        self.apply(self.core.sessions_adopted(action.key, client_ids))
        self.sessions_committed()  # replicated as this broker's own
        if self._claiming:
            return  # the claim being answered (or the CONNECT here) takes it
        takeover = engine.takeover
        for client_id in client_ids:
            # the client connected to a live broker before the copy was adopted: it goes there
            # (the engine's own path for a session that arrives after a newer claim); not to the
            # gone home's old claim
            newer = takeover.newest_remote_claim(client_id) if takeover is not None else None
            if newer is not None and newer[1] != action.key[0] and self.core.is_live(newer[1]):
                engine._pass_on_if_claimed_elsewhere(client_id)

    # ------------------------------------------------------------------ actions
    def apply(self, actions: list[ReplicationAction]) -> None:
        for action in actions:
            if isinstance(action, SendReplica):
                self.endpoint.send(action.peer, action.item)
            elif isinstance(action, Durable):
                for seq in range(action.first_seq, action.end_seq):
                    waiting = self.waiting.pop(seq, None)
                    if waiting is not None:
                        waiting.set_result(True)
            elif isinstance(action, Persist):
                self.disk.persist(action)
            elif isinstance(action, Drop):
                self.disk.drop(action)
            elif isinstance(action, TakeOver):
                self._take_over(action)
            elif isinstance(action, PersistSession):
                self.disk.persist_session(action)
            elif isinstance(action, DropSessions):
                self.disk.drop_sessions(action)
            elif isinstance(action, AdoptSessions):
                self._adopt(action)
            elif isinstance(action, CopyFound):
                # kept for a CONNECT still waiting (not "no copy here", nor late: never taken)
                if action.copy.snapshot is not None and self.core.lookup_open(action.lookup_id):
                    self.copies.setdefault(action.lookup_id, action)
                self._check_copy_waits()
        if self.suback_waits.waiting():
            self._check_suback_waits()

    def _take_over(self, action: TakeOver) -> None:
        """Publish a gone origin's entries again as this broker's own (the failover)."""
        router = self.sim.broker.router
        waits: list[Completion[bool]] = []
        for message in action.messages:
            again = replace(message, retain=False, origin=self.peer_id)
            result = router.publish(again, None)
            if result.wait is not None:
                waits.append(result.wait)
        self.taken_over += len(action.messages)
        self.sim.history_note("take_over", action.key[0], len(action.messages))
        pending = [len(waits)]

        def one_done(_done: object) -> None:
            pending[0] -= 1
            if pending[0] == 0 and self.sim.alive:
                self.apply(self.core.taken_over(action.key))

        if not waits:
            self.apply(self.core.taken_over(action.key))
        for wait in waits:
            wait.add_done_callback(one_done)

    # ------------------------------------------------------------------ network
    def _on_receive(self, sender: str, item: object) -> None:
        if self.sim.alive:
            self.apply(self.core.on_item(sender, _as_item(item), self.scheduler.time()))

    def _on_peer_down(self, peer: str) -> None:
        if self.sim.alive:
            self.apply(self.core.on_peer_down(peer, self.scheduler.time()))
            self._check_copy_waits()  # a member asked that will not answer now


def _as_item(item: object) -> ReplicaItem:
    return item  # type: ignore[return-value]  # only replication records travel this network


class ReplicatedCluster:
    """The cluster port of a replicating broker: the engine, plus the replication log."""

    def __init__(self, engine: ClusterEngine, node: ReplicationNode) -> None:
        self.engine = engine
        self.node = node

    def on_publish(self, message: Message, from_client_id: str | None) -> Completion[bool] | None:
        engine = self.engine
        sender = engine.sender
        if message.qos == 0 or message.topic.startswith("$SYS") or sender is None:
            return engine.on_publish(message, from_client_id)
        classes = topic_classes(message.topic, engine.interest.class_levels)
        before = {cls: sender.position(cls) for cls in classes}
        wait = engine.on_publish(message, from_client_id)
        entries = [((sender.origin, cls), seq) for cls, seq in before.items() if sender.position(cls) > seq]
        durable = self.node.append(message, entries)
        return both_done(wait, durable)

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        self.engine.on_subscribe(client_id, topic_filter, share_group, qos)

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        self.engine.on_unsubscribe(client_id, topic_filter, share_group)

    def before_attach(
        self, client_id: str, clean_start: bool, username: str | None = None
    ) -> Completion[SessionSnapshot | None] | None:
        node = self.node
        node.claimed(client_id)  # a copy held here of a gone home: a local session now
        wait = self.engine.before_attach(client_id, clean_start, username)
        if clean_start or node.core.replicas <= 1 or wait is None:
            return wait
        # beside the claim: a holder's copy, used if the claim finds no session (its home did
        # not answer within the CONNECT's wait - gone, or not yet reported down)
        result: Completion[SessionSnapshot | None] = Completion()
        lookup_id = node.lookup(client_id, result)
        takeover = self.engine.takeover
        deadline = node.scheduler.time() + (takeover.wait_s if takeover is not None else 0.0)

        def claim_done(done: Completion[SessionSnapshot | None]) -> None:
            error = done.exception()
            if error is not None:
                node.copies.pop(lookup_id, None)
                node.core.lookup_ended(lookup_id)
                result.set_exception(error)
                return
            snapshot = done.result()
            if snapshot is None:
                # a holder's copy may still be on its way (its claim answer said "no session")
                node.when_no_copy_can_come(lookup_id, deadline, take_copy)
                return
            node.copies.pop(lookup_id, None)
            node.core.lookup_ended(lookup_id)
            result.set_result(snapshot)

        def take_copy() -> None:
            snapshot = node.take_copy(lookup_id, client_id)
            result.set_result(snapshot)
            if snapshot is not None:
                # the copy's positions catch the session up right after its import, as a claim
                # reply's do (``_apply_moved_positions``), not at the CONNACK: a message published
                # here in between went live into the session ahead of what came before it
                # (seeds 197, 759 and 849 of the --sessions sweep)
                node.scheduler.call_soon(self.engine._apply_moved_positions, client_id)

        wait.add_done_callback(claim_done)
        return result

    def owns_share_group(self, group: str, topic_filter: str) -> bool:
        return self.engine.owns_share_group(group, topic_filter)

    def subscriptions_ready(
        self, topic_filters: list[tuple[str, str | None]], client_id: str | None = None
    ) -> Completion[bool] | None:
        ready = self.engine.subscriptions_ready(topic_filters)
        if client_id is None or self.node.core.replicas <= 1:
            return ready
        copied = self.node.session_copied(client_id)  # seed 004's "durable on N"
        return copied if ready is None else both_done(ready, copied) if copied is not None else ready

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        self.engine.on_client_connected(client_id, session_present)

    def on_client_disconnected(self, client_id: str) -> None:
        self.engine.on_client_disconnected(client_id)


class ReplicatedSimBroker(SimBroker):
    """A simulated broker whose QoS >= 1 publishes are acknowledged once durable on
    ``cluster.replicas`` brokers (its settings). ``started_empty``: its data directory held no
    store when it started."""

    def __init__(
        self,
        world: World,
        network: Network,
        peer_id: str,
        data_dir: str,
        *,
        replica_network: Network,
        members: list[str],
        failover_after_s: float,
        history_note: Any = None,
        **options: Any,
    ) -> None:
        self.started_empty = not os.path.exists(os.path.join(data_dir, "skipmq.db"))
        self.leaving = False
        self.failover_after_s = failover_after_s
        self._replica_network = replica_network
        self._members = members
        self.history_note = history_note or (lambda *event: None)
        super().__init__(world, network, peer_id, data_dir, **options)
        self._observe_broker()

    def _cluster_port(self) -> ClusterPort:
        os.makedirs(self.data_dir, exist_ok=True)
        self.replication = ReplicationNode(self, self._replica_network, self._members)
        return ReplicatedCluster(self.engine, self.replication)

    def _observe_broker(self) -> None:
        """Two observation points on the broker core (wrapped, not replaced): after each commit of
        its store the persistent sessions that changed are replicated; a takeover claim answered
        here first adopts a held copy of the client's session whose home is gone."""
        broker = self.broker
        store_commit = self.store.commit
        hand_over = broker.hand_over

        def commit_then_replicate() -> None:
            store_commit()
            if self.alive:
                self.replication.sessions_committed()

        def adopt_then_hand_over(client_id: str, *, transfer: bool) -> tuple[bool, SessionSnapshot | None]:
            self.replication.claimed(client_id)
            return hand_over(client_id, transfer=transfer)

        self.store.commit = commit_then_replicate  # type: ignore[method-assign]
        broker.hand_over = adopt_then_hand_over  # type: ignore[method-assign]

    def start(self, contacts: list[str]) -> None:
        super().start(contacts)
        self.replication.start()

    def accept(self, socket: SimSocket) -> ClientConnection | None:
        if self.leaving:
            return None  # a draining broker's listeners are closed
        return super().accept(socket)

    def drain(self) -> None:
        """The first steps of a graceful removal (SIGTERM with a drain): no new clients, every
        client disconnected (v5 0x8B: they reconnect to another broker, whose takeover claim moves
        their sessions from here), and the replication's :meth:`~Replication.leave`. The process
        exits once :meth:`drained` (the run decides; a grace period bounds the wait)."""
        if not self.alive or self.leaving:
            return
        self.leaving = True
        self.broker.disconnect_all()
        node = self.replication
        node.apply(node.core.leave(self.scheduler.time()))

    def drained(self) -> bool:
        return self.alive and self.replication.core.drained()

    def crash(self) -> None:
        if not self.alive:
            return
        super().crash()
        self.replication.crash()
