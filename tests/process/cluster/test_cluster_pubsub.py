"""Cross-broker publish/subscribe over the overlay: QoS 0/1/2, exactly once, order, fan-out, amqtt.

Follows MQTT 3.1.1 §4.3 / MQTT 5 §4.3 (QoS flows, delivered QoS = min(publish, granted)),
§4.6 (per-publisher, per-topic order) across brokers, and docs/cluster.md (a subscription on
any broker reaches publishers on every broker once its broker joined the topic class; QoS 2
has no duplicates). Subscriber and publisher are on different brokers of a 3-broker cluster.
"""

from __future__ import annotations

import asyncio

import pytest
from amqtt.client import MQTTClient

from tests.support.cluster import (
    PROBE_PREFIX,
    ClientFactory,
    ClusterClient,
    ClusterFactory,
    numbers,
    probe_route,
    publish_until_acks_are_fast,
    unique_id,
    wait_until,
)
from tools.launcher import LocalCluster


def wait_all_acked(client: ClusterClient, timeout_s: float = 30.0) -> None:
    wait_until(lambda: not client.pending, timeout_s, what=f"{client.client_id}: every publish acknowledged")
    assert client.failed_payloads == [], f"publishes refused: {client.failed_payloads[:5]}"


@pytest.mark.parametrize("sub_qos", [0, 1, 2])
@pytest.mark.parametrize("version", [4, 5])
def test_cross_broker_qos_is_the_minimum(
    cluster3: LocalCluster, client_factory: ClientFactory, sub_qos: int, version: int
) -> None:
    topic = f"{unique_id('xq')}/a"
    sub = client_factory(cluster3, 1, version=version)
    assert sub.subscribe(topic, sub_qos) == [sub_qos]
    probe_route(cluster3, 2, sub, topic)
    pub = client_factory(cluster3, 2, version=version)
    for pub_qos in (0, 1, 2):
        pub.publish(topic, f"p{pub_qos}".encode(), pub_qos)
    got = sub.wait_messages(3)
    assert sorted((m.payload, m.qos) for m in got) == [(f"p{q}".encode(), min(q, sub_qos)) for q in (0, 1, 2)]
    assert all(m.topic == topic and not m.retain for m in got)
    sub.assert_no_message(0.5)


def test_qos2_exactly_once_across_brokers(cluster3: LocalCluster, client_factory: ClientFactory) -> None:
    topic = f"{unique_id('xq2')}/exactly"
    sub = client_factory(cluster3, 1)
    sub.subscribe(topic, 2)
    probe_route(cluster3, 2, sub, topic)
    pub = client_factory(cluster3, 2)
    for n in range(200):
        pub.publish_nowait(topic, f"m{n}".encode(), 2)
    wait_all_acked(pub)
    got = sub.wait_messages(200, timeout_s=30)
    got += sub.drain(1.0)
    payloads = [m.payload for m in got]
    assert len(payloads) == len(set(payloads)) == 200, "QoS 2 duplicated or lost a message"
    assert numbers(payloads, b"m") == list(range(200)), "per-publisher order broken"
    assert {m.qos for m in got} == {2}


def test_qos1_order_of_500_messages(cluster3: LocalCluster, client_factory: ClientFactory) -> None:
    topic = f"{unique_id('xo')}/order"
    sub = client_factory(cluster3, 1, version=4)
    sub.subscribe(topic, 1)
    probe_route(cluster3, 2, sub, topic)
    pub = client_factory(cluster3, 2, version=4)
    for n in range(500):
        pub.publish_nowait(topic, f"n{n}".encode(), 1)
    wait_all_acked(pub)
    got = sub.wait_messages(500, timeout_s=40)
    assert numbers([m.payload for m in got], b"n") == list(range(500))
    sub.assert_no_message(0.5)


def test_fanout_to_subscribers_on_every_broker(cluster3: LocalCluster, client_factory: ClientFactory) -> None:
    topic = f"{unique_id('fan')}/out"
    subs = [client_factory(cluster3, index) for index in range(3)]
    for sub in subs:
        sub.subscribe(topic, 1)
    for sub in subs:
        probe_route(cluster3, 1, sub, topic)
    pub = client_factory(cluster3, 1)
    for n in range(50):
        pub.publish_nowait(topic, f"f{n}".encode(), 1)
    wait_all_acked(pub)
    for sub in subs:
        got = sub.wait_messages(50, timeout_s=20)
        assert numbers([m.payload for m in got], b"f") == list(range(50)), (
            f"{sub.client_id} on port {sub.port}"
        )
        sub.assert_no_message(0.5)


def test_publishers_on_two_brokers_keep_their_own_order(
    cluster3: LocalCluster, client_factory: ClientFactory
) -> None:
    topic = f"{unique_id('two')}/pubs"
    sub = client_factory(cluster3, 0)
    sub.subscribe(topic, 1)
    probe_route(cluster3, 1, sub, topic)
    probe_route(cluster3, 2, sub, topic)
    pubs = {b"a": client_factory(cluster3, 1), b"b": client_factory(cluster3, 2)}
    for n in range(100):
        for prefix, pub in pubs.items():
            pub.publish_nowait(topic, prefix + str(n).encode(), 1)
    for pub in pubs.values():
        wait_all_acked(pub)
    got = [m.payload for m in sub.wait_messages(200, timeout_s=30)]
    for prefix in pubs:
        assert numbers([p for p in got if p.startswith(prefix)], prefix) == list(range(100))


def test_amqtt_clients_across_brokers(cluster3: LocalCluster, client_factory: ClientFactory) -> None:
    """amqtt (MQTT 3.1.1) subscribes on broker 0 and publishes on broker 2; paho on the other side."""
    topic_in = f"{unique_id('am')}/in"
    topic_out = f"{unique_id('am')}/out"
    paho_sub = client_factory(cluster3, 1)
    paho_sub.subscribe(topic_out, 2)
    probe_route(cluster3, 2, paho_sub, topic_out)
    paho_pub = client_factory(cluster3, 1)

    async def scenario() -> list[tuple[bytes, int]]:
        subscriber = MQTTClient(client_id=unique_id("amsub"))
        publisher = MQTTClient(client_id=unique_id("ampub"))
        await subscriber.connect(f"mqtt://127.0.0.1:{cluster3.brokers[0].mqtt_port}/", cleansession=True)
        await publisher.connect(f"mqtt://127.0.0.1:{cluster3.brokers[2].mqtt_port}/", cleansession=True)
        try:
            assert await subscriber.subscribe([(topic_in, 2)]) == [2]
            # probe: paho publishes from broker 1 until amqtt on broker 0 sees one (bounded)
            deadline = asyncio.get_running_loop().time() + 20
            routed = False
            while not routed:
                assert asyncio.get_running_loop().time() < deadline, "amqtt subscription not routed in 20 s"
                paho_pub.publish(topic_in, PROBE_PREFIX + b"amqtt", 0)
                try:
                    msg = await subscriber.deliver_message(timeout_duration=0.2)
                except TimeoutError:
                    msg = None
                routed = msg is not None and bytes(msg.data).startswith(PROBE_PREFIX)
            for qos in (0, 1, 2):
                paho_pub.publish(topic_in, f"to-amqtt-{qos}".encode(), qos)
                await publisher.publish(topic_out, f"from-amqtt-{qos}".encode(), qos=qos)
            out: list[tuple[bytes, int]] = []
            while len(out) < 3:
                msg = await subscriber.deliver_message(timeout_duration=10)
                assert msg is not None, "amqtt subscriber got nothing"
                if not bytes(msg.data).startswith(PROBE_PREFIX):
                    out.append((bytes(msg.data), int(msg.qos or 0)))
            return out
        finally:
            await subscriber.disconnect()
            await publisher.disconnect()

    got = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert sorted(got) == [(f"to-amqtt-{q}".encode(), q) for q in (0, 1, 2)]
    received = paho_sub.wait_messages(3)
    assert sorted((m.payload, m.qos) for m in received) == [
        (f"from-amqtt-{q}".encode(), q) for q in (0, 1, 2)
    ]


def test_acks_are_not_delayed_after_a_subscriber_broker_unsubscribes(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    """docs/cluster.md: a QoS 1 PUBACK waits for storage at every *subscriber's* broker. A broker
    whose last subscriber unsubscribed is none: once the UNSUB settled, PUBACKs must not wait
    publish_ack_wait_ms for it any more."""
    ack_wait_s = 3.0
    cluster = cluster_factory(3, {"cluster.publish_ack_wait_ms": str(int(ack_wait_s * 1000))})
    topic = f"{unique_id('un')}/acks"
    staying, leaving = client_factory(cluster, 1), client_factory(cluster, 2)
    for sub in (staying, leaving):
        sub.subscribe(topic, 1)
        probe_route(cluster, 0, sub, topic)
    publisher = client_factory(cluster, 0)
    publisher.publish(topic, b"before", 1)
    leaving.unsubscribe(topic)
    payloads = publish_until_acks_are_fast(
        publisher, topic, b"after", fast_s=1.0, settle_s=10.0, ack_timeout_s=ack_wait_s + 5
    )
    got = staying.wait_messages(1 + len(payloads))
    assert [m.payload for m in got] == [b"before", *payloads]
