"""The group COMMIT off the event loop (``Store.commit_in_background``, a broker without a cluster).

The first test drives the mechanism (every COMMIT to the thread); the second the default policy
that decides which COMMITs go there (those likely to wait on the disk).

A real in-process broker (``ThreadedBroker``, SQLite store in a temporary directory). The store's
connection is wrapped so that each COMMIT waits at a gate the test opens: while a COMMIT is held,
the broker must go on serving other clients (it runs on the store's commit thread, not on the
loop), and the PUBACK of a message queued for a persistent session must not leave before the
COMMIT that made it durable returned - the PUBACK of a message published while that COMMIT was in
flight not even when it returns (its write is in the next one). Both messages survive a restart.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.adapters import sqlite_store
from broker.adapters.server import ThreadedBroker
from broker.adapters.sqlite_store import Store, StoredMessage
from broker.mqtt.packets import Pingreq, Pingresp, Puback
from tests.support.core import RawClient, start_broker, wait_for, wait_store_idle

__all__ = ["start_broker"]
Start = Callable[..., ThreadedBroker]


class _GatedDb:
    """Wraps the store's sqlite3 connection: every COMMIT waits for the next gate the test opens
    (at most ``GATE_S``, so that a broker that commits on its loop fails the test, not hangs it)."""

    GATE_S = 3.0

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.held = threading.Semaphore(0)  # released once per COMMIT that reached the gate
        self.gates = threading.Semaphore(0)
        self.on_loop: list[bool] = []

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT":
            self.on_loop.append(threading.current_thread().name == "skipmq-broker")
            self.held.release()
            self.gates.acquire(timeout=self.GATE_S)
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_commit_runs_off_the_loop_and_acks_wait_for_their_commit(start_broker: Start, tmp_path: Any) -> None:
    data_dir = tmp_path / "gated"
    threaded = start_broker(data_dir)
    port = threaded.ports["tcp"]
    sub = RawClient(port)
    assert sub.connect("ct-sub", clean=False).reason_code == 0
    sub.subscribe("ct/t", 1)
    sub.disconnect()  # offline: both messages stay queued in the store
    pub = RawClient(port)
    assert pub.connect("ct-pub").reason_code == 0
    other = RawClient(port)
    assert other.connect("ct-other").reason_code == 0

    gated: list[_GatedDb] = []

    def install() -> None:
        store = threaded.broker.store
        assert store is not None
        gated.append(_GatedDb(store._db))
        store._db = gated[0]  # type: ignore[assignment]
        store.background_commits = "always"  # the default sends only likely-slow COMMITs there

    wait_store_idle(threaded)  # the first COMMIT gated must be this publish's, not a late earlier one
    threaded.call(install)
    db = gated[0]
    pub.publish("ct/t", b"first", 1, packet_id=3)
    assert db.held.acquire(timeout=5), "no COMMIT for the first message"
    # the first COMMIT is held: the loop still serves another client at once
    other.send(Pingreq())
    assert isinstance(other.expect(Pingresp, timeout_s=1.5), Pingresp)
    # a second message while the first COMMIT is in flight: its write waits for the next commit
    pub.publish("ct/t", b"second", 1, packet_id=4)
    store = threaded.broker.store
    assert store is not None
    wait_for(lambda: threaded.call(lambda: len(store._deferred_ops)) > 0, timeout_s=3)
    pub.expect_nothing(0.3)  # no PUBACK before the first COMMIT returned
    db.gates.release()  # the first COMMIT returns
    assert pub.expect(Puback).packet_id == 3
    assert db.held.acquire(timeout=5), "no COMMIT for the second message"
    pub.expect_nothing(0.3)  # the second message's PUBACK waits for its own COMMIT
    db.gates.release()
    assert pub.expect(Puback).packet_id == 4
    assert db.on_loop[:2] == [False, False], db.on_loop
    db.GATE_S = 0.0  # let the remaining COMMITs (disconnects, stop) through
    db.gates.release(100)
    pub.disconnect()
    other.disconnect()
    threaded.stop()

    restarted = start_broker(data_dir)
    again = RawClient(restarted.ports["tcp"])
    assert again.connect("ct-sub", clean=False).session_present
    received = [again.expect_publish(), again.expect_publish()]
    assert [m.payload for m in received] == [b"first", b"second"]
    for message in received:
        again.ack(message)
    again.expect_nothing(0.3)


def _queued_commit(store: Store, done: list[BaseException | None]) -> bool:
    """One message queued for "sub" and committed through ``commit_in_background`` if the policy
    sends it there (True), else on this thread."""
    store.enqueue("sub", StoredMessage("t/1", bytes(3000), 1, False, {}, None, "node"))
    if store.commit_in_background(done.append):
        store.wait_background_commit()
        return True
    store.commit()
    return False


def test_adaptive_policy_sends_the_commits_that_wait_on_the_disk_to_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default a COMMIT goes to the thread only when it will start the WAL over (the checkpoint
    thread copied every frame: SQLite fsyncs the new WAL header) or follows a slow one; the others
    stay on the caller's thread (no hand-off per commit). The slow-commit threshold is lifted for
    the first part, so that a COMMIT preempted on a loaded machine does not decide it."""
    monkeypatch.setattr(sqlite_store, "SLOW_COMMIT_S", 60.0)
    monkeypatch.setattr(sqlite_store, "THREAD_WHEN_APART_S", 60.0)  # back to back (see below)
    store = Store(str(tmp_path / "adaptive.db"), checkpoint="background")
    posted: list[Callable[[], object]] = []
    store.post = posted.append
    store.upsert_session("sub", protocol_level=4, expiry_interval_s=60, username=None, disconnected_at=None)
    store.commit()
    done: list[BaseException | None] = []
    checkpointer = store._checkpointer
    assert checkpointer is not None
    store._last_commit_at = time.perf_counter()
    assert [_queued_commit(store, done) for _ in range(5)] == [False] * 5  # quick, nothing due
    completed = checkpointer.completed
    checkpointer.wanted.set()  # a pass with no COMMIT beside it copies every frame
    wait_for(lambda: checkpointer.completed > completed, timeout_s=10)
    assert _queued_commit(store, done)  # this one starts the WAL over: on the thread
    assert done == [None]
    assert not _queued_commit(store, done)
    monkeypatch.setattr(sqlite_store, "SLOW_COMMIT_S", 0.002)
    store._committed(0.05)  # a 50 ms COMMIT (the busy disk of a neighbour's job)
    assert all(_queued_commit(store, done) for _ in range(3))  # the following ones: on the thread
    assert done == [None] * 4
    assert len(posted) == 4  # each background COMMIT posted its return to the "loop"
    store.close()
    reopened = Store(str(tmp_path / "adaptive.db"))
    assert reopened.queue_depth("sub") == 10  # every message committed, whichever thread
    reopened.close()


def test_adaptive_policy_sends_commits_that_come_apart_to_the_thread(tmp_path: Path) -> None:
    """A COMMIT that comes at least THREAD_WHEN_APART_S after the previous one goes to the thread
    (a hand-off is cheap then, and a disk stall without warning does not hold the loop); COMMITs
    back to back stay on the caller's thread."""
    store = Store(str(tmp_path / "apart.db"), checkpoint="background")
    posted: list[Callable[[], object]] = []
    store.post = posted.append
    store.upsert_session("sub", protocol_level=4, expiry_interval_s=60, username=None, disconnected_at=None)
    store.commit()
    done: list[BaseException | None] = []
    time.sleep(sqlite_store.THREAD_WHEN_APART_S * 4)
    assert _queued_commit(store, done)  # after a pause: on the thread
    assert done == [None] and len(posted) == 1
    store._last_commit_at = time.perf_counter() + 60  # the next ones count as back to back
    assert not _queued_commit(store, done)
    store.close()
    reopened = Store(str(tmp_path / "apart.db"))
    assert reopened.queue_depth("sub") == 2
    reopened.close()
