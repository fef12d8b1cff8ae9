"""Join queries of an overlay node (seed 003 §3.5.2, §3.5.3): bootstrap, overlay formation
(``overlay.formation``), the greedy SEARCH for the insertion position, the join itself (sticky
level-0 neighbours, REXP to both, EEXP timers), the later position check, leave (LEAVE, UNSUB)
and receipt of NEW (§3.5.6).

Part of ``overlay.node.OverlayNode`` (the module docstring there says how the class is split).
"""

from __future__ import annotations

from dataclasses import replace

from overlay import messages as m
from overlay.api import JoinTopic, LeaveTopic, PeerId
from overlay.formation import should_yield
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
from overlay.node_publish import PublishQueries
from overlay.node_state import (
    T_EEXP_RANDOM,
    T_EEXP_RANGE,
    T_LINK,
    T_PING,
    T_REXP,
    T_SEARCH,
    T_VERIFY,
    PendingJoin,
    VirtualNode,
)
from overlay.skipgraph import peer_search_step, search_answer


class JoinQueries(PublishQueries):
    """Bootstrap, formation, search, join, leave and NEW of ``OverlayNode``."""

    # ===================================================== inspection used by the join

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

    # ================================================================ bootstrap & join

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
            self._timer(self.now + self.config.ping_interval_s * (0.5 + self.rng.random()), T_PING, None)
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
        join = PendingJoin(key, mv, 0)
        self.pending[key] = join
        self._start_search(join)

    def _start_search(self, join: PendingJoin) -> None:
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
        self._timer(self.now + self.config.search_timeout_s, T_SEARCH, join.request_id)
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

    def _formation_round(self, join: PendingJoin, search: m.SEARCH) -> None:
        """A seed with no virtual node: close the last round (found?) and probe every contact."""
        config = self.config
        lead = self.formation_key
        if lead is not None and lead != join.key and lead in self.pending:
            join.waiting = True  # the leading join finds the overlay, or founds it, first
            self._timer(self.now + config.search_timeout_s, T_SEARCH, join.request_id)
            return
        self.formation_key = join.key
        if self.formation.close_round(self.peer_id):  # the lowest reachable seed: found
            self.requests.pop(join.request_id, None)
            self.formation.reset()
            self.founded = True
            self._complete_join(join, None, None)
            return
        self.formation.start_round(join.request_id)
        self._timer(self.now + config.formation_round_s, T_SEARCH, join.request_id)
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
            join = PendingJoin(key, random_membership_vector(self.rng, self.config.mv_bits), 0)
            self.pending[key] = join
            self._start_search(join)

    # ========================================================================== search

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

    # ================================================================== position check

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
            self._timer(self.now + delay, T_VERIFY, vnode)

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
            self._timer(self.now + min(1.0, self.config.search_timeout_s), T_SEARCH, msg.request_id)

    # ================================================================== join completes

    def _complete_join(self, join: PendingJoin, pred: NodeRef | None, succ: NodeRef | None) -> None:
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
        self._timer(now + config.link_retry_s, T_LINK, vnode)  # REXP lost? re-announce by LINK
        if config.join_verify_rounds > 0:
            self._timer(now + config.join_verify_delay_s, T_VERIFY, vnode)
        rng = self.rng
        self._timer(now + config.rexp_interval_s * (0.9 + 0.2 * rng.random()), T_REXP, vnode)
        if config.frt_enabled:
            self._timer(now + config.eexp_delay_s, T_EEXP_RANGE, vnode)
            self._timer(now + config.eexp_delay_s + config.eexp_random_delay_s, T_EEXP_RANDOM, vnode)
        topic, role = join.key[0], join.key[1]
        if role == PUBLISHER and topic != ANCHOR_TOPIC:
            self._check_rendezvous(vnode)
            if vnode.rp_present is None and vnode.right0 is not None:
                self._send(vnode.right0, m.PRESENCE_QUERY(vnode.right0, vnode.ref, topic))
            for event, queued_at in self.pending_publishes.pop(topic, []):
                self._publish(event, queued_at)

    # =========================================================================== leave

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

    # ============================================================================= NEW

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
