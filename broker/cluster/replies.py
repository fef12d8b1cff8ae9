"""Coalesced replies between brokers (issue #11): the overlay's per-hop ``ACK`` and end-to-end
``DONE`` of a PUB (seed 003 §3.5.1 range multicast, made crash-safe by SkipMQ: docs/overlay.md §5)
are held per peer for up to ``cluster.ack_delay_ms`` and then leave together, in one transport
frame with each other and with the stream acknowledgements (``StreamAck``, seed 004's ACK
vector) that the receiver core delays by the same amount.

Why: at a paced publish rate every forwarded message went out alone and each receiver broker
answered it with a frame of its own (the ACK and DONE of its PUB). On grpc.aio a frame costs
each end about as much CPU as the rest of the receive path (~250-300 us on the 2-core benchmark
machine, docs/benchmarks-cluster.md), so at 1,000 msg/s the answers alone kept a core a quarter
busy and pushed the publisher's broker into queueing. Both are acknowledgements whose timers run
in seconds (``pub_ack_timeout_s``, ``publish_done_timeout_s``): a few milliseconds later changes
no decision, and the send log frees an entry that much later. Anything else sent to the peer
takes the held replies with it (they go first, in the order they were held).

Pure: events and ``now`` in, what is due out; the engine sends it (``ClusterEngine._send``).
"""

from __future__ import annotations

__all__ = ["ReplyHold"]


class ReplyHold:
    """Replies waiting per peer; one deadline, ``delay_s`` after the first reply held since the
    last time everything went out."""

    __slots__ = ("_due", "_held", "delay_s")

    def __init__(self, delay_s: float) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.delay_s = delay_s
        self._held: dict[str, list[object]] = {}
        self._due: float | None = None

    def hold(self, peer: str, item: object, now: float) -> None:
        held = self._held.get(peer)
        if held is None:
            self._held[peer] = [item]
        else:
            held.append(item)
        if self._due is None:
            self._due = now + self.delay_s

    def holds_for(self, peer: str) -> bool:
        return peer in self._held

    def take(self, peer: str) -> list[object]:
        """The replies held for ``peer`` (something else goes to it now: they go first)."""
        items = self._held.pop(peer, [])
        if not self._held:
            self._due = None
        return items

    def due(self, now: float) -> list[tuple[str, list[object]]]:
        """Everything held, once the deadline has come (else nothing)."""
        if self._due is None or now < self._due:
            return []
        return self.take_all()

    def take_all(self) -> list[tuple[str, list[object]]]:
        held = list(self._held.items())
        self._held.clear()
        self._due = None
        return held

    def next_deadline(self) -> float | None:
        return self._due

    def held_count(self) -> int:
        return sum(len(items) for items in self._held.values())
