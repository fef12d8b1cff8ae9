"""Skip Graph routing decisions over a routing table (Aspnes & Shah; seed 003 §3.1, §3.5.6).

* ``search_next_hop``: greedy key search used to find a joining node's insertion position:
  move to the known entry closest to the target without passing it; the node where no such
  entry exists is the target's predecessor (searching right) or successor (searching left).
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

from bisect import bisect_left, bisect_right

from overlay.keys import PUBLISHER, Key, NodeRef, common_prefix_length
from overlay.table import RoutingTable


def search_next_hop(table: RoutingTable, owner: Key, target: Key) -> Key | None:
    """The target itself is never a hop: a joiner's key is in no table yet, and a node checking
    its own position (``OverlayNode._verify_position``) wants the search to end at the node the
    rest of the graph takes for its neighbour, not at itself."""
    keys = table.keys
    if target > owner:
        index = bisect_left(keys, target)  # entries in (owner, target): the largest
        if index > 0 and keys[index - 1] > owner:
            return keys[index - 1]
        return None
    index = bisect_right(keys, target)  # entries in (target, owner): the smallest
    if index < len(keys) and keys[index] < owner:
        return keys[index]
    return None


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
