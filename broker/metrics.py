"""Prometheus metrics for the broker with zero cost on the publish path.

The broker core mutates plain ints in a ``BrokerStats`` (no locks, no prometheus_client calls
on the hot path: ``stats.messages_received[qos] += 1``). ``BrokerCollector`` turns the stats into
metric families only when ``/metrics`` is scraped. ``make_registry`` builds a fresh
``CollectorRegistry`` per broker (several brokers can live in one process, e.g. in tests) that
also carries prometheus_client's process collector (CPU seconds, resident memory, open fds).

Metric names are documented in docs/configuration.md ("Metrics"); the pipeline and the
dashboards depend on them, so treat them as a public interface.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from broker.mqtt.packets import PacketType

# The classic text format generate_latest() writes; every Prometheus version understands it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Drop reasons that always appear (as 0) so dashboards and rate() see the series from the start.
DROP_REASONS = (
    "queue_full",
    "expired",
    "no_subscribers",
    "acl_denied",
    "packet_too_large",
    "slow_consumer",
)
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
    uptime_started_at: float = field(default_factory=time.time)  # unix time the broker started


def _labelled_counter(name: str, doc: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for label_value, count in list(values.items()):  # a copy: the core may add keys meanwhile
        family.add_metric([str(label_value)], count)
    return family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class BrokerCollector(Collector):
    """Builds the skipmq_* metric families from a ``BrokerStats`` at scrape time."""

    def __init__(self, stats: BrokerStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        yield _gauge("skipmq_connections", "Client connections currently open", stats.connections_current)
        yield CounterMetricFamily(
            "skipmq_connections_total",
            "Client connections accepted since start",
            value=stats.connections_total,
        )
        for name, doc, per_qos in (
            (
                "skipmq_messages_received",
                "PUBLISH messages received from clients, by QoS",
                stats.messages_received,
            ),
            ("skipmq_messages_sent", "PUBLISH messages sent to clients, by QoS", stats.messages_sent),
        ):
            family = CounterMetricFamily(name, doc, labels=["qos"])
            for qos, count in enumerate(per_qos):
                family.add_metric([str(qos)], count)
            yield family
        yield CounterMetricFamily(
            "skipmq_bytes_received", "Bytes received from clients", value=stats.bytes_received
        )
        yield CounterMetricFamily("skipmq_bytes_sent", "Bytes sent to clients", value=stats.bytes_sent)
        yield _labelled_counter(
            "skipmq_messages_dropped", "Messages dropped, by reason", "reason", stats.messages_dropped
        )
        yield _labelled_counter(
            "skipmq_packet_errors",
            "Malformed packets and protocol errors, by packet type",
            "packet_type",
            stats.packet_errors,
        )
        yield _labelled_counter(
            "skipmq_packets_received", "MQTT packets received, by type", "packet_type", stats.packets_received
        )
        yield _labelled_counter(
            "skipmq_packets_sent", "MQTT packets sent, by type", "packet_type", stats.packets_sent
        )
        yield _gauge("skipmq_retained_messages", "Retained messages stored", stats.retained_messages)
        yield _gauge("skipmq_subscriptions", "Subscriptions (all sessions)", stats.subscriptions)
        yield _gauge("skipmq_queued_messages", "Messages queued for sessions", stats.queued_messages)
        yield _gauge("skipmq_sessions", "Sessions (connected and persistent disconnected)", stats.sessions)
        yield _gauge(
            "skipmq_inflight_messages",
            "Outgoing QoS>0 messages awaiting acknowledgement",
            stats.inflight_messages,
        )
        yield _gauge(
            "skipmq_uptime_seconds",
            "Seconds since the broker started",
            max(0.0, time.time() - stats.uptime_started_at),
        )

    def describe(self) -> Iterator[Metric]:
        # Describing by collecting lets the registry detect duplicate names at register time.
        return self.collect()


def make_registry(stats: BrokerStats) -> CollectorRegistry:
    """A fresh registry with this broker's metrics and the process collector (CPU, RSS)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(BrokerCollector(stats))
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The Prometheus text exposition of ``registry``: (body, content type)."""
    return generate_latest(registry), CONTENT_TYPE
