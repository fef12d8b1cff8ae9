"""Brokers joining, leaving and crashing while messages flow (seed 003 §3.5.2 join / §3.5.3 leave,
docs/cluster.md: SIGTERM = graceful leave, kill -9 detected within cluster.failure_timeout_ms).

The invariant checked is MQTT's promise to a QoS 1 publisher: every message whose PUBACK the
publisher received reaches every subscriber that was routed before it was published (and is
still connected), in per-publisher order.
"""

from __future__ import annotations

import pytest

from tests.support.cluster import (
    ClientFactory,
    ClusterClient,
    ClusterFactory,
    Received,
    Streamer,
    first_occurrences,
    is_strictly_increasing,
    numbers,
    probe_route,
    publish_until_acks_are_fast,
    unique_id,
    wait_peer_gone,
    wait_until,
)
from tools.launcher import LocalCluster

DELIVERY_S = 30.0


def received_numbers(client: ClusterClient, into: list[Received], prefix: bytes = b"n") -> list[int]:
    into.extend(client.drain(0.05))
    return numbers([m.payload for m in into], prefix)


def wait_received_all(client: ClusterClient, wanted: set[int], into: list[Received]) -> list[int]:
    """Wait (bounded) until client received every number in wanted; returns all numbers received."""

    def done() -> bool:
        return wanted <= set(received_numbers(client, into))

    try:
        wait_until(done, DELIVERY_S, interval_s=0.1, what=f"{client.client_id}: all acknowledged messages")
    except TimeoutError:
        missing = sorted(wanted - set(received_numbers(client, into)))
        raise AssertionError(
            f"{client.client_id} (port {client.port}) misses {len(missing)} acknowledged messages:"
            f" {missing[:20]}"
        ) from None
    return received_numbers(client, into)


@pytest.mark.slow
def test_join_and_graceful_leave_under_traffic(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    """A publisher on broker 0 streams QoS 1 while a 4th broker joins (and gets a subscriber) and
    broker 1 leaves with SIGTERM: the subscribers on the remaining brokers miss nothing that was
    acknowledged, in order, and the others stop linking to the leaver."""
    cluster = cluster_factory(3)
    topic = f"{unique_id('jl')}/stream"
    leaver_sub = client_factory(cluster, 1)  # on the broker that will leave
    steady_sub = client_factory(cluster, 2)
    for sub in (leaver_sub, steady_sub):
        sub.subscribe(topic, 1)
        probe_route(cluster, 0, sub, topic)
    publisher = client_factory(cluster, 0)
    streamer = Streamer(publisher, topic)
    streamer.start()
    try:
        streamer.wait_acked(50)
        joined = cluster.add_broker()
        assert joined.index == 3
        late_sub = client_factory(cluster, 3)
        late_sub.subscribe(topic, 1)
        probe_route(cluster, 0, late_sub, topic)
        late_from = streamer.sent  # handed to paho after its route was proven
        streamer.wait_acked(len(streamer.acked_numbers()) + 50)

        assert cluster.stop_broker(1) == 0, "a leaving broker exits 0 after SIGTERM"
        streamer.wait_acked(len(streamer.acked_numbers()) + 100)
    finally:
        streamer.stop()
    wait_until(lambda: not publisher.pending, 20, what="the last publishes acknowledged")
    acked = set(streamer.acked_numbers())
    assert len(acked) >= 200

    steady_got: list[Received] = []
    steady = wait_received_all(steady_sub, acked, steady_got)
    assert is_strictly_increasing(first_occurrences(steady)), "per-publisher order broken at broker 2"
    late_got: list[Received] = []
    late = wait_received_all(late_sub, {n for n in acked if n >= late_from}, late_got)
    assert is_strictly_increasing(first_occurrences(late)), "per-publisher order broken at the new broker"
    # the leaver is gone from the others' view of the overlay
    leaver_peer = cluster.brokers[1].peer_id
    for index in (0, 2, 3):
        wait_peer_gone(cluster, index, leaver_peer, 10)


@pytest.mark.slow
def test_kill_9_of_the_publishers_broker_loses_nothing_acknowledged(
    cluster3: LocalCluster, client_factory: ClientFactory
) -> None:
    cluster = cluster3  # ends with all three brokers up again (broker 0 restarted)
    topic = f"{unique_id('k9')}/stream"
    subscriber = client_factory(cluster, 2)
    subscriber.subscribe(topic, 1)
    probe_route(cluster, 0, subscriber, topic)
    publisher = client_factory(cluster, 0, client_id=unique_id("k9pub"), clean=False, session_expiry_s=600)
    streamer = Streamer(publisher, topic)
    streamer.start()
    try:
        streamer.wait_acked(60)
        cluster.kill_broker(0)
        publisher.wait_disconnected(10)
        acked_before_kill = set(streamer.acked_numbers())
        publisher.connect(cluster.brokers[1].mqtt_port)  # continue on broker B
        streamer.wait_acked(len(acked_before_kill) + 60)
    finally:
        streamer.stop()
    wait_until(lambda: not publisher.pending, 20, what="retransmitted publishes acknowledged")
    acked = set(streamer.acked_numbers())
    assert acked_before_kill < acked

    # the neighbours notice the crash and the cluster keeps delivering between survivors
    dead_peer = cluster.brokers[0].peer_id
    for index in (1, 2):
        wait_peer_gone(cluster, index, dead_peer, 15)
    topic_after = f"{unique_id('k9after')}/x"
    late = client_factory(cluster, 1)
    late.subscribe(topic_after, 1)
    probe_route(cluster, 2, late, topic_after)
    client_factory(cluster, 2).publish(topic_after, b"still-alive", 1)
    assert late.wait_message().payload == b"still-alive"

    # what the killed broker PUBACKed is in its send log: all of it arrives once it is back
    # (docs/cluster.md, guarantees: "crash of a publisher's broker"). A PUBACK can leave a moment
    # before the forward that carries the same message, so a kill -9 between the two keeps that
    # message on the killed broker's disk until it restarts (a run without the restart lost [61])
    cluster.restart_broker(0)
    got: list[Received] = []
    received = wait_received_all(subscriber, acked, got)
    assert is_strictly_increasing([n for n in first_occurrences(received) if n in acked_before_kill]), (
        "messages accepted by the killed broker arrived out of order"
    )


def test_acks_are_not_delayed_after_a_subscriber_broker_leaves(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    """After a graceful leave the departed broker is no longer a subscriber's broker: once the
    leave settled, a QoS 1 PUBACK must not wait cluster.publish_ack_wait_ms for it."""
    ack_wait_s = 3.0
    cluster = cluster_factory(3, {"cluster.publish_ack_wait_ms": str(int(ack_wait_s * 1000))})
    topic = f"{unique_id('lv')}/acks"
    subs = [client_factory(cluster, 1), client_factory(cluster, 2)]
    for sub in subs:
        sub.subscribe(topic, 1)
        probe_route(cluster, 0, sub, topic)
    publisher = client_factory(cluster, 0)
    publisher.publish(topic, b"before", 1)
    assert cluster.stop_broker(1) == 0
    payloads = publish_until_acks_are_fast(
        publisher, topic, b"after", fast_s=1.0, settle_s=10.0, ack_timeout_s=ack_wait_s + 5
    )
    got = subs[1].wait_messages(1 + len(payloads))
    assert [m.payload for m in got] == [b"before", *payloads]


@pytest.mark.slow
def test_puback_means_stored_at_the_subscribers_broker(
    cluster3: LocalCluster, client_factory: ClientFactory
) -> None:
    """docs/cluster.md: a QoS 1 PUBACK is sent after the message is stored at every subscriber's
    broker. Kill -9 both the publisher's and the subscriber's broker right after the last PUBACK,
    restart the subscriber's broker from its data directory: the offline session has them all.
    On the module's cluster after the kill -9 test (the last to use it: it leaves broker 2 dead)."""
    cluster = cluster3
    topic = f"{unique_id('dur')}/stored"
    client_id = unique_id("offline")
    sub = client_factory(cluster, 1, client_id=client_id, clean=False, session_expiry_s=600)
    sub.subscribe(topic, 1)
    probe_route(cluster, 2, sub, topic)
    sub.disconnect()
    publisher = client_factory(cluster, 2)
    for n in range(30):
        publisher.publish_nowait(topic, f"d{n}".encode(), 1)
    wait_until(lambda: not publisher.pending, 20, what="30 PUBACKs")
    assert len(publisher.acked_payloads) == 30
    cluster.kill_broker(2)
    cluster.kill_broker(1)
    cluster.restart_broker(1)
    sub.connect()
    assert sub.session_present
    got = sub.wait_messages(30, timeout_s=20)
    assert numbers([m.payload for m in got], b"d") == list(range(30))


@pytest.mark.slow
def test_a_silent_broker_is_detected_within_the_failure_timeout(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    """A frozen broker (SIGSTOP: its connections stay open, nothing answers) can only be found
    by the overlay's liveness probes. While it hosts a subscriber, QoS 1 PUBACKs wait for it;
    once its neighbours declared it dead (cluster.failure_timeout_ms) they must not any more:
    PUBACKs are fast again and the live subscriber gets every acknowledged message."""
    failure_timeout_s, ping_interval_s, ack_wait_s = 2.0, 0.5, 4.0
    cluster = cluster_factory(
        3,
        {
            "cluster.failure_timeout_ms": str(int(failure_timeout_s * 1000)),
            "cluster.ping_interval_ms": str(int(ping_interval_s * 1000)),
            "cluster.publish_ack_wait_ms": str(int(ack_wait_s * 1000)),
        },
    )
    topic = f"{unique_id('frz')}/x"
    frozen_sub, live_sub = client_factory(cluster, 1), client_factory(cluster, 2)
    for sub in (frozen_sub, live_sub):
        sub.subscribe(topic, 1)
        probe_route(cluster, 0, sub, topic)
    publisher = client_factory(cluster, 0)
    publisher.publish(topic, b"f-before", 1)
    cluster.freeze_broker(1)
    try:
        # slow PUBACKs are expected until the failure is detected; after that they must be fast
        settle_s = failure_timeout_s + 2 * ping_interval_s + ack_wait_s + 2.0
        payloads = publish_until_acks_are_fast(
            publisher, topic, b"f", fast_s=1.0, settle_s=settle_s, ack_timeout_s=ack_wait_s + 5
        )
        got = live_sub.wait_messages(1 + len(payloads))
        assert [m.payload for m in got] == [b"f-before", *payloads]
    finally:
        cluster.thaw_broker(1)
