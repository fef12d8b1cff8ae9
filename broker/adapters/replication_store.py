"""The replica holder's copies of other brokers' logs (``cluster.replicas`` > 1) in the broker's
SQLite store: implements ``ReplicaStore`` of ``broker.cluster.engine_replication``.

One row per entry of an origin incarnation's log, ``(origin, incarnation, seq)`` -> the message
as ``skipmq.v1.MqttMessage`` bytes (the wire's own encoding); one row per persistent session held
of a home incarnation, ``(origin, incarnation, client_id)`` -> ``skipmq.v1.SessionReplica`` bytes
(the snapshot with the home's stream positions). Rows are written in the store's
group-commit transaction, like the send log (``broker.adapters.cluster_store``): the holder's
acknowledgement of an entry leaves only after the commit that made it durable
(``EngineReplication._flush``). The rows go with the data directory: a holder whose disk is lost
holds nothing, and its origins send their entries again (docs/notes/replication.md).
"""

from __future__ import annotations

from broker.adapters.sqlite_store import Store
from broker.adapters.transport.wire import mqtt_message_from_proto, mqtt_message_to_proto, pb
from broker.adapters.transport.wire_replication import replica_from_proto, replica_to_proto
from broker.cluster.messages import StreamPosition
from broker.cluster.replication_messages import LogKey, SessionReplica
from broker.core.messages import Message, SessionSnapshot

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cluster_replicas (
    origin TEXT NOT NULL, incarnation TEXT NOT NULL, seq INTEGER NOT NULL, message BLOB NOT NULL,
    PRIMARY KEY (origin, incarnation, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cluster_replica_sessions (
    origin TEXT NOT NULL, incarnation TEXT NOT NULL, client_id TEXT NOT NULL, session BLOB NOT NULL,
    PRIMARY KEY (origin, incarnation, client_id)
) WITHOUT ROWID;
"""


def encode_message(message: Message) -> bytes:
    out = pb.MqttMessage()
    mqtt_message_to_proto(message, out, "replica")
    return bytes(out.SerializeToString())


def decode_message(data: bytes) -> Message:
    src = pb.MqttMessage()
    src.ParseFromString(bytes(data))
    return mqtt_message_from_proto(src, "replica")


class SqliteReplicaStore:
    """See the module docstring."""

    def __init__(self, store: Store) -> None:
        self._store = store
        db = store.db
        if db.in_transaction:
            store.commit()
        db.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")

    def persist(self, key: LogKey, first_seq: int, messages: tuple[Message, ...]) -> None:
        """In the open transaction (committed before the acknowledgement leaves)."""
        self._store.begin()
        origin, incarnation = key
        rows = [
            (origin, incarnation, first_seq + offset, encode_message(message))
            for offset, message in enumerate(messages)
        ]
        self._store.db.executemany(
            "INSERT OR REPLACE INTO cluster_replicas (origin, incarnation, seq, message) VALUES (?, ?, ?, ?)",
            rows,
        )

    def drop(self, key: LogKey, below_seq: int | None) -> None:
        self._store.begin()
        db = self._store.db
        if below_seq is None:
            db.execute("DELETE FROM cluster_replicas WHERE origin = ? AND incarnation = ?", key)
        else:
            db.execute(
                "DELETE FROM cluster_replicas WHERE origin = ? AND incarnation = ? AND seq < ?",
                (*key, below_seq),
            )

    def load(self) -> list[tuple[LogKey, int, Message]]:
        rows = self._store.db.execute(
            "SELECT origin, incarnation, seq, message FROM cluster_replicas ORDER BY origin, incarnation, seq"
        ).fetchall()
        return [((origin, incarnation), seq, decode_message(data)) for origin, incarnation, seq, data in rows]

    def persist_session(
        self,
        key: LogKey,
        client_id: str,
        snapshot: SessionSnapshot | None,
        positions: tuple[StreamPosition, ...],
    ) -> None:
        """The held copy of ``client_id``'s session of ``key`` (None: deleted), in the open transaction."""
        self._store.begin()
        db = self._store.db
        if snapshot is None:
            db.execute(
                "DELETE FROM cluster_replica_sessions WHERE origin = ? AND incarnation = ? AND client_id = ?",
                (*key, client_id),
            )
            return
        out = pb.Replica()
        replica_to_proto(SessionReplica(key[1], client_id, 1, snapshot, positions), out)
        db.execute(
            "INSERT OR REPLACE INTO cluster_replica_sessions (origin, incarnation, client_id, session) "
            "VALUES (?, ?, ?, ?)",
            (*key, client_id, out.SerializeToString()),
        )

    def drop_sessions(self, key: LogKey) -> None:
        self._store.begin()
        self._store.db.execute(
            "DELETE FROM cluster_replica_sessions WHERE origin = ? AND incarnation = ?", key
        )

    def load_sessions(self) -> list[tuple[LogKey, SessionSnapshot, tuple[StreamPosition, ...]]]:
        rows = self._store.db.execute(
            "SELECT origin, incarnation, session FROM cluster_replica_sessions ORDER BY origin, incarnation"
        ).fetchall()
        held: list[tuple[LogKey, SessionSnapshot, tuple[StreamPosition, ...]]] = []
        for origin, incarnation, data in rows:
            src = pb.Replica()
            src.ParseFromString(bytes(data))
            record = replica_from_proto(src)
            if isinstance(record, SessionReplica) and record.snapshot is not None:
                held.append(((origin, incarnation), record.snapshot, record.positions))
        return held

    def count(self) -> int:
        return int(self._store.db.execute("SELECT COUNT(*) FROM cluster_replicas").fetchone()[0])
