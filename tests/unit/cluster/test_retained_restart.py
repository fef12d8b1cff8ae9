"""Retained versions survive a restart (issue #10, seed 117 of the crash + partition sweep).

A broker accepted a retained write while it was cut off (its ``RetainedUpdate`` to the others was
lost with the partition) and then crashed. It restarted with the message on disk but no version in
memory: its anti-entropy digest (XOR of the versions) was 0 like that of the brokers that never saw
the write, so the two sides compared equal and never converged. The versions are now durable
(``ClusterStore.set_retained_version``, written with the retained rows they stamp) and a restarted
broker starts from them (``RetainedSync.restore``).
"""

from __future__ import annotations

from pathlib import Path

from broker.adapters.cluster_store import SqliteClusterStore
from broker.adapters.sqlite_store import Store
from broker.cluster.messages import RetainedUpdate
from broker.cluster.retained_sync import RetainedSync
from broker.core.session import Message


def _retained(topic: str, payload: bytes) -> Message:
    return Message(topic, payload, qos=1, retain=True)


def test_a_restarted_broker_offers_the_retained_write_the_others_never_got() -> None:
    before_crash = RetainedSync("a:1", request_timeout_s=1.0)
    before_crash.accept(RetainedUpdate("b:1", 50, _retained("gone", b"")))  # a deletion it knew of
    before_crash.local_write(_retained("cfg", b"v"), wall_ms=100)  # its update to b is lost
    durable = [(topic, ms, origin) for topic, (ms, origin) in before_crash.changed.items()]
    assert sorted(durable) == [("cfg", 100, "a:1"), ("gone", 50, "b:1")]

    restarted = RetainedSync("a:1", request_timeout_s=1.0)
    restarted.restore(durable, held=["cfg"])
    assert restarted.changed == {}  # read from the store: nothing to write again
    assert restarted.digest == before_crash.digest
    other = RetainedSync("b:1", request_timeout_s=1.0)
    assert other.differs(restarted.digest)  # anti-entropy exchanges the copies
    [reply] = restarted.copy_for(1, [_retained("cfg", b"v")])
    assert all([other.accept(update) for update in reply.updates])  # the value and the deletion
    assert other.versions["cfg"] == (100, "a:1")
    assert not other.differs(restarted.digest)


def test_a_retained_message_on_disk_without_a_version_gets_the_oldest_one() -> None:
    """A store from before versions were kept: the digest still covers the message, and any
    versioned write elsewhere wins over it."""
    restarted = RetainedSync("a:1", request_timeout_s=1.0)
    restarted.restore([], held=["cfg"])
    assert restarted.versions == {"cfg": (0, "a:1")}
    assert restarted.changed == {"cfg": (0, "a:1")}  # written, so the next restart agrees
    assert restarted.differs(RetainedSync("b:1", request_timeout_s=1.0).digest)
    assert restarted.accept(RetainedUpdate("b:1", 1, _retained("cfg", b"newer")))


def test_the_sqlite_cluster_store_keeps_retained_versions_across_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "skipmq.db")
    store = Store(path)
    cluster_store = SqliteClusterStore(store)
    cluster_store.set_retained_version("cfg", 100, "a:1")
    cluster_store.set_retained_version("cfg", 200, "b:1")
    cluster_store.set_retained_version("gone", 50, "b:1")
    store.commit()
    store.close()
    reopened = Store(path)
    try:
        assert SqliteClusterStore(reopened).load_retained_versions() == [
            ("cfg", 200, "b:1"),
            ("gone", 50, "b:1"),
        ]
    finally:
        reopened.close()
