"""The per-class counters and the snapshots built from them (broker.cluster.class_stats, issue #13)."""

from __future__ import annotations

from broker.cluster.class_stats import ClassCounters, SnapshotBuilder


def test_snapshot_carries_totals_and_deltas_per_class() -> None:
    counters = ClassCounters()
    builder = SnapshotBuilder("b1:7000", counters, table_size=2)
    for _ in range(5):
        counters.published("=hot")
        counters.forwarded("=hot")
    counters.received("=hot", 1, delivered=True)
    counters.received("=hot", 3, delivered=False)
    counters.received("=hot", 20, delivered=True)
    first = builder.build(100.0, lambda cls: 1)
    hot = first["classes"][0]
    assert first["broker"] == "b1:7000" and first["seq"] == 1 and first["table_size"] == 2
    assert (hot["class"], hot["publishes"], hot["publishes_delta"]) == ("=hot", 5, 5)
    assert (hot["received"], hot["deliveries"], hot["wasted"], hot["hop_sum"]) == (3, 2, 1, 24)
    # buckets 1,2,3,4,6,8,12,16,+Inf: one hop of 1, one of 3, one past 16
    assert hot["hops_delta"] == [1, 0, 1, 0, 0, 0, 0, 0, 1]
    assert first["hop_bounds"][-1] == "+Inf"

    counters.published("=hot")
    second = builder.build(110.0, lambda cls: 3)
    hot = second["classes"][0]
    assert second["interval_s"] == 10.0 and second["seq"] == 2
    assert (hot["publishes"], hot["publishes_delta"], hot["received_delta"]) == (6, 1, 0)
    assert hot["hops_delta"] == [0] * 9
    # the subscriber-broker count went 1 -> 3: the row shows the crossing of L = 2
    assert (hot["subscriber_brokers_before"], hot["subscriber_brokers"]) == (1, 3)


def test_known_classes_without_traffic_are_reported() -> None:
    builder = SnapshotBuilder("b", ClassCounters(), table_size=60)
    snapshot = builder.build(1.0, lambda cls: 2, known_classes=["=idle"])
    assert [(c["class"], c["publishes"], c["subscriber_brokers"]) for c in snapshot["classes"]] == [
        ("=idle", 0, 2)
    ]
