"""Range multicast over FRT tables, SFB-style (seed 003 §3.5.1).

A message for the key range [lo, hi) reaches a virtual node u together with the sub-range u is
responsible for. u takes the entries of its table inside the range, plus itself if it is
inside, as split points p_0 < p_1 < ... < p_m and hands p_j the interval [p_j, p_{j+1})
(p_0 gets [lo, p_1), p_m gets [p_m, hi)). Because u's level-0 neighbours are always in its
table, the intervals cover the range and are disjoint, so every node of the range receives
the message exactly once when tables are accurate. FRT tables may hold several entries per
level and a low-level entry may lie farther than a high-level one, so SFB's level-by-level
split does not apply; as the paper prescribes, sub-ranges are handed out starting from the
entry with the farthest key (by rank distance from u) and ending with the nearest.

If u is outside the range and knows no entry inside it, the message is routed greedily toward
the range (the farthest entry between u and the range) - the "search" part of a range search.
"""

from __future__ import annotations

from bisect import bisect_left

from overlay.keys import Key
from overlay.table import RoutingTable

Delegation = tuple[Key, Key, Key]  # (receiver, lo, hi)


def plan_delegation(table: RoutingTable, owner: Key, lo: Key, hi: Key) -> list[Delegation]:
    """Sub-ranges of [lo, hi) for the in-range entries of ``table``, farthest first."""
    keys = table.keys
    start = bisect_left(keys, lo)
    end = bisect_left(keys, hi)
    if start >= end:
        return []
    points = keys[start:end]
    owner_inside = lo <= owner < hi
    if owner_inside:
        own_index = bisect_left(points, owner)
        points = [*points[:own_index], owner, *points[own_index:]]
    else:
        own_index = 0 if owner < lo else len(points)
    plan: list[tuple[int, Delegation]] = []
    last = len(points) - 1
    for index, point in enumerate(points):
        if point == owner:
            continue
        sub_lo = lo if index == 0 else point
        sub_hi = hi if index == last else points[index + 1]
        distance = index - own_index if index >= own_index else own_index - index
        plan.append((distance, (point, sub_lo, sub_hi)))
    plan.sort(key=lambda item: -item[0])
    return [delegation for _, delegation in plan]


def route_toward_range(table: RoutingTable, owner: Key, lo: Key, hi: Key) -> Key | None:
    """Next hop toward [lo, hi) when ``owner`` is outside it and knows nothing inside it.

    None means the range holds no node (the owner's level-0 neighbour already lies beyond it).
    """
    keys = table.keys
    if owner < lo:
        index = bisect_left(keys, lo)  # entries in (owner, lo): take the largest
        if index > 0 and keys[index - 1] > owner:
            return keys[index - 1]
        return None
    index = bisect_left(keys, hi)  # entries in [hi, owner): take the smallest
    if index < len(keys) and keys[index] < owner:
        return keys[index]
    return None
