"""Federation custody in the broker's SQLite store (implements ``CustodyStore`` of
``broker.federation.store_port``; docs/federation.md "Delivery semantics").

One row per event in custody: its id, the link it came from ("" = published here) and the
event as its wire encoding (a ``FedMessage``, protos/skipmq/v1/federation.proto). Like the
cluster's send log (``broker.adapters.cluster_store``) the table lives in the same database and
joins the same group-commit transaction as the broker's own rows: ``put`` opens the transaction,
so a publisher's PUBACK (which waits for the commit) leaves only once the event is durable in
custody; the rows of one transaction are written together right before the COMMIT
(``Store.before_commit``, one ``executemany``). ``forget`` opens no transaction: the deletion
goes with the next commit (a row found after a crash only makes the router send the event
again, and the neighbours acknowledge a copy they had without delivering it twice).
"""

from __future__ import annotations

from broker.adapters.federation import wire
from broker.adapters.sqlite_store import Store
from broker.adapters.transport._pb.skipmq.v1 import federation_pb2 as pb
from broker.federation.messages import Event

_SCHEMA = """
CREATE TABLE IF NOT EXISTS federation_custody (
    event_id TEXT NOT NULL PRIMARY KEY, came_from TEXT NOT NULL, event BLOB NOT NULL,
    held_at INTEGER NOT NULL
);
"""


class SqliteCustodyStore:
    """See the module docstring."""

    def __init__(self, store: Store) -> None:
        self._store = store
        db = store.db
        if db.in_transaction:
            store.commit()
        db.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
        row = db.execute("SELECT COALESCE(MAX(held_at), 0) FROM federation_custody").fetchone()
        self._order = int(row[0])
        self._changes: dict[str, tuple[Event, str | None] | None] = {}  # None: forget
        store.before_commit.append(self._flush)

    def put(self, event: Event, came_from: str | None) -> None:
        self._store.begin()
        self._changes.pop(event.event_id, None)  # re-inserted at the end: keeps the order
        self._changes[event.event_id] = (event, came_from)

    def forget(self, event_id: str) -> None:
        self._changes.pop(event_id, None)
        self._changes[event_id] = None

    def load(self) -> list[tuple[Event, str | None]]:
        rows = self._store.db.execute(
            "SELECT came_from, event FROM federation_custody ORDER BY held_at"
        ).fetchall()
        out: list[tuple[Event, str | None]] = []
        for came_from, data in rows:
            event = wire.decode(pb.FedMessage.FromString(data))
            if isinstance(event, Event):
                out.append((event, came_from or None))
        return out

    def pending(self) -> int:
        """Rows waiting for the next commit."""
        return len(self._changes)

    def _flush(self) -> None:
        if not self._changes:
            return
        changes = list(self._changes.items())
        self._changes.clear()
        db = self._store.db
        deletions = [(event_id,) for event_id, row in changes if row is None]
        if deletions:
            db.executemany("DELETE FROM federation_custody WHERE event_id = ?", deletions)
        rows = []
        for event_id, row in changes:
            if row is not None:
                self._order += 1
                event, came_from = row
                rows.append((event_id, came_from or "", wire.encode(event).SerializeToString(), self._order))
        if rows:
            db.executemany(
                "INSERT OR REPLACE INTO federation_custody (event_id, came_from, event, held_at) "
                "VALUES (?, ?, ?, ?)",
                rows,
            )
