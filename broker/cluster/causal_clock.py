"""Causal groups: the dependency vector a forwarded message carries (pure core; issue #10).

Seed 004 (CO protocol) §3.4, Theorem 1: a message p causally precedes q iff ``p.SEQ <
q.ACK_{p.src}`` - the ACK vector a message carries (the SEQ its sender expects next from each
source, §3.1-§3.2) *is* its causal dependency. In SkipMQ the seed's sources are the reliable
streams ``(origin incarnation, topic class)`` of ``stream_sender``, which already give SEQ, the
durable send log and RET; a causal group (``cluster.causal_groups``, MQTT topic filters) adds the
ACK vector to the messages whose topic matches it:

* ``deps`` of a message = this broker's clock for the groups its topic matches: for every stream
  whose group messages this broker sent or accepted, the position just after the last of them.
  Every message below that position on that stream precedes this one.
* The clock is merged along acceptance (transitivity of happened-before): accepting q merges
  q's ``deps`` and q's own positions. A topic goes out on several streams of its origin (its
  exact class and the wildcard classes of its prefixes, docs/cluster.md "Topic classes"), so a
  message lists its position on each of them (``copies``): a broker that subscribes another of
  those classes than the one this broker received still sees q as a dependency.
* The receiving side (``stream_receiver``) accepts a message only when its own positions reach
  those of ``deps`` for the streams it receives: the seed's acceptance condition with failure
  condition (2) (docs/causal.md decision 2), and RET for what is missing.

Events in (``stamp``, ``sent``, ``accepted``), no I/O, no clock, no randomness.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.cluster.messages import ForwardedMessage, StreamPosition
from broker.mqtt.topics import topic_matches

StreamKey = tuple[str, str]  # (origin, topic class)
_TOPIC_CACHE_LIMIT = 4096


class CausalClock:
    """One vector clock per causal group of this broker."""

    def __init__(self, group_filters: Iterable[str]) -> None:
        self.filters = tuple(group_filters)
        self._clocks: tuple[dict[StreamKey, int], ...] = tuple({} for _ in self.filters)
        self._groups: dict[str, tuple[int, ...]] = {}  # topic -> indices of the groups it is in

    def groups_of(self, topic: str) -> tuple[int, ...]:
        """The causal groups ``topic`` belongs to (empty: none, the message carries nothing)."""
        groups = self._groups.get(topic)
        if groups is None:
            if len(self._groups) >= _TOPIC_CACHE_LIMIT:
                self._groups.clear()
            groups = tuple(i for i, f in enumerate(self.filters) if topic_matches(f, topic))
            self._groups[topic] = groups
        return groups

    def stamp(self, groups: tuple[int, ...]) -> tuple[StreamPosition, ...]:
        """The ``deps`` of a message of ``groups`` sent now (the seed's ACK vector)."""
        if len(groups) == 1:
            merged = self._clocks[groups[0]]
        else:
            merged = {}
            for index in groups:
                for key, next_seq in self._clocks[index].items():
                    if next_seq > merged.get(key, 0):
                        merged[key] = next_seq
        return tuple(StreamPosition(origin, cls, n) for (origin, cls), n in sorted(merged.items()))

    def sent(self, groups: tuple[int, ...], origin: str, copies: tuple[tuple[str, int], ...]) -> None:
        """This broker sent a message of ``groups`` as SEQ ``seq`` of its stream of each class in
        ``copies``: the messages it sends from now on follow it."""
        for index in groups:
            clock = self._clocks[index]
            for cls, seq in copies:
                clock[(origin, cls)] = seq + 1

    def accepted(self, forwarded: ForwardedMessage) -> None:
        """``forwarded`` was accepted here (delivered to the local subscribers)."""
        if not forwarded.copies:
            return
        groups = self.groups_of(forwarded.message.topic)
        origin = forwarded.origin
        for index in groups:
            clock = self._clocks[index]
            for dep in forwarded.deps:
                key = (dep.origin, dep.stream)
                if dep.next_seq > clock.get(key, 0):
                    clock[key] = dep.next_seq
            for cls, seq in forwarded.copies:
                key = (origin, cls)
                if seq + 1 > clock.get(key, 0):
                    clock[key] = seq + 1

    def restore(self, positions: Iterable[tuple[StreamKey, int]]) -> None:
        """A restarted broker: what its previous incarnation accepted (its receive positions) and
        sent (its send log) precedes everything it sends now, in every group (the clock itself is
        not kept; this over-approximates it: a receiver may wait for a message of another topic)."""
        for key, next_seq in positions:
            for clock in self._clocks:
                if next_seq > clock.get(key, 0):
                    clock[key] = next_seq

    def forget(self, keys: Iterable[StreamKey]) -> None:
        """Streams whose state this broker dropped (silent for ``STREAM_IDLE_S``): their messages
        are long delivered everywhere, no dependency on them is needed any more."""
        for key in keys:
            for clock in self._clocks:
                clock.pop(key, None)

    def size(self) -> int:
        """Entries over every group's clock (the header a message of all groups would carry)."""
        return sum(len(clock) for clock in self._clocks)
