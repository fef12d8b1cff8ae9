"""Per-class snapshots on $SYS/skipmq/<broker-id>/classes (issue #13; docs/pipeline.md "Snapshots").

A real 3-broker cluster, real paho clients: what a publisher sends on one broker shows up in that
broker's snapshots as publishes and forwards, at the subscriber's broker as deliveries with their
hop counts, and the subscriber-broker count of a class follows subscriptions on other brokers.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.cluster import (
    ClientFactory,
    ClusterClient,
    ClusterFactory,
    probe_route,
    unique_id,
    wait_until,
)

SETTINGS = {"cluster.class_snapshot_interval_s": "1", "cluster.table_size": "2"}


def latest(sys_sub: ClusterClient, broker_id: str, cls: str, seen: dict[str, Any]) -> dict[str, Any] | None:
    """The newest snapshot entry of ``cls`` from ``broker_id`` received so far."""
    while not sys_sub.messages.empty():
        message = sys_sub.messages.get_nowait()
        snapshot = json.loads(message.payload)
        assert message.topic == f"$SYS/skipmq/{snapshot['broker']}/classes"
        for entry in snapshot["classes"]:
            seen[(snapshot["broker"], entry["class"])] = {
                **entry,
                "table_size": snapshot["table_size"],
                "seq": snapshot["seq"],
            }
    return seen.get((broker_id, cls))


def test_snapshots_count_one_class_on_publisher_and_subscriber_brokers(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    cluster = cluster_factory(3, settings=SETTINGS)
    ids = [broker.peer_id for broker in cluster.brokers]
    prefix = unique_id("hot")
    topic, cls = f"{prefix}/a", f"={prefix}"
    watch0 = client_factory(cluster, 0)
    watch1 = client_factory(cluster, 1)
    watch0.subscribe("$SYS/skipmq/+/classes", 0)
    watch1.subscribe("$SYS/skipmq/+/classes", 0)
    sub = client_factory(cluster, 1)
    sub.subscribe(topic, 1)
    probe_route(cluster, 0, sub, topic)
    seen0: dict[str, Any] = {}
    seen1: dict[str, Any] = {}
    # the probes are counted too: the figure once it stopped moving is the base
    counts: list[int] = []
    seq: list[int] = [-1]

    def settled() -> int | None:
        entry = latest(watch0, ids[0], cls, seen0)
        if entry is not None and (not counts or counts[-1] != entry["publishes"] or entry["seq"] != seq[-1]):
            counts.append(entry["publishes"])
            seq.append(entry["seq"])
        return counts[-1] if len(counts) >= 2 and counts[-1] == counts[-2] else None

    base = wait_until(settled, 15, what="the probes counted")
    pub = client_factory(cluster, 0)
    for n in range(40):
        pub.publish(topic, f"m{n}".encode(), 1)
    sub.wait_messages(40)
    at_pub = wait_until(
        lambda: (e := latest(watch0, ids[0], cls, seen0)) and e["publishes"] >= base + 40 and e,
        15,
        what="the publisher broker's snapshot counts the publishes",
    )
    assert at_pub["publishes"] == base + 40 and at_pub["forwards"] >= 40
    at_sub = wait_until(
        lambda: (e := latest(watch1, ids[1], cls, seen1)) and e["deliveries"] >= 40 and e,
        15,
        what="the subscriber broker's snapshot counts the deliveries",
    )
    assert at_sub["wasted"] == 0 and sum(at_sub["hops"]) == at_sub["received"] >= 40
    # only broker 1 subscribes; then brokers 0 and 2 do too: 3 subscriber brokers > L = 2
    assert at_pub["subscriber_brokers"] == 1 and at_pub["table_size"] == 2
    for index in (0, 2):
        client_factory(cluster, index).subscribe(topic, 0)
    crossed = wait_until(
        lambda: (e := latest(watch0, ids[0], cls, seen0)) and e["subscriber_brokers"] == 3 and e,
        15,
        what="broker 0 sees three subscriber brokers",
    )
    assert crossed["subscriber_brokers_before"] in (1, 2)
