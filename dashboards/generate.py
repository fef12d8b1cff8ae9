"""Generates the Grafana dashboards in this folder from one list of panels.

The JSON files are generated, not hand-edited: `python dashboards/generate.py` rewrites them and
tests/test_dashboards.py checks that the committed files match this generator and that every
metric a panel queries is one the broker actually exports (broker/metrics.py). The same files are
written into helm/skipmq/dashboards/ (a chart cannot read files outside its directory), which the
chart ships as a ConfigMap for Grafana's dashboard sidecar.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHART_COPY = HERE.parent / "helm" / "skipmq" / "dashboards"

# (title, unit, [(PromQL expression, legend)], panel width)
BROKER_PANELS: list[tuple[str, str, list[tuple[str, str]], int]] = [
    ("Connected clients", "short", [("sum by (instance) (skipmq_connections)", "{{instance}}")], 8),
    (
        "Connection rate",
        "ops",
        [("sum by (instance) (rate(skipmq_connections_total[1m]))", "{{instance}}")],
        8,
    ),
    ("Sessions", "short", [("sum by (instance) (skipmq_sessions)", "{{instance}}")], 8),
    (
        "Messages in by QoS",
        "ops",
        [("sum by (qos) (rate(skipmq_messages_received_total[1m]))", "QoS {{qos}}")],
        12,
    ),
    (
        "Messages out by QoS",
        "ops",
        [("sum by (qos) (rate(skipmq_messages_sent_total[1m]))", "QoS {{qos}}")],
        12,
    ),
    (
        "Bytes in / out",
        "Bps",
        [
            ("sum(rate(skipmq_bytes_received_total[1m]))", "in"),
            ("sum(rate(skipmq_bytes_sent_total[1m]))", "out"),
        ],
        12,
    ),
    (
        "Dropped messages by reason",
        "ops",
        [("sum by (reason) (rate(skipmq_messages_dropped_total[5m]))", "{{reason}}")],
        12,
    ),
    (
        "Queued and in-flight messages",
        "short",
        [
            ("sum by (instance) (skipmq_queued_messages)", "queued {{instance}}"),
            ("sum by (instance) (skipmq_inflight_messages)", "in flight {{instance}}"),
        ],
        12,
    ),
    (
        "Subscriptions and retained messages",
        "short",
        [
            ("sum by (instance) (skipmq_subscriptions)", "subscriptions {{instance}}"),
            ("sum by (instance) (skipmq_retained_messages)", "retained {{instance}}"),
        ],
        12,
    ),
    (
        "Protocol errors by packet type",
        "ops",
        [("sum by (packet_type) (rate(skipmq_packet_errors_total[5m]))", "{{packet_type}}")],
        12,
    ),
    (
        "Packets in by type",
        "ops",
        [("sum by (packet_type) (rate(skipmq_packets_received_total[1m]))", "{{packet_type}}")],
        12,
    ),
    (
        "Broker CPU",
        "percentunit",
        [('rate(process_cpu_seconds_total{job=~"$job"}[1m])', "{{instance}}")],
        12,
    ),
    ("Broker RSS", "bytes", [('process_resident_memory_bytes{job=~"$job"}', "{{instance}}")], 12),
    ("Uptime", "s", [("max by (instance) (skipmq_uptime_seconds)", "{{instance}}")], 12),
]


# Hops are whole numbers and the histogram's buckets end on whole hops (le = 1, 2, 3, 4, 6, ...;
# broker/cluster/stats.py HOP_BUCKETS). histogram_quantile interpolates linearly inside the bucket
# the quantile falls in, (k-1, k], so it returns a value in (k-1, k]: 0.5 for traffic that all
# took one hop. ceil() maps that back to k, the bucket's whole-hop bound: exact where buckets are
# one hop wide (1-4 hops), and never below the bucket's lowest hop count above that. The
# recording rules (deploy/prometheus/skipmq-rules.yml) use the same expression per job.
HOPS_QUANTILE = "ceil(histogram_quantile({q}, sum by (le) (rate(skipmq_cluster_delivery_hops_bucket[5m]))))"

CLUSTER_PANELS: list[tuple[str, str, list[tuple[str, str]], int]] = [
    (
        "Connected peer brokers",
        "short",
        [("sum by (instance) (skipmq_cluster_peers_connected)", "{{instance}}")],
        8,
    ),
    (
        "Overlay virtual nodes",
        "short",
        [("sum by (instance) (skipmq_cluster_virtual_nodes)", "{{instance}}")],
        8,
    ),
    (
        "Topic classes",
        "short",
        [
            ("sum by (instance) (skipmq_cluster_subscribed_classes)", "subscribed {{instance}}"),
            ("sum by (instance) (skipmq_cluster_published_classes)", "published {{instance}}"),
        ],
        8,
    ),
    (
        "Forwarded / received messages",
        "ops",
        [
            ("sum by (instance) (rate(skipmq_cluster_forwarded_total[1m]))", "forwarded {{instance}}"),
            ("sum by (instance) (rate(skipmq_cluster_received_total[1m]))", "received {{instance}}"),
            ("sum by (instance) (rate(skipmq_cluster_wasted_total[1m]))", "wasted {{instance}}"),
        ],
        12,
    ),
    (
        "Overlay hops per delivery (p50, p99)",
        "short",
        [(HOPS_QUANTILE.format(q="0.5"), "p50"), (HOPS_QUANTILE.format(q="0.99"), "p99")],
        12,
    ),
    (
        "Forwarded QoS>0 publications completed by the overlay",
        "ops",
        [("sum by (complete) (rate(skipmq_cluster_publish_done_total[5m]))", "complete={{complete}}")],
        12,
    ),
    (
        "Order repair",
        "ops",
        [
            ("sum(rate(skipmq_cluster_reordered_total[5m]))", "held for an earlier message"),
            ("sum(rate(skipmq_cluster_gaps_skipped_total[5m]))", "gaps given up"),
            ("sum(rate(skipmq_cluster_duplicates_dropped_total[5m]))", "duplicates dropped"),
            ("sum(rate(skipmq_cluster_rets_sent_total[5m]))", "RET sent"),
        ],
        12,
    ),
    (
        "Send log: retransmissions",
        "ops",
        [
            ("sum(rate(skipmq_cluster_resent_total[5m]))", "resent to a receiver"),
            ("sum(rate(skipmq_cluster_republished_total[5m]))", "published again"),
            ("sum(rate(skipmq_cluster_receivers_given_up_total[5m]))", "receivers given up"),
        ],
        12,
    ),
    (
        "Send log size",
        "short",
        [
            ("sum by (instance) (skipmq_cluster_send_log_messages)", "messages {{instance}}"),
            ("sum by (instance) (skipmq_cluster_send_log_receivers)", "receivers {{instance}}"),
        ],
        12,
    ),
    (
        "Session moves",
        "ops",
        [
            ("sum(rate(skipmq_cluster_claims_sent_total[5m]))", "claims"),
            ("sum(rate(skipmq_cluster_sessions_handed_over_total[5m]))", "handed over"),
        ],
        12,
    ),
    (
        "Held (reordering) messages",
        "short",
        [("sum by (instance) (skipmq_cluster_held_messages)", "{{instance}}")],
        12,
    ),
]


def _panel(
    panel_id: int, title: str, unit: str, targets: list[tuple[str, str]], width: int, x: int, y: int
) -> dict[str, Any]:
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def broker_dashboard() -> dict[str, Any]:
    return _dashboard("skipmq-broker", "SkipMQ broker", BROKER_PANELS)


def cluster_dashboard() -> dict[str, Any]:
    return _dashboard("skipmq-cluster", "SkipMQ cluster", CLUSTER_PANELS)


def _dashboard(
    uid: str, title: str, specs: list[tuple[str, str, list[tuple[str, str]], int]]
) -> dict[str, Any]:
    panels = []
    x = y = 0
    for panel_id, (title_, unit, targets, width) in enumerate(specs, start=1):
        if x + width > 24:
            x, y = 0, y + 8
        panels.append(_panel(panel_id, title_, unit, targets, width, x, y))
        x += width
    return {
        "uid": uid,
        "title": title,
        "tags": ["skipmq", "mqtt"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"},
                {
                    "name": "job",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(skipmq_uptime_seconds, job)",
                    "includeAll": True,
                    "multi": True,
                    "label": "Job",
                },
            ]
        },
        "panels": panels,
    }


DASHBOARDS = {"skipmq-broker.json": broker_dashboard, "skipmq-cluster.json": cluster_dashboard}


def render(name: str) -> str:
    return json.dumps(DASHBOARDS[name](), indent=2, sort_keys=True) + "\n"


def main() -> int:
    for name in DASHBOARDS:
        (HERE / name).write_text(render(name))
        (CHART_COPY / name).write_text(render(name))
        print(f"wrote dashboards/{name} and helm/skipmq/dashboards/{name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
