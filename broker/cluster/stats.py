"""Cluster metrics: plain-int counters kept by the runtime, exported at scrape time.

Names (docs/operations.md, dashboards/): ``skipmq_cluster_forwarded_total`` (messages this broker
published into the overlay, per topic-class publication), ``skipmq_cluster_received_total``
(forwarded messages delivered here), ``skipmq_cluster_wasted_total`` (of those, the ones no local
filter matched: the cost of routing on topic classes), ``skipmq_cluster_delivery_hops``
(histogram of overlay hops of those, 1 = direct from the publisher's broker; seed 003 path length),
``skipmq_cluster_publish_done_total{complete}`` (QoS>0 publishes whose cluster-wide storage was
confirmed, or not within ``cluster.publish_ack_wait_ms``), reorder and claim counters, and
gauges for peers and virtual nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

HOP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)


class ClusterStats:
    """Counters updated on the event-loop thread; read by the collector."""

    def __init__(self) -> None:
        self.forwarded = 0
        self.received = 0
        self.wasted = 0  # received on a subscribed class but matching no local filter
        self.duplicates_dropped = 0
        self.reordered = 0  # messages that waited for an earlier one of their stream
        self.gaps_skipped = 0  # missing sequence numbers given up after cluster.reorder_hold_ms
        self.publish_done = {"true": 0, "false": 0}
        self.claims_sent = 0
        self.sessions_handed_over = 0
        self.sessions_received = 0
        self.retained_updates_applied = 0
        self.hop_counts = [0] * (len(HOP_BUCKETS) + 1)  # per bucket, last = +Inf
        self.hop_sum = 0

    def observe_hops(self, hops: int) -> None:
        self.hop_sum += hops
        for index, bound in enumerate(HOP_BUCKETS):
            if hops <= bound:
                self.hop_counts[index] += 1
                return
        self.hop_counts[-1] += 1


class ClusterCollector(Collector):
    def __init__(self, stats: ClusterStats, gauges: Callable[[], dict[str, int]]) -> None:
        self.stats = stats
        self.gauges = gauges

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        yield CounterMetricFamily(
            "skipmq_cluster_forwarded",
            "Messages published into the overlay (per topic class)",
            stats.forwarded,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_received", "Forwarded messages delivered to this broker", stats.received
        )
        yield CounterMetricFamily(
            "skipmq_cluster_wasted",
            "Forwarded messages of a subscribed topic class that matched no local filter (docs/cluster.md)",
            stats.wasted,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_duplicates_dropped",
            "Forwarded messages received twice and dropped",
            stats.duplicates_dropped,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_reordered",
            "Forwarded messages held for an earlier one of their stream",
            stats.reordered,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_gaps_skipped",
            "Missing forwarded messages given up after reorder_hold_ms",
            stats.gaps_skipped,
        )
        done = CounterMetricFamily(
            "skipmq_cluster_publish_done",
            "QoS>0 publishes: storage at every subscriber broker confirmed (true) or not in time (false)",
            labels=["complete"],
        )
        for label, value in stats.publish_done.items():
            done.add_metric([label], value)
        yield done
        yield CounterMetricFamily(
            "skipmq_cluster_claims_sent", "Session claims sent for CONNECTs", stats.claims_sent
        )
        yield CounterMetricFamily(
            "skipmq_cluster_sessions_handed_over",
            "Sessions handed to another broker",
            stats.sessions_handed_over,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_sessions_received",
            "Sessions received from another broker",
            stats.sessions_received,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_retained_updates_applied",
            "Retained messages taken from other brokers",
            stats.retained_updates_applied,
        )
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(HOP_BUCKETS, stats.hop_counts, strict=False):
            running += count
            buckets.append((str(bound), running))
        running += stats.hop_counts[-1]
        buckets.append(("+Inf", running))
        yield HistogramMetricFamily(
            "skipmq_cluster_delivery_hops",
            "Overlay hops of forwarded messages delivered here (1 = direct from the publisher's broker)",
            buckets=buckets,
            sum_value=stats.hop_sum,
        )
        for name, value in self.gauges().items():
            yield GaugeMetricFamily(
                f"skipmq_cluster_{name}", f"Cluster: {name.replace('_', ' ')}", value=value
            )

    def describe(self) -> Iterator[Metric]:
        return self.collect()
