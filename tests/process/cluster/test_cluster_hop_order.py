"""Per-publisher order across a forced one-hop <-> multi-hop switch (seed 003 §3.3/§3.5.4 with
FRT, seed 004 ordering; docs/cluster.md).

Five brokers with ``cluster.table_size=2`` (L): while a topic class has few subscriber brokers
its delivery is one hop; as subscribers join on more brokers than L allows, delivery falls back
to Skip Graph multi-hop. One publisher streams numbered QoS 1 messages throughout; every
subscriber must see its numbers strictly increasing and every acknowledged message published
after it was routed, and ``skipmq_cluster_delivery_hops`` must show deliveries over more than
one hop. Then two subscriber brokers unsubscribe (back towards fewer hops) while the stream
goes on, and the order must still hold.
"""

from __future__ import annotations

import itertools

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


@pytest.mark.slow
def test_order_holds_while_the_route_switches_to_multi_hop(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    cluster = cluster_factory(BROKERS, {"cluster.table_size": "2", "cluster.class_levels": "1"})
    topic = f"{unique_id('ord')}/stream"
    publisher = client_factory(cluster, 0)
    streamer = Streamer(publisher, topic, interval_s=0.005)
    # (client, first number it must get, for an unsubscribed one: what was acked before UNSUBSCRIBE)
    subscribers: list[tuple[ClusterClient, int, set[int] | None]] = []
    first = client_factory(cluster, 1)
    first.subscribe(topic, 1)
    probe_route(cluster, 0, first, topic)
    subscribers.append((first, 0, None))
    streamer.start()
    try:
        # more subscriber brokers join one by one while the stream runs: 1 -> 2 -> ... -> 4 (> L)
        for index in range(2, BROKERS):
            streamer.wait_acked(len(streamer.acked_numbers()) + 40)
            sub = client_factory(cluster, index)
            sub.subscribe(topic, 1)
            probe_route(cluster, 0, sub, topic)
            subscribers.append((sub, streamer.sent, None))  # sent after its route was proven
            # a second subscriber on a broker that already has one (aggregated locally)
            if index == 2:
                extra = client_factory(cluster, index, version=4)
                extra.subscribe(topic, 1)
                probe_route(cluster, 0, extra, topic)
                subscribers.append((extra, streamer.sent, None))
        streamer.wait_acked(len(streamer.acked_numbers()) + 100)
        # and back: the subscribers on brokers 3 and 4 unsubscribe (fewer subscriber brokers)
        for position, (sub, start, _) in enumerate(subscribers):
            if sub.port in (cluster.brokers[3].mqtt_port, cluster.brokers[4].mqtt_port):
                stored_for_it = set(streamer.acked_numbers())  # acked, so stored for it: must arrive
                sub.unsubscribe(topic)
                subscribers[position] = (sub, start, stored_for_it)
        streamer.wait_acked(len(streamer.acked_numbers()) + 100)
    finally:
        streamer.stop()
    wait_until(lambda: not publisher.pending, 20, what="the last publishes acknowledged")
    acked = set(streamer.acked_numbers())
    assert len(acked) >= 40 * (BROKERS - 2) + 200
    assert sum(before is not None for _, _, before in subscribers) == 2

    for sub, start, acked_before in subscribers:
        wanted = {n for n in (acked if acked_before is None else acked_before) if n >= start}
        got: list[Received] = []

        def complete(sub: ClusterClient = sub, got: list[Received] = got, wanted: set[int] = wanted) -> bool:
            got.extend(sub.drain(0.05))
            return wanted <= set(numbers([m.payload for m in got], b"n"))

        try:
            wait_until(complete, 30, interval_s=0.1, what=f"{sub.client_id}: all acknowledged messages")
        except TimeoutError:
            have = set(numbers([m.payload for m in got], b"n"))
            raise AssertionError(
                f"{sub.client_id} (port {sub.port}) misses {sorted(wanted - have)[:20]}"
            ) from None
        sequence = numbers([m.payload for m in got], b"n")
        assert is_strictly_increasing(sequence), (
            f"{sub.client_id} (port {sub.port}) saw numbers out of order or twice: "
            f"{[(a, b) for a, b in itertools.pairwise(sequence) if a >= b][:10]}"
        )

    multi_hop = sum(
        histogram_count_above(cluster.metrics_text(index), "skipmq_cluster_delivery_hops", 1.0)
        for index in range(BROKERS)
    )
    assert multi_hop > 0, "with L=2 and 4 subscriber brokers some deliveries must take more than one hop"
