"""Waiting for subscriptions to become reachable before acknowledging them (pure core).

A SUBACK promises that messages published afterwards reach the subscription, on any broker.
Across the cluster that holds once the class's subscriber virtual node has joined the Skip Graph
(seed 003 §3.5.2: the node is linked into its class's subscriber run at level 0, so the range
multicast of §3.5.4 reaches it, and the rendezvous point learns of it). So the SUBACK of a
subscription whose class is still joining - and the CONNACK of a session that moved here, whose
classes join as it is imported - wait until every class is joined, at most ``timeout_s``
(issue #10, docs/cluster.md "Subscriptions").

Events in (``add`` a wait for topics, ``poll`` with a readiness predicate after each event,
``tick`` with ``now``), finished waits out as ``(wait id, ready)``. No I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

Finished = tuple[int, bool]  # (wait id, every topic ready; False = timed out or aborted)

W = TypeVar("W")


class _BoundedWaits(Generic[W]):
    """Waits, each with what it waits for (``W``), all with the same bound ``timeout_s``: ``tick``
    finishes those past it as not ready, ``abort_all`` every one."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._next_id = 0
        self._waits: dict[int, W] = {}
        self._deadlines: deque[tuple[float, int]] = deque()  # in deadline order (fixed timeout)

    def _add(self, waits_for: W, now: float) -> int:
        self._next_id += 1
        self._waits[self._next_id] = waits_for
        self._deadlines.append((now + self.timeout_s, self._next_id))
        return self._next_id

    def waiting(self) -> bool:
        return bool(self._waits)

    def tick(self, now: float) -> list[Finished]:
        finished: list[Finished] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _at, wait_id = deadlines.popleft()
            if self._waits.pop(wait_id, None) is not None:
                finished.append((wait_id, False))
        return finished

    def next_deadline(self) -> float | None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][1] not in self._waits:
            deadlines.popleft()
        return deadlines[0][0] if deadlines else None

    def abort_all(self) -> list[Finished]:
        finished = [(wait_id, False) for wait_id in self._waits]
        self._waits.clear()
        self._deadlines.clear()
        return finished


class SubscribeWaits(_BoundedWaits[list[str]]):
    def add(self, topics: list[str], now: float) -> int:
        return self._add(list(topics), now)

    def poll(self, is_ready: Callable[[str], bool]) -> list[Finished]:
        finished: list[Finished] = []
        for wait_id, topics in list(self._waits.items()):
            topics[:] = [topic for topic in topics if not is_ready(topic)]
            if not topics:
                del self._waits[wait_id]
                finished.append((wait_id, True))
        return finished


class SessionCopyWaits(_BoundedWaits[tuple[str, int | None]]):
    """SUBACKs of persistent sessions held until the session's state with the subscription is on
    N brokers (``cluster.replicas`` = N > 1; seed 004's acknowledgement stage, "durable on N"),
    at most ``timeout_s`` (``cluster.subscribe_wait_ms``, the bound of every SUBACK wait). A
    SUBACK that followed the local commit only promised a subscription that a disk loss of the
    home took with it: the client reconnected elsewhere to an older copy (session present, no
    subscription) and missed what was published after its SUBACK (seed 145 of the replication
    sweep; docs/notes/replication.md).

    ``add`` a wait for a client's state ``version`` (None: the state is not numbered yet - the
    adapter gives it to the replication later; ``numbered`` names it then), ``poll`` with a
    durability predicate after each event, ``tick`` with ``now``; finished waits out as
    ``(wait id, durable)``. No I/O."""

    def add(self, client_id: str, version: int | None, now: float) -> int:
        return self._add((client_id, version), now)

    def numbered(self, version_of: Callable[[str], int]) -> None:
        """The adapter gave its pending states to the replication: waits without a version take
        the client's version now (0: not a session of the replication's - nothing to wait for)."""
        for wait_id, (client_id, version) in list(self._waits.items()):
            if version is None:
                self._waits[wait_id] = (client_id, version_of(client_id))

    def poll(self, is_durable: Callable[[str, int], bool]) -> list[Finished]:
        finished: list[Finished] = []
        for wait_id, (client_id, version) in list(self._waits.items()):
            if version is not None and (version == 0 or is_durable(client_id, version)):
                del self._waits[wait_id]
                finished.append((wait_id, True))
        return finished
