"""The SQLite store's commit thread: the group COMMIT off the event loop.

Used by ``broker.adapters.sqlite_store.Store`` once the broker gives it a way back to its loop
(``Store.post``, the loop's ``call_soon_threadsafe``): the COMMIT statement of a group commit runs
on this thread, and the loop goes on serving every client meanwhile. The acknowledgements that
depend on the commit still leave only after it returned (``broker.core.durability``). Why: a
COMMIT usually takes ~20 us, but the one that starts SQLite's WAL over fsyncs it, and a write into
a busy disk's page cache can stall; on the loop every message behind it waited
(docs/notes/single-broker.md, "the group commit off the event loop").

One thread, one job at a time: the store never starts a commit while one is in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from queue import SimpleQueue


class CommitThread:
    """Runs one job at a time on a daemon thread; ``done`` is set when the current job returned."""

    def __init__(self, name: str = "skipmq-store-commit") -> None:
        self._jobs: SimpleQueue[tuple[Callable[[], None], Callable[[], object]] | None] = SimpleQueue()
        self.done = threading.Event()
        self.done.set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], then: Callable[[], object]) -> None:
        """Run ``job`` on the thread, set ``done``, then call ``then`` (on the thread: it posts the
        outcome to the loop). The caller waits for ``done`` before the next submit."""
        self.done.clear()
        self._jobs.put((job, then))

    def _run(self) -> None:
        jobs = self._jobs
        done = self.done
        while True:
            item = jobs.get()
            if item is None:
                return
            job, then = item
            try:
                job()
            finally:
                done.set()
            then()

    def stop(self) -> None:
        """Wait for the current job, then end the thread."""
        self.done.wait()
        self._jobs.put(None)
        self._thread.join()
