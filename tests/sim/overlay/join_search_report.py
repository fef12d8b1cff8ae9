"""Join searches in the 1,000-peer churn test's join phase (docs/overlay.md §10 "Slow joins at small L").

    python -m tests.sim.overlay.join_search_report SEED [NAME=VALUE ...]

Runs the first phase of ``test_sim_overlay.churn_simulation`` (1,000 peers, L = 8, 5 % loss: the
bootstraps, then 2,021 topic joins within 5 s) with ``OverlayConfig`` fields overridden by the
arguments (the test's config otherwise), and reports:

* the joins still pending 10 / 30 / 60 / 90 s after the topic joins, by kind at 90 s;
* the SEARCH messages of every search (an engine observer): hops of the answered ones and the
  share sent to a virtual node right of the target (walking left), for joins and position checks
  (``join_verify_rounds``) apart;
* a replay over the tables at 90 s: 400 searches for a new key next to a random existing one,
  from a random virtual node of a random peer, by the per-vnode greedy walk SkipMQ used before
  2026-11-27 (split by the direction it walks) and, on the same pairs, by ``peer_search_step``.

A report, not a test (about 60 s of CPU per run).
"""

from __future__ import annotations

import random
import statistics
import sys
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Any

from overlay.api import JoinTopic, PeerId, Role
from overlay.keys import Key
from overlay.node import OverlayNode
from overlay.sim.checkers import InvariantViolation, check_level0_ring
from overlay.sim.engine import NetworkConfig, Simulator
from overlay.skipgraph import peer_search_step
from overlay.table import RoutingTable
from tests.sim.overlay.test_join_search import SearchHops
from tests.sim.overlay.test_sim_overlay import CHURN_CONFIG

PEERS = 1000
Tables = dict[PeerId, dict[Key, RoutingTable]]


def per_vnode_next_hop(table: RoutingTable, target: Key) -> Key | None:
    """The greedy step over one table, from the node it was addressed to (before 2026-11-27)."""
    keys, owner = table.keys, table.owner
    if target > owner:
        index = bisect_left(keys, target)
        return keys[index - 1] if index > 0 and keys[index - 1] > owner else None
    index = bisect_right(keys, target)
    return keys[index] if index < len(keys) and keys[index] < owner else None


def per_vnode_walk(tables: dict[Key, RoutingTable], start: Key, target: Key) -> int:
    current, hops = start, 0
    while True:
        nxt = per_vnode_next_hop(tables[current], target)
        if nxt is None or nxt not in tables:
            return hops
        hops += nxt[2] != current[2]
        current = nxt


def per_peer_walk(by_peer: Tables, tables: dict[Key, RoutingTable], peer: PeerId, target: Key) -> int:
    hops = 0
    while True:
        step = peer_search_step(by_peer[peer].values(), target)
        if step is None or step[1] is None or step[1] not in tables:
            return hops
        hops += 1
        peer = step[1][2]


def join_phase(
    seed: int, overrides: dict[str, Any]
) -> tuple[Simulator, list[OverlayNode], SearchHops, dict[int, int]]:
    config = replace(CHURN_CONFIG, **overrides)
    network = NetworkConfig(base_latency_s=0.01, link_spread_s=0.02, jitter_s=0.005, loss_rate=0.05)
    sim = Simulator(seed, network)
    log = SearchHops()
    sim.observers.append(log)
    plan = random.Random(seed)
    nodes = [OverlayNode(peer, rng=sim.node_rng(peer), config=config) for peer in range(PEERS)]
    for node in nodes:  # no churn in this phase: every node stays up
        sim.add_node(node, (0,) if node.peer_id else (), at=node.peer_id * 0.05)
    sim.run_for(5.0 + PEERS * 0.05)
    joins_at = sim.now
    topics = [f"room/{i}" for i in range(6)]
    for peer in range(PEERS):
        for topic in plan.sample(topics, 2):
            role = Role.PUBLISHER if plan.random() < 0.4 else Role.SUBSCRIBER
            sim.inject(peer, JoinTopic(topic, role), at=sim.now + plan.random() * 5.0)
    sim.inject(0, JoinTopic("news", Role.PUBLISHER))
    for peer in plan.sample(range(1, PEERS), 20):
        sim.inject(peer, JoinTopic("news", Role.SUBSCRIBER), at=sim.now + plan.random() * 5.0)
    pending: dict[int, int] = {}
    for after_s in (10, 30, 60, 90):
        sim.run_until(joins_at + after_s)
        pending[after_s] = sum(len(node.pending) for node in nodes)
    return sim, nodes, log, pending


def report(seed: int, overrides: dict[str, Any]) -> None:
    sim, nodes, log, pending = join_phase(seed, overrides)
    kinds = Counter(
        "anchor" if join.key[0] == "" else ("publisher" if join.key[1] == 0 else "subscriber")
        for node in nodes
        for join in node.pending.values()
    )
    try:
        check_level0_ring(sim)
        ring = "exact"
    except InvariantViolation:
        ring = "WRONG"
    print(f"seed={seed} {overrides} joins pending +10/30/60/90 s: {pending}; at +90 s {dict(kinds)}")
    print(f"  level-0 list 90 s after the joins: {ring}")
    for name, is_check in (("joins", False), ("checks", True)):
        searches = [search for search in log.hops if (search in log.checks) == is_check]
        answered = [log.hops[search] for search in searches if search in log.answered]
        if not answered:
            continue
        total = sum(log.hops[search] for search in searches)
        left = sum(log.left[search] for search in searches)
        print(
            f"  {name}: {len(searches)} searches, {len(answered)} answered: hops mean "
            f"{statistics.mean(answered):.1f} max {max(answered)}; {total} SEARCH messages, "
            f"{left / total:.0%} walking left"
        )
    by_peer: Tables = {node.peer_id: {key: v.table for key, v in node.vnodes.items()} for node in nodes}
    tables = {key: table for peer_tables in by_peer.values() for key, table in peer_tables.items()}
    keys = sorted(tables)
    rng = random.Random(7)
    walks: dict[tuple[str, str], list[int]] = defaultdict(list)
    for _ in range(400):
        peer = rng.choice(list(by_peer))
        start = rng.choice(sorted(by_peer[peer]))
        near = rng.choice(keys)
        target = (near[0], near[1], near[2] + 0.5)  # a new key next to an existing one
        side = "left" if start > target else "right"  # the way the per-vnode walk goes
        walks[("per-vnode", side)].append(per_vnode_walk(tables, start, target))
        walks[("per-peer", side)].append(per_peer_walk(by_peer, tables, peer, target))
    for (rule, side), hops in sorted(walks.items()):
        print(
            f"  replay {rule:9s} (per-vnode walk going {side:5s}): n={len(hops)} "
            f"hops mean {statistics.mean(hops):.1f} max {max(hops)}"
        )


def main(argv: list[str]) -> None:
    overrides: dict[str, Any] = {}
    for argument in argv[1:]:
        name, value = argument.split("=", 1)
        current = getattr(CHURN_CONFIG, name)
        overrides[name] = value == "True" if isinstance(current, bool) else type(current)(value)
    report(int(argv[0]), overrides)


if __name__ == "__main__":
    main(sys.argv[1:])
