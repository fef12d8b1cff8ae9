"""The cluster fast path on a broker alone (issue #11, broker/cluster/engine.py ``on_publish``,
docs/cluster.md "Fast path"): a clustered broker that founded its overlay without contacts and that
no other broker ever talked to keeps no presence-grace copies of what nobody subscribes (the
wildcard class ``*0:`` every topic is also published on), and writes no send-log row for a QoS 1
message only its own subscribers get, since no subscription elsewhere can have its SUBACK before
another broker's first message reaches it; once one has, copies and rows are kept again.

A real clustered broker (real gRPC listener, no peers, real SQLite store) and real MQTT clients;
the engine's ``StreamSender.presence_on`` tells what was kept for the class, the broker's SQLite
file what the send log holds.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from broker.adapters.server import ThreadedBroker
from broker.cluster.engine import ClusterEngine
from tests.support.core import RawClient, start_broker

__all__ = ["start_broker"]  # the fixture
Start = Callable[..., ThreadedBroker]
MESSAGES = 200
WILDCARD_CLASS = "*0:"  # the class of the level-0 wildcard filters (broker.cluster.classes)


def _engine(threaded: ThreadedBroker) -> ClusterEngine:
    runtime = threaded.server.runtime
    assert runtime is not None
    return runtime.engine


def _publish_and_receive(threaded: ThreadedBroker, topic: str) -> None:
    subscriber = RawClient(threaded.ports["tcp"])
    subscriber.connect(f"sub-{topic}")
    subscriber.subscribe(topic, 0)
    publisher = RawClient(threaded.ports["tcp"])
    publisher.connect(f"pub-{topic}")
    for n in range(MESSAGES):
        publisher.publish(topic, str(n).encode(), 0)
    got = [int(subscriber.expect_publish().payload) for _ in range(MESSAGES)]
    assert got == list(range(MESSAGES))
    subscriber.close()
    publisher.close()


def _publish_qos1_and_receive(threaded: ThreadedBroker, topic: str) -> None:
    subscriber = RawClient(threaded.ports["tcp"])
    subscriber.connect(f"sub-{topic}")
    subscriber.subscribe(topic, 1)
    publisher = RawClient(threaded.ports["tcp"])
    publisher.connect(f"pub-{topic}")
    for n in range(MESSAGES):
        publisher.publish_acked(topic, str(n).encode(), 1, packet_id=n % 60_000 + 1)
    got = []
    for _ in range(MESSAGES):
        publish = subscriber.expect_publish()
        subscriber.ack(publish)
        got.append(int(publish.payload))
    assert got == list(range(MESSAGES))
    subscriber.close()
    publisher.close()


def _send_log_rows(threaded: ThreadedBroker, cls: str) -> int:
    """Rows of the broker's durable send log for class ``cls``: its SQLite file, read-only (WAL
    lets a second reader in while the broker runs)."""
    path = Path(threaded.config.data_dir) / "skipmq.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)) as db:
        row = db.execute("SELECT count(*) FROM cluster_send_log WHERE stream = ?", (cls,)).fetchone()
    return int(row[0])


def _kept(threaded: ThreadedBroker) -> int:
    engine = _engine(threaded)
    assert engine.sender is not None
    kept, _held = threaded.call(lambda: engine.sender.presence_on(WILDCARD_CLASS, engine.scheduler.time()))
    return len(kept)


def test_a_broker_alone_keeps_no_presence_grace_copies_until_another_broker_talks_to_it(
    start_broker: Start,
) -> None:
    threaded = start_broker(cluster__enabled=True, cluster__port=0, cluster__host="127.0.0.1")
    _publish_and_receive(threaded, "alone/t")
    # the full path runs at most once a second per class (QUIET_RECHECK_S) and keeps its message
    kept = _kept(threaded)
    assert kept <= 5, f"{kept} of {MESSAGES} messages kept for the presence grace on a broker alone"

    # (``presence_on`` marked the class present: past the presence grace it is not any more)
    time.sleep(threaded.config.cluster.presence_grace_ms / 1000.0 + 0.2)
    # another broker talks to it (any message): from then on a subscription elsewhere may exist
    engine = _engine(threaded)
    threaded.call(engine.on_receive, "127.0.0.1:1", object())
    _publish_and_receive(threaded, "alone/u")
    kept = _kept(threaded)
    assert kept >= MESSAGES - 5, f"only {kept} of {MESSAGES} kept once another broker had talked"


def test_a_broker_alone_writes_no_send_log_row_for_its_own_subscribers_until_another_broker_talks(
    start_broker: Start,
) -> None:
    threaded = start_broker(cluster__enabled=True, cluster__port=0, cluster__host="127.0.0.1")
    _publish_qos1_and_receive(threaded, "solo/t")
    # the full path runs at most once a second per class (QUIET_RECHECK_S) and logs its message
    # (``cluster.send_log_min_retention_ms`` keeps those rows during the test)
    rows = _send_log_rows(threaded, "=solo")
    assert rows <= 5, f"{rows} send-log rows for {MESSAGES} QoS 1 messages only local subscribers got"

    engine = _engine(threaded)
    threaded.call(engine.on_receive, "127.0.0.1:1", object())  # another broker talks to it
    before = _send_log_rows(threaded, "=solo")
    _publish_qos1_and_receive(threaded, "solo/u")
    written = _send_log_rows(threaded, "=solo") - before
    # from then on a subscriber elsewhere may hold a SUBACK we have not heard of yet (cut off):
    # every message goes into the durable send log again (docs/cluster.md "Fast path")
    assert written >= MESSAGES - 5, f"only {written} of {MESSAGES} logged once another broker talked"
