"""The simulation's event loop: a virtual clock, one event queue, seeded randomness.

Everything that happens in a simulation is a callback scheduled at a virtual time; callbacks at
the same time run in the order they were scheduled. :class:`ProcessScheduler` gives one simulated
broker process the core's ``Scheduler`` port on this loop; killing the process (``kill``) drops
every callback it still had scheduled, like ``kill -9`` drops a process's timers.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable
from typing import Any, TypeVar

from broker.core.ports import Completion

T = TypeVar("T")

EPOCH_S = 1_800_000_000.0  # the virtual wall clock's origin (a fixed date: runs replay exactly)


def derive_seed(seed: int, *parts: object) -> int:
    """A 64-bit seed derived from ``seed`` and ``parts``, stable across processes and runs."""
    text = repr((seed, *parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


class SimulationFailure(AssertionError):
    """A simulation broke an invariant; the message names the seed that replays it."""


class _Handle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class World:
    """Virtual time and the event queue of one simulation run."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.now = 0.0
        self.rng = random.Random(derive_seed(seed, "world"))
        self._queue: list[tuple[float, int, _Handle, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.events = 0

    def rng_for(self, *parts: object) -> random.Random:
        return random.Random(derive_seed(self.seed, *parts))

    def at(self, when: float, callback: Callable[..., Any], *args: Any) -> _Handle:
        """Run ``callback(*args)`` at virtual time ``when`` (never in the past)."""
        handle = _Handle()
        self._seq += 1
        heapq.heappush(self._queue, (max(when, self.now), self._seq, handle, callback, args))
        return handle

    def after(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> _Handle:
        return self.at(self.now + max(0.0, delay_s), callback, *args)

    def run_until(self, end_s: float, *, max_events: int = 5_000_000) -> None:
        queue = self._queue
        while queue and queue[0][0] <= end_s:
            when, _seq, handle, callback, args = heapq.heappop(queue)
            if handle.cancelled:
                continue
            self.now = when
            self.events += 1
            if self.events > max_events:
                raise SimulationFailure(f"more than {max_events} events [seed={self.seed}]")
            callback(*args)
        self.now = max(self.now, end_s)

    def run_for(self, duration_s: float) -> None:
        self.run_until(self.now + duration_s)


class ProcessScheduler:
    """``broker.core.ports.Scheduler`` for one simulated broker process.

    ``wall_time`` is the virtual clock plus this process's clock offset (brokers' clocks disagree).
    After :meth:`kill` nothing this process scheduled runs any more.
    """

    def __init__(self, world: World, *, clock_offset_s: float = 0.0, blocking_delay_s: float = 0.0) -> None:
        self.world = world
        self.clock_offset_s = clock_offset_s
        self.blocking_delay_s = blocking_delay_s
        self.alive = True

    def kill(self) -> None:
        self.alive = False

    def time(self) -> float:
        return self.world.now

    def wall_time(self) -> float:
        return EPOCH_S + self.world.now + self.clock_offset_s

    def _guarded(self, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if self.alive:
            callback(*args)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> _Handle:
        return self.world.at(self.world.now, self._guarded, callback, args)

    def call_later(self, delay_s: float, callback: Callable[..., object], *args: Any) -> _Handle:
        return self.world.after(delay_s, self._guarded, callback, args)

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> _Handle:
        return self.world.at(when, self._guarded, callback, args)

    def run_blocking(self, func: Callable[[], T]) -> Completion[T]:
        """Runs ``func`` at once and resolves the completion ``blocking_delay_s`` later."""
        completion: Completion[T] = Completion()
        try:
            result = func()
        except Exception as exc:
            self.call_later(self.blocking_delay_s, completion.set_exception, exc)
        else:
            self.call_later(self.blocking_delay_s, completion.set_result, result)
        return completion
