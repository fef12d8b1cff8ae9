"""The cluster fast path (issue #11; broker/cluster/engine.py ``on_publish``, overlay/node.py
``reaches_only_self``): a publish whose topic class no other broker subscribes does no overlay work
(it is delivered locally; QoS >= 1 goes into the durable send log, or with
``cluster.local_qos1_in_memory`` is kept in memory and written to the store only while some other
broker is down or unreachable), and the moment another broker subscribes, a
publish after its SUBACK reaches it (docs/cluster.md "Subscriptions").

Real brokers (3-broker cluster over gRPC), paho clients, the brokers' own SQLite files.
"""

from __future__ import annotations

import time

from tests.support.cluster import (
    ClientFactory,
    ClusterFactory,
    metric_total,
    numbers,
    send_log_rows,
    unique_id,
    wait_until,
)
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


def test_a_local_only_qos1_publish_needs_no_send_log_row_while_every_peer_is_connected(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    """With ``cluster.local_qos1_in_memory`` (off by default), local deliveries in a cluster cost
    what they cost on a single broker: a QoS 1 publish on a class nobody elsewhere subscribes is
    not written to the store (its PUBACK waits for no commit)
    while every other broker is connected; with a broker down it is written again (for a receiver
    cut off on the other side that we have not heard of, should this broker crash before it is
    back). ``cluster.send_log_min_retention_ms`` (10 s) keeps any row written here until after
    the counts below."""
    cluster = cluster_factory(3, settings={"cluster.local_qos1_in_memory": "true"})
    prefix = unique_id("fastrows")
    topic, cls = f"{prefix}/t", f"={prefix}"
    local = client_factory(cluster, 0)
    assert local.subscribe(topic, 1) == [1]
    publisher = client_factory(cluster, 0)
    publisher.publish(topic, b"warm", 1)  # the full path once: joins the class as a publisher
    local.wait_messages(1)
    for n in range(MESSAGES):
        publisher.publish_nowait(topic, b"a" + str(n).encode(), 1)
    wait_until(lambda: not publisher.pending, 30.0, what="every QoS 1 publish acknowledged")
    assert numbers((m.payload for m in local.wait_messages(MESSAGES)), b"a") == list(range(MESSAGES))
    # the full path runs at most once a second per class (QUIET_RECHECK_S) and logs its message
    rows = send_log_rows(cluster, 0, cls)
    assert rows <= 20, f"{rows} of {MESSAGES + 1} local-only QoS 1 messages were written to the store"

    gone = cluster.brokers[2].peer_id
    cluster.kill_broker(2)
    wait_until(
        lambda: gone not in cluster.cluster_state(0)["connected_peers"],
        30.0,
        what="broker 0 sees broker 2's link down",
    )
    time.sleep(1.5)  # past QUIET_RECHECK_S: the class's reach is checked again
    before = send_log_rows(cluster, 0, cls)
    for n in range(100):
        publisher.publish_nowait(topic, b"b" + str(n).encode(), 1)
    wait_until(lambda: not publisher.pending, 30.0, what="every QoS 1 publish acknowledged")
    assert numbers((m.payload for m in local.wait_messages(100)), b"b") == list(range(100))
    written = send_log_rows(cluster, 0, cls) - before
    assert written >= 100, f"only {written} of 100 QoS 1 messages written while a peer was down"
