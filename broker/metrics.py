"""Prometheus metrics for the broker with zero cost on the publish path.

The broker core mutates plain ints in a ``broker.core.stats.BrokerStats`` (no locks, no
prometheus_client calls on the hot path: ``stats.messages_received[qos] += 1``).
``BrokerCollector`` turns the stats into metric families only when ``/metrics`` is scraped.
``make_registry`` builds a fresh ``CollectorRegistry`` per broker (several brokers can live in one
process, e.g. in tests) that also carries prometheus_client's process collector (CPU seconds,
resident memory, open fds).

Metric names are documented in docs/configuration.md ("Metrics"); the pipeline and the
dashboards depend on them, so treat them as a public interface.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from broker import __version__
from broker.cluster.stats import LATENCY_SAMPLE_EVERY, METRIC_HOP_MAX, RTT_SAMPLE_EVERY, ClusterStats
from broker.config import BrokerConfig
from broker.core.stats import QUEUE_NEAR_LIMIT, BrokerStats, Histogram

if TYPE_CHECKING:  # a type only: overlay.node (~1 MiB) loads where a cluster starts
    from broker.cluster.overlay_figures import OverlayFigures

# The classic text format generate_latest() writes; every Prometheus version understands it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _labelled_counter(name: str, doc: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for label_value, count in list(values.items()):  # a copy: the core may add keys meanwhile
        family.add_metric([str(label_value)], count)
    return family


def _histogram(name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
    buckets = [(floatToGoString(bound), count) for bound, count in histogram.cumulative()]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=histogram.total)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


@functools.cache
def git_revision() -> str | None:
    """The commit this broker runs, when cheaply known, else None (the label is then left out).

    Read once from the git metadata of a source checkout next to the package (plain files: no
    subprocess; works in a worktree and with packed refs). An installed wheel or the image has no
    checkout, hence no revision. (Not an environment variable: every SKIPMQ_* variable must be a
    configuration key, broker/config/schema.py.)
    """
    try:
        dot_git = Path(__file__).resolve().parent.parent / ".git"
        git_dir = dot_git
        if dot_git.is_file():  # a worktree: "gitdir: <path>"
            git_dir = Path(dot_git.read_text().split(":", 1)[1].strip())
        head = (git_dir / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head or None  # detached HEAD
        ref = head[5:]
        common = git_dir
        if (git_dir / "commondir").is_file():
            common = (git_dir / (git_dir / "commondir").read_text().strip()).resolve()
        for base in (git_dir, common):
            if (base / ref).is_file():
                return (base / ref).read_text().strip() or None
        for line in (common / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split(" ", 1)[0]
    except (OSError, IndexError):
        return None
    return None


def build_info() -> GaugeMetricFamily:
    """``skipmq_build_info{version, python_version[, revision]} 1``: join it on ``instance`` to
    label other series with the version a broker runs."""
    revision = git_revision()
    labels = ["version", "python_version"] + (["revision"] if revision else [])
    family = GaugeMetricFamily(
        "skipmq_build_info", "SkipMQ build: always 1, the version in the labels", labels=labels
    )
    values = [__version__, platform.python_version()] + ([revision] if revision else [])
    family.add_metric(values, 1)
    return family


class BrokerCollector(Collector):
    """Builds the skipmq_* metric families from a ``BrokerStats`` at scrape time."""

    def __init__(self, stats: BrokerStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        yield build_info()
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
            "skipmq_store_errors",
            "Store (SQLite) failures, by kind: a store call while handling a packet, a group commit,"
            " the rewrite of the store from memory",
            "kind",
            stats.store_errors,
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
            "skipmq_session_queue_limit",
            "Messages a session queue may hold (limits.max_queued_messages)",
            stats.queue_limit,
        )
        yield _gauge(
            "skipmq_session_queue_depth_max", "Messages in the longest session queue", stats.queue_depth_max
        )
        yield _gauge(
            "skipmq_sessions_queue_near_limit",
            f"Sessions whose queue holds at least {QUEUE_NEAR_LIMIT:.0%} of limits.max_queued_messages",
            stats.sessions_queue_near_limit,
        )
        yield _histogram(
            "skipmq_store_commit_seconds",
            "Duration of each group commit of the SQLite store (COMMIT and its fsync)",
            stats.store_commit_seconds,
        )
        yield _labelled_counter(
            "skipmq_store_checkpoints",
            "Background WAL checkpoints of the SQLite store, by outcome: completed (every WAL frame"
            " copied into the database), partial (a commit overlapped the pass), failed",
            "outcome",
            stats.store_checkpoints,
        )
        yield _histogram(
            "skipmq_store_checkpoint_seconds",
            "Duration of each background WAL checkpoint of the SQLite store (copy and fsyncs)",
            stats.store_checkpoint_seconds,
        )
        yield _gauge(
            "skipmq_uptime_seconds",
            "Seconds since the broker started",
            max(0.0, time.time() - stats.uptime_started_at) if stats.uptime_started_at else 0.0,
        )

    def describe(self) -> Iterator[Metric]:
        # Describing by collecting lets the registry detect duplicate names at register time.
        return self.collect()


# Overlay message kinds always exported (from 0): seed 003's queries and SkipMQ's maintenance
# messages (overlay/messages.py); cluster envelopes appear as "Envelope".
OVERLAY_KINDS = (
    "REXP",
    "EEXP",
    "PUB",
    "UNSUB",
    "NEW",
    "SEARCH",
    "FOUND",
    "LINK",
    "LEAVE",
    "PING",
    "PONG",
    "ACK",
    "DONE",
    "GONE",
    "PRESENCE",
    "Envelope",
)


def overlay_families(figures: OverlayFigures) -> Iterator[Metric]:
    """The skipmq_overlay_* families of ``broker.cluster.overlay_figures`` (read at scrape time)."""
    entries = GaugeMetricFamily(
        "skipmq_overlay_routing_entries",
        "Routing-table entries of all this broker's virtual nodes, by kind: sticky (level-0"
        " neighbours), same_class_subscriber (subscribers of the node's own class), other",
        labels=["kind"],
    )
    for kind, count in figures.routing_entries.items():
        entries.add_metric([kind], count)
    yield entries
    classes = GaugeMetricFamily(
        "skipmq_overlay_published_classes",
        "Classes this broker publishes, by delivery: one_hop (its table holds every subscriber"
        " broker), multi_hop (some are reached through others), no_subscribers (publishes suppressed)",
        labels=["delivery"],
    )
    for delivery, count in figures.published_classes.items():
        classes.add_metric([delivery], count)
    yield classes
    suspected = GaugeMetricFamily(
        "skipmq_cluster_peer_suspected",
        "1 while this broker suspects the peer broker down (failure detector or transport), else 0",
        labels=["peer"],
    )
    for peer, flag in figures.peer_suspected.items():
        suspected.add_metric([peer], flag)
    yield suspected
    silence = GaugeMetricFamily(
        "skipmq_cluster_peer_silence_seconds",
        "Seconds since a peer broker the failure detector watches was last heard from",
        labels=["peer"],
    )
    for peer, seconds in figures.peer_silence_s.items():
        silence.add_metric([peer], seconds)
    yield silence


class ClusterCollector(Collector):
    """Builds the skipmq_cluster_* metric families from a ``ClusterStats`` and the engine's gauges."""

    def __init__(
        self,
        stats: ClusterStats,
        gauges: Callable[[], dict[str, int]],
        figures: Callable[[], OverlayFigures] | None = None,
        sender_counters: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.stats = stats
        self.gauges = gauges
        self.figures = figures
        self.sender_counters = sender_counters

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
            "skipmq_cluster_catch_up_sessions_set_aside",
            "Sessions that stopped pacing a catch-up (slower than the live stream: queue policy applies)",
            stats.catch_up_sessions_set_aside,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_gaps_skipped",
            "Missing forwarded messages given up because their sender no longer had them",
            stats.gaps_skipped,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_republished",
            "Send-log messages published through the overlay again (publication not completed)",
            stats.republished,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_resent",
            "Send-log messages sent again directly to a receiver broker (RET or unacknowledged)",
            stats.resent,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_rets_sent", "Retransmission requests (RET) sent for gaps", stats.rets_sent
        )
        yield CounterMetricFamily(
            "skipmq_cluster_receivers_given_up",
            "Receiver brokers silent for send_log_retention_s that the send log stopped waiting for",
            stats.receivers_given_up,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_causal_held",
            "Causal-group messages that waited for a message they depend on (cluster.causal_groups)",
            stats.causal_held,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_causal_given_up",
            "Causal-group messages delivered without a dependency after cluster.causal_wait_ms",
            stats.causal_given_up,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_subscribe_waits_timed_out",
            "SUBACKs or CONNACKs that waited subscribe_wait_ms for their classes to join the overlay",
            stats.subscribe_waits_timed_out,
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
            "skipmq_cluster_claims_refused",
            "Session claims refused: the client id's session here belongs to another user",
            stats.claims_refused,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_inbound_rejected",
            "Cluster messages dropped as not valid from the broker that sent them",
            stats.inbound_rejected,
        )
        rejected = CounterMetricFamily(
            "skipmq_cluster_origin_proofs_rejected",
            "Items dropped because their origin proof was missing or did not show their origin made "
            "them (forwarded, retained, claim, envelope; docs/security.md)",
            labels=["kind"],
        )
        for proof_kind in ("forwarded", "retained", "claim", "envelope"):
            rejected.add_metric([proof_kind], stats.origin_proofs_rejected[proof_kind])
        yield rejected
        yield CounterMetricFamily(
            "skipmq_cluster_origin_proofs_signed",
            "Origin proofs this broker made (one per publication or directed message it originated)",
            stats.origin_proofs_signed,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_origin_proofs_verified",
            "Origin proofs of other brokers checked and found good",
            stats.origin_proofs_verified,
        )
        yield CounterMetricFamily(
            "skipmq_cluster_origin_proofs_link_bound",
            "Origin proofs of other brokers taken from the origin's own proven link: certificate "
            "checked, signature not (docs/security.md)",
            stats.origin_proofs_link_bound,
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
        for hops in range(1, METRIC_HOP_MAX + 1):
            running += stats.hop_counts[hops - 1]
            buckets.append((str(hops), running))
        buckets.append(("+Inf", running + stats.hop_counts[-1]))
        yield HistogramMetricFamily(
            "skipmq_cluster_delivery_hops",
            "Overlay hops of forwarded messages delivered here (1 = direct from the publisher's broker;"
            f" one bucket per hop count up to {METRIC_HOP_MAX})",
            buckets=buckets,
            sum_value=stats.hop_sum,
        )
        yield _histogram(
            "skipmq_cluster_publish_confirm_seconds",
            "QoS>0 messages forwarded into the overlay: seconds until every subscriber broker delivered"
            f" and stored them (the overlay's DONE); one publication in {LATENCY_SAMPLE_EVERY} is timed",
            stats.publish_confirm_seconds,
        )
        yield _histogram(
            "skipmq_cluster_peer_rtt_seconds",
            "Round trips to peer brokers: every failure-detector PING to its PONG, one overlay PUB"
            f" delegation in {RTT_SAMPLE_EVERY} to its per-hop ACK",
            stats.peer_rtt_seconds,
        )
        for name, doc, per_kind in (
            (
                "skipmq_overlay_messages_sent",
                "Overlay and cluster messages sent, by kind",
                stats.overlay_sent,
            ),
            (
                "skipmq_overlay_messages_received",
                "Overlay and cluster messages received, by kind",
                stats.overlay_received,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=["kind"])
            counts = {kind: 0 for kind in OVERLAY_KINDS}
            for message_type, count in list(per_kind.items()):
                # an overlay message's ``kind`` is a property (overlay/messages.py), equal to its
                # class name; a class without one is counted by its name
                kind = getattr(message_type, "kind", None)
                label = kind if isinstance(kind, str) else message_type.__name__
                counts[label] = counts.get(label, 0) + count
            for label, count in sorted(counts.items()):
                family.add_metric([label], count)
            yield family
        if self.sender_counters is not None:
            counters = self.sender_counters()
            yield CounterMetricFamily(
                "skipmq_cluster_publishes_suppressed",
                "Messages not forwarded into the overlay: their class had no subscriber broker",
                counters["publishes_suppressed"],
            )
            yield CounterMetricFamily(
                "skipmq_cluster_rets_received",
                "Retransmission requests (RET) from receiver brokers answered from the send log",
                counters["rets_received"],
            )
        if self.figures is not None:
            yield from overlay_families(self.figures())
        for name, value in self.gauges().items():
            yield GaugeMetricFamily(
                f"skipmq_cluster_{name}", f"Cluster: {name.replace('_', ' ')}", value=value
            )

    def describe(self) -> Iterator[Metric]:
        return self.collect()


def certificate_files(config: BrokerConfig) -> dict[str, str]:
    """The certificate files a broker's configuration names, by setting (only the set ones; the
    client listener's only while it is enabled)."""
    files = {}
    tls = config.listeners.tls
    if tls.enabled:
        files["listeners.tls.certfile"] = tls.certfile
        files["listeners.tls.cafile"] = tls.cafile
    if config.cluster.enabled:
        files["cluster.tls_cert_file"] = config.cluster.tls_cert_file
        files["cluster.tls_ca_file"] = config.cluster.tls_ca_file
    return {setting: path for setting, path in files.items() if path}


class CertificateCollector(Collector):
    """``skipmq_tls_certificate_expiry_timestamp_seconds{setting}``: when the first certificate of
    each configured PEM file expires (unix time). Read at scrape time, so a rotated file (the broker
    re-reads its cluster certificates for new links) shows its new date; parsed again only when the
    file's mtime or size changed. A file that cannot be read or parsed has no series (and
    ``skipmq_tls_certificate_read_errors`` counts it)."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files
        self._cache: dict[str, tuple[tuple[int, int], float]] = {}

    def _expiry(self, path: str) -> float | None:
        from cryptography import x509

        try:
            status = os.stat(path)
            stamp = (status.st_mtime_ns, status.st_size)
            cached = self._cache.get(path)
            if cached is not None and cached[0] == stamp:
                return cached[1]
            with open(path, "rb") as handle:
                certificate = x509.load_pem_x509_certificate(handle.read())
        except (OSError, ValueError):
            return None
        expiry = certificate.not_valid_after_utc.timestamp()
        self._cache[path] = (stamp, expiry)
        return expiry

    def collect(self) -> Iterator[Metric]:
        expiry = GaugeMetricFamily(
            "skipmq_tls_certificate_expiry_timestamp_seconds",
            "When the (first) certificate of each configured certificate file expires, unix time",
            labels=["setting"],
        )
        errors = GaugeMetricFamily(
            "skipmq_tls_certificate_read_errors",
            "Configured certificate files that could not be read or parsed at this scrape",
            labels=["setting"],
        )
        for setting, path in sorted(self.files.items()):
            when = self._expiry(path)
            if when is None:
                errors.add_metric([setting], 1)
            else:
                expiry.add_metric([setting], when)
                errors.add_metric([setting], 0)
        yield expiry
        yield errors

    def describe(self) -> Iterator[Metric]:
        return self.collect()


def make_registry(stats: BrokerStats, certificates: dict[str, str] | None = None) -> CollectorRegistry:
    """A fresh registry with this broker's metrics, the expiry of its certificate files
    (``certificates``: setting -> path, see ``certificate_files``) and the process collector."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(BrokerCollector(stats))
    registry.register(CertificateCollector(certificates or {}))
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The Prometheus text exposition of ``registry``: (body, content type)."""
    return generate_latest(registry), CONTENT_TYPE
