"""Seeded simulation of SIONet federation (seed 000 §3.7) across 60 sites in a random tree.

Random subscribe / unsubscribe (random filters, wildcards and TTLs), publishes from random
sites, and - in the churn test - leaves and crashes. After every step every router's counters
are compared with a brute-force oracle computed from the tree and the local subscriptions
alone, and every event must reach exactly the sites whose subscriptions match within their
TTL (full filter) or whose classes match (type only, a superset of the exact sites), each once.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter, deque

import pytest

from broker.cluster.classes import filter_class, topic_classes
from broker.federation.keys import RoutingMode
from broker.federation.messages import Event
from broker.federation.router import PlaceSettings
from broker.mqtt.topics import topic_matches
from simulation.federation import FederationNet

SITES = 60
LEVEL_WORDS = (("plant", "office", "fleet"), ("a", "b", "c", "d"), ("t", "h"))
TTLS = (2, 3, 4, 16)


def random_filter(rng: random.Random) -> str:
    levels = []
    for words in LEVEL_WORDS:
        roll = rng.random()
        if roll < 0.12:
            levels.append("#")
            break
        levels.append("+" if roll < 0.3 else rng.choice(words))
    return "/".join(levels)


def random_topic(rng: random.Random) -> str:
    return "/".join(rng.choice(words) for words in LEVEL_WORDS[: rng.randint(2, 3)])


class Oracle:
    """What the federation should look like, from the tree and local subscriptions only."""

    def __init__(self, net: FederationNet) -> None:
        self.net = net
        self.subs: dict[str, Counter[tuple[str, int]]] = {name: Counter() for name in net.routers}

    def adjacency(self) -> dict[str, set[str]]:
        adj: dict[str, set[str]] = {name: set() for name in self.net.routers}
        for name, router in self.net.routers.items():
            if router.parent is not None:
                assert name in self.net.routers[router.parent].children, (name, router.parent)
                adj[name].add(router.parent)
                adj[router.parent].add(name)
        return adj

    def distances(self, adj: dict[str, set[str]], start: str) -> dict[str, int]:
        dist = {start: 0}
        queue = deque([start])
        while queue:
            here = queue.popleft()
            for there in adj[here]:
                if there not in dist:
                    dist[there] = dist[here] + 1
                    queue.append(there)
        return dist

    def check_tree(self, adj: dict[str, set[str]]) -> None:
        edges = sum(len(n) for n in adj.values()) // 2
        assert edges == len(adj) - 1, "the sites no longer form one tree"
        assert len(self.distances(adj, next(iter(adj)))) == len(adj)

    def check_counters(self) -> None:
        adj = self.adjacency()
        self.check_tree(adj)
        dist = {name: self.distances(adj, name) for name in adj}
        some = next(iter(self.net.routers.values()))

        def arriving(receiver: str, neighbour: str) -> dict[str, int]:
            """Key -> TTL the neighbour must have registered on ``receiver``."""
            best: dict[str, int] = {}
            for site, subs in self.subs.items():
                if site == receiver or dist[neighbour][site] >= dist[receiver][site]:
                    continue  # not on the neighbour's side of the link
                for (topic_filter, ttl), count in subs.items():
                    left = ttl - dist[receiver][site]
                    if count and left >= 1:
                        key = some.key_of(topic_filter)
                        best[key] = max(best.get(key, 0), left)
            return best

        received = {(r, n): arriving(r, n) for r in adj for n in adj[r]}
        for name, router in self.net.routers.items():
            for link in adj[name]:
                assert router.received_from(link) == received[(name, link)], (name, link)
                expected: Counter[str] = Counter()
                for (topic_filter, ttl), count in self.subs[name].items():
                    if ttl - 1 >= 1:
                        expected[some.key_of(topic_filter)] += count
                for other in adj[name] - {link}:
                    for key, ttl in received[(name, other)].items():
                        if ttl - 1 >= 1:
                            expected[key] += 1
                actual = {key: n for key, n in router.counters().get(link, {}).items() if n}
                assert actual == {key: n for key, n in expected.items() if n}, (name, link)

    def receivers(self, publisher: str, topic: str, *, by_class: bool) -> set[str]:
        """The sites an event reaches, by the definition of event paths (§3.7.2): from a site
        the event holds, it crosses to a neighbour when some site on that neighbour's side has a
        matching subscription whose TTL reaches the site holding it (so an event, once carried
        toward one subscriber, also follows the paths that end close to its way - Fig. 16's
        chain reaction); it is delivered at every site it reaches with a matching subscription."""
        adj = self.adjacency()
        dist = {name: self.distances(adj, name) for name in adj}
        levels = self.net.settings.class_levels
        classes = set(topic_classes(topic, levels))

        def matches(topic_filter: str) -> bool:
            if by_class:
                return filter_class(topic_filter, levels) in classes
            return topic_matches(topic_filter, topic)

        wanted = [
            (site, ttl)
            for site, subs in self.subs.items()
            for (topic_filter, ttl), count in subs.items()
            if count and matches(topic_filter)
        ]
        reached = {publisher}
        queue = deque([publisher])
        while queue:
            here = queue.popleft()
            for there in adj[here] - reached:
                beyond = [(site, ttl) for site, ttl in wanted if dist[there][site] < dist[here][site]]
                if any(dist[here][site] <= ttl - 1 for site, ttl in beyond):
                    reached.add(there)
                    queue.append(there)
        return {site for site, _ttl in wanted} & (reached - {publisher})


def random_tree(net: FederationNet, rng: random.Random) -> None:
    names = [f"s{i:02d}" for i in range(SITES)]
    for name in names:
        net.add(name)
    net.build_tree({name: rng.choice(names[:index]) for index, name in enumerate(names) if index})


def publish_and_check(net: FederationNet, oracle: Oracle, rng: random.Random, serial: int) -> None:
    publisher = rng.choice(sorted(net.routers))
    topic = random_topic(rng)
    for log in net.delivered.values():
        log.clear()
    payload = str(serial).encode()
    net.do(publisher, net.routers[publisher].publish(Event(topic, payload)))
    got = {site for site, log in net.delivered.items() if log}
    for site, log in net.delivered.items():
        assert len(log) <= 1, f"{site} got {topic} twice"
    exact = oracle.receivers(publisher, topic, by_class=False)
    if net.settings.mode is RoutingMode.FULL_FILTER:
        assert got == exact, (publisher, topic)
    else:
        assert got == oracle.receivers(publisher, topic, by_class=True), (publisher, topic)
        assert got >= exact


def subscribe_step(net: FederationNet, oracle: Oracle, rng: random.Random) -> None:
    site = rng.choice(sorted(net.routers))
    held = [entry for entry, count in oracle.subs[site].items() if count]
    if held and rng.random() < 0.4:
        topic_filter, ttl = rng.choice(sorted(held))
        oracle.subs[site][(topic_filter, ttl)] -= 1
        net.do(site, net.routers[site].unsubscribe(topic_filter, ttl=ttl))
    else:
        topic_filter, ttl = random_filter(rng), rng.choice(TTLS)
        oracle.subs[site][(topic_filter, ttl)] += 1
        net.do(site, net.routers[site].subscribe(topic_filter, ttl=ttl))


@pytest.mark.parametrize("mode", [RoutingMode.FULL_FILTER, RoutingMode.TYPE_ONLY])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_counters_match_the_oracle_and_events_reach_exactly_the_matching_sites(
    mode: RoutingMode, seed: int
) -> None:
    rng = random.Random(seed)
    net = FederationNet(PlaceSettings("sweep", mode=mode, class_levels=rng.choice((1, 2))))
    random_tree(net, rng)
    oracle = Oracle(net)
    for step in range(200):
        subscribe_step(net, oracle, rng)
        oracle.check_counters()
        if step % 3 == 0:
            publish_and_check(net, oracle, rng, step)


@pytest.mark.parametrize("seed", [11, 12])
def test_leaves_and_crashes_keep_one_tree_with_correct_counters(seed: int) -> None:
    rng = random.Random(seed)
    settings = PlaceSettings("churn", mode=RoutingMode.FULL_FILTER, probe_hops=4)
    net = FederationNet(settings)
    random_tree(net, rng)
    oracle = Oracle(net)
    for _ in range(120):
        subscribe_step(net, oracle, rng)
    for round_ in range(12):
        net.tick(settings.probe_interval_s)  # discovery refreshed before the fault
        root = next(name for name, router in net.routers.items() if router.parent is None)
        # half of the faults take the root: a leave hands over, a crash makes its children elect
        victim = root if round_ % 4 in (2, 3) else rng.choice(sorted(set(net.routers) - {root}))
        if round_ % 2:
            net.do(victim, net.routers[victim].leave())
            del net.routers[victim]
        else:
            net.crash(victim)
        del oracle.subs[victim]
        net.tick(settings.retry_interval_s)
        net.tick(settings.custody_grace_s)  # the lost links' ghost registrations expire
        oracle.check_counters()
        for serial in range(5):
            publish_and_check(net, oracle, rng, 1000 * round_ + serial)
        for _ in range(10):
            subscribe_step(net, oracle, rng)
        oracle.check_counters()


def test_type_only_needs_fewer_setup_messages_and_wastes_events() -> None:
    """The seed's trade-off on one workload (the sweep over the ratio is bench/federation_modes.py)."""
    results = {}
    for mode in RoutingMode:
        rng = random.Random(7)
        net = FederationNet(dataclasses.replace(PlaceSettings("tradeoff"), mode=mode, class_levels=1))
        random_tree(net, rng)
        oracle = Oracle(net)
        for _ in range(200):
            subscribe_step(net, oracle, rng)
        setup = net.sent["Register"] + net.sent["Unregister"]
        events_before = net.sent["Event"]
        for serial in range(100):
            publish_and_check(net, oracle, rng, serial)
        results[mode] = (setup, net.sent["Event"] - events_before)
    assert results[RoutingMode.TYPE_ONLY][0] < results[RoutingMode.FULL_FILTER][0]
    assert results[RoutingMode.TYPE_ONLY][1] > results[RoutingMode.FULL_FILTER][1]


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_qos1_events_reach_every_live_subscriber_once_across_crashes_on_their_way(seed: int) -> None:
    """Custody (broker/federation/custody.py): a QoS 1 event is cut off half-way by the crash of a
    site on its way; after the re-links it still reaches every live site with a matching
    subscription, and none twice (re-routed copies are suppressed by event id)."""
    rng = random.Random(seed)
    settings = PlaceSettings("custody", ttl=64, probe_hops=8, custody_grace_s=30.0)
    net = FederationNet(settings)
    random_tree(net, rng)
    subs: dict[str, list[str]] = {name: [] for name in net.routers}
    for _ in range(80):
        site, topic_filter = rng.choice(sorted(net.routers)), random_filter(rng)
        subs[site].append(topic_filter)
        net.do(site, net.routers[site].subscribe(topic_filter))
    root = next(name for name, router in net.routers.items() if router.parent is None)
    events: list[tuple[str, str, bytes]] = []
    for serial in range(15):
        net.tick(settings.probe_interval_s)  # discovery known before the crash
        publisher = rng.choice(sorted(net.routers))
        topic, payload = random_topic(rng), f"e{serial}".encode()
        events.append((publisher, topic, payload))
        net.apply(publisher, net.routers[publisher].publish(Event(topic, payload, qos=1), net.now))
        net.step(rng.randint(0, 40))  # the event is somewhere on its way
        publishers = {name for name, _t, _p in events}
        victim = rng.choice(sorted(set(net.routers) - publishers - {root}))
        net.crash(victim, settle=False)
        del subs[victim]
        net.run()
        for _ in range(3):
            net.tick(settings.retry_interval_s)
    for _ in range(4):  # re-routes done; custody given back (a revived copy waits one more grace)
        net.tick(settings.custody_grace_s + 1)
    Oracle(net).check_tree(Oracle(net).adjacency())
    for publisher, topic, payload in events:
        wanted = {
            site
            for site, filters in subs.items()
            if site != publisher and any(topic_matches(f, topic) for f in filters)
        }
        got = Counter(
            site for site, log in net.delivered.items() for event in log if event.payload == payload
        )
        assert set(got) >= wanted, (payload, sorted(wanted - set(got)))
        assert all(count == 1 for count in got.values()), (payload, got)
    left = {
        name: dict(router._custody.entries) for name, router in net.routers.items() if router._custody.entries
    }
    assert not left, left
