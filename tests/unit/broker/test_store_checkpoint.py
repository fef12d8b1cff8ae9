"""The store's WAL checkpoints off the event loop (``Store(checkpoint="background")``, the broker's
default): a COMMIT does not copy the WAL into the database, a thread does; the WAL stays bounded;
nothing committed is lost across a crash (``abandon``, as ``kill -9`` leaves the files) and reopen.

The WAL's frame count is read from the WAL-index header in the ``-shm`` file (``mxFrame``, a
32-bit native-order integer at byte 16: https://www.sqlite.org/walformat.html, 2.2.1)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from broker.adapters import sqlite_checkpoint
from broker.adapters.sqlite_store import PUBLISH_SENT, Store, StoredMessage

PAYLOAD = bytes(6000)  # two overflow pages per message: many WAL frames per commit, quickly


def wal_frames(path: str) -> int:
    """Frames in the WAL now (0 after SQLite started it over)."""
    header = Path(path + "-shm").read_bytes()[:24]
    return int.from_bytes(header[16:20], sys.byteorder)


def commit_messages(store: Store, count: int, first_seq: int | None = None) -> int | None:
    """``count`` group commits of one QoS 1 message each, acknowledging the previous one, as the
    broker does for a persistent subscriber; returns the last seq (still queued)."""
    previous = first_seq
    for _ in range(count):
        seq = store.enqueue("sub", StoredMessage("t/1", PAYLOAD, 1, False, {}, None, "node"))
        store.set_inflight("sub", seq, seq % 65535 + 1, PUBLISH_SENT)
        if previous is not None:
            store.ack("sub", previous)
        previous = seq
        store.commit()
    return previous


def open_store(path: str, checkpoint: str) -> Store:
    store = Store(path, checkpoint=checkpoint)
    store.upsert_session("sub", protocol_level=4, expiry_interval_s=3600, username=None, disconnected_at=None)
    store.commit()
    return store


def test_commit_checkpoints_inline_but_not_in_background(tmp_path: Path) -> None:
    frames = {}
    for mode in ("inline", "background"):
        path = str(tmp_path / f"{mode}.db")
        store = open_store(path, mode)
        if store._checkpointer is not None:
            # the thread is never asked: only SQLite's own checkpoint could bring the WAL back
            store._checkpointer.every_commits = 10**9
        commit_messages(store, 600)  # ~3 pages a commit: past SQLite's default 1,000-page checkpoint
        frames[mode] = wal_frames(path)
        store.close()
    assert frames["inline"] < 1000, frames  # a COMMIT crossed 1,000 pages and checkpointed
    assert frames["background"] > 1000, frames  # no COMMIT on the caller's thread checkpointed


class PassWatch:
    """When the checkpoint thread's passes run: the thread clears ``wanted`` just before a pass and
    counts its outcome just after it (``Checkpointer._run``); both are wrapped here, so ``running``
    and ``started``/``ended`` cover at least the time the pass holds SQLite's checkpoint lock."""

    def __init__(self, checkpointer: sqlite_checkpoint.Checkpointer) -> None:
        self.running = False
        self.started = 0
        self.ended = 0
        clear, count = checkpointer.wanted.clear, checkpointer._count

        def cleared() -> None:
            self.running, self.started = True, self.started + 1
            clear()

        def counted(outcome: str) -> None:
            count(outcome)
            self.running, self.ended = False, self.ended + 1

        checkpointer.wanted.clear = cleared  # type: ignore[method-assign]
        checkpointer._count = counted  # type: ignore[method-assign]


def test_background_checkpoints_and_bounds_the_wal(tmp_path: Path) -> None:
    """The WAL starts over at the first COMMIT past ``WAL_BOUND_PAGES`` that overlaps no pass of the
    checkpoint thread: SQLite's own checkpoint on the store's connection (wal_autocheckpoint) then
    copies what is left, and the next COMMIT starts the WAL over (and truncates the file to
    ``JOURNAL_SIZE_LIMIT_BYTES``). That is the guarantee checked here, COMMIT by COMMIT.

    How far past the bound the WAL gets is not: SQLite's checkpoint is PASSIVE and gives up while
    the thread's pass holds the checkpoint lock, so the WAL grows by whatever is committed until
    that pass ends - the pass's copy and fsyncs against the commit rate, i.e. the machine's
    scheduling and disk. (An earlier form asserted at most 1.25 x WAL_BOUND_PAGES and saw 15,011
    pages at load 11; docs/notes/store-wal-bound.md.)"""
    path = str(tmp_path / "store.db")
    store = open_store(path, "background")
    checkpointer = store._checkpointer
    assert checkpointer is not None
    watch = PassWatch(checkpointer)
    bound = sqlite_checkpoint.WAL_BOUND_PAGES
    previous: int | None = None
    frames_before = wal_frames(path)
    free_before = False  # the previous COMMIT overlapped no pass
    checked = restarts = 0
    for _ in range(24 * 300):  # ~3-4 pages a COMMIT: about twice the bound
        seen = (watch.started, watch.ended)
        free = not watch.running
        previous = commit_messages(store, 1, previous)
        frames = wal_frames(path)
        free = free and not watch.running and (watch.started, watch.ended) == seen
        restarts += frames < frames_before
        if frames_before >= bound and free_before and free:
            checked += 1  # SQLite's checkpoint in the previous COMMIT ran: this one starts over
            assert frames < frames_before, (frames_before, frames)
        frames_before, free_before = frames, free
    assert restarts >= 1, (restarts, checked)  # (checked: 0 only if every COMMIT past it overlapped a pass)
    assert checkpointer.passes >= 1 and checkpointer.errors == 0, checkpointer.last_error
    # a pass that no COMMIT overlaps copies every frame, and the next COMMIT starts the WAL over,
    # truncating the file to the size limit
    passes = checkpointer.passes
    checkpointer.wanted.set()
    deadline = time.monotonic() + 30
    while (checkpointer.passes == passes or watch.running) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert checkpointer.passes > passes
    previous = commit_messages(store, 1, previous)
    assert wal_frames(path) < 100, wal_frames(path)
    assert Path(path + "-wal").stat().st_size <= sqlite_checkpoint.JOURNAL_SIZE_LIMIT_BYTES
    store.close()
    assert not checkpointer._thread.is_alive()


def test_background_checkpoint_loses_nothing_committed_across_a_crash(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    store = open_store(path, "background")
    last = commit_messages(store, 1200)  # several background passes
    assert last is not None
    kept = [
        store.enqueue("sub", StoredMessage(f"kept/{n}", b"x%d" % n, 1, False, {}, None, "node"))
        for n in range(5)
    ]
    store.commit()
    store.enqueue("sub", StoredMessage("lost/uncommitted", b"y", 1, False, {}, None, "node"))
    store.abandon()  # the open transaction is rolled back, as kill -9 leaves it
    reopened = Store(path, checkpoint="background")
    entries = reopened.load_queue("sub")
    assert [e.seq for e in entries] == [last, *kept]
    assert [e.message.topic for e in entries[1:]] == [f"kept/{n}" for n in range(5)]
    assert entries[0].message.payload == PAYLOAD and entries[0].state == PUBLISH_SENT
    reopened.close()


def test_memory_store_runs_no_checkpointer() -> None:
    store = Store(":memory:", checkpoint="background")
    assert store._checkpointer is None
    store.close()


def test_bad_checkpoint_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checkpoint must be one of"):
        Store(str(tmp_path / "x.db"), checkpoint="sometimes")


def test_checkpoint_passes_are_counted_and_timed_in_the_metrics(tmp_path: Path) -> None:
    """``skipmq_store_checkpoints_total`` by outcome and ``skipmq_store_checkpoint_seconds`` follow
    the checkpoint thread's passes (scraped through the broker's Prometheus registry)."""
    from prometheus_client.parser import text_string_to_metric_families

    from broker.metrics import BrokerStats, make_registry, render

    stats = BrokerStats()
    store = open_store(str(tmp_path / "metrics.db"), "background")
    store.count_checkpoints(stats.store_checkpoints, stats.store_checkpoint_seconds)
    checkpointer = store._checkpointer
    assert checkpointer is not None
    commit_messages(store, 3 * checkpointer.every_commits)  # asks the thread 3 times
    deadline = time.monotonic() + 10
    while checkpointer.passes + checkpointer.errors < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    store.close()  # joins the thread: no pass runs while the figures are compared
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(render(make_registry(stats))[0].decode())
        for sample in family.samples
    }
    by_outcome = {
        outcome: samples[("skipmq_store_checkpoints_total", (("outcome", outcome),))]
        for outcome in ("completed", "partial", "failed")
    }
    assert checkpointer.passes >= 1, (checkpointer.passes, checkpointer.last_error)
    assert by_outcome["completed"] == checkpointer.completed
    assert by_outcome["completed"] + by_outcome["partial"] == checkpointer.passes
    assert by_outcome["failed"] == checkpointer.errors
    assert samples[("skipmq_store_checkpoint_seconds_count", ())] == checkpointer.passes
    assert samples[("skipmq_store_checkpoint_seconds_sum", ())] > 0
