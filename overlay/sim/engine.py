"""Deterministic discrete-event simulator that drives ``overlay.api.OverlayCore`` nodes.

Implements the simulation half of the sans-I/O boundary of ``overlay/api.py`` (style of
TigerBeetle's VOPR and etcd-raft's scripted tests): a virtual clock, one event queue, and a
seeded network model with per-link latency, loss, reordering and partitions, plus injection of
churn (joins, graceful leaves, silent crashes). Every run is a pure function of its seed: the
network's randomness comes from ``random.Random(seed)`` and each node receives its own
``random.Random`` derived from the seed and its peer id, so the same seed replays the same
trace (``Simulator.trace_digest``). Failures raised by the engine carry the seed
(``SimulationError``) so a failing run can be replayed.

The driver loop is the one documented in ``overlay/api.py``: every action returned by
``handle`` is carried out in order (``Send`` becomes a ``Receive`` at the destination after
the link latency; ``Deliver`` / ``SubscriberPresence`` / ``PublishDone`` are handed to observers) and the node
is ticked at (never before) its ``next_deadline()``. A crashed node neither receives nor sends
and says no goodbye; messages in flight to it are dropped on arrival.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from overlay.api import (
    Action,
    Bootstrap,
    Deliver,
    Event,
    OverlayCore,
    PeerId,
    PublishDone,
    Receive,
    Send,
    Shutdown,
    SubscriberPresence,
    Tick,
)
from overlay.node import OverlayNode
from overlay.sim.errors import SimulationError

__all__ = [
    "NetworkConfig",
    "Observer",
    "SimulationError",
    "Simulator",
    "derive_seed",
]

_RECEIVE = 0
_TICK = 1
_EVENT = 2
_CONTROL = 3

_MASK64 = (1 << 64) - 1


def derive_seed(seed: int, *parts: Hashable) -> int:
    """A 64-bit seed derived from ``seed`` and ``parts``, stable across processes and runs."""
    text = repr((seed, *parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def _mix64(value: int) -> int:
    """SplitMix64 finaliser: a cheap, well-spread integer hash (stable across processes)."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


@dataclass(slots=True)
class NetworkConfig:
    """The simulated network between physical nodes.

    A link's latency is ``base_latency_s + link_spread_s * u(link)`` with ``u`` a fixed pseudo-random
    number in [0, 1) per ordered pair of nodes (so each link has its own stable latency), plus
    ``jitter_s * U(0, 1)`` per message. With probability ``reorder_rate`` a message is held back by
    an extra ``U(0, reorder_delay_s)`` so it overtakes nothing but is overtaken by later ones; with
    probability ``loss_rate`` it is dropped. Partitions are set on the simulator.
    """

    base_latency_s: float = 0.010
    link_spread_s: float = 0.0
    jitter_s: float = 0.0
    loss_rate: float = 0.0
    reorder_rate: float = 0.0
    reorder_delay_s: float = 0.050

    def __post_init__(self) -> None:
        for name in ("base_latency_s", "link_spread_s", "jitter_s", "reorder_delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"NetworkConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("loss_rate", "reorder_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"NetworkConfig.{name} must be within [0, 1], got {rate!r}")


Observer = Callable[["Simulator", PeerId, Event, list[Action]], None]
"""Called after every ``handle`` with the node, the event it handled and the actions it returned."""


@dataclass(slots=True)
class NetworkStats:
    """Counters of what the network did (all since the simulator was created)."""

    sent: int = 0
    delivered: int = 0
    lost: int = 0
    partitioned: int = 0
    to_dead_peer: int = 0
    reordered: int = 0
    handled_events: int = 0
    # messages sent per kind: a plain dict (a Counter's ``+= 1`` cost a compiled sweep ~3 % of
    # its instructions); read it as ``sent_by_kind``
    sent_counts: dict[str, int] = field(default_factory=dict)
    sent_by_peer_kind: Counter[tuple[Any, str]] = field(default_factory=Counter)

    @property
    def sent_by_kind(self) -> Counter[str]:
        """Messages sent per kind (a copy; 0 for a kind never sent)."""
        return Counter(self.sent_counts)


class Simulator:
    """A seeded, virtual-time network of ``OverlayCore`` nodes (see the module docstring).

    ``count_per_peer`` keeps per-(peer, kind) send counters (for query-rate reports); turn it off in
    the large sweep to save memory. ``trace`` folds every handled event into ``trace_digest``.
    """

    def __init__(
        self,
        seed: int,
        network: NetworkConfig | None = None,
        *,
        trace: bool = False,
        count_per_peer: bool = True,
    ) -> None:
        if not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.seed = seed
        self.network = network if network is not None else NetworkConfig()
        self.rng = random.Random(derive_seed(seed, "network"))
        self.now = 0.0
        self.nodes: dict[PeerId, OverlayCore] = {}
        self.crashed: set[PeerId] = set()
        self.stats = NetworkStats()
        self.observers: list[Observer] = []
        # The event queue: a heap of the distinct times that have events, and per time its events
        # in the order they were scheduled. That is the order of a heap of (time, sequence
        # number, ...) tuples, with float comparisons instead of tuple comparisons in the heap
        # (py-spy put 18 % of a compiled sweep worker's samples at N = 10,000 in the tuple heap).
        self._times: list[float] = []
        self._due: dict[float, list[tuple[int, PeerId, Any]]] = {}
        self._tick_at: dict[PeerId, float] = {}
        self._link_index: dict[PeerId, int] = {}
        self._partition_of: dict[PeerId, int] | None = None
        self._count_per_peer = count_per_peer
        self._trace = hashlib.blake2b(digest_size=16) if trace else None
        self._stats_since_s = 0.0

    # ------------------------------------------------------------------ membership and churn

    def node_rng(self, peer: PeerId) -> random.Random:
        """The ``random.Random`` a node with id ``peer`` should be constructed with (seeded)."""
        return random.Random(derive_seed(self.seed, "node", peer))

    def add_node(self, node: OverlayCore, contacts: Sequence[PeerId] = (), at: float | None = None) -> None:
        """Start ``node`` (now, or at virtual time ``at``) with a ``Bootstrap(contacts)`` event."""
        peer = node.peer_id
        if peer in self.nodes or peer in self.crashed:
            raise SimulationError(f"peer id {peer!r} is already in use", seed=self.seed, now_s=self.now)
        self.nodes[peer] = node
        self._link_index[peer] = len(self._link_index)
        self.inject(peer, Bootstrap(tuple(contacts)), at=at)

    def inject(self, peer: PeerId, event: Event, at: float | None = None) -> None:
        """Hand ``event`` to ``peer`` now or at virtual time ``at`` (e.g. JoinTopic, Publish)."""
        if peer not in self.nodes and peer not in self.crashed:
            raise SimulationError(f"inject to unknown peer {peer!r}", seed=self.seed, now_s=self.now)
        self._push(self._at(at), _EVENT, peer, event)

    def call_at(self, at: float, callback: Callable[[], None]) -> None:
        """Run ``callback()`` at virtual time ``at`` (scheduled churn, partitions, checks)."""
        self._push(self._at(at), _CONTROL, None, callback)

    def crash(self, peer: PeerId, at: float | None = None) -> None:
        """Silently stop ``peer`` (now or at ``at``): no goodbye, in-flight messages to it are lost."""
        if at is not None and at > self.now:
            self.call_at(at, lambda: self.crash(peer))
            return
        if peer not in self.nodes:
            raise SimulationError(f"crash of unknown or dead peer {peer!r}", seed=self.seed, now_s=self.now)
        del self.nodes[peer]
        self._tick_at.pop(peer, None)
        self.crashed.add(peer)

    def leave(self, peer: PeerId, drain_s: float = 1.0, at: float | None = None) -> None:
        """Graceful leave: ``Shutdown`` now (or at ``at``), then the node stops ``drain_s`` later."""
        start = self._at(at)
        self.inject(peer, Shutdown(), at=start)
        self.call_at(start + drain_s, lambda: self.crash(peer) if peer in self.nodes else None)

    def partition(self, groups: Iterable[Iterable[PeerId]]) -> None:
        """Split the network: messages between peers of different groups are dropped.

        Peers not named in any group form one further group together.
        """
        partition_of: dict[PeerId, int] = {}
        for index, group in enumerate(groups, start=1):
            for peer in group:
                if peer in partition_of:
                    raise ValueError(f"peer {peer!r} is in two partition groups")
                partition_of[peer] = index
        self._partition_of = partition_of

    def heal(self) -> None:
        """End any partition."""
        self._partition_of = None

    def live_peers(self) -> list[PeerId]:
        """Peers currently running, in the order they were added."""
        return list(self.nodes)

    # ------------------------------------------------------------------ running

    def run_until(self, end_s: float, *, max_events: int | None = None) -> int:
        """Process every event with time <= ``end_s``; the clock ends at ``end_s``. Returns the count."""
        times = self._times
        due = self._due
        processed = 0
        try:
            while times and times[0] <= end_s:
                if max_events is not None and processed >= max_events:
                    raise SimulationError(
                        f"more than {max_events} events before t={end_s}", seed=self.seed, now_s=self.now
                    )
                time_s = times[0]
                events = due[time_s]
                if len(events) == 1:  # the usual case: the only event at this time
                    heapq.heappop(times)
                    del due[time_s]
                    code, peer, payload = events[0]
                else:
                    code, peer, payload = events.pop(0)
                self._step(time_s, code, peer, payload)
                processed += 1
        except SimulationError:
            raise
        except Exception as exc:
            raise SimulationError(f"{type(exc).__name__}: {exc}", seed=self.seed, now_s=self.now) from exc
        if end_s > self.now:
            self.now = end_s
        return processed

    def run_for(self, duration_s: float, *, max_events: int | None = None) -> int:
        """Advance the clock by ``duration_s``."""
        return self.run_until(self.now + duration_s, max_events=max_events)

    def pending(self) -> int:
        """Events waiting in the queue (messages in flight, timers, injections)."""
        return sum(len(events) for events in self._due.values())

    # ------------------------------------------------------------------ reports

    def trace_digest(self) -> str:
        """Hex digest of every handled event so far (requires ``trace=True``)."""
        if self._trace is None:
            raise SimulationError("trace_digest needs Simulator(trace=True)", seed=self.seed, now_s=self.now)
        return self._trace.hexdigest()

    def reset_query_counts(self) -> None:
        """Start a new measurement window for ``query_rates``."""
        self.stats.sent_counts.clear()
        self.stats.sent_by_peer_kind.clear()
        self._stats_since_s = self.now

    def query_rates(self) -> dict[str, dict[str, float]]:
        """Per message kind: total sent, mean and max per node per simulated second in the window."""
        window_s = max(self.now - self._stats_since_s, 1e-9)
        peers = max(len(self.nodes), 1)
        per_kind_max: dict[str, int] = {}
        for (_, kind), count in self.stats.sent_by_peer_kind.items():
            if count > per_kind_max.get(kind, 0):
                per_kind_max[kind] = count
        report: dict[str, dict[str, float]] = {}
        for kind, total in sorted(self.stats.sent_by_kind.items()):
            report[kind] = {
                "total": float(total),
                "mean_per_node_per_s": total / peers / window_s,
                "max_per_node_per_s": per_kind_max.get(kind, 0) / window_s,
            }
        return report

    # ------------------------------------------------------------------ internals

    def _at(self, at: float | None) -> float:
        if at is None:
            return self.now
        if at < self.now:
            raise SimulationError(f"cannot schedule in the past (at={at})", seed=self.seed, now_s=self.now)
        return at

    def _push(self, at: float, code: int, peer: PeerId, payload: Any) -> None:
        events = self._due.get(at)
        if events is None:
            self._due[at] = [(code, peer, payload)]
            heapq.heappush(self._times, at)
        else:
            events.append((code, peer, payload))

    def _step(self, time_s: float, code: int, peer: PeerId, payload: Any) -> None:
        self.now = time_s
        if code == _CONTROL:
            payload()
            return
        node = self.nodes.get(peer)
        if node is None:
            if code == _RECEIVE:
                self.stats.to_dead_peer += 1
            return
        event: Event
        if code == _RECEIVE:
            self.stats.delivered += 1
            sender, message = payload
            if self._trace is None and not self.observers and type(node) is OverlayNode:
                # the same as handle(Receive(...)) without building the event nobody looks at
                self.stats.handled_events += 1
                actions = node.receive(sender, message, time_s)
                if actions:
                    self._carry_out(peer, actions)
                self._schedule_next(peer, time_s, node.next_deadline())
                return
            event = Receive(sender, message)
        elif code == _TICK:
            if self._tick_at.get(peer) != time_s:
                return  # superseded by an earlier deadline that already fired
            del self._tick_at[peer]
            deadline = node.next_deadline()
            if deadline is None:
                return
            if deadline > time_s:
                self._schedule_tick(peer, deadline)
                return
            event = Tick()
        else:
            event = payload
        self.stats.handled_events += 1
        if self._trace is not None:
            self._trace.update(repr((time_s, peer, event)).encode())
        actions = node.handle(event, time_s)
        if actions:
            self._carry_out(peer, actions)
        for observer in self.observers:
            observer(self, peer, event, actions)
        self._schedule_next(peer, time_s, node.next_deadline())

    def _schedule_next(self, peer: PeerId, time_s: float, deadline: float | None) -> None:
        """After ``peer`` handled an event at ``time_s``: tick it at its new deadline if that is
        earlier than the tick already scheduled."""
        if deadline is not None:
            scheduled = self._tick_at.get(peer)
            if scheduled is None or deadline < scheduled:
                self._schedule_tick(peer, max(deadline, time_s))

    def _schedule_tick(self, peer: PeerId, at: float) -> None:
        self._tick_at[peer] = at
        self._push(at, _TICK, peer, None)

    def _carry_out(self, peer: PeerId, actions: list[Action]) -> None:
        stats = self.stats
        network = self.network
        rng = self.rng
        sent_counts = stats.sent_counts
        for action in actions:
            if type(action) is not Send:
                if not isinstance(action, Deliver | SubscriberPresence | PublishDone):
                    raise SimulationError(
                        f"peer {peer!r} returned an unknown action {action!r}", seed=self.seed, now_s=self.now
                    )
                continue
            dest = action.dest
            message = action.message
            kind = getattr(message, "kind", None)
            if not isinstance(kind, str):
                raise SimulationError(
                    f"peer {peer!r} sent a message without a str .kind: {message!r}",
                    seed=self.seed,
                    now_s=self.now,
                )
            stats.sent += 1
            sent_counts[kind] = sent_counts.get(kind, 0) + 1
            if self._count_per_peer:
                stats.sent_by_peer_kind[(peer, kind)] += 1
            if network.loss_rate and rng.random() < network.loss_rate:
                stats.lost += 1
                continue
            partition_of = self._partition_of
            if partition_of is not None and partition_of.get(peer, 0) != partition_of.get(dest, 0):
                stats.partitioned += 1
                continue
            delay_s = network.base_latency_s
            if network.link_spread_s:
                delay_s += network.link_spread_s * self._link_unit(peer, dest)
            if network.jitter_s:
                delay_s += network.jitter_s * rng.random()
            if network.reorder_rate and rng.random() < network.reorder_rate:
                stats.reordered += 1
                delay_s += network.reorder_delay_s * rng.random()
            self._push(self.now + delay_s, _RECEIVE, dest, (peer, message))

    def _link_unit(self, src: PeerId, dest: PeerId) -> float:
        index = self._link_index
        a = index.get(src, 0)
        b = index.get(dest, 0)
        return _mix64((a << 32) ^ b ^ (self.seed << 17)) / 2.0**64
