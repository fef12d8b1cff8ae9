"""A virtual node's routing table: FRT (seed 003 §3.3-§3.4) or the plain Skip Graph baseline.

Entries are the keys of other virtual nodes with their membership vectors, kept in a sorted
list (``bisect``; at most L+1 keys) with their levels in a parallel list (scans read levels
without hashing keys) and a dict ``key -> (mv << 8 | level)``; ``owner_index``,
kept up to date by every insertion and removal, is the owner's insertion point in that list (the
number of predecessors), so the level-0 neighbours need no search. The level-0 neighbours are
the nearest entries on either side; they are the sticky entries (§3.4) and are
never filtered out. Per-level entry counts (all entries, and non-SUB entries) let
``frt.select_victim`` pick the filtering victim without building candidate tables.

``frt=True``: entry learning is unconditional; when the table exceeds ``capacity`` (L) one
entry is removed by ≤FRT filtering. ``frt=False`` (SG-TBPS baseline): an entry is kept only
while it is a Skip Graph neighbour, i.e. the nearest entry on its side among those of level
>= i for some i (the "staircase"); the size is not bounded by L.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from overlay import frt
from overlay.keys import SUBSCRIBER, Key, NodeRef, common_prefix_length

_LEVEL_MASK = 0xFF


class TableTrace:
    """What a traced table did with same-topic subscribers: every one it ever learned, and the
    last reason (``frt.eviction_reason``) for which filtering removed each evicted one."""

    __slots__ = ("evicted", "learned")

    def __init__(self) -> None:
        self.learned: set[Key] = set()
        self.evicted: dict[Key, str] = {}


class RoutingTable:
    __slots__ = (
        "capacity",
        "frt_enabled",
        "keys",
        "level_counts",
        "levels",
        "mv_bits",
        "nonsub_counts",
        "owner",
        "owner_index",
        "owner_mv",
        "owner_topic",
        "packed",
        "sub_count",
        "trace",
    )

    def __init__(self, owner: Key, owner_mv: int, *, capacity: int, frt_enabled: bool, mv_bits: int) -> None:
        self.owner = owner
        self.owner_mv = owner_mv
        self.owner_topic = owner[0]
        self.capacity = capacity
        self.frt_enabled = frt_enabled
        self.mv_bits = mv_bits
        self.keys: list[Key] = []
        self.levels: list[int] = []  # levels[i] is the level of keys[i] (scans read it without hashing keys)
        self.owner_index = 0  # the owner's insertion point in ``keys``: entries before it are predecessors
        self.packed: dict[Key, int] = {}
        self.level_counts: list[int] = []
        self.nonsub_counts: list[int] = []
        self.sub_count = 0
        self.trace: TableTrace | None = None  # set by simulator reports (paper_sweep --explain)

    # ------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, key: object) -> bool:
        return key in self.packed

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys)

    def level_of(self, key: Key) -> int:
        return self.packed[key] & _LEVEL_MASK

    def mv_of(self, key: Key) -> int:
        return self.packed[key] >> 8

    def ref(self, key: Key) -> NodeRef:
        return (key, self.packed[key] >> 8)

    def is_sub(self, key: Key) -> bool:
        return key[1] == SUBSCRIBER and key[0] == self.owner_topic

    def left0(self) -> Key | None:
        index = self.owner_index
        return self.keys[index - 1] if index > 0 else None

    def right0(self) -> Key | None:
        keys = self.keys
        index = self.owner_index
        return keys[index] if index < len(keys) else None

    def sticky_keys(self) -> list[Key]:
        keys = self.keys
        index = self.owner_index
        out = []
        if index > 0:
            out.append(keys[index - 1])
        if index < len(keys):
            out.append(keys[index])
        return out

    def level_neighbor(self, direction: int, level: int) -> Key | None:
        """Nearest entry on the ``direction`` side (+1 right, -1 left) of level >= ``level``."""
        keys = self.keys
        levels = self.levels
        index = self.owner_index
        if direction > 0:
            for i in range(index, len(keys)):
                if levels[i] >= level:
                    return keys[i]
        else:
            for i in range(index - 1, -1, -1):
                if levels[i] >= level:
                    return keys[i]
        return None

    def keys_between(self, lo: Key, hi: Key) -> list[Key]:
        """Entries with lo <= key < hi, ascending."""
        keys = self.keys
        return keys[bisect_left(keys, lo) : bisect_left(keys, hi)]

    def sub_entries(self) -> int:
        return self.sub_count

    def scan_farthest(self, level_mask: int, want_sub: bool, index: int) -> int:
        """The position in ``keys`` of the farthest non-sticky predecessor, else successor, of a
        level in ``level_mask`` (bit l set: level l) whose SUB membership is ``want_sub`` (the
        B9/B10' step of ``frt.select_victim``), or -1; ``index`` is the owner's insertion point
        in ``keys``."""
        keys = self.keys
        levels = self.levels
        topic = self.owner_topic
        for i in range(0, index - 1):  # keys[index - 1] is the sticky left neighbour
            if (level_mask >> levels[i]) & 1:
                key = keys[i]
                if (key[1] == SUBSCRIBER and key[0] == topic) == want_sub:
                    return i
        for i in range(len(keys) - 1, index, -1):  # keys[index] is the sticky right neighbour
            if (level_mask >> levels[i]) & 1:
                key = keys[i]
                if (key[1] == SUBSCRIBER and key[0] == topic) == want_sub:
                    return i
        return -1

    # ------------------------------------------------------------ mutation

    def _insert(self, key: Key, mv: int) -> None:
        if self.trace is not None and self.is_sub(key):
            self.trace.learned.add(key)
        level = common_prefix_length(self.owner_mv, mv, self.mv_bits)
        keys = self.keys
        at = bisect_left(keys, key)
        keys.insert(at, key)
        self.levels.insert(at, level)
        if at < self.owner_index or (at == self.owner_index and key < self.owner):
            self.owner_index += 1
        self.packed[key] = (mv << 8) | level
        counts = self.level_counts
        if level >= len(counts):
            grow = level + 1 - len(counts)
            counts.extend([0] * grow)
            self.nonsub_counts.extend([0] * grow)
        counts[level] += 1
        if key[1] == SUBSCRIBER and key[0] == self.owner_topic:
            self.sub_count += 1
        else:
            self.nonsub_counts[level] += 1

    def remove(self, key: Key) -> bool:
        packed = self.packed.pop(key, None)
        if packed is None:
            return False
        self._unlink(bisect_left(self.keys, key), key, packed)
        return True

    def remove_at(self, index: int) -> Key:
        """Remove the entry ``keys[index]`` (no search); returns its key."""
        key = self.keys[index]
        self._unlink(index, key, self.packed.pop(key))
        return key

    def _unlink(self, at: int, key: Key, packed: int) -> None:
        keys = self.keys
        del keys[at]
        del self.levels[at]
        if at < self.owner_index:
            self.owner_index -= 1
        level = packed & _LEVEL_MASK
        counts = self.level_counts
        counts[level] -= 1
        if key[1] == SUBSCRIBER and key[0] == self.owner_topic:
            self.sub_count -= 1
        else:
            self.nonsub_counts[level] -= 1
        while counts and counts[-1] == 0:
            counts.pop()
            self.nonsub_counts.pop()

    def add(self, ref: NodeRef) -> bool:
        """Entry learning (+ filtering). True iff ``key`` is newly present afterwards."""
        key, mv = ref
        if key == self.owner:
            return False
        current = self.packed.get(key)
        if current is not None:
            if current >> 8 == mv:
                return False
            self.remove(key)  # same key, new incarnation: re-learn its membership vector
        self._insert(key, mv)
        if self.frt_enabled:
            if len(self.keys) > self.capacity:
                index = frt.victim_index(self)
                if index >= 0:
                    victim = self.keys[index]
                    if self.trace is not None and self.is_sub(victim):
                        self.trace.evicted[victim] = frt.eviction_reason(self, victim)
                    self.remove_at(index)
                    return victim != key
        else:
            self._prune_to_skip_graph()
            return key in self.packed
        return True

    def _prune_to_skip_graph(self) -> None:
        keys = self.keys
        levels = self.levels
        index = self.owner_index
        drop: list[Key] = []
        best = -1
        for i in range(index, len(keys)):
            level = levels[i]
            if level > best:
                best = level
            else:
                drop.append(keys[i])
        best = -1
        for i in range(index - 1, -1, -1):
            level = levels[i]
            if level > best:
                best = level
            else:
                drop.append(keys[i])
        for key in drop:
            self.remove(key)

    def remove_peer(self, peer: object) -> list[Key]:
        gone = [key for key in self.keys if key[2] == peer]
        for key in gone:
            self.remove(key)
        return gone
