"""Durable broker state in SQLite: sessions, subscriptions, per-session queues, retained messages.

Follows seed 001 §4.1 (受信済みメッセージの管理, DB-backed queue): every message queued for a
persistent session carries a per-session sequence number, and a queued message is deleted only
when that sequence number is acknowledged (``ack``). Sequence numbers are monotonic and never
reused while the session exists (the counter survives restarts; ``delete_session`` resets it).

Group commit
------------
The broker core (``broker.core.durability``) calls this store synchronously from its event-loop
thread. Every mutating call runs at once inside an open transaction (so later reads see it) and
``commit()`` ends the transaction. The core calls ``commit()`` once per event-loop iteration and
only after it sends the PUBACK/PUBREC that depends on the persisted message. One fsync-free commit
thus covers every message of that iteration.

Durability: ``journal_mode=WAL`` with ``synchronous=NORMAL`` (the default) means a process crash
(``kill -9``) loses nothing that was committed; a power loss or OS crash may lose the last few
commits. ``synchronous=FULL`` (config ``store.synchronous = "full"``) also survives power loss, at
the price of one fsync per commit.

Checkpoints: with ``checkpoint="background"`` (the broker's default, config ``store.checkpoint``)
no COMMIT runs SQLite's automatic checkpoint every 1,000 WAL pages (a copy into the database and
two fsyncs, on the event loop); a thread with its own connection runs PASSIVE checkpoints
(``broker.adapters.sqlite_checkpoint``), and the COMMIT checkpoints only when the WAL reaches
``WAL_BOUND_PAGES``. The commit-before-PUBACK rule is unchanged: a checkpoint only moves
committed pages from the WAL into the database file.

Payloads fanned out to many sessions are stored once: a ``messages`` row carries a reference
count of the ``queue`` rows pointing at it, and a trigger deletes the message when its last queue
row goes (ack, drop, session deletion).

The COMMIT off the event loop: once the broker sets ``post`` (its loop's
``call_soon_threadsafe``), ``commit_in_background`` runs the COMMIT statement on a thread of the
store's own (``broker.adapters.sqlite_commit_thread``) and calls back on the loop when it returned;
the core releases the acknowledgements that waited for it only then. While it is in flight the
hot-path writes (enqueue, set_inflight, ack, sessions, subscriptions, wills, QoS 2 ids, retained)
are recorded and replayed into the next transaction when it returned (``enqueue`` hands out its
sequence number at once from the cached counter); every other call, and every read, first waits
for the COMMIT (``_settle``), so callers always see their own writes.

The store is not thread-safe: use it from one thread at a time (the event-loop thread); the
commit thread touches the connection only while the loop does not.

Size: one class per store (the StorePort on SQLite): the schema, its migrations and every
statement of the port live together so that a reader sees each table's writes and reads in one place
(over 800 lines with the background commit's deferral of the hot-path writes).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from broker.adapters.sqlite_checkpoint import JOURNAL_SIZE_LIMIT_BYTES, WAL_BOUND_PAGES, Checkpointer
from broker.adapters.sqlite_commit_thread import CommitThread
from broker.core.records import (
    PUBLISH_SENT,
    PUBREL_SENT,
    QUEUED,
    QueueEntry,
    SessionRecord,
    StoredMessage,
    StoredSubscription,
    StoreError,
)
from broker.core.stats import Histogram

SCHEMA_VERSION = 1

SYNCHRONOUS_MODES = ("normal", "full")

# "inline": SQLite's automatic checkpoint runs inside the COMMIT that crosses 1,000 WAL pages (on the
# caller's thread, with an fsync of the WAL and of the database); "background": COMMIT never
# checkpoints, a thread of the store's own runs them (see ``Checkpointer``)
CHECKPOINT_MODES = ("inline", "background")

# When a COMMIT goes to the commit thread (``commit_in_background``): "always", or "adaptive" (the
# broker's default) - only a COMMIT likely to wait on the disk, so that the ~20 us ones stay on the
# loop without a thread hand-off each (a thread woken per commit costs CPU and, on a small
# machine, run-queue time): one that will start the WAL over (the checkpoint thread copied every
# frame since: SQLite then fsyncs the new WAL header), one near the WAL bound (its checkpoint), any
# with SQLite's own checkpoints ("inline"), every one for a while after a slow one (a busy disk),
# and any that comes at least THREAD_WHEN_APART_S after the previous one.
BACKGROUND_COMMIT_POLICIES = ("adaptive", "always")
SLOW_COMMIT_S = 0.002
SLOW_SPELL_COMMITS = 1000
NEAR_BOUND_FRAMES = WAL_BOUND_PAGES - 2_000
# "adaptive" also sends a COMMIT to the thread when the previous one started at least this long
# ago: under ~2,000 commits a second the hand-off costs little, and a COMMIT that blocks on the
# disk without warning (a neighbour's fsync) then never holds the loop; above that rate the
# hand-offs' CPU and wake-ups cost more than they save on 2 cores (docs/notes/single-broker.md)
THREAD_WHEN_APART_S = 0.0005

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    client_id TEXT PRIMARY KEY,
    protocol_level INTEGER NOT NULL,
    expiry_interval_s INTEGER NOT NULL,
    username TEXT,
    disconnected_at REAL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscriptions (
    client_id TEXT NOT NULL,
    topic_filter TEXT NOT NULL,
    qos INTEGER NOT NULL,
    no_local INTEGER NOT NULL,
    retain_as_published INTEGER NOT NULL,
    retain_handling INTEGER NOT NULL,
    subscription_identifier INTEGER,
    PRIMARY KEY (client_id, topic_filter)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS seq_counters (
    client_id TEXT PRIMARY KEY,
    next_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    properties TEXT,
    expiry_at REAL,
    origin TEXT NOT NULL,
    refcount INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS queue (
    client_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message_id INTEGER NOT NULL,
    packet_id INTEGER,
    state INTEGER NOT NULL,
    subscription_identifiers TEXT,
    PRIMARY KEY (client_id, seq)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS queue_row_released AFTER DELETE ON queue BEGIN
    UPDATE messages SET refcount = refcount - 1 WHERE id = OLD.message_id;
    DELETE FROM messages WHERE id = OLD.message_id AND refcount <= 0;
END;
CREATE TABLE IF NOT EXISTS incoming_qos2 (
    client_id TEXT NOT NULL,
    packet_id INTEGER NOT NULL,
    PRIMARY KEY (client_id, packet_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS retained (
    topic TEXT PRIMARY KEY,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    properties TEXT,
    expiry_at REAL,
    origin TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS wills (
    client_id TEXT PRIMARY KEY,
    will BLOB NOT NULL,
    fire_at REAL
) WITHOUT ROWID;
"""


# --- lossless property serialization -------------------------------------------------------------
# JSON with tags: bytes -> {"b": hex}, tuple -> {"t": [...]}, dict -> {"d": {...}}; lists, str, int,
# float, bool and None as themselves. Plain dicts are always wrapped, so a tag is never ambiguous.


def _encode_value(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float)):  # bool is an int
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"b": bytes(value).hex()}
    if isinstance(value, tuple):
        return {"t": [_encode_value(item) for item in value]}
    if isinstance(value, list):
        return [_encode_value(item) for item in value]
    if isinstance(value, dict):
        return {"d": {_require_str_key(key): _encode_value(item) for key, item in value.items()}}
    raise StoreError(f"cannot store property value of type {type(value).__name__}: {value!r}")


def _require_str_key(key: Any) -> str:
    if not isinstance(key, str):
        raise StoreError(f"property names must be str, got {type(key).__name__}: {key!r}")
    return key


def _decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_value(item) for item in value]
    if isinstance(value, dict):
        if "b" in value:
            return bytes.fromhex(value["b"])
        if "t" in value:
            return tuple(_decode_value(item) for item in value["t"])
        return {key: _decode_value(item) for key, item in value["d"].items()}
    return value


def encode_properties(properties: dict[str, Any]) -> str | None:
    """Serialize MQTT properties losslessly (bytes, tuples, nested lists); None when empty."""
    if not properties:
        return None
    return json.dumps(
        {_require_str_key(key): _encode_value(value) for key, value in properties.items()},
        separators=(",", ":"),
    )


def decode_properties(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    return {key: _decode_value(value) for key, value in json.loads(text).items()}


def _encode_ids(ids: list[int]) -> str | None:
    return ",".join(map(str, ids)) if ids else None


def _decode_ids(text: str | None) -> list[int]:
    return [int(part) for part in text.split(",")] if text else []


def _check_qos(qos: int) -> None:
    if qos not in (0, 1, 2):
        raise ValueError(f"qos must be 0, 1 or 2, got {qos!r}")


@dataclass(slots=True)
class _MessageCacheEntry:
    """The last message row written in this transaction, to store a fan-out payload once."""

    message: StoredMessage
    fingerprint: tuple[Any, ...]
    properties: dict[str, Any]
    row_id: int


def _fingerprint(message: StoredMessage) -> tuple[Any, ...]:
    return (message.topic, message.payload, message.qos, message.retain, message.expiry_at, message.origin)


@dataclass(slots=True)
class _Counters:
    next_seq: dict[str, int] = field(default_factory=dict)  # loaded lazily
    # Counters to write at commit. On restart the next seq is max(stored counter, largest queued
    # seq + 1), so the stored counter only matters once the largest queued seq is deleted: only
    # deletions mark a counter dirty, and enqueue-only commits write no counter row.
    dirty: set[str] = field(default_factory=set)
    depth: dict[str, int] = field(default_factory=dict)  # queue depth cache, loaded lazily


class Store:
    """SQLite-backed durable state with group commit (see the module docstring); implements
    ``broker.core.ports.StorePort``."""

    # what a failing store raises: the core then rewrites the store from memory
    errors: tuple[type[BaseException], ...] = (StoreError, sqlite3.Error)

    def __init__(self, path: str, *, synchronous: str = "normal", checkpoint: str = "inline") -> None:
        if synchronous not in SYNCHRONOUS_MODES:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS_MODES}, got {synchronous!r}")
        if checkpoint not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoint must be one of {CHECKPOINT_MODES}, got {checkpoint!r}")
        self.path = path
        # isolation_level=None: we issue BEGIN/COMMIT ourselves (group commit).
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            journal_mode = self._db.execute("PRAGMA journal_mode=WAL").fetchall()[0][0]
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {path!r}: {exc}") from exc
        self._closed = False
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._db.execute("PRAGMA foreign_keys=OFF")
        self._create_schema()
        self._counters = _Counters()
        self._last_message: _MessageCacheEntry | None = None
        # called inside the open transaction right before COMMIT (the cluster store's batched rows)
        self.before_commit: list[Callable[[], None]] = []
        # each COMMIT's duration goes here when set (``skipmq_store_commit_seconds``; the server
        # sets the broker's ``stats.store_commit_seconds``): once per group commit, not per message
        self.commit_seconds: Histogram | None = None
        self._checkpointer: Checkpointer | None = None
        self._commits_since_checkpoint = 0
        # the COMMIT off the loop: ``post`` (set by the broker: its loop's call_soon_threadsafe)
        # enables ``commit_in_background``; see the module docstring
        self.post: Callable[[Callable[[], None]], object] | None = None
        self._commit_thread: CommitThread | None = None
        self.background_commits = "adaptive"  # BACKGROUND_COMMIT_POLICIES
        self._slow_spell = 0  # commits left that go to the thread after a slow one
        self._last_commit_at = 0.0  # perf_counter() of the last group commit (THREAD_WHEN_APART_S)
        self._completed_seen = 0  # the checkpoint thread's completed passes, as of the last COMMIT
        self._bg_expected_slow = False  # the COMMIT in flight was sent for its WAL restart or bound
        self._bg_running = False  # a COMMIT is in flight on the commit thread: the loop keeps off _db
        self._bg_generation = 0
        self._bg_outcome: tuple[float, BaseException | None] = (0.0, None)
        self._bg_error: BaseException | None = None  # the in-flight COMMIT's failure, for ``done``
        self._bg_done: Callable[[BaseException | None], None] | None = None
        self._deferred_ops: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._replay_error: BaseException | None = None  # a replayed write failed: next commit fails
        if checkpoint == "background" and journal_mode == "wal":  # not ":memory:"
            self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_BOUND_PAGES}")
            self._db.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT_BYTES}")
            try:
                self._checkpointer = Checkpointer(path, synchronous)
            except sqlite3.Error as exc:
                self._db.close()
                self._closed = True
                raise StoreError(f"cannot open store {path!r} for checkpoints: {exc}") from exc

    def count_checkpoints(self, outcomes: dict[str, int], seconds: Histogram) -> None:
        """Count the background checkpoints' passes by outcome and time them (the broker's
        ``skipmq_store_checkpoints_total`` and ``skipmq_store_checkpoint_seconds``)."""
        if self._checkpointer is not None:
            self._checkpointer.outcomes = outcomes
            self._checkpointer.seconds = seconds

    @property
    def checkpoints_run(self) -> int:
        """Passes of the background checkpointer so far (0 when inline)."""
        return self._checkpointer.passes if self._checkpointer is not None else 0

    # --- schema and transactions ------------------------------------------------------------------

    def _create_schema(self) -> None:
        try:
            self._db.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
            self._db.execute("BEGIN IMMEDIATE")
            rows = self._db.execute("SELECT version FROM schema_version").fetchall()
            if not rows:
                self._db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            elif rows[0][0] != SCHEMA_VERSION:
                raise StoreError(
                    f"store {self.path!r} has schema version {rows[0][0]}, this broker needs {SCHEMA_VERSION}"
                )
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            self._db.close()
            self._closed = True
            raise

    @property
    def db(self) -> sqlite3.Connection:
        """The connection, for adapters that keep their own tables in this store's transactions
        (waits for a COMMIT in flight on the commit thread)."""
        self._settle()
        return self._db

    def begin(self) -> None:
        """Join (or open) the group-commit transaction."""
        self._begin()

    def _begin(self) -> None:
        if self._closed:
            raise StoreError("store is closed")
        if self._bg_running:
            self._settle()
        if not self._db.in_transaction:
            self._db.execute("BEGIN")

    def _write(self, op: Callable[..., Any], *args: Any) -> None:
        """Run a write now, or record it for the next transaction while a COMMIT is in flight."""
        if self._bg_running:
            self._deferred_ops.append((op, args))
        else:
            op(*args)

    @property
    def pending(self) -> bool:
        """True when there is uncommitted work."""
        if self._closed:
            return False
        if self._bg_running:
            return bool(self._deferred_ops)
        return self._db.in_transaction

    def commit(self) -> None:
        """End the open transaction, making everything since the last commit durable (on the
        caller's thread; a COMMIT in flight on the commit thread is waited for first)."""
        if self._closed:
            return
        self._settle()
        self._raise_replay_error()
        if not self._db.in_transaction:
            return
        self._prepare_commit()
        started = time.perf_counter()
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._commit_failed(exc) from exc
        self._committed(time.perf_counter() - started)

    def _prepare_commit(self) -> None:
        for hook in self.before_commit:
            hook()
        counters = self._counters
        if counters.dirty:
            self._db.executemany(
                "INSERT INTO seq_counters (client_id, next_seq) VALUES (?, ?) "
                "ON CONFLICT(client_id) DO UPDATE SET next_seq = excluded.next_seq",
                [(client_id, counters.next_seq[client_id]) for client_id in counters.dirty],
            )
            counters.dirty.clear()
        self._last_message = None

    def _commit_failed(self, exc: BaseException) -> StoreError:
        if not self._db.in_transaction:  # SQLite rolled the transaction back (e.g. disk full)
            # Depths are recounted from the database; seq counters stay ahead, so a seq handed
            # out in the lost transaction is still never reused.
            self._counters.depth.clear()
        return StoreError(f"commit to store {self.path!r} failed: {exc}")

    def _raise_replay_error(self) -> None:
        error = self._replay_error
        if error is not None:
            self._replay_error = None
            raise StoreError(f"a write replayed after a background commit failed: {error}") from error

    # --- the COMMIT on the commit thread ----------------------------------------------------------

    def commit_in_background(self, done: Callable[[BaseException | None], None]) -> bool:
        """Start the group COMMIT on the commit thread; ``done(error)`` is called on the loop once
        it returned (``error`` None: durable). False, and nothing started, when there is nothing
        to commit, a COMMIT is already in flight, or no ``post`` was given (then call ``commit``).
        Raises like ``commit`` when the transaction cannot be prepared."""
        post = self.post
        if post is None or self._closed or self._bg_running or not self._db.in_transaction:
            return False
        if not self._commit_may_block():
            return False
        self._raise_replay_error()
        thread = self._commit_thread
        if thread is None:
            thread = self._commit_thread = CommitThread()
        self._prepare_commit()
        self._bg_running = True
        self._bg_done = done
        self._bg_generation += 1
        thread.submit(self._commit_on_thread, partial(post, partial(self._bg_returned, self._bg_generation)))
        return True

    def _commit_may_block(self) -> bool:
        """Whether this COMMIT goes to the thread: likely to wait on the disk, or the commits are
        far enough apart that a hand-off costs little (see BACKGROUND_COMMIT_POLICIES)."""
        self._bg_expected_slow = False
        now = time.perf_counter()
        spaced = now - self._last_commit_at >= THREAD_WHEN_APART_S
        self._last_commit_at = now
        if self.background_commits == "always" or self._slow_spell > 0:
            return True
        checkpointer = self._checkpointer
        if checkpointer is None:  # SQLite's own checkpoint may run in any COMMIT
            return True
        completed = checkpointer.completed
        if completed != self._completed_seen:  # every frame copied: this COMMIT restarts the WAL
            self._completed_seen = completed
            self._bg_expected_slow = True
        elif checkpointer.last_wal_frames >= NEAR_BOUND_FRAMES:
            self._bg_expected_slow = True
        return self._bg_expected_slow or spaced

    def _commit_on_thread(self) -> None:
        started = time.perf_counter()
        try:
            self._db.execute("COMMIT")
        except BaseException as exc:
            self._bg_outcome = (time.perf_counter() - started, exc)
            return
        self._bg_outcome = (time.perf_counter() - started, None)

    def _bg_returned(self, generation: int) -> None:
        """On the loop: the background COMMIT returned (posted by the commit thread)."""
        if generation == self._bg_generation:
            self.wait_background_commit()

    def wait_background_commit(self) -> None:
        """Wait for a COMMIT in flight on the commit thread, replay the writes recorded meanwhile
        and call its ``done`` (on the loop; at once if it already returned)."""
        self._settle()
        done = self._bg_done
        if done is not None:
            self._bg_done = None
            error = self._bg_error
            self._bg_error = None
            done(error)

    def _settle(self) -> None:
        """Take the connection back from the commit thread (waiting for its COMMIT) and replay the
        writes recorded meanwhile into the next transaction; ``done`` is left to the caller."""
        if not self._bg_running:
            return
        thread = self._commit_thread
        assert thread is not None
        thread.done.wait()
        self._bg_running = False
        seconds, error = self._bg_outcome
        if error is None:
            # a WAL restart's header fsync was expected to be slow: no sign of a busy disk
            self._committed(seconds, expected_slow=self._bg_expected_slow)
        else:
            self._bg_error = self._commit_failed(error)
        ops = self._deferred_ops
        self._deferred_ops = []
        for op, args in ops:
            try:
                op(*args)
            except Exception as exc:  # the core rewrites the store from memory before the next commit
                self._replay_error = exc

    def _committed(self, seconds: float, *, expected_slow: bool = False) -> None:
        if seconds >= SLOW_COMMIT_S and not expected_slow:
            self._slow_spell = SLOW_SPELL_COMMITS
        elif self._slow_spell:
            self._slow_spell -= 1
        histogram = self.commit_seconds
        if histogram is not None:
            histogram.observe(seconds)
        if self._checkpointer is not None:
            self._commits_since_checkpoint += 1
            if self._commits_since_checkpoint >= self._checkpointer.every_commits:
                self._commits_since_checkpoint = 0
                self._checkpointer.wanted.set()

    def close(self) -> None:
        """Commit pending work and close the database. Idempotent."""
        if self._closed:
            return
        self.commit()
        self._stop_threads()
        self._db.close()
        self._closed = True

    def _stop_threads(self) -> None:
        self._settle()
        thread = self._commit_thread
        if thread is not None:
            self._commit_thread = None
            thread.stop()
        self._stop_checkpointer()

    def _stop_checkpointer(self) -> None:
        checkpointer = self._checkpointer
        if checkpointer is not None:
            self._checkpointer = None
            checkpointer.stop()

    def abandon(self) -> None:
        """Close the database without committing: the open transaction is rolled back, as a
        ``kill -9`` of the broker leaves it (the whole-cluster simulation's crash). Idempotent."""
        if self._closed:
            return
        self._stop_threads()
        self._db.close()
        self._closed = True

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- sessions ---------------------------------------------------------------------------------

    def upsert_session(
        self,
        client_id: str,
        *,
        protocol_level: int,
        expiry_interval_s: int,
        username: str | None,
        disconnected_at: float | None,
    ) -> None:
        if expiry_interval_s < 0:
            raise ValueError(f"expiry_interval_s must be >= 0, got {expiry_interval_s!r}")
        self._write(
            self._upsert_session, client_id, protocol_level, expiry_interval_s, username, disconnected_at
        )

    def _upsert_session(
        self,
        client_id: str,
        protocol_level: int,
        expiry_interval_s: int,
        username: str | None,
        disconnected_at: float | None,
    ) -> None:
        self._begin()
        self._db.execute(
            "INSERT INTO sessions (client_id, protocol_level, expiry_interval_s, username, disconnected_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT(client_id) DO UPDATE SET "
            "protocol_level = excluded.protocol_level, expiry_interval_s = excluded.expiry_interval_s, "
            "username = excluded.username, disconnected_at = excluded.disconnected_at",
            (client_id, protocol_level, expiry_interval_s, username, disconnected_at),
        )

    def delete_session(self, client_id: str) -> None:
        """Remove the session with its subscriptions, queue, incoming QoS 2 ids, will and seq counter."""
        self._begin()
        db = self._db
        db.execute("DELETE FROM sessions WHERE client_id = ?", (client_id,))
        db.execute("DELETE FROM subscriptions WHERE client_id = ?", (client_id,))
        db.execute("DELETE FROM queue WHERE client_id = ?", (client_id,))
        db.execute("DELETE FROM incoming_qos2 WHERE client_id = ?", (client_id,))
        db.execute("DELETE FROM wills WHERE client_id = ?", (client_id,))
        db.execute("DELETE FROM seq_counters WHERE client_id = ?", (client_id,))
        counters = self._counters
        counters.next_seq.pop(client_id, None)
        counters.dirty.discard(client_id)
        counters.depth[client_id] = 0

    def load_sessions(self) -> list[SessionRecord]:
        """Every stored session with its subscriptions, incoming QoS 2 ids, will and next seq."""
        self._settle()
        db = self._db
        subscriptions: dict[str, list[StoredSubscription]] = {}
        for row in db.execute(
            "SELECT client_id, topic_filter, qos, no_local, retain_as_published, retain_handling, "
            "subscription_identifier FROM subscriptions ORDER BY client_id, topic_filter"
        ):
            subscriptions.setdefault(row[0], []).append(
                StoredSubscription(row[1], row[2], bool(row[3]), bool(row[4]), row[5], row[6])
            )
        qos2: dict[str, set[int]] = {}
        for client_id, packet_id in db.execute("SELECT client_id, packet_id FROM incoming_qos2"):
            qos2.setdefault(client_id, set()).add(packet_id)
        wills = {row[0]: (row[1], row[2]) for row in db.execute("SELECT client_id, will, fire_at FROM wills")}
        records = []
        for client_id, protocol_level, expiry_interval_s, username, disconnected_at in db.execute(
            "SELECT client_id, protocol_level, expiry_interval_s, username, disconnected_at "
            "FROM sessions ORDER BY client_id"
        ).fetchall():
            will, will_fire_at = wills.get(client_id, (None, None))
            records.append(
                SessionRecord(
                    client_id=client_id,
                    protocol_level=protocol_level,
                    expiry_interval_s=expiry_interval_s,
                    username=username,
                    disconnected_at=disconnected_at,
                    subscriptions=subscriptions.get(client_id, []),
                    next_seq=self._next_seq(client_id),
                    incoming_qos2=qos2.get(client_id, set()),
                    will=will,
                    will_fire_at=will_fire_at,
                )
            )
        return records

    # --- subscriptions ----------------------------------------------------------------------------

    def add_subscription(self, client_id: str, sub: StoredSubscription) -> None:
        """Insert or replace (by topic filter) one subscription of a session."""
        _check_qos(sub.qos)
        if sub.retain_handling not in (0, 1, 2):
            raise ValueError(f"retain_handling must be 0, 1 or 2, got {sub.retain_handling!r}")
        self._write(self._add_subscription, client_id, sub)

    def _add_subscription(self, client_id: str, sub: StoredSubscription) -> None:
        self._begin()
        self._db.execute(
            "INSERT INTO subscriptions (client_id, topic_filter, qos, no_local, retain_as_published, "
            "retain_handling, subscription_identifier) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(client_id, topic_filter) DO UPDATE SET qos = excluded.qos, "
            "no_local = excluded.no_local, retain_as_published = excluded.retain_as_published, "
            "retain_handling = excluded.retain_handling, "
            "subscription_identifier = excluded.subscription_identifier",
            (
                client_id,
                sub.topic_filter,
                sub.qos,
                int(sub.no_local),
                int(sub.retain_as_published),
                sub.retain_handling,
                sub.subscription_identifier,
            ),
        )

    def remove_subscription(self, client_id: str, topic_filter: str) -> None:
        self._write(self._remove_subscription, client_id, topic_filter)

    def _remove_subscription(self, client_id: str, topic_filter: str) -> None:
        self._begin()
        self._db.execute(
            "DELETE FROM subscriptions WHERE client_id = ? AND topic_filter = ?", (client_id, topic_filter)
        )

    # --- queues -----------------------------------------------------------------------------------

    def _next_seq(self, client_id: str) -> int:
        next_seq = self._counters.next_seq.get(client_id)
        if next_seq is None:
            row = self._db.execute(
                "SELECT next_seq FROM seq_counters WHERE client_id = ?", (client_id,)
            ).fetchone()
            stored = row[0] if row else 1
            # Never below what the queue already holds (belt and braces against a lost counter row).
            row = self._db.execute("SELECT MAX(seq) FROM queue WHERE client_id = ?", (client_id,)).fetchone()
            next_seq = max(stored, (row[0] or 0) + 1)
            self._counters.next_seq[client_id] = next_seq
        return next_seq

    def _message_row(self, message: StoredMessage) -> int:
        """Row id of ``message`` in ``messages`` with one more reference, inserting it if needed."""
        cached = self._last_message
        if (
            cached is not None
            and cached.fingerprint == _fingerprint(message)
            and cached.properties == message.properties
        ):
            cursor = self._db.execute(
                "UPDATE messages SET refcount = refcount + 1 WHERE id = ?", (cached.row_id,)
            )
            if cursor.rowcount == 1:
                return cached.row_id
        return self._insert_message(message, 1)

    def _insert_message(self, message: StoredMessage, refcount: int) -> int:
        _check_qos(message.qos)
        cursor = self._db.execute(
            "INSERT INTO messages (topic, payload, qos, retain, properties, expiry_at, origin, refcount) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                message.topic,
                bytes(message.payload),
                message.qos,
                int(message.retain),
                encode_properties(message.properties),
                message.expiry_at,
                message.origin,
                refcount,
            ),
        )
        row_id = cursor.lastrowid
        assert row_id is not None
        # Every insert refreshes the cache, so a cached id can never name a reused row id.
        self._last_message = _MessageCacheEntry(
            message, _fingerprint(message), dict(message.properties), row_id
        )
        return row_id

    def _append(
        self, client_id: str, message: StoredMessage, subscription_identifiers: list[int] | None, seq: int
    ) -> None:
        """Insert queue entry ``seq`` (handed out by ``enqueue``) with its message row."""
        self._begin()
        message_id = self._message_row(message)
        counters = self._counters
        self._db.execute(
            "INSERT INTO queue (client_id, seq, message_id, packet_id, state, subscription_identifiers) "
            "VALUES (?, ?, ?, NULL, 0, ?)",
            (
                client_id,
                seq,
                message_id,
                _encode_ids(subscription_identifiers) if subscription_identifiers else None,
            ),
        )
        depth = counters.depth.get(client_id)
        if depth is not None:
            counters.depth[client_id] = depth + 1

    def enqueue(
        self, client_id: str, message: StoredMessage, subscription_identifiers: list[int] | None = None
    ) -> int:
        """Append ``message`` to the session's queue; return its new sequence number.

        Enqueueing the same message (same object or equal content) to several sessions within one
        transaction stores its payload once.
        """
        next_seqs = self._counters.next_seq
        seq = next_seqs.get(client_id)
        if seq is None or not self._bg_running:
            self._begin()
            seq = self._next_seq(client_id)
        next_seqs[client_id] = seq + 1
        self._write(self._append, client_id, message, subscription_identifiers, seq)
        return seq

    def enqueue_many(
        self,
        client_ids: list[str],
        message: StoredMessage,
        subscription_identifiers: list[list[int]] | None = None,
    ) -> list[int]:
        """Queue one message for many sessions, storing the payload once; return each new seq.

        ``subscription_identifiers``, when given, holds one list per client id (same order).
        """
        if not client_ids:
            return []
        if subscription_identifiers is not None and len(subscription_identifiers) != len(client_ids):
            raise ValueError(
                f"subscription_identifiers has {len(subscription_identifiers)} lists "
                f"for {len(client_ids)} client ids"
            )
        self._begin()
        message_id = self._insert_message(message, len(client_ids))
        counters = self._counters
        next_seqs = counters.next_seq
        depths = counters.depth
        seqs: list[int] = []
        rows: list[tuple[str, int, int, str | None]] = []
        for index, client_id in enumerate(client_ids):
            seq = next_seqs.get(client_id) or self._next_seq(client_id)
            next_seqs[client_id] = seq + 1
            depth = depths.get(client_id)
            if depth is not None:
                depths[client_id] = depth + 1
            ids = subscription_identifiers[index] if subscription_identifiers is not None else None
            rows.append((client_id, seq, message_id, _encode_ids(ids) if ids else None))
            seqs.append(seq)
        self._db.executemany(
            "INSERT INTO queue (client_id, seq, message_id, packet_id, state, subscription_identifiers) "
            "VALUES (?, ?, ?, NULL, 0, ?)",
            rows,
        )
        return seqs

    def set_inflight(self, client_id: str, seq: int, packet_id: int | None, state: int) -> None:
        """Record that queue entry ``seq`` was sent with ``packet_id`` and is now in ``state``."""
        if state not in (QUEUED, PUBLISH_SENT, PUBREL_SENT):
            raise ValueError(f"state must be 0 (queued), 1 (PUBLISH sent) or 2 (PUBREL sent), got {state!r}")
        if packet_id is not None and not 1 <= packet_id <= 65535:
            raise ValueError(f"packet_id must be in 1..65535 or None, got {packet_id!r}")
        self._write(self._set_inflight, client_id, seq, packet_id, state)

    def _set_inflight(self, client_id: str, seq: int, packet_id: int | None, state: int) -> None:
        self._begin()
        cursor = self._db.execute(
            "UPDATE queue SET packet_id = ?, state = ? WHERE client_id = ? AND seq = ?",
            (packet_id, state, client_id, seq),
        )
        if cursor.rowcount == 0:
            raise StoreError(f"no queued message with seq {seq} for client {client_id!r}")

    def ack(self, client_id: str, seq: int) -> None:
        """Delete queue entry ``seq`` (seed 001 §4.1: only on acknowledgement). Unknown seq: no-op."""
        self._write(self._ack, client_id, seq)

    def _ack(self, client_id: str, seq: int) -> None:
        self._begin()
        next_seq = self._next_seq(client_id)  # before the delete, which may remove the largest seq
        cursor = self._db.execute("DELETE FROM queue WHERE client_id = ? AND seq = ?", (client_id, seq))
        if cursor.rowcount:
            counters = self._counters
            depth = counters.depth.get(client_id)
            if depth is not None:
                counters.depth[client_id] = depth - 1
            if seq >= next_seq - 1:  # the newest entry: persist the counter
                counters.dirty.add(client_id)

    def ack_many(self, client_id: str, seqs: list[int]) -> int:
        """Delete every listed queue entry (e.g. a pull request's acknowledged seqs).

        Unknown seqs are ignored; returns how many entries were deleted.
        """
        if not seqs:
            return 0
        self._begin()
        self._next_seq(client_id)  # cache the counter before the delete may remove the largest seq
        cursor = self._db.executemany(
            "DELETE FROM queue WHERE client_id = ? AND seq = ?", [(client_id, seq) for seq in seqs]
        )
        deleted = cursor.rowcount  # summed over the statements; trigger changes not included
        if deleted:
            self._deleted(client_id, deleted)
        return deleted

    def _deleted(self, client_id: str, count: int) -> None:
        """Bookkeeping after ``count`` queue entries of ``client_id`` were deleted."""
        counters = self._counters
        depth = counters.depth.get(client_id)
        if depth is not None:
            counters.depth[client_id] = depth - count
        counters.dirty.add(client_id)  # the caller cached the counter before deleting

    def load_queue(self, client_id: str, limit: int | None = None) -> list[QueueEntry]:
        """The session's queue entries in sequence order (at most ``limit``)."""
        sql = (
            "SELECT q.seq, q.packet_id, q.state, q.subscription_identifiers, m.topic, m.payload, m.qos, "
            "m.retain, m.properties, m.expiry_at, m.origin "
            "FROM queue q JOIN messages m ON m.id = q.message_id WHERE q.client_id = ? ORDER BY q.seq"
        )
        self._settle()
        params: tuple[Any, ...] = (client_id,)
        if limit is not None:
            if limit < 0:
                raise ValueError(f"limit must be >= 0 or None, got {limit!r}")
            sql += " LIMIT ?"
            params = (client_id, limit)
        return [
            QueueEntry(
                seq=row[0],
                message=StoredMessage(
                    row[4], row[5], row[6], bool(row[7]), decode_properties(row[8]), row[9], row[10]
                ),
                packet_id=row[1],
                state=row[2],
                subscription_identifiers=_decode_ids(row[3]),
            )
            for row in self._db.execute(sql, params)
        ]

    def queue_depth(self, client_id: str) -> int:
        """Number of entries (queued and in flight) in the session's queue."""
        self._settle()
        depth = self._counters.depth.get(client_id)
        if depth is None:
            depth = self._db.execute(
                "SELECT COUNT(*) FROM queue WHERE client_id = ?", (client_id,)
            ).fetchone()[0]
            self._counters.depth[client_id] = depth
        return depth

    def drop_oldest(self, client_id: str, count: int) -> int:
        """Delete up to ``count`` of the oldest entries still waiting to be sent (state 0).

        Entries already in flight are never dropped: the client may still acknowledge them.
        Returns how many were dropped.
        """
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count!r}")
        if count == 0:
            return 0
        self._begin()
        self._next_seq(client_id)  # cache the counter before the delete may remove the largest seq
        cursor = self._db.execute(
            "DELETE FROM queue WHERE client_id = ? AND seq IN ("
            "SELECT seq FROM queue WHERE client_id = ? AND state = 0 ORDER BY seq LIMIT ?)",
            (client_id, client_id, count),
        )
        dropped = cursor.rowcount
        if dropped:
            self._deleted(client_id, dropped)
        return dropped

    def message_count(self) -> int:
        """Number of distinct stored queued payloads (fan-out copies share one)."""
        self._settle()
        return int(self._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0])

    # --- incoming QoS 2 ---------------------------------------------------------------------------

    def add_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        if not 1 <= packet_id <= 65535:
            raise ValueError(f"packet_id must be in 1..65535, got {packet_id!r}")
        self._write(self._add_incoming_qos2, client_id, packet_id)

    def _add_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        self._begin()
        self._db.execute(
            "INSERT OR IGNORE INTO incoming_qos2 (client_id, packet_id) VALUES (?, ?)", (client_id, packet_id)
        )

    def remove_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        self._write(self._remove_incoming_qos2, client_id, packet_id)

    def _remove_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        self._begin()
        self._db.execute(
            "DELETE FROM incoming_qos2 WHERE client_id = ? AND packet_id = ?", (client_id, packet_id)
        )

    # --- retained ---------------------------------------------------------------------------------

    def set_retained(self, topic: str, message: StoredMessage) -> None:
        """Store (or replace) the retained message of ``topic``."""
        _check_qos(message.qos)
        self._write(self._set_retained, topic, message)

    def _set_retained(self, topic: str, message: StoredMessage) -> None:
        self._begin()
        self._db.execute(
            "INSERT OR REPLACE INTO retained (topic, payload, qos, retain, properties, expiry_at, origin) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                topic,
                bytes(message.payload),
                message.qos,
                int(message.retain),
                encode_properties(message.properties),
                message.expiry_at,
                message.origin,
            ),
        )

    def delete_retained(self, topic: str) -> None:
        self._write(self._delete_retained, topic)

    def _delete_retained(self, topic: str) -> None:
        self._begin()
        self._db.execute("DELETE FROM retained WHERE topic = ?", (topic,))

    def load_retained(self) -> list[StoredMessage]:
        """Every retained message, ordered by topic."""
        self._settle()
        return [
            StoredMessage(row[0], row[1], row[2], bool(row[3]), decode_properties(row[4]), row[5], row[6])
            for row in self._db.execute(
                "SELECT topic, payload, qos, retain, properties, expiry_at, origin "
                "FROM retained ORDER BY topic"
            )
        ]

    # --- wills ------------------------------------------------------------------------------------

    def set_will(self, client_id: str, will: bytes | None, fire_at: float | None) -> None:
        """Store the session's will (``None`` removes it); ``fire_at`` is the delayed-will time."""
        self._write(self._set_will, client_id, will, fire_at)

    def _set_will(self, client_id: str, will: bytes | None, fire_at: float | None) -> None:
        self._begin()
        if will is None:
            self._db.execute("DELETE FROM wills WHERE client_id = ?", (client_id,))
        else:
            self._db.execute(
                "INSERT OR REPLACE INTO wills (client_id, will, fire_at) VALUES (?, ?, ?)",
                (client_id, bytes(will), fire_at),
            )

    def load_wills(self) -> list[tuple[str, bytes, float | None]]:
        """Every stored will as (client_id, will, fire_at), including those without a session row."""
        self._settle()
        return [
            (row[0], row[1], row[2])
            for row in self._db.execute("SELECT client_id, will, fire_at FROM wills ORDER BY client_id")
        ]
