"""Small tables (issue #18: L = 4, a topic with 3 subscriber brokers; seed 003 §3.4).

The publisher's table holds its two sticky level-0 neighbours (the left one is not a
subscriber: it belongs to the run before the topic) and two more entries. All three subscribers
fit (the right sticky neighbour is the first of them), so one hop is possible - and ≤FRT takes
it unless policy 1 forbids it: B1 (l_max, then |EMP|) is decided before B3 (|SUB|), so an
entry that is the only one of the top level, or the only one of a level below it, stays in
the table in preference to a subscriber. Which case applies depends on the membership vectors
only; both are shown here, and ``frt.eviction_reason`` names the proposition.
"""

from __future__ import annotations

from overlay import frt
from overlay.keys import PUBLISHER, SUBSCRIBER
from overlay.table import RoutingTable, TableTrace

OWNER = ("t", PUBLISHER, 0)
OWNER_MV = 0
LEFT0 = ("a", PUBLISHER, 9)  # the sticky left neighbour: another topic's publisher
SUBS = [("t", SUBSCRIBER, peer) for peer in (1, 2, 3)]  # SUBS[0] is the sticky right neighbour
OTHER = ("z", PUBLISHER, 7)  # a non-subscriber beyond the subscriber run


def mv_of_level(level: int) -> int:
    """A membership vector sharing exactly ``level`` digits with OWNER_MV (= 0)."""
    return 1 << level


def table_after_learning(levels: dict[tuple[str, int, int], int]) -> RoutingTable:
    table = RoutingTable(OWNER, OWNER_MV, capacity=4, frt_enabled=True, mv_bits=32)
    table.trace = TableTrace()
    for key, level in levels.items():
        table.add((key, mv_of_level(level)))
    return table


def test_three_subscribers_fill_the_free_slots_when_policy_1_allows() -> None:
    # OTHER shares its level with a subscriber: removing it changes neither l_max nor EMP
    table = table_after_learning({LEFT0: 0, SUBS[0]: 1, SUBS[1]: 0, SUBS[2]: 2, OTHER: 1})
    assert set(table.keys) == {LEFT0, *SUBS}  # every subscriber is an entry: one hop
    assert table.trace is not None and not table.trace.evicted


def test_policy_1_keeps_the_only_top_level_entry_before_a_subscriber() -> None:
    # OTHER is the only entry of level 3 (the top): dropping it lowers l_max (B1), so a
    # subscriber goes instead and is reached through another subscriber (two hops)
    table = table_after_learning({LEFT0: 0, SUBS[0]: 1, SUBS[1]: 0, SUBS[2]: 1, OTHER: 3})
    assert OTHER in table and LEFT0 in table and SUBS[0] in table
    assert table.sub_count == 2
    assert table.trace is not None
    reasons = set(table.trace.evicted.values())
    assert reasons == {"B1 (policy 1: keep the Skip-Graph levels, l_max/EMP)"}


def test_policy_1_keeps_the_only_entry_of_a_lower_level_before_a_subscriber() -> None:
    # OTHER is the only entry of level 1: dropping it empties that level (|EMP| + 1, B1)
    table = table_after_learning({LEFT0: 0, SUBS[0]: 2, SUBS[1]: 0, SUBS[2]: 2, OTHER: 1})
    assert OTHER in table and table.sub_count == 2
    assert table.trace is not None
    assert set(table.trace.evicted.values()) == {"B1 (policy 1: keep the Skip-Graph levels, l_max/EMP)"}


def test_eviction_reason_agrees_with_the_brute_force_order() -> None:
    table = table_after_learning({LEFT0: 0, SUBS[0]: 1, SUBS[1]: 0, SUBS[2]: 1})
    table.add((OTHER, mv_of_level(3)))  # over capacity: the victim is chosen now
    assert len(table) == 4
    entry_mvs = {key: table.mv_of(key) for key in table.keys}
    entry_mvs[SUBS[2]] = mv_of_level(1)
    chosen = frt.select_victim_bruteforce(OWNER, OWNER_MV, entry_mvs, [LEFT0, SUBS[0]], 32)
    assert chosen == SUBS[2]  # the same victim the fast filter removed


def test_l4_publisher_reaches_three_subscribers_in_one_hop_unless_policy_1_keeps_an_entry() -> None:
    """Brokers with L = 4 (anchors on), 3 subscriber brokers of one topic, other topics around
    it, over 12 seeds: every subscriber not reached in one hop was learned by the publisher and
    filtered out by B1 - never lost for another reason (not learned, or sticky slots)."""
    from overlay.config import OverlayConfig
    from tests.support.overlay_harness import PUB_ROLE, SUB_ROLE, Cluster, joined

    config = OverlayConfig(table_size=4)
    one_hop_runs = 0
    for seed in range(1, 13):
        cluster = Cluster(8, config, seed=seed)
        cluster.bootstrap_all()
        joined(cluster, [(0, "t", PUB_ROLE)] + [(p, "a" if p % 2 else "z", PUB_ROLE) for p in (4, 5, 6, 7)])
        publisher = ("t", PUBLISHER, 0)
        table = cluster.nodes[0].table_of(publisher)
        table.trace = TableTrace()
        joined(cluster, [(p, "t", SUB_ROLE) for p in (1, 2, 3)])
        cluster.publish(0, "t", 1)  # the publish's EEXP may still teach entries
        cluster.advance(5.0)
        hops = {item[0]: item[1].hops for item in cluster.publish(0, "t", 2)}
        assert sorted(hops) == [1, 2, 3], f"seed {seed}: delivered to {sorted(hops)}"
        if all(h == 1 for h in hops.values()):
            one_hop_runs += 1
            continue
        for peer, h in hops.items():
            key = ("t", SUBSCRIBER, peer)
            if h > 1:
                assert key not in table, f"seed {seed}: {key} is an entry but took {h} hops"
                why = table.trace.evicted.get(key)
                assert why is not None and why.startswith("B1"), f"seed {seed}: {key}: {why}"
    assert one_hop_runs >= 1
