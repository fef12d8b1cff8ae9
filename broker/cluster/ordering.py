"""Receive order of forwarded messages: per-sender FIFO with gap skipping (pure core).

Every broker numbers the messages it forwards per (its incarnation, topic class) stream from 1
with no gaps (``ForwardedMessage.seq``); a receiver restores that order, so per-publisher
per-topic order (MQTT §4.6) survives the overlay's one-hop / multi-hop switches (seed 003: the
route of a topic changes as its subscriber count crosses the table size). Duplicates are
dropped. A message that overtook an earlier one is held; after ``hold_s`` without the missing
one the gap is skipped (counted) and delivery continues. The first message of a stream seen
here sets where the stream starts; an earlier one arriving later (the route switched while this
broker joined) is delivered late rather than lost. The CO protocol's causal order (seed 004,
the reliable-delivery issue) lands beside this module with the same shape.

Events in (``receive`` a message with ``now``; ``tick`` at ``next_deadline()``), the messages to
deliver out, in order. No I/O, no clock of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedDict

from broker.cluster.messages import ForwardedMessage
from broker.cluster.stats import ClusterStats

# sequence numbers below a stream's first received one that were delivered late (out of order)
# are remembered so their retransmissions are dropped; the oldest are forgotten beyond this
LATE_SEEN_LIMIT = 1024

Delivery = tuple[ForwardedMessage, int]  # (message, overlay hops)
StreamKey = tuple[str, str]  # (origin incarnation, topic class)


@dataclass
class _Stream:
    next_seq: int = 0  # 0 = nothing received yet
    first_seq: int = 0  # the sequence number the stream started at here
    # earlier messages that arrived after the first one (they overtook nothing: delivered late)
    late_seen: set[int] = field(default_factory=set)
    held: SortedDict = field(default_factory=SortedDict)  # seq -> Delivery
    hold_until: float | None = None
    last_seen: float = 0.0


class FifoOrdering:
    """The receive state of every (origin, class) stream."""

    def __init__(
        self,
        hold_s: float,
        *,
        stats: ClusterStats | None = None,
        on_gap: Callable[[StreamKey, int], Any] | None = None,
    ) -> None:
        self.hold_s = hold_s
        self.stats = stats if stats is not None else ClusterStats()  # duplicates, reordered, gaps
        self._streams: dict[StreamKey, _Stream] = {}
        self._holding: set[StreamKey] = set()  # streams with a hold deadline
        self._on_gap = on_gap

    def receive(self, forwarded: ForwardedMessage, hops: int, now: float) -> list[Delivery]:
        """``forwarded`` arrived over ``hops`` overlay hops; the messages now deliverable, in order."""
        key = (forwarded.origin, forwarded.stream)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream()
        stream.last_seen = now
        seq = forwarded.seq
        if stream.next_seq == 0:
            stream.next_seq = stream.first_seq = seq  # the first message of a stream sets its start
        if seq < stream.first_seq and seq not in stream.late_seen:
            # earlier than the message that started the stream here and never seen: it was
            # overtaken (one-hop / multi-hop switch as this broker joined); late beats lost
            stream.late_seen.add(seq)
            if len(stream.late_seen) > LATE_SEEN_LIMIT:
                stream.late_seen.discard(min(stream.late_seen))
            self.stats.reordered += 1
            return [(forwarded, hops)]
        if seq < stream.next_seq or seq in stream.held:
            self.stats.duplicates_dropped += 1
            return []
        if seq > stream.next_seq:
            stream.held[seq] = (forwarded, hops)
            self.stats.reordered += 1
            if stream.hold_until is None:
                stream.hold_until = now + self.hold_s
                self._holding.add(key)
            return []
        ready = [(forwarded, hops)]
        stream.next_seq = seq + 1
        self._drain(key, stream, now, ready)
        return ready

    def tick(self, now: float) -> list[Delivery]:
        """Skip the gaps whose hold time is over; the messages that become deliverable."""
        ready: list[Delivery] = []
        for key in sorted(self._holding):
            stream = self._streams[key]
            if stream.hold_until is None or stream.hold_until > now:
                continue
            stream.hold_until = None
            self._holding.discard(key)
            if not stream.held:
                continue
            first = stream.held.peekitem(0)[0]
            missing = first - stream.next_seq
            self.stats.gaps_skipped += missing
            if self._on_gap is not None:
                self._on_gap(key, missing)
            stream.next_seq = first
            self._drain(key, stream, now, ready)
        return ready

    def next_deadline(self) -> float | None:
        if not self._holding:  # the common case, asked after every event: nothing held
            return None
        deadlines = [self._streams[key].hold_until for key in self._holding]
        return min((d for d in deadlines if d is not None), default=None)

    def forget_idle(self, now: float, idle_s: float) -> None:
        """Drop the state of streams silent for ``idle_s`` with nothing held."""
        for key, stream in list(self._streams.items()):
            if now - stream.last_seen > idle_s and not stream.held:
                del self._streams[key]

    def held_count(self) -> int:
        return sum(len(stream.held) for stream in self._streams.values())

    def clear_deadlines(self) -> None:
        """Nothing is delivered any more (the broker stops)."""
        for key in self._holding:
            self._streams[key].hold_until = None
        self._holding.clear()

    def _drain(self, key: StreamKey, stream: _Stream, now: float, ready: list[Delivery]) -> None:
        held = stream.held
        while held and held.peekitem(0)[0] == stream.next_seq:
            _seq, delivery = held.popitem(0)
            ready.append(delivery)
            stream.next_seq += 1
        if not held:
            stream.hold_until = None
            self._holding.discard(key)
        elif stream.hold_until is None:
            stream.hold_until = now + self.hold_s
            self._holding.add(key)
