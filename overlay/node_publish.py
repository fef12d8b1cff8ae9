"""Publish queries of an overlay node (seed 003 §3.5.4): PUB by range multicast to the subscriber
range (with an EEXP while the table is short of entries), delivery with duplicate suppression,
end-to-end completion (DONE, ``api.PublishDone``), re-delegation around crashed receivers, UNSUB
by range multicast (§3.5.3) and the per-hop ACK of PUB/UNSUB delegations.

Part of ``overlay.node.OverlayNode`` (the module docstring there says how the class is split).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from overlay import messages as m
from overlay.api import Deliver, JoinTopic, PeerId, Publish, PublishDone
from overlay.keys import PUBLISHER, SUBSCRIBER, Key, NodeRef, run_bounds
from overlay.node_base import NodeBase
from overlay.node_state import T_ACK, T_DONE, T_DONE_RETRY, PublishTask, VirtualNode


class PublishQueries(NodeBase):
    """PUB, DONE, UNSUB and ACK of ``OverlayNode``."""

    # =================================================================== publish / PUB

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
        task: PublishTask | None = None
        if config.publish_done_enabled:
            if self.presence.get(event.topic) is False:
                self._out.append(PublishDone(event.topic, event.publication_id, True, reached=False))
                return
            task = PublishTask(None, event.topic, event.publication_id)
            started = self.now if published_at is None else published_at
            self._timer(started + config.publish_done_timeout_s, T_DONE, task)
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
        task: PublishTask | None = None,
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
                    self._timer(retry_at, T_DONE_RETRY, (task, ack_id))
            if ack_id and remote:
                self._expect_ack(vnode, msg, ack_id, 0)
            self._send(dest, msg)
        return len(plan)

    def _on_pub(self, sender: PeerId, msg: m.PUB) -> None:
        vnode = self._vnode_for(sender, msg)
        if vnode is None:
            return
        if msg.ack_id and sender != self.peer_id:
            self._send_peer(sender, m.ACK(msg.ack_id))
        task: PublishTask | None = None
        if msg.ack_id and self.config.publish_done_enabled:
            ident = (vnode.key, msg.sender[0], msg.publication_id, msg.lo, msg.hi)
            known = self.done_tasks.get(ident)
            if known is not None:  # a retransmission (lost ACK or DONE): never re-run the subtree
                if not known.finished:
                    known.also.append((sender, msg.ack_id))
                elif known.succeeded:
                    self._send_peer(sender, m.DONE(msg.ack_id))
                return  # (a failed subtree stays silent; the publisher times out)
            task = PublishTask((sender, msg.ack_id), msg.topic, msg.publication_id, ident)
            self.done_tasks[ident] = task
            self._timer(self.now + self.config.publish_done_timeout_s, T_DONE, task)
        self._accept_pub(vnode, msg, msg.hops, detour=False, task=task)
        if task is not None:
            self._settle_task(task, vnode, msg.lo, msg.hi)

    def _accept_pub(
        self, vnode: VirtualNode, msg: m.PUB, hops: int, *, detour: bool, task: PublishTask | None = None
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

    # ==================================================== end-to-end completion (DONE)

    def _task_progress(self, task: PublishTask) -> None:
        """Report a task whose delegations all reported DONE (its own Deliver is already out)."""
        if task.finished or task.waiting:
            return
        task.finished = task.succeeded = True
        if task.upstream is None:
            self._out.append(PublishDone(task.topic, task.publication_id, True, reached=task.reached))
        else:
            for peer, ack_id in (task.upstream, *task.also):
                self._send_peer(peer, m.DONE(ack_id))

    def _settle_task(self, task: PublishTask, vnode: VirtualNode, lo: Key, hi: Key) -> None:
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

    def _fail_task(self, task: PublishTask) -> None:
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

    def _close_slot(self, ack_id: int) -> PublishTask | None:
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

    def _redelegate(self, msg: m.PUB, task: PublishTask | None) -> None:
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

    def _done_timeout(self, task: PublishTask) -> None:
        self._fail_task(task)  # no-op when it finished in time
        if task.ident is not None and self.done_tasks.get(task.ident) is task:
            del self.done_tasks[task.ident]

    def _retry_delegation(self, task: PublishTask, slot: int) -> None:
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

    # =========================================================================== UNSUB

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

    def _on_ack(self, sender: PeerId, msg: m.ACK) -> None:
        entry = self.outstanding.get(msg.ack_id)
        if entry is not None and entry[1].dest[2] != sender:
            return  # only the peer the message went to acknowledges it
        self.outstanding.pop(msg.ack_id, None)

    # ===================================================================== per-hop ACK

    def _expect_ack(self, vnode: VirtualNode, msg: Any, ack_id: int, tries: int) -> None:
        self.outstanding[ack_id] = (vnode, msg, tries)
        self._timer(self.now + self.config.pub_ack_timeout_s, T_ACK, ack_id)
