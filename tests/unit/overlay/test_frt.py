"""Unit tests of the ≤FRT order (seed 003 §3.4: propositions B1..B10) and entry filtering.

Each proposition gets a pair of tables (E, F) for the same owner where exactly that
proposition decides; filtering examples are worked out by hand.
"""

from __future__ import annotations

import pytest

from overlay import frt
from overlay.frt import TableView, frt_compare, frt_equivalent, frt_leq, propositions
from overlay.keys import PUBLISHER, SUBSCRIBER
from overlay.table import RoutingTable

OWNER = ("m", PUBLISHER, 50)  # a publisher of topic "m"


def k(peer: int, topic: str = "x", role: int = PUBLISHER) -> tuple[str, int, int]:
    """Keys of topic "x" lie right of OWNER only if topic > "m": use "a" for left, "x" for right."""
    return (topic, role, peer)


def left(peer: int) -> tuple[str, int, int]:
    return ("a", PUBLISHER, peer)


def right(peer: int) -> tuple[str, int, int]:
    return ("x", PUBLISHER, peer)


def sub(peer: int) -> tuple[str, int, int]:
    return ("m", SUBSCRIBER, peer)  # a subscriber of the owner's topic: right of OWNER


def view(*rows: tuple[tuple[str, int, int], int]) -> TableView:
    return TableView(
        OWNER, tuple((key, level, key[0] == "m" and key[1] == SUBSCRIBER) for key, level in rows)
    )


def B(e: TableView, f: TableView) -> dict[int, bool]:
    return {index + 1: value for index, value in enumerate(propositions(e, f))}


def assert_better(worse: TableView, better: TableView) -> None:
    assert frt_leq(worse, better)
    assert not frt_leq(better, worse)
    assert frt_compare(worse, better) == -1 and frt_compare(better, worse) == 1


# ---------------------------------------------------------------------- notations


def test_notations() -> None:
    table = view((left(1), 0), (left(2), 2), (right(3), 0), (sub(4), 2), (right(5), 4))
    assert frt.l_max(table) == 4
    assert frt.emp(table) == {1, 3}
    assert frt.sub(table) == {sub(4)}
    assert frt.max_levels(table) == {0, 2}
    assert frt.succ_keys(table) == [sub(4), right(3), right(5)]  # ("m",1,..) < ("x",..): nearest first
    assert frt.pred_keys(table) == [left(2), left(1)]  # nearest (largest) first
    assert frt.l_max(view()) == -1 and frt.max_levels(view()) == set()


# ---------------------------------------------------------------------- one test per proposition


def test_b1_higher_l_max_is_better() -> None:
    e = view((right(1), 0), (right(2), 1))
    f = view((right(1), 0), (right(2), 2))  # reaches level 2 (level 1 empty, yet l_max decides)
    b = B(e, f)
    assert b[1] and not b[2]
    assert_better(e, f)


def test_b1_same_l_max_fewer_empty_levels_is_better() -> None:
    e = view((right(1), 0), (right(2), 0), (right(3), 2))  # level 1 empty
    f = view((right(1), 0), (right(2), 1), (right(3), 2))
    b = B(e, f)
    assert b[1] and not b[2]
    assert frt.l_max(e) == frt.l_max(f) and len(frt.emp(e)) > len(frt.emp(f))
    assert_better(e, f)


def test_b2_ties_on_l_max_and_emp() -> None:
    e = view((right(1), 0), (right(2), 1))
    f = view((left(1), 0), (left(2), 1))
    assert B(e, f)[2] and not B(e, f)[1]
    assert B(f, e)[2] and not B(f, e)[1]


def test_b3_more_same_topic_subscribers_is_better() -> None:
    e = view((right(1), 0), (right(2), 1), (right(3), 1))
    f = view((right(1), 0), (right(2), 1), (sub(3), 1))
    b = B(e, f)
    assert b[2] and b[3] and not b[1]
    assert_better(e, f)


def test_b3_does_not_override_b1() -> None:
    many_subs = view((sub(1), 0), (sub(2), 0), (sub(3), 0))
    higher = view((right(1), 0), (right(2), 1))
    assert B(many_subs, higher)[1]
    assert_better(many_subs, higher)


def test_b4_ties_on_sub() -> None:
    e = view((sub(1), 0), (right(2), 1))
    f = view((sub(5), 0), (left(2), 1))
    b = B(e, f)
    assert b[4] and not b[3]


def test_b5_fewer_maximal_levels_is_better() -> None:
    # counts E: [2, 2] -> MAX={0,1};  F: [1, 3] -> MAX={1}
    e = view((right(1), 0), (right(2), 0), (right(3), 1), (right(4), 1))
    f = view((right(1), 0), (right(2), 1), (right(3), 1), (right(4), 1))
    b = B(e, f)
    assert b[4] and b[5] and not b[3]
    assert_better(e, f)


def test_b6_ties_on_max_size() -> None:
    e = view((right(1), 0), (right(2), 0), (right(3), 1))
    f = view((right(1), 0), (right(2), 1), (right(3), 1))
    b = B(e, f)
    assert b[6] and not b[5]


def test_b7_lowest_maximal_level_higher_is_better() -> None:
    # E: counts [2, 1] -> MAX={0};  F: counts [1, 2] -> MAX={1}: F keeps more high-level entries
    e = view((right(1), 0), (right(2), 0), (right(3), 1))
    f = view((right(1), 0), (right(2), 1), (right(3), 1))
    b = B(e, f)
    assert b[6] and b[7] and not b[5]
    assert_better(e, f)


def test_b8_ties_on_min_max() -> None:
    e = view((right(1), 0), (right(3), 1))
    f = view((right(2), 0), (right(3), 1))
    b = B(e, f)
    assert b[8] and not b[7]


def test_b9_nearer_successors_are_better() -> None:
    e = view((right(1), 0), (right(3), 0))  # SUCC nearest-first: x1, x3
    f = view((right(1), 0), (right(2), 0))  # SUCC: x1, x2 -> nearer second successor
    b = B(e, f)
    assert b[8] and b[9] and not b[10]
    assert_better(e, f)


def test_b9_missing_successor_counts_as_farthest() -> None:
    e = view((left(1), 0), (right(1), 0), (left(2), 1))  # SUCC = [x1]
    f = view((left(1), 0), (right(1), 0), (right(2), 1))  # SUCC = [x1, x2]
    b = B(e, f)
    assert b[8] and b[9]
    assert_better(e, f)


def test_b10_nearer_predecessors_are_better() -> None:
    # same successors; predecessors nearest-first E: a3, a1   F: a3, a2 (a2 nearer than a1)
    e = view((left(3), 0), (left(1), 1), (right(5), 0))
    f = view((left(3), 0), (left(2), 1), (right(5), 0))
    b = B(e, f)
    assert b[8] and b[10] and not b[9]
    assert_better(e, f)


def test_b9_and_b10_as_written_can_conflict_and_the_order_reads_them_lexicographically() -> None:
    # E lost a successor, F lost a predecessor: literally B9(E,F) and B10(F,E) both hold
    e = view((left(2), 0), (right(1), 0), (left(1), 0))
    f = view((left(2), 0), (right(1), 0), (right(2), 0))
    assert B(e, f)[9] and B(f, e)[10]
    # B10 applies only when KEY(SUCC) ties, so keeping successors wins: F is better
    assert_better(e, f)


def test_equivalence_is_identity_of_keys() -> None:
    e = view((left(1), 0), (right(2), 3))
    same = view((right(2), 3), (left(1), 0))
    assert frt_equivalent(e, same) and frt_compare(e, same) == 0
    assert not frt_equivalent(e, view((left(1), 0), (right(3), 3)))


# ---------------------------------------------------------------------- filtering by hand

OWNER_MV = 0  # level of an entry with membership vector 1 << l is l (bits 0..l-1 shared)


def mv_for_level(level: int) -> int:
    return 1 << level


def table_with(capacity: int, rows: list[tuple[tuple[str, int, int], int]]) -> RoutingTable:
    table = RoutingTable(OWNER, OWNER_MV, capacity=capacity, frt_enabled=True, mv_bits=8)
    for key, level in rows:
        table.add((key, mv_for_level(level)))
    return table


def test_filtering_never_drops_level0_neighbours_and_keeps_size() -> None:
    table = table_with(3, [(left(1), 0), (right(1), 0), (right(2), 1)])
    assert not table.add((right(3), mv_for_level(1)))  # the new, farthest level-1 successor goes
    assert table.keys == [left(1), right(1), right(2)]
    assert table.sticky_keys() == [left(1), right(1)]


def test_filtering_prefers_keeping_a_levels_only_entry() -> None:
    # right(5) is the only level-3 entry and far away; B1 keeps it, a level-0 entry goes
    table = table_with(4, [(left(1), 0), (right(1), 0), (right(2), 0), (right(5), 3)])
    assert table.add((left(2), mv_for_level(0)))  # the new entry stays: it is the new left neighbour
    # level 0 = {a1, a2, x1, x2}, sticky a2 and x1: B9/B10' drop the farthest predecessor a1
    assert table.keys == [left(2), right(1), right(2), right(5)]


def test_filtering_keeps_same_topic_subscribers() -> None:
    near_publisher, other_publisher = ("m", PUBLISHER, 60), ("m", PUBLISHER, 70)
    table = table_with(3, [(left(1), 0), (near_publisher, 0), (other_publisher, 0)])
    # B9 alone would drop the farthest successor, the new subscriber; B3 keeps it
    assert table.add((sub(3), mv_for_level(0)))
    assert table.keys == [left(1), near_publisher, sub(3)]


def test_filtering_balances_levels_then_prefers_high_levels() -> None:
    table = table_with(4, [(left(1), 0), (right(1), 0), (right(2), 1)])
    table.add((left(2), mv_for_level(0)))
    assert len(table) == 4
    # level 0 = {a1, a2, a3, x1} (sticky a3, x1), level 1 = {x2}: level 0 loses its farthest
    # predecessor; the lone level-1 entry stays
    assert table.add((left(3), mv_for_level(0)))
    assert table.keys == [left(2), left(3), right(1), right(2)]
    # with two entries on each of levels 0 and 1, B7 protects the higher level
    table = table_with(5, [(left(1), 0), (right(1), 0), (right(2), 0), (left(4), 1), (right(3), 1)])
    # adding x4 at level 1 gives counts [3, 3] (MAX = {0, 1}); removing from level 0 leaves
    # MAX = {1} (min 1), removing from level 1 leaves MAX = {0} (min 0): level 0 loses a1
    assert table.add((right(4), mv_for_level(1)))
    assert table.keys == [left(4), right(1), right(2), right(3), right(4)]


def test_fast_selection_matches_bruteforce_on_a_worked_example() -> None:
    rows = [(left(1), 0), (left(2), 2), (left(3), 0), (right(1), 1), (right(2), 0), (sub(7), 0)]
    rows.append((right(3), 2))
    table = table_with(100, rows)
    mvs = {key: table.mv_of(key) for key in table.keys}
    expected = frt.select_victim_bruteforce(OWNER, OWNER_MV, mvs, table.sticky_keys(), 8)
    # counts: level0 = {a1, a3, x2, m7}, level1 = {x1}, level2 = {a2, x3}; sticky: a3, m7
    # B1: levels 0 and 2 have >= 2 entries; B3: non-SUB; B5: removing from level 0 leaves
    # MAX={0,2}? counts [3,1,2] -> MAX={0} size 1; from level 2: [4,1,1] -> {0} size 1;
    # B7: min(MAX) equal (0) -> B9/B10': farthest predecessor among candidates: a1
    assert expected == left(1)
    assert frt.select_victim(table) == left(1)


def test_select_victim_none_when_only_sticky_entries() -> None:
    table = table_with(100, [(left(1), 0), (right(1), 3)])
    assert frt.select_victim(table) is None
    assert (
        frt.select_victim_bruteforce(
            OWNER, OWNER_MV, {key: table.mv_of(key) for key in table.keys}, table.sticky_keys(), 8
        )
        is None
    )


def test_table_size_must_hold_the_sticky_entries() -> None:
    from overlay.config import OverlayConfig

    with pytest.raises(ValueError, match="table_size"):
        OverlayConfig(table_size=1)
