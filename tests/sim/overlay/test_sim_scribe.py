"""Tests of the Scribe/Pastry baseline (overlay/sim/scribe.py) run in the simulator."""

from __future__ import annotations

import random
from collections import deque
from functools import partial

import pytest

from overlay.api import Action, Deliver, Event, JoinTopic, LeaveTopic, PeerId, Publish, Role
from overlay.sim.checkers import DeliveryChecker
from overlay.sim.engine import NetworkConfig, Simulator
from overlay.sim.scribe import LEAF_HALF, ScribeConfig, ScribeNode, topic_key

NODES = 300


def build(
    seed: int, nodes: int = NODES, network: NetworkConfig | None = None, config: ScribeConfig | None = None
) -> Simulator:
    sim = Simulator(seed, network)
    plan = random.Random(seed)
    config = config if config is not None else ScribeConfig(2.0)
    for peer in range(nodes):
        contacts = (plan.randrange(peer),) if peer else ()
        node = ScribeNode(peer, rng=sim.node_rng(peer), config=config)
        sim.add_node(node, contacts, at=peer * 0.005)
    sim.run_until(nodes * 0.005 + 20.0)
    return sim


def ring_distance(node: ScribeNode, key: int) -> tuple[int, int]:
    return min((node.node_id - key) % 2**32, (key - node.node_id) % 2**32), node.node_id


def scribe_nodes(sim: Simulator) -> list[ScribeNode]:
    nodes = [node for node in sim.nodes.values() if isinstance(node, ScribeNode)]
    assert len(nodes) == len(sim.nodes)
    return nodes


@pytest.fixture(scope="module")
def overlay() -> Simulator:
    return build(21)


def test_every_node_joined_with_the_true_leaf_set(overlay: Simulator) -> None:
    nodes = scribe_nodes(overlay)
    ring = sorted(node.node_id for node in nodes)
    position = {node_id: index for index, node_id in enumerate(ring)}
    for node in nodes:
        assert node.joined
        index = position[node.node_id]
        want_right = [ring[(index + k) % len(ring)] for k in range(1, LEAF_HALF + 1)]
        want_left = [ring[(index - k) % len(ring)] for k in range(1, LEAF_HALF + 1)]
        assert [entry[0] for _, entry in node.right_leaves] == want_right
        assert [entry[0] for _, entry in node.left_leaves] == want_left


def test_every_key_has_one_root_the_numerically_closest_node(overlay: Simulator) -> None:
    nodes = scribe_nodes(overlay)
    for topic in ("alpha", "beta", "gamma", "delta"):
        key = topic_key(topic)
        roots = [node for node in nodes if node.is_root_of(key)]
        assert len(roots) == 1, topic
        closest = min(nodes, key=partial(ring_distance, key=key))
        assert roots[0] is closest


def test_publish_reaches_every_subscriber_once_with_route_plus_tree_depth(overlay: Simulator) -> None:
    sim = overlay
    checker = DeliveryChecker(settle_s=1.0, window_s=3.0, strict_presence=False)
    sim.observers.append(checker)
    hops_seen: dict[int, int] = {}

    def record(s: Simulator, peer: PeerId, event: Event, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Deliver) and action.publication_id == 7:
                hops_seen[peer] = action.hops

    sim.observers.append(record)
    plan = random.Random(3)
    subscribers = plan.sample(range(1, NODES), 60)
    for peer in subscribers:
        sim.inject(peer, JoinTopic("news", Role.SUBSCRIBER))
    sim.inject(0, JoinTopic("news", Role.PUBLISHER))
    sim.run_for(3.0)
    publish_sends_before = sim.stats.sent_by_kind["PUBLISH"]
    sim.inject(0, Publish("news", b"x", 7))
    sim.run_for(4.0)
    assert checker.check(sim) == 1
    assert sorted(hops_seen) == sorted(subscribers)
    route_hops = sim.stats.sent_by_kind["PUBLISH"] - publish_sends_before
    # tree depth of every node below the root, by walking the children lists
    nodes = {node.peer_id: node for node in scribe_nodes(sim)}
    root = next(node for node in nodes.values() if node.is_root_of(topic_key("news")))
    depth = {root.peer_id: 0}
    queue = deque([root.peer_id])
    while queue:
        parent = queue.popleft()
        for child in nodes[parent].children("news"):
            assert child not in depth, "the multicast tree must not revisit a node"
            depth[child] = depth[parent] + 1
            queue.append(child)
    for peer, hops in hops_seen.items():
        assert hops == route_hops + depth[peer]
    assert max(hops_seen.values()) > route_hops  # subscribers really sit below the root
    sim.observers.remove(checker)
    sim.observers.remove(record)


def test_unsubscribe_prunes_the_tree() -> None:
    sim = build(5, nodes=120)
    plan = random.Random(9)
    subscribers = plan.sample(range(1, 120), 15)
    for peer in subscribers:
        sim.inject(peer, JoinTopic("t", Role.SUBSCRIBER))
    sim.run_for(3.0)
    nodes = scribe_nodes(sim)
    assert sum(len(node.children("t")) for node in nodes) >= 15
    for peer in subscribers:
        sim.inject(peer, LeaveTopic("t", Role.SUBSCRIBER))
    sim.run_for(3.0)
    assert sum(len(node.children("t")) for node in nodes) == 0
    delivered: list[object] = []
    sim.observers.append(lambda s, p, e, acts: delivered.extend(a for a in acts if isinstance(a, Deliver)))
    sim.inject(0, Publish("t", b"x", 1))
    sim.run_for(3.0)
    assert delivered == []


def test_scribe_is_deterministic_and_survives_jitter() -> None:
    network = NetworkConfig(link_spread_s=0.03, jitter_s=0.01)
    first = build(8, nodes=80, network=network)
    second = build(8, nodes=80, network=network)
    assert [n.node_id for n in scribe_nodes(first)] == [n.node_id for n in scribe_nodes(second)]
    assert first.stats.sent == second.stats.sent
    assert all(node.joined for node in scribe_nodes(first))


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="leafset_period_s"):
        ScribeConfig(leafset_period_s=0)
    with pytest.raises(ValueError, match="digit_bits"):
        ScribeConfig(digit_bits=3)
    with pytest.raises(ValueError, match="join_state"):
        ScribeConfig(join_state="lazy")
    with pytest.raises(ValueError, match="publish_mode"):
        ScribeConfig(publish_mode="flood")
    with pytest.raises(ValueError, match="leaf_half"):
        ScribeConfig(leaf_half=0)
    with pytest.raises(ValueError, match="cache_root"):
        ScribeConfig(publish_mode="tree", cache_root=True)
    with pytest.raises(ValueError, match="max_children"):
        ScribeConfig(max_children=-1)


def table_entries(sim: Simulator) -> int:
    return sum(entry is not None for node in scribe_nodes(sim) for row in node.table for entry in row)


def subscribe_and_publish(
    sim: Simulator, subscribers: list[int], publisher: int, publishes: int = 1
) -> tuple[dict[int, int], int]:
    """Subscribers and the publisher join "news"; the last of ``publishes`` publishes' hops per
    subscriber and its PUBLISH sends (route to the root). Every publish reaches each subscriber once."""
    checker = DeliveryChecker(settle_s=1.0, window_s=3.0, strict_presence=False)
    sim.observers.append(checker)
    hops_seen: dict[int, int] = {}

    def record(s: Simulator, peer: PeerId, event: Event, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Deliver) and action.publication_id == publishes:
                hops_seen[peer] = action.hops

    sim.observers.append(record)
    for peer in subscribers:
        sim.inject(peer, JoinTopic("news", Role.SUBSCRIBER))
    sim.inject(publisher, JoinTopic("news", Role.PUBLISHER))
    sim.run_for(3.0)
    route_sends = 0
    for publication in range(1, publishes + 1):
        before = sim.stats.sent_by_kind["PUBLISH"]
        sim.inject(publisher, Publish("news", b"x", publication))
        sim.run_for(4.0)
        route_sends = sim.stats.sent_by_kind["PUBLISH"] - before
    assert checker.check(sim) == publishes
    assert sorted(hops_seen) == sorted(subscribers)
    sim.observers.remove(checker)
    sim.observers.remove(record)
    return hops_seen, route_sends


def test_rows_join_fills_fewer_slots_and_still_routes_to_the_one_root() -> None:
    """join_state="rows" (Pastry's join): routing tables hold only rows copied from the join
    route (plus announcements); without learning from traffic fewer still; routing and leaf
    sets stay exact."""
    full = build(31, nodes=200)
    rows = build(31, nodes=200, config=ScribeConfig(2.0, join_state="rows"))
    lazy = build(31, nodes=200, config=ScribeConfig(2.0, join_state="rows", learn_from_traffic=False))
    quiet = build(31, nodes=200, config=ScribeConfig(2.0, join_state="rows", announce=False))
    silent = build(
        31, nodes=200, config=ScribeConfig(2.0, join_state="rows", announce=False, learn_from_traffic=False)
    )
    seen = build(31, nodes=200, config=ScribeConfig(2.0, join_state="self", announce=False))
    # (at 200 nodes the leaf-set exchanges teach nearly everything: only the order is asserted)
    assert table_entries(silent) < table_entries(lazy) < table_entries(rows)
    assert table_entries(seen) < table_entries(full)
    for sim in (full, rows, lazy, quiet, silent, seen):
        nodes = scribe_nodes(sim)
        assert all(node.joined for node in nodes)
        for topic in ("alpha", "beta"):
            key = topic_key(topic)
            roots = [node for node in nodes if node.is_root_of(key)]
            assert roots == [min(nodes, key=partial(ring_distance, key=key))]
        hops, _ = subscribe_and_publish(sim, random.Random(4).sample(range(1, 200), 25), 0)
        assert min(hops.values()) >= 1


def test_smaller_leaf_sets_are_exact() -> None:
    sim = build(17, nodes=120, config=ScribeConfig(2.0, leaf_half=4))
    nodes = scribe_nodes(sim)
    ring = sorted(node.node_id for node in nodes)
    position = {node_id: index for index, node_id in enumerate(ring)}
    for node in nodes:
        index = position[node.node_id]
        assert [entry[0] for _, entry in node.right_leaves] == [ring[(index + k) % 120] for k in range(1, 5)]
        assert [entry[0] for _, entry in node.left_leaves] == [ring[(index - k) % 120] for k in range(1, 5)]


def tree_distances(sim: Simulator, start: int) -> dict[int, int]:
    """Hops from ``start`` to every node of the "news" tree over parent and child edges."""
    nodes = {node.peer_id: node for node in scribe_nodes(sim)}
    edges: dict[int, set[int]] = {peer: set() for peer in nodes}
    for peer, node in nodes.items():
        for child in node.children("news"):
            edges[peer].add(child)
            edges[child].add(peer)
    distance = {start: 0}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        for there in edges[here]:
            if there not in distance:
                distance[there] = distance[here] + 1
                queue.append(there)
    return distance


def test_tree_mode_floods_from_the_publisher_along_tree_edges() -> None:
    """publish_mode="tree" (Overlay Weaver's Mcast): the publisher is a tree member and each
    subscriber is reached once, in exactly its tree distance from the publisher."""
    sim = build(23, nodes=250, config=ScribeConfig(2.0, publish_mode="tree"))
    subscribers = random.Random(6).sample(range(1, 250), 40)
    hops, route_sends = subscribe_and_publish(sim, subscribers, 0)
    assert route_sends == 0  # nothing is routed to the root
    distance = tree_distances(sim, 0)
    assert {peer: distance[peer] for peer in subscribers} == hops
    # the publisher's own branch is shorter than the way over the root for some subscriber
    root = next(node for node in scribe_nodes(sim) if node.is_root_of(topic_key("news")))
    assert min(hops.values()) < distance[root.peer_id] + 1


def test_cached_root_makes_the_route_one_hop() -> None:
    sim = build(29, nodes=200, config=ScribeConfig(2.0, cache_root=True))
    subscribers = random.Random(8).sample(range(1, 200), 30)
    hops, route_sends = subscribe_and_publish(sim, subscribers, 0, publishes=2)
    assert route_sends == 1  # the second publish goes straight to the root
    distance = tree_distances(
        sim, next(n.peer_id for n in scribe_nodes(sim) if n.is_root_of(topic_key("news")))
    )
    assert hops == {peer: 1 + distance[peer] for peer in subscribers}


@pytest.mark.parametrize("digit_bits", [1, 2])
def test_other_digit_bases_route_to_one_root_and_deliver(digit_bits: int) -> None:
    sim = Simulator(13)
    plan = random.Random(13)
    config = ScribeConfig(2.0, digit_bits=digit_bits)
    for peer in range(150):
        contacts = (plan.randrange(peer),) if peer else ()
        sim.add_node(ScribeNode(peer, rng=sim.node_rng(peer), config=config), contacts, at=peer * 0.005)
    sim.run_for(20.0)
    nodes = scribe_nodes(sim)
    assert len(nodes[0].table) == 32 // digit_bits
    assert sum(node.is_root_of(topic_key("x")) for node in nodes) == 1
    checker = DeliveryChecker(settle_s=1.0, window_s=3.0, strict_presence=False)
    sim.observers.append(checker)
    for peer in plan.sample(range(1, 150), 30):
        sim.inject(peer, JoinTopic("x", Role.SUBSCRIBER))
    sim.run_for(3.0)
    sim.inject(0, Publish("x", b"p", 1))
    sim.run_for(4.0)
    assert checker.check(sim) == 1
    assert len(checker.publishes[(0, 1)].deliveries) == 30


def test_bottleneck_remover_caps_children_and_deepens_the_tree() -> None:
    """max_children (Scribe's bottleneck remover without proximity): after the subscriptions no
    node has more children than the cap, every subscriber is still reached once in route + its
    tree depth, and the tree is deeper than the uncapped one built by the same seed."""
    subscribers = random.Random(12).sample(range(1, 250), 80)
    depths = {}
    for cap in (0, 3):
        sim = build(37, nodes=250, config=ScribeConfig(2.0, max_children=cap))
        hops, route_sends = subscribe_and_publish(sim, subscribers, 0)
        nodes = scribe_nodes(sim)
        if cap:
            assert max(len(node.children("news")) for node in nodes) <= cap
        root = next(node for node in nodes if node.is_root_of(topic_key("news")))
        distance = tree_distances(sim, root.peer_id)
        assert hops == {peer: route_sends + distance[peer] for peer in subscribers}
        depths[cap] = max(distance[peer] for peer in subscribers)
    assert depths[3] > depths[0]
