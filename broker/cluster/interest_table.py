"""Which other brokers subscribe which topic classes (pure core): filter propagation (seed 000).

SIONet propagates event filters along its links so that senders know where events are wanted; here
each broker tells the others the topic classes it subscribes (``ClassInterest``: the whole list when
a broker starts or comes back, then every 0 -> 1 and 1 -> 0 change of its class counters, see
``broker.cluster.interest``). A sender registers the subscriber brokers of a class as receivers of
its stream of that class (``broker.cluster.stream_sender``), so its send log keeps each message until
they acknowledge it - even a receiver the overlay cannot reach (the other side of a partition, a
broker restarting), and even for a stream it has never received from (issue #10). The overlay's own
routing does not depend on this table.

Events in (``apply`` a peer's message, ``forget`` a peer), the changes out. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from broker.cluster.messages import ClassInterest

Version = tuple[int, int]  # (epoch, version) of a ClassInterest
UNORDERED: Version = (0, 0)


def version_of(interest: ClassInterest) -> Version:
    return (interest.epoch, interest.version)


class InterestTable:
    """Per peer, the classes it subscribes, and the order of what was applied (issue #10): the
    version of the last whole list applied (the floor: every class it does not name was not
    subscribed then) and, above it, the version of the last news applied for each class. An
    announcement no newer than that is ignored - a whole list sent when the peer started or came
    back, overtaken in the network by the peer's later "I subscribe" (loss, reordering, a retransmit)
    erased that subscription before, and the peer's senders stopped keeping messages for it
    (seed 50 of the conversation with crashes and partitions). Unordered announcements (a sender
    without versions) are applied as they come."""

    def __init__(self) -> None:
        self._by_class: dict[str, set[str]] = {}
        self._by_peer: dict[str, set[str]] = {}
        self._floor: dict[str, Version] = {}  # peer -> version of the last whole list applied
        self._news: dict[str, dict[str, Version]] = {}  # peer -> class -> version, above the floor

    def stale(self, peer: str, interest: ClassInterest) -> bool:
        """Whether ``interest`` is older than (or the same as) the last whole list applied from
        ``peer``: ``apply`` changes nothing with it."""
        version = version_of(interest)
        return version != UNORDERED and version <= self._floor.get(peer, UNORDERED)

    def apply(self, peer: str, interest: ClassInterest) -> tuple[list[str], list[str]]:
        """``peer``'s interest message; the classes it (newly) subscribes and stopped subscribing."""
        known = self._by_peer.setdefault(peer, set())
        version = version_of(interest)
        if version == UNORDERED:
            joined = set(interest.subscribed)
            left = (known - joined) if interest.full else set(interest.unsubscribed)
        elif self.stale(peer, interest):
            return [], []
        elif interest.full:
            news = self._news.get(peer, {})
            # a class with news newer than this list keeps what the news said
            joined = {cls for cls in interest.subscribed if news.get(cls, UNORDERED) < version}
            left = {cls for cls in known - set(interest.subscribed) if news.get(cls, UNORDERED) < version}
            self._floor[peer] = version
            newer = {cls: seen for cls, seen in news.items() if seen > version}
            if newer:
                self._news[peer] = newer
            else:
                self._news.pop(peer, None)
        else:
            floor = self._floor.get(peer, UNORDERED)
            news = self._news.setdefault(peer, {})
            joined, left = set(), set()
            for classes, target in ((interest.subscribed, joined), (interest.unsubscribed, left)):
                for cls in classes:
                    if version > news.get(cls, floor):  # newer than what we know of the class
                        news[cls] = version
                        target.add(cls)
        added = joined - known
        removed = left & known
        for cls in added:
            known.add(cls)
            self._by_class.setdefault(cls, set()).add(peer)
        for cls in removed:
            known.discard(cls)
            peers = self._by_class.get(cls)
            if peers is not None:
                peers.discard(peer)
                if not peers:
                    del self._by_class[cls]
        return sorted(added), sorted(removed)

    def peers_of(self, cls: str) -> frozenset[str]:
        peers = self._by_class.get(cls)
        return frozenset(peers) if peers else frozenset()

    def classes(self) -> set[str]:
        """Every class some other broker subscribes."""
        return set(self._by_class)

    def classes_of(self, peer: str) -> frozenset[str]:
        return frozenset(self._by_peer.get(peer, ()))


class InterestAnnouncer:
    """This broker's announcements of its classes, repeated to each peer until that peer
    acknowledges them (the acknowledgement is an empty ``ClassInterest`` answering the
    announcement's reference). A lost announcement would leave a sender not knowing this broker
    subscribes: what it publishes before the overlay reaches this broker's new subscriber node (a
    Skip Graph run still forming, loss) would be confirmed without it and freed (seed 311 of the
    causal conversation with loss and a crash).

    Per peer, the latest state of each class not acknowledged yet, and the reference of the last
    announcement that carried it: an acknowledgement settles exactly the classes whose last
    announcement it answers, so a newer change is never settled by an older answer. A full list
    (a peer that comes back) replaces every pending change for that peer. Events in (``announce``,
    ``acked``, ``forget`` a peer reported down, ``tick`` with ``now``); the envelopes to send out as
    ``(peer, reference, interest)``. No I/O.

    Every announcement is stamped ``(epoch, version)`` (``stamp``): ``epoch`` is given at each
    start (``begin``: durable, larger than any before it), ``version`` grows with each
    announcement. What is repeated is the current state of the classes it names (a whole list:
    every class subscribed now, not those of when it was first sent), under a new version: a
    receiver applies only what is newer than what it applied (``InterestTable``)."""

    def __init__(self, retransmit_s: float, epoch: int = 0) -> None:
        self.retransmit_s = retransmit_s
        self._ref = 0
        self._epoch = epoch
        self._version = 0
        self._classes: set[str] = set()  # the classes we subscribe, as announced
        self._pending: dict[str, dict[str, tuple[bool, int]]] = {}  # peer -> class -> (joined, ref)
        self._full: dict[str, int] = {}  # peer -> ref of the full list it has not acknowledged
        self._due: dict[str, float] = {}  # peer -> when to announce its pending state again
        self._next: float | None = None

    def begin(self, epoch: int) -> None:
        """This broker (re)starts with ``epoch``, larger than that of every earlier start."""
        self._epoch = epoch
        self._version = 0

    def stamp(self, interest: ClassInterest) -> ClassInterest:
        """``interest`` with the next version (once per announcement, whatever the peers)."""
        if interest.full:
            self._classes = set(interest.subscribed)
        else:
            self._classes |= set(interest.subscribed)
            self._classes -= set(interest.unsubscribed)
        self._version += 1
        return replace(interest, epoch=self._epoch, version=self._version)

    def announce(
        self, interest: ClassInterest, peers: Iterable[str], now: float
    ) -> list[tuple[str, int, ClassInterest]]:
        """``interest`` to ``peers`` (stamped here unless it is already), until each acknowledges."""
        if not interest.version:
            interest = self.stamp(interest)
        out = []
        for peer in peers:
            self._ref += 1
            ref = self._ref
            if interest.full:
                self._pending.pop(peer, None)
                self._full[peer] = ref
            else:
                pending = self._pending.setdefault(peer, {})
                for cls in interest.subscribed:
                    pending[cls] = (True, ref)
                for cls in interest.unsubscribed:
                    pending[cls] = (False, ref)
            self._due[peer] = now + self.retransmit_s
            out.append((peer, ref, interest))
        self._arm()
        return out

    def acked(self, peer: str, ref: int) -> None:
        """``peer`` applied the announcement ``ref``."""
        if self._full.get(peer) == ref:
            del self._full[peer]
        pending = self._pending.get(peer)
        if pending:
            for cls in [cls for cls, (_joined, sent) in pending.items() if sent == ref]:
                del pending[cls]
            if not pending:
                del self._pending[peer]
        if peer not in self._pending and peer not in self._full:
            self._due.pop(peer, None)
            self._arm()

    def forget(self, peer: str) -> None:
        """``peer`` is down: it gets the whole list when it is back (``announce`` a full list)."""
        self._pending.pop(peer, None)
        self._full.pop(peer, None)
        self._due.pop(peer, None)
        self._arm()

    def pending(self, peer: str, cls: str) -> bool:
        """Whether ``peer`` may not know yet that this broker subscribes ``cls``."""
        if peer in self._full:
            return cls in self._classes
        entry = self._pending.get(peer, {}).get(cls)
        return entry is not None and entry[0]

    def tick(self, now: float) -> list[tuple[str, int, ClassInterest]]:
        """The announcements not acknowledged within ``retransmit_s``, again (new references and
        versions: the pending state of each class is its latest, so a new version tells no lie)."""
        if self._next is None or self._next > now:
            return []
        self._next = None
        out: list[tuple[str, int, ClassInterest]] = []
        for peer, due in sorted(self._due.items()):
            if due > now:
                continue
            if peer in self._full:
                out += self.announce(ClassInterest(tuple(sorted(self._classes)), (), True), [peer], now)
                continue
            pending = self._pending.get(peer, {})
            joined = tuple(sorted(cls for cls, (yes, _ref) in pending.items() if yes))
            left = tuple(sorted(cls for cls, (yes, _ref) in pending.items() if not yes))
            out += self.announce(ClassInterest(joined, left), [peer], now)
        self._arm()
        return out

    def next_deadline(self) -> float | None:
        return self._next

    def _arm(self) -> None:
        self._next = min(self._due.values()) if self._due else None
