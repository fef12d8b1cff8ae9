"""Replicated send log (``cluster.replicas = N``): the pure core of one broker, as an origin of
its own log and as a replica holder of other brokers' logs (docs/notes/replication.md).

Seed 004's stages (§2.4) over a *replica group*: an origin O and its N-1 holders, the next N-1
live brokers after O on the ring of peer ids (:meth:`Replication.holders_of`).

* **Origin.** Every QoS >= 1 publish O accepts is an entry of O's log (numbered 1, 2, ... per
  incarnation, no gaps: §3.1's SEQ) sent to each holder; a holder's cumulative
  :class:`ReplicaAck` is its acceptance (AL: everything below is on its disk). The
  pre-acknowledgement condition of §3.4, ``seq < min AL`` over the current holders, is
  "durable on N": :class:`Durable` releases the publishers' PUBACKs. What a holder has not
  acknowledged is sent again every ``retransmit_s`` (§3.3's retransmission, cumulative).
* **Acknowledgement** (§3.5): once O's send log no longer needs entries (every receiver broker took
  them; the adapter says so with :meth:`Replication.released`), O sends a :class:`ReplicaRelease`
  and the holders drop them.
* **Holder.** Entries are accepted in order only (a gap waits for the retransmission), persisted
  (:class:`Persist`, committed before the ack that follows it) and kept until released.
* **Failover.** When O's incarnation is gone - O came back having *started empty* (its disk lost),
  or O has been reported down for ``failover_after_s`` (removed for good) - a holder publishes
  what it holds again as its own publishes (:class:`TakeOver`), then drops it
  (:meth:`Replication.taken_over`). An incarnation of O that restored its disk delivers its own
  log; the holders drop the older incarnation's entries after ``retention_s``.
* **Re-replication.** A holder reported down leaves O's holder set: the next live broker on the
  ring becomes a holder and gets every entry O has not released; a holder that comes back having
  started empty gets them again. PUBACKs waiting on a gone holder are released by its successor.

* **Sessions.** The home broker's persistent sessions (subscriptions, queued and in-flight
  messages, QoS 2 state, will, expiry: a ``SessionSnapshot``) go to the same holders as its log,
  the latest state of each (:meth:`Replication.session_changed`, versions increasing per
  incarnation; a holder keeps the highest and acknowledges it). When the home is gone the holder
  *adopts* them (:class:`AdoptSessions`: they become its own stored sessions, which the cluster's
  takeover claim hands to a client reconnecting to any broker) before publishing the log again.
* **Graceful removal** (:meth:`Replication.leave`, :meth:`Replication.drained`): the leaving broker
  tells every member; each origin it held for sends its log and sessions to its next holder and
  answers :class:`ReplicaHandedOver` once they are accepted there; what it holds of origins that
  are down it takes over itself. When it exits, its own holders take its log and sessions over at
  once (no failover wait).

Not here yet: a bound on how long a publisher waits when fewer than N brokers are reachable.

Size: one object on purpose - the origin's log, the held logs, the sessions of both sides and the
graceful removal all read and change the same membership view and holder set (who is live, who
is leaving, who holds what), which must agree with itself at every event.

Pure: events and ``now`` in, actions out (``broker.cluster.replication_messages``); no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.cluster.messages import StreamPosition
from broker.cluster.replication_messages import (
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
    ReplicaHandedOver,
    ReplicaHello,
    ReplicaItem,
    ReplicaLeaving,
    ReplicaRelease,
    ReplicationAction,
    SendReplica,
    SessionAck,
    SessionCopy,
    SessionCopyTaken,
    SessionDurable,
    SessionLookup,
    SessionReplica,
    TakeOver,
)
from broker.core.messages import Message, SessionSnapshot

RESEND_BATCH = 256  # entries per ReplicaAppend sent again (one batch, like a stream's resend)
# a session adopted here and then handed on (to a takeover claim) is still given to lookups this
# long: longer than a CONNECT's claim wait (``cluster.takeover_wait_ms``, 500 ms by default)
HANDED_COPY_KEPT_S = 2.0


class _Held:
    """What this broker holds of one origin incarnation: its log and its persistent sessions."""

    __slots__ = ("entries", "gone", "next_seq", "session_positions", "session_versions", "sessions")

    def __init__(self) -> None:
        self.entries: dict[int, Message] = {}
        self.next_seq = 1  # AL: every entry below is on disk here (or was released)
        self.gone = False  # taken over (or handed over): nothing more is held of it
        self.sessions: dict[str, SessionSnapshot] = {}
        self.session_versions: dict[str, int] = {}  # highest version accepted (deleted ones too)
        self.session_positions: dict[str, tuple[StreamPosition, ...]] = {}

    def adopt(self, client_ids: list[str], key: LogKey) -> AdoptSessions:
        snapshots = tuple(self.sessions[client_id] for client_id in client_ids)
        positions = tuple(self.session_positions.get(client_id, ()) for client_id in client_ids)
        return AdoptSessions(key, snapshots, positions)


class _Adopted:
    """A session this broker adopted from a gone home: its latest state here, kept for lookups
    for ``handed_copy_kept_s`` after it was handed on (its claim's reply may come too late)."""

    __slots__ = ("handed", "key", "positions", "since", "snapshot")

    def __init__(
        self, key: LogKey, snapshot: SessionSnapshot, positions: tuple[StreamPosition, ...], now: float
    ) -> None:
        self.key = key
        self.snapshot = snapshot
        self.positions = positions
        self.since = now  # adopted, or (``handed``) handed on
        self.handed = False


class Replication:
    """One broker's replication state. ``replicas`` is N (1: nothing is replicated, every entry is
    durable at once - today's behaviour)."""

    def __init__(
        self,
        peer_id: str,
        incarnation: str,
        *,
        replicas: int,
        retransmit_s: float,
        failover_after_s: float,
        retention_s: float,
        started_empty: bool,
        handed_copy_kept_s: float = HANDED_COPY_KEPT_S,
    ) -> None:
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        self.peer_id = peer_id
        self.incarnation = incarnation
        self.replicas = replicas
        self.retransmit_s = retransmit_s
        self.failover_after_s = failover_after_s
        self.retention_s = retention_s
        self.started_empty = started_empty
        self.handed_copy_kept_s = handed_copy_kept_s
        self._now = 0.0  # the latest ``now`` of an event (for the calls that carry none)
        self._members: set[str] = {peer_id}
        # members this incarnation heard from and not reported down since: only they hold replicas
        # (a member that never answers - removed, or not started - is never waited for)
        self._live: set[str] = {peer_id}
        self._down: dict[str, float] = {}  # peer -> reported down since
        self._hello_at: dict[str, float] = {}  # member not heard from -> when it was last greeted
        self._incarnation_of: dict[str, str] = {}
        # origin side
        self._log: dict[int, Message] = {}  # seq -> entry not released yet
        self._next_seq = 1
        self._released = 1  # entries below are released (acknowledged, §3.5)
        self._durable = 1  # entries below were reported Durable (pre-acknowledged, §3.4)
        self._al: dict[str, int] = {}  # holder -> its acceptance (next seq it expects)
        self._sent_to: dict[str, int] = {}  # holder -> next seq sent to it
        # holder -> when it last made progress (acknowledged more) or was sent its unacknowledged
        # entries again; sending it *new* entries does not count (seed 536: a publisher faster than
        # the retransmit period kept a holder's gap from ever being filled)
        self._progress_at: dict[str, float] = {}
        self._replicated_to: set[str] = set()  # peers that may hold entries of this log
        self._release_sent: dict[str, int] = {}
        # holder side
        self._held: dict[LogKey, _Held] = {}
        self._expires: dict[LogKey, float] = {}  # superseded logs dropped at that time
        # sessions, home side: client id -> (latest version, its state; None: ended)
        self._sessions: dict[str, tuple[int, SessionSnapshot | None]] = {}
        self._session_positions: dict[str, tuple[StreamPosition, ...]] = {}
        self._session_version = 0
        self._session_al: dict[str, dict[str, int]] = {}  # holder -> client id -> version accepted
        self._session_sent: dict[str, dict[str, tuple[int, float]]] = {}  # ... -> (version, when)
        self._session_durable: dict[str, int] = {}  # client id -> version durable on N
        self._adopted: dict[str, _Adopted] = {}  # sessions adopted from gone homes, recently
        # graceful removal
        self.leaving = False  # this broker drains (:meth:`leave`)
        self._leaving: set[str] = set()  # members that said they are leaving
        # leaving member -> (our log's next seq, our sessions' versions) when it said so: it is
        # answered ReplicaHandedOver once all of that is durable on N without it
        self._owe_handover: dict[str, tuple[int, dict[str, int]]] = {}
        self._handed_over: set[str] = set()  # origins that answered our leave
        self._lookups = 0
        self._unanswered: dict[int, set[str]] = {}  # lookup id -> members asked, not answered yet

    # ------------------------------------------------------------------ membership
    def start(self, members: Iterable[str], now: float) -> list[ReplicationAction]:
        """This incarnation starts among ``members``: tell each one who we are."""
        self._members.update(members)
        for origin, _incarnation in self._held:
            # a log restored from disk whose origin does not answer is taken over after
            # ``failover_after_s``, as if it had been reported down at our start
            self._members.add(origin)
            self._down.setdefault(origin, now)
        hello = ReplicaHello(self.incarnation, self.started_empty, wants_reply=True)
        others = [peer for peer in sorted(self._members) if peer != self.peer_id]
        for peer in others:
            self._hello_at[peer] = now
        return [SendReplica(peer, hello) for peer in others]

    def meet(self, peers: Iterable[str], now: float) -> list[ReplicationAction]:
        """Brokers learnt of after :meth:`start` (a broker process hears of members through its
        cluster links): greeted as ``start`` greets, and again while silent (``_greet_silent``)."""
        new = sorted({peer for peer in peers if peer != self.peer_id and peer not in self._members})
        if not new:
            return []
        self._members.update(new)
        hello = ReplicaHello(self.incarnation, self.started_empty, wants_reply=True)
        for peer in new:
            self._hello_at[peer] = now
        return [SendReplica(peer, hello) for peer in new]

    def _greet_silent(self, now: float) -> list[ReplicationAction]:
        """A hello again, every ``retransmit_s``, to each member not heard from (a lost hello
        would otherwise leave two brokers each waiting for the other to speak first)."""
        hello = ReplicaHello(self.incarnation, self.started_empty, wants_reply=True)
        actions: list[ReplicationAction] = []
        for peer in sorted(self._members - self._live):
            if now - self._hello_at.get(peer, now - self.retransmit_s) >= self.retransmit_s:
                self._hello_at[peer] = now
                actions.append(SendReplica(peer, hello))
        return actions

    def holders_of(self, origin: str) -> list[str]:
        """The N-1 live brokers after ``origin`` on the ring of peer ids (this broker's view)."""
        ring = sorted(self._members | {origin})
        start = ring.index(origin)
        holders: list[str] = []
        for step in range(1, len(ring)):
            if len(holders) >= self.replicas - 1:
                break
            peer = ring[(start + step) % len(ring)]
            if peer in self._live and peer != origin and peer not in self._leaving:
                holders.append(peer)
        return holders

    def is_live(self, peer: str) -> bool:
        """``peer`` was heard from and not reported down since (this broker's view)."""
        return peer in self._live

    def on_peer_down(self, peer: str, now: float) -> list[ReplicationAction]:
        """The link to ``peer`` broke (its process died, or keep-alive gave up across a cut)."""
        if peer == self.peer_id or peer in self._down:
            return []
        self._members.add(peer)
        self._live.discard(peer)
        self._down[peer] = now
        actions = self._send_due(now, force=True) + self._send_sessions(now, force=True)
        actions += self._check_durable() + self._check_sessions()
        if peer in self._leaving:
            # removed gracefully: its log and sessions are gone now, no failover wait
            for key, held in sorted(self._held.items()):
                if key[0] == peer and not held.gone:
                    actions += self._take_over(key, held)
        return actions

    def _heard_from(self, peer: str, now: float) -> list[ReplicationAction]:
        actions: list[ReplicationAction] = []
        if peer not in self._live:
            self._members.add(peer)
            self._live.add(peer)
            self._down.pop(peer, None)
            actions += self._send_due(now, force=True) + self._send_sessions(now, force=True)
        return actions

    # ------------------------------------------------------------------ origin
    def append(self, message: Message, now: float) -> tuple[int, list[ReplicationAction]]:
        """A QoS >= 1 publish accepted here: its entry number, and what to do. With N = 1 it is
        durable at once (its commit here is the one copy)."""
        seq = self._next_seq
        self._next_seq = seq + 1
        if self.replicas <= 1:
            self._released = self._durable = self._next_seq
            return seq, [Durable(seq, seq + 1)]
        self._log[seq] = message
        return seq, self._send_due(now, force=False) + self._check_durable()

    def released(self, upto: int, now: float) -> list[ReplicationAction]:
        """Entries below ``upto`` are no longer needed by this broker's send log (every receiver
        broker took them): seed 004 §3.5's acknowledgement - the holders may drop them."""
        upto = min(upto, self._next_seq)
        if upto <= self._released:
            return []
        for seq in range(self._released, upto):
            self._log.pop(seq, None)
        self._released = upto
        actions = self._check_durable()
        return actions + self._send_releases()

    def durable_upto(self) -> int:
        """Entries below are durable on N (pre-acknowledged)."""
        return self._durable

    def under_replicated(self) -> int:
        """Entries of this broker's log not on N brokers yet (the metric's figure)."""
        return self._next_seq - self._durable

    def _send_due(self, now: float, *, force: bool) -> list[ReplicationAction]:
        """Send each current holder what it lacks: new entries at once; again (§3.3) when
        ``retransmit_s`` passed since the last send to it, or ``force`` (its holder set changed)."""
        if self.replicas <= 1:
            return []
        actions: list[ReplicationAction] = []
        for holder in self.holders_of(self.peer_id):
            acked = max(self._al.get(holder, 1), self._released)
            if acked >= self._next_seq:
                continue
            sent = self._sent_to.get(holder, 1)
            progress = self._progress_at.get(holder)
            if force or progress is None or now - progress >= self.retransmit_s:
                # a new holder, its holder set changed, or no progress for a retransmit period
                # (§3.3): from what it accepted; the retransmission timer starts again
                first = acked
                self._progress_at[holder] = now
            elif sent < self._next_seq:
                first = max(sent, acked)  # only what was never sent to it (the timer runs on)
            else:
                continue
            end = min(self._next_seq, first + RESEND_BATCH)
            messages = tuple(self._log[seq] for seq in range(first, end))
            item = ReplicaAppend(self.incarnation, first, messages, self._released)
            actions.append(SendReplica(holder, item))
            self._sent_to[holder] = max(sent, end)
            self._replicated_to.add(holder)
        return actions

    def _check_durable(self) -> list[ReplicationAction]:
        holders = self.holders_of(self.peer_id)
        if len(holders) < self.replicas - 1:
            reach = self._released  # fewer live brokers than N: only what every receiver took
        else:
            reach = min((self._al.get(holder, 1) for holder in holders), default=self._next_seq)
            reach = max(reach, self._released)
        reach = min(reach, self._next_seq)
        if reach <= self._durable:
            return []
        first, self._durable = self._durable, reach
        return [Durable(first, reach)]

    def _send_releases(self) -> list[ReplicationAction]:
        actions: list[ReplicationAction] = []
        release = ReplicaRelease(self.incarnation, self._released)
        for peer in sorted(self._replicated_to):
            if peer not in self._down and self._release_sent.get(peer, 1) < self._released:
                self._release_sent[peer] = self._released
                actions.append(SendReplica(peer, release))
        return actions

    # ------------------------------------------------------------------ from other brokers
    def on_item(self, peer: str, item: ReplicaItem, now: float) -> list[ReplicationAction]:
        self._now = max(self._now, now)
        actions = self._heard_from(peer, now)
        if isinstance(item, ReplicaAppend):
            actions += self._on_append(peer, item)
        elif isinstance(item, ReplicaAck):
            actions += self._on_ack(peer, item, now)
        elif isinstance(item, ReplicaRelease):
            actions += self._on_release(peer, item)
        elif isinstance(item, ReplicaHello):
            actions += self._on_hello(peer, item, now)
        elif isinstance(item, SessionReplica):
            actions += self._on_session(peer, item)
        elif isinstance(item, SessionAck):
            actions += self._on_session_ack(peer, item)
        elif isinstance(item, ReplicaLeaving):
            actions += self._on_leaving(peer, item, now)
        elif isinstance(item, ReplicaHandedOver):
            actions += self._on_handed_over(peer, item)
        elif isinstance(item, SessionLookup):
            actions += self._on_lookup(peer, item, now)
        elif isinstance(item, SessionCopy):
            unanswered = self._unanswered.get(item.lookup_id)
            if unanswered is not None:
                unanswered.discard(peer)
            actions.append(CopyFound(item.lookup_id, peer, item))
        elif isinstance(item, SessionCopyTaken):
            actions += self._on_copy_taken(item)
        return actions

    def _on_hello(self, peer: str, hello: ReplicaHello, now: float) -> list[ReplicationAction]:
        actions: list[ReplicationAction] = []
        if hello.wants_reply:
            answer = ReplicaHello(self.incarnation, self.started_empty, wants_reply=False)
            actions.append(SendReplica(peer, answer))
        known = self._incarnation_of.get(peer)
        self._incarnation_of[peer] = hello.incarnation
        if known == hello.incarnation:
            return actions
        # as an origin: a holder that lost its disk has none of our entries any more
        if hello.started_empty and (peer in self._al or peer in self._sent_to):
            self._al[peer] = 1
            self._sent_to[peer] = 1
            self._progress_at.pop(peer, None)
            self._release_sent.pop(peer, None)
            actions += self._send_due(now, force=True)
        if hello.started_empty and (peer in self._session_al or peer in self._session_sent):
            self._session_al.pop(peer, None)
            self._session_sent.pop(peer, None)
            actions += self._send_sessions(now, force=True)
        # a new incarnation of a member that had said it was leaving: it is back as a member
        self._leaving.discard(peer)
        # as a holder: the logs of the peer's earlier incarnations
        for key, held in sorted(self._held.items()):
            if key[0] != peer or key[1] == hello.incarnation or held.gone:
                continue
            if hello.started_empty:
                actions += self._take_over(key, held)
            else:
                self._expires.setdefault(key, now + self.retention_s)
        return actions

    def _held_for(self, peer: str, incarnation: str) -> _Held | None:
        """What we hold of ``peer``'s ``incarnation`` (made on first use); None: a late copy from
        an incarnation its successor already replaced, or one already taken over."""
        key = (peer, incarnation)
        held = self._held.get(key)
        if held is None:
            if self._incarnation_of.get(peer, incarnation) != incarnation:
                return None
            held = self._held[key] = _Held()
        return None if held.gone else held

    def _on_append(self, peer: str, append: ReplicaAppend) -> list[ReplicationAction]:
        key = (peer, append.incarnation)
        held = self._held_for(peer, append.incarnation)
        if held is None:
            return []
        actions: list[ReplicationAction] = []
        if append.released > held.next_seq:
            held.next_seq = append.released
        actions += self._drop_below(key, held, append.released)
        accepted: list[Message] = []
        first = held.next_seq
        for offset, message in enumerate(append.messages):
            seq = append.first_seq + offset
            if seq < held.next_seq:
                continue  # a duplicate: acknowledged again below
            if seq > held.next_seq:
                break  # a gap: wait for the retransmission (cumulative acceptance)
            held.entries[seq] = message
            held.next_seq = seq + 1
            accepted.append(message)
        if accepted:
            actions.append(Persist(key, first, tuple(accepted)))
        actions.append(SendReplica(peer, ReplicaAck(append.incarnation, held.next_seq)))
        return actions

    def _on_ack(self, peer: str, ack: ReplicaAck, now: float) -> list[ReplicationAction]:
        if ack.incarnation != self.incarnation:
            return []
        if ack.next_seq > self._al.get(peer, 1):
            self._al[peer] = ack.next_seq
            self._progress_at[peer] = now
        return self._check_durable() + self._answer_leaving()

    def _on_release(self, peer: str, release: ReplicaRelease) -> list[ReplicationAction]:
        key = (peer, release.incarnation)
        held = self._held.get(key)
        if held is None or held.gone:
            return []
        if release.upto > held.next_seq:
            held.next_seq = release.upto
        return self._drop_below(key, held, release.upto)

    def _drop_below(self, key: LogKey, held: _Held, upto: int) -> list[ReplicationAction]:
        stale: list[int] = []
        for seq in held.entries:  # in ascending order: appended, and restored, in log order
            if seq >= upto:
                break  # (not a scan of every entry held on each append: a holder's CPU)
            stale.append(seq)
        if not stale:
            return []
        for seq in stale:
            del held.entries[seq]
        return [Drop(key, upto)]

    # ------------------------------------------------------------------ sessions (home side)
    def session_changed(
        self,
        client_id: str,
        snapshot: SessionSnapshot | None,
        now: float,
        positions: tuple[StreamPosition, ...] = (),
    ) -> list[ReplicationAction]:
        """The persistent session ``client_id`` of this broker changed (subscriptions, queued or
        in-flight messages, QoS 2 state, will, expiry): ``snapshot`` is its whole state now; None:
        it ended here (clean start, expired, moved to another broker). ``positions``: where this
        broker stands in the streams of its classes (what it received is in the snapshot). The
        holders keep the latest state; :class:`SessionDurable` says when this version is on N."""
        self._now = max(self._now, now)
        adopted = self._adopted.get(client_id)
        if adopted is not None:
            if snapshot is not None:  # ours (again): it answers the claim itself
                adopted.snapshot, adopted.positions, adopted.handed = snapshot, positions, False
            else:  # handed on (or ended): answered to lookups for a while from now
                adopted.handed, adopted.since = True, now
        self._session_version += 1
        version = self._session_version
        if self.replicas <= 1:
            return [SessionDurable(client_id, version)]
        self._sessions[client_id] = (version, snapshot)
        self._session_positions[client_id] = positions
        return self._send_sessions(now, force=False, only=client_id) + self._check_sessions()

    def session_version(self, client_id: str) -> int:
        """The version of ``client_id``'s latest state given here (0: none, or ended and forgotten)."""
        latest = self._sessions.get(client_id)
        return latest[0] if latest is not None else 0

    def session_durable_from(self, client_id: str, version: int) -> bool:
        """State ``version`` of ``client_id`` (or a later one) is on N brokers - seed 004's
        acknowledgement stage, which a persistent session's SUBACK waits for - or it cannot be
        yet: fewer than N brokers are live (no wait then), or the session is not ours."""
        if client_id not in self._sessions or self.replicas <= 1:
            return True
        if len(self.holders_of(self.peer_id)) < self.replicas - 1:
            return True
        return self._session_durable.get(client_id, 0) >= version

    def session_on_n(self, client_id: str, version: int) -> bool:
        """State ``version`` of ``client_id`` (or a later one) was accepted by N - 1 holders (or
        the session is not ours, or one copy is asked for): :meth:`session_durable_from` without
        its "fewer than N live" excuse - what tells a SUBACK that left with its copy from one that
        left without it (the metric ``skipmq_cluster_replication_session_acks_uncopied_total``)."""
        if client_id not in self._sessions or self.replicas <= 1:
            return True
        return self._session_durable.get(client_id, 0) >= version

    def session_durable(self, client_id: str) -> bool:
        """The latest state of ``client_id`` is on N brokers (or it is not a session of ours)."""
        latest = self._sessions.get(client_id)
        return latest is None or self._session_durable.get(client_id, 0) >= latest[0]

    def under_replicated_sessions(self) -> int:
        """Sessions of this broker whose latest state is not on N brokers yet (the metric's figure)."""
        return sum(1 for client_id in self._sessions if not self.session_durable(client_id))

    def _send_sessions(self, now: float, *, force: bool, only: str | None = None) -> list[ReplicationAction]:
        """Send each holder the latest state of every session it lacks; again (§3.3) after
        ``retransmit_s`` without its acceptance, or at once when ``force`` (holder set changed)."""
        if self.replicas <= 1 or not self._sessions:
            return []
        actions: list[ReplicationAction] = []
        clients = [only] if only is not None else sorted(self._sessions)
        for holder in self.holders_of(self.peer_id):
            accepted = self._session_al.setdefault(holder, {})
            sent = self._session_sent.setdefault(holder, {})
            for client_id in clients:
                version, snapshot = self._sessions[client_id]
                if accepted.get(client_id, 0) >= version:
                    continue
                last = sent.get(client_id)
                if (
                    not force
                    and last is not None
                    and last[0] >= version
                    and now - last[1] < self.retransmit_s
                ):
                    continue
                sent[client_id] = (version, now)
                positions = self._session_positions.get(client_id, ())
                item = SessionReplica(self.incarnation, client_id, version, snapshot, positions)
                actions.append(SendReplica(holder, item))
        return actions

    def _check_sessions(self) -> list[ReplicationAction]:
        holders = self.holders_of(self.peer_id)
        if len(holders) < self.replicas - 1:
            return []  # fewer live brokers than N: no session change is durable on N
        actions: list[ReplicationAction] = []
        for client_id, (version, snapshot) in sorted(self._sessions.items()):
            if self._session_durable.get(client_id, 0) >= version:
                continue
            if all(self._session_al.get(holder, {}).get(client_id, 0) >= version for holder in holders):
                self._session_durable[client_id] = version
                actions.append(SessionDurable(client_id, version))
                if snapshot is None:  # ended, and its holders know: forget it
                    del self._sessions[client_id]
                    del self._session_durable[client_id]
                    self._session_positions.pop(client_id, None)
                    for accepted in self._session_al.values():
                        accepted.pop(client_id, None)
                    for sent in self._session_sent.values():
                        sent.pop(client_id, None)
        return actions

    def _on_session_ack(self, peer: str, ack: SessionAck) -> list[ReplicationAction]:
        if ack.incarnation != self.incarnation:
            return []
        accepted = self._session_al.setdefault(peer, {})
        if ack.version > accepted.get(ack.client_id, 0):
            accepted[ack.client_id] = ack.version
        return self._check_sessions() + self._answer_leaving()

    # ------------------------------------------------------------------ sessions (holder side)
    def _on_session(self, peer: str, item: SessionReplica) -> list[ReplicationAction]:
        held = self._held_for(peer, item.incarnation)
        if held is None:
            return []
        key = (peer, item.incarnation)
        actions: list[ReplicationAction] = []
        if item.version > held.session_versions.get(item.client_id, 0):
            held.session_versions[item.client_id] = item.version
            if item.snapshot is None:
                held.sessions.pop(item.client_id, None)
                held.session_positions.pop(item.client_id, None)
            else:
                held.sessions[item.client_id] = item.snapshot
                held.session_positions[item.client_id] = item.positions
            actions.append(PersistSession(key, item.client_id, item.snapshot, item.positions))
        accepted = held.session_versions[item.client_id]
        actions.append(SendReplica(peer, SessionAck(item.incarnation, item.client_id, accepted)))
        return actions

    # ------------------------------------------------------------------ sessions: a CONNECT elsewhere
    def lookup(self, client_id: str) -> tuple[int, list[ReplicationAction]]:
        """A CONNECT with clean start 0 for ``client_id`` here: ask every member for a held
        copy of its session (beside the takeover claim, which asks the session's home). The
        copies come back as :class:`CopyFound`; the adapter uses one only if the claim found no
        session, and then calls :meth:`copy_taken`."""
        self._lookups += 1
        item = SessionLookup(self._lookups, client_id)
        # every member, not only those live in our view: just after a heal a holder may not have
        # been heard from again yet (seed 358 of the --sessions sweep)
        peers = sorted(self._members - {self.peer_id})
        self._unanswered[self._lookups] = set(peers)
        return self._lookups, [SendReplica(peer, item) for peer in peers]

    def lookup_answered(self, lookup_id: int) -> bool:
        """Every member asked by ``lookup_id`` that is live in our view answered it (with a copy or
        with none): no copy is still on its way. The takeover claim's answers do not tell that: a
        holder answers the claim "no session" while the copy's home is live in *its* view (it has
        not yet seen the home's link break), and its copy, answering the lookup, may arrive after
        the claim is done (test_replicated_sessions.py: session present False, 3,473 lost)."""
        unanswered = self._unanswered.get(lookup_id)
        return not unanswered or not unanswered & self._live

    def lookup_unanswered(self, lookup_id: int) -> list[str]:
        """The members asked by ``lookup_id`` that have not answered it (asked again)."""
        return sorted(self._unanswered.get(lookup_id, ()))

    def lookup_open(self, lookup_id: int) -> bool:
        """The CONNECT that asked ``lookup_id`` is not answered yet (a copy now may be taken)."""
        return lookup_id in self._unanswered

    def lookup_ended(self, lookup_id: int) -> None:
        """The CONNECT that asked is answered: later answers are not waited for."""
        self._unanswered.pop(lookup_id, None)

    def copy_taken(self, holder: str, copy: SessionCopy, client_id: str) -> list[ReplicationAction]:
        """The copy of ``holder`` became the client's session here: the holder drops it."""
        return [SendReplica(holder, SessionCopyTaken(copy.incarnation, copy.home, client_id))]

    def _on_lookup(self, peer: str, item: SessionLookup, now: float) -> list[ReplicationAction]:
        actions: list[ReplicationAction] = []
        for key, held in sorted(self._held.items()):
            snapshot = held.sessions.get(item.client_id)
            if held.gone or snapshot is None or key[0] == peer:
                continue
            holders = self.holders_of(key[0])
            if holders and self.peer_id not in holders:
                # a copy left here from before the home's holders changed (held while the home's
                # next broker was down; that one is back and holds the newest): not answered
                # with, as it is not adopted (``EngineReplication._adopt``) - its older queue and
                # positions made the asking broker deliver what the home had delivered again
                continue
            positions = held.session_positions.get(item.client_id, ())
            copy = SessionCopy(item.lookup_id, key[0], key[1], snapshot, positions)
            actions.append(SendReplica(peer, copy))
        adopted = self._adopted.get(item.client_id)
        if (
            not actions
            and adopted is not None
            and adopted.handed
            and now - adopted.since <= self.handed_copy_kept_s
            and adopted.key[0] != peer
        ):
            # adopted here at a claim (or a failover) and handed on to the claim - whose reply,
            # on the cluster's envelope path, may come after the CONNECT stopped waiting (seeds
            # 17, 434, 475 and 657 of the --sessions sweep): the asking broker gets the state it
            # was handed, used only if its claim found none (the late reply is then merged)
            key = adopted.key
            copy = SessionCopy(item.lookup_id, key[0], key[1], adopted.snapshot, adopted.positions)
            actions.append(SendReplica(peer, copy))
        if not actions:  # "no copy here": the asking broker stops waiting once every member said so
            actions.append(SendReplica(peer, SessionCopy(item.lookup_id, "", "", None)))
        return actions

    def _on_copy_taken(self, item: SessionCopyTaken) -> list[ReplicationAction]:
        self._adopted.pop(item.client_id, None)  # the asking broker's session now
        key = (item.home, item.incarnation)
        if key not in self._held:
            return []
        return self.sessions_adopted(key, [item.client_id], keep_copy=False)

    # ------------------------------------------------------------------ graceful removal
    def leave(self, now: float) -> list[ReplicationAction]:
        """This broker is being removed gracefully (SIGTERM with a drain): the adapter stops
        accepting publishes and sessions first. Every member is told (they stop holding on us and
        give what we held of theirs to their next holder); what we hold of origins that are down
        (nobody else can hand it over) is taken over now, as a failover would. Exit once
        :meth:`drained`; our holders then take our log and sessions over at once."""
        if self.leaving:
            return []
        self.leaving = True
        item = ReplicaLeaving(self.incarnation)
        actions: list[ReplicationAction] = [
            SendReplica(peer, item) for peer in sorted(self._live) if peer != self.peer_id
        ]
        for key, held in sorted(self._held.items()):
            if not held.gone and key[0] in self._down:
                actions += self._take_over(key, held)
        return actions

    def drained(self) -> bool:
        """Leaving, and nothing is lost when this process exits now: our log and sessions are on
        N brokers (our holders take them over), and every origin we held entries or sessions of
        answered that it has them on N brokers without us (or is down: taken over here)."""
        if not self.leaving or self.under_replicated() or self.under_replicated_sessions():
            return False
        return not any(
            not held.gone and (held.entries or held.sessions) and key[0] not in self._down
            for key, held in self._held.items()
        )

    def leaving_members(self) -> frozenset[str]:
        """The members that said they are leaving (a drain), this broker not included."""
        return frozenset(self._leaving)

    def _on_leaving(self, peer: str, item: ReplicaLeaving, now: float) -> list[ReplicationAction]:
        if self._incarnation_of.get(peer, item.incarnation) != item.incarnation:
            return []
        self._leaving.add(peer)
        versions = {client_id: version for client_id, (version, _s) in self._sessions.items()}
        self._owe_handover[peer] = (self._next_seq, versions)
        actions = self._send_due(now, force=True) + self._send_sessions(now, force=True)
        return actions + self._check_durable() + self._check_sessions() + self._answer_leaving()

    def _answer_leaving(self) -> list[ReplicationAction]:
        """Answer each leaving member once what we had when it said so is accepted by our
        current holders - N copies without it (our ``Durable`` mark counted it among them)."""
        if not self._owe_handover:
            return []
        holders = self.holders_of(self.peer_id)
        if self.replicas > 1 and len(holders) < self.replicas - 1:
            return []
        actions: list[ReplicationAction] = []
        for peer, (next_seq, versions) in sorted(self._owe_handover.items()):
            if self.replicas > 1 and not self._accepted_by(holders, next_seq, versions):
                continue
            del self._owe_handover[peer]
            if peer not in self._down:
                actions.append(SendReplica(peer, ReplicaHandedOver(self.incarnation)))
        return actions

    def _accepted_by(self, holders: list[str], next_seq: int, versions: dict[str, int]) -> bool:
        """Every one of ``holders`` accepted our log below ``next_seq`` and these session versions."""
        for holder in holders:
            if max(self._al.get(holder, 1), self._released) < next_seq:
                return False
            accepted = self._session_al.get(holder, {})
            for client_id, version in versions.items():
                if client_id in self._sessions and accepted.get(client_id, 0) < version:
                    return False
        return True

    def _on_handed_over(self, peer: str, item: ReplicaHandedOver) -> list[ReplicationAction]:
        key = (peer, item.incarnation)
        held = self._held.get(key)
        if held is None or held.gone:
            return []
        held.gone = True
        held.entries.clear()
        held.sessions.clear()
        self._handed_over.add(peer)
        return [Drop(key, None), DropSessions(key)]

    # ------------------------------------------------------------------ holder: failover
    def restore_held_session(
        self, key: LogKey, snapshot: SessionSnapshot, positions: tuple[StreamPosition, ...] = ()
    ) -> None:
        """A restarted holder (its disk kept) loads a session it held of ``key`` (before
        :meth:`start`)."""
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = _Held()
        held.sessions[snapshot.client_id] = snapshot
        held.session_positions[snapshot.client_id] = positions

    def restore_held(self, key: LogKey, first_seq: int, messages: Iterable[Message]) -> None:
        """A restarted holder (its disk kept) loads what it held of ``key`` (before :meth:`start`)."""
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = _Held()
        for offset, message in enumerate(messages):
            held.entries[first_seq + offset] = message
        if held.entries:
            held.next_seq = max(held.next_seq, max(held.entries) + 1)

    def _take_over(self, key: LogKey, held: _Held) -> list[ReplicationAction]:
        held.gone = True
        self._expires.pop(key, None)
        actions: list[ReplicationAction] = []
        if held.sessions:
            # its persistent sessions become this broker's own: adopted before its entries are
            # published again, so that the entries reach the adopted sessions' subscriptions too
            actions.append(held.adopt(sorted(held.sessions), key))
        if not held.entries:
            return [*actions, Drop(key, None)]
        first = min(held.entries)
        messages = tuple(held.entries[seq] for seq in sorted(held.entries))
        return [*actions, TakeOver(key, first, messages)]

    def taken_over(self, key: LogKey) -> list[ReplicationAction]:
        """The entries of a :class:`TakeOver` are durable as this broker's own publishes."""
        held = self._held.get(key)
        if held is None:
            return []
        held.entries.clear()
        return [Drop(key, None)]

    def sessions_adopted(
        self, key: LogKey, client_ids: Iterable[str] | None = None, *, keep_copy: bool = True
    ) -> list[ReplicationAction]:
        """The sessions of an :class:`AdoptSessions` (``client_ids``; None: all of ``key``) are this
        broker's own now (and replicated as such through :meth:`session_changed`): drop the held
        copies. Each is remembered (``keep_copy``) until ``handed_copy_kept_s`` after it is handed
        on, for lookups (:meth:`_on_lookup`)."""
        held = self._held.get(key)
        if held is None:
            return []
        if keep_copy:
            for client_id in sorted(held.sessions) if client_ids is None else client_ids:
                snapshot = held.sessions.get(client_id)
                if snapshot is not None:
                    positions = held.session_positions.get(client_id, ())
                    self._adopted[client_id] = _Adopted(key, snapshot, positions, self._now)
        if client_ids is None:
            held.sessions.clear()
            held.session_positions.clear()
            return [DropSessions(key)]
        actions: list[ReplicationAction] = []
        for client_id in client_ids:
            held.session_positions.pop(client_id, None)
            if held.sessions.pop(client_id, None) is not None:
                actions.append(PersistSession(key, client_id, None))
        return actions

    def claimed(self, client_id: str, *, home_silent: bool = False) -> list[ReplicationAction]:
        """A CONNECT for ``client_id`` asks every broker for its session (the cluster's takeover
        claim) and this broker holds a copy whose home is not live in our view: adopt it now, so
        that the claim is answered with it (``session present``) without waiting for the failover
        time. A live home answers the claim itself.

        ``home_silent``: the CONNECT here found no session - the home did not answer its claim
        (gone, but still live in our view: the CONNECT came before its broken link). A copy held
        here is adopted then too if this broker is one of the home's current holders: the home
        sends its latest states there, so it is the newest copy. Before, the CONNECT took the
        copy another member answered its lookup with - a former holder's (it held the session
        while this broker was down), with positions 1,540 messages old: 2,660 duplicates of
        5,000 at QoS 2 (test_disk_loss.py with 5 brokers; docs/notes/replication.md)."""
        actions: list[ReplicationAction] = []
        for key, held in sorted(self._held.items()):
            if held.gone or client_id not in held.sessions:
                continue
            live = key[0] in self._live and self._incarnation_of.get(key[0], key[1]) == key[1]
            if live and (not home_silent or self.peer_id not in self.holders_of(key[0])):
                continue  # (its hello may not have come yet: its records did)
            actions.append(held.adopt([client_id], key))
        return actions

    def held_sessions(self) -> dict[LogKey, list[str]]:
        """The homes this broker holds persistent sessions of (not adopted), with their client ids."""
        return {
            key: sorted(held.sessions)
            for key, held in sorted(self._held.items())
            if not held.gone and held.sessions
        }

    def held_count(self) -> int:
        return sum(len(held.entries) for held in self._held.values() if not held.gone)

    def held_logs(self) -> dict[LogKey, int]:
        """The logs this broker holds entries of (not taken over), with their entry counts."""
        return {
            key: len(held.entries)
            for key, held in sorted(self._held.items())
            if not held.gone and held.entries
        }

    # ------------------------------------------------------------------ time
    def tick(self, now: float) -> list[ReplicationAction]:
        """Retransmission to holders, releases, failover of origins down for good, expiry."""
        self._now = max(self._now, now)
        for client_id, adopted in list(self._adopted.items()):
            if now - adopted.since > self.handed_copy_kept_s:
                del self._adopted[client_id]
        actions = self._greet_silent(now) + self._send_due(now, force=False) + self._send_releases()
        actions += self._send_sessions(now, force=False) + self._answer_leaving()
        for key, held in sorted(self._held.items()):
            if held.gone:
                continue
            since = self._down.get(key[0])
            if since is not None and now - since >= self.failover_after_s:
                actions += self._take_over(key, held)
            elif key in self._expires and now >= self._expires[key]:
                del self._expires[key]
                held.gone = True
                held.entries.clear()
                actions.append(Drop(key, None))
                if held.sessions:
                    held.sessions.clear()
                    actions.append(DropSessions(key))
        return actions
