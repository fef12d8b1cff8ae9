"""Wildcard subscriptions across brokers (MQTT 3.1.1 §4.7 / MQTT 5 §4.7, docs/cluster.md).

The overlay routes on topic classes (the first ``cluster.class_levels`` levels); each broker
does the exact MQTT match. These tests check that ``+`` and ``#`` work across brokers, also at
the first level (``+/temp``, ``#``: they span every class), and that a filter in one class does
not receive another class's messages.
"""

from __future__ import annotations

from tests.support.cluster import ClientFactory, ClusterClient, probe_route, unique_id
from tools.launcher import LocalCluster


def topics_of(client: ClusterClient, count: int, prefixes: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """Wait for ``count`` messages whose topic starts with one of prefixes (others are ignored)."""
    out: list[tuple[str, bytes]] = []
    while len(out) < count:
        msg = client.wait_message(15)
        if msg.topic.startswith(prefixes):
            out.append((msg.topic, msg.payload))
    return out


def test_plus_and_hash_inside_a_class(cluster3: LocalCluster, client_factory: ClientFactory) -> None:
    cls = unique_id("wc")
    plus = client_factory(cluster3, 0)
    plus.subscribe(f"{cls}/+/temp", 1)
    hash_sub = client_factory(cluster3, 1)
    hash_sub.subscribe(f"{cls}/#", 1)
    probe_route(cluster3, 2, plus, f"{cls}/probe/temp")
    probe_route(cluster3, 2, hash_sub, f"{cls}/probe/temp")
    pub = client_factory(cluster3, 2)
    sent = [f"{cls}/room1/temp", f"{cls}/room2/temp", f"{cls}/room1/humidity", f"{cls}/a/b/temp", cls]
    for index, topic in enumerate(sent):
        pub.publish(topic, f"v{index}".encode(), 1)
    assert [(m.topic, m.payload) for m in plus.wait_messages(2)] == [
        (f"{cls}/room1/temp", b"v0"),
        (f"{cls}/room2/temp", b"v1"),
    ]
    plus.assert_no_message(0.7)
    # "cls/#" also matches the parent level "cls" itself (MQTT §4.7.1.2)
    got = hash_sub.wait_messages(5)
    assert [(m.topic, m.payload) for m in got] == [(t, f"v{i}".encode()) for i, t in enumerate(sent)]


def test_plus_at_the_first_level_spans_classes(cluster3: LocalCluster, client_factory: ClientFactory) -> None:
    first, second = unique_id("pa"), unique_id("pb")
    sub = client_factory(cluster3, 2)
    sub.subscribe("+/temp", 1)
    # each class must reach the wildcard subscriber; probe both from the publishing broker
    probe_route(cluster3, 0, sub, f"{first}/temp")
    probe_route(cluster3, 0, sub, f"{second}/temp")
    pub = client_factory(cluster3, 0)
    for n in range(10):
        pub.publish(f"{first}/temp", f"a{n}".encode(), 1)
        pub.publish(f"{second}/temp", f"b{n}".encode(), 1)
        pub.publish(f"{first}/humidity", f"x{n}".encode(), 1)  # does not match +/temp
    got = topics_of(sub, 20, (first, second))
    assert [p for t, p in got if t == f"{first}/temp"] == [f"a{n}".encode() for n in range(10)]
    assert [p for t, p in got if t == f"{second}/temp"] == [f"b{n}".encode() for n in range(10)]
    leftovers = [m for m in sub.drain(0.7) if m.topic.startswith((first, second))]
    assert leftovers == [], f"{first}/humidity must not match +/temp: {leftovers}"


def test_hash_alone_receives_every_class(cluster3: LocalCluster, client_factory: ClientFactory) -> None:
    classes = [unique_id("ha"), unique_id("hb"), unique_id("hc")]
    sub = client_factory(cluster3, 1)
    sub.subscribe("#", 1)
    for cls in classes:
        probe_route(cluster3, 0, sub, f"{cls}/x")
        probe_route(cluster3, 2, sub, f"{cls}/x")
    pubs = [client_factory(cluster3, 0), client_factory(cluster3, 2)]
    expected: set[tuple[str, bytes]] = set()
    for n in range(5):
        for index, pub in enumerate(pubs):
            for cls in classes:
                payload = f"{index}-{n}".encode()
                pub.publish(f"{cls}/x", payload, 1)
                expected.add((f"{cls}/x", payload))
    got = topics_of(sub, len(expected), tuple(classes))
    assert len(got) == len(set(got)) == len(expected)
    assert set(got) == expected
    extra = [m for m in sub.drain(0.7) if m.topic.startswith(tuple(classes))]
    assert extra == [], f"duplicates: {extra}"


def test_a_filter_in_one_class_gets_nothing_from_another(
    cluster3: LocalCluster, client_factory: ClientFactory
) -> None:
    cls_a, cls_b = unique_id("ca"), unique_id("cb")
    sub_a = client_factory(cluster3, 0)
    sub_a.subscribe(f"{cls_a}/#", 1)
    sub_b = client_factory(cluster3, 2)
    sub_b.subscribe(f"{cls_b}/+", 1)
    probe_route(cluster3, 1, sub_a, f"{cls_a}/x")
    probe_route(cluster3, 1, sub_b, f"{cls_b}/x")
    pub = client_factory(cluster3, 1)
    for n in range(10):
        pub.publish(f"{cls_a}/x", f"a{n}".encode(), 1)
        pub.publish(f"{cls_b}/x", f"b{n}".encode(), 1)
    got_a = sub_a.wait_messages(10)
    got_b = sub_b.wait_messages(10)
    assert {m.topic for m in got_a} == {f"{cls_a}/x"}
    assert {m.topic for m in got_b} == {f"{cls_b}/x"}
    sub_a.assert_no_message(0.5)
    sub_b.assert_no_message(0.3)
