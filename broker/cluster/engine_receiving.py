"""The cluster engine's inputs from other brokers (docs/cluster.md).

:class:`EngineReceiving` is the part of ``broker.cluster.engine.ClusterEngine`` that takes what the
``PeerTransport`` reports: items received (overlay queries, deliveries of the overlay, directed
envelopes, each checked by ``broker.cluster.inbound`` and the origin checks first), peers down,
back or gone, and the periodic probe and sweep that follow peers and idle state. It holds no
state of its own.

Size: with the flow-control decisions of catch-up (room, holds, the window rules, the stall) that
the receiver's callbacks ask for: they read and set the same per-stream sets of set-aside, gated
and absent sessions, and split apart each would reach into the others' (about 690 lines).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from broker.cluster.engine_base import (
    CATCH_UP_GIVE_UP_S,
    DOWN_PEER_MEMORY_S,
    PROBE_RETRANSMITS,
    PUBLISHER_IDLE_S,
    RTT_SAMPLE_MASK,
    STREAM_IDLE_S,
    SWEEP_INTERVAL_S,
)
from broker.cluster.engine_takeover import TakeoverGlue
from broker.cluster.inbound import envelope_problem, payload_problem
from broker.cluster.messages import (
    ClaimReply,
    ClassInterest,
    Envelope,
    ForwardedBatch,
    ForwardedMessage,
    RetainedSyncReply,
    RetainedSyncRequest,
    RetainedUpdate,
    SessionClaim,
)
from broker.cluster.stream_receiver import RET_WINDOW, UNLIMITED
from broker.cluster.streams import CONTROL_CLASS
from broker.cluster.takeover import LateSession
from overlay import api
from overlay.api import Role
from overlay.messages import ACK, PONG

if TYPE_CHECKING:
    from broker.core.ports import BrokerApi

log = logging.getLogger("skipmq.cluster")


class EngineReceiving(TakeoverGlue):
    """See the module docstring."""

    def on_receive(self, sender: str, item: object) -> None:
        """A message from broker ``sender`` (an overlay query, or a directed envelope)."""
        if self.stopped:
            return
        if sender not in self._heard_from or sender in self._down_peers:
            self._departed.discard(sender)
            self._heard_from.add(sender)
            self._unheard_contacts.discard(sender)
            self._peer_back(sender)
        kind = type(item)
        self.stats.overlay_received[kind] += 1
        if kind is ACK:
            if not item.ack_id & RTT_SAMPLE_MASK:  # type: ignore[attr-defined]
                self._round_trip_answered(sender, item.ack_id)  # type: ignore[attr-defined]
        elif kind is PONG:
            self._round_trip_answered(sender, item.nonce)  # type: ignore[attr-defined]
        self._receiving_from = sender
        self._note_link(sender, item)  # (engine_origin: what a proven link vouches for)
        try:
            if isinstance(item, Envelope):
                problem = envelope_problem(sender, self.peer_id, item)
                if problem is None and isinstance(item.body, RetainedSyncReply):
                    problem = self._unasked_retained_reply(sender, item.body.request_id)
                checks = self.origin_checks
                if problem is not None:
                    self._reject(sender, item.body, problem)
                elif checks is None or not self._origin_refused(
                    checks.check_envelope(item, self._wall_s(), self._link_peer(item))
                ):
                    self._on_envelope(item)
            else:
                self._handle(api.Receive(sender, item))
        except Exception:
            log.exception("cluster: failed to handle %s from %s", type(item).__name__, sender)
        self._after_event()

    def on_peer_down(self, peer: str) -> None:
        """The transport lost broker ``peer`` (refused, broken link)."""
        if self.stopped:
            return
        self._handle(api.PeerUnreachable(peer))
        self._down_peers.setdefault(peer, self._now())
        if self._next_probe is None:
            self._next_probe = self._now() + self.retransmit_s * PROBE_RETRANSMITS
        assert self.transport is not None and self.takeover is not None
        self.transport.drop_queued(peer)  # the overlay re-sends what matters around it
        self._finish_claims(self.takeover.peer_down(peer))
        self.takeover.claimant_down(peer, self._now())
        self.announcer.forget(peer)
        self._after_event()

    def _room_for(self, key: tuple[str, str]) -> int:
        """How many more messages of stream ``key`` the local sessions of its class take now: the
        least room below half its queue limit over those sessions (the other half stays free for
        live messages of other streams meanwhile); seed 004's minBUF of the flow condition.
        Sessions set aside on this stream (slower than the live stream) do not count; the
        connected ones with no room are noted (``_catch_up_window_closed``)."""
        broker = self.broker
        if broker is None:
            return UNLIMITED
        room = UNLIMITED
        set_aside = self._set_aside.get(key)
        least: list[str] = []  # the connected sessions with the least room (they gate it)
        for client_id in self.interest.clients_of(key[1]):
            depth = broker.queue_depth(client_id)
            if depth is not None:
                queued, limit = depth
                left = max(1, limit // 2) - queued
                if set_aside is not None and client_id in set_aside:
                    if queued > limit // 4:
                        continue  # still behind: its queue policy applies
                    set_aside.discard(client_id)  # drained to a quarter of its limit: paces again
                    self._backlog_arrived(key, client_id)
                if not broker.client_connected(client_id):
                    self._absent_in_window.setdefault(key, set()).add(client_id)
                    if self._claimable_after_restart(client_id):
                        left = 0  # its client may have moved on: a claim takes it (engine_takeover)
                    if left < RET_WINDOW:  # an away session holds it below one window
                        self._away_gated.setdefault(key, Counter())[client_id] += 1
                elif left < room:
                    least = [client_id]
                elif left == room:
                    least.append(client_id)
                room = min(room, left)
        if least and room < RET_WINDOW:  # it holds the catch-up below one window
            gated = self._gated.setdefault(key, Counter())
            for client_id in least:
                gated[client_id] += 1
        return room

    def _hold_for_absent(self, key: tuple[str, str]) -> bool:
        """Whether the live stream ``key`` is to be paced as a catch-up (``StreamReceiver.hold_live``):
        every local session of its class is away (none connected) and one of them, not set aside,
        has no room below half its queue limit (or may be claimed after this broker's restart). A
        single broker drops for an offline session beyond its queue limit; in a cluster the client
        is often moving to another broker (its session follows with the positions this broker
        stood at) or reconnecting, so the senders' logs keep the stream instead, up to the stall
        (``StreamReceiver.stall_s``) after which such sessions are set aside and drop by policy.
        With a connected session of the class here, nothing is held: no head-of-line blocking."""
        broker = self.broker
        if broker is None:
            return False
        set_aside = self._set_aside.get(key, ())
        holding = False
        for client_id in self.interest.clients_of(key[1]):
            if broker.client_connected(client_id):
                return False
            if client_id in set_aside:
                continue
            depth = broker.queue_depth(client_id)
            if depth is None:
                continue
            if depth[0] >= max(1, depth[1] // 2) or self._claimable_after_restart(client_id):
                holding = True
        return holding

    def _catch_up_window_closed(self, key: tuple[str, str], fell_behind: bool, behind: int) -> int:
        """A window (``stream_receiver.SLOW_WINDOW_S``) of the catch-up of ``key`` is over. If it
        fell further behind the live stream, the sessions that gated it while connected throughout
        the window drain slower than the live stream: they stop pacing it (no head-of-line blocking:
        the others' catch-up goes on at their pace) and take its messages with their queue policy,
        as on one broker - drops counted (``queue_full_oldest``) and logged. An absent session keeps
        gating (its client is reconnecting, e.g. after this broker restarted) up to the stall
        (``StreamReceiver.stall_s``). A set-aside session paces again once it has drained to a
        quarter of its queue limit (half when the stream is live again: ``_catch_up_over``) - not
        at half, where a catch-up paced by the others leaves it between two windows. How many
        sessions were set aside."""
        gated = self._gated.pop(key, Counter())
        absent = self._absent_in_window.pop(key, set())
        away_gated = self._away_gated.pop(key, Counter())
        least = min(behind, self._least_behind_at_close.get(key, behind))
        self._least_behind_at_close[key] = least
        broker = self.broker
        if broker is None:
            return 0
        away = self._away_holding_back(key, gated, away_gated, behind) if away_gated else 0
        if not gated:
            return away
        if not fell_behind:
            return away + self._holding_back_the_class(key, gated, absent, behind)
        # the sessions that held it most of the window (not one that drained a restored queue first)
        # and for which the catch-up has fallen behind, since its least backlog, by half their
        # queue limit or more (the half the pacing leaves them; the whole limit held the fast one
        # of test_slow_subscriber_sim.py back past 2x its p99 alone). One window that fell behind
        # proves nothing alone: after a restart the broker and its clients warm up, and a catch-up
        # that then drains at twice the live rate was set aside and dropped 5,136 of 12,455 (the
        # recovery matrix, docs/notes/recovery.md)
        most = max(gated.values())
        slow = sorted(
            c
            for c, n in gated.items()
            if n * 2 >= most
            and c not in absent
            and broker.client_connected(c)
            and behind - least >= _queue_limit(broker, c) // 2
        )
        if not slow or not self._held_back_by(key, slow):
            return away
        self._set_aside.setdefault(key, set()).update(slow)
        self.stats.catch_up_sessions_set_aside += len(slow)
        for client_id in slow:
            log.warning(
                "cluster_catch_up_session_set_aside client_id=%s origin=%s stream=%s behind=%d "
                "reason=slower_than_stream (its queue policy applies until it has drained)",
                client_id,
                key[0],
                key[1],
                behind,
            )
        return away + len(slow)

    def _away_holding_back(
        self, key: tuple[str, str], gated: Counter[str], away_gated: Counter[str], behind: int
    ) -> int:
        """A window of the catch-up of ``key`` is over. The sessions whose client is away (not
        connected here now) that held it below one RET window most of the window, beside a
        connected session of its class here with room for a RET window or more (held back by
        them), stop pacing it: no head-of-line blocking by an away session (before this rule one
        gated the connected ones' whole catch-up until its client came back or the 10 s stall: the
        fast one's p99 2.38x its p99 alone in test_slow_subscriber_sim.py, 2.15x in the bench).
        The backlog - what its queue holds and the rest of the catch-up as known now - is the
        cluster's, not the client's lag: counted apart from its queue limit, as for a connected
        session set aside with no live stream (``_holding_back_the_class``; at most 4 queue limits,
        drop-oldest beyond, counted and logged), so the offline session keeps a queue, as on one
        broker. Not in the claim grace after this broker's restart (``_claimable_after_restart``:
        a claim from the broker its client moved to takes the session with the positions it stood
        at, not with a queue of what the client got there meanwhile); a session alone in its class
        here is never set aside so (nobody is held back). It paces again once drained to a quarter
        of its queue limit (``_room_for``). How many sessions were set aside."""
        broker = self.broker
        assert broker is not None
        most = max(max(gated.values(), default=0), max(away_gated.values()))
        set_aside = self._set_aside.get(key, ())
        away = sorted(
            c
            for c, n in away_gated.items()
            if n * 2 >= most
            and c not in set_aside
            and not broker.client_connected(c)
            and not self._claimable_after_restart(c)
        )
        if not away or not self._held_back_with_room(key, away):
            return 0
        self._set_aside_counted_apart(
            key,
            away,
            behind,
            "away_holds_back_class (its client is away; the backlog is counted apart, its queue"
            " policy applies beyond it)",
        )
        return len(away)

    def _holding_back_the_class(
        self, key: tuple[str, str], gated: Counter[str], absent: set[str], behind: int
    ) -> int:
        """A window of the catch-up of ``key`` is over and it did not fall behind a live stream (the
        stream is over, or as slow as the catch-up: e.g. this broker was down longer than the
        stream lasted, so its whole backlog is catch-up). The sessions that gated it most of the
        window while connected throughout, beside another connected session of its class here
        with room for a RET window or more (not gating, not set aside: it is held back), stop
        pacing it: the others' catch-up goes on at their pace (no head-of-line blocking). Nothing
        shows them slower than the stream (no live stream to compare; the rate it was published at
        is not known here after a restart), so what their queues hold and the rest of the
        catch-up as known now (``behind``) are the cluster's backlog, not their lag: counted apart
        from the queue limit, as for the stall (``_catch_up_stalled``, ``Outbound.allow_backlog``:
        at most 4 queue limits; drop-oldest beyond, counted and logged). They pace again once
        drained to a quarter of their queue limit (``_room_for``). A session alone in its class
        here (a moved session that drains a bit slower for a few seconds) is never set aside so:
        nobody would go faster. Before this rule a session draining at 100 msg/s paced the whole
        catch-up of a fast one beside it, p99 2.5x its p99 alone (test_slow_subscriber_sim.py).
        How many sessions were set aside."""
        broker = self.broker
        assert broker is not None
        most = max(gated.values())
        holding = sorted(
            c for c, n in gated.items() if n * 2 >= most and c not in absent and broker.client_connected(c)
        )
        if not holding or not self._held_back_with_room(key, holding):
            return 0
        self._set_aside_counted_apart(
            key,
            holding,
            behind,
            "holds_back_class (no live stream; the backlog is counted apart, its queue policy"
            " applies beyond it)",
        )
        return len(holding)

    def _set_aside_counted_apart(
        self, key: tuple[str, str], client_ids: list[str], behind: int, reason: str
    ) -> None:
        """Set ``client_ids`` aside from pacing the catch-up of ``key``: what their queues hold and
        the rest of the catch-up as known now (``behind``) are counted apart from their queue limit
        (``Outbound.allow_backlog``), each logged with ``reason``."""
        broker = self.broker
        assert broker is not None
        self._set_aside.setdefault(key, set()).update(client_ids)
        self.stats.catch_up_sessions_set_aside += len(client_ids)
        for client_id in client_ids:
            depth = broker.queue_depth(client_id)
            if depth is not None:
                broker.count_backlog_apart(client_id, depth[0] + behind, True)
                self._backlog_coming.setdefault(client_id, set()).add(key)
            log.warning(
                "cluster_catch_up_session_set_aside client_id=%s origin=%s stream=%s behind=%d reason=%s",
                client_id,
                key[0],
                key[1],
                behind,
                reason,
            )

    def _held_back_with_room(self, key: tuple[str, str], holding: list[str]) -> bool:
        """Whether another connected session of ``key``'s class here, not in ``holding`` and not
        set aside, has room for a RET window or more below half its queue limit now: the sessions
        ``holding`` hold it back."""
        broker = self.broker
        assert broker is not None
        set_aside = self._set_aside.get(key, ())
        for client_id in self.interest.clients_of(key[1]):
            if client_id in holding or client_id in set_aside or not broker.client_connected(client_id):
                continue
            depth = broker.queue_depth(client_id)
            if depth is not None and max(1, depth[1] // 2) - depth[0] >= RET_WINDOW:
                return True
        return False

    def _held_back_by(self, key: tuple[str, str], slow: list[str]) -> bool:
        """Whether setting ``slow`` aside lets another session's catch-up of ``key`` go faster: a
        connected session of its class here, not slow and not set aside already. Without one, the
        slow sessions alone pace the catch-up (receiver-driven: the senders' logs keep what they
        have not taken) - set aside, they would only take the cluster's backlog into their queues
        and drop it. A session moved here whose client drains slower than the live stream for a
        few seconds (a loaded machine, its broker busy) was set aside so and lost 279-1,343 of
        5,000 (test_disk_loss.py with 5 brokers); one that stays slower than the live stream is
        set aside by the stall (``_catch_up_stalled``), as an offline session on one broker."""
        broker = self.broker
        assert broker is not None
        set_aside = self._set_aside.get(key, ())
        return any(
            client_id not in slow and client_id not in set_aside and broker.client_connected(client_id)
            for client_id in self.interest.clients_of(key[1])
        )

    def _catch_up_stalled(self, key: tuple[str, str], behind: int) -> int:
        """The catch-up of ``key`` has not shrunk for the stall (``StreamReceiver.stall_s``): the
        sessions with no room hold it still - clients away all along - and stop pacing it (their
        queue policy applies, as to an offline session on one broker), so that the others' catch-up
        goes on paced instead of unpaced for everyone. How many were set aside."""
        broker = self.broker
        if broker is None:
            return 0
        holding = []
        set_aside = self._set_aside.get(key, set())
        for client_id in self.interest.clients_of(key[1]):
            depth = broker.queue_depth(client_id)
            if (
                client_id not in set_aside
                and depth is not None
                and max(1, depth[1] // 2) - depth[0] < RET_WINDOW
            ):
                holding.append(client_id)  # its room holds the catch-up below one window
        if not holding:
            return 0
        self._set_aside.setdefault(key, set()).update(holding)
        self.stats.catch_up_sessions_set_aside += len(holding)
        for client_id in holding:
            depth = broker.queue_depth(client_id)
            if depth is not None and broker.client_connected(client_id):
                # what its queue holds and the rest of the catch-up are the cluster's backlog, not
                # the client's lag: counted apart from its queue limit (``_backlog_arrived``)
                broker.count_backlog_apart(client_id, depth[0] + behind, True)
                self._backlog_coming.setdefault(client_id, set()).add(key)
        for client_id in sorted(holding):
            log.warning(
                "cluster_catch_up_session_set_aside client_id=%s origin=%s stream=%s behind=%d "
                "reason=stalled connected=%s (its queue policy applies to what it falls behind "
                "beyond the backlog%s)",
                client_id,
                key[0],
                key[1],
                behind,
                broker.client_connected(client_id),
                " counted apart" if client_id in self._backlog_coming else ", until it has drained",
            )
        return len(holding)

    def _catch_up_over(self, key: tuple[str, str]) -> None:
        """The stream ``key`` is live again. A set-aside session stays set aside until it has
        drained below half its queue limit (``_room_for``): while its queue is that full it is
        still behind the live stream, and a short lag of a live stream under load (more than
        LIVE_SLACK behind for a moment) would otherwise make it gate the others again for a
        window each time."""
        self._gated.pop(key, None)
        self._absent_in_window.pop(key, None)
        self._away_gated.pop(key, None)
        self._least_behind_at_close.pop(key, None)
        set_aside = self._set_aside.get(key)
        broker = self.broker
        if broker is None:
            return
        slow = set_aside or ()
        for client_id in self.interest.clients_of(key[1]):
            stalled = self._backlog_arrived(key, client_id)
            depth = broker.queue_depth(client_id)
            if (
                depth is not None
                and not stalled
                and client_id not in slow
                and broker.client_connected(client_id)
            ):
                # what the paced catch-up left in its queue - half its limit at most, the pacing's
                # share - is the cluster's backlog: the queue limit applies to what the client falls
                # behind beyond it (not for a session set aside as slower than the stream: its
                # queue is its own lag)
                backlog = min(depth[0], depth[1] // 2)
                if backlog:
                    broker.count_backlog_apart(client_id, backlog, False)
                    log.info(
                        "cluster_catch_up_backlog_apart client_id=%s origin=%s stream=%s backlog=%d "
                        "reason=live (the queue limit applies beyond it)",
                        client_id,
                        key[0],
                        key[1],
                        backlog,
                    )
        if set_aside is None:
            return
        for client_id in list(set_aside):
            depth = broker.queue_depth(client_id)
            if depth is None or depth[0] < max(1, depth[1] // 2):
                set_aside.discard(client_id)
        if not set_aside:
            del self._set_aside[key]

    def _backlog_arrived(self, key: tuple[str, str], client_id: str) -> bool:
        """The stalled catch-up ``key`` set aside for ``client_id`` is in its queue (live again, or
        paced again): its queue's allowance follows the queue down once no other such catch-up is
        still on its way (``Outbound.release_backlog``). Whether it had been set aside so."""
        coming = self._backlog_coming.get(client_id)
        if coming is None or key not in coming:
            return False
        coming.discard(key)
        if not coming:
            del self._backlog_coming[client_id]
            assert self.broker is not None
            self.broker.backlog_in(client_id)
        return True

    def _peer_left(self, peer: str) -> None:
        """``peer`` stops gracefully (its announcement ``leaving``): absent, as if down - the send
        log keeps what it misses, its claims are not waited for - but not contacted (no probes, no
        resends, no dials to its address) until it talks to us again (``on_receive``)."""
        if peer == self.peer_id:
            return
        self._departed.add(peer)
        self._heard_from.discard(peer)
        self._down_peers.setdefault(peer, self._now())
        assert self.transport is not None and self.takeover is not None
        self.transport.drop_queued(peer)
        self._finish_claims(self.takeover.peer_down(peer))
        self.announcer.forget(peer)
        log.info("cluster_peer_left %s: not contacted until it talks again", peer)

    def _absent_since(self) -> float | None:
        """Since when some peer is reported down (the send log keeps what was sent since for it)."""
        down = self._down_peers
        return min(down.values()) if down else None

    def _peer_back(self, peer: str) -> None:
        """Broker ``peer`` talks to us for the first time, or again after it was reported down (it
        started or restarted - perhaps holding stored sessions of clients now connected here - or
        a partition healed): the claims of our connected clients are repeated to it, so each client
        id ends with one owner, the newest connection (an older session and what was queued for it
        move here)."""
        self._down_peers.pop(peer, None)
        takeover = self.takeover
        broker = self.broker
        sender = self.sender
        retained_sync = self.retained_sync
        if takeover is None or broker is None or sender is None or retained_sync is None:
            return
        claims = takeover.claims_to_repeat(broker.client_connected) + takeover.recovery_claims()
        for claim in claims:
            self._send_envelope(peer, claim.client_id, claim.claim_id, claim)
        takeover.repeat_to(peer, claims, self._now())  # until answered: a repeat may be lost
        full = ClassInterest(tuple(self.interest.classes()), (), True)
        for dest, ref, interest in self.announcer.announce(full, [peer], self._now()):
            self._send_envelope(dest, "", ref, interest)
        self._sender_actions(sender.logged_for(peer))
        # compare retained stores at once; and the answer tells ``peer`` we are back too
        self._send_envelope(peer, "", 0, RetainedSyncRequest(0, retained_sync.digest))

    def _probe_down_peers(self, now: float) -> None:
        """Peers reported down are contacted again every few retransmit periods (for at most
        ``DOWN_PEER_MEMORY_S``): the two sides of a healed partition find each other even when
        their overlay halves do not (a broker that restarted during the split joined only its half)."""
        self._next_probe = None
        assert self.transport is not None and self.retained_sync is not None
        connected = self.transport.connected_peers()
        for peer, since in list(self._down_peers.items()):
            if now - since > DOWN_PEER_MEMORY_S:
                del self._down_peers[peer]
            elif peer not in connected:
                self._send_envelope(peer, "", 0, RetainedSyncRequest(0, self.retained_sync.digest))
        if self._down_peers:
            self._next_probe = now + self.retransmit_s * PROBE_RETRANSMITS

    def _sweep(self, now: float) -> None:
        """Leave idle publisher classes; forget silent receive streams and old claims."""
        self._next_sweep = now + SWEEP_INTERVAL_S
        for cls, last in list(self._published.items()):
            if now - last > PUBLISHER_IDLE_S and cls != CONTROL_CLASS:
                del self._published[cls]
                self._handle(api.LeaveTopic(cls, Role.PUBLISHER))
        assert self.takeover is not None and self.broker is not None
        self.takeover.forget(self.broker.has_session)
        for claim_id, claimant in self.takeover.forget_handed_over(now):
            self.store.set_handed_over(claim_id, claimant, None)
        for claim_id in self.takeover.expire_pending(now):
            self.store.set_pending_claim(claim_id, None)
        expired: list[str] = []
        for key, waiting in list(self._awaiting_start.items()):  # streams that never came
            expired += [entry[1] for entry in waiting if now - entry[2] > CATCH_UP_GIVE_UP_S]
            waiting[:] = [entry for entry in waiting if now - entry[2] <= CATCH_UP_GIVE_UP_S]
            if not waiting:
                del self._awaiting_start[key]
        self._persist_catch_ups(expired)
        forgotten = self.receiver.forget_idle(now, STREAM_IDLE_S)
        if self.causal is not None:
            self.causal.forget(forgotten)
        self._persist_positions()

    def _on_deliver(self, action: api.Deliver) -> None:
        payload = action.payload
        if action.publisher == self.peer_id:
            return  # our own publication: local subscribers already have it
        problem = payload_problem(action.publisher, payload)
        if problem is not None:
            self._reject(action.publisher, payload, problem)
            return
        checks = self.origin_checks
        if checks is not None and self._origin_refused(
            checks.check_payload(payload, self._wall_s(), self._link_peer(payload))
        ):
            return  # (relayed here by ``_receiving_from``; a relay cannot make a proof)
        if isinstance(payload, ForwardedMessage):
            self._receive_forwarded(payload, int(action.hops))
        elif isinstance(payload, ForwardedBatch):
            hops = int(action.hops)
            self._route_memos = {}  # matched once per (class, topic) of the batch (``_deliver``)
            try:
                for forwarded in payload.messages:
                    self._receive_forwarded(forwarded, hops)
            finally:
                self._route_memos = None
                self._persist_positions()  # the batch's receive positions, once (``_deliver``)
        elif isinstance(payload, RetainedUpdate):
            self._apply_retained(payload)
        elif isinstance(payload, SessionClaim):
            self._on_claim(payload)

    def receive_forwarded(self, forwarded: ForwardedMessage, hops: int) -> None:
        """A forwarded message the overlay delivered here after ``hops`` hops: restore its
        stream's order (``stream_receiver``), then deliver what is ready to local subscribers (what the
        overlay's ``Deliver`` action does; an entry point for tests and tools)."""
        self._receive_forwarded(forwarded, hops)
        self._after_event()

    def _on_envelope(self, envelope: Envelope) -> None:
        if envelope.dest != self.peer_id:
            if envelope.ttl <= 1:
                log.warning("cluster_envelope_dropped ttl orig=%s dest=%s", envelope.orig, envelope.dest)
                return
            self._send(envelope.dest, replace(envelope, ttl=envelope.ttl - 1))
            return
        body = envelope.body
        assert self.takeover is not None and self.retained_sync is not None and self.broker is not None
        if isinstance(body, ClaimReply):
            if not self.takeover.is_own_claim(body.claim_id, body.client_id) or (
                body.snapshot is not None and body.snapshot.client_id != body.client_id
            ):
                self.stats.inbound_rejected += 1
                log.warning(
                    "cluster_message_rejected ClaimReply from %s: claim %d for %r is not ours",
                    envelope.orig,
                    body.claim_id,
                    body.client_id,
                )
                return
            if body.refused:
                self._claim_refused(body)
                return
            here = self.broker.client_connected(body.client_id)
            # (orig: the answering broker)
            outcome = self.takeover.on_reply(envelope.orig, body, client_here=here)
            if body.snapshot is None and self.takeover.answered_without_session(body.claim_id, envelope.orig):
                self.store.set_pending_claim(body.claim_id, None)  # nobody has it in flight
            if isinstance(outcome, LateSession) and self._pass_on_late(body):
                self._claim_settled(body.claim_id)  # the client has moved on: the session went on to it
            elif isinstance(outcome, LateSession):
                # came after the wait ended: keep its messages anyway, and what its old broker
                # had not delivered to it
                self.stats.sessions_received += 1
                log.info("cluster_late_session_merged client_id=%s from=%s queued=%d", body.client_id,
                         envelope.orig, len(outcome.snapshot.pending))  # fmt: skip
                self.broker.receive_late_session(outcome.snapshot)
                self._claim_settled(body.claim_id)
                if body.positions and self.broker.has_session(body.client_id):
                    late = [s.match_filter for s in outcome.snapshot.subscriptions if s.share_group is None]
                    self._catch_up(body.client_id, body.positions, late)
            elif outcome is None and body.had_client and body.positions and body.snapshot is None:
                # an answer (to a repeated claim) from a broker whose copy of the session was empty:
                # what was published after its positions still has to reach the client here
                if self.broker.has_session(body.client_id):
                    self._catch_up(body.client_id, body.positions)
            elif outcome is not None:
                if outcome.snapshot is not None:
                    self.stats.sessions_received += 1
                    log.info("cluster_session_received client_id=%s from=%s queued=%d", body.client_id,
                             envelope.orig, len(outcome.snapshot.pending))  # fmt: skip
                    if body.positions:
                        self._moved_positions[body.client_id] = body.positions
                        self._keep_local_record(outcome.snapshot)
                self._finish_claims([outcome])  # schedules the completion: the core imports then
                if outcome.snapshot is not None:
                    # scheduled after the import, in its commit: what the old broker had not
                    # delivered is fetched into the session at once (a crash of this broker before
                    # the CONNACK would otherwise lose the positions, kept in memory only)
                    self.scheduler.call_soon(self._apply_moved_positions, body.client_id)
                    self.scheduler.call_soon(self._claim_settled, body.claim_id)  # (in the import's commit)
                    # if a newer CONNECT elsewhere claimed the client meanwhile, the session goes
                    # on to it
                    self.scheduler.call_soon(self._pass_on_if_claimed_elsewhere, body.client_id)
            if self._resends_held:  # after the answer's positions are applied (``_apply_moved_positions``)
                self.scheduler.call_soon(self._release_resends_answered, envelope.orig)
        elif isinstance(body, RetainedSyncRequest):
            if body.digest is not None and not self.retained_sync.differs(body.digest):
                return  # anti-entropy: the same retained versions on both sides
            for reply in self.retained_sync.copy_for(body.request_id, self.broker.retained_messages()):
                self._send_envelope(envelope.orig, "", body.request_id, self._prove_own_retained(reply))
            self._persist_retained_versions()
        elif isinstance(body, RetainedSyncReply):
            checks = self.origin_checks
            for update in self.retained_sync.reply_received(body):
                # each update is checked against its own origin (a copy relays other brokers'),
                # when it would be applied
                if (
                    checks is not None
                    and self.retained_sync.newer(update)
                    and self._origin_refused(checks.check_retained(update, self._wall_s()))
                ):
                    continue
                self._apply_retained(update)
        elif isinstance(body, SessionClaim):  # repeated to us after a partition or a restart
            self._on_claim(body)
        elif isinstance(body, ClassInterest):
            if body.leaving:
                self._peer_left(envelope.orig)
                return
            if not body.subscribed and not body.unsubscribed and not body.full:
                if envelope.ref:  # the acknowledgement of one of our announcements
                    self.announcer.acked(envelope.orig, envelope.ref)
                return
            self._on_interest(envelope.orig, body)
            if envelope.ref:
                self._send_envelope(envelope.orig, "", envelope.ref, ClassInterest(()))
        else:
            self._on_stream_body(envelope.orig, body)


def _queue_limit(broker: BrokerApi, client_id: str) -> int:
    """The queue limit of ``client_id``'s session here (0 without a session)."""
    depth = broker.queue_depth(client_id)
    return depth[1] if depth is not None else 0
