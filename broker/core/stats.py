"""The broker's plain counters and gauges (no locks, no calls on the hot path).

The core mutates them directly (``stats.messages_received[qos] += 1``); the Prometheus collector
(``broker.metrics``) turns them into metric families only when ``/metrics`` is scraped. Metric
names are documented in docs/configuration.md ("Metrics").
"""

from __future__ import annotations

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
# Packet-type label values: PacketType names, e.g. "PUBLISH".
PACKET_TYPE_NAMES = tuple(packet_type.name for packet_type in PacketType)


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
    uptime_started_at: float = 0.0  # unix time the broker started (set by the broker at start)

    def count_drop(self, reason: str, count: int = 1) -> None:
        dropped = self.messages_dropped
        dropped[reason] = dropped.get(reason, 0) + count
