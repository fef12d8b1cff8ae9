"""The cluster's durable state in the broker's SQLite store (implements ``ClusterStore`` of
``broker.cluster.engine``): the send log of the reliable streams, the receivers' positions the
send log waits for, and this broker's own receive positions (seed 004 SL, AL and REQ); and the
replies that carried sessions away, for a claim repeated because its reply was lost; and the
versions of the retained topics (``broker.cluster.retained_sync``: last writer wins, deletions
included), durable with the retained rows they stamp; and the catch-ups of sessions moved here,
with the messages held for them (``broker.cluster.catch_up_state``), in the transaction of the
deliveries and receive positions they go with (a crash mid catch-up loses nothing); and the
epoch of this broker's announcements of interest (``broker.cluster.interest_table``), one more at
each start; and the origin proof of each retained version (``broker.cluster.origin_proof``).

Its tables live in the same database and join the same group-commit transaction as the broker's
own rows, so a message is in the send log by the time its publisher's PUBACK leaves (the PUBACK
waits for the commit), and a receive position is durable together with the deliveries it covers.
Positions change with every forwarded message: they are kept in memory and written with the
store's next commit (``Store.before_commit``) - they open no transaction of their own, so a QoS 0
stream or deliveries to clean sessions cost no SQLite write. Send-log rows open the transaction
(the PUBACK waits for its commit) and are written together right before the COMMIT (one
``executemany`` per commit instead of one statement per message, issue #11).
"""

from __future__ import annotations

import json

from broker.adapters.sqlite_store import Store
from broker.adapters.transport.wire import decode_forwarded, decode_item, encode_forwarded, encode_item
from broker.cluster.catch_up_state import CatchUpRow
from broker.cluster.messages import ClaimReply, Envelope, ForwardedMessage, SessionClaim

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
CREATE TABLE IF NOT EXISTS cluster_handed_over (
    claim_id INTEGER NOT NULL, claimant TEXT NOT NULL, reply BLOB NOT NULL,
    PRIMARY KEY (claim_id, claimant)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cluster_pending_claims (
    claim_id INTEGER NOT NULL PRIMARY KEY, claim BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cluster_retained_versions (
    topic TEXT NOT NULL PRIMARY KEY, version_ms INTEGER NOT NULL, origin TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cluster_retained_proofs (
    topic TEXT NOT NULL PRIMARY KEY, proof BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cluster_catch_ups (
    client_id TEXT NOT NULL PRIMARY KEY, catch_ups TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cluster_held (
    client_id TEXT NOT NULL, origin TEXT NOT NULL, stream TEXT NOT NULL, seq INTEGER NOT NULL,
    forwarded BLOB NOT NULL,
    PRIMARY KEY (client_id, origin, stream, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cluster_counters (
    name TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL
) WITHOUT ROWID;
"""

_INSERT_LOG_ROW = (
    "INSERT OR REPLACE INTO cluster_send_log (origin, stream, seq, forwarded) VALUES (?, ?, ?, ?)"
)


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
        self._appended: list[ForwardedMessage] = []  # send-log rows of the open transaction
        store.before_commit.append(self._flush)

    # ------------------------------------------------------------------ send log
    def log_append(self, forwarded: ForwardedMessage) -> None:
        """In the open transaction (its commit holds the PUBACK): the row itself is written, with
        the others of the transaction in one ``executemany``, right before the COMMIT."""
        self._store.begin()
        self._appended.append(forwarded)

    def log_forget(self, key: StreamKey, below_seq: int) -> None:
        self._store.begin()
        self._write_appended()  # (rows appended in this transaction are deleted too)
        self._store.db.execute(
            "DELETE FROM cluster_send_log WHERE origin = ? AND stream = ? AND seq < ?", (*key, below_seq)
        )

    def _write_appended(self) -> None:
        if self._appended:
            rows = [(f.origin, f.stream, f.seq, encode_forwarded(f)) for f in self._appended]
            self._appended.clear()
            self._store.db.executemany(_INSERT_LOG_ROW, rows)

    def load_log(self) -> list[ForwardedMessage]:
        self._write_appended()
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

    # ------------------------------------------------------------------ sessions handed over
    def set_handed_over(self, claim_id: int, claimant: str, reply: ClaimReply | None) -> None:
        """In the open transaction: the hand-over's own (the session's deletion here), so the reply
        is durable exactly when the session left this store. None forgets it."""
        self._store.begin()
        db = self._store.db
        if reply is None:
            db.execute(
                "DELETE FROM cluster_handed_over WHERE claim_id = ? AND claimant = ?", (claim_id, claimant)
            )
            return
        envelope = Envelope("", claimant, "", reply.client_id, claim_id, 1, reply)
        db.execute(
            "INSERT OR REPLACE INTO cluster_handed_over (claim_id, claimant, reply) VALUES (?, ?, ?)",
            (claim_id, claimant, encode_item(envelope)),
        )

    # ------------------------------------------------------------------ our claims still in flight
    def set_pending_claim(self, claim_id: int, claim: SessionClaim | None) -> None:
        """In the open transaction (the engine commits before the claim leaves): a claim of ours
        that may still bring a session (``broker.cluster.takeover``). None forgets it."""
        self._store.begin()
        db = self._store.db
        if claim is None:
            db.execute("DELETE FROM cluster_pending_claims WHERE claim_id = ?", (claim_id,))
            return
        envelope = Envelope(claim.origin, "", "", claim.client_id, claim_id, 1, claim)
        db.execute(
            "INSERT OR REPLACE INTO cluster_pending_claims (claim_id, claim) VALUES (?, ?)",
            (claim_id, encode_item(envelope)),
        )

    def load_pending_claims(self) -> list[SessionClaim]:
        rows = self._store.db.execute("SELECT claim FROM cluster_pending_claims ORDER BY claim_id").fetchall()
        out = []
        for (data,) in rows:
            envelope = decode_item(data)
            if isinstance(envelope, Envelope) and isinstance(envelope.body, SessionClaim):
                out.append(envelope.body)
        return out

    def load_handed_over(self) -> list[tuple[int, str, ClaimReply]]:
        rows = self._store.db.execute(
            "SELECT claim_id, claimant, reply FROM cluster_handed_over ORDER BY claim_id, claimant"
        ).fetchall()
        out = []
        for claim_id, claimant, data in rows:
            envelope = decode_item(data)
            if isinstance(envelope, Envelope) and isinstance(envelope.body, ClaimReply):
                out.append((claim_id, claimant, envelope.body))
        return out

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

    def set_retained_proof(self, topic: str, proof: bytes | None) -> None:
        """The origin proof of the topic's version (``broker.cluster.origin_proof``), in the
        transaction of that version: a copy for another broker relays it unchanged."""
        self._store.begin()
        if proof is None:
            self._store.db.execute("DELETE FROM cluster_retained_proofs WHERE topic = ?", (topic,))
        else:
            self._store.db.execute(
                "INSERT OR REPLACE INTO cluster_retained_proofs (topic, proof) VALUES (?, ?)", (topic, proof)
            )

    def load_retained_proofs(self) -> dict[str, bytes]:
        rows = self._store.db.execute("SELECT topic, proof FROM cluster_retained_proofs").fetchall()
        return {topic: bytes(proof) for topic, proof in rows}

    # ------------------------------------------------------------------ moved sessions' catch-ups
    def set_catch_ups(self, client_id: str, rows: list[CatchUpRow]) -> None:
        """In the open transaction (that of the deliveries and positions it goes with): what the
        client still waits for, as a whole (a JSON list of rows; a catch-up is rare and short).
        An empty list forgets it."""
        self._store.begin()
        db = self._store.db
        if not rows:
            db.execute("DELETE FROM cluster_catch_ups WHERE client_id = ?", (client_id,))
            return
        db.execute(
            "INSERT INTO cluster_catch_ups (client_id, catch_ups) VALUES (?, ?) "
            "ON CONFLICT(client_id) DO UPDATE SET catch_ups = excluded.catch_ups",
            (client_id, json.dumps([list(row) for row in rows])),
        )

    def load_catch_ups(self) -> list[tuple[str, list[CatchUpRow]]]:
        rows = self._store.db.execute(
            "SELECT client_id, catch_ups FROM cluster_catch_ups ORDER BY client_id"
        ).fetchall()
        out: list[tuple[str, list[CatchUpRow]]] = []
        for client_id, data in rows:
            decoded = [(str(o), str(s), int(n), int(e), bool(c)) for o, s, n, e, c in json.loads(data)]
            out.append((client_id, decoded))
        return out

    def hold(self, client_id: str, forwarded: ForwardedMessage) -> None:
        """In the open transaction: that of the delivery (and the receive position) that held it."""
        self._store.begin()
        self._store.db.execute(
            "INSERT OR REPLACE INTO cluster_held (client_id, origin, stream, seq, forwarded) "
            "VALUES (?, ?, ?, ?, ?)",
            (client_id, forwarded.origin, forwarded.stream, forwarded.seq, encode_forwarded(forwarded)),
        )

    def release_held(self, client_id: str, key: StreamKey | None) -> None:
        """In the open transaction (that of the held messages' delivery to the client): the rows
        of ``key`` (None: of every stream) held for ``client_id`` are deleted."""
        self._store.begin()
        if key is None:
            self._store.db.execute("DELETE FROM cluster_held WHERE client_id = ?", (client_id,))
        else:
            self._store.db.execute(
                "DELETE FROM cluster_held WHERE client_id = ? AND origin = ? AND stream = ?",
                (client_id, *key),
            )

    def load_held(self) -> list[tuple[str, ForwardedMessage]]:
        rows = self._store.db.execute(
            "SELECT client_id, forwarded FROM cluster_held ORDER BY client_id, origin, stream, seq"
        ).fetchall()
        return [(client_id, decode_forwarded(data)) for client_id, data in rows]

    # ------------------------------------------------------------------ interest epoch
    def set_interest_epoch(self, epoch: int) -> None:
        """Committed at once (once per start): no announcement of this epoch may leave before
        it is durable, or a crash would let the next start reuse it."""
        self._store.begin()
        self._store.db.execute(
            "INSERT INTO cluster_counters (name, value) VALUES ('interest_epoch', ?) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (epoch,),
        )
        self._store.commit()

    def load_interest_epoch(self) -> int:
        row = self._store.db.execute(
            "SELECT value FROM cluster_counters WHERE name = 'interest_epoch'"
        ).fetchone()
        return int(row[0]) if row else 0

    # ------------------------------------------------------------------ commit
    def _flush(self) -> None:
        db = self._store.db
        self._write_appended()
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
