"""Tests for broker.store: real SQLite WAL files, group commit, crash durability (seed 001 §4.1)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parents[3]
from broker.adapters.sqlite_store import (  # noqa: E402
    PUBLISH_SENT,
    PUBREL_SENT,
    QUEUED,
    SessionRecord,
    Store,
    StoredMessage,
    StoredSubscription,
    StoreError,
    decode_properties,
    encode_properties,
)

RICH_PROPERTIES: dict[str, Any] = {
    "payload_format_indicator": 1,
    "message_expiry_interval": 120,
    "content_type": "application/json",
    "response_topic": "reply/here",
    "correlation_data": b"\x00\x01\xffbinary",
    "user_property": [("k", "v"), ("k", "v2"), ("ünïcode", "✓")],
    "subscription_identifier": [3, 7],
}


def message(topic: str = "a/b", payload: bytes = b"hello", qos: int = 1, **kwargs: Any) -> StoredMessage:
    return StoredMessage(
        topic, payload, qos, kwargs.pop("retain", False), kwargs.pop("properties", {}), **kwargs
    )


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "skipmq.db")


def open_session(store: Store, client_id: str, **overrides: Any) -> None:
    fields: dict[str, Any] = {
        "protocol_level": 5,
        "expiry_interval_s": 3600,
        "username": None,
        "disconnected_at": None,
    }
    fields.update(overrides)
    store.upsert_session(client_id, **fields)


def test_wal_mode_and_schema_version(db_path: str) -> None:
    Store(db_path).close()
    db = sqlite3.connect(db_path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(1,)]
    db.close()


def test_unknown_schema_version_is_refused(db_path: str) -> None:
    Store(db_path).close()
    db = sqlite3.connect(db_path)
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version 99"):
        Store(db_path)


def test_unopenable_path_names_the_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-dir" / "skipmq.db")
    with pytest.raises(StoreError, match=r"cannot open store .*no-such-dir"):
        Store(missing)
    not_a_db = tmp_path / "garbage.db"
    not_a_db.write_bytes(b"this is not an sqlite database" * 100)
    with pytest.raises(StoreError, match=r"garbage\.db"):
        Store(str(not_a_db))


def test_bad_synchronous_mode_is_refused(db_path: str) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        Store(db_path, synchronous="extra")


def test_full_synchronous_mode(db_path: str) -> None:
    store = Store(db_path, synchronous="full")
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    store.close()


def test_memory_store_works() -> None:
    store = Store(":memory:")
    open_session(store, "c")
    assert store.enqueue("c", message()) == 1
    store.commit()
    assert [entry.seq for entry in store.load_queue("c")] == [1]
    store.close()


def test_group_commit_pending_and_visibility(db_path: str) -> None:
    store = Store(db_path)
    assert not store.pending
    store.commit()  # nothing to do: cheap no-op
    open_session(store, "c")
    seq = store.enqueue("c", message())
    assert store.pending
    # Our own reads see the uncommitted write ...
    assert [entry.seq for entry in store.load_queue("c")] == [seq]
    # ... another connection does not until commit().
    other = sqlite3.connect(db_path)
    assert other.execute("SELECT COUNT(*) FROM queue").fetchone()[0] == 0
    store.commit()
    assert not store.pending
    assert other.execute("SELECT COUNT(*) FROM queue").fetchone()[0] == 1
    other.close()
    store.close()


def test_session_round_trip(db_path: str) -> None:
    store = Store(db_path)
    open_session(store, "alice", protocol_level=4, expiry_interval_s=60, username="al", disconnected_at=123.5)
    open_session(store, "bob")
    store.add_subscription("alice", StoredSubscription("x/+", 1, True, True, 2, 42))
    store.add_subscription("alice", StoredSubscription("y/#", 0))
    store.add_incoming_qos2("alice", 7)
    store.add_incoming_qos2("alice", 9)
    store.remove_incoming_qos2("alice", 9)
    store.set_will("alice", b"opaque-will", 1000.25)
    store.enqueue("alice", message())
    store.close()

    store = Store(db_path)
    sessions = {record.client_id: record for record in store.load_sessions()}
    assert set(sessions) == {"alice", "bob"}
    assert sessions["alice"] == SessionRecord(
        client_id="alice",
        protocol_level=4,
        expiry_interval_s=60,
        username="al",
        disconnected_at=123.5,
        subscriptions=[
            StoredSubscription("x/+", 1, True, True, 2, 42),
            StoredSubscription("y/#", 0, False, False, 0, None),
        ],
        next_seq=2,
        incoming_qos2={7},
        will=b"opaque-will",
        will_fire_at=1000.25,
    )
    assert sessions["bob"].subscriptions == []
    assert sessions["bob"].will is None
    assert sessions["bob"].next_seq == 1
    store.close()


def test_upsert_session_updates_fields(db_path: str) -> None:
    store = Store(db_path)
    open_session(store, "c", disconnected_at=None)
    open_session(store, "c", expiry_interval_s=5, disconnected_at=99.0, username="u")
    [record] = store.load_sessions()
    assert (record.expiry_interval_s, record.disconnected_at, record.username) == (5, 99.0, "u")
    with pytest.raises(ValueError, match="expiry_interval_s"):
        open_session(store, "c", expiry_interval_s=-1)
    store.close()


def test_subscription_upsert_and_remove(db_path: str) -> None:
    store = Store(db_path)
    open_session(store, "c")
    store.add_subscription("c", StoredSubscription("t", 0))
    store.add_subscription("c", StoredSubscription("t", 2, no_local=True, subscription_identifier=5))
    [record] = store.load_sessions()
    assert record.subscriptions == [StoredSubscription("t", 2, True, False, 0, 5)]
    store.remove_subscription("c", "t")
    store.remove_subscription("c", "never-there")
    [record] = store.load_sessions()
    assert record.subscriptions == []
    with pytest.raises(ValueError, match="qos"):
        store.add_subscription("c", StoredSubscription("t", 3))
    with pytest.raises(ValueError, match="retain_handling"):
        store.add_subscription("c", StoredSubscription("t", 1, retain_handling=3))
    store.close()


def test_delete_session_removes_everything(db_path: str) -> None:
    store = Store(db_path)
    for client_id in ("gone", "kept"):
        open_session(store, client_id)
        store.add_subscription(client_id, StoredSubscription("t", 1))
        store.add_incoming_qos2(client_id, 1)
        store.set_will(client_id, b"w", None)
    shared = message(payload=b"shared")
    store.enqueue_many(["gone", "kept"], shared)
    store.enqueue("gone", message(payload=b"only-gone"))
    store.commit()
    assert store.message_count() == 2
    store.delete_session("gone")
    assert store.queue_depth("gone") == 0
    store.close()

    store = Store(db_path)
    assert [record.client_id for record in store.load_sessions()] == ["kept"]
    assert store.load_queue("gone") == []
    assert [entry.message.payload for entry in store.load_queue("kept")] == [b"shared"]
    assert store.message_count() == 1  # the payload only "gone" referenced is freed
    assert [client_id for client_id, _will, _at in store.load_wills()] == ["kept"]
    # A new session under the same id starts a fresh sequence.
    open_session(store, "gone")
    assert store.enqueue("gone", message()) == 1
    store.close()


def test_queue_order_inflight_state_and_ack(db_path: str) -> None:
    store = Store(db_path)
    open_session(store, "c")
    seqs = [store.enqueue("c", message(payload=bytes([i]), qos=2), [i]) for i in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    store.set_inflight("c", 1, 10, PUBLISH_SENT)
    store.set_inflight("c", 2, 11, PUBREL_SENT)
    store.ack("c", 3)
    store.ack("c", 3)  # a duplicate acknowledgement is a no-op
    store.ack("c", 999)
    store.commit()
    store.close()

    store = Store(db_path)
    entries = store.load_queue("c")
    assert [(e.seq, e.packet_id, e.state, e.subscription_identifiers) for e in entries] == [
        (1, 10, PUBLISH_SENT, [0]),
        (2, 11, PUBREL_SENT, [1]),
        (4, None, QUEUED, [3]),
        (5, None, QUEUED, [4]),
    ]
    assert [e.message.payload for e in entries] == [b"\x00", b"\x01", b"\x03", b"\x04"]
    assert [e.seq for e in store.load_queue("c", limit=2)] == [1, 2]
    assert store.queue_depth("c") == 4
    with pytest.raises(StoreError, match="seq 3"):
        store.set_inflight("c", 3, 12, PUBLISH_SENT)
    with pytest.raises(ValueError, match="state"):
        store.set_inflight("c", 4, 12, 3)
    with pytest.raises(ValueError, match="packet_id"):
        store.set_inflight("c", 4, 70000, PUBLISH_SENT)
    with pytest.raises(ValueError, match="qos"):
        store.enqueue("c", message(qos=5))
    store.close()


def test_ack_many_counts_only_existing_entries(db_path: str) -> None:
    store = Store(db_path)
    open_session(store, "c")
    shared = message(payload=b"shared")
    store.enqueue_many(["c", "other"], shared)
    for _ in range(4):
        store.enqueue("c", message(payload=b"own"))
    assert store.queue_depth("c") == 5
    assert store.ack_many("c", [1, 2, 2, 99]) == 2
    assert store.ack_many("c", []) == 0
    assert store.queue_depth("c") == 3
    store.commit()
    assert [e.seq for e in store.load_queue("c")] == [3, 4, 5]
    assert [e.message.payload for e in store.load_queue("other")] == [b"shared"]
    store.close()


def test_seq_monotonic_across_reopen_even_after_all_acked(db_path: str) -> None:
    store = Store(db_path)
    open_session(store, "c")
    first = [store.enqueue("c", message()) for _ in range(3)]
    for seq in first:
        store.ack("c", seq)
    store.close()
    store = Store(db_path)
    assert store.queue_depth("c") == 0
    assert store.load_sessions()[0].next_seq == 4
    assert store.enqueue("c", message()) == 4  # never reused, though the queue was empty
    store.close()
    store = Store(db_path)
    assert store.enqueue("c", message()) == 5
    store.close()


@pytest.mark.parametrize("how", ["ack", "ack_many", "drop_oldest"])
def test_seq_not_reused_when_newest_entry_deleted_after_reopen(db_path: str, how: str) -> None:
    """Enqueue-only commits store no counter row; deleting the newest entry must store one."""
    store = Store(db_path)
    open_session(store, "c")
    for _ in range(3):
        store.enqueue("c", message())
    store.close()
    store = Store(db_path)  # cold counter cache
    if how == "ack":
        for seq in (3, 1, 2):
            store.ack("c", seq)
    elif how == "ack_many":
        assert store.ack_many("c", [3, 2, 1]) == 3
    else:
        assert store.drop_oldest("c", 10) == 3
    store.close()
    store = Store(db_path)
    assert store.queue_depth("c") == 0
    assert store.enqueue("c", message()) == 4
    store.close()


def test_queue_depth_tracks_changes(db_path: str) -> None:
    store = Store(db_path)
    open_session(store, "c")
    assert store.queue_depth("c") == 0
    for _ in range(6):
        store.enqueue("c", message())
    assert store.queue_depth("c") == 6
    store.ack("c", 1)
    assert store.queue_depth("c") == 5
    assert store.drop_oldest("c", 2) == 2
    assert store.queue_depth("c") == 3
    store.close()
    store = Store(db_path)
    assert store.queue_depth("c") == 3  # from the database after reopen
    store.close()


def test_drop_oldest_skips_inflight(db_path: str) -> None:
    store = Store(db_path)
    open_session(store, "c")
    for i in range(6):
        store.enqueue("c", message(payload=bytes([i])))
    store.set_inflight("c", 1, 1, PUBLISH_SENT)
    assert store.drop_oldest("c", 2) == 2
    assert [e.seq for e in store.load_queue("c")] == [1, 4, 5, 6]
    assert store.drop_oldest("c", 0) == 0
    assert store.drop_oldest("c", 100) == 3  # only queued entries; seq 1 is in flight
    assert [e.seq for e in store.load_queue("c")] == [1]
    with pytest.raises(ValueError, match="count"):
        store.drop_oldest("c", -1)
    store.commit()
    assert store.message_count() == 1
    store.close()


def test_shared_payload_stored_once(db_path: str) -> None:
    store = Store(db_path)
    clients = [f"c{i}" for i in range(50)]
    for client_id in clients:
        open_session(store, client_id)
    big = message(payload=b"P" * 10_000, properties=dict(RICH_PROPERTIES))
    seqs = store.enqueue_many(clients, big)
    assert seqs == [1] * 50
    store.commit()
    assert store.message_count() == 1
    payload_bytes = store._db.execute("SELECT SUM(LENGTH(payload)) FROM messages").fetchone()[0]
    assert payload_bytes == 10_000
    # Freed only when the last reference is acknowledged.
    for client_id in clients[:-1]:
        store.ack(client_id, 1)
    store.commit()
    assert store.message_count() == 1
    assert store.load_queue(clients[-1])[0].message == big
    store.ack(clients[-1], 1)
    store.commit()
    assert store.message_count() == 0
    store.close()


def test_enqueue_same_message_per_client_stores_once(db_path: str) -> None:
    """The per-subscriber path (enqueue with subscription ids) also shares the payload."""
    store = Store(db_path)
    shared = message(payload=b"S" * 1000, properties={"user_property": [("a", "b")]})
    for i in range(10):
        open_session(store, f"c{i}")
        store.enqueue(f"c{i}", shared, [i + 1])
    assert store.message_count() == 1
    # A different message in between gets its own row; equal content is recognised again.
    store.enqueue("c0", message(payload=b"other"))
    store.enqueue("c1", message(payload=b"other"))
    assert store.message_count() == 2
    store.commit()
    assert [e.subscription_identifiers for e in store.load_queue("c3")] == [[4]]
    store.close()


def test_enqueue_cache_never_points_at_a_reused_row(db_path: str) -> None:
    store = Store(db_path)
    open_session(store, "a")
    open_session(store, "b")
    first = message(payload=b"first")
    seq = store.enqueue("a", first)
    store.ack("a", seq)  # deletes the message row; SQLite may reuse its id
    store.enqueue_many(["b"], message(payload=b"second"))
    store.enqueue("a", first)
    store.commit()
    assert [e.message.payload for e in store.load_queue("a")] == [b"first"]
    assert [e.message.payload for e in store.load_queue("b")] == [b"second"]
    store.close()


def test_enqueue_many_with_subscription_identifiers(db_path: str) -> None:
    store = Store(db_path)
    open_session(store, "a")
    open_session(store, "b")
    store.enqueue("a", message(payload=b"x"))
    assert store.enqueue_many(["a", "b"], message(), [[1, 2], []]) == [2, 1]
    assert store.load_queue("a")[1].subscription_identifiers == [1, 2]
    assert store.load_queue("b")[0].subscription_identifiers == []
    assert store.enqueue_many([], message()) == []
    assert store.enqueue_many(["b", "b", "a"], message(payload=b"dup")) == [2, 3, 3]
    assert store.queue_depth("b") == 3
    with pytest.raises(ValueError, match="subscription_identifiers"):
        store.enqueue_many(["a", "b"], message(), [[1]])
    store.close()


def test_retained_round_trip_with_rich_properties(db_path: str) -> None:
    store = Store(db_path)
    retained = message(
        "sensors/1", b"\x00\xff", 2, retain=True, properties=dict(RICH_PROPERTIES), expiry_at=5e9, origin="n1"
    )
    store.set_retained("sensors/1", retained)
    store.set_retained("sensors/2", message("sensors/2", b"old", 0, retain=True))
    store.set_retained("sensors/2", message("sensors/2", b"new", 1, retain=True))
    store.set_retained("gone", message("gone", b"x", 0, retain=True))
    store.delete_retained("gone")
    store.close()

    store = Store(db_path)
    loaded = store.load_retained()
    assert [m.topic for m in loaded] == ["sensors/1", "sensors/2"]
    assert loaded[0] == retained
    props = loaded[0].properties
    assert isinstance(props["correlation_data"], bytes)
    assert props["user_property"] == [("k", "v"), ("k", "v2"), ("ünïcode", "✓")]
    assert all(isinstance(pair, tuple) for pair in props["user_property"])
    assert loaded[1].payload == b"new" and loaded[1].qos == 1
    store.close()


def test_queued_message_properties_round_trip(db_path: str) -> None:
    store = Store(db_path)
    open_session(store, "c")
    original = message(properties=dict(RICH_PROPERTIES), expiry_at=1234.5, origin="node-7")
    store.enqueue("c", original)
    store.close()
    store = Store(db_path)
    assert store.load_queue("c")[0].message == original
    store.close()


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"a": b""},
        {"nested": {"d": b"x", "b": [1, (2, b"3")]}},
        {"t": ("x",), "b": None, "flag": True, "f": 1.5},
    ],
)
def test_property_codec_is_lossless(value: dict[str, Any]) -> None:
    decoded = decode_properties(encode_properties(value))
    assert decoded == value
    assert repr(decoded) == repr(value)  # types too: tuples stay tuples, bytes stay bytes


property_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.binary(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=10), property_values, max_size=5))
def test_property_codec_round_trips_arbitrary_values(value: dict[str, Any]) -> None:
    decoded = decode_properties(encode_properties(value))
    assert repr(decoded) == repr(value)


def test_property_codec_rejects_unstorable_values() -> None:
    with pytest.raises(StoreError, match="set"):
        encode_properties({"x": {1, 2}})


def test_wills_survive_restart_and_can_be_cleared(db_path: str) -> None:
    store = Store(db_path)
    store.set_will("no-session", b"will-bytes", 42.0)
    store.set_will("c2", b"w2", None)
    store.set_will("c2", None, None)
    store.close()
    store = Store(db_path)
    assert store.load_wills() == [("no-session", b"will-bytes", 42.0)]
    store.close()


def test_incoming_qos2_validation(db_path: str) -> None:
    store = Store(db_path)
    with pytest.raises(ValueError, match="packet_id"):
        store.add_incoming_qos2("c", 0)
    store.add_incoming_qos2("c", 5)
    store.add_incoming_qos2("c", 5)  # idempotent
    store.close()


def test_closed_store_refuses_writes(db_path: str) -> None:
    store = Store(db_path)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.enqueue("c", message())


def test_context_manager_commits(db_path: str) -> None:
    with Store(db_path) as store:
        open_session(store, "c")
        store.enqueue("c", message())
    with Store(db_path) as store:
        assert store.queue_depth("c") == 1


def test_abandon_loses_exactly_the_uncommitted_work(db_path: str) -> None:
    """``abandon`` is what a crash does (the whole-cluster simulation's kill -9)."""
    store = Store(db_path)
    open_session(store, "c")
    kept = store.enqueue("c", message())
    store.commit()
    store.enqueue("c", message())  # not committed
    store.abandon()
    store.abandon()  # idempotent
    with Store(db_path) as again:
        assert [entry.seq for entry in again.load_queue("c")] == [kept]


CHILD_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from broker.adapters.sqlite_store import Store, StoredMessage

    store = Store({path!r})
    store.upsert_session("dev", protocol_level=5, expiry_interval_s=60, username=None, disconnected_at=None)
    for i in range(3):
        store.enqueue("dev", StoredMessage("t", b"committed-%d" % i, 1, False, {{"correlation_data": b"c"}}))
    store.set_retained("r", StoredMessage("r", b"retained", 1, True, {{}}))
    store.commit()
    store.enqueue("dev", StoredMessage("t", b"uncommitted", 1, False, {{}}))
    store.set_retained("r2", StoredMessage("r2", b"uncommitted", 1, True, {{}}))
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    if {how!r} == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        os._exit(3)
    """
)


@pytest.mark.parametrize("how", ["sigkill", "os_exit"])
def test_committed_survives_process_death_uncommitted_does_not(db_path: str, how: str) -> None:
    script = CHILD_SCRIPT.format(root=str(REPO_ROOT), path=db_path, how=how)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert result.stdout == b"ready\n", result.stderr.decode()
    assert result.returncode == (-9 if how == "sigkill" else 3)
    assert os.path.exists(db_path + "-wal")  # the data lives in the WAL, not yet checkpointed

    store = Store(db_path)
    entries = store.load_queue("dev")
    assert [e.message.payload for e in entries] == [b"committed-0", b"committed-1", b"committed-2"]
    assert entries[0].message.properties == {"correlation_data": b"c"}
    assert [m.topic for m in store.load_retained()] == ["r"]
    # The uncommitted seq 4 was lost with its transaction; the counter continues after the last
    # committed one, so no committed seq is ever handed out twice.
    assert store.enqueue("dev", message()) == 4
    store.close()
