"""Per-publisher order across a forced one-hop <-> multi-hop switch (seed 003 §3.3/§3.5.4 with
FRT, seed 004 ordering; docs/cluster.md "Subscriptions" and "Guarantees in one table").

Five brokers with ``cluster.table_size=2`` (L): while a topic class has few subscriber brokers
its delivery is one hop; as subscribers join on more brokers than L allows, delivery falls back
to Skip Graph multi-hop. One publisher streams numbered QoS 1 messages throughout; every
subscriber must see its numbers strictly increasing and every acknowledged message published
after it was routed, and ``skipmq_cluster_delivery_hops`` must show deliveries over more than
one hop. Then two subscriber brokers unsubscribe (back towards fewer hops) while the stream
goes on, and the order must still hold.

What an unsubscribed subscriber is owed (MQTT 3.1.1 §3.10.4, MQTT 5 §3.10.4; docs/cluster.md):
every acknowledged message up to one it was seen to have received while subscribed (checked,
bounded, before its UNSUBSCRIBE), then in order and without a gap whatever its broker delivered
until the UNSUBSCRIBE, and nothing published after its UNSUBACK. Messages acknowledged just before
the UNSUBSCRIBE but still on their way between brokers (a multi-hop route being repaired, a resend
not yet due) when its broker removes the subscription are not delivered to it: MQTT only requires
the server to finish what it started sending and lets it drop what was buffered.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from tests.support.cluster import (
    ClientFactory,
    ClusterClient,
    ClusterFactory,
    Received,
    Streamer,
    histogram_count_above,
    is_strictly_increasing,
    numbers,
    probe_route,
    unique_id,
    wait_until,
)

BROKERS = 5


@dataclass
class Subscriber:
    client: ClusterClient
    start: int  # the first number it must get: sent after its route was proven
    got: list[Received] = field(default_factory=list)
    # for one that unsubscribed: the numbers published after its UNSUBACK (it must get none)
    unsubacked_at: int | None = None

    def numbers(self) -> list[int]:
        # what has arrived so far, without waiting: drain(settle_s) returns only after a pause of
        # settle_s, which a steady stream (one message every 5 ms) may never leave
        self.got.extend(self.client.drain(0.0))
        return numbers([m.payload for m in self.got], b"n")

    def wait_for(self, wanted: set[int], what: str) -> None:
        """Bounded wait until every number in ``wanted`` was received."""
        try:
            wait_until(lambda: wanted <= set(self.numbers()), 30, interval_s=0.1, what=what)
        except TimeoutError:
            raise AssertionError(
                f"{self.client.client_id} (port {self.client.port}) misses "
                f"{sorted(wanted - set(self.numbers()))[:20]} ({what})"
            ) from None


@pytest.mark.slow
def test_order_holds_while_the_route_switches_to_multi_hop(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    cluster = cluster_factory(BROKERS, {"cluster.table_size": "2", "cluster.class_levels": "1"})
    topic = f"{unique_id('ord')}/stream"
    publisher = client_factory(cluster, 0)
    streamer = Streamer(publisher, topic, interval_s=0.005)
    subscribers: list[Subscriber] = []
    first = client_factory(cluster, 1)
    first.subscribe(topic, 1)
    probe_route(cluster, 0, first, topic)
    subscribers.append(Subscriber(first, 0))
    streamer.start()
    try:
        # more subscriber brokers join one by one while the stream runs: 1 -> 2 -> ... -> 4 (> L)
        for index in range(2, BROKERS):
            streamer.wait_acked(len(streamer.acked_numbers()) + 40)
            sub = client_factory(cluster, index)
            sub.subscribe(topic, 1)
            probe_route(cluster, 0, sub, topic)
            subscribers.append(Subscriber(sub, streamer.sent))  # sent after its route was proven
            # a second subscriber on a broker that already has one (aggregated locally)
            if index == 2:
                extra = client_factory(cluster, index, version=4)
                extra.subscribe(topic, 1)
                probe_route(cluster, 0, extra, topic)
                subscribers.append(Subscriber(extra, streamer.sent))
        streamer.wait_acked(len(streamer.acked_numbers()) + 100)
        # and back: the subscribers on brokers 3 and 4 unsubscribe (fewer subscriber brokers)
        for sub in subscribers:
            if sub.client.port in (cluster.brokers[3].mqtt_port, cluster.brokers[4].mqtt_port):
                # owed while subscribed: everything acknowledged so far (seen arriving, bounded)
                acked = {n for n in streamer.acked_numbers() if n >= sub.start}
                sub.wait_for(acked, "acknowledged while it was subscribed, before its UNSUBSCRIBE")
                sub.client.unsubscribe(topic)
                sub.unsubacked_at = streamer.sent  # these and later were published after the UNSUBACK
        streamer.wait_acked(len(streamer.acked_numbers()) + 100)
    finally:
        streamer.stop()
    wait_until(lambda: not publisher.pending, 20, what="the last publishes acknowledged")
    acked = set(streamer.acked_numbers())
    assert len(acked) >= 40 * (BROKERS - 2) + 200
    assert sum(sub.unsubacked_at is not None for sub in subscribers) == 2

    for sub in subscribers:
        name = f"{sub.client.client_id} (port {sub.client.port})"
        if sub.unsubacked_at is None:
            sub.wait_for({n for n in acked if n >= sub.start}, "all acknowledged messages")
        else:
            sub.got.extend(sub.client.drain(1.0))  # until nothing came for 1 s
            have = sub.numbers()
            last = max(have)
            # no gap up to the last one it got: its broker delivers each stream in order, so a
            # missing number below it would be a lost message, not one still on its way
            gap = {n for n in acked if sub.start <= n <= last} - set(have)
            assert not gap, f"{name} misses {sorted(gap)[:20]}, acknowledged before {last} which it got"
            assert last < sub.unsubacked_at, f"{name} got {last}, published after its UNSUBACK"
        sequence = sub.numbers()
        assert is_strictly_increasing(sequence), (
            f"{name} saw numbers out of order or twice: "
            f"{[(a, b) for a, b in itertools.pairwise(sequence) if a >= b][:10]}"
        )

    multi_hop = sum(
        histogram_count_above(cluster.metrics_text(index), "skipmq_cluster_delivery_hops", 1.0)
        for index in range(BROKERS)
    )
    assert multi_hop > 0, "with L=2 and 4 subscriber brokers some deliveries must take more than one hop"
