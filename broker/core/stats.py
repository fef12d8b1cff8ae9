"""The broker's plain counters and gauges (no locks, no calls on the hot path).

The core mutates them directly (``stats.messages_received[qos] += 1``); the Prometheus collector
(``broker.metrics``) turns them into metric families only when ``/metrics`` is scraped. Metric
names are documented in docs/configuration.md ("Metrics").
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from broker.mqtt.packets import PacketType

# Drop reasons that always appear (as 0) so dashboards and rate() see the series from the start
# (broker/core/drops.py says what each means; docs/configuration.md "Metrics").
DROP_REASONS = (
    "queue_full_oldest",
    "queue_full_new",
    "expired",
    "no_subscribers",
    "acl_denied",
    "packet_too_large",
    "slow_consumer",
    "qos0_offline",
    "session_ended",
    "memory_high_water",
)
# Store failure kinds (broker/core/durability.py): a store call failing while a packet is handled,
# a group commit failing, the rewrite of the store from memory failing. Always present, from 0.
STORE_ERROR_KINDS = ("operation", "commit", "resync")
# Background WAL checkpoint outcomes (broker/adapters/sqlite_checkpoint.py): every frame copied
# (the next COMMIT starts the WAL over), some left (a COMMIT overlapped the pass), an error.
CHECKPOINT_OUTCOMES = ("completed", "partial", "failed")
# Packet-type label values: PacketType names, e.g. "PUBLISH".
PACKET_TYPE_NAMES = tuple(packet_type.name for packet_type in PacketType)


# A session queue this full (of limits.max_queued_messages) counts as near its limit.
QUEUE_NEAR_LIMIT = 0.8
# Group-commit durations (SQLite COMMIT with its fsync): a WAL commit on a local SSD takes well
# under a millisecond, a busy or network disk tens to hundreds; seconds mean a failing disk.
STORE_COMMIT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """A Prometheus-style histogram in plain ints: ``observe`` is one bisect and two additions
    (no lock, no prometheus_client call); ``broker.metrics`` exports it at scrape time.

    ``counts[i]`` counts values ``<= bounds[i]`` and above ``bounds[i-1]``; the last slot counts
    values above every bound (+Inf)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs, ending with (inf, count of every value)."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((float(bound), running))
        out.append((float("inf"), running + self.counts[-1]))
        return out


def _zeroes(names: tuple[str, ...]) -> dict[str, int]:
    return dict.fromkeys(names, 0)


@dataclass(slots=True)
class BrokerStats:
    """Plain counters and gauges the broker core updates directly (no locks, no calls)."""

    connections_current: int = 0
    connections_total: int = 0
    messages_received: list[int] = field(default_factory=lambda: [0, 0, 0])  # index: QoS 0..2
    messages_sent: list[int] = field(default_factory=lambda: [0, 0, 0])  # index: QoS 0..2
    bytes_received: int = 0
    bytes_sent: int = 0
    messages_dropped: dict[str, int] = field(default_factory=lambda: _zeroes(DROP_REASONS))  # reason -> n
    # packet type name -> malformed packets / protocol errors
    packet_errors: dict[str, int] = field(default_factory=lambda: _zeroes(PACKET_TYPE_NAMES))
    packets_received: dict[str, int] = field(default_factory=lambda: _zeroes(PACKET_TYPE_NAMES))
    packets_sent: dict[str, int] = field(default_factory=lambda: _zeroes(PACKET_TYPE_NAMES))
    retained_messages: int = 0
    subscriptions: int = 0
    queued_messages: int = 0
    sessions: int = 0
    inflight_messages: int = 0
    store_errors: dict[str, int] = field(default_factory=lambda: _zeroes(STORE_ERROR_KINDS))  # kind -> n
    # every group commit's duration (observed by the SQLite adapter, once per commit, not per message)
    store_commit_seconds: Histogram = field(default_factory=lambda: Histogram(STORE_COMMIT_BUCKETS_S))
    # the store's background WAL checkpoints (observed on the checkpoint thread): passes by outcome
    # and each pass's duration (the copy into the database and its fsyncs)
    store_checkpoints: dict[str, int] = field(default_factory=lambda: _zeroes(CHECKPOINT_OUTCOMES))
    store_checkpoint_seconds: Histogram = field(default_factory=lambda: Histogram(STORE_COMMIT_BUCKETS_S))
    # refreshed at scrape time (``Broker.refresh_stats``) from every session's queue
    queue_limit: int = 0  # limits.max_queued_messages
    queue_depth_max: int = 0  # the longest session queue
    sessions_queue_near_limit: int = 0  # sessions whose queue holds >= QUEUE_NEAR_LIMIT of the limit
    uptime_started_at: float = 0.0  # unix time the broker started (set by the broker at start)

    def count_drop(self, reason: str, count: int = 1) -> None:
        dropped = self.messages_dropped
        dropped[reason] = dropped.get(reason, 0) + count
