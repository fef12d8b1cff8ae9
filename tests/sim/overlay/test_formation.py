"""Formation (overlay.formation, issue 17): peers started together with one seed list form ONE overlay.

Seeded simulations of the real ``OverlayNode``: 3, 5 and 50 seeds started within a fraction of a
second of each other (with jitter and, in some runs, message loss); a missing lowest seed; a late
lowest seed; a seed cut off during formation that founded alone and merges when the partition
heals; peers restarting (new addresses, as pods) around a broker that stayed up. The single
overlay is checked by the level-0 ring over every live virtual node (two overlays cannot form
one sorted ring) and by every peer having joined all its virtual nodes.
"""

from __future__ import annotations

import random

import pytest

from overlay.api import JoinTopic, Role
from overlay.config import OverlayConfig
from overlay.node import OverlayNode
from overlay.sim.checkers import check_level0_ring, check_tables
from overlay.sim.engine import NetworkConfig, Simulator

CONFIG = OverlayConfig(table_size=8, ping_interval_s=2.0, failure_timeout_s=6.0, formation_round_s=0.5)
NETWORK = NetworkConfig(base_latency_s=0.005, link_spread_s=0.02, jitter_s=0.005)
LOSSY = NetworkConfig(base_latency_s=0.005, link_spread_s=0.02, jitter_s=0.005, loss_rate=0.03)


def start(
    sim: Simulator, peers: list[int], seeds: list[int], *, at: float = 0.0, spread_s: float = 0.3
) -> None:
    """Start ``peers`` within ``spread_s`` of ``at``, each with the seed list ``seeds`` (itself included)."""
    jitter = random.Random(sim.seed)
    for peer in peers:
        node = OverlayNode(peer, rng=sim.node_rng(peer), config=CONFIG)
        sim.add_node(node, tuple(seeds), at=at + jitter.random() * spread_s)
        sim.inject(peer, JoinTopic(f"t/{peer % 3}", Role(peer % 2)), at=at)  # queued until joined


def nodes(sim: Simulator) -> list[OverlayNode]:
    return [node for node in sim.nodes.values() if isinstance(node, OverlayNode)]


def assert_one_overlay(sim: Simulator, peers: list[int]) -> None:
    live = {node.peer_id: node for node in nodes(sim)}
    assert sorted(live) == sorted(peers)
    for node in live.values():
        assert node.vnodes and not node.pending, f"peer {node.peer_id} not joined [seed={sim.seed}]"
        assert len(node.vnodes) == 2, f"peer {node.peer_id}: {node.virtual_keys()} [seed={sim.seed}]"
    assert check_level0_ring(sim) == 2 * len(peers)
    check_tables(sim)
    if len(peers) > 1:
        assert not any(node.is_lonely() for node in live.values())
    assert sum(node.founded for node in live.values()) <= 1


@pytest.mark.parametrize(("size", "seed"), [(3, s) for s in range(1, 9)] + [(5, s) for s in range(1, 9)])
def test_seeds_started_together_form_one_overlay(size: int, seed: int) -> None:
    sim = Simulator(seed, NETWORK)
    peers = list(range(size))
    start(sim, peers, peers)
    sim.run_for(8.0)
    assert_one_overlay(sim, peers)
    founders = [node.peer_id for node in nodes(sim) if node.founded]
    assert founders == [0], f"the lowest reachable seed founds [seed={seed}]"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_five_seeds_under_message_loss(seed: int) -> None:
    sim = Simulator(seed, LOSSY)
    peers = list(range(5))
    start(sim, peers, peers)
    sim.run_for(20.0)
    assert_one_overlay(sim, peers)


@pytest.mark.parametrize("seed", [1, 2])
def test_fifty_seeds_started_together_form_one_overlay(seed: int) -> None:
    sim = Simulator(seed, NETWORK, count_per_peer=False)
    peers = list(range(100, 150))
    start(sim, peers, peers, spread_s=1.0)
    sim.run_for(15.0)
    assert_one_overlay(sim, peers)


def test_without_itself_in_the_seed_list_nobody_founds() -> None:
    """The behaviour before formation, kept for non-seeds: a peer that is not a seed only joins.
    Three such peers pointing at each other never form an overlay (issue 17's 0 of 3)."""
    sim = Simulator(1, NETWORK)
    for peer in range(3):
        contacts = tuple(p for p in range(3) if p != peer)
        sim.add_node(OverlayNode(peer, rng=sim.node_rng(peer), config=CONFIG), contacts)
    sim.run_for(20.0)
    assert all(not node.vnodes for node in nodes(sim))


def test_missing_lowest_seed_the_lowest_reachable_founds() -> None:
    sim = Simulator(4, NETWORK)
    start(sim, [1, 2, 3, 4], [0, 1, 2, 3, 4])  # 0 is listed but never starts
    sim.run_for(8.0)
    assert_one_overlay(sim, [1, 2, 3, 4])
    assert [node.peer_id for node in nodes(sim) if node.founded] == [1]
    # joined seeds keep probing only the seed they never heard from (0 may have founded alone)
    sim.run_for(2 * CONFIG.ping_interval_s)
    assert all(node.unheard == {0} for node in nodes(sim))


def test_late_lowest_seed_joins_the_formed_overlay() -> None:
    sim = Simulator(5, NETWORK)
    start(sim, [1, 2, 3], [0, 1, 2, 3])
    sim.run_for(6.0)
    start(sim, [0], [0, 1, 2, 3], at=sim.now)
    sim.run_for(6.0)
    assert_one_overlay(sim, [0, 1, 2, 3])
    assert not sim.nodes[0].founded  # type: ignore[attr-defined]


def test_seed_cut_off_during_formation_merges_when_the_partition_heals() -> None:
    sim = Simulator(6, NETWORK)
    peers = list(range(5))
    sim.partition([[0], [1, 2, 3, 4]])
    start(sim, peers, peers)
    sim.run_for(6.0)
    founders = sorted(node.peer_id for node in nodes(sim) if node.founded)
    assert founders == [0, 1], "two overlays while cut off"
    sim.heal()
    sim.run_for(3 * CONFIG.ping_interval_s + 2.0)
    assert_one_overlay(sim, peers)
    assert all(not node.unheard for node in nodes(sim)), "every probed contact answered"


def test_broker_rejoins_when_its_peers_restart() -> None:
    """0 stays up while 1 and 2 crash and come back at new addresses (11, 12), at first unable
    to reach 0 (they found their own overlay); once they can, 0 - alone by now - joins theirs."""
    sim = Simulator(7, NETWORK)
    start(sim, [0, 1, 2], [0, 1, 2])
    sim.run_for(6.0)
    assert_one_overlay(sim, [0, 1, 2])
    sim.crash(1)
    sim.crash(2)
    sim.run_for(CONFIG.failure_timeout_s + 3 * CONFIG.ping_interval_s)
    assert sim.nodes[0].is_lonely()  # type: ignore[attr-defined]
    sim.partition([[0], [11, 12]])
    start(sim, [11, 12], [0, 11, 12], at=sim.now)
    sim.run_for(6.0)
    sim.heal()
    sim.run_for(3 * CONFIG.ping_interval_s + 2.0)
    assert_one_overlay(sim, [0, 11, 12])


def test_restarted_peers_join_the_broker_that_stayed_up() -> None:
    sim = Simulator(8, NETWORK)
    start(sim, [0, 1, 2], [0, 1, 2])
    sim.run_for(6.0)
    sim.crash(0)
    sim.crash(1)
    start(sim, [10, 11], [2, 10, 11], at=sim.now + 1.0)  # 2 stayed up: they join it, nobody founds
    # a search sent to a crashed peer's entry is retried another way after search_timeout_s
    sim.run_for(CONFIG.failure_timeout_s + 3 * CONFIG.search_timeout_s)
    assert_one_overlay(sim, [2, 10, 11])
    assert not any(sim.nodes[p].founded for p in (10, 11))  # type: ignore[attr-defined]


def test_formation_is_deterministic_for_its_seed() -> None:
    digests = []
    for _ in range(2):
        sim = Simulator(11, LOSSY, trace=True)
        start(sim, list(range(5)), list(range(5)))
        sim.run_for(10.0)
        digests.append(sim.trace_digest())
    assert digests[0] == digests[1]
