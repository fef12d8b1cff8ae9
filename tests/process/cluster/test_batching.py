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

from broker.mqtt.packets import Puback
from tests.support.cluster import ClientFactory, metric_total, numbers, probe_route, unique_id
from tests.support.core import RawClient
from tools import mqtt_raw
from tools.launcher import LocalCluster

BURST = 200


def _publications_done(cluster: LocalCluster, index: int) -> float:
    return metric_total(cluster.metrics_text(index), "skipmq_cluster_publish_done_total")


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
    forwarded_before = _forwarded(cluster3, 0)

    broker = cluster3.brokers[0]
    publisher = RawClient(broker.mqtt_port, host=broker.host)
    publisher.connect(unique_id("burst"))
    burst = b"".join(
        mqtt_raw.publish_packet(topic, b"n" + str(n).encode(), qos=1, packet_id=n + 1) for n in range(BURST)
    )
    publisher.send_bytes(burst)  # one write: the broker reads the burst in one or a few reads
    acked = {publisher.expect(Puback).packet_id for _ in range(BURST)}
    assert acked == set(range(1, BURST + 1))

    for subscriber in subscribers:
        got = subscriber.wait_messages(BURST, timeout_s=30.0)
        assert numbers((m.payload for m in got), b"n") == list(range(BURST))
        subscriber.assert_no_message(0.3)  # once each
    publisher.close()

    assert _forwarded(cluster3, 0) - forwarded_before == BURST
    # one overlay publication (and PublishDone) per batch, not per message: before batching this
    # was BURST
    publications = _publications_done(cluster3, 0) - done_before
    assert publications <= BURST // 4, f"{publications} overlay publications for a burst of {BURST}"
