"""Generates SkipMQ's Grafana dashboards with grafana-foundation-sdk, one per concern.

    python dashboards/generate.py            # rewrite the JSON files
    python dashboards/generate.py --check    # exit 1 if a committed file differs

Five dashboards (docs/observability.md describes every panel): ``skipmq-broker`` (clients,
traffic, the process), ``skipmq-cluster`` (peer brokers, their suspicion and round trip, the send
log and stream repair), ``skipmq-overlay`` (the SG-TBPS/FRT overlay of seed 003: routing tables,
one-hop vs multi-hop classes, queries by kind, hops), ``skipmq-message-path`` (a message's way
from PUBLISH to delivery: store commit, forwarding, publish-to-delivery latency, queues, drops)
and ``skipmq-spark-pipeline`` (the Spark job of pipeline/, from the driver's own /metrics,
``skipmq-pipeline --metrics-port``: micro-batches, rows written, window lag, queries up).

The JSON is built by Grafana's own typed builders (grafana-foundation-sdk, generated from
Grafana's schemas) instead of hand-written dicts: field names and enum values are Grafana's.
Every panel's every selector carries ``job=~"$job", instance=~"$instance"`` (written ``$SEL``
below), so the two variables filter every panel alike (their values come from
``skipmq_build_info`` on the broker dashboards, ``skipmq_pipeline_info`` on the Spark one);
tests/unit/test_dashboards.py checks it, that the committed files match this generator, and that
every queried metric is exported; the real-Prometheus test
(tests/process/cluster/test_prometheus_real.py) runs every expression.

The same files are written into helm/skipmq/dashboards/ (a chart cannot read files outside its
directory; the chart's ConfigMap globs ``dashboards/*.json`` for Grafana's dashboard sidecar).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard as DashboardBuilder
from grafana_foundation_sdk.builders.dashboard import DatasourceVariable, QueryVariable
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

HERE = Path(__file__).resolve().parent
CHART_COPY = HERE.parent / "helm" / "skipmq" / "dashboards"

SEL = 'job=~"$job", instance=~"$instance"'
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


class Target(NamedTuple):
    expr: str  # with $SEL where the job/instance matchers go
    legend: str
    # the real-Prometheus test expects at least one sample that is a number (not NaN) for this
    # target on a 3-broker cluster under traffic; False where none is right (e.g. no broker
    # suspected: no series)
    data: bool = True


class PanelSpec(NamedTuple):
    title: str
    unit: str
    targets: tuple[Target, ...]
    width: int = 12
    description: str = ""  # what it shows and what to look for (also in docs/observability.md)
    kind: str = "timeseries"  # or "stat"


QUERY_KINDS = '"REXP|EEXP|PUB|UNSUB|NEW"'  # seed 003's queries
MAINTENANCE_KINDS = '"SEARCH|LINK|LEAVE|PING|ACK|DONE|GONE|PRESENCE"'  # SkipMQ's own (docs/overlay.md)


def t(expr: str, legend: str, data: bool = True) -> Target:
    expr = expr.replace("QUERY_KINDS", QUERY_KINDS).replace("MAINTENANCE_KINDS", MAINTENANCE_KINDS)
    return Target(expr.replace("$SEL", SEL), legend, data)


# Hops are whole numbers and skipmq_cluster_delivery_hops has one bucket per hop count (le = 1,
# 2, ..., 16). histogram_quantile interpolates linearly inside the bucket the quantile falls in,
# (k-1, k], so it returns a value in (k-1, k]: 0.5 for traffic that all took one hop. ceil() maps
# that back to k, exactly. The recording rules (deploy/prometheus/skipmq.rules.yml) do the same.
def hops_quantile(q: str) -> str:
    return (
        f"ceil(histogram_quantile({q}, sum by (le) (rate(skipmq_cluster_delivery_hops_bucket{{$SEL}}[5m]))))"
    )


def latency_quantile(metric: str, q: str, by: str = "") -> str:
    group = f"sum by (le{', ' + by if by else ''})"
    return f"histogram_quantile({q}, {group} (rate({metric}_bucket{{$SEL}}[5m])))"


BROKER_PANELS = (
    PanelSpec(
        "Brokers up",
        "short",
        (t("sum(up{$SEL}) or vector(0)", "up"),),
        6,
        "Brokers of the selected job that Prometheus scrapes successfully.",
        "stat",
    ),
    PanelSpec(
        "Versions running",
        "short",
        (t("count by (version) (skipmq_build_info{$SEL})", "{{version}}"),),
        6,
        "Brokers per SkipMQ version (skipmq_build_info): more than one during a rolling upgrade.",
        "stat",
    ),
    PanelSpec(
        "Connected clients",
        "short",
        (t("sum(skipmq_connections{$SEL})", "clients"),),
        6,
        "Client connections open on the selected brokers.",
        "stat",
    ),
    PanelSpec(
        "Uptime (shortest)",
        "s",
        (t("min(skipmq_uptime_seconds{$SEL})", "uptime"),),
        6,
        "The most recently (re)started broker's uptime: a small value means a restart.",
        "stat",
    ),
    PanelSpec(
        "Connections per broker",
        "short",
        (t("sum by (instance) (skipmq_connections{$SEL})", "{{instance}}"),),
        8,
        "Open client connections per broker: a load balancer spreads them evenly.",
    ),
    PanelSpec(
        "Connection rate",
        "ops",
        (t("sum by (instance) (rate(skipmq_connections_total{$SEL}[1m]))", "{{instance}}"),),
        8,
        "New client connections per second: a reconnect storm shows as a spike.",
    ),
    PanelSpec(
        "Sessions",
        "short",
        (t("sum by (instance) (skipmq_sessions{$SEL})", "{{instance}}"),),
        8,
        "Sessions per broker, connected and persistent disconnected ones.",
    ),
    PanelSpec(
        "Messages in by QoS",
        "ops",
        (t("sum by (qos) (rate(skipmq_messages_received_total{$SEL}[1m]))", "QoS {{qos}}"),),
        12,
        "PUBLISH messages received from clients per second.",
    ),
    PanelSpec(
        "Messages out by QoS",
        "ops",
        (t("sum by (qos) (rate(skipmq_messages_sent_total{$SEL}[1m]))", "QoS {{qos}}"),),
        12,
        "PUBLISH messages sent to clients per second (one per matching subscription).",
    ),
    PanelSpec(
        "Bytes in / out",
        "Bps",
        (
            t("sum(rate(skipmq_bytes_received_total{$SEL}[1m]))", "in"),
            t("sum(rate(skipmq_bytes_sent_total{$SEL}[1m]))", "out"),
        ),
        12,
        "Client traffic in bytes per second.",
    ),
    PanelSpec(
        "Packets in by type",
        "ops",
        (t("sum by (packet_type) (rate(skipmq_packets_received_total{$SEL}[1m]))", "{{packet_type}}"),),
        12,
        "MQTT packets received per second by type (PINGREQ from idle clients, PUBACK, ...).",
    ),
    PanelSpec(
        "Protocol errors by packet type",
        "ops",
        (t("sum by (packet_type) (rate(skipmq_packet_errors_total{$SEL}[5m]))", "{{packet_type}}"),),
        12,
        "Malformed packets and protocol errors per second: a misbehaving client or an attack.",
    ),
    PanelSpec(
        "Subscriptions and retained messages",
        "short",
        (
            t("sum by (instance) (skipmq_subscriptions{$SEL})", "subscriptions {{instance}}"),
            t("sum by (instance) (skipmq_retained_messages{$SEL})", "retained {{instance}}"),
        ),
        12,
        "Subscriptions of all sessions and retained messages stored, per broker.",
    ),
    PanelSpec(
        "Store errors",
        "short",
        (
            t(
                "sum by (instance, kind) (increase(skipmq_store_errors_total{$SEL}[10m]))",
                "{{kind}} {{instance}}",
            ),
        ),
        12,
        "SQLite store failures in the last 10 minutes by kind (alert SkipMQStoreErrors): should be 0.",
    ),
    PanelSpec(
        "Broker CPU",
        "percentunit",
        (t("sum by (instance) (rate(process_cpu_seconds_total{$SEL}[1m]))", "{{instance}}"),),
        12,
        "CPU time per second of each broker process (1 = one core busy: the event loop's limit).",
    ),
    PanelSpec(
        "Broker RSS",
        "bytes",
        (t("sum by (instance) (process_resident_memory_bytes{$SEL})", "{{instance}}"),),
        12,
        "Resident memory of each broker process: grows with sessions, queues and the send log.",
    ),
)

CLUSTER_PANELS = (
    PanelSpec(
        "Connected peer brokers",
        "short",
        (t("sum by (instance) (skipmq_cluster_peers_connected{$SEL})", "{{instance}}"),),
        8,
        "Peer brokers each broker has a live link to (alert SkipMQBrokerIsolated at 0).",
    ),
    PanelSpec(
        "Peers suspected down",
        "short",
        (
            t(
                "sum by (instance, peer) (skipmq_cluster_peer_suspected{$SEL}) > 0",
                "{{instance}} suspects {{peer}}",
                False,
            ),
        ),
        8,
        "Each (broker, peer) where the failure detector or the transport holds the peer down"
        " (alert SkipMQPeerSuspected). Empty when every peer is healthy.",
    ),
    PanelSpec(
        "Peer silence",
        "s",
        (
            t(
                "max by (instance, peer) (skipmq_cluster_peer_silence_seconds{$SEL})",
                "{{instance}} → {{peer}}",
            ),
        ),
        8,
        "Seconds since each watched peer was last heard; it is declared dead past"
        " cluster.failure_timeout_ms.",
    ),
    PanelSpec(
        "Peer round trip (p50, p99)",
        "s",
        (
            t(latency_quantile("skipmq_cluster_peer_rtt_seconds", "0.5"), "p50"),
            t(latency_quantile("skipmq_cluster_peer_rtt_seconds", "0.99"), "p99"),
        ),
        12,
        "PING to PONG and PUB to its per-hop ACK (1 in 8) between brokers: the network plus both"
        " event loops. Rising with CPU means"
        " busy brokers; rising alone means the network.",
    ),
    PanelSpec(
        "Send log size",
        "short",
        (
            t("sum by (instance) (skipmq_cluster_send_log_messages{$SEL})", "messages {{instance}}"),
            t("sum by (instance) (skipmq_cluster_send_log_receivers{$SEL})", "receivers {{instance}}"),
        ),
        12,
        "The CO send log (seed 004): forwarded QoS>0 messages kept until every receiver broker"
        " acknowledged them (alert SkipMQSendLogGrowing).",
    ),
    PanelSpec(
        "Send log: retransmissions",
        "ops",
        (
            t("sum(rate(skipmq_cluster_resent_total{$SEL}[5m]))", "resent to a receiver"),
            t("sum(rate(skipmq_cluster_republished_total{$SEL}[5m]))", "published again"),
            t("sum(rate(skipmq_cluster_receivers_given_up_total{$SEL}[5m]))", "receivers given up"),
        ),
        12,
        "Send-log messages sent again: directly to a receiver (RET or no ACK) or through the overlay.",
    ),
    PanelSpec(
        "RET requests",
        "ops",
        (
            t("sum(rate(skipmq_cluster_rets_sent_total{$SEL}[5m]))", "RET sent (gaps seen)"),
            t("sum(rate(skipmq_cluster_rets_received_total{$SEL}[5m]))", "RET answered"),
        ),
        12,
        "Retransmission requests (seed 004 §3.3): receivers that saw a gap, senders that answered.",
    ),
    PanelSpec(
        "Order repair",
        "ops",
        (
            t("sum(rate(skipmq_cluster_reordered_total{$SEL}[5m]))", "held for an earlier message"),
            t("sum(rate(skipmq_cluster_gaps_skipped_total{$SEL}[5m]))", "gaps given up"),
            t("sum(rate(skipmq_cluster_duplicates_dropped_total{$SEL}[5m]))", "duplicates dropped"),
        ),
        12,
        "Stream repair at receivers: reordering, duplicates, gaps given up (messages lost).",
    ),
    PanelSpec(
        "Held and causal hold-back",
        "short",
        (
            t("sum by (instance) (skipmq_cluster_held_messages{$SEL})", "held behind a gap {{instance}}"),
            t(
                "sum by (instance) (skipmq_cluster_causal_held_messages{$SEL})",
                "causal hold-back {{instance}}",
            ),
            t(
                "sum by (instance) (skipmq_cluster_causal_blocked_streams{$SEL})",
                "blocked streams {{instance}}",
            ),
        ),
        12,
        "Forwarded messages waiting at a receiver: for an earlier one of their stream, or for a"
        " causal dependency (cluster.causal_groups).",
    ),
    PanelSpec(
        "Session moves and claims",
        "ops",
        (
            t("sum(rate(skipmq_cluster_claims_sent_total{$SEL}[5m]))", "claims sent"),
            t("sum(rate(skipmq_cluster_sessions_handed_over_total{$SEL}[5m]))", "handed over"),
            t("sum(rate(skipmq_cluster_sessions_received_total{$SEL}[5m]))", "received"),
            t("sum(rate(skipmq_cluster_claims_refused_total{$SEL}[5m]))", "claims refused"),
        ),
        12,
        "Clients reconnecting to another broker move their session there.",
    ),
    PanelSpec(
        "Rejected and timed-out",
        "ops",
        (
            t("sum(rate(skipmq_cluster_inbound_rejected_total{$SEL}[5m]))", "inbound rejected"),
            t(
                "sum by (kind) (rate(skipmq_cluster_origin_proofs_rejected_total{$SEL}[5m]))",
                "origin proof refused: {{kind}}",
            ),
            t(
                "sum by (reason) (rate(skipmq_cluster_link_dial_refused_total{$SEL}[5m]))",
                "dial refused: {{reason}}",
            ),
            t(
                "sum(rate(skipmq_cluster_subscribe_waits_timed_out_total{$SEL}[5m]))",
                "subscribe waits timed out",
            ),
        ),
        12,
        "Cluster messages dropped as invalid from their sender, items whose origin proof failed (a"
        " member forging another broker's traffic, docs/security.md), dials refused because the"
        " answering broker did not prove the dialed peer id (an impostor on a broker's address), and"
        " SUBACKs that waited"
        " cluster.subscribe_wait_ms for the overlay: all should stay at 0.",
    ),
    PanelSpec(
        "Under-replicated (cluster.replicas > 1)",
        "short",
        (
            t(
                "sum by (instance) (skipmq_cluster_replication_under_replicated{$SEL})",
                "{{instance}} log entries",
                False,
            ),
            t(
                "sum by (instance) (skipmq_cluster_replication_under_replicated_sessions{$SEL})",
                "{{instance}} sessions",
                False,
            ),
        ),
        12,
        "Send-log entries (their PUBACKs wait) and persistent sessions (lost with the broker's disk now)"
        " not yet on cluster.replicas brokers; 0 in a healthy cluster (alerts"
        " SkipMQUnderReplicatedEntries / SkipMQUnderReplicatedSessions). Empty with one copy.",
    ),
    PanelSpec(
        "SUBACK/UNSUBACK copy waits (cluster.replicas > 1)",
        "ops",
        (
            t(
                "sum(rate(skipmq_cluster_replication_session_copy_waits_total{$SEL}[5m]))",
                "waited for the copy",
                False,
            ),
            t(
                "sum by (reason) (rate(skipmq_cluster_replication_session_acks_uncopied_total{$SEL}[5m]))",
                "sent without the copy: {{reason}}",
                False,
            ),
        ),
        12,
        "SUBACKs and UNSUBACKs of persistent sessions held until the session's state was on N"
        " brokers, and those sent without it (timed_out, fewer_than_n_live, stopping): the latter"
        " should stay at 0 (docs/observability.md).",
    ),
)

OVERLAY_PANELS = (
    PanelSpec(
        "Overlay hops per delivery (p50, p99)",
        "short",
        (t(hops_quantile("0.5"), "p50"), t(hops_quantile("0.99"), "p99")),
        12,
        "Overlay hops of forwarded messages delivered (1 = straight from the publisher's broker),"
        " whole hops (ceil of histogram_quantile over one bucket per hop count).",
    ),
    PanelSpec(
        "Deliveries by hop count",
        "ops",
        (
            t(
                'sum by (le) (rate(skipmq_cluster_delivery_hops_bucket{$SEL, le=~"1|2|3|4|8|16|.Inf"}[5m]))',
                "≤ {{le}} hops",
            ),
        ),
        12,
        "Forwarded deliveries per second that took at most 1, 2, 3, 4, 8, 16 hops (cumulative).",
    ),
    PanelSpec(
        "Published classes: one hop vs multi-hop",
        "short",
        (t("sum by (delivery) (skipmq_overlay_published_classes{$SEL})", "{{delivery}}"),),
        12,
        "Classes published here whose publisher table holds every subscriber broker (one_hop),"
        " misses some (multi_hop: more subscribers than L), or has none (no_subscribers).",
    ),
    PanelSpec(
        "Routing-table entries by kind",
        "short",
        (
            t("sum by (kind) (skipmq_overlay_routing_entries{$SEL})", "{{kind}}"),
            t(
                "sum(skipmq_cluster_virtual_nodes{$SEL}) * max(skipmq_cluster_routing_table_capacity{$SEL})",
                "capacity (L x virtual nodes)",
            ),
        ),
        12,
        "FRT entries (seed 003 §3.4): sticky level-0 neighbours, same-class subscribers (kept for"
        " one-hop delivery) and others, against the capacity L per virtual node.",
    ),
    PanelSpec(
        "Queries sent by kind",
        "ops",
        (
            t(
                "sum by (kind) (rate(skipmq_overlay_messages_sent_total{$SEL, kind=~QUERY_KINDS}[5m]))",
                "{{kind}}",
            ),
        ),
        12,
        "Seed 003's queries sent per second: PUB carries publications; REXP/EEXP/NEW maintain and"
        " grow the tables; UNSUB follows unsubscriptions.",
    ),
    PanelSpec(
        "Queries received by kind",
        "ops",
        (
            t(
                "sum by (kind) (rate(skipmq_overlay_messages_received_total{$SEL, kind=~QUERY_KINDS}[5m]))",
                "{{kind}}",
            ),
        ),
        12,
        "The same queries received per second.",
    ),
    PanelSpec(
        "Forwarded / received / wasted",
        "ops",
        (
            t("sum by (instance) (rate(skipmq_cluster_forwarded_total{$SEL}[1m]))", "forwarded {{instance}}"),
            t("sum by (instance) (rate(skipmq_cluster_received_total{$SEL}[1m]))", "received {{instance}}"),
            t("sum by (instance) (rate(skipmq_cluster_wasted_total{$SEL}[1m]))", "wasted {{instance}}"),
        ),
        12,
        "Messages published into the overlay, received from it, and received without a matching"
        " local filter (the cost of routing on topic classes).",
    ),
    PanelSpec(
        "Suppressed publishes",
        "ops",
        (t("sum by (instance) (rate(skipmq_cluster_publishes_suppressed_total{$SEL}[5m]))", "{{instance}}"),),
        12,
        "Messages not sent into the overlay: no other broker subscribes their class (seed 003 §3.2).",
    ),
    PanelSpec(
        "Virtual nodes and classes",
        "short",
        (
            t("sum by (instance) (skipmq_cluster_virtual_nodes{$SEL})", "virtual nodes {{instance}}"),
            t("sum by (instance) (skipmq_cluster_subscribed_classes{$SEL})", "subscribed {{instance}}"),
            t("sum by (instance) (skipmq_cluster_published_classes{$SEL})", "published {{instance}}"),
        ),
        12,
        "Each broker's virtual nodes (one per class and role, plus the anchor) and its classes.",
    ),
    PanelSpec(
        "Overlay maintenance messages",
        "ops",
        (
            t(
                "sum by (kind) (rate(skipmq_overlay_messages_sent_total{$SEL, kind=~MAINTENANCE_KINDS}[5m]))",
                "{{kind}}",
            ),
        ),
        12,
        "SkipMQ's own overlay messages: joins (SEARCH, LINK), leaves, failure detection (PING),"
        " per-hop ACK and end-to-end DONE of publications.",
    ),
)

MESSAGE_PATH_PANELS = (
    PanelSpec(
        "Messages through the broker",
        "ops",
        (
            t("sum(rate(skipmq_messages_received_total{$SEL}[1m]))", "in from clients"),
            t("sum(rate(skipmq_cluster_forwarded_total{$SEL}[1m]))", "forwarded to the overlay"),
            t("sum(rate(skipmq_cluster_received_total{$SEL}[1m]))", "received from the overlay"),
            t("sum(rate(skipmq_messages_sent_total{$SEL}[1m]))", "out to clients"),
        ),
        24,
        "A message's way: PUBLISH in, forwarded per topic class, received at subscriber brokers,"
        " delivered to each matching subscription.",
    ),
    PanelSpec(
        "Publish to delivery at every subscriber broker (p50, p99)",
        "s",
        (
            t(latency_quantile("skipmq_cluster_publish_confirm_seconds", "0.5"), "p50"),
            t(latency_quantile("skipmq_cluster_publish_confirm_seconds", "0.99"), "p99"),
        ),
        12,
        "QoS>0 messages forwarded into the overlay until every subscriber broker delivered and"
        " stored them (the overlay's DONE). Sampled: 1 publication in 8.",
    ),
    PanelSpec(
        "Store commit (p50, p99)",
        "s",
        (
            t(latency_quantile("skipmq_store_commit_seconds", "0.5"), "p50"),
            t(latency_quantile("skipmq_store_commit_seconds", "0.99"), "p99"),
        ),
        12,
        "SQLite group commits (COMMIT and fsync): QoS>0 acknowledgements wait for them.",
    ),
    PanelSpec(
        "Publications confirmed in time",
        "percentunit",
        (
            t(
                'sum(rate(skipmq_cluster_publish_done_total{$SEL, complete="true"}[5m]))'
                " / sum(rate(skipmq_cluster_publish_done_total{$SEL}[5m]))",
                "confirmed",
            ),
        ),
        12,
        "Share of QoS>0 forwarded publications every subscriber broker confirmed within"
        " cluster.publish_ack_wait_ms (alert SkipMQPublishConfirmationsTimingOut below 95 %).",
    ),
    PanelSpec(
        "Fullest session queue",
        "percentunit",
        (
            t(
                "max by (instance) (skipmq_session_queue_depth_max{$SEL})"
                " / max by (instance) (skipmq_session_queue_limit{$SEL})",
                "{{instance}}",
            ),
        ),
        12,
        "The longest session queue as a share of limits.max_queued_messages (alert"
        " SkipMQQueueNearLimit at 80 %); at 100 % messages are dropped.",
    ),
    PanelSpec(
        "Queued and in-flight messages",
        "short",
        (
            t("sum by (instance) (skipmq_queued_messages{$SEL})", "queued {{instance}}"),
            t("sum by (instance) (skipmq_inflight_messages{$SEL})", "in flight {{instance}}"),
            t(
                "sum by (instance) (skipmq_sessions_queue_near_limit{$SEL})",
                "sessions near limit {{instance}}",
            ),
        ),
        12,
        "Messages waiting for offline or slow subscribers, and QoS>0 messages awaiting their ack.",
    ),
    PanelSpec(
        "Dropped messages by reason",
        "ops",
        (t("sum by (reason) (rate(skipmq_messages_dropped_total{$SEL}[5m]))", "{{reason}}"),),
        12,
        "Messages not delivered to a subscription, by reason (docs/configuration.md § Metrics).",
    ),
)


# The Spark job's driver (pipeline/metrics.py). No job runs in the real-Prometheus test, so no
# target there expects data (data=False): the test still runs every expression.
WINDOW_LAG = "skipmq_pipeline_window_lag_seconds"
SPARK_PIPELINE_PANELS = (
    PanelSpec(
        "Streaming queries up",
        "short",
        (t("sum by (query) (skipmq_pipeline_query_up{$SEL})", "{{query}}", False),),
        8,
        "1 per streaming query (snapshots from MQTT, metrics from HTTP) that runs; 0 once it failed"
        " or stopped (the driver logs pipeline_failed and exits 1).",
        "stat",
    ),
    PanelSpec(
        "Pipeline versions running",
        "short",
        (t("count by (version) (skipmq_pipeline_info{$SEL})", "{{version}}", False),),
        8,
        "Pipeline drivers serving /metrics per SkipMQ version (skipmq_pipeline_info).",
        "stat",
    ),
    PanelSpec(
        "Stalest table",
        "s",
        (
            t(
                "max(time() - skipmq_pipeline_last_window_end_timestamp_seconds{$SEL})",
                "seconds behind",
                False,
            ),
        ),
        8,
        "Seconds since the end of the newest window written, for the table furthest behind: the"
        " window length plus the watermark plus a trigger when healthy; growing means the job stalls.",
        "stat",
    ),
    PanelSpec(
        "Micro-batches per query",
        "ops",
        (t("sum by (query) (rate(skipmq_pipeline_batches_total{$SEL}[5m]))", "{{query}}", False),),
        12,
        "Micro-batches with rows per second, per streaming query: about one per --trigger while"
        " windows close.",
    ),
    PanelSpec(
        "Rows written per table",
        "ops",
        (t("sum by (table) (rate(skipmq_pipeline_rows_written_total{$SEL}[5m]))", "{{table}}", False),),
        12,
        "Rows written to each Parquet table per second (docs/pipeline.md has the tables).",
    ),
    PanelSpec(
        "Window lag (p50, p99)",
        "s",
        (
            t(latency_quantile(WINDOW_LAG, "0.5", "query"), "p50 {{query}}", False),
            t(latency_quantile(WINDOW_LAG, "0.99", "query"), "p99 {{query}}", False),
        ),
        12,
        "Seconds from a window's end to its rows written: the watermark, the trigger and the batch's"
        " own time. Growing batch after batch means Spark cannot keep up.",
    ),
    PanelSpec(
        "Newest window per table (age)",
        "s",
        (
            t(
                "time() - max by (table) (skipmq_pipeline_last_window_end_timestamp_seconds{$SEL})",
                "{{table}}",
                False,
            ),
        ),
        12,
        "Seconds since the end of the newest window written to each table. Tables written only"
        " on findings (hot_classes, l_crossings, outliers, latency_outliers) may lag without harm.",
    ),
)


def _panel(panel_id: int, spec: PanelSpec) -> Any:
    builder: Any = stat.Panel() if spec.kind == "stat" else timeseries.Panel()
    builder = (
        builder.id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .unit(spec.unit)
        .datasource(DATASOURCE)
        .span(spec.width)
        .height(4 if spec.kind == "stat" else 8)
    )
    for index, target in enumerate(spec.targets):
        builder = builder.with_target(
            prometheus.Dataquery()
            .ref_id(chr(ord("A") + index))
            .expr(target.expr)
            .legend_format(target.legend)
        )
    return builder


def _variables(info_metric: str) -> list[Any]:
    return [
        DatasourceVariable("datasource").label("Data source").type("prometheus"),
        QueryVariable("job")
        .label("Job")
        .datasource(DATASOURCE)
        .query(f"label_values({info_metric}, job)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .include_all(True)
        .all_value(".*")
        .multi(True),
        QueryVariable("instance")
        .label("Instance")
        .datasource(DATASOURCE)
        .query(f'label_values({info_metric}{{job=~"$job"}}, instance)')
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .include_all(True)
        .all_value(".*")
        .multi(True),
    ]


def build(
    uid: str,
    title: str,
    description: str,
    specs: tuple[PanelSpec, ...],
    info_metric: str = "skipmq_build_info",
) -> dict[str, Any]:
    builder = (
        DashboardBuilder(title)
        .uid(uid)
        .description(description)
        .tags(["skipmq", "mqtt"])
        .editable()
        .time("now-1h", "now")
        .refresh("30s")
        .variables(_variables(info_metric))
    )
    for panel_id, spec in enumerate(specs, start=1):
        builder = builder.with_panel(_panel(panel_id, spec))
    encoded: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return encoded


# file -> (uid, title, description, panels, the metric the $job/$instance variables list)
DASHBOARDS: dict[str, tuple[str, str, str, tuple[PanelSpec, ...], str]] = {
    "skipmq-broker.json": (
        "skipmq-broker",
        "SkipMQ broker",
        "Clients, traffic and the broker process (docs/observability.md).",
        BROKER_PANELS,
        "skipmq_build_info",
    ),
    "skipmq-cluster.json": (
        "skipmq-cluster",
        "SkipMQ cluster",
        "Peer brokers, their suspicion and round trip, the send log and stream repair"
        " (docs/observability.md).",
        CLUSTER_PANELS,
        "skipmq_build_info",
    ),
    "skipmq-overlay.json": (
        "skipmq-overlay",
        "SkipMQ overlay",
        "The SG-TBPS/FRT overlay: routing tables, one-hop vs multi-hop classes, queries, hops"
        " (docs/observability.md).",
        OVERLAY_PANELS,
        "skipmq_build_info",
    ),
    "skipmq-message-path.json": (
        "skipmq-message-path",
        "SkipMQ message path",
        "A message from PUBLISH to delivery: store commit, forwarding, publish-to-delivery latency,"
        " queues, drops (docs/observability.md).",
        MESSAGE_PATH_PANELS,
        "skipmq_build_info",
    ),
    "skipmq-spark-pipeline.json": (
        "skipmq-spark-pipeline",
        "SkipMQ Spark pipeline",
        "The Spark job over the cluster (skipmq-pipeline --metrics-port): micro-batches, rows"
        " written, window lag, queries up (docs/observability.md).",
        SPARK_PIPELINE_PANELS,
        "skipmq_pipeline_info",
    ),
}

BUILDERS: dict[str, Callable[[], dict[str, Any]]] = {
    name: (lambda spec=spec: build(*spec)) for name, spec in DASHBOARDS.items()
}


def render(name: str) -> str:
    return json.dumps(BUILDERS[name](), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a committed file is not what this generates"
    )
    args = parser.parse_args(argv)
    stale = []
    for name in DASHBOARDS:
        text = render(name)
        for path in (HERE / name, CHART_COPY / name):
            if args.check:
                if not path.is_file() or path.read_text() != text:
                    stale.append(str(path))
            else:
                path.write_text(text)
                print(f"wrote {path.relative_to(HERE.parent)}", file=sys.stderr)
    if stale:
        print("stale (run python dashboards/generate.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
