"""Cluster-wide retained messages (MQTT 3.1.1 §3.3.1.3 / MQTT 5 §3.3.1.3, docs/cluster.md).

A retained message accepted by any broker is replicated to every broker (last writer wins);
a new subscriber anywhere gets the latest value once it propagated, and an empty retained
payload deletes it cluster-wide. Propagation is awaited by polling with fresh subscribers
(bounded), never by a fixed sleep.
"""

from __future__ import annotations

from tests.support.cluster import ClusterClient, Received, probe_route, unique_id, wait_until
from tools.launcher import LocalCluster

PROPAGATION_S = 15.0


def retained_seen(
    cluster: LocalCluster, index: int, topic_filter: str, settle_s: float = 0.5
) -> list[Received]:
    """Subscribe a fresh client on broker index and return the retained messages it is sent."""
    client = ClusterClient(cluster.brokers[index].mqtt_port, client_id=unique_id("ret"))
    try:
        client.subscribe(topic_filter, 1)
        return [m for m in client.drain(settle_s) if m.retain]
    finally:
        client.close()


def wait_retained(cluster: LocalCluster, index: int, topic: str, payload: bytes | None) -> None:
    """Wait until a new subscriber on broker index gets exactly ``payload`` retained (None: nothing)."""

    def matches() -> bool:
        seen = [m.payload for m in retained_seen(cluster, index, topic)]
        return seen == ([] if payload is None else [payload])

    wait_until(
        matches, PROPAGATION_S, interval_s=0.1, what=f"retained {payload!r} on {topic} at broker {index}"
    )


def test_retained_reaches_new_subscribers_on_other_brokers(cluster3: LocalCluster) -> None:
    topic = f"{unique_id('rt')}/state"
    publisher = ClusterClient(cluster3.brokers[0].mqtt_port)
    try:
        publisher.publish(topic, b"v1", 1, retain=True)
        wait_retained(cluster3, 2, topic, b"v1")
        got = retained_seen(cluster3, 2, topic)
        assert [(m.topic, m.payload, m.qos) for m in got] == [(topic, b"v1", 1)]
        wait_retained(cluster3, 1, topic, b"v1")
    finally:
        publisher.close()


def test_latest_value_wins_and_empty_payload_deletes_everywhere(cluster3: LocalCluster) -> None:
    topic = f"{unique_id('rl')}/state"
    first = ClusterClient(cluster3.brokers[0].mqtt_port)
    second = ClusterClient(cluster3.brokers[1].mqtt_port)
    try:
        first.publish(topic, b"old", 1, retain=True)
        wait_retained(cluster3, 2, topic, b"old")
        second.publish(topic, b"new", 1, retain=True)  # another broker overwrites it
        for index in range(3):
            wait_retained(cluster3, index, topic, b"new")
        first.publish(topic, b"", 1, retain=True)  # delete, from the first broker
        for index in range(3):
            wait_retained(cluster3, index, topic, None)
    finally:
        first.close()
        second.close()


def test_retained_with_wildcard_subscription_on_another_broker(cluster3: LocalCluster) -> None:
    cls = unique_id("rw")
    publisher = ClusterClient(cluster3.brokers[2].mqtt_port)
    try:
        for room in ("a", "b", "c"):
            publisher.publish(f"{cls}/{room}/temp", room.encode(), 1, retain=True)
        publisher.publish(f"{cls}/a/humidity", b"h", 1, retain=True)

        def all_three() -> bool:
            got = retained_seen(cluster3, 0, f"{cls}/+/temp")
            return sorted((m.topic, m.payload) for m in got) == [
                (f"{cls}/{room}/temp", room.encode()) for room in ("a", "b", "c")
            ]

        wait_until(all_three, PROPAGATION_S, interval_s=0.1, what="3 retained temps at broker 0")
    finally:
        publisher.close()


def test_live_subscriber_gets_retained_publish_without_retain_flag(cluster3: LocalCluster) -> None:
    """MQTT §3.3.1.3: a retained PUBLISH forwarded to an existing subscription has RETAIN 0
    (v3.1.1; v5 with retain-as-published false), also when it crossed brokers."""
    topic = f"{unique_id('rf')}/live"
    sub = ClusterClient(cluster3.brokers[1].mqtt_port)
    publisher = ClusterClient(cluster3.brokers[0].mqtt_port)
    try:
        sub.subscribe(topic, 1)
        probe_route(cluster3, 0, sub, topic)
        publisher.publish(topic, b"live", 1, retain=True)
        msg = sub.wait_message()
        assert (msg.payload, msg.retain) == (b"live", False)
        publisher.publish(topic, b"", 1, retain=True)
    finally:
        sub.close()
        publisher.close()
