"""Cluster metrics: plain-int counters kept by the cluster engine, exported at scrape time
(``broker.metrics.ClusterCollector``).

Names (docs/operations.md, dashboards/): ``skipmq_cluster_forwarded_total`` (messages this broker
published into the overlay, per topic-class publication), ``skipmq_cluster_received_total``
(forwarded messages delivered here), ``skipmq_cluster_wasted_total`` (of those, the ones no local
filter matched: the cost of routing on topic classes), ``skipmq_cluster_delivery_hops``
(histogram of overlay hops of those, 1 = direct from the publisher's broker; seed 003 path length),
``skipmq_cluster_publish_done_total{complete}`` (QoS>0 forwarded publications the overlay
completed, or not within ``cluster.publish_ack_wait_ms``: the send log publishes those again),
the reliable streams' counters (seed 004: republished, resent, RET sent, gaps given up, receivers
given up), causal groups' waits, reorder and claim counters, and gauges for peers, virtual nodes
and the send log.
"""

from __future__ import annotations

from collections import Counter

from broker.core.stats import Histogram

# The per-class snapshots' hop buckets (``broker.cluster.class_stats``; the pipeline reads them).
HOP_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)
# ``skipmq_cluster_delivery_hops`` counts every whole hop count apart up to this (le = 1, 2, ...,
# 16, +Inf), so ``ceil(histogram_quantile(...))`` is exact: one bucket per hop count.
METRIC_HOP_MAX = 16
# Sampling of the latency histograms observed per forwarded message: one publication in
# LATENCY_SAMPLE_EVERY (a power of two; the publication id's low bits pick it).
LATENCY_SAMPLE_EVERY = 8
# One PUB delegation in RTT_SAMPLE_EVERY (by ack id's low bits) has its per-hop ACK sent at once
# and timed (``skipmq_cluster_peer_rtt_seconds``); the others are held and coalesced
# (``broker.cluster.replies``), so a rarer sample costs fewer frames of their own.
RTT_SAMPLE_EVERY = 64
# From a QoS>0 message's publication into the overlay to the overlay's end-to-end DONE (every
# subscriber broker delivered and stored it): loopback and one data centre take milliseconds, a
# slow subscriber broker or a retransmission seconds.
PUBLISH_CONFIRM_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# PING to PONG (the failure detector) and PUB to its per-hop ACK (sampled) between two brokers:
# the network round trip plus both event loops' delay.
PEER_RTT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ClusterStats:
    """Counters updated on the event-loop thread; read by the collector."""

    def __init__(self) -> None:
        self.forwarded = 0
        self.received = 0
        self.wasted = 0  # received on a subscribed class but matching no local filter
        self.duplicates_dropped = 0
        self.reordered = 0  # messages that waited for an earlier one of their stream
        self.gaps_skipped = 0  # missing sequence numbers the sender no longer had (given up)
        self.republished = 0  # send-log entries published through the overlay again
        self.resent = 0  # send-log entries sent again directly to a receiver broker
        self.rets_sent = 0  # RET requests this broker sent for gaps
        # flow control of catch-up (stream_receiver): messages not kept because they were more
        # than HOLD_WINDOW ahead of REQ (asked for again), and catch-ups that waited for room
        self.beyond_window = 0
        self.paced_waits = 0
        # sessions that stopped pacing a catch-up: slower than the live stream (no head-of-line
        # blocking; engine_receiving._catch_up_window_closed)
        self.catch_up_sessions_set_aside = 0
        self.receivers_given_up = 0  # receiver brokers silent for cluster.send_log_retention_s
        self.causal_held = 0  # causal-group messages that waited for a message they depend on
        self.causal_given_up = 0  # ... and were delivered after cluster.causal_wait_ms without it
        self.subscribe_waits_timed_out = 0  # SUBACK/CONNACK waits that hit cluster.subscribe_wait_ms
        self.publish_done = {"true": 0, "false": 0}
        self.claims_sent = 0
        self.claims_refused = 0  # claims of another user for a client id whose session is here
        self.inbound_rejected = 0  # cluster messages dropped as not valid from their sender
        # origin proofs (broker.cluster.origin_checks): made, checked, and items refused by kind
        self.origin_proofs_signed = 0
        self.origin_proofs_verified = 0
        self.origin_proofs_link_bound = 0  # checked but for the signature: straight from a proven link
        self.origin_proofs_rejected: Counter[str] = Counter()
        self.sessions_handed_over = 0
        self.sessions_received = 0
        self.retained_updates_applied = 0
        self.hop_counts = [0] * (METRIC_HOP_MAX + 1)  # index k-1: k hops; last: > METRIC_HOP_MAX
        self.hop_sum = 0
        self.publish_confirm_seconds = Histogram(PUBLISH_CONFIRM_BUCKETS_S)  # sampled, see above
        self.peer_rtt_seconds = Histogram(PEER_RTT_BUCKETS_S)  # every PING answered
        # overlay messages by kind (REXP, EEXP, PUB, ...; the engine counts them as it sends and
        # receives them: one dict update per overlay message)
        self.overlay_sent: Counter[type] = Counter()
        self.overlay_received: Counter[type] = Counter()

    def observe_hops(self, hops: int) -> None:
        self.hop_sum += hops
        if 0 < hops <= METRIC_HOP_MAX:
            self.hop_counts[hops - 1] += 1
        else:  # 0 cannot happen (a forwarded delivery took at least one hop): counted as 1
            self.hop_counts[0 if hops <= 0 else METRIC_HOP_MAX] += 1
