"""Property tests (hypothesis) of ≤FRT and FRT entry filtering (seed 003 §3.3-§3.4).

* filtering never drops a sticky (level-0 neighbour) entry and never exceeds L;
* the order is a strict total order: for any two tables of one owner exactly one of
  E <FRT F, F <FRT E, E ≡ F holds, where E ≡ F means both hold the same keys;
* the order is transitive (so "the maximal candidate table" is well defined);
* the structural ``select_victim`` equals ``select_victim_bruteforce``.
"""

from __future__ import annotations

from bisect import bisect_left

from hypothesis import given, settings
from hypothesis import strategies as st

from overlay import frt
from overlay.frt import TableView, frt_equivalent, frt_leq
from overlay.keys import PUBLISHER, SUBSCRIBER
from overlay.table import RoutingTable

MV_BITS = 5
OWNER_MV = 0b10110
OWNER = ("m", PUBLISHER, 50)

key_strategy = st.tuples(
    st.sampled_from(["a", "m", "z"]), st.sampled_from([PUBLISHER, SUBSCRIBER]), st.integers(0, 99)
).filter(lambda key: key != OWNER)
entries_strategy = st.dictionaries(key_strategy, st.integers(0, (1 << MV_BITS) - 1), max_size=18)


def build(entries: dict[tuple[str, int, int], int], capacity: int = 10**6) -> RoutingTable:
    table = RoutingTable(OWNER, OWNER_MV, capacity=capacity, frt_enabled=True, mv_bits=MV_BITS)
    for key, mv in entries.items():
        table.add((key, mv))
    return table


def as_view(entries: dict[tuple[str, int, int], int]) -> TableView:
    return TableView.build(OWNER, OWNER_MV, entries, MV_BITS)


@settings(max_examples=400, deadline=None)
@given(entries_strategy)
def test_fast_selection_equals_bruteforce(entries: dict[tuple[str, int, int], int]) -> None:
    table = build(entries)
    mvs = {key: table.mv_of(key) for key in table.keys}
    assert frt.select_victim(table) == frt.select_victim_bruteforce(
        OWNER, OWNER_MV, mvs, table.sticky_keys(), MV_BITS
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(key_strategy, st.integers(0, (1 << MV_BITS) - 1)), max_size=40), st.integers(2, 8))
def test_learning_with_filtering_keeps_sticky_entries_and_size(
    stream: list[tuple[tuple[str, int, int], int]], capacity: int
) -> None:
    table = build({}, capacity)
    known: dict[tuple[str, int, int], int] = {}
    for key, mv in stream:
        known[key] = mv
        table.add((key, mv))
        assert len(table) <= capacity
        assert table.keys == sorted(table.keys)
        assert table.owner_index == bisect_left(table.keys, OWNER)  # kept, not searched
        assert table.levels == [table.level_of(key) for key in table.keys]
        # the nearest key ever learned on each side is always kept: level-0 neighbours are sticky
        lefts = [k for k in known if k < OWNER]
        rights = [k for k in known if k > OWNER]
        if lefts:
            assert max(lefts) in table
        if rights:
            assert min(rights) in table
        assert sum(table.level_counts) == len(table)
        assert table.sub_count == sum(1 for k in table.keys if k[0] == "m" and k[1] == SUBSCRIBER)


@settings(max_examples=300, deadline=None)
@given(entries_strategy, entries_strategy)
def test_order_is_total_and_antisymmetric(
    e_entries: dict[tuple[str, int, int], int], f_entries: dict[tuple[str, int, int], int]
) -> None:
    e, f = as_view(e_entries), as_view(f_entries)
    e_worse = frt_leq(e, f) and not frt_leq(f, e)
    f_worse = frt_leq(f, e) and not frt_leq(e, f)
    outcomes = [e_worse, f_worse, frt_equivalent(e, f)]
    assert outcomes.count(True) == 1
    assert not (frt_leq(e, f) and frt_leq(f, e))
    assert frt_equivalent(e, f) == (set(e_entries) == set(f_entries))


@settings(max_examples=200, deadline=None)
@given(entries_strategy, entries_strategy, entries_strategy)
def test_order_is_transitive(
    a: dict[tuple[str, int, int], int], b: dict[tuple[str, int, int], int], c: dict[tuple[str, int, int], int]
) -> None:
    va, vb, vc = as_view(a), as_view(b), as_view(c)
    if frt_leq(va, vb) and frt_leq(vb, vc):
        assert frt_leq(va, vc)


@settings(max_examples=200, deadline=None)
@given(entries_strategy)
def test_victim_yields_the_maximal_candidate_table(entries: dict[tuple[str, int, int], int]) -> None:
    table = build(entries)
    victim = frt.select_victim(table)
    sticky = set(table.sticky_keys())
    if victim is None:
        assert set(table.keys) <= sticky
        return
    assert victim not in sticky
    mvs = {key: table.mv_of(key) for key in table.keys}
    chosen = as_view({k: v for k, v in mvs.items() if k != victim})
    for other in table.keys:
        if other not in sticky and other != victim:
            assert frt_leq(as_view({k: v for k, v in mvs.items() if k != other}), chosen)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), key_strategy, st.integers(0, (1 << MV_BITS) - 1)),
            st.tuples(st.just("remove"), key_strategy, st.just(0)),
            st.tuples(st.just("remove_peer"), key_strategy, st.just(0)),
        ),
        max_size=40,
    ),
    st.booleans(),
    st.integers(2, 8),
)
def test_owner_index_follows_every_change_of_the_table(
    operations: list[tuple[str, tuple[str, int, int], int]], frt_enabled: bool, capacity: int
) -> None:
    """``owner_index`` (kept, never searched) is the owner's insertion point, and ``levels`` the
    levels of ``keys`` in order, after any mix of learning, filtering (FRT) or staircase pruning
    (SG-TBPS), removals and peer removals."""
    table = RoutingTable(OWNER, OWNER_MV, capacity=capacity, frt_enabled=frt_enabled, mv_bits=MV_BITS)
    for operation, key, mv in operations:
        if operation == "add":
            table.add((key, mv))
        elif operation == "remove":
            table.remove(key)
        else:
            table.remove_peer(key[2])
        assert table.owner_index == bisect_left(table.keys, OWNER)
        assert table.levels == [table.level_of(key) for key in table.keys]
        index = table.owner_index
        assert table.left0() == (table.keys[index - 1] if index else None)
        assert table.right0() == (table.keys[index] if index < len(table.keys) else None)
