"""The cluster fast path (issue #11; broker/cluster/engine.py ``on_publish``, overlay/node.py
``reaches_only_self``): a publish whose topic class no other broker subscribes does no overlay work
(it is delivered locally; QoS >= 1 still goes into the send log), and the moment another broker
subscribes, a publish after its SUBACK reaches it (docs/cluster.md "Subscriptions").

Real brokers (3-broker cluster over gRPC), paho clients.
"""

from __future__ import annotations

from tests.support.cluster import ClientFactory, metric_total, numbers, unique_id, wait_until
from tools.launcher import LocalCluster

MESSAGES = 300


def _forwarded(cluster: LocalCluster, index: int) -> float:
    return metric_total(cluster.metrics_text(index), "skipmq_cluster_forwarded_total")


def test_a_class_nobody_elsewhere_subscribes_skips_the_overlay_until_a_remote_suback(
    cluster3: LocalCluster, client_factory: ClientFactory
) -> None:
    topic = f"{unique_id('fast')}/t"
    local = client_factory(cluster3, 0)
    assert local.subscribe(topic, 1) == [1]
    publisher = client_factory(cluster3, 0)
    publisher.publish(topic, b"warm", 1)  # the first publish joins the class as a publisher
    local.wait_messages(1)
    before = _forwarded(cluster3, 0)
    for n in range(MESSAGES):
        publisher.publish_nowait(topic, b"a" + str(n).encode(), n % 2)
    wait_until(lambda: not publisher.pending, 30.0, what="every QoS 1 publish acknowledged")
    got = local.wait_messages(MESSAGES)
    # (QoS 0 and QoS 1 are not ordered against each other, MQTT §4.6)
    assert sorted(numbers((m.payload for m in got), b"a")) == list(range(MESSAGES))
    # the full path runs at most once a second per class (LOCAL_ONLY_RECHECK_S); before the fast
    # path every one of the messages was published into the overlay
    forwarded = _forwarded(cluster3, 0) - before
    assert forwarded <= 20, f"{forwarded} of {MESSAGES} local-only messages went into the overlay"

    remote = client_factory(cluster3, 1)
    assert remote.subscribe(topic, 1) == [1]  # SUBACK: from now on publishes anywhere reach it
    for n in range(50):
        publisher.publish(topic, b"b" + str(n).encode(), 1)
    remote_got = remote.wait_messages(50, timeout_s=20.0)
    assert numbers((m.payload for m in remote_got), b"b") == list(range(50))
    local_got = local.wait_messages(50)
    assert numbers((m.payload for m in local_got), b"b") == list(range(50))
