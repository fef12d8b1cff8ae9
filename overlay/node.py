"""OverlayNode: one physical node (broker) of SG-TBPS with Flexible Routing Tables (seed 003 §3).

Implements ``overlay.api.OverlayCore`` (sans-I/O: events and ``now`` in, actions out; the only
randomness is the ``rng`` passed in). A physical node holds many virtual nodes keyed
``(topic, role, peer_id)`` (§3.2), each with its own routing table (``overlay.table``):

* join (§3.5.2): greedy SEARCH for the insertion position, both level-0 neighbours become
  sticky entries, REXP(level 0) to both; after ``eexp_delay_s`` an EEXP to the topic's
  subscriber range, later random-walk EEXPs while the table holds fewer than L entries;
* leave (§3.5.3): a subscriber sends UNSUB by range multicast to the publisher range; every
  virtual node unlinks with LEAVE to its level-0 neighbours;
* publish (§3.5.4): PUB by range multicast (``overlay.multicast``) to the subscriber range, plus
  an EEXP to that range while the table is short of entries;
* periodic (§3.5.5): REXP(level 0) to both level-0 neighbours every ``rexp_interval_s``;
* receipt (§3.5.6): NEW when absent from the existing-entry list, REXP level rule, EEXP
  decrement, UNSUB removal, learning of sender and forwarder (never UNSUB's sender);
* rendezvous point (§3.2): the publisher whose right level-0 neighbour is not a publisher of
  its topic watches that neighbour; when subscriber presence changes it multicasts PRESENCE
  to the publisher range, yielding ``api.SubscriberPresence`` at every publisher;
* formation (``overlay.formation``, SkipMQ's decision): a seed (a peer listed in its own
  contacts) with no virtual node probes every contact each ``formation_round_s``, joins any
  overlay that answers, and founds one as the lowest reachable seed; a seed alone in its overlay
  keeps probing and yields to another overlay (lonely-split repair);
* crashes: peers hosting level-0 neighbours are probed (PING) and declared dead after
  ``failure_timeout_s`` of silence; PUB/UNSUB delegations are acknowledged per hop and
  re-delegated on timeout or GONE; subscribers drop duplicate publications.

Everything the paper leaves open is decided in docs/overlay.md.

Size: the OverlayNode of seed 003 - join (REXP/EEXP/NEW), publish (PUB with the FRT multicast
and end-to-end DONE) and maintenance (ping, repair, UNSUB/LEAVE) share the virtual nodes' state
and the action list; design.md proposes splitting it by concern, left for the overlay-fidelity
issue (its scripted and simulated tests pin the behaviour first).
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from overlay import messages as m
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
    PublishDone,
    Receive,
    Send,
    Shutdown,
    SubscriberPresence,
    Tick,
)
from overlay.config import OverlayConfig
from overlay.formation import Formation, should_yield
from overlay.keys import (
    ANCHOR_TOPIC,
    PUBLISHER,
    SUBSCRIBER,
    Key,
    NodeRef,
    make_key,
    random_index,
    random_membership_vector,
    run_bounds,
)
from overlay.multicast import Delegation, plan_delegation, route_toward_range
from overlay.skipgraph import (
    farthest_same_run_right,
    is_rendezvous_candidate,
    peer_search_step,
    rexp_next_hop,
    search_answer,
)
from overlay.table import RoutingTable

_T_REXP = 0
_T_EEXP_RANGE = 1
_T_EEXP_RANDOM = 2
_T_SEARCH = 3
_T_PING = 4
_T_ACK = 5
_T_LINK = 6
_T_NOTICE = 7
_T_DONE = 8
_T_DONE_RETRY = 9
_T_VERIFY = 10


def _check_topic(topic: object) -> None:
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, got {type(topic).__name__}")
    if topic == ANCHOR_TOPIC:
        raise ValueError("topic must be non-empty (the empty topic is reserved for the per-peer anchor)")


class VirtualNode:
    """One (topic, role, peer) member of the Skip Graph with its routing table."""

    __slots__ = (
        "confirmed",
        "key",
        "last_publish_eexp",
        "left0",
        "link_tries",
        "loose_left_from",
        "loose_left_until",
        "loose_right_from",
        "loose_right_until",
        "mv",
        "random_rounds",
        "ref",
        "right0",
        "rp_present",
        "seen",
        "table",
        "verify_rounds",
    )

    def __init__(self, key: Key, mv: int, config: OverlayConfig) -> None:
        self.key = key
        self.mv = mv
        self.ref: NodeRef = (key, mv)
        self.table = RoutingTable(
            key, mv, capacity=config.table_size, frt_enabled=config.frt_enabled, mv_bits=config.mv_bits
        )
        self.left0: Key | None = None
        self.right0: Key | None = None
        self.confirmed: set[Key] = set()  # level-0 neighbours that answered our LINK/REXP
        self.link_tries = 0
        # until then a level-0 neighbour that moved farther away (crash, give-up, GONE; not a
        # graceful LEAVE, which names the replacement) may hide live nodes in between: the
        # nodes behind a crashed one re-link only after their own failure detection
        # (ends early when a neighbour at least as near as the lost one, ``*_from``, is back)
        self.loose_left_until = float("-inf")
        self.loose_right_until = float("-inf")
        self.loose_left_from: Key | None = None
        self.loose_right_from: Key | None = None
        self.rp_present: bool | None = None  # None: not the rendezvous point
        self.seen: dict[tuple[Key, int], None] = {}
        self.random_rounds = 0
        self.verify_rounds = 0  # position checks done (see OverlayNode._verify_position)
        self.last_publish_eexp = float("-inf")


class _PendingJoin:
    __slots__ = ("first_hop", "key", "mv", "request_id", "waiting")

    def __init__(self, key: Key, mv: int, request_id: int) -> None:
        self.key = key
        self.mv = mv
        self.request_id = request_id
        self.waiting = False  # held back while another join of this peer runs the formation rounds
        self.first_hop: Key | None = None  # where this peer's own vnode sent the current search


class _PublishTask:
    """End-to-end completion of one PUB handled here (``publish_done_enabled``).

    ``upstream`` is (peer, ack id) of the delegation to answer with DONE, or None for this
    peer's own ``Publish`` (answered with ``api.PublishDone``); ``also`` holds the ack ids of
    retransmissions of the same delegation, answered together. ``waiting`` maps each open
    delegation (slot = its first ack id) to its forwarding virtual node, its latest PUB and all
    ack ids it was sent with (retransmissions get new ones). ``ident`` names the delegation
    received (virtual node, publisher key, publication id, lo, hi)."""

    __slots__ = (
        "also",
        "finished",
        "ident",
        "publication_id",
        "reached",
        "succeeded",
        "topic",
        "upstream",
        "waiting",
    )

    def __init__(
        self, upstream: tuple[PeerId, int] | None, topic: str, publication_id: int, ident: Any = None
    ) -> None:
        self.upstream = upstream
        self.also: list[tuple[PeerId, int]] = []
        self.topic = topic
        self.publication_id = publication_id
        self.ident = ident
        self.waiting: dict[int, tuple[VirtualNode, m.PUB, list[int]]] = {}
        self.finished = False
        self.succeeded = False
        self.reached = False  # a delegation of it went to another peer (``PublishDone.reached``)


class OverlayNode:
    """A physical node; see the module docstring and docs/overlay.md."""

    def __init__(self, peer_id: PeerId, *, rng: random.Random, config: OverlayConfig) -> None:
        self.peer_id = peer_id
        self.rng = rng
        self.config = config
        self.vnodes: dict[Key, VirtualNode] = {}
        self.contacts: tuple[PeerId, ...] = ()
        self.bootstrapped = False
        # formation (overlay.formation): a seed (listed in its own contacts) may found the overlay
        self.seed = False
        self.founded = False  # this peer founded its overlay by the formation rule (inspection)
        self.formation = Formation(config.formation_rounds)
        self.formation_key: Key | None = None  # the pending join that runs the formation rounds
        self.join_via: PeerId | None = None  # a peer in the overlay to join (after a yield)
        self.lonely_probe: int | None = None  # request id of the last probe of a lonely seed
        self.unheard: set[PeerId] = set()  # a seed's contacts never heard from (probed while joined)
        self.unheard_probes: dict[int, PeerId] = {}  # request id of this round's probe -> contact
        self.deferred: list[Event] = []
        self.pending: dict[Key, _PendingJoin] = {}
        self.requests: dict[int, Key] = {}
        self.verifying: dict[int, tuple[Key, float]] = {}  # verification search -> (vnode, until)
        self.pending_publishes: dict[str, list[tuple[Publish, float]]] = {}  # (event, time queued)
        self.done_slots: dict[int, tuple[_PublishTask, int]] = {}  # PUB ack id -> (task, slot)
        self.done_tasks: dict[Any, _PublishTask] = {}  # received delegation -> its task (for a while)
        self.presence: dict[str, bool] = {}
        self.last_heard: dict[PeerId, float] = {}
        self.recent_peers: dict[PeerId, None] = {}  # fallback contacts for a later re-join
        self.probes: dict[PeerId, int] = {}  # PINGs sent since the peer was last heard
        self.dead: dict[PeerId, float] = {}
        # entries removed when a peer was declared dead, restored if it turns out alive
        self.buried: dict[PeerId, list[tuple[Key, NodeRef]]] = {}
        # departed virtual nodes (GONE, LEAVE, UNSUB): hearsay about that incarnation (same
        # membership vector) is ignored for dead_peer_memory_s, so two neighbours that both
        # still list it cannot keep re-teaching it to each other (LINK/GONE/NEW storm)
        self.tombstones: dict[Key, tuple[int, float]] = {}
        self.outstanding: dict[int, tuple[VirtualNode, Any, int]] = {}  # ack id -> (from, msg, tries)
        self.timers: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._ids = 0
        self._ping_scheduled = False
        self.now = 0.0
        self._graceful = False  # handling a LEAVE (its replacement is authoritative)
        self._out: list[Action] = []
        self._local: deque[Any] = deque()
        # the other kinds (NEW, EEXP, REXP, SEARCH, LINK) are called directly: _handle_message
        self._dispatch: dict[type, Callable[[PeerId, Any], None]] = {
            m.PUB: self._on_pub,
            m.UNSUB: self._on_unsub,
            m.FOUND: self._on_found,
            m.SEARCH_FAIL: self._on_search_fail,
            m.LEAVE: self._on_leave,
            m.PRESENCE: self._on_presence,
            m.PRESENCE_QUERY: self._on_presence_query,
            m.PING: self._on_ping,
            m.PONG: self._on_pong,
            m.GONE: self._on_gone,
            m.ACK: self._on_ack,
            m.DONE: self._on_done,
        }

    # ================================================================ driver interface

    def handle(self, event: Event, now: float) -> list[Action]:
        if isinstance(event, Receive):
            return self.receive(event.sender, event.message, now)
        self.now = now
        out: list[Action] = []
        self._out = out
        if isinstance(event, Tick):
            self._tick()
        elif isinstance(event, Publish):
            _check_topic(event.topic)
            self._publish(event)
        elif isinstance(event, JoinTopic):
            _check_topic(event.topic)
            if self.bootstrapped:
                self._join(event.topic, int(event.role))
            else:
                self.deferred.append(event)
        elif isinstance(event, LeaveTopic):
            if self.bootstrapped:
                self._leave(make_key(event.topic, int(event.role), self.peer_id))
            else:
                self.deferred.append(event)
        elif isinstance(event, Bootstrap):
            self._bootstrap(event.contacts)
        elif isinstance(event, PeerUnreachable):
            self._declare_dead(event.peer)
        elif isinstance(event, Shutdown):
            self.deferred.clear()
            for key in list(self.pending):
                self._leave(key)
            for key in sorted(self.vnodes, key=lambda k: k[0] == ANCHOR_TOPIC):
                self._leave(key)
            for task, _ in list(self.done_slots.values()):  # nobody will wait for the rest
                self._fail_task(task)
        else:
            raise TypeError(f"unknown overlay event {event!r}")
        self._drain_local()
        return out

    def receive(self, sender: PeerId, message: Any, now: float) -> list[Action]:
        """``handle(Receive(sender, message), now)`` without building the event: the simulator's
        path for the tens of millions of messages of a large sweep."""
        self.now = now
        out: list[Action] = []
        self._out = out
        self._receive(sender, message)
        self._drain_local()
        return out

    def next_deadline(self) -> float | None:
        return self.timers[0][0] if self.timers else None

    # ================================================================ inspection (read-only)

    def virtual_keys(self) -> list[Key]:
        """Keys of the joined virtual nodes of this peer, sorted."""
        return sorted(self.vnodes)

    def level0_neighbors(self, key: Key) -> tuple[Key | None, Key | None]:
        table = self.vnodes[key].table
        return table.left0(), table.right0()

    def table_entries(self, key: Key) -> list[Key]:
        return list(self.vnodes[key].table.keys)

    def sticky_entries(self, key: Key) -> list[Key]:
        return self.vnodes[key].table.sticky_keys()

    def membership_vector(self, key: Key) -> int:
        return self.vnodes[key].mv

    def entry_level(self, key: Key, entry: Key) -> int:
        """Level (common-prefix length of membership vectors) of ``entry`` in ``key``'s table."""
        return self.vnodes[key].table.level_of(entry)

    def table_of(self, key: Key) -> RoutingTable:
        """The live table object (treat as read-only)."""
        return self.vnodes[key].table

    def is_rendezvous(self, key: Key) -> bool:
        return self.vnodes[key].rp_present is not None

    def subscriber_presence(self, topic: str) -> bool | None:
        """The last presence this peer's publisher of ``topic`` was told (None: not yet)."""
        return self.presence.get(topic)

    def reaches_only_self(self, topic: str, now: float) -> bool:
        """Whether a PUB of ``topic`` from this peer would reach no other peer's subscriber: this
        peer's publisher and subscriber of ``topic`` are joined, neither's table holds another
        peer's subscriber of ``topic`` (so the range multicast of §3.5.4 ends at our own
        subscriber, and its DONE is immediate), and neither is on probation after a level-0
        neighbour moved away (subscribers may be hidden there, ``_settle_task``). Only events
        (``handle``) make it turn False; the passing of time only ends a probation."""
        me = self.peer_id
        pub = self.vnodes.get((topic, PUBLISHER, me))
        sub = self.vnodes.get((topic, SUBSCRIBER, me))
        if pub is None or sub is None:
            return False
        lo, hi = run_bounds(topic, SUBSCRIBER)
        for vnode in (pub, sub):
            if now < vnode.loose_left_until or now < vnode.loose_right_until:
                return False
            for key in vnode.table.keys_between(lo, hi):
                if key[2] != me:
                    return False
        return True

    def joining_keys(self) -> list[Key]:
        return sorted(self.pending)

    def is_lonely(self) -> bool:
        """Joined, and no other peer's virtual node is in any routing table (alone in its overlay)."""
        me = self.peer_id
        return bool(self.vnodes) and all(
            key[2] == me for vnode in self.vnodes.values() for key in vnode.table.keys
        )

    def known_peer_count(self) -> int:
        """Distinct peers in this peer's routing tables, itself included (0: not joined)."""
        if not self.vnodes:
            return 0
        return len({key[2] for vnode in self.vnodes.values() for key in vnode.table.keys} | {self.peer_id})

    # ================================================================ plumbing

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _timer(self, at: float, kind: int, arg: Any) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (at, self._seq, kind, arg))

    def _send(self, dest: Key, message: Any) -> None:
        peer = dest[2]
        if peer == self.peer_id:
            self._local.append(message)
        else:
            self._out.append(Send(peer, message))

    def _send_peer(self, peer: PeerId, message: Any) -> None:
        if peer == self.peer_id:
            self._local.append(message)
        else:
            self._out.append(Send(peer, message))

    def _drain_local(self) -> None:
        local = self._local
        while local:
            self._handle_message(self.peer_id, local.popleft())

    def _receive(self, sender: PeerId, message: Any) -> None:
        if self.unheard:
            self.unheard.discard(sender)
        if sender in self.last_heard:
            self.last_heard[sender] = self.now
            self.probes.pop(sender, None)
        recent = self.recent_peers
        if sender not in recent:
            recent[sender] = None
            if len(recent) > 32:
                del recent[next(iter(recent))]
        if sender in self.dead:
            del self.dead[sender]
            self._exhume(sender)
        self._handle_message(sender, message)

    def _handle_message(self, sender: PeerId, message: Any) -> None:
        # the kinds that make up nearly all of the traffic (NEW, EEXP and REXP at join, SEARCH,
        # LINK) are called directly, which a compiled build (bench/compiled_core.py) turns into
        # native calls; the others through the table
        kind = type(message)
        if kind is m.NEW:
            self._on_new(sender, message)
        elif kind is m.EEXP:
            self._on_eexp(sender, message)
        elif kind is m.REXP:
            self._on_rexp(sender, message)
        elif kind is m.SEARCH:
            self._on_search(sender, message)
        elif kind is m.LINK:
            self._on_link(sender, message)
        else:
            handler = self._dispatch.get(kind)
            if handler is None:
                raise TypeError(f"not an overlay message: {message!r}")
            handler(sender, message)

    def _vnode_for(self, sender: PeerId, message: Any) -> VirtualNode | None:
        """The addressed virtual node, or None after telling the sender it is gone."""
        vnode = self.vnodes.get(message.dest)
        if vnode is None:
            bounced = message if isinstance(message, m.PUB | m.UNSUB | m.PRESENCE | m.SEARCH) else None
            if isinstance(message, m.PUB | m.UNSUB) and message.ack_id:
                self._send_peer(sender, m.ACK(message.ack_id))
            self._send_peer(sender, m.GONE(message.dest, bounced))
        return vnode

    # ================================================================ learning & level 0

    def _learn(self, vnode: VirtualNode, ref: NodeRef | None) -> None:
        if ref is None:
            return
        key = ref[0]
        peer = key[2]
        if peer in self.dead or (peer == self.peer_id and key not in self.vnodes):
            return
        tomb = self.tombstones.get(key)
        if tomb is not None:
            if tomb[0] == ref[1] and self.now < tomb[1]:
                return
            del self.tombstones[key]  # expired, or a new incarnation (new membership vector)
        vnode.table.add(ref)

    def _after_change(self, vnode: VirtualNode) -> None:
        table = vnode.table
        left, right = table.left0(), table.right0()
        if left == vnode.left0 and right == vnode.right0:
            return
        if left is not None and left != vnode.left0:
            self._send(left, m.LINK(left, vnode.ref))
            self._watch(left[2])
        if right is not None and right != vnode.right0:
            self._send(right, m.LINK(right, vnode.ref))
            self._watch(right[2])
        # a node arrived between us and our old neighbour, who believes we are adjacent: tell it
        old_left, old_right = vnode.left0, vnode.right0
        # (it may have been filtered out of our table meanwhile, but not if it crashed)
        dead = self.dead
        # (sent again after link_retry_s: nothing else would repair its view before its next REXP)
        if left is not None and old_left is not None and old_left < left and old_left[2] not in dead:
            keys = table.keys  # the known node nearest to the old neighbour, on our side of it
            notice = m.NEW(old_left, table.ref(keys[bisect_right(keys, old_left)]))
            self._send(old_left, notice)
            self._timer(self.now + self.config.link_retry_s, _T_NOTICE, notice)
        if right is not None and old_right is not None and right < old_right and old_right[2] not in dead:
            keys = table.keys
            notice = m.NEW(old_right, table.ref(keys[bisect_left(keys, old_right) - 1]))
            self._send(old_right, notice)
            self._timer(self.now + self.config.link_retry_s, _T_NOTICE, notice)
        right_changed = right != old_right
        config = self.config
        until = self.now + config.failure_timeout_s + config.ping_interval_s + config.link_retry_s
        if old_left is not None and (left is None or left < old_left):
            if not self._graceful and vnode.loose_left_until < self.now:
                vnode.loose_left_until, vnode.loose_left_from = until, old_left
        elif left is not None and vnode.loose_left_from is not None and left >= vnode.loose_left_from:
            vnode.loose_left_until, vnode.loose_left_from = float("-inf"), None  # it is back
        if old_right is not None and (right is None or right > old_right):
            if not self._graceful and vnode.loose_right_until < self.now:
                vnode.loose_right_until, vnode.loose_right_from = until, old_right
        elif right is not None and vnode.loose_right_from is not None and right <= vnode.loose_right_from:
            vnode.loose_right_until, vnode.loose_right_from = float("-inf"), None
        vnode.left0, vnode.right0 = left, right
        vnode.confirmed.intersection_update((left, right))
        vnode.link_tries = 0
        self._timer(self.now + self.config.link_retry_s, _T_LINK, vnode)
        if right_changed and vnode.key[1] == PUBLISHER and vnode.key[0] != ANCHOR_TOPIC:
            self._check_rendezvous(vnode)

    def _watch(self, peer: PeerId) -> None:
        """A peer just became a level-0 neighbour: its silence is timed from now, unless it is
        timed already (it hosts another neighbour): a crashed peer whose entries move into the
        level-0 slots one after another must not have its silence restarted each time."""
        if peer != self.peer_id:
            self.last_heard.setdefault(peer, self.now)

    def _correct(self, vnode: VirtualNode, sender: NodeRef) -> None:
        """The sender believes we are its level-0 neighbour: offer the known node nearest to it
        between us (a jump, not a step, so a misplaced joiner converges in O(log n) rounds)."""
        sender_key = sender[0]
        table = vnode.table
        keys = table.keys
        if sender_key < vnode.key:
            index = bisect_right(keys, sender_key)
            if index < len(keys) and keys[index] < vnode.key:
                self._send(sender_key, m.NEW(sender_key, table.ref(keys[index])))
        else:
            index = bisect_left(keys, sender_key)
            if index > 0 and keys[index - 1] > vnode.key:
                self._send(sender_key, m.NEW(sender_key, table.ref(keys[index - 1])))

    def _bury_key(self, key: Key, mv: int | None) -> None:
        """Remember that the incarnation ``mv`` of ``key`` departed (see ``tombstones``)."""
        if mv is None:
            for vnode in self.vnodes.values():
                if key in vnode.table:
                    mv = vnode.table.mv_of(key)
                    break
            else:
                return
        tombstones = self.tombstones
        tombstones[key] = (mv, self.now + self.config.dead_peer_memory_s)
        if len(tombstones) > 4096:  # bounded: drop the oldest (dicts keep insertion order)
            del tombstones[next(iter(tombstones))]

    def _forget_everywhere(self, key: Key) -> None:
        self._bury_key(key, None)
        for vnode in list(self.vnodes.values()):
            if vnode.table.remove(key):
                self._after_change(vnode)

    def _declare_dead(self, peer: PeerId) -> None:
        if peer == self.peer_id:
            return
        self.dead[peer] = self.now + self.config.dead_peer_memory_s
        self.last_heard.pop(peer, None)
        self.probes.pop(peer, None)
        # one last PING at once: a peer only suspected because of lost messages answers within a
        # round trip and is forgiven (its entries restored, ``_exhume``) instead of a ping round later
        self._send_peer(peer, m.PING(self._next_id()))
        buried = self.buried.setdefault(peer, [])
        for vnode in list(self.vnodes.values()):
            table = vnode.table
            refs = [table.ref(key) for key in table.keys if key[2] == peer]
            if refs:
                buried.extend((vnode.key, ref) for ref in refs)
                table.remove_peer(peer)
                self._after_change(vnode)
        if self.done_slots:
            self._redelegate_to_dead(peer)

    # ================================================================ bootstrap & join

    def _exhume(self, peer: PeerId) -> None:
        """A peer declared dead spoke again (lost PINGs made it look crashed): put back the
        entries its declaration removed, so the level-0 links it held are restored at once
        instead of waiting for the next REXP (docs/overlay.md §10, false suspicions)."""
        changed: dict[Key, VirtualNode] = {}
        for vnode_key, ref in self.buried.pop(peer, ()):
            vnode = self.vnodes.get(vnode_key)
            if vnode is not None:
                self._learn(vnode, ref)
                changed[vnode_key] = vnode
        for vnode in changed.values():
            self._after_change(vnode)

    def _bootstrap(self, contacts: tuple[PeerId, ...]) -> None:
        self.contacts = tuple(c for c in contacts if c != self.peer_id)
        self.seed = self.peer_id in contacts
        if self.seed:
            self.unheard = set(self.contacts)
        if self.bootstrapped:
            return
        self.bootstrapped = True
        if not self._ping_scheduled:
            self._ping_scheduled = True
            self._timer(self.now + self.config.ping_interval_s * (0.5 + self.rng.random()), _T_PING, None)
        if self.config.anchor_enabled:
            self._join(ANCHOR_TOPIC, PUBLISHER)
        deferred, self.deferred = self.deferred, []
        for event in deferred:
            if isinstance(event, JoinTopic):
                self._join(event.topic, int(event.role))
            elif isinstance(event, LeaveTopic):
                self._leave(make_key(event.topic, int(event.role), self.peer_id))

    def _join(self, topic: str, role: int) -> None:
        key = make_key(topic, role, self.peer_id)
        if key in self.vnodes or key in self.pending:
            return
        mv = random_membership_vector(self.rng, self.config.mv_bits)
        join = _PendingJoin(key, mv, 0)
        self.pending[key] = join
        self._start_search(join)

    def _start_search(self, join: _PendingJoin) -> None:
        self.requests.pop(join.request_id, None)
        join.request_id = self._next_id()
        join.waiting = False
        join.first_hop = None
        self.requests[join.request_id] = join.key
        search = m.SEARCH(None, self.peer_id, join.key, join.request_id, None)
        via = self.join_via
        if self.seed and self.contacts and not self.vnodes and (via is None or via in self.dead):
            self._formation_round(join, search)
            return
        self._timer(self.now + self.config.search_timeout_s, _T_SEARCH, join.request_id)
        if self.vnodes:
            self._local.append(search)
        elif via is not None and via not in self.dead:
            self._send_peer(via, search)
        elif self.contacts or self.recent_peers:
            known = self.contacts or tuple(self.recent_peers)
            alive = [c for c in known if c not in self.dead] or list(known)
            self._send_peer(self.rng.choice(alive), search)
        else:  # the first node of the overlay
            self.requests.pop(join.request_id, None)
            self._complete_join(join, None, None)

    def _formation_round(self, join: _PendingJoin, search: m.SEARCH) -> None:
        """A seed with no virtual node: close the last round (found?) and probe every contact."""
        config = self.config
        lead = self.formation_key
        if lead is not None and lead != join.key and lead in self.pending:
            join.waiting = True  # the leading join finds the overlay, or founds it, first
            self._timer(self.now + config.search_timeout_s, _T_SEARCH, join.request_id)
            return
        self.formation_key = join.key
        if self.formation.close_round(self.peer_id):  # the lowest reachable seed: found
            self.requests.pop(join.request_id, None)
            self.formation.reset()
            self.founded = True
            self._complete_join(join, None, None)
            return
        self.formation.start_round(join.request_id)
        self._timer(self.now + config.formation_round_s, _T_SEARCH, join.request_id)
        probe = replace(search, contact_hops=m.SEARCH_MAX_CONTACT_HOPS)  # answered, not passed on
        for peer in self.contacts:
            self._send_peer(peer, probe)

    def _probe_contacts(self) -> None:
        """Each ping round: a seed alone in its overlay asks its contacts whether another overlay
        exists; a joined seed asks the contacts it never heard from (missing at formation: they
        may have founded alone and learn of this overlay from the probe's origin)."""
        if not (self.seed and self.contacts and self.vnodes):
            return
        target = min(self.vnodes)
        hops = m.SEARCH_MAX_CONTACT_HOPS
        self.unheard_probes.clear()
        if self.is_lonely():
            self.lonely_probe = self._next_id()
            for peer in self.contacts:
                self._send_peer(peer, m.SEARCH(None, self.peer_id, target, self.lonely_probe, None, hops))
            return
        self.lonely_probe = None
        for peer in self.contacts:
            if peer in self.unheard:  # one probe each: any answer settles it (see _probe_answered)
                request_id = self._next_id()
                self.unheard_probes[request_id] = peer
                self._send_peer(peer, m.SEARCH(None, self.peer_id, target, request_id, None, hops))

    def _probe_answered(self, request_id: int) -> bool:
        """An answer (FOUND or SEARCH_FAIL) to a joined seed's probe of a contact it never heard
        from: in an overlay (ours, or another that learned of ours from the probe) or about to
        search one itself; either way, no need to probe it again."""
        contact = self.unheard_probes.pop(request_id, None)
        if contact is None:
            return False
        self.unheard.discard(contact)
        return True

    def _on_lonely_found(self, sender: PeerId, msg: m.FOUND) -> None:
        self.lonely_probe = None
        if sender == self.peer_id or not self.is_lonely():
            return
        for ref in (msg.pred, msg.succ):
            if ref is not None and ref[0][2] == self.peer_id:
                return  # the answer knows us: the same overlay after all
        if should_yield(self.peer_id, sender, msg.peers):
            self._yield_overlay(sender)

    def _yield_overlay(self, via: PeerId) -> None:
        """Leave this lonely overlay (nobody else holds its virtual nodes) and join ``via``'s."""
        keys = sorted(self.vnodes)
        self.vnodes.clear()
        self.founded = False
        self.join_via = via
        for key in keys:
            join = _PendingJoin(key, random_membership_vector(self.rng, self.config.mv_bits), 0)
            self.pending[key] = join
            self._start_search(join)

    def _on_search(self, sender: PeerId, msg: m.SEARCH) -> None:
        if msg.dest is None:
            if not self.vnodes:  # still joining ourselves: pass it on toward older peers
                helpers = [c for c in self.contacts if c != msg.origin and c not in self.dead]
                if helpers and msg.contact_hops < m.SEARCH_MAX_CONTACT_HOPS:
                    self._send_peer(self.rng.choice(helpers), replace(msg, contact_hops=msg.contact_hops + 1))
                else:
                    self._send_peer(msg.origin, m.SEARCH_FAIL(msg.request_id))
                return
            origin = msg.origin
            if self.seed and origin != self.peer_id and origin not in self.contacts and self.is_lonely():
                self.contacts = (*self.contacts, origin)  # alone here: probe the searcher's overlay too
        else:
            vnode = self._vnode_for(sender, msg)
            if vnode is None:
                return
            if msg.forwarder is not None:
                self._learn(vnode, msg.forwarder)
                self._after_change(vnode)
        self._search_step(msg)

    def _search_step(self, msg: m.SEARCH) -> None:
        """One step of a SEARCH at this peer, from the best of all its virtual nodes
        (``skipgraph.peer_search_step``; docs/overlay.md §5 "Search routing")."""
        step = peer_search_step((vnode.table for vnode in self.vnodes.values()), msg.target)
        if step is None:  # nothing here but the target itself
            self._send_peer(msg.origin, m.SEARCH_FAIL(msg.request_id))
            return
        vnode = self.vnodes[step[0].owner]
        nxt = step[1]
        if nxt is not None:
            if msg.origin == self.peer_id and nxt[2] != self.peer_id:
                join = self.pending.get(self.requests.get(msg.request_id))  # type: ignore[arg-type]
                if join is not None and join.first_hop is None:
                    join.first_hop = nxt
            self._send(nxt, m.SEARCH(nxt, msg.origin, msg.target, msg.request_id, vnode.ref))
            return
        pred, succ = (
            None if key is None else vnode.ref if key == vnode.key else vnode.table.ref(key)
            for key in search_answer(vnode.table, msg.target)
        )
        self._send_peer(msg.origin, m.FOUND(msg.request_id, msg.target, pred, succ, self.known_peer_count()))

    def _verify_position(self, vnode: VirtualNode) -> None:
        """Search for our own key once more, from an entry of our table (docs/overlay.md §10).

        Joins that search the same spot concurrently (peers bootstrapping 2 ms apart all insert
        their anchors at the right end) are answered by nodes that do not yet know each other's
        joiners; the joiners then form interleaved chains that each look right locally and that
        the NEW/LINK notices merge only one node per round trip. A second search a moment later
        runs through tables that have learned the burst: where it ends at a node other than us,
        its answer names nodes nearer than our neighbours, and learning them starts the usual
        corrections at every misplaced joiner at once."""
        if self.vnodes.get(vnode.key) is not vnode:
            return
        table = vnode.table
        sticky = table.sticky_keys()
        candidates = [key for key in table.keys if key not in sticky and key[2] != self.peer_id]
        if not candidates:
            candidates = [key for key in table.keys if key[2] != self.peer_id]
        if not candidates:
            return
        start = candidates[random_index(self.rng, len(candidates))]
        now = self.now
        if len(self.verifying) > 64:  # answers that never came (lost, or a crashed hop)
            self.verifying = {rid: item for rid, item in self.verifying.items() if item[1] > now}
        request_id = self._next_id()
        self.verifying[request_id] = (vnode.key, now + self.config.search_timeout_s)
        self._send(start, m.SEARCH(start, self.peer_id, vnode.key, request_id, vnode.ref))

    def _on_verify_found(self, key: Key, msg: m.FOUND) -> None:
        vnode = self.vnodes.get(key)
        if vnode is None:
            return
        for ref in (msg.pred, msg.succ):
            if ref is not None and ref[0] != key:
                self._learn(vnode, ref)
        self._after_change(vnode)
        vnode.verify_rounds += 1
        if vnode.verify_rounds < self.config.join_verify_rounds:  # the next check waits twice as long
            delay = self.config.join_verify_delay_s * 2**vnode.verify_rounds
            self._timer(self.now + delay, _T_VERIFY, vnode)

    def _on_found(self, sender: PeerId, msg: m.FOUND) -> None:
        verified = self.verifying.pop(msg.request_id, None)
        if verified is not None:
            self._on_verify_found(verified[0], msg)
            return
        if self.lonely_probe is not None and msg.request_id == self.lonely_probe:
            self._on_lonely_found(sender, msg)
            return
        if self.unheard_probes and self._probe_answered(msg.request_id):
            return
        key = self.requests.pop(msg.request_id, None)
        if key is None:
            return
        join = self.pending.get(key)
        if join is None:
            return
        self._complete_join(join, msg.pred, msg.succ)

    def _on_search_fail(self, sender: PeerId, msg: m.SEARCH_FAIL) -> None:
        if msg.request_id == self.formation.request_id:  # a formation round waits for all answers
            self.formation.heard_not_joined(sender)
            return
        if self.unheard_probes and self._probe_answered(msg.request_id):
            return
        key = self.requests.get(msg.request_id)
        if key is not None:  # retry soon (the search timer would wait search_timeout_s)
            self._timer(self.now + min(1.0, self.config.search_timeout_s), _T_SEARCH, msg.request_id)

    def _complete_join(self, join: _PendingJoin, pred: NodeRef | None, succ: NodeRef | None) -> None:
        del self.pending[join.key]
        config = self.config
        vnode = VirtualNode(join.key, join.mv, config)
        first = not self.vnodes
        self.vnodes[join.key] = vnode
        if first:
            self.join_via = None
            self.formation.reset()
            self.formation_key = None
            for held in [j for j in self.pending.values() if j.waiting]:
                self._start_search(held)  # held back by the formation rounds: search from here now
        for ref in (pred, succ):
            if ref is not None and ref[0] != join.key:
                self._learn(vnode, ref)
        for other in self.vnodes.values():  # co-located virtual nodes know each other for free
            if other is not vnode:
                self._learn(other, vnode.ref)
                self._learn(vnode, other.ref)
                self._after_change(other)
        table = vnode.table
        vnode.left0, vnode.right0 = table.left0(), table.right0()
        existing = tuple(table.keys)
        for neighbour in (vnode.left0, vnode.right0):
            if neighbour is not None:
                self._send(neighbour, m.REXP(neighbour, vnode.ref, vnode.ref, existing, 0))
                self._watch(neighbour[2])
        now = self.now
        self._timer(now + config.link_retry_s, _T_LINK, vnode)  # REXP lost? re-announce by LINK
        if config.join_verify_rounds > 0:
            self._timer(now + config.join_verify_delay_s, _T_VERIFY, vnode)
        rng = self.rng
        self._timer(now + config.rexp_interval_s * (0.9 + 0.2 * rng.random()), _T_REXP, vnode)
        if config.frt_enabled:
            self._timer(now + config.eexp_delay_s, _T_EEXP_RANGE, vnode)
            self._timer(now + config.eexp_delay_s + config.eexp_random_delay_s, _T_EEXP_RANDOM, vnode)
        topic, role = join.key[0], join.key[1]
        if role == PUBLISHER and topic != ANCHOR_TOPIC:
            self._check_rendezvous(vnode)
            if vnode.rp_present is None and vnode.right0 is not None:
                self._send(vnode.right0, m.PRESENCE_QUERY(vnode.right0, vnode.ref, topic))
            for event, queued_at in self.pending_publishes.pop(topic, []):
                self._publish(event, queued_at)

    # ================================================================ leave

    def _leave(self, key: Key) -> None:
        join = self.pending.pop(key, None)
        if join is not None:
            self.requests.pop(join.request_id, None)
            if key[1] == PUBLISHER:
                self._drop_pending_publishes(key[0])
            return
        vnode = self.vnodes.pop(key, None)
        if vnode is None:
            return
        table = vnode.table
        if key[1] == SUBSCRIBER:
            lo, hi = run_bounds(key[0], PUBLISHER)
            self._multicast_unsub(vnode, vnode.ref, key[0], lo, hi)
        left, right = table.left0(), table.right0()
        left_ref = table.ref(left) if left is not None else None
        right_ref = table.ref(right) if right is not None else None
        if left is not None:
            self._send(left, m.LEAVE(left, vnode.ref, right_ref))
        if right is not None:
            self._send(right, m.LEAVE(right, vnode.ref, left_ref))
        if key[1] == PUBLISHER:
            self.presence.pop(key[0], None)
            self._drop_pending_publishes(key[0])
        for other in list(self.vnodes.values()):
            if other.table.remove(key):
                self._after_change(other)

    def _on_leave(self, sender: PeerId, msg: m.LEAVE) -> None:
        vnode = self.vnodes.get(msg.dest)
        if vnode is None:
            return
        self._bury_key(msg.sender[0], msg.sender[1])
        vnode.table.remove(msg.sender[0])
        if msg.replacement is not None and msg.replacement[0] != vnode.key:
            self._learn(vnode, msg.replacement)
        self._graceful = True  # the leaver named its replacement (None: it was at an end)
        self._after_change(vnode)
        self._graceful = False

    # ================================================================ REXP / EEXP / NEW / LINK

    def _on_rexp(self, sender: PeerId, msg: m.REXP) -> None:
        vnode = self._vnode_for(sender, msg)
        if vnode is None:
            return
        origin = msg.sender
        if origin[0] == vnode.key:
            return
        if not _listed(msg.existing, vnode.key):
            self._send(origin[0], m.NEW(origin[0], vnode.ref))
        if msg.forwarder[0] != origin[0]:
            self._learn(vnode, origin)
            self._learn(vnode, msg.forwarder)
            self._after_change(vnode)
        elif msg.level == 0:  # a direct REXP(level 0): the sender believes we are adjacent
            self._confirm_link(vnode, origin, False)
        else:
            self._learn(vnode, origin)
            self._after_change(vnode)
        nxt, level = rexp_next_hop(vnode.table, vnode.key, vnode.mv, origin, msg.level, self.config.mv_bits)
        if nxt is not None:
            self._send(nxt, m.REXP(nxt, origin, vnode.ref, msg.existing, level))

    def _on_new(self, sender: PeerId, msg: m.NEW) -> None:
        vnode = self.vnodes.get(msg.dest)
        if vnode is None:
            return
        key, mv = msg.sender
        if sender != key[2] and self._known_gone(key, mv):
            # hearsay about a virtual node we know departed (GONE, LEAVE, UNSUB) or whose peer we
            # declared crashed: tell the sender, whose table still holds it (``_on_gone``). A
            # stale entry offered as a level-0 correction (``_correct``) otherwise hides the
            # nearer live node behind it on every retry, and teaches the departed node back once
            # our memory of it expires (docs/overlay.md §10, stale corrections).
            self._send_peer(sender, m.GONE(key, None))
            return
        self._learn(vnode, msg.sender)
        self._after_change(vnode)

    def _on_link(self, sender: PeerId, msg: m.LINK) -> None:
        vnode = self.vnodes.get(msg.dest)
        if vnode is None:
            self._send_peer(sender, m.GONE(msg.dest, None))
            return
        self._confirm_link(vnode, msg.sender, msg.reply)

    def _confirm_link(self, vnode: VirtualNode, sender: NodeRef, is_reply: bool) -> None:
        """``sender`` claims adjacency (LINK, or a direct REXP of level 0). Learn it, offer a
        nearer node if we know one, else confirm: answer with LINK(reply) unless our own LINK
        to it is already on its way (it just became our neighbour)."""
        sender_key = sender[0]
        before = (vnode.left0, vnode.right0)
        self._learn(vnode, sender)
        self._correct(vnode, sender)
        self._after_change(vnode)
        if sender_key == vnode.left0 or sender_key == vnode.right0:
            vnode.confirmed.add(sender_key)
            if not is_reply and sender_key in before:
                self._send(sender_key, m.LINK(sender_key, vnode.ref, True))

    def _relink(self, vnode: VirtualNode) -> None:
        """Re-announce level-0 links that were never confirmed (LINK or its answer lost)."""
        if self.vnodes.get(vnode.key) is not vnode or vnode.link_tries >= self.config.link_max_retries:
            return
        pending = [n for n in (vnode.left0, vnode.right0) if n is not None and n not in vnode.confirmed]
        if not pending:
            return
        vnode.link_tries += 1
        for neighbour in pending:
            self._send(neighbour, m.LINK(neighbour, vnode.ref))
        self._timer(self.now + self.config.link_retry_s, _T_LINK, vnode)

    def _on_eexp(self, sender: PeerId, msg: m.EEXP) -> None:
        vnode = self._vnode_for(sender, msg)
        if vnode is None:
            return
        origin = msg.sender
        supplied = False  # this node is an entry the origin lacked (§3.5.6: it answers NEW)
        if origin[0] != vnode.key:
            if not _listed(msg.existing, vnode.key):
                self._send(origin[0], m.NEW(origin[0], vnode.ref))
                supplied = True
            self._learn(vnode, origin)
        if msg.forwarder[0] != origin[0]:
            self._learn(vnode, msg.forwarder)
        self._after_change(vnode)
        # §3.5.6: "decrement the missing-entry count; if it is >= 1, forward". With
        # eexp_decrement="supplied" (not the seed's) a range EEXP spends one only where it found
        # a new entry (its shrinking sub-ranges still bound it); a random walk always spends one.
        spend = supplied or msg.random_walk or self.config.eexp_decrement == "every"
        remaining = msg.missing - 1 if spend else msg.missing
        if remaining < 1:
            return
        if msg.random_walk:
            self._eexp_random_step(vnode, origin, msg.existing, remaining, msg.forwarder[0])
        else:
            self._eexp_range_step(vnode, origin, msg.existing, remaining, msg.lo, msg.hi)

    def _eexp_random_step(
        self, vnode: VirtualNode, origin: NodeRef, existing: tuple[Key, ...], missing: int, avoid: Key
    ) -> None:
        keys = vnode.table.keys
        if not keys:
            return
        for _ in range(4):
            nxt = keys[random_index(self.rng, len(keys))]
            if nxt != origin[0] and nxt != avoid:
                break
        else:
            return
        self._send(nxt, m.EEXP(nxt, origin, vnode.ref, existing, missing, (), (), True))

    def _eexp_range_step(
        self, vnode: VirtualNode, origin: NodeRef, existing: tuple[Key, ...], missing: int, lo: Key, hi: Key
    ) -> None:
        plan = plan_delegation(vnode.table, vnode.key, lo, hi)
        if plan:
            # The seed forwards the (decremented) count to "the next destination" and says
            # nothing of dividing it: with eexp_split="whole" every delegate of the range
            # multicast carries it; "even" divides it (farthest delegate first gets the rest).
            whole = self.config.eexp_split == "whole"
            base, extra = divmod(missing, len(plan))
            for index, (dest, sub_lo, sub_hi) in enumerate(plan):
                share = missing if whole else base + (1 if index < extra else 0)
                if share >= 1:
                    self._send(dest, m.EEXP(dest, origin, vnode.ref, existing, share, sub_lo, sub_hi, False))
        elif not lo <= vnode.key < hi:
            nxt = route_toward_range(vnode.table, vnode.key, lo, hi)
            if nxt is not None:
                self._send(nxt, m.EEXP(nxt, origin, vnode.ref, existing, missing, lo, hi, False))

    def _eexp_missing(self, vnode: VirtualNode) -> int:
        table = vnode.table
        size = self.config.table_size
        missing = size - len(table)
        if self.config.eexp_trigger == "below_l":  # §3.5.2/§3.5.4: "while fewer than L entries"
            return missing
        # the slots a subscriber could still take: all but the subscribers held and the sticky
        # entries that are not subscribers (a sticky subscriber is counted once)
        nonsub_sticky = sum(1 for key in table.sticky_keys() if not table.is_sub(key))
        deficit = size - table.sub_count - nonsub_sticky
        return max(missing, deficit)

    def _issue_range_eexp(self, vnode: VirtualNode) -> None:
        topic = vnode.key[0]
        if topic == ANCHOR_TOPIC:
            return
        missing = self._eexp_missing(vnode)
        if missing < 1:
            return
        lo, hi = run_bounds(topic, SUBSCRIBER)
        self._eexp_range_step(vnode, vnode.ref, tuple(vnode.table.keys), missing, lo, hi)

    # ================================================================ publish / PUB

    def _publish(self, event: Publish, published_at: float | None = None) -> None:
        key = (event.topic, PUBLISHER, self.peer_id)
        vnode = self.vnodes.get(key)
        config = self.config
        if vnode is None:
            if key in self.pending or (
                not self.bootstrapped
                and any(
                    isinstance(e, JoinTopic) and e.topic == event.topic and int(e.role) == PUBLISHER
                    for e in self.deferred
                )
            ):
                queue = self.pending_publishes.setdefault(event.topic, [])
                if len(queue) >= config.max_pending_publishes:
                    if config.publish_done_enabled:  # refused, and the driver is told so
                        self._out.append(PublishDone(event.topic, event.publication_id, False))
                        return
                    raise OverflowError(
                        f"more than {config.max_pending_publishes} publishes queued for topic "
                        f"{event.topic!r} while its publisher is still joining"
                    )
                queue.append((event, self.now))
                return
            raise ValueError(
                f"Publish on topic {event.topic!r} without JoinTopic(topic, Role.PUBLISHER) first"
            )
        task: _PublishTask | None = None
        if config.publish_done_enabled:
            if self.presence.get(event.topic) is False:
                self._out.append(PublishDone(event.topic, event.publication_id, True, reached=False))
                return
            task = _PublishTask(None, event.topic, event.publication_id)
            started = self.now if published_at is None else published_at
            self._timer(started + config.publish_done_timeout_s, _T_DONE, task)
        elif self.presence.get(event.topic) is False:
            return  # no subscriber: exhaust data is not forwarded (§3.2)
        lo, hi = run_bounds(event.topic, SUBSCRIBER)
        publication_id = event.publication_id
        self._pub_step(vnode, vnode.ref, event.topic, event.payload, publication_id, 0, lo, hi, task=task)
        if task is not None:
            self._settle_task(task, vnode, lo, hi)
        if (
            config.frt_enabled
            and self.now - vnode.last_publish_eexp >= config.eexp_publish_min_interval_s
            and self._eexp_missing(vnode) >= 1
        ):
            vnode.last_publish_eexp = self.now
            self._issue_range_eexp(vnode)

    def _delegation_plan(self, vnode: VirtualNode, lo: Key, hi: Key, *, detour: bool) -> list[Delegation]:
        """Range multicast step (§3.5.1): the sub-ranges of [lo, hi) to delegate, farthest-keyed
        entries first; when this node lies outside the range and knows no entry inside it, one
        hop toward the range (or, with ``detour``, around a dead entry)."""
        table = vnode.table
        plan = plan_delegation(table, vnode.key, lo, hi)
        if not plan and lo < hi and not lo <= vnode.key < hi:
            nxt = route_toward_range(table, vnode.key, lo, hi)
            if nxt is None and detour:
                nxt = self._detour(vnode, lo, hi)
            if nxt is not None:
                plan = [(nxt, lo, hi)]
        return plan

    def _pub_step(
        self,
        vnode: VirtualNode,
        origin: NodeRef,
        topic: str,
        payload: Any,
        publication_id: int,
        hops: int,
        lo: Key,
        hi: Key,
        detour: bool = False,
        task: _PublishTask | None = None,
    ) -> int:
        """Delegate [lo, hi) of a PUB; with ``task``, every delegation (local ones too) gets an
        ack id and is awaited for DONE. Returns the number of delegations made."""
        plan = self._delegation_plan(vnode, lo, hi, detour=detour)
        for dest, sub_lo, sub_hi in plan:
            remote = dest[2] != self.peer_id
            ack_id = self._next_id() if (self.config.pub_ack_enabled and remote) or task else m.NO_ACK
            msg = m.PUB(
                dest, origin, topic, payload, publication_id, vnode.ref, hops + 1, sub_lo, sub_hi, ack_id
            )
            if task is not None:
                task.reached = task.reached or remote
                task.waiting[ack_id] = (vnode, msg, [ack_id])
                self.done_slots[ack_id] = (task, ack_id)
                if remote:  # a lost DONE: the delegation is sent once more (dedup makes it safe)
                    retry_at = self.now + self.config.publish_done_timeout_s / 3
                    self._timer(retry_at, _T_DONE_RETRY, (task, ack_id))
            if ack_id and remote:
                self._expect_ack(vnode, msg, ack_id, 0)
            self._send(dest, msg)
        return len(plan)

    def _detour(self, vnode: VirtualNode, lo: Key, hi: Key) -> Key | None:
        """A known node beyond the far end of [lo, hi) that can reach into it from there."""
        keys = vnode.table.keys
        after = [key for key in keys if key >= hi]
        if after:
            return after[0]
        before = [key for key in keys if key < lo]
        return before[-1] if before else None

    def _on_pub(self, sender: PeerId, msg: m.PUB) -> None:
        vnode = self._vnode_for(sender, msg)
        if vnode is None:
            return
        if msg.ack_id and sender != self.peer_id:
            self._send_peer(sender, m.ACK(msg.ack_id))
        task: _PublishTask | None = None
        if msg.ack_id and self.config.publish_done_enabled:
            ident = (vnode.key, msg.sender[0], msg.publication_id, msg.lo, msg.hi)
            known = self.done_tasks.get(ident)
            if known is not None:  # a retransmission (lost ACK or DONE): never re-run the subtree
                if not known.finished:
                    known.also.append((sender, msg.ack_id))
                elif known.succeeded:
                    self._send_peer(sender, m.DONE(msg.ack_id))
                return  # (a failed subtree stays silent; the publisher times out)
            task = _PublishTask((sender, msg.ack_id), msg.topic, msg.publication_id, ident)
            self.done_tasks[ident] = task
            self._timer(self.now + self.config.publish_done_timeout_s, _T_DONE, task)
        self._accept_pub(vnode, msg, msg.hops, detour=False, task=task)
        if task is not None:
            self._settle_task(task, vnode, msg.lo, msg.hi)

    def _accept_pub(
        self, vnode: VirtualNode, msg: m.PUB, hops: int, *, detour: bool, task: _PublishTask | None = None
    ) -> None:
        origin = msg.sender
        if origin[0] != vnode.key:
            self._learn(vnode, origin)
        if msg.forwarder[0] != origin[0] and msg.forwarder[0] != vnode.key:
            self._learn(vnode, msg.forwarder)
        self._after_change(vnode)
        key = vnode.key
        if key[1] == SUBSCRIBER and key[0] == msg.topic and msg.lo <= key < msg.hi:
            seen_key = (origin[0], msg.publication_id)
            seen = vnode.seen
            if seen_key not in seen:
                seen[seen_key] = None
                if len(seen) > self.config.dedup_window:
                    del seen[next(iter(seen))]
                self._out.append(Deliver(msg.topic, msg.payload, msg.publication_id, origin[0][2], hops))
        self._pub_step(
            vnode, origin, msg.topic, msg.payload, msg.publication_id, hops, msg.lo, msg.hi, detour, task
        )

    # ================================================================ end-to-end completion (DONE)

    def _task_progress(self, task: _PublishTask) -> None:
        """Report a task whose delegations all reported DONE (its own Deliver is already out)."""
        if task.finished or task.waiting:
            return
        task.finished = task.succeeded = True
        if task.upstream is None:
            self._out.append(PublishDone(task.topic, task.publication_id, True, reached=task.reached))
        else:
            for peer, ack_id in (task.upstream, *task.also):
                self._send_peer(peer, m.DONE(ack_id))

    def _settle_task(self, task: _PublishTask, vnode: VirtualNode, lo: Key, hi: Key) -> None:
        """After handling [lo, hi) at ``vnode``: the range between ``vnode`` and its level-0
        neighbour on a side the range extends to was covered by nobody but ``vnode``'s view of
        that neighbour; while it is on probation after moving farther away (a crash being
        repaired), subscribers may be hidden there, so the task cannot report DONE."""
        now = self.now
        if (hi > vnode.key and now < vnode.loose_right_until) or (
            lo < vnode.key and now < vnode.loose_left_until
        ):
            self._fail_task(task)
        else:
            self._task_progress(task)

    def _fail_task(self, task: _PublishTask) -> None:
        """Give the task up: the publisher hears complete=False; a forwarder stays silent (its
        upstream times out, since DONE carries no failure)."""
        if task.finished:
            return
        task.finished = True
        for _, _, ack_ids in task.waiting.values():
            for ack_id in ack_ids:
                self.done_slots.pop(ack_id, None)
        task.waiting.clear()
        if task.upstream is None:
            self._out.append(PublishDone(task.topic, task.publication_id, False))

    def _close_slot(self, ack_id: int) -> _PublishTask | None:
        """Forget the delegation sent with ``ack_id``; returns its task if still open."""
        entry = self.done_slots.pop(ack_id, None)
        if entry is None:
            return None
        task, slot = entry
        waiting = task.waiting.pop(slot, None)
        if waiting is not None:
            for other in waiting[2]:
                self.done_slots.pop(other, None)
        return None if task.finished else task

    def _on_done(self, sender: PeerId, msg: m.DONE) -> None:
        entry = self.done_slots.get(msg.ack_id)
        if entry is not None:
            waiting = entry[0].waiting.get(entry[1])
            if waiting is not None and waiting[1].dest[2] != sender:
                return  # only the peer the delegation went to can report it done (ack ids are guessable)
        task = self._close_slot(msg.ack_id)
        if task is not None:
            self._task_progress(task)

    def _redelegate(self, msg: m.PUB, task: _PublishTask | None) -> None:
        """Carry on a PUB whose receiver is gone or given up, from its forwarder (detouring);
        a tracked task fails if the sub-range can no longer be reached at all."""
        vnode = self.vnodes.get(msg.forwarder[0])
        if vnode is None:
            if task is not None:
                self._fail_task(task)
            return
        made = self._pub_step(
            vnode,
            msg.sender,
            msg.topic,
            msg.payload,
            msg.publication_id,
            msg.hops - 1,
            msg.lo,
            msg.hi,
            detour=True,
            task=task,
        )
        if task is not None:
            if made == 0 and not msg.lo <= vnode.key < msg.hi:
                self._fail_task(task)
            else:
                self._task_progress(task)

    def _redelegate_to_dead(self, peer: PeerId) -> None:
        """Delegations awaiting DONE from a peer declared dead go around it at once (the ACK
        may have come before the crash, so no ack timeout would fire)."""
        stranded = [
            (task, slot)
            for task, slot in self.done_slots.values()
            if slot in task.waiting and task.waiting[slot][1].dest[2] == peer
        ]
        for task, slot in stranded:
            if task.finished or slot not in task.waiting:
                continue
            _, msg, ack_ids = task.waiting[slot]
            for ack_id in ack_ids:
                self.outstanding.pop(ack_id, None)
            self._close_slot(slot)
            self._redelegate(msg, task)

    def _done_timeout(self, task: _PublishTask) -> None:
        self._fail_task(task)  # no-op when it finished in time
        if task.ident is not None and self.done_tasks.get(task.ident) is task:
            del self.done_tasks[task.ident]

    def _retry_delegation(self, task: _PublishTask, slot: int) -> None:
        """No DONE yet for a delegation (the DONE, or a DONE below it, may be lost): send the PUB
        again under a new ack id; the receiver re-runs its subtree, subscribers deliver once."""
        waiting = task.waiting.get(slot)
        if task.finished or waiting is None:
            return
        vnode, msg, ack_ids = waiting
        if self.vnodes.get(vnode.key) is not vnode or any(a in self.outstanding for a in ack_ids):
            return  # gone, or the per-hop ACK machinery is still on it
        retry = replace(msg, ack_id=self._next_id())
        ack_ids.append(retry.ack_id)
        task.waiting[slot] = (vnode, retry, ack_ids)
        self.done_slots[retry.ack_id] = (task, slot)
        self._expect_ack(vnode, retry, retry.ack_id, self.config.pub_ack_retries)
        self._send(retry.dest, retry)

    def _drop_pending_publishes(self, topic: str) -> None:
        queued = self.pending_publishes.pop(topic, [])
        if self.config.publish_done_enabled:
            for event, _ in queued:
                self._out.append(PublishDone(event.topic, event.publication_id, False))

    # ================================================================ UNSUB

    def _multicast_unsub(
        self, vnode: VirtualNode, origin: NodeRef, topic: str, lo: Key, hi: Key, detour: bool = False
    ) -> None:
        for dest, sub_lo, sub_hi in self._delegation_plan(vnode, lo, hi, detour=detour):
            ack_id = self._next_id() if self.config.pub_ack_enabled and dest[2] != self.peer_id else m.NO_ACK
            msg = m.UNSUB(dest, origin, vnode.ref, topic, sub_lo, sub_hi, ack_id)
            if ack_id:
                self._expect_ack(vnode, msg, ack_id, 0)
            self._send(dest, msg)

    def _on_unsub(self, sender: PeerId, msg: m.UNSUB) -> None:
        vnode = self._vnode_for(sender, msg)
        if vnode is None:
            return
        if msg.ack_id:
            self._send_peer(sender, m.ACK(msg.ack_id))
        self._accept_unsub(vnode, msg, detour=False)

    def _accept_unsub(self, vnode: VirtualNode, msg: m.UNSUB, *, detour: bool) -> None:
        self._bury_key(msg.sender[0], msg.sender[1])
        vnode.table.remove(msg.sender[0])  # never learned back (§3.5.6)
        if msg.forwarder[0] != msg.sender[0] and msg.forwarder[0] != vnode.key:
            self._learn(vnode, msg.forwarder)
        self._after_change(vnode)
        self._multicast_unsub(vnode, msg.sender, msg.topic, msg.lo, msg.hi, detour)

    # ================================================================ rendezvous point

    def _check_rendezvous(self, vnode: VirtualNode) -> None:
        table = vnode.table
        topic = vnode.key[0]
        if not is_rendezvous_candidate(table, vnode.key):
            vnode.rp_present = None
            return
        right = table.right0()
        present = right is not None and right[0] == topic and right[1] == SUBSCRIBER
        if vnode.rp_present == present:
            return
        vnode.rp_present = present
        self._set_presence(topic, present)
        lo, _ = run_bounds(topic, PUBLISHER)
        self._presence_step(vnode, vnode.ref, topic, present, lo, vnode.key)

    def _set_presence(self, topic: str, present: bool) -> None:
        if self.presence.get(topic) != present:
            self.presence[topic] = present
            self._out.append(SubscriberPresence(topic, present))

    def _presence_step(
        self, vnode: VirtualNode, origin: NodeRef, topic: str, present: bool, lo: Key, hi: Key
    ) -> None:
        for dest, sub_lo, sub_hi in self._delegation_plan(vnode, lo, hi, detour=False):
            self._send(dest, m.PRESENCE(dest, origin, vnode.ref, topic, present, sub_lo, sub_hi))

    def _on_presence(self, sender: PeerId, msg: m.PRESENCE) -> None:
        vnode = self._vnode_for(sender, msg)
        if vnode is None:
            return
        if msg.sender[0] != vnode.key:
            self._learn(vnode, msg.sender)
        if msg.forwarder[0] != msg.sender[0]:
            self._learn(vnode, msg.forwarder)
        self._after_change(vnode)
        key = vnode.key
        direct = msg.lo == msg.hi
        in_scope = direct or msg.lo <= key < msg.hi
        # the rendezvous point trusts its own observation
        if key[1] == PUBLISHER and key[0] == msg.topic and in_scope and vnode.rp_present is None:
            self._set_presence(msg.topic, msg.present)
        if not direct:
            self._presence_step(vnode, msg.sender, msg.topic, msg.present, msg.lo, msg.hi)

    def _on_presence_query(self, sender: PeerId, msg: m.PRESENCE_QUERY) -> None:
        vnode = self._vnode_for(sender, msg)
        if vnode is None:
            return
        self._learn(vnode, msg.sender)
        self._after_change(vnode)
        if vnode.rp_present is not None:
            dest = msg.sender[0]
            self._send(dest, m.PRESENCE(dest, vnode.ref, vnode.ref, msg.topic, vnode.rp_present, dest, dest))
            return
        nxt = farthest_same_run_right(vnode.table, vnode.key)
        if nxt is not None:
            self._send(nxt, m.PRESENCE_QUERY(nxt, msg.sender, msg.topic))

    # ================================================================ liveness, GONE, ACK

    def _on_ping(self, sender: PeerId, msg: m.PING) -> None:
        self._send_peer(sender, m.PONG(msg.nonce))

    def _on_pong(self, sender: PeerId, msg: m.PONG) -> None:
        return  # _receive already refreshed last_heard

    def _known_gone(self, key: Key, mv: int) -> bool:
        if key[2] in self.dead:
            return True
        tomb = self.tombstones.get(key)
        return tomb is not None and tomb[0] == mv and self.now < tomb[1]

    def _drop_hearsay(self, key: Key) -> None:
        """Another peer (not the key's host) says ``key`` is gone: it may only suspect a crash, so
        drop the entry where it is not a level-0 neighbour (no tombstone: the next hearsay from a
        live node brings it back); where it is one, our own PINGs decide (``_watch``)."""
        if key[2] == self.peer_id:
            return  # our own virtual node: we know better (the sender only suspects us)
        for vnode in list(self.vnodes.values()):
            if key == vnode.left0 or key == vnode.right0:
                self._watch(key[2])
            elif vnode.table.remove(key):
                self._after_change(vnode)

    def _on_gone(self, sender: PeerId, msg: m.GONE) -> None:
        if sender != msg.gone[2]:
            self._drop_hearsay(msg.gone)
            return
        self._forget_everywhere(msg.gone)
        bounced = msg.bounced
        if bounced is None:
            return
        self._reroute(bounced)

    def _reroute(self, bounced: Any) -> None:
        """Carry on a range/search message whose receiver vanished, from its forwarder."""
        forwarder = bounced.forwarder
        if forwarder is None:
            if isinstance(bounced, m.SEARCH):  # the origin's own first hop: start again
                key = self.requests.get(bounced.request_id)
                join = self.pending.get(key) if key is not None else None
                if join is not None:
                    self._start_search(join)
            return
        if isinstance(bounced, m.PUB):
            task = self._close_slot(bounced.ack_id) if bounced.ack_id else None
            self._redelegate(bounced, task)
            return
        vnode = self.vnodes.get(forwarder[0])
        if vnode is None:
            return
        if isinstance(bounced, m.UNSUB):
            self._multicast_unsub(vnode, bounced.sender, bounced.topic, bounced.lo, bounced.hi, detour=True)
        elif isinstance(bounced, m.PRESENCE):
            self._presence_step(vnode, bounced.sender, bounced.topic, bounced.present, bounced.lo, bounced.hi)
        elif isinstance(bounced, m.SEARCH):
            self._search_step(bounced)

    def _on_ack(self, sender: PeerId, msg: m.ACK) -> None:
        entry = self.outstanding.get(msg.ack_id)
        if entry is not None and entry[1].dest[2] != sender:
            return  # only the peer the message went to acknowledges it
        self.outstanding.pop(msg.ack_id, None)

    def _expect_ack(self, vnode: VirtualNode, msg: Any, ack_id: int, tries: int) -> None:
        self.outstanding[ack_id] = (vnode, msg, tries)
        self._timer(self.now + self.config.pub_ack_timeout_s, _T_ACK, ack_id)

    def _ack_timeout(self, ack_id: int) -> None:
        entry = self.outstanding.pop(ack_id, None)
        if entry is None:
            return
        vnode, msg, tries = entry
        if self.vnodes.get(vnode.key) is not vnode:
            if isinstance(msg, m.PUB):
                task = self._close_slot(ack_id)
                if task is not None:
                    self._fail_task(task)
            return
        if tries < self.config.pub_ack_retries:  # maybe just lost: same receiver, new ack id
            retry = replace(msg, ack_id=self._next_id())
            self._expect_ack(vnode, retry, retry.ack_id, tries + 1)
            tracked = self.done_slots.get(ack_id)
            if tracked is not None and tracked[1] in tracked[0].waiting:
                task, slot = tracked
                ack_ids = task.waiting[slot][2]
                ack_ids.append(retry.ack_id)
                task.waiting[slot] = (vnode, retry, ack_ids)
                self.done_slots[retry.ack_id] = tracked
            self._send(retry.dest, retry)
            return
        if vnode.table.remove(msg.dest):  # suspected crashed: drop the entry, re-delegate around it
            self._after_change(vnode)
        self._reroute(msg)

    # ================================================================ timers

    def _tick(self) -> None:
        timers = self.timers
        now = self.now
        while timers and timers[0][0] <= now:
            _, _, kind, arg = heapq.heappop(timers)
            if kind == _T_REXP:
                self._periodic_rexp(arg)
            elif kind == _T_ACK:
                self._ack_timeout(arg)
            elif kind == _T_LINK:
                self._relink(arg)
            elif kind == _T_DONE:
                self._done_timeout(arg)
            elif kind == _T_DONE_RETRY:
                self._retry_delegation(*arg)
            elif kind == _T_NOTICE:
                if arg.dest[2] not in self.dead:
                    self._send(arg.dest, arg)
            elif kind == _T_PING:
                self._ping_round()
            elif kind == _T_EEXP_RANGE:
                self._join_eexp(arg)
            elif kind == _T_EEXP_RANDOM:
                self._random_eexp(arg)
            elif kind == _T_VERIFY:
                self._verify_position(arg)
            elif kind == _T_SEARCH:
                key = self.requests.get(arg)
                join = self.pending.get(key) if key is not None else None
                if join is not None and join.request_id == arg:
                    self._search_timeout(join)

    def _search_timeout(self, join: _PendingJoin) -> None:
        """No answer to a search this peer routed itself: the entry it went to is suspected
        crashed and dropped (as an unacknowledged PUB's receiver is), so the retry goes another
        way. Without this a dead peer's entry that no ping watches (not a level-0 neighbour) and
        that nobody tells us about takes every retry (a join pending forever)."""
        hop = join.first_hop
        if hop is not None and not any(hop in (v.left0, v.right0) for v in self.vnodes.values()):
            # level-0 neighbours are pinged and declared crashed by their own rule; a lost search
            # must not cut the ring
            for vnode in list(self.vnodes.values()):
                if vnode.table.remove(hop):
                    self._after_change(vnode)
        self._start_search(join)

    def _periodic_rexp(self, vnode: VirtualNode) -> None:
        if self.vnodes.get(vnode.key) is not vnode:
            return
        table = vnode.table
        existing = tuple(table.keys)
        for neighbour in (table.left0(), table.right0()):
            if neighbour is not None:
                self._send(neighbour, m.REXP(neighbour, vnode.ref, vnode.ref, existing, 0))
        if vnode.rp_present is not None:  # the rendezvous point refreshes the publishers' view
            topic = vnode.key[0]
            lo, _ = run_bounds(topic, PUBLISHER)
            self._presence_step(vnode, vnode.ref, topic, vnode.rp_present, lo, vnode.key)
        interval = self.config.rexp_interval_s
        self._timer(self.now + interval * (0.9 + 0.2 * self.rng.random()), _T_REXP, vnode)

    def _join_eexp(self, vnode: VirtualNode) -> None:
        if self.vnodes.get(vnode.key) is vnode:
            self._issue_range_eexp(vnode)

    def _random_eexp(self, vnode: VirtualNode) -> None:
        config = self.config
        if self.vnodes.get(vnode.key) is not vnode:
            return
        table = vnode.table
        missing = config.table_size - len(table)
        if missing < 1 or vnode.random_rounds >= config.eexp_random_max_rounds or not table.keys:
            return
        vnode.random_rounds += 1
        self._eexp_random_step(vnode, vnode.ref, tuple(table.keys), missing, vnode.key)
        self._timer(self.now + config.eexp_random_interval_s, _T_EEXP_RANDOM, vnode)

    def _ping_round(self) -> None:
        config = self.config
        now = self.now
        for peer, until in list(self.dead.items()):
            if until <= now:
                del self.dead[peer]
                self.buried.pop(peer, None)
            else:  # a wrongly suspected peer (lost pings) answers and is forgiven (see _receive)
                self._send_peer(peer, m.PING(self._next_id()))
        watched: set[PeerId] = set()
        for vnode in self.vnodes.values():
            for neighbour in (vnode.left0, vnode.right0):
                if neighbour is not None and neighbour[2] != self.peer_id:
                    watched.add(neighbour[2])
        self._probe_contacts()
        for peer in sorted(watched, key=repr):
            heard = self.last_heard.get(peer)
            if heard is None:
                self.last_heard[peer] = now
            elif now - heard >= config.failure_timeout_s and self.probes.get(peer, 0) >= 2:
                self._declare_dead(peer)  # silent for the timeout and at least two PINGs unanswered
            elif now - heard >= config.ping_interval_s:
                self.probes[peer] = self.probes.get(peer, 0) + 1
                self._send_peer(peer, m.PING(self._next_id()))
        for peer in [peer for peer in self.last_heard if peer not in watched]:
            del self.last_heard[peer]  # only peers hosting level-0 neighbours are timed
            self.probes.pop(peer, None)
        self._timer(now + config.ping_interval_s, _T_PING, None)


def _listed(existing: tuple[Key, ...], key: Key) -> bool:
    """Whether ``key`` is in an existing-entry list (§3.5.6). The list is a table's keys, ascending
    (``tuple(table.keys)``): a binary search instead of a scan of up to L+1 keys, on every REXP and
    EEXP received (the scan was about 4 s of a 138-s profiled N = 1,000, L = 120 series). A list
    that is not ascending (a faulty peer) costs at most a NEW too many or too few."""
    index = bisect_left(existing, key)
    return index < len(existing) and existing[index] == key
