"""A moved session's catch-up is durable (issue #10): scripted tests of the pure core
``broker.cluster.catch_up_state`` and of its rows in the SQLite store across a restart (the
whole-cluster run: tests/sim/cluster/test_catch_up_durable_sim.py)."""

from __future__ import annotations

from pathlib import Path

from broker.adapters.cluster_store import SqliteClusterStore
from broker.adapters.sqlite_store import Store
from broker.cluster import catch_up_state
from broker.cluster.messages import ForwardedMessage
from broker.cluster.store_port import MemoryClusterStore
from broker.core.session import Message

C_STREAM = ("c:1/inc", "=cu")


def _forwarded(seq: int, key: tuple[str, str] = C_STREAM) -> ForwardedMessage:
    return ForwardedMessage(key[0], key[1], seq, Message("cu/x", f"m{seq}".encode(), qos=1))


def _mid_catch_up() -> tuple[catch_up_state.CatchUps, catch_up_state.AwaitingStart]:
    """Client "sub" moved here: it still needs SEQs 51..119 of C's stream (its old broker stood at
    51, this one at 120) and waits for D's stream to start here; "other" needs 3..9 of C's."""
    catch_ups: catch_up_state.CatchUps = {
        C_STREAM: [[51, 120, "sub", 5.5, True], [3, 10, "other", 5.0, False]]
    }
    awaiting: catch_up_state.AwaitingStart = {("d:1/inc", "=cu"): [(7, "sub", 5.5)]}
    return catch_ups, awaiting


def test_the_rows_of_a_client_name_what_it_still_waits_for() -> None:
    catch_ups, awaiting = _mid_catch_up()
    assert catch_up_state.rows_of("sub", catch_ups, awaiting) == [
        ("c:1/inc", "=cu", 51, 120, True),
        ("d:1/inc", "=cu", 7, 0, False),
    ]
    assert catch_up_state.rows_of("nobody", catch_ups, awaiting) == []


def test_a_restarted_broker_resumes_the_catch_up_and_the_held_messages(tmp_path: Path) -> None:
    """The state mid catch-up goes to the store (rows and held messages in the open transaction),
    is committed, the broker dies; the next incarnation loads the same catch-ups - restarted at
    its own ``now`` - and the messages held for the client in SEQ order."""
    catch_ups, awaiting = _mid_catch_up()
    store = Store(str(tmp_path / "skipmq.db"))
    cluster_store = SqliteClusterStore(store)
    for client_id in ("sub", "other"):
        cluster_store.set_catch_ups(client_id, catch_up_state.rows_of(client_id, catch_ups, awaiting))
    for seq in (122, 120, 121):  # held as they were delivered to the other subscribers here
        cluster_store.hold("sub", _forwarded(seq))
    store.commit()
    cluster_store.hold("sub", _forwarded(123))  # not committed: gone with the crash
    store.abandon()

    again = SqliteClusterStore(Store(str(tmp_path / "skipmq.db")))
    loaded = again.load_catch_ups(), again.load_held()
    restored, restored_awaiting, held = catch_up_state.restore(*loaded, 50.0)
    assert restored == {C_STREAM: [[3, 10, "other", 50.0, False], [51, 120, "sub", 50.0, True]]}
    assert restored_awaiting == {("d:1/inc", "=cu"): [(7, "sub", 50.0)]}
    assert [f.seq for f in held[(C_STREAM, "sub")]] == [120, 121, 122]
    assert held[(C_STREAM, "sub")][0] == _forwarded(120)


def test_a_finished_catch_up_and_its_released_messages_are_gone_from_the_store(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "skipmq.db"))
    cluster_store = SqliteClusterStore(store)
    other_key = ("e:1/inc", "=cu")
    cluster_store.set_catch_ups("sub", [("c:1/inc", "=cu", 51, 120, True)])
    cluster_store.hold("sub", _forwarded(120))
    cluster_store.hold("sub", _forwarded(4, other_key))
    store.commit()
    cluster_store.set_catch_ups("sub", [])  # caught up
    cluster_store.release_held("sub", C_STREAM)  # its held messages delivered
    store.commit()
    assert cluster_store.load_catch_ups() == []
    assert cluster_store.load_held() == [("sub", _forwarded(4, other_key))]
    cluster_store.release_held("sub", None)  # the session handed over: everything goes with it
    store.commit()
    assert cluster_store.load_held() == []


def test_the_memory_store_keeps_the_same_rows() -> None:
    memory = MemoryClusterStore()
    memory.set_catch_ups("sub", [("c:1/inc", "=cu", 51, 120, True)])
    memory.hold("sub", _forwarded(121))
    memory.hold("sub", _forwarded(120))
    assert memory.load_catch_ups() == [("sub", [("c:1/inc", "=cu", 51, 120, True)])]
    assert [f.seq for _c, f in memory.load_held()] == [120, 121]
    memory.set_catch_ups("sub", [])
    memory.release_held("sub", C_STREAM)
    assert memory.load_catch_ups() == [] and memory.load_held() == []


def test_a_late_sessions_catch_up_stops_where_the_sessions_own_subscriptions_began() -> None:
    """Issue #30: a late session merged into a session that subscribed here meanwhile needs a
    stream only up to where that session's own subscriptions began to get it; with a filter of
    its own not subscribed here, or no record, nothing bounds the catch-up."""
    d_stream = ("d:1/inc", "=cu")
    subscribed_at = {"cu/#": {C_STREAM: 120}, "cu/x": {C_STREAM: 130}}
    assert catch_up_state.upper_bound(subscribed_at, ["cu/#"], C_STREAM, start=0) == 120
    # two filters of the class: the later subscription bounds it (it got what came after)
    assert catch_up_state.upper_bound(subscribed_at, ["cu/#", "cu/x"], C_STREAM, start=0) == 130
    # a stream that reached this broker after the subscription: from where it started here
    assert catch_up_state.upper_bound(subscribed_at, ["cu/#"], d_stream, start=40) == 40
    assert catch_up_state.upper_bound(subscribed_at, ["cu/#"], d_stream, start=0) is None
    assert catch_up_state.upper_bound(subscribed_at, ["cu/#", "cu/y"], C_STREAM, start=0) is None
    assert catch_up_state.upper_bound(subscribed_at, [], C_STREAM, start=0) is None
