"""The metrics of issue #14: exact hop buckets, latency histograms, the overlay's own figures
(routing-table composition, one-hop vs multi-hop classes, peer suspicion) and session queue fill.

The overlay figures are read from real ``OverlayNode`` s stepped by the scripted harness (the same
code a broker runs); the queue figures from a real broker with a persistent session whose queue
fills up. The 3-broker cluster under a real Prometheus is tests/process/cluster/test_prometheus_real.py.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from broker.adapters.server import ThreadedBroker
from broker.adapters.transport.tls import issue_broker_cert, make_ca
from broker.cluster.overlay_figures import peer_suspicion, published_classes, routing_entries
from broker.cluster.stats import METRIC_HOP_MAX, ClusterStats
from broker.core.stats import Histogram
from broker.metrics import ClusterCollector, render
from overlay.api import PeerUnreachable
from tests.support.core import PahoClient, start_broker, wait_for
from tests.support.overlay_harness import PUB_ROLE, SUB_ROLE, Cluster, joined, small_config

__all__ = ["start_broker"]  # the fixture
Start = Callable[..., ThreadedBroker]


def metrics_text(http_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as response:
        return response.read().decode()


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, _ = render(registry)
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_histogram_counts_values_into_le_buckets() -> None:
    histogram = Histogram((0.001, 0.01, 0.1))
    for value in (0.0005, 0.001, 0.002, 0.5):
        histogram.observe(value)
    assert histogram.cumulative() == [(0.001, 2), (0.01, 3), (0.1, 3), (float("inf"), 4)]
    assert abs(histogram.total - 0.5035) < 1e-12


def test_delivery_hops_has_one_bucket_per_hop_count() -> None:
    stats = ClusterStats()
    for hops in (1, 1, 1, 5, 6, 17):
        stats.observe_hops(hops)
    registry = CollectorRegistry()
    registry.register(ClusterCollector(stats, dict))
    got = samples(registry)

    def bucket(le: str) -> float:
        return got[("skipmq_cluster_delivery_hops_bucket", (("le", le),))]

    assert [bucket(str(k)) for k in range(1, 8)] == [3, 3, 3, 3, 4, 5, 5]  # 5 and 6 hops told apart
    assert bucket(str(METRIC_HOP_MAX)) == 5
    assert bucket("+Inf") == 6
    assert got[("skipmq_cluster_delivery_hops_sum", ())] == 1 + 1 + 1 + 5 + 6 + 17


def test_overlay_message_kinds_are_exported_by_name_from_zero() -> None:
    from overlay.messages import PING

    stats = ClusterStats()
    stats.overlay_sent[PING] = 3
    registry = CollectorRegistry()
    registry.register(ClusterCollector(stats, dict))
    got = samples(registry)
    assert got[("skipmq_overlay_messages_sent_total", (("kind", "PING"),))] == 3
    for kind in ("REXP", "EEXP", "PUB", "UNSUB", "NEW"):
        assert got[("skipmq_overlay_messages_received_total", (("kind", kind),))] == 0


def test_routing_entries_and_one_hop_classes_from_real_overlay_nodes() -> None:
    cluster = Cluster(4, small_config(table_size=10))
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE), (1, "t", SUB_ROLE), (2, "t", SUB_ROLE), (3, "u", SUB_ROLE)], 5.0)
    cluster.advance(20.0)
    node = cluster.nodes[0]
    entries = routing_entries(node)
    (vnode,) = node.vnodes.values()
    table = vnode.table
    assert sum(entries.values()) == len(table) > 0
    assert entries["sticky"] == len(table.sticky_keys())
    subs_in_table = {key for key in table if key[0] == "t" and key[1] == 1}
    assert subs_in_table, "the publisher learned no subscriber: the test would be vacuous"
    sticky_subs = subs_in_table & set(table.sticky_keys())
    assert entries["same_class_subscriber"] == len(subs_in_table - sticky_subs)
    # both subscriber brokers of "t" are in the publisher's table: one hop; "u" has nobody else
    # known here but broker 3; "v" nobody at all
    known = {"t": [1, 2], "u": [3], "v": []}
    got = published_classes(node, ["t", "v"], lambda cls: known[cls])
    assert got == {"one_hop": 1, "multi_hop": 0, "no_subscribers": 1}
    # a subscriber broker the publisher's table does not hold makes the class multi-hop
    known["t"] = [1, 2, 99]
    assert published_classes(node, ["t"], lambda cls: known[cls])["multi_hop"] == 1


def test_peer_suspicion_follows_the_failure_detector() -> None:
    cluster = Cluster(3, small_config())
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE), (1, "t", SUB_ROLE), (2, "t", SUB_ROLE)], 5.0)
    node = cluster.nodes[0]
    suspected, silence = peer_suspicion(node, cluster.now, [1, 2], {})
    assert suspected == {1: 0, 2: 0}
    assert all(seconds >= 0 for seconds in silence.values())
    cluster.event(0, PeerUnreachable(2))  # the transport lost it: declared dead at once
    suspected, _ = peer_suspicion(node, cluster.now, [1, 2], {})
    assert suspected == {1: 0, 2: 1}
    suspected, _ = peer_suspicion(node, cluster.now, [1], {1: cluster.now})
    assert suspected[1] == 1  # the engine's unreachable peers count too


def test_queue_fill_of_a_persistent_session(start_broker: Start) -> None:
    broker = start_broker(**{"limits.max_queued_messages": 10})
    port, http_port = broker.ports["tcp"], broker.ports["http"]
    subscriber = PahoClient(port, "queue-fill-sub", clean_session=False).start()
    subscriber.subscribe("fill/#", qos=1)
    subscriber.stop()  # persistent session: what is published now is queued
    publisher = PahoClient(port, "queue-fill-pub").start()
    for number in range(9):
        publisher.publish("fill/x", str(number).encode(), qos=1)

    def scraped() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (sample.name, ()): sample.value
            for family in text_string_to_metric_families(metrics_text(http_port))
            for sample in family.samples
            if not sample.labels
        }

    wait_for(lambda: scraped()[("skipmq_session_queue_depth_max", ())] == 9, what="9 messages queued")
    got = scraped()
    assert got[("skipmq_session_queue_limit", ())] == 10
    assert got[("skipmq_sessions_queue_near_limit", ())] == 1  # 9 of 10 >= 80 %
    assert got[("skipmq_store_commit_seconds_count", ())] > 0  # the QoS 1 messages were committed
    publisher.stop()


def test_certificate_expiry_of_the_tls_listener(start_broker: Start, tmp_path: Path) -> None:
    """A broker serving MQTT over TLS with a certificate valid for 10 days exports its expiry; a
    certificate file replaced by garbage shows as a read error (the broker keeps its loaded one)."""
    make_ca(tmp_path / "ca")
    cert, key = issue_broker_cert(tmp_path / "ca", "127.0.0.1:1", days=10)
    broker = start_broker(
        **{
            "listeners.tls.enabled": True,
            "listeners.tls.port": 0,
            "listeners.tls.host": "127.0.0.1",
            "listeners.tls.certfile": str(cert),
            "listeners.tls.keyfile": str(key),
        }
    )
    http_port = broker.ports["http"]

    def series() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(metrics_text(http_port))
            for sample in family.samples
            if sample.name.startswith("skipmq_tls_")
        }

    setting = (("setting", "listeners.tls.certfile"),)
    got = series()
    expiry = got[("skipmq_tls_certificate_expiry_timestamp_seconds", setting)]
    assert abs(expiry - (time.time() + 10 * 86400)) < 3600
    assert got[("skipmq_tls_certificate_read_errors", setting)] == 0
    cert.write_text("not a certificate\n")
    got = series()
    assert ("skipmq_tls_certificate_expiry_timestamp_seconds", setting) not in got
    assert got[("skipmq_tls_certificate_read_errors", setting)] == 1
