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

    def classes_of(self, peer: str) -> frozenset[str]:
        return frozenset(self._by_peer.get(peer, ()))
