"""Scribe baseline: topic multicast trees on a Pastry-style prefix-routing DHT (seed 003 §2, §4).

The comparison system of seed 003's evaluation (Castro et al., Scribe on Rowstron & Druschel's
Pastry), written as an ``overlay.api.OverlayCore`` so it runs in the same simulator as the
proposed system and SG-TBPS.

Pastry part: each node has a random ``ID_BITS``-bit id read as base ``2**digit_bits`` digits, a
routing table (row = length of the shared prefix, column = next digit) and a leaf set of the
``leaf_half`` (default ``LEAF_HALF``) numerically closest ids on each side of the ring.
``route(key)`` forwards to the leaf closest to the key when the key lies within the leaf set,
otherwise to the routing-table entry sharing one more digit with the key, otherwise (rare case)
to any known node that shares as long a prefix and is numerically closer; the node numerically
closest to the key is its root.
Join: the newcomer routes JOIN to its own id through a contact; every node on the path sends it
its state (routing entries and leaf set), the root marks its reply final; the newcomer then
announces itself to every node it knows. Leaf sets are exchanged periodically
(``leafset_period_s``, only while a node's leaf set changed since its last exchange) so that
concurrent joins converge and a settled static overlay is quiet. Tables are therefore the result of the
protocol's own messages (no oracle). Proximity-aware entry choice is not modelled (there is no
geography in the simulator): a slot keeps the first node learned for it.

Scribe part: a topic's key is a hash of its name; its root is the key's Pastry root. A subscriber
routes SUBSCRIBE toward the key; every node on the way adds the previous hop as a child and stops
forwarding if it already was in the tree. A publish is routed to the root (PUBLISH) and then sent
down the tree (MULTICAST). Path length (``Deliver.hops``) = publisher → root hops + root →
subscriber tree depth, which is what seed 003's comparison of per-subscriber path lengths implies
(Scribe's optional "publisher caches the root" shortcut is not used). Leaving subscribers prune
themselves (UNSUBSCRIBE) when they have no children. Tree repair after crashes (Scribe's
heartbeats) is not modelled: this baseline is used for path lengths on a stable overlay.

``ScribeConfig`` also has the other set-ups measured for issue #18 (Pastry's row-wise join,
tables without later maintenance, smaller leaf sets, Overlay Weaver's bidirectional tree
multicast, a cached root); the defaults are the behaviour described above.

Size: one baseline system, Pastry and Scribe together (join, routing, leaf sets, trees), with
the ScribeConfig set-ups issue #18 measures; its message types are small frozen dataclasses.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace
from typing import Any

from overlay.api import (
    Action,
    Bootstrap,
    Deliver,
    Event,
    JoinTopic,
    LeaveTopic,
    PeerId,
    PeerUnreachable,
    Publish,
    Receive,
    Role,
    Send,
    Shutdown,
    Tick,
)

__all__ = [
    "DIGIT_BITS",
    "ID_BITS",
    "LEAF_HALF",
    "ScribeConfig",
    "ScribeNode",
    "topic_key",
]

ID_BITS = 32
DIGIT_BITS = 4  # Pastry's usual b; ScribeConfig.digit_bits overrides it
LEAF_HALF = 8
_RING = 1 << ID_BITS

Contact = tuple[int, PeerId]  # (pastry id, peer id)


def topic_key(topic: str) -> int:
    """The Pastry key of a topic (a stable hash of its name)."""
    return int.from_bytes(hashlib.blake2b(topic.encode(), digest_size=8).digest(), "big") % _RING


def _digit(value: int, index: int, digit_bits: int) -> int:
    return (value >> (ID_BITS - digit_bits * (index + 1))) & ((1 << digit_bits) - 1)


def _shared_prefix(a: int, b: int, digit_bits: int) -> int:
    diff = a ^ b
    if diff == 0:
        return ID_BITS // digit_bits
    return (ID_BITS - diff.bit_length()) // digit_bits


def _ring_distance(a: int, b: int) -> int:
    d = (a - b) % _RING
    return min(d, _RING - d)


JOIN_STATES = ("all", "rows", "self")
PUBLISH_MODES = ("root", "tree")


@dataclass(frozen=True, slots=True)
class ScribeConfig:
    """Parameters of the Pastry/Scribe baseline.

    The defaults are the baseline of docs/overlay-reproduction.md; the other values are the
    set-ups measured for issue #18 (Scribe's spread of path lengths; Overlay Weaver's Pastry and
    Mcast are the reference for "rows", leaf_half=4 and "tree"):

    * ``join_state``: what each node on a JOIN's route sends the newcomer. "all": every contact it
      knows (routing table and leaf set). "rows": Pastry's join as the paper and Overlay Weaver do
      it: the rows the newcomer can use from that node (from one past the previous hop's shared
      prefix with the newcomer up to its own; row 0 from the first hop, every row from the last),
      the last node also its leaf set. "self": only itself (the last node also its leaf set), so
      the newcomer's table holds the nodes it has seen. In every mode the route's nodes learn the
      newcomer only from its announcement (Overlay Weaver merges it at once, which deadlocks
      concurrent joins here: a JOIN routed to a newcomer still joining waits for that join).
    * ``announce``: the newcomer tells every node it learned about itself (Pastry's last join step).
    * ``learn_from_traffic``: leaf-set exchanges and SUBSCRIBE messages also fill routing-table
      slots (else they only update leaf sets / nothing): with False and "rows", routing tables
      hold only what joins copied and announced (no later maintenance).
    * ``leaf_half``: leaf-set entries on each side (Pastry's L/2; Overlay Weaver's default is 4).
    * ``publish_mode``: "root": the publish is routed to the topic's root and sent down the tree
      (Scribe). "tree": the publisher joins the topic's tree and the message floods along tree
      edges from it, up and down (Overlay Weaver's Mcast: "bi-directional, not one-way from a
      rendezvous point"); a path is then the tree distance between publisher and subscriber.
    * ``cache_root``: "root" mode only: the root tells the publisher its address after the first
      publish, and later publishes go to it in one hop (Scribe's optional cache).
    * ``max_children``: Scribe's bottleneck remover without a proximity metric (0: off). A node
      that gets more children than this in a topic's tree hands the newest one to one of its
      other children (chosen by a hash of the two ids), which adopts it (and may pass it on).
    """

    leafset_period_s: float = 5.0
    digit_bits: int = DIGIT_BITS  # Pastry's b: ids are read as base 2**b digits
    join_state: str = "all"
    announce: bool = True
    learn_from_traffic: bool = True
    leaf_half: int = LEAF_HALF
    publish_mode: str = "root"
    cache_root: bool = False
    max_children: int = 0

    def __post_init__(self) -> None:
        if self.digit_bits not in (1, 2, 4, 8):
            raise ValueError(f"ScribeConfig.digit_bits must be 1, 2, 4 or 8, got {self.digit_bits!r}")
        if self.leafset_period_s <= 0:
            raise ValueError(f"ScribeConfig.leafset_period_s must be > 0, got {self.leafset_period_s!r}")
        if self.join_state not in JOIN_STATES:
            raise ValueError(f"ScribeConfig.join_state must be one of {JOIN_STATES}, got {self.join_state!r}")
        if self.publish_mode not in PUBLISH_MODES:
            raise ValueError(
                f"ScribeConfig.publish_mode must be one of {PUBLISH_MODES}, got {self.publish_mode!r}"
            )
        if self.leaf_half < 1:
            raise ValueError(f"ScribeConfig.leaf_half must be >= 1, got {self.leaf_half!r}")
        if self.cache_root and self.publish_mode != "root":
            raise ValueError("ScribeConfig.cache_root needs publish_mode='root'")
        if self.max_children < 0:
            raise ValueError(f"ScribeConfig.max_children must be >= 0, got {self.max_children!r}")


# ------------------------------------------------------------------ messages (plain data)


@dataclass(frozen=True, slots=True)
class PastryJoin:
    joiner: Contact
    last_hop: Contact | None = None  # the node that forwarded it (None from the newcomer itself)
    kind: str = "JOIN"


@dataclass(frozen=True, slots=True)
class PastryState:
    entries: tuple[Contact, ...]
    final: bool
    kind: str = "STATE"


@dataclass(frozen=True, slots=True)
class PastryAnnounce:
    contact: Contact
    kind: str = "ANNOUNCE"


@dataclass(frozen=True, slots=True)
class PastryLeafSet:
    """A node's leaf set (and itself); ``want_reply`` asks the receiver for its own leaf set."""

    entries: tuple[Contact, ...]
    want_reply: bool
    kind: str = "LEAFSET"


@dataclass(frozen=True, slots=True)
class ScribeSubscribe:
    topic: str
    child: Contact
    kind: str = "SUBSCRIBE"


@dataclass(frozen=True, slots=True)
class ScribeUnsubscribe:
    topic: str
    child: Contact
    kind: str = "UNSUBSCRIBE"


@dataclass(frozen=True, slots=True)
class ScribePublish:
    """Routed from the publisher toward the topic's root; ``hops`` = links traversed so far."""

    topic: str
    payload: Any  # opaque to the overlay
    publication_id: int
    publisher: PeerId
    hops: int
    kind: str = "PUBLISH"


@dataclass(frozen=True, slots=True)
class ScribeMulticast:
    """Sent down the topic's tree from the root (or, ``publish_mode="tree"``, along every tree
    edge but the one it came by: ``via``); ``hops`` counts from the publisher."""

    topic: str
    payload: Any  # opaque to the overlay
    publication_id: int
    publisher: PeerId
    hops: int
    via: PeerId | None = None
    kind: str = "MULTICAST"


@dataclass(frozen=True, slots=True)
class ScribeRedirect:
    """``max_children``: a parent with too many children tells ``topic``'s newest child to attach
    below ``new_parent`` (one of its former siblings) instead."""

    topic: str
    new_parent: Contact
    kind: str = "REDIRECT"


@dataclass(frozen=True, slots=True)
class ScribeRootNotice:
    """``cache_root``: the root of ``topic`` tells a publisher its address."""

    topic: str
    root: Contact
    kind: str = "ROOT"


class ScribeNode:
    """One physical node running Pastry + Scribe (implements ``overlay.api.OverlayCore``)."""

    __slots__ = (
        "_children",
        "_leaves_changed",
        "_next_leafset_s",
        "_parent",
        "_pending",
        "_publishing",
        "_root_cache",
        "_subscribed",
        "config",
        "joined",
        "left_leaves",
        "node_id",
        "peer_id",
        "right_leaves",
        "table",
    )

    def __init__(self, peer_id: PeerId, *, rng: random.Random, config: ScribeConfig | None = None) -> None:
        self.peer_id = peer_id
        self.config = config if config is not None else ScribeConfig()
        self.node_id: int = rng.getrandbits(ID_BITS)
        bits = self.config.digit_bits
        self.table: list[list[Contact | None]] = [[None] * (1 << bits) for _ in range(ID_BITS // bits)]
        self.left_leaves: list[tuple[int, Contact]] = []  # (ccw distance, contact), closest first
        self.right_leaves: list[tuple[int, Contact]] = []  # (cw distance, contact), closest first
        self.joined = False
        self._pending: list[Event] = []  # held until this node has joined
        self._children: dict[str, dict[PeerId, Contact]] = {}
        self._parent: dict[str, Contact] = {}
        self._subscribed: set[str] = set()
        self._publishing: set[str] = set()  # publish_mode="tree": topics whose tree we joined to publish
        self._root_cache: dict[str, Contact] = {}  # cache_root: topic -> its root
        self._next_leafset_s: float | None = None
        self._leaves_changed = True

    # ------------------------------------------------------------------ OverlayCore

    def handle(self, event: Event, now: float) -> list[Action]:
        out: list[Action] = []
        if isinstance(event, Receive):
            self._on_message(event.message, now, out)
        elif isinstance(event, Tick):
            if self._next_leafset_s is not None and now >= self._next_leafset_s:
                self._next_leafset_s = now + self.config.leafset_period_s
                if self._leaves_changed:  # a settled leaf set is not re-sent (static membership)
                    self._leaves_changed = False
                    self._send_leafset(out)
        elif isinstance(event, Bootstrap):
            if event.contacts:
                out.append(Send(event.contacts[0], PastryJoin((self.node_id, self.peer_id))))
            else:
                self.joined = True
            self._next_leafset_s = now + self.config.leafset_period_s
        elif not self.joined and isinstance(event, JoinTopic | LeaveTopic | Publish):
            self._pending.append(event)
        elif isinstance(event, JoinTopic):
            if event.role == Role.SUBSCRIBER:
                self._subscribe(event.topic, out)
            elif self.config.publish_mode == "tree":
                self._publishing.add(event.topic)
                self._enter_tree(event.topic, out)
        elif isinstance(event, LeaveTopic):
            if event.role == Role.SUBSCRIBER:
                self._subscribed.discard(event.topic)
                self._prune(event.topic, out)
        elif isinstance(event, Publish):
            if self.config.publish_mode == "tree":
                m = ScribeMulticast(event.topic, event.payload, event.publication_id, self.peer_id, 0)
                self._flood(m, out)
                return out
            message = ScribePublish(event.topic, event.payload, event.publication_id, self.peer_id, 0)
            cached = self._root_cache.get(event.topic)
            if cached is not None and cached[1] != self.peer_id:
                out.append(Send(cached[1], replace(message, hops=1)))
            else:
                self._route_publish(message, out)
        elif isinstance(event, Shutdown):
            for topic in list(self._subscribed):
                self._subscribed.discard(topic)
                self._prune(topic, out)
            self._next_leafset_s = None
        elif isinstance(event, PeerUnreachable):
            self._forget(event.peer)
        else:
            raise TypeError(f"ScribeNode cannot handle event {event!r}")
        return out

    def next_deadline(self) -> float | None:
        return self._next_leafset_s

    # ------------------------------------------------------------------ inspection

    def known_contacts(self) -> list[Contact]:
        """Every node in the routing table or leaf set (deduplicated, deterministic order)."""
        seen: dict[int, Contact] = {}
        for row in self.table:
            for entry in row:
                if entry is not None:
                    seen.setdefault(entry[0], entry)
        for _, entry in self.left_leaves:
            seen.setdefault(entry[0], entry)
        for _, entry in self.right_leaves:
            seen.setdefault(entry[0], entry)
        return list(seen.values())

    def children(self, topic: str) -> list[PeerId]:
        """This node's children in ``topic``'s multicast tree."""
        return list(self._children.get(topic, {}))

    def is_root_of(self, key: int) -> bool:
        """Whether this node considers itself the root of ``key``."""
        return self.next_hop(key) is None

    def next_hop(self, key: int) -> Contact | None:
        """Pastry's routing step for ``key``; None when this node is the key's root."""
        own = self.node_id
        if key == own:
            return None
        own_distance = _ring_distance(own, key)
        best: Contact | None = None
        if self._leafset_covers(key):
            best_rank = (own_distance, own)
            for _, entry in self.left_leaves:
                rank = (_ring_distance(entry[0], key), entry[0])
                if rank < best_rank:
                    best_rank, best = rank, entry
            for _, entry in self.right_leaves:
                rank = (_ring_distance(entry[0], key), entry[0])
                if rank < best_rank:
                    best_rank, best = rank, entry
            return best
        bits = self.config.digit_bits
        prefix = _shared_prefix(own, key, bits)
        slot = self.table[prefix][_digit(key, prefix, bits)]
        if slot is not None:
            return slot
        # Pastry's rare case: a known node sharing as long a prefix and numerically closer; failing
        # that (a routing-table hole), any numerically closer node, so routing always progresses.
        best = None
        best_rank = (own_distance, own)
        fallback: Contact | None = None
        fallback_rank = best_rank
        for candidate in self.known_contacts():
            rank = (_ring_distance(candidate[0], key), candidate[0])
            if _shared_prefix(candidate[0], key, bits) >= prefix:
                if rank < best_rank:
                    best_rank, best = rank, candidate
            elif rank < fallback_rank:
                fallback_rank, fallback = rank, candidate
        return best if best is not None else fallback

    # ------------------------------------------------------------------ Pastry

    def _leafset_covers(self, key: int) -> bool:
        half = self.config.leaf_half
        if len(self.left_leaves) < half or len(self.right_leaves) < half:
            return True  # a leaf set that is not full knows the whole (small) ring on that side
        ccw = (self.node_id - key) % _RING
        cw = (key - self.node_id) % _RING
        return ccw <= self.left_leaves[-1][0] or cw <= self.right_leaves[-1][0]

    def _learn(self, contact: Contact, table: bool = True) -> None:
        """Merge ``contact`` into the leaf set and (``table``) an empty routing-table slot."""
        node_id = contact[0]
        own = self.node_id
        if node_id == own:
            return
        if table:
            bits = self.config.digit_bits
            prefix = _shared_prefix(own, node_id, bits)
            row = self.table[prefix]
            column = _digit(node_id, prefix, bits)
            if row[column] is None:
                row[column] = contact
        cw = (node_id - own) % _RING
        half = self.config.leaf_half
        if self._insert_leaf(self.right_leaves, cw, contact, half):
            self._leaves_changed = True
        if self._insert_leaf(self.left_leaves, _RING - cw, contact, half):
            self._leaves_changed = True

    @staticmethod
    def _insert_leaf(leaves: list[tuple[int, Contact]], distance: int, contact: Contact, half: int) -> bool:
        """Insert ``contact`` if it is among the ``half`` closest; True when the set changed."""
        if len(leaves) >= half and distance >= leaves[-1][0]:
            return False
        for _, entry in leaves:
            if entry[0] == contact[0]:
                return False
        for index, (existing, _) in enumerate(leaves):
            if distance < existing:
                leaves.insert(index, (distance, contact))
                break
        else:
            leaves.append((distance, contact))
        del leaves[half:]
        return True

    def _forget(self, peer: PeerId) -> None:
        for row in self.table:
            for column, entry in enumerate(row):
                if entry is not None and entry[1] == peer:
                    row[column] = None
        self.left_leaves = [item for item in self.left_leaves if item[1][1] != peer]
        self.right_leaves = [item for item in self.right_leaves if item[1][1] != peer]
        self._leaves_changed = True

    def _state_entries(self) -> tuple[Contact, ...]:
        return (*self.known_contacts(), (self.node_id, self.peer_id))

    def _self_entries(self, joiner: Contact, final: bool) -> tuple[Contact, ...]:
        """join_state="self": this node only, and its leaf set from the last hop."""
        leaves = (*self.left_leaves, *self.right_leaves) if final else ()
        entries = {entry[0]: entry for _, entry in leaves if entry[0] != joiner[0]}
        return (*entries.values(), (self.node_id, self.peer_id))

    def _row_entries(self, joiner: Contact, last_hop: Contact | None, final: bool) -> tuple[Contact, ...]:
        """join_state="rows": the routing-table rows the newcomer can use from this node (Pastry;
        Overlay Weaver's UPDATE_ROUTING_TABLE): from one past the previous hop's shared prefix
        with the newcomer (row 0 at the first hop) up to our own shared prefix, every row at the
        last hop, which adds its leaf set; and this node itself."""
        bits = self.config.digit_bits
        rows = len(self.table)
        start = 0 if last_hop is None else _shared_prefix(last_hop[0], joiner[0], bits) + 1
        end = rows - 1 if final else min(_shared_prefix(self.node_id, joiner[0], bits), rows - 1)
        entries: dict[int, Contact] = {}
        for row in self.table[start : end + 1]:
            for entry in row:
                if entry is not None and entry[0] != joiner[0]:
                    entries.setdefault(entry[0], entry)
        if final:
            for _, entry in (*self.left_leaves, *self.right_leaves):
                if entry[0] != joiner[0]:
                    entries.setdefault(entry[0], entry)
        return (*entries.values(), (self.node_id, self.peer_id))

    def _leafset_message(self, want_reply: bool) -> PastryLeafSet:
        entries = (
            *(entry for _, entry in self.left_leaves),
            *(entry for _, entry in self.right_leaves),
            (self.node_id, self.peer_id),
        )
        return PastryLeafSet(entries, want_reply)

    def _send_leafset(self, out: list[Action]) -> None:
        if not self.joined:
            return
        message = self._leafset_message(want_reply=True)
        targets = {entry[1]: None for entry in message.entries[:-1]}
        for peer in targets:
            out.append(Send(peer, message))

    def _on_message(self, message: object, now: float, out: list[Action]) -> None:
        if isinstance(message, ScribeMulticast):
            self._on_multicast(message, out)
        elif isinstance(message, ScribePublish):
            self._route_publish(message, out)
        elif isinstance(message, ScribeSubscribe):
            self._on_subscribe(message, out)
        elif isinstance(message, ScribeUnsubscribe):
            children = self._children.get(message.topic)
            if children is not None:
                children.pop(message.child[1], None)
                self._prune(message.topic, out)
        elif isinstance(message, PastryJoin):
            if not self.joined:
                self._pending.append(Receive(message.joiner[1], message))  # route it once joined
                return
            joiner = message.joiner
            hop = self.next_hop(joiner[0])
            if hop is not None and hop[1] == joiner[1]:
                hop = None
            if self.config.join_state == "rows":
                entries = self._row_entries(joiner, message.last_hop, final=hop is None)
            elif self.config.join_state == "self":
                entries = self._self_entries(joiner, final=hop is None)
            else:
                entries = self._state_entries()
            out.append(Send(joiner[1], PastryState(entries, final=hop is None)))
            if hop is not None:
                out.append(Send(hop[1], replace(message, last_hop=(self.node_id, self.peer_id))))
        elif isinstance(message, PastryState):
            for entry in message.entries:
                self._learn(entry)
            if message.final and not self.joined:
                self.joined = True
                if self.config.announce:
                    announce = PastryAnnounce((self.node_id, self.peer_id))
                    for entry in self.known_contacts():
                        out.append(Send(entry[1], announce))
                pending, self._pending = self._pending, []
                for event in pending:
                    out.extend(self.handle(event, now))
        elif isinstance(message, PastryAnnounce):
            self._learn(message.contact)
        elif isinstance(message, PastryLeafSet):
            table = self.config.learn_from_traffic
            for entry in message.entries:
                self._learn(entry, table)
            if message.want_reply and self.joined:
                out.append(Send(message.entries[-1][1], self._leafset_message(want_reply=False)))
        elif isinstance(message, ScribeRootNotice):
            self._root_cache[message.topic] = message.root
        elif isinstance(message, ScribeRedirect):
            if message.topic in self._children:  # still on the tree: attach below the sibling
                self._parent[message.topic] = message.new_parent
                child = ScribeSubscribe(message.topic, (self.node_id, self.peer_id))
                out.append(Send(message.new_parent[1], child))
        else:
            raise TypeError(f"ScribeNode received an unknown message {message!r}")

    # ------------------------------------------------------------------ Scribe

    def _subscribe(self, topic: str, out: list[Action]) -> None:
        self._subscribed.add(topic)
        self._enter_tree(topic, out)

    def _enter_tree(self, topic: str, out: list[Action]) -> None:
        if topic in self._children:
            return  # already on the tree (forwarder or root)
        self._children[topic] = {}
        self._join_tree(topic, out)

    def _join_tree(self, topic: str, out: list[Action]) -> None:
        hop = self.next_hop(topic_key(topic))
        if hop is None:
            return  # this node is the root
        self._parent[topic] = hop
        out.append(Send(hop[1], ScribeSubscribe(topic, (self.node_id, self.peer_id))))

    def _on_subscribe(self, message: ScribeSubscribe, out: list[Action]) -> None:
        topic = message.topic
        if self.config.learn_from_traffic:
            self._learn(message.child)
        children = self._children.get(topic)
        if children is not None:
            children[message.child[1]] = message.child
            limit = self.config.max_children
            if limit and len(children) > limit:
                self._shed_child(topic, children, message.child, out)
            return
        self._children[topic] = {message.child[1]: message.child}
        self._join_tree(topic, out)

    def _shed_child(
        self, topic: str, children: dict[PeerId, Contact], newest: Contact, out: list[Action]
    ) -> None:
        """``max_children``: hand the newest child to a former sibling (a stable hash picks which)."""
        del children[newest[1]]
        siblings = sorted(children.values())
        digest = hashlib.blake2b(f"{newest[0]}:{topic}".encode(), digest_size=8).digest()
        sibling = siblings[int.from_bytes(digest, "big") % len(siblings)]
        out.append(Send(newest[1], ScribeRedirect(topic, sibling)))

    def _prune(self, topic: str, out: list[Action]) -> None:
        children = self._children.get(topic)
        if children is None or children or topic in self._subscribed or topic in self._publishing:
            return
        del self._children[topic]
        parent = self._parent.pop(topic, None)
        if parent is not None:
            out.append(Send(parent[1], ScribeUnsubscribe(topic, (self.node_id, self.peer_id))))

    def _route_publish(self, message: ScribePublish, out: list[Action]) -> None:
        hop = self.next_hop(topic_key(message.topic))
        if hop is not None:
            out.append(Send(hop[1], replace(message, hops=message.hops + 1)))
            return
        m = message
        if self.config.cache_root and m.publisher != self.peer_id:
            out.append(Send(m.publisher, ScribeRootNotice(m.topic, (self.node_id, self.peer_id))))
        self._on_multicast(ScribeMulticast(m.topic, m.payload, m.publication_id, m.publisher, m.hops), out)

    def _on_multicast(self, message: ScribeMulticast, out: list[Action]) -> None:
        topic = message.topic
        m = message
        if topic in self._subscribed:
            out.append(Deliver(topic, m.payload, m.publication_id, m.publisher, m.hops))
        if self.config.publish_mode == "tree":
            self._flood(m, out)
            return
        children = self._children.get(topic)
        if not children:
            return
        down = replace(m, hops=m.hops + 1)
        for peer in children:
            out.append(Send(peer, down))

    def _flood(self, message: ScribeMulticast, out: list[Action]) -> None:
        """publish_mode="tree": forward along every tree edge (parent and children) but the one
        the message came by."""
        topic = message.topic
        onward = replace(message, hops=message.hops + 1, via=self.peer_id)
        parent = self._parent.get(topic)
        if parent is not None and parent[1] != message.via:
            out.append(Send(parent[1], onward))
        for peer in self._children.get(topic, {}):
            if peer != message.via:
                out.append(Send(peer, onward))
