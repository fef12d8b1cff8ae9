"""The cluster's durable state in the broker's SQLite store (implements ``ClusterStore`` of
``broker.cluster.engine``): the send log of the reliable streams, the receivers' positions the
send log waits for, and this broker's own receive positions (seed 004 SL, AL and REQ); and the
versions of the retained topics (``broker.cluster.retained_sync``: last writer wins, deletions
included), durable with the retained rows they stamp.

Its tables live in the same database and join the same group-commit transaction as the broker's
own rows, so a message is in the send log by the time its publisher's PUBACK leaves (the PUBACK
waits for the commit), and a receive position is durable together with the deliveries it covers.
Positions change with every forwarded message: they are kept in memory and written with the
store's next commit (``Store.before_commit``) - they open no transaction of their own, so a QoS 0
stream or deliveries to clean sessions cost no SQLite write.
"""

from __future__ import annotations

from broker.adapters.sqlite_store import Store
from broker.adapters.transport.wire import decode_forwarded, encode_forwarded
from broker.cluster.messages import ForwardedMessage

StreamKey = tuple[str, str]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cluster_send_log (
    origin TEXT NOT NULL, stream TEXT NOT NULL, seq INTEGER NOT NULL, forwarded BLOB NOT NULL,
    PRIMARY KEY (origin, stream, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cluster_receivers (
    origin TEXT NOT NULL, stream TEXT NOT NULL, peer TEXT NOT NULL, next_seq INTEGER NOT NULL,
    PRIMARY KEY (origin, stream, peer)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cluster_positions (
    origin TEXT NOT NULL, stream TEXT NOT NULL, next_seq INTEGER NOT NULL,
    PRIMARY KEY (origin, stream)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cluster_retained_versions (
    topic TEXT NOT NULL PRIMARY KEY, version_ms INTEGER NOT NULL, origin TEXT NOT NULL
) WITHOUT ROWID;
"""


class SqliteClusterStore:
    """See the module docstring."""

    def __init__(self, store: Store) -> None:
        self._store = store
        db = store.db
        if db.in_transaction:
            store.commit()
        db.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        self._positions: dict[StreamKey, int] = {}
        self._receivers: dict[tuple[StreamKey, str], int | None] = {}
        store.before_commit.append(self._flush)

    # ------------------------------------------------------------------ send log
    def log_append(self, forwarded: ForwardedMessage) -> None:
        self._store.begin()
        self._store.db.execute(
            "INSERT OR REPLACE INTO cluster_send_log (origin, stream, seq, forwarded) VALUES (?, ?, ?, ?)",
            (forwarded.origin, forwarded.stream, forwarded.seq, encode_forwarded(forwarded)),
        )

    def log_forget(self, key: StreamKey, below_seq: int) -> None:
        self._store.begin()
        self._store.db.execute(
            "DELETE FROM cluster_send_log WHERE origin = ? AND stream = ? AND seq < ?", (*key, below_seq)
        )

    def load_log(self) -> list[ForwardedMessage]:
        rows = self._store.db.execute(
            "SELECT forwarded FROM cluster_send_log ORDER BY origin, stream, seq"
        ).fetchall()
        return [decode_forwarded(row[0]) for row in rows]

    # ------------------------------------------------------------------ receivers (AL)
    def set_receiver(self, key: StreamKey, peer: str, next_seq: int | None) -> None:
        """Written with the store's next commit (no transaction of its own: an older position
        found after a crash only makes the sender resend more)."""
        self._receivers[(key, peer)] = next_seq

    def load_receivers(self) -> list[tuple[StreamKey, str, int]]:
        rows = self._store.db.execute(
            "SELECT origin, stream, peer, next_seq FROM cluster_receivers"
        ).fetchall()
        return [((origin, stream), peer, next_seq) for origin, stream, peer, next_seq in rows]

    # ------------------------------------------------------------------ own positions (REQ)
    def set_position(self, key: StreamKey, next_seq: int) -> None:
        """0 forgets the stream. Written with the store's next commit, that of the deliveries it
        covers when they went into persistent sessions; no transaction of its own."""
        self._positions[key] = next_seq

    def load_positions(self) -> list[tuple[StreamKey, int]]:
        rows = self._store.db.execute("SELECT origin, stream, next_seq FROM cluster_positions").fetchall()
        return [((origin, stream), next_seq) for origin, stream, next_seq in rows]

    # ------------------------------------------------------------------ retained versions
    def set_retained_version(self, topic: str, version_ms: int, origin: str) -> None:
        """In the open transaction: that of the retained row it stamps (a local write's publish,
        or the update applied). Retained writes are rare: one row each."""
        self._store.begin()
        self._store.db.execute(
            "INSERT INTO cluster_retained_versions (topic, version_ms, origin) VALUES (?, ?, ?) "
            "ON CONFLICT(topic) DO UPDATE SET version_ms = excluded.version_ms, origin = excluded.origin",
            (topic, version_ms, origin),
        )

    def load_retained_versions(self) -> list[tuple[str, int, str]]:
        rows = self._store.db.execute(
            "SELECT topic, version_ms, origin FROM cluster_retained_versions ORDER BY topic"
        ).fetchall()
        return [(topic, version_ms, origin) for topic, version_ms, origin in rows]

    # ------------------------------------------------------------------ commit
    def _flush(self) -> None:
        db = self._store.db
        if self._positions:
            items = list(self._positions.items())
            self._positions.clear()
            db.executemany(
                "DELETE FROM cluster_positions WHERE origin = ? AND stream = ?",
                [key for key, next_seq in items if not next_seq],
            )
            db.executemany(
                "INSERT INTO cluster_positions (origin, stream, next_seq) VALUES (?, ?, ?) "
                "ON CONFLICT(origin, stream) DO UPDATE SET next_seq = excluded.next_seq",
                [(*key, next_seq) for key, next_seq in items if next_seq],
            )
        if self._receivers:
            changes = list(self._receivers.items())
            self._receivers.clear()
            db.executemany(
                "DELETE FROM cluster_receivers WHERE origin = ? AND stream = ? AND peer = ?",
                [(*key, peer) for (key, peer), next_seq in changes if next_seq is None],
            )
            db.executemany(
                "INSERT INTO cluster_receivers (origin, stream, peer, next_seq) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(origin, stream, peer) DO UPDATE SET next_seq = excluded.next_seq",
                [(*key, peer, next_seq) for (key, peer), next_seq in changes if next_seq is not None],
            )
