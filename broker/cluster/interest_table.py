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

from broker.cluster.messages import ClassInterest


class InterestTable:
    def __init__(self) -> None:
        self._by_class: dict[str, set[str]] = {}
        self._by_peer: dict[str, set[str]] = {}

    def apply(self, peer: str, interest: ClassInterest) -> tuple[list[str], list[str]]:
        """``peer``'s interest message; the classes it (newly) subscribes and stopped subscribing."""
        known = self._by_peer.setdefault(peer, set())
        if interest.full:
            added = set(interest.subscribed) - known
            removed = known - set(interest.subscribed)
        else:
            added = set(interest.subscribed) - known
            removed = set(interest.unsubscribed) & known
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
    ``(peer, reference, interest)``. No I/O."""

    def __init__(self, retransmit_s: float) -> None:
        self.retransmit_s = retransmit_s
        self._ref = 0
        self._pending: dict[str, dict[str, tuple[bool, int]]] = {}  # peer -> class -> (joined, ref)
        self._full: dict[str, int] = {}  # peer -> ref of the full list it has not acknowledged
        self._full_classes: dict[str, tuple[str, ...]] = {}
        self._due: dict[str, float] = {}  # peer -> when to announce its pending state again
        self._next: float | None = None

    def announce(
        self, interest: ClassInterest, peers: Iterable[str], now: float
    ) -> list[tuple[str, int, ClassInterest]]:
        out = []
        for peer in peers:
            self._ref += 1
            ref = self._ref
            if interest.full:
                self._pending.pop(peer, None)
                self._full[peer] = ref
                self._full_classes[peer] = tuple(interest.subscribed)
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
            self._full_classes.pop(peer, None)
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
        self._full_classes.pop(peer, None)
        self._due.pop(peer, None)
        self._arm()

    def pending(self, peer: str, cls: str) -> bool:
        """Whether ``peer`` may not know yet that this broker subscribes ``cls``."""
        if peer in self._full:
            return cls in self._full_classes.get(peer, ())
        entry = self._pending.get(peer, {}).get(cls)
        return entry is not None and entry[0]

    def tick(self, now: float) -> list[tuple[str, int, ClassInterest]]:
        """The announcements not acknowledged within ``retransmit_s``, again (new references)."""
        if self._next is None or self._next > now:
            return []
        self._next = None
        out: list[tuple[str, int, ClassInterest]] = []
        for peer, due in sorted(self._due.items()):
            if due > now:
                continue
            if peer in self._full:
                out += self.announce(ClassInterest(self._full_classes[peer], (), True), [peer], now)
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
