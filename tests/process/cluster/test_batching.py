"""Cross-broker batching (issue #11; broker/cluster/streams.py ``_publish_forwarded`` /
``_flush_outbox``, docs/cluster.md "Reliable streams", Batching): the messages a broker accepts on one
topic class within one event-loop iteration go to the other brokers as ONE overlay publication (a
``ForwardedBatch``: one PUB, ACK and DONE per hop), and each subscriber elsewhere still gets every
one of them, once, in the publisher's order.

Real brokers (3-broker cluster over gRPC); the publisher is a raw socket client that writes a burst
of QoS 1 PUBLISH packets in one ``sendall`` (so the broker reads them together), the subscribers
are paho clients on the two other brokers.
"""

from __future__ import annotations

import time

from broker.mqtt.packets import Puback
from tests.support.cluster import ClientFactory, ClusterFactory, metric_total, numbers, probe_route, unique_id
from tests.support.core import RawClient
from tools import mqtt_raw
from tools.launcher import LocalCluster

BURST = 200


def _burst(broker_port: int, host: str, topic: str, count: int, payload_bytes: int = 0) -> None:
    """``count`` QoS 1 PUBLISHes in one write; returns once every one is acknowledged."""
    publisher = RawClient(broker_port, host=host)
    publisher.connect(unique_id("burst"))
    pad = b"." * payload_bytes
    burst = b"".join(
        mqtt_raw.publish_packet(topic, b"n" + str(n).encode() + b":" + pad, qos=1, packet_id=n + 1)
        for n in range(count)
    )
    publisher.send_bytes(burst)  # one write: the broker reads the burst in one or a few reads
    acked = {publisher.expect(Puback).packet_id for _ in range(count)}
    assert acked == set(range(1, count + 1))
    publisher.close()


def _publications_done(cluster: LocalCluster, index: int) -> float:
    return metric_total(cluster.metrics_text(index), "skipmq_cluster_publish_done_total")


def _republished(cluster: LocalCluster, index: int) -> float:
    return metric_total(cluster.metrics_text(index), "skipmq_cluster_republished_total")


def _forwarded(cluster: LocalCluster, index: int) -> float:
    return metric_total(cluster.metrics_text(index), "skipmq_cluster_forwarded_total")


def test_a_burst_goes_out_as_few_publications_and_arrives_whole_and_in_order(
    cluster3: LocalCluster, client_factory: ClientFactory
) -> None:
    topic = f"{unique_id('batch')}/t"
    subscribers = [client_factory(cluster3, 1), client_factory(cluster3, 2)]
    for subscriber in subscribers:
        assert subscriber.subscribe(topic, 1) == [1]
    for subscriber in subscribers:
        probe_route(cluster3, 0, subscriber, topic)
    done_before = _publications_done(cluster3, 0)
    republished_before = _republished(cluster3, 0)
    forwarded_before = _forwarded(cluster3, 0)

    broker = cluster3.brokers[0]
    _burst(broker.mqtt_port, broker.host, topic, BURST)

    for subscriber in subscribers:
        got = subscriber.wait_messages(BURST, timeout_s=30.0)
        assert numbers((m.payload.split(b":")[0] for m in got), b"n") == list(range(BURST))
        subscriber.assert_no_message(0.3)  # once each

    # the batches' completions completed every message in them: nothing is published again
    time.sleep(2.5)  # > 2 x cluster.retransmit_ms: an unconfirmed message would have been republished
    assert _republished(cluster3, 0) == republished_before
    assert _forwarded(cluster3, 0) - forwarded_before == BURST
    # one overlay publication (and PublishDone) per batch, not per message: before batching this
    # was BURST
    publications = _publications_done(cluster3, 0) - done_before
    assert publications <= BURST // 4, f"{publications} overlay publications for a burst of {BURST}"


def test_a_batch_stays_below_the_smallest_cluster_frame(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    """With ``cluster.max_frame_bytes`` at its minimum (64 KiB), a burst of 200 QoS 1 messages of
    2 KiB (400 KiB, each far below the limit) still reaches the other broker whole: batches are cut
    to fit the frame, never refused by the transport as too large."""
    cluster = cluster_factory(2, settings={"cluster.max_frame_bytes": "65536"})
    topic = f"{unique_id('frame')}/t"
    subscriber = client_factory(cluster, 1)
    assert subscriber.subscribe(topic, 1) == [1]
    probe_route(cluster, 0, subscriber, topic)
    broker = cluster.brokers[0]
    _burst(broker.mqtt_port, broker.host, topic, BURST, payload_bytes=2048)
    got = subscriber.wait_messages(BURST, timeout_s=30.0)
    assert numbers((m.payload.split(b":")[0] for m in got), b"n") == list(range(BURST))
