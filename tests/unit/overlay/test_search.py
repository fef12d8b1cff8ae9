"""The per-peer join search (``skipgraph.peer_search_step``; seed 003 §3.5.2, docs/overlay.md §5).

A SEARCH that reaches a peer continues from everything the peer knows (all its co-located
virtual nodes and their tables), walking right from the nearest known key below the target.
The property tests check, over random key sets, co-locations and tables that hold at least the
level-0 neighbours, that every search ends, never hops to its target, changes side at most once
(left to right), and answers with the target's true neighbours (for the position check of an
existing key: a node the others take for its neighbour, and the key). The examples show the two things the
rule adds to a per-vnode greedy walk: a search addressed right of the target continues from the
peer's anchor, and a nearer entry in another co-located table is used.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from overlay.keys import PUBLISHER, SUBSCRIBER
from overlay.skipgraph import peer_search_step, search_answer
from overlay.table import RoutingTable

Key = tuple[Any, ...]
MV_BITS = 8


Tables = dict[Any, dict[Key, RoutingTable]]  # peer -> its virtual nodes' tables


def build_tables(keys: list[Key], extra_share: float, rng: random.Random) -> Tables:
    """Each key's table holds its true level-0 neighbours and a random share of the other keys;
    the tables are grouped by peer (``key[2]``) in a random order, as ``OverlayNode`` holds them
    (in the order its virtual nodes joined)."""
    ordered = sorted(keys)
    mvs = {key: rng.getrandbits(MV_BITS) for key in ordered}
    by_peer: Tables = defaultdict(dict)
    for key in rng.sample(ordered, len(ordered)):
        index = ordered.index(key)
        table = RoutingTable(key, mvs[key], capacity=10**6, frt_enabled=True, mv_bits=MV_BITS)
        for neighbour in (index - 1, index + 1):
            if 0 <= neighbour < len(ordered):
                table.add((ordered[neighbour], mvs[ordered[neighbour]]))
        for other in ordered:
            if other != key and rng.random() < extra_share:
                table.add((other, mvs[other]))
        by_peer[key[2]][key] = table
    return by_peer


def run_search(by_peer: Tables, start: Any, target: Key) -> tuple[list[Key], Any]:
    """Hops (the keys forwarded to) and the answer of a search started at peer ``start``."""
    peer = start
    hops: list[Key] = []
    total = sum(len(tables) for tables in by_peer.values())
    while True:
        step = peer_search_step(by_peer[peer].values(), target)
        assert step is not None, f"peer {peer} holds no virtual node but the target"
        table, nxt = step
        assert table.owner != target, "the target answered its own search"
        if nxt is None:
            return hops, search_answer(table, target)
        assert nxt != target, "a search hopped to its target"
        assert nxt in by_peer[nxt[2]], f"hop to {nxt!r}, which is not a virtual node"
        assert nxt not in by_peer[peer], "a hop to a co-located virtual node (must be handled locally)"
        hops.append(nxt)
        assert len(hops) <= total, "the search does not end"
        peer = nxt[2]


key_strategy = st.tuples(
    st.sampled_from(["", "a", "m", "z"]), st.sampled_from([PUBLISHER, SUBSCRIBER]), st.integers(0, 11)
)


@settings(max_examples=400, deadline=None)
@given(
    st.sets(key_strategy, min_size=2, max_size=40),
    st.floats(0.0, 0.5),
    st.integers(0, 2**32),
    st.booleans(),
    st.data(),
)
def test_search_ends_at_the_targets_true_neighbours(
    keys: set[Key], extra_share: float, seed: int, existing: bool, data: st.DataObject
) -> None:
    rng = random.Random(seed)
    by_peer = build_tables(sorted(keys), extra_share, rng)
    ordered = sorted(keys)
    near = data.draw(st.sampled_from(ordered))
    target = near if existing else (near[0], near[1], near[2] + 0.5)  # a joiner's new key
    starts = [peer for peer, tables in by_peer.items() if set(tables) - {target}]
    if not starts:
        return
    start = data.draw(st.sampled_from(sorted(starts)))
    hops, (pred, succ) = run_search(by_peer, start, target)

    below = [key for key in ordered if key < target]
    above = [key for key in ordered if key > target]
    true_pred = below[-1] if below else None
    true_succ = above[0] if above else None
    if not existing:
        assert (pred, succ) == (true_pred, true_succ)
    else:  # the position check: a neighbour of the target and the target, as the others see it
        # (from the right only where nothing below the target is known but the target itself)
        assert (pred, succ) in ((true_pred, target), (target, true_succ))
    # monotone: left of the target only increasing, right only decreasing, right-to-left never
    sides = [hop < target for hop in hops]
    assert sides == sorted(sides), f"the search went back to the right of the target: {hops}"
    left_part = [hop for hop in hops if hop < target]
    right_part = [hop for hop in hops if hop > target]
    assert left_part == sorted(left_part) and len(set(left_part)) == len(left_part)
    assert right_part == sorted(right_part, reverse=True) and len(set(right_part)) == len(right_part)


def _table(owner: Key, *entries: Key) -> RoutingTable:
    table = RoutingTable(owner, 0, capacity=10**6, frt_enabled=True, mv_bits=MV_BITS)
    for index, entry in enumerate(entries):
        table.add((entry, index + 1))
    return table


def test_a_search_addressed_right_of_the_target_walks_right_from_the_anchor() -> None:
    target = ("m", SUBSCRIBER, 50)
    anchor = _table(("", PUBLISHER, 1), ("", PUBLISHER, 0), ("", PUBLISHER, 2), ("m", PUBLISHER, 9))
    topic = _table(("z", PUBLISHER, 1), ("x", SUBSCRIBER, 7), ("z", PUBLISHER, 3), ("n", PUBLISHER, 4))
    # a per-vnode greedy walk from ("z", 0, 1) would go left to ("n", 0, 4) and walk on left;
    # the peer knows ("m", 0, 9) below the target through its anchor and goes there instead
    assert peer_search_step([topic, anchor], target) == (anchor, ("m", PUBLISHER, 9))


def test_the_nearest_key_below_from_any_co_located_table_is_taken() -> None:
    target = ("m", SUBSCRIBER, 50)
    addressed = _table(("m", SUBSCRIBER, 10), ("m", SUBSCRIBER, 5), ("m", SUBSCRIBER, 20))
    other = _table(("", PUBLISHER, 10), ("", PUBLISHER, 9), ("m", SUBSCRIBER, 44))
    assert peer_search_step([addressed, other], target) == (other, ("m", SUBSCRIBER, 44))


def test_a_peer_holding_the_predecessor_answers_with_it() -> None:
    target = ("m", SUBSCRIBER, 50)
    pred = _table(("m", SUBSCRIBER, 40), ("m", SUBSCRIBER, 30), ("m", SUBSCRIBER, 60))
    anchor = _table(("", PUBLISHER, 40), ("", PUBLISHER, 41), ("m", SUBSCRIBER, 40))
    table, nxt = peer_search_step([anchor, pred], target) or (None, "no step")
    assert (table, nxt) == (pred, None)
    assert search_answer(pred, target) == (("m", SUBSCRIBER, 40), ("m", SUBSCRIBER, 60))


def test_the_successor_answers_when_its_left_neighbour_is_the_nearest_key_below() -> None:
    target = ("m", SUBSCRIBER, 50)
    succ = _table(("m", SUBSCRIBER, 60), ("m", SUBSCRIBER, 40), ("m", SUBSCRIBER, 70))
    assert peer_search_step([succ], target) == (succ, None)
    assert search_answer(succ, target) == (("m", SUBSCRIBER, 40), ("m", SUBSCRIBER, 60))
    # a co-located table that knows a nearer key below: the search goes there instead
    other = _table(("a", PUBLISHER, 60), ("m", SUBSCRIBER, 45))
    assert peer_search_step([succ, other], target) == (other, ("m", SUBSCRIBER, 45))


def test_the_target_is_never_a_hop_nor_the_answer() -> None:
    target = ("m", SUBSCRIBER, 50)
    own = _table(target, ("m", SUBSCRIBER, 40), ("m", SUBSCRIBER, 60))
    assert peer_search_step([own], target) is None  # nothing here but the target
    right = _table(("m", SUBSCRIBER, 60), target, ("m", SUBSCRIBER, 40))
    # its left neighbour is the target: the search goes on to the key below the target
    assert peer_search_step([own, right], target) == (right, ("m", SUBSCRIBER, 40))


def test_a_co_located_node_that_another_table_also_lists_answers_for_itself() -> None:
    # the position check of the lowest key: nothing below it is known; the nearest key above is
    # the peer's own ("m", 0, 1), listed first as an entry of the peer's ("z", 0, 1)
    target = ("a", PUBLISHER, 5)
    higher = _table(("z", PUBLISHER, 1), ("m", PUBLISHER, 1))
    succ = _table(("m", PUBLISHER, 1), target, ("z", PUBLISHER, 1))
    assert peer_search_step([higher, succ], target) == (succ, None)
    assert search_answer(succ, target) == (target, ("m", PUBLISHER, 1))
