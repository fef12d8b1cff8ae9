"""Shared subscriptions across brokers (MQTT 5 §4.8.2, docs/cluster.md).

``$share/<group>/<filter>`` with members on different brokers: each message goes to exactly
one member of each group cluster-wide; different groups and plain subscribers each get it too.
"""

from __future__ import annotations

from collections import Counter

from tests.support.cluster import ClientFactory, ClusterClient, probe_route, unique_id, wait_until
from tools.launcher import LocalCluster

MESSAGES = 100


def collect(members: list[ClusterClient], expected: int, timeout_s: float = 30.0) -> Counter[bytes]:
    """Count the payloads all members received until ``expected`` arrived, then 1 s of quiet."""
    counts: Counter[bytes] = Counter()

    def enough() -> bool:
        for member in members:
            for msg in member.drain(0.05):
                counts[msg.payload] += 1
        return sum(counts.values()) >= expected

    wait_until(enough, timeout_s, interval_s=0.01, what=f"{expected} shared deliveries")
    for member in members:
        for msg in member.drain(1.0):
            counts[msg.payload] += 1
    return counts


def test_each_group_gets_each_message_once_cluster_wide(
    cluster3: LocalCluster, client_factory: ClientFactory
) -> None:
    topic = f"{unique_id('sh')}/t"
    group_one = [client_factory(cluster3, 0), client_factory(cluster3, 1)]
    group_two = [client_factory(cluster3, 1), client_factory(cluster3, 2)]
    for member in group_one:
        member.subscribe(f"$share/g1/{topic}", 1)
    for member in group_two:
        member.subscribe(f"$share/g2/{topic}", 1)
    plain = client_factory(cluster3, 0)
    plain.subscribe(topic, 1)
    probe_route(cluster3, 2, group_one, topic)
    probe_route(cluster3, 2, group_two, topic)
    probe_route(cluster3, 2, plain, topic)

    publisher = client_factory(cluster3, 2)
    for n in range(MESSAGES):
        publisher.publish_nowait(topic, f"s{n}".encode(), 1)
    wait_until(lambda: not publisher.pending, 30, what="all publishes acknowledged")

    expected = {f"s{n}".encode(): 1 for n in range(MESSAGES)}
    for name, members in (("g1", group_one), ("g2", group_two)):
        counts = collect(members, MESSAGES)
        duplicated = {p: c for p, c in counts.items() if c > 1}
        assert not duplicated, f"group {name} got duplicates: {sorted(duplicated)[:10]}"
        assert dict(counts) == expected, f"group {name} lost {set(expected) - set(counts)}"
    plain_got = [m.payload for m in plain.wait_messages(MESSAGES, timeout_s=20)]
    assert sorted(plain_got) == sorted(expected)
    plain.assert_no_message(0.5)
