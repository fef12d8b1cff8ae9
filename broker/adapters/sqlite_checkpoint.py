"""The SQLite store's background checkpointer: PASSIVE WAL checkpoints on a thread of their own.

Used by ``broker.adapters.sqlite_store.Store(checkpoint="background")`` (config
``store.checkpoint``, the broker's default), so that a COMMIT on the event loop neither copies
the WAL into the database nor waits for that copy's fsyncs. Why the constants are what they are:
docs/notes/single-broker.md ("checkpoints off the event loop").
"""

from __future__ import annotations

import sqlite3
import threading
import time

from broker.core.stats import Histogram

# The background checkpointer. A PASSIVE checkpoint on a thread copies the WAL into the database
# (with its two fsyncs) while the event loop keeps committing; SQLite can start the WAL over only
# once every frame is copied, and the COMMIT that starts it over syncs the new WAL header (one
# fsync on the loop, synchronous=NORMAL included). So the thread checkpoints once per
# CHECKPOINT_EVERY_COMMITS commits (a pass that no commit overlaps completes, and the next COMMIT
# starts the WAL over), and under sustained load, where some commit overlaps every pass, SQLite's
# own checkpoint on the store's connection at WAL_BOUND_PAGES completes it (it then copies only
# what came since the thread's last pass). The WAL file is kept up to JOURNAL_SIZE_LIMIT_BYTES, so
# it is reused rather than regrown.
CHECKPOINT_EVERY_COMMITS = 250
WAL_BOUND_PAGES = 10_000
JOURNAL_SIZE_LIMIT_BYTES = 48 * 2**20


class Checkpointer:
    """PASSIVE checkpoints of the store's WAL on a thread with its own connection, so that the
    event loop's COMMIT neither copies pages into the database nor waits for its fsyncs
    (``Store(checkpoint="background")``).

    A PASSIVE checkpoint never takes the writer's lock: the store's connection keeps committing
    while it runs. SQLite starts the WAL over at the next write once every frame has been copied.
    """

    def __init__(self, path: str, synchronous: str) -> None:
        self.wanted = threading.Event()
        self.every_commits = CHECKPOINT_EVERY_COMMITS  # the store sets ``wanted`` this often
        self.passes = 0  # checkpoints run
        self.completed = 0  # passes that copied every frame there was when they started
        self.errors = 0
        self.last_error = ""
        self.last_wal_frames = 0  # the WAL's size in frames at the last pass
        # set by the broker (``Store.count_checkpoints``): outcome -> passes, and each pass's duration
        self.outcomes: dict[str, int] | None = None
        self.seconds: Histogram | None = None
        self._stopping = False
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._thread = threading.Thread(target=self._run, name="skipmq-store-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        wanted = self.wanted
        db = self._db
        while True:
            wanted.wait()
            if self._stopping:
                return
            wanted.clear()
            started = time.perf_counter()
            try:
                # fetchall: the statement runs to its end (no read transaction left open)
                ((_busy, wal_frames, copied),) = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.Error as exc:
                self.errors += 1
                self.last_error = str(exc)
                self._count("failed")
                continue
            seconds = self.seconds
            if seconds is not None:
                seconds.observe(time.perf_counter() - started)
            self.last_wal_frames = wal_frames
            self.passes += 1
            if copied >= wal_frames:
                self.completed += 1
                self._count("completed")
            else:
                self._count("partial")

    def _count(self, outcome: str) -> None:
        outcomes = self.outcomes
        if outcomes is not None:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

    def stop(self) -> None:
        self._stopping = True
        self.wanted.set()
        self._thread.join()
        self._db.close()
