"""Maintenance queries of an overlay node (seed 003 §3.5.5, §3.5.6): receipt of REXP, EEXP and
LINK, the periodic REXP and the EEXP rounds that refill a short table, liveness (PING/PONG, peers
declared dead and forgiven), GONE and the re-routing of bounced messages, ACK timeouts, and the
timers that drive all of it.

Part of ``overlay.node.OverlayNode`` (the module docstring there says how the class is split).
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Any

from overlay import messages as m
from overlay.api import PeerId
from overlay.keys import PUBLISHER, Key, NodeRef, run_bounds
from overlay.node_join import JoinQueries
from overlay.node_state import (
    T_ACK,
    T_DONE,
    T_DONE_RETRY,
    T_EEXP_RANDOM,
    T_EEXP_RANGE,
    T_LINK,
    T_NOTICE,
    T_PING,
    T_REXP,
    T_SEARCH,
    T_VERIFY,
    PendingJoin,
    VirtualNode,
    listed,
)
from overlay.skipgraph import rexp_next_hop


class MaintenanceQueries(JoinQueries):
    """REXP / EEXP / LINK, refresh, liveness, repair and timers of ``OverlayNode``."""

    # ===================================================== liveness, GONE, ACK timeout

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

    # ============================================================== REXP / EEXP / LINK

    def _on_rexp(self, sender: PeerId, msg: m.REXP) -> None:
        vnode = self._vnode_for(sender, msg)
        if vnode is None:
            return
        origin = msg.sender
        if origin[0] == vnode.key:
            return
        if not listed(msg.existing, vnode.key):
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
        self._timer(self.now + self.config.link_retry_s, T_LINK, vnode)

    def _on_eexp(self, sender: PeerId, msg: m.EEXP) -> None:
        vnode = self._vnode_for(sender, msg)
        if vnode is None:
            return
        origin = msg.sender
        supplied = False  # this node is an entry the origin lacked (§3.5.6: it answers NEW)
        if origin[0] != vnode.key:
            if not listed(msg.existing, vnode.key):
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

    def _on_ping(self, sender: PeerId, msg: m.PING) -> None:
        self._send_peer(sender, m.PONG(msg.nonce))

    def _on_pong(self, sender: PeerId, msg: m.PONG) -> None:
        return  # _receive already refreshed last_heard

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

    # ========================================================================== timers

    def _tick(self) -> None:
        timers = self.timers
        now = self.now
        while timers and timers[0][0] <= now:
            _, _, kind, arg = heapq.heappop(timers)
            if kind == T_REXP:
                self._periodic_rexp(arg)
            elif kind == T_ACK:
                self._ack_timeout(arg)
            elif kind == T_LINK:
                self._relink(arg)
            elif kind == T_DONE:
                self._done_timeout(arg)
            elif kind == T_DONE_RETRY:
                self._retry_delegation(*arg)
            elif kind == T_NOTICE:
                if arg.dest[2] not in self.dead:
                    self._send(arg.dest, arg)
            elif kind == T_PING:
                self._ping_round()
            elif kind == T_EEXP_RANGE:
                self._join_eexp(arg)
            elif kind == T_EEXP_RANDOM:
                self._random_eexp(arg)
            elif kind == T_VERIFY:
                self._verify_position(arg)
            elif kind == T_SEARCH:
                key = self.requests.get(arg)
                join = self.pending.get(key) if key is not None else None
                if join is not None and join.request_id == arg:
                    self._search_timeout(join)

    def _search_timeout(self, join: PendingJoin) -> None:
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

    # ======================================================= periodic refresh (§3.5.5)

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
        self._timer(self.now + interval * (0.9 + 0.2 * self.rng.random()), T_REXP, vnode)

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
        self._timer(self.now + config.eexp_random_interval_s, T_EEXP_RANDOM, vnode)

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
        self._timer(now + config.ping_interval_s, T_PING, None)
