"""The cluster fast path on a broker alone (issue #11, broker/cluster/engine.py ``on_publish``,
docs/cluster.md "Fast path"): a clustered broker that founded its overlay without contacts and that
no other broker ever talked to keeps no presence-grace copies of what nobody subscribes (the
wildcard class ``*0:`` every topic is also published on), since no subscription elsewhere can have
its SUBACK before another broker's first message reaches it; once one has, copies are kept again.

A real clustered broker (real gRPC listener, no peers) and real MQTT clients; the engine's
``StreamSender.presence_on`` tells what was kept for the class.
"""

from __future__ import annotations

import time
from collections.abc import Callable

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
