"""Skip Graph routing decisions over a routing table (Aspnes & Shah; seed 003 §3.1, §3.5.6).

* ``peer_search_step``: the step a peer takes for a SEARCH, the greedy key search that finds a
  joining node's insertion position (§3.5.2 "search its own insertion position"; the seed leaves
  the search to SG-TBPS): move to the known key nearest the target without passing it, over
  all the peer's co-located virtual nodes and their tables (SkipMQ's decision, docs/overlay.md
  §5 "Search routing"); ``search_answer``: FOUND's predecessor and successor where the search ends.
* ``rexp_next_hop``: the REXP forwarding rule of §3.5.6. A REXP of level i travelling away
  from its sender s reaches u. If u is s's level-(i+1) neighbour (their membership vectors
  share >= i+1 digits) the level is incremented - repeatedly, since u is then also s's
  neighbour at every level up to the common-prefix length - and the query goes to u's
  neighbour of the new level; otherwise to u's level-i neighbour; with no such neighbour the
  exploration ends. "Level-i neighbour" is the nearest table entry on that side whose level
  (common-prefix length with u) is >= i: exactly the Skip Graph pointer for the plain table,
  the best known approximation of it for an FRT table.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from overlay.keys import PUBLISHER, Key, NodeRef, common_prefix_length
from overlay.table import RoutingTable


def peer_search_step(tables: Iterable[RoutingTable], target: Key) -> tuple[RoutingTable, Key | None] | None:
    """The step of a SEARCH for ``target`` at a peer whose co-located virtual nodes own ``tables``.

    Returns ``(table, next)``: the virtual node owning ``table`` forwards the search to its entry
    ``next``, or, with ``next`` None, ends it (``search_answer``). None if the peer holds no
    virtual node but the target.

    Greedy over everything the peer knows (its virtual nodes and every entry of their tables),
    walking right: the search goes to the nearest known key below the target. It ends when that
    key is one of the peer's own virtual nodes (the target's predecessor as far as the peer
    knows), or when the nearest known key above the target is its own and that node's left
    level-0 neighbour is the nearest known key below (where a left walk ends; one hop saved).
    Only a peer that knows no key below the target walks left, to the nearest known key above.
    Every forward moves strictly nearer the target on its side and a search changes side at
    most once (left to right), so it ends. Right is the side the tables serve: ≤FRT's B9/B10'
    drop the farthest predecessors first, and every peer's anchor lies left of every topic key
    (docs/overlay.md §2, §5 "Search routing").

    The target itself is never a hop nor where a search ends: a joiner's key is in no table yet,
    and a virtual node checking its own position (``OverlayNode._verify_position``) wants the
    search to end at the node the rest of the graph takes for its neighbour, not at itself."""
    below: Key | None = None
    below_table: RoutingTable | None = None
    above: Key | None = None
    above_table: RoutingTable | None = None
    own: dict[Key, RoutingTable] = {}
    for table in tables:
        owner = table.owner
        if owner == target:
            continue
        own[owner] = table
        keys = table.keys
        index = bisect_left(keys, target)  # keys[index - 1] < target, the target itself excluded
        nearest = keys[index - 1] if index > 0 else None
        if owner < target and (nearest is None or owner > nearest):
            nearest = owner
        if nearest is not None and (below is None or nearest > below):
            below, below_table = nearest, table
        if index < len(keys) and keys[index] == target:
            index += 1  # bisect_right: keys[index] > target
        nearest = keys[index] if index < len(keys) else None
        if owner > target and (nearest is None or owner < nearest):
            nearest = owner
        if nearest is not None and (above is None or nearest < above):
            above, above_table = nearest, table
    if below is not None and below in own:
        return own[below], None
    if above is not None and above in own and own[above].left0() == below:
        return own[above], None
    if below is not None and below_table is not None:
        return below_table, below
    if above is not None and above in own:
        return own[above], None
    if above is not None and above_table is not None:
        return above_table, above
    return None  # no virtual node but the target


def search_answer(table: RoutingTable, target: Key) -> tuple[Key | None, Key | None]:
    """FOUND's (pred, succ) from the virtual node owning ``table`` where a search for ``target``
    ends: the owner and its level-0 neighbour on the target's side."""
    owner = table.owner
    if target > owner:
        return owner, table.right0()
    return table.left0(), owner


def rexp_next_hop(
    table: RoutingTable, owner: Key, owner_mv: int, sender: NodeRef, level: int, mv_bits: int
) -> tuple[Key | None, int]:
    sender_key, sender_mv = sender
    direction = 1 if sender_key < owner else -1
    shared = common_prefix_length(owner_mv, sender_mv, mv_bits)
    if shared > level:
        level = shared
    nxt = table.level_neighbor(direction, level)
    if nxt == sender_key:
        nxt = None
    return nxt, level


def is_rendezvous_candidate(table: RoutingTable, owner: Key) -> bool:
    """A publisher whose right level-0 neighbour is not a publisher of its topic."""
    right = table.right0()
    return right is None or right[0] != owner[0] or right[1] != PUBLISHER


def farthest_same_run_right(table: RoutingTable, owner: Key) -> Key | None:
    """The farthest known entry to the right inside owner's (topic, role) run."""
    inside = table.keys_between(owner, (owner[0], owner[1] + 1))
    inside = [key for key in inside if key > owner]
    return inside[-1] if inside else None
