"""The shared ground of an overlay node (seed 003 §3): its state, sending, learning of entries and
the level-0 rules (§3.5.6 receipt, §3.5.2 adjacency), the range-multicast steps that PUB, UNSUB,
PRESENCE and EEXP share (§3.5.1), and the rendezvous point (§3.2).

Part of ``overlay.node.OverlayNode`` (the module docstring there says how the class is split):
``NodeBase`` is the lowest base. Level-0 changes (``_after_change``) re-check the rendezvous
point, so it lives here, below publish and maintenance, which both drive it.
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_left, bisect_right
from collections import deque
from typing import Any

from overlay import messages as m
from overlay.api import Action, Event, PeerId, Publish, Send, SubscriberPresence
from overlay.config import OverlayConfig
from overlay.formation import Formation
from overlay.keys import ANCHOR_TOPIC, PUBLISHER, SUBSCRIBER, Key, NodeRef, random_index, run_bounds
from overlay.multicast import Delegation, plan_delegation, route_toward_range
from overlay.node_state import T_LINK, T_NOTICE, PendingJoin, PublishTask, VirtualNode
from overlay.skipgraph import farthest_same_run_right, is_rendezvous_candidate


class NodeBase:
    """State, sending, level 0, range steps and the rendezvous point of ``OverlayNode``."""

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
        self.pending: dict[Key, PendingJoin] = {}
        self.requests: dict[int, Key] = {}
        self.verifying: dict[int, tuple[Key, float]] = {}  # verification search -> (vnode, until)
        self.pending_publishes: dict[str, list[tuple[Publish, float]]] = {}  # (event, time queued)
        self.done_slots: dict[int, tuple[PublishTask, int]] = {}  # PUB ack id -> (task, slot)
        self.done_tasks: dict[Any, PublishTask] = {}  # received delegation -> its task (for a while)
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

    # ======================================================================== plumbing

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

    def _vnode_for(self, sender: PeerId, message: Any) -> VirtualNode | None:
        """The addressed virtual node, or None after telling the sender it is gone."""
        vnode = self.vnodes.get(message.dest)
        if vnode is None:
            bounced = message if isinstance(message, m.PUB | m.UNSUB | m.PRESENCE | m.SEARCH) else None
            if isinstance(message, m.PUB | m.UNSUB) and message.ack_id:
                self._send_peer(sender, m.ACK(message.ack_id))
            self._send_peer(sender, m.GONE(message.dest, bounced))
        return vnode

    # ============================================================== learning & level 0

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
            self._timer(self.now + self.config.link_retry_s, T_NOTICE, notice)
        if right is not None and old_right is not None and right < old_right and old_right[2] not in dead:
            keys = table.keys
            notice = m.NEW(old_right, table.ref(keys[bisect_left(keys, old_right) - 1]))
            self._send(old_right, notice)
            self._timer(self.now + self.config.link_retry_s, T_NOTICE, notice)
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
        self._timer(self.now + self.config.link_retry_s, T_LINK, vnode)
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

    # ======================================== range steps (PUB, UNSUB, PRESENCE, EEXP)

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

    def _detour(self, vnode: VirtualNode, lo: Key, hi: Key) -> Key | None:
        """A known node beyond the far end of [lo, hi) that can reach into it from there."""
        keys = vnode.table.keys
        after = [key for key in keys if key >= hi]
        if after:
            return after[0]
        before = [key for key in keys if key < lo]
        return before[-1] if before else None

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

    # ================================================================== departed nodes

    def _known_gone(self, key: Key, mv: int) -> bool:
        if key[2] in self.dead:
            return True
        tomb = self.tombstones.get(key)
        return tomb is not None and tomb[0] == mv and self.now < tomb[1]
