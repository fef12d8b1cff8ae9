"""The SQLite custody store (broker/adapters/federation/custody_store.py) on a real database:
``put`` opens the group-commit transaction (a PUBACK waits for it), rows are durable only after
the commit, ``forget`` goes with the next commit, and a new process reads back what was held,
oldest first, with the link each event came from."""

from __future__ import annotations

from pathlib import Path

from broker.adapters.federation.custody_store import SqliteCustodyStore
from broker.adapters.sqlite_store import Store
from broker.federation.messages import Event


def event(n: int) -> Event:
    return Event(f"plant/{n}", bytes([n]) * 3, qos=1, retain=n % 2 == 0, site="edge", event_id=f"b/x/{n}")


def test_rows_are_durable_after_the_commit_and_read_back_in_order(tmp_path: Path) -> None:
    path = str(tmp_path / "skipmq.db")
    store = Store(path)
    custody = SqliteCustodyStore(store)
    assert not store.pending
    custody.put(event(1), None)
    assert store.pending  # the PUBACK of the publish that put it waits for this commit
    custody.put(event(2), "10.0.0.2:7990")
    custody.put(event(3), None)
    custody.forget("b/x/3")  # held and complete in one transaction: never written
    store.commit()
    custody.forget("b/x/1")
    assert not store.pending  # a deletion opens no transaction ...
    custody.put(event(4), None)
    store.abandon()  # kill -9 before that commit: event 4 and the deletion of 1 are lost

    again = Store(path)
    assert SqliteCustodyStore(again).load() == [(event(1), None), (event(2), "10.0.0.2:7990")]
    again.close()


def test_forget_goes_with_the_next_commit(tmp_path: Path) -> None:
    path = str(tmp_path / "skipmq.db")
    store = Store(path)
    custody = SqliteCustodyStore(store)
    custody.put(event(1), None)
    custody.put(event(2), None)
    store.commit()
    custody.forget("b/x/1")
    custody.put(event(5), None)
    store.commit()
    store.close()
    again = Store(path)
    assert [e.event_id for e, _ in SqliteCustodyStore(again).load()] == ["b/x/2", "b/x/5"]
    again.close()
