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

Not here yet: sessions (subscriptions, queues, QoS 2 state), the graceful hand-over of a leaving
broker, a bound on how long a publisher waits when fewer than N brokers are reachable.

Pure: events and ``now`` in, actions out (``broker.cluster.replication_messages``); no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.cluster.replication_messages import (
    Drop,
    Durable,
    LogKey,
    Persist,
    ReplicaAck,
    ReplicaAppend,
    ReplicaHello,
    ReplicaItem,
    ReplicaRelease,
    ReplicationAction,
    SendReplica,
    TakeOver,
)
from broker.core.messages import Message

RESEND_BATCH = 256  # entries per ReplicaAppend sent again (one batch, like a stream's resend)


class _Held:
    """What this broker holds of one origin incarnation's log."""

    __slots__ = ("entries", "gone", "next_seq")

    def __init__(self) -> None:
        self.entries: dict[int, Message] = {}
        self.next_seq = 1  # AL: every entry below is on disk here (or was released)
        self.gone = False  # taken over: its origin incarnation is gone


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
            if peer in self._live and peer != origin:
                holders.append(peer)
        return holders

    def on_peer_down(self, peer: str, now: float) -> list[ReplicationAction]:
        """The link to ``peer`` broke (its process died, or keep-alive gave up across a cut)."""
        if peer == self.peer_id or peer in self._down:
            return []
        self._members.add(peer)
        self._live.discard(peer)
        self._down[peer] = now
        return self._send_due(now, force=True) + self._check_durable()

    def _heard_from(self, peer: str, now: float) -> list[ReplicationAction]:
        actions: list[ReplicationAction] = []
        if peer not in self._live:
            self._members.add(peer)
            self._live.add(peer)
            self._down.pop(peer, None)
            actions += self._send_due(now, force=True)
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
        actions = self._heard_from(peer, now)
        if isinstance(item, ReplicaAppend):
            actions += self._on_append(peer, item)
        elif isinstance(item, ReplicaAck):
            actions += self._on_ack(peer, item, now)
        elif isinstance(item, ReplicaRelease):
            actions += self._on_release(peer, item)
        elif isinstance(item, ReplicaHello):
            actions += self._on_hello(peer, item, now)
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
        # as a holder: the logs of the peer's earlier incarnations
        for key, held in sorted(self._held.items()):
            if key[0] != peer or key[1] == hello.incarnation or held.gone:
                continue
            if hello.started_empty:
                actions += self._take_over(key, held)
            else:
                self._expires.setdefault(key, now + self.retention_s)
        return actions

    def _on_append(self, peer: str, append: ReplicaAppend) -> list[ReplicationAction]:
        key = (peer, append.incarnation)
        held = self._held.get(key)
        if held is None:
            if self._incarnation_of.get(peer, append.incarnation) != append.incarnation:
                return []  # a late copy from an incarnation its successor already replaced
            held = self._held[key] = _Held()
        if held.gone:
            return []  # a late copy from an incarnation already taken over
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
        return self._check_durable()

    def _on_release(self, peer: str, release: ReplicaRelease) -> list[ReplicationAction]:
        key = (peer, release.incarnation)
        held = self._held.get(key)
        if held is None or held.gone:
            return []
        if release.upto > held.next_seq:
            held.next_seq = release.upto
        return self._drop_below(key, held, release.upto)

    def _drop_below(self, key: LogKey, held: _Held, upto: int) -> list[ReplicationAction]:
        stale = [seq for seq in held.entries if seq < upto]
        if not stale:
            return []
        for seq in stale:
            del held.entries[seq]
        return [Drop(key, upto)]

    # ------------------------------------------------------------------ holder: failover
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
        if not held.entries:
            return [Drop(key, None)]
        first = min(held.entries)
        messages = tuple(held.entries[seq] for seq in sorted(held.entries))
        return [TakeOver(key, first, messages)]

    def taken_over(self, key: LogKey) -> list[ReplicationAction]:
        """The entries of a :class:`TakeOver` are durable as this broker's own publishes."""
        held = self._held.get(key)
        if held is None:
            return []
        held.entries.clear()
        return [Drop(key, None)]

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
        actions = self._greet_silent(now) + self._send_due(now, force=False) + self._send_releases()
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
        return actions
