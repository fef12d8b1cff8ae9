"""Join searches at small L are short and walk right (seed 003 §3.5.2; docs/overlay.md §5 "Join", §10).

A SEARCH continues at every peer from the best of all the peer's virtual nodes
(``skipgraph.peer_search_step``): from the nearest key below the target that the peer knows
(every peer's anchor lies left of every topic key), walking right. Before, it continued from
the virtual node it was addressed to, and a search whose first virtual node lay right of the
target walked left, which ≤FRT tables serve badly (B9/B10' drop the farthest predecessors
first): an anchor joined after a topic (its first search lost under loss) walked left from the
topic, across the runs. At 1,000 peers (L = 8, 5 % loss) that left joins pending 90 s after
the topic joins, and with the position check (``join_verify_rounds``) on the churn test failed.

Counted in SEARCH messages (hops), not in time: 300 peers, L = 8, 5 % loss, every peer joins
two of six topics, the observer counts the hops of each join search that was answered. Seeds
1-5, before -> after: mean hops 10.5-12.4 -> 7.9-8.7, hops walking left 9-14 % -> 1 %.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest

from overlay import messages as m
from overlay.api import Action, Event, JoinTopic, PeerId, Role, Send
from overlay.config import OverlayConfig
from overlay.node import OverlayNode
from overlay.sim.checkers import check_level0_ring
from overlay.sim.engine import NetworkConfig, Simulator


class SearchHops:
    """Engine observer: SEARCH messages per search (origin, request id), those sent to a virtual
    node right of the target, and which searches were answered. Position checks (a joined node
    searching its own key, the first hop forwarded by that node) are left out."""

    def __init__(self) -> None:
        self.hops: dict[tuple[PeerId, int], int] = defaultdict(int)
        self.left: dict[tuple[PeerId, int], int] = defaultdict(int)
        self.checks: set[tuple[PeerId, int]] = set()
        self.answered: set[tuple[PeerId, int]] = set()

    def __call__(self, sim: Simulator, peer: PeerId, event: Event, actions: list[Action]) -> None:
        for action in actions:
            if type(action) is not Send:
                continue
            message: Any = action.message
            if isinstance(message, m.SEARCH) and message.dest is not None:
                search = (message.origin, message.request_id)
                if search not in self.hops and message.forwarder and message.forwarder[0] == message.target:
                    self.checks.add(search)
                self.hops[search] += 1
                if message.dest > message.target:
                    self.left[search] += 1
            elif isinstance(message, m.FOUND):
                self.answered.add((action.dest, message.request_id))

    def joins(self) -> list[tuple[PeerId, int]]:
        return [search for search in self.hops if search in self.answered and search not in self.checks]


@pytest.mark.slow
def test_join_searches_at_small_l_are_short_and_walk_right() -> None:
    seed, peers = 1, 300
    config = OverlayConfig(table_size=8)
    network = NetworkConfig(base_latency_s=0.01, link_spread_s=0.02, jitter_s=0.005, loss_rate=0.05)
    sim = Simulator(seed, network)
    hops = SearchHops()
    sim.observers.append(hops)
    plan = random.Random(seed)
    for peer in range(peers):
        node = OverlayNode(peer, rng=sim.node_rng(peer), config=config)
        sim.add_node(node, (0,) if peer else (), at=peer * 0.05)
    sim.run_for(5.0 + peers * 0.05)
    topics = [f"room/{i}" for i in range(6)]
    for peer in range(peers):
        for topic in plan.sample(topics, 2):
            role = Role.PUBLISHER if plan.random() < 0.4 else Role.SUBSCRIBER
            sim.inject(peer, JoinTopic(topic, role), at=sim.now + plan.random() * 5.0)
    sim.run_for(60.0)
    check_level0_ring(sim)

    joins = hops.joins()
    assert len(joins) >= 3 * peers * 0.95  # an anchor and two topics per peer, (nearly) all answered
    mean_hops = sum(hops.hops[search] for search in joins) / len(joins)
    left_share = sum(hops.left[search] for search in joins) / sum(hops.hops[search] for search in joins)
    # per-vnode greedy (before): 11.84 hops, 14 % of them walking left; per peer: 7.99 and 1 %
    assert mean_hops < 9.5, f"join searches average {mean_hops:.2f} hops [seed={seed}]"
    assert left_share < 0.04, f"{left_share:.1%} of join-search hops walk left [seed={seed}]"
    assert len(hops.checks) > peers  # the position check runs by default (join_verify_rounds)
