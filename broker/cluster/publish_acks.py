"""Waiting for remote storage before acknowledging a publisher (pure core).

A QoS 1/2 message accepted here is published on each of its topic classes that has subscribers
(one overlay ``Publish`` per class, seed 003 §3.5.4). The overlay reports ``PublishDone`` once the
whole multicast tree of a publication answered DONE, i.e. every subscriber broker reached stored
the message (docs/cluster.md "When is the publisher acknowledged"). The publisher's PUBACK/PUBREC
waits until every publication of its message is done, or at most ``timeout_s``; then it leaves
anyway, counted as not confirmed. Outcomes: ``(wait id, complete)``.

Events in (open/add/close a wait, a publication done, ``tick``), finished waits out. No I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

Finished = tuple[int, bool]  # (wait id, every publication confirmed)


@dataclass
class _Wait:
    outstanding: set[int] = field(default_factory=set)
    publications: int = 0
    sealed: bool = False  # False while the message is still being handed to the overlay
    complete: bool = True


class PublishAcks:
    """The waits of the QoS>0 messages whose publishers are not acknowledged yet."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._next_id = 0
        self._waits: dict[int, _Wait] = {}
        self._by_publication: dict[int, int] = {}  # publication id -> wait id
        # (deadline, wait id) in closing order = deadline order (``now`` never goes back, the
        # timeout is fixed); finished waits are skipped lazily
        self._deadlines: deque[tuple[float, int]] = deque()

    def open(self) -> int:
        """A new wait; register its publications (``add``) before the overlay sees them."""
        self._next_id += 1
        self._waits[self._next_id] = _Wait()
        return self._next_id

    def add(self, wait_id: int, publication_id: int) -> None:
        wait = self._waits[wait_id]
        wait.outstanding.add(publication_id)
        wait.publications += 1
        self._by_publication[publication_id] = wait_id

    def close(self, wait_id: int, now: float) -> list[Finished]:
        """Every publication is registered. The wait stays open (``is_open``) until its publications
        are done or the deadline passes; it finishes at once if all are already done, and goes
        without an outcome if none was sent."""
        wait = self._waits[wait_id]
        if not wait.outstanding:
            del self._waits[wait_id]
            return [(wait_id, wait.complete)] if wait.publications else []
        wait.sealed = True
        self._deadlines.append((now + self.timeout_s, wait_id))
        return []

    def is_open(self, wait_id: int) -> bool:
        return wait_id in self._waits

    def done(self, publication_id: int, complete: bool) -> list[Finished]:
        """The overlay's ``PublishDone`` for one publication."""
        wait_id = self._by_publication.pop(publication_id, None)
        if wait_id is None:
            return []
        wait = self._waits[wait_id]
        wait.outstanding.discard(publication_id)
        wait.complete = wait.complete and complete
        if wait.outstanding or not wait.sealed:
            return []
        return [self._finish(wait_id, wait.complete)]

    def tick(self, now: float) -> list[Finished]:
        """Waits whose deadline passed finish unconfirmed."""
        deadlines = self._deadlines
        finished: list[Finished] = []
        while deadlines and deadlines[0][0] <= now:
            _deadline, wait_id = deadlines.popleft()
            if wait_id in self._waits:
                finished.append(self._finish(wait_id, False))
        return finished

    def next_deadline(self) -> float | None:
        deadlines = self._deadlines
        waits = self._waits
        while deadlines and deadlines[0][1] not in waits:
            deadlines.popleft()
        return deadlines[0][0] if deadlines else None

    def abort_all(self) -> list[Finished]:
        """Every open wait finishes unconfirmed (the broker stops)."""
        self._deadlines.clear()
        return [self._finish(wait_id, False) for wait_id in list(self._waits)]

    def _finish(self, wait_id: int, complete: bool) -> Finished:
        wait = self._waits.pop(wait_id)
        for publication_id in wait.outstanding:
            self._by_publication.pop(publication_id, None)
        return wait_id, complete
