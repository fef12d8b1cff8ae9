"""The total order ≤FRT on routing tables and FRT entry filtering (seed 003 §3.3, §3.4).

Notation (§3.4), for a virtual node u with membership vector mv(u):

* the *level* of an entry e is the length of the common prefix of mv(u) and mv(e), as in
  FRT-Skip Graph; E_l is the set of entries of level l;
* ``l_max(E)``: the largest level of an entry of E (-1 for an empty table);
* ``EMP(E)``: the levels 0..l_max(E)-1 that hold no entry (level l_max(E) is never empty, so
  counting "the l_max(E) levels" from 0 or from 1 gives the same |EMP|);
* ``SUB(E)``: the entries that are subscribers of u's topic;
* ``MAX(E)``: the levels 0..l_max(E) holding the most entries;
* ``SUCC(E)`` / ``PRED(E)``: entries with a larger / smaller key than u;
* ``KEY(X)``: X as a sequence ordered by key distance from u, nearest first (ascending keys for
  SUCC, descending keys for PRED). ``>dic`` compares such sequences element by element by
  distance from u; a sequence that is a proper prefix of the other is the greater one (a missing
  element counts as infinitely far). Comparing PRED by raw ascending keys would make policy 5
  ("keep keys near u") prefer *far* predecessors, so distance order is the reading consistent
  with the policies.

Propositions B1..B10 are implemented literally (``propositions``). As written, B9 and B10 can
hold in opposite directions at once (E loses a successor, F loses a predecessor), which would
make ≤FRT cyclic; SkipMQ reads the policy list as lexicographic, so the order uses
B10' = B8 and KEY(SUCC(E)) = KEY(SUCC(F)) and KEY(PRED(E)) >dic KEY(PRED(F)). Then

    E ≤FRT F  ⇔  B1 or B3 or B5 or B7 or B9 or B10'          (F is the better table)

is a strict total order on the tables of one owner: E ≡ F (neither ≤FRT the other) iff E and
F hold the same keys. Entry filtering removes, from the non-sticky entries, the one whose
removal leaves the ≤FRT-maximal table. ``select_victim`` derives that entry structurally in
O(levels + k) (k = entries scanned from either end, usually a handful) from per-level counts;
``select_victim_bruteforce`` builds every candidate table and compares them pairwise, and the
property tests prove the two equal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from overlay.keys import SUBSCRIBER, Key, common_prefix_length

if TYPE_CHECKING:
    from overlay.table import RoutingTable


@dataclass(frozen=True, slots=True)
class TableView:
    """A routing table as the order sees it: the owner and (key, level, is_sub) per entry."""

    owner: Key
    entries: tuple[tuple[Key, int, bool], ...]

    @staticmethod
    def build(owner: Key, owner_mv: int, entry_mvs: Mapping[Key, int], mv_bits: int) -> TableView:
        topic = owner[0]
        rows = tuple(
            (key, common_prefix_length(owner_mv, mv, mv_bits), key[1] == SUBSCRIBER and key[0] == topic)
            for key, mv in sorted(entry_mvs.items())
        )
        return TableView(owner, rows)

    def without(self, key: Key) -> TableView:
        return TableView(self.owner, tuple(row for row in self.entries if row[0] != key))


# ------------------------------------------------------------------ notations of §3.4


def l_max(table: TableView) -> int:
    return max((level for _, level, _ in table.entries), default=-1)


def level_counts(table: TableView) -> list[int]:
    counts = [0] * (l_max(table) + 1)
    for _, level, _ in table.entries:
        counts[level] += 1
    return counts


def emp(table: TableView) -> set[int]:
    counts = level_counts(table)
    return {level for level in range(len(counts) - 1) if counts[level] == 0}


def sub(table: TableView) -> set[Key]:
    return {key for key, _, is_sub in table.entries if is_sub}


def max_levels(table: TableView) -> set[int]:
    counts = level_counts(table)
    if not counts:
        return set()
    most = max(counts)
    return {level for level, count in enumerate(counts) if count == most}


def succ_keys(table: TableView) -> list[Key]:
    """KEY(SUCC(E)): successors, nearest first (ascending keys)."""
    return sorted(key for key, _, _ in table.entries if key > table.owner)


def pred_keys(table: TableView) -> list[Key]:
    """KEY(PRED(E)): predecessors, nearest first (descending keys)."""
    return sorted((key for key, _, _ in table.entries if key < table.owner), reverse=True)


def _dic_greater(seq_a: Sequence[Key], seq_b: Sequence[Key], *, descending: bool) -> bool:
    """seq_a >dic seq_b by distance from the owner (nearest-first sequences)."""
    for key_a, key_b in zip(seq_a, seq_b, strict=False):
        if key_a != key_b:
            return key_a < key_b if descending else key_a > key_b
    return len(seq_a) < len(seq_b)


def propositions(e: TableView, f: TableView) -> tuple[bool, ...]:
    """(B1, ..., B10) for the pair (E, F) exactly as written in §3.4 (B10 without the SUCC tie)."""
    lmax_e, lmax_f = l_max(e), l_max(f)
    emp_e, emp_f = len(emp(e)), len(emp(f))
    b1 = lmax_e < lmax_f or (lmax_e == lmax_f and emp_e > emp_f)
    b2 = lmax_e == lmax_f and emp_e == emp_f
    sub_e, sub_f = len(sub(e)), len(sub(f))
    b3 = b2 and sub_e < sub_f
    b4 = b2 and sub_e == sub_f
    max_e, max_f = max_levels(e), max_levels(f)
    b5 = b4 and len(max_e) > len(max_f)
    b6 = b4 and len(max_e) == len(max_f)
    min_max_e = min(max_e, default=-1)
    min_max_f = min(max_f, default=-1)
    b7 = b6 and min_max_e < min_max_f
    b8 = b6 and min_max_e == min_max_f
    b9 = b8 and _dic_greater(succ_keys(e), succ_keys(f), descending=False)
    b10 = b8 and _dic_greater(pred_keys(e), pred_keys(f), descending=True)
    return (b1, b2, b3, b4, b5, b6, b7, b8, b9, b10)


def frt_leq(e: TableView, f: TableView) -> bool:
    """E ≤FRT F: F is the better table (B1 or B3 or B5 or B7 or B9 or B10', see module doc)."""
    b = propositions(e, f)
    if b[0] or b[2] or b[4] or b[6] or b[8]:
        return True
    return b[9] and succ_keys(e) == succ_keys(f)


def frt_equivalent(e: TableView, f: TableView) -> bool:
    """Neither table is ≤FRT the other (holds iff both have the same owner and keys)."""
    return not frt_leq(e, f) and not frt_leq(f, e)


def frt_compare(e: TableView, f: TableView) -> int:
    """-1 if E <FRT F, 1 if F <FRT E, 0 if equivalent."""
    if frt_leq(e, f):
        return -1
    if frt_leq(f, e):
        return 1
    return 0


def select_victim_bruteforce(
    owner: Key,
    owner_mv: int,
    entry_mvs: Mapping[Key, int],
    sticky: Iterable[Key],
    mv_bits: int,
) -> Key | None:
    """Reference filtering: try every non-sticky removal, keep the ≤FRT-maximal result."""
    table = TableView.build(owner, owner_mv, entry_mvs, mv_bits)
    pinned = set(sticky)
    best_key: Key | None = None
    best_table: TableView | None = None
    for key in sorted(entry_mvs):
        if key in pinned:
            continue
        candidate = table.without(key)
        if best_table is None or frt_leq(best_table, candidate):
            best_key, best_table = key, candidate
    return best_key


# ------------------------------------------------------------------ fast structural selection


def select_victim(table: RoutingTable) -> Key | None:
    """The entry whose removal yields the ≤FRT-maximal table (non-sticky entries only)."""
    index = victim_index(table)
    return table.keys[index] if index >= 0 else None


def victim_index(table: RoutingTable) -> int:
    """The position in ``table.keys`` of ``select_victim``'s entry, or -1 (nothing removable).

    Derivation, one priority step per proposition pair:
    B1/B2: removing an entry of a level with >= 2 entries changes neither l_max nor EMP; if no
      such candidate exists, removing a sole entry below the top level costs one empty level,
      and removing the sole top entry (lowering l_max) is the last resort.
    B3/B4: prefer removing an entry that is not in SUB.
    B5/B6, B7/B8: |MAX| and min(MAX) after the removal depend only on the entry's level; keep
      the levels minimising |MAX|, then maximising min(MAX).
    B9/B10': removing a predecessor keeps KEY(SUCC) intact, so the farthest predecessor among
      the remaining candidates goes first; with none, the farthest successor.
    """
    # Level sets are bit masks (bit l: level l), built in one pass over the per-level counts.
    counts = table.level_counts
    nonsub = table.nonsub_counts
    top = len(counts) - 1
    if top < 0:
        return -1
    keys = table.keys
    levels = table.levels
    topic = table.owner_topic
    index = table.owner_index  # keys[index - 1], keys[index]: the sticky entries
    left_level = right_level = -1  # the sticky entries' levels (-1: none on that side)
    left_nonsub = right_nonsub = False
    if index > 0:
        key = keys[index - 1]
        left_level = levels[index - 1]
        left_nonsub = not (key[1] == SUBSCRIBER and key[0] == topic)
    if index < len(keys):
        key = keys[index]
        right_level = levels[index]
        right_nonsub = not (key[1] == SUBSCRIBER and key[0] == topic)
    crowded = 0  # removable entries, on a level of >= 2 entries
    removable_below_top = 0  # removable entries, below the top level
    removable_nonsub = 0  # removable non-SUB entries
    top_removable = False
    most = second = -1  # the largest count, the largest count on another level
    n_max = 0  # levels holding ``most`` entries
    lowest = -1  # the lowest of them
    at_max = 0
    for lv in range(top + 1):
        count = counts[lv]
        removable = count
        removable_ns = nonsub[lv]
        if lv == left_level:
            removable -= 1
            if left_nonsub:
                removable_ns -= 1
        if lv == right_level:
            removable -= 1
            if right_nonsub:
                removable_ns -= 1
        bit = 1 << lv
        if removable > 0:
            if count >= 2:
                crowded |= bit
            if lv < top:
                removable_below_top |= bit
            else:
                top_removable = True
        if removable_ns > 0:
            removable_nonsub |= bit
        if count > most:
            second, most, n_max, lowest, at_max = most, count, 1, lv, bit
        elif count == most:
            n_max += 1
            at_max |= bit
        elif count > second:
            second = count
    # B1/B2
    wanted = crowded
    if not wanted:
        wanted = removable_below_top
        if not wanted:
            if not top_removable:
                return -1
            wanted = 1 << top
    # B3/B4
    want_sub = not (wanted & removable_nonsub)
    if not want_sub:
        wanted &= removable_nonsub
    # B5..B8: (|MAX|, min MAX) after removing one entry of level lv depends on lv only.
    # With k >= 2 maximal levels, removing from a maximal level leaves k - 1 of them, and the
    # lowest maximal level is the one whose removal keeps min(MAX) highest. With a unique
    # maximal level m, removing elsewhere leaves MAX = {m}; removing from m does too unless m
    # then ties with the runner-up levels (|MAX| > 1), which is worse.
    if wanted & (wanted - 1):  # more than one candidate level
        lowest_bit = 1 << lowest
        if n_max >= 2:
            if wanted & lowest_bit:
                wanted = lowest_bit
            elif wanted & at_max:
                wanted &= at_max
        elif wanted & lowest_bit and most - 1 == second:
            wanted &= ~lowest_bit
    # B9/B10': farthest predecessor, else farthest successor
    return table.scan_farthest(wanted, want_sub, index)


# ------------------------------------------------------------------ explanation (simulator reports)

_DECIDING = (
    (0, "B1 (policy 1: keep the Skip-Graph levels, l_max/EMP)"),
    (2, "B3 (policy 2: keep same-topic subscribers)"),
    (4, "B5 (policy 3: fewest most-populated levels, |MAX|)"),
    (6, "B7 (policy 3/4: highest min(MAX))"),
    (8, "B9 (policy 5: nearer successors, KEY(SUCC))"),
    (9, "B10' (policy 5: nearer predecessors, KEY(PRED))"),
)


def eviction_reason(table: RoutingTable, victim: Key) -> str:
    """Why filtering removed ``victim`` (a same-topic subscriber) rather than another entry.

    Against the best table left by removing a non-subscriber instead: the first proposition by
    which the chosen table beats it (B1 when policy 1 - l_max, EMP - keeps that entry). With no
    removable non-subscriber, against the best table left by removing another subscriber
    ("subscribers only: ..."). ``table`` still holds ``victim``. O(L^2); for simulator reports
    (``TableTrace``), not for the hot path."""
    entry_mvs = {key: table.mv_of(key) for key in table.keys}
    view = TableView.build(table.owner, table.owner_mv, entry_mvs, table.mv_bits)
    pinned = set(table.sticky_keys())
    chosen = view.without(victim)
    best: dict[bool, TableView] = {}
    for key in table.keys:
        if key in pinned or key == victim:
            continue
        candidate = view.without(key)
        is_sub = table.is_sub(key)
        if is_sub not in best or frt_leq(best[is_sub], candidate):
            best[is_sub] = candidate
    if False in best:
        alternative, prefix = best[False], ""
    elif True in best:
        alternative, prefix = best[True], "subscribers only: "
    else:
        return "no other non-sticky entry"
    b = propositions(alternative, chosen)
    for index, label in _DECIDING:
        if b[index] and (index != 9 or succ_keys(alternative) == succ_keys(chosen)):
            return prefix + label
    return prefix + "equivalent tables"
