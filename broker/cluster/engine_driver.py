"""The cluster engine's driver loop (docs/cluster.md; the aioquic / etcd-raft driver shape).

:class:`EngineDriver` is the part of ``broker.cluster.engine.ClusterEngine`` that drives the pure
cores: it feeds the overlay node its events (``_handle``), carries out the actions they return in
order (``_carry_out``), sends (overlay queries, held replies, directed envelopes: ``_send``,
``_send_envelope``), commits what must be durable before a message leaves (``_commit``), and keeps
one timer at the earliest ``next_deadline()`` of the overlay and the cores (``_arm_timer``,
``_on_timer``, ``_after_event``). It holds no state of its own (``engine_base.EngineBase``).
"""

from __future__ import annotations

import logging
from typing import Any

from broker.cluster.engine_base import (
    CATCH_UP_GIVE_UP_S,
    INTEREST_REFRESH_RETRANSMITS,
    MAX_ROUND_TRIPS_TIMED,
    RTT_SAMPLE_MASK,
    EngineBase,
)
from broker.cluster.messages import (
    DEFAULT_ENVELOPE_TTL,
    ClassInterest,
    Envelope,
    RetainedSyncRequest,
)
from broker.cluster.retained_sync import CopyRequest
from broker.cluster.streams import StreamsMixin
from broker.cluster.streams_taken_over import LogTakenOverMixin
from overlay import api
from overlay.messages import ACK, DONE, PING, PUB

log = logging.getLogger("skipmq.cluster")


class EngineDriver(StreamsMixin, LogTakenOverMixin, EngineBase):
    """See the module docstring."""

    def _now(self) -> float:
        return self.scheduler.time()

    def _handle(self, event: Any) -> None:
        node = self.node
        if node is None or (self.stopped and not isinstance(event, api.Shutdown)):
            return
        if type(event) is api.Publish:
            checks = self.origin_checks
            if checks is not None:  # our publication carries our origin proof
                event = api.Publish(event.topic, checks.sign_payload(event.payload), event.publication_id)
        elif self._quiet:
            # a publication only sends (its own subscriber learns nothing new); anything else may
            # make another broker's subscriber known
            self._quiet.clear()
        try:
            actions = node.handle(event, self._now())
        except Exception:
            self._arm_timer()  # the overlay's deadline may have moved even if handling failed
            raise
        self._carry_out(actions)

    def _carry_out(self, actions: list[Any]) -> None:
        for action in actions:
            try:
                self._carry_out_one(action)
            except Exception:
                # one bad action (a malformed payload from a peer, a bug) must not drop the ones
                # behind it: they may be the DONE a publisher's broker waits for
                log.exception("cluster: failed to carry out %s", type(action).__name__)

    def _carry_out_one(self, action: Any) -> None:
        if isinstance(action, api.Send):
            message = action.message
            if self._deliver_pending_commit and not self._held_back(message):
                # a Deliver before this Send must be durable first: the Send may be the DONE
                # that lets the publisher's broker acknowledge its client (a held DONE waits for
                # the group commit at the end of this loop iteration: ``_send_held_replies``)
                self._deliver_pending_commit = False
                self._commit()
            self._send(action.dest, message)
        elif isinstance(action, api.Deliver):
            self._on_deliver(action)
        elif isinstance(action, api.PublishDone):
            self.stats.publish_done["true" if action.complete else "false"] += 1
            self._publication_done(action.publication_id, action.complete, action.reached)
        elif isinstance(action, api.SubscriberPresence) and action.present and self.sender is not None:
            # a subscription elsewhere just became reachable: what was kept goes out first
            messages, held = self.sender.presence_on(action.topic, self._now())
            for forwarded in held:
                self._publish_forwarded(forwarded)
            for message, deps in messages:
                if deps is None:
                    self._forward(action.topic, message)
                else:  # a message of a causal group, with the dependencies it had when published
                    self._forward_causal(action.topic, message, deps)

    def _held_back(self, item: object) -> bool:
        """``item`` is a reply that waits in ``_replies``: an overlay ACK or DONE, but the ACK of a
        PUB whose round trip is timed (``RTT_SAMPLE_MASK``), which goes at once."""
        if self._replies is None:
            return False
        kind = type(item)
        if kind is DONE:
            return True
        return kind is ACK and bool(item.ack_id & RTT_SAMPLE_MASK)  # type: ignore[attr-defined]

    def _send(self, dest: str, item: object) -> None:
        kind = type(item)
        self.stats.overlay_sent[kind] += 1
        # round trips to ``dest`` (skipmq_cluster_peer_rtt_seconds), timed when the answer comes:
        # every failure-detector PING (its PONG), one PUB delegation in RTT_SAMPLE_EVERY (its
        # per-hop ACK, which the receiver sends at once; by ack id)
        if kind is PUB:
            ack_id = item.ack_id  # type: ignore[attr-defined]
            if ack_id and not ack_id & RTT_SAMPLE_MASK:
                self._time_round_trip(dest, ack_id)
        elif kind is PING:
            self._time_round_trip(dest, item.nonce)  # type: ignore[attr-defined]
        replies = self._replies
        if replies is not None:
            if self._held_back(item):
                replies.hold(dest, item, self._now())
                return
            if replies.holds_for(dest):  # they go first, in this frame
                self._send_held_replies([(dest, replies.take(dest))])
        self._transmit(dest, item)

    def _send_held_replies(self, held: list[tuple[str, list[object]]]) -> None:
        """Replies that waited in ``_replies``: a DONE among them may answer a Deliver whose
        writes are not committed yet (the driver promise of overlay/api.py)."""
        if not held:
            return
        self._commit()
        for dest, items in held:
            for item in items:
                self._transmit(dest, item)

    def _transmit(self, dest: str, item: object) -> None:
        assert self.transport is not None
        if self._departed and dest in self._departed:
            return  # it left the cluster: no dial until it talks to us again
        try:
            self.transport.send(dest, item)
        except (ValueError, RuntimeError) as exc:  # WireError is a ValueError
            log.error("cluster: cannot send %s to %s: %s", type(item).__name__, dest, exc)

    def _time_round_trip(self, dest: str, request_id: int) -> None:
        round_trips = self._round_trips
        if len(round_trips) > MAX_ROUND_TRIPS_TIMED:  # requests a peer never answered
            round_trips.clear()
        round_trips[(dest, request_id)] = self._now()

    def _round_trip_answered(self, peer: str, request_id: int) -> None:
        sent_at = self._round_trips.pop((peer, request_id), None)
        if sent_at is not None:
            self.stats.peer_rtt_seconds.observe(self._now() - sent_at)

    def _commit(self) -> None:
        broker = self.broker
        if broker is not None and broker.store_pending():
            broker.commit_now()

    def _arm_timer(self) -> None:
        """One timer at the earliest deadline of the overlay and the cores."""
        node = self.node
        if node is None or self.stopped:
            return
        # runs after every event (every forwarded message): a plain loop, no generator or list
        deadline = node.next_deadline()
        takeover = self.takeover
        retained_sync = self.retained_sync
        sender = self.sender
        for candidate in (
            self._replies.next_deadline() if self._replies is not None else None,
            self.receiver.next_deadline(),
            sender.next_deadline() if sender is not None else None,
            self.subscribe_waits.next_deadline(),
            takeover.next_deadline() if takeover is not None else None,
            retained_sync.next_deadline() if retained_sync is not None else None,
            self._next_sweep,
            self._next_probe,
            self._next_interest,
            self._next_catch_up,
            self.announcer.next_deadline(),
        ):
            if candidate is not None and (deadline is None or candidate < deadline):
                deadline = candidate
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None:
            self._timer = self.scheduler.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        if self.stopped:
            return
        now = self._now()
        node = self.node
        assert node is not None and self.takeover is not None and self.retained_sync is not None
        deadline = node.next_deadline()
        if deadline is not None and deadline <= now:
            self._handle(api.Tick())
        assert self.sender is not None
        if self._replies is not None:
            self._send_held_replies(self._replies.due(now))
        self._deliver(self.receiver.poll(now))  # catch-ups that waited for room
        self._receiver_actions(self.receiver.tick(now))
        if self.receiver.blocked_count():
            self._deliver(self.receiver.give_up_waits(now))
        self._sender_actions(self.sender.tick(now))
        self._finish_ready_waits(self.subscribe_waits.tick(now))
        self._finish_claims(self.takeover.tick(now))
        for peer, claim in self.takeover.repeats(now):
            self._send_envelope(peer, claim.client_id, claim.claim_id, claim)
        self._release_resends()  # held for a claim's answer: answered meanwhile, or held long enough
        self._send_copy_request(self.retained_sync.tick(now))
        assert self.transport is not None
        self._send_copy_request(self.retained_sync.anti_entropy(self.transport.connected_peers(), now))
        if self._next_sweep is not None and self._next_sweep <= now:
            self._sweep(now)
        if self._next_probe is not None and self._next_probe <= now:
            self._probe_down_peers(now)
        if self._next_catch_up is not None and self._next_catch_up <= now:
            self._next_catch_up = self._repeat_catch_ups(now, self.retransmit_s, CATCH_UP_GIVE_UP_S)
        for peer, ref, interest in self.announcer.tick(now):
            if peer in self._down_peers:
                self.announcer.forget(peer)  # it gets the whole list when it is back
            else:
                self._send_envelope(peer, "", ref, interest)
        if self._next_interest is not None and self._next_interest <= now:
            # announcements are not acknowledged: repeated (as additions: a sender that missed one
            # registers us from its next message on)
            self._next_interest = now + self.retransmit_s * INTEREST_REFRESH_RETRANSMITS
            classes = tuple(self.interest.classes())
            if classes:
                self._announce_interest(ClassInterest(classes))
        self._after_event()

    def _after_event(self) -> None:
        if self._quiet:
            self._quiet.clear()  # receivers and interest may have changed
        if (self._catch_ups or self._older_session_holds) and self._next_catch_up is None:
            self._next_catch_up = self._now() + self.retransmit_s
        if self.subscribe_waits.waiting():
            self._finish_ready_waits(self.subscribe_waits.poll(self._topic_ready))
        self._arm_timer()
        if self.broker is not None:
            self.broker.after_batch()

    def _send_envelope(self, dest: str, to_client: str, ref: int, body: Any) -> None:
        if isinstance(body, RetainedSyncRequest):
            asked = self._retained_asked.setdefault(dest, {})
            if len(asked) > 64:  # old requests of a peer that never answered
                asked.clear()
            asked[body.request_id] = self._now()
        self._commit()
        envelope = Envelope(self.peer_id, dest, "", to_client, ref, DEFAULT_ENVELOPE_TTL, body)
        if self.origin_checks is not None:  # our directed messages carry our origin proof
            envelope = self.origin_checks.sign_envelope(envelope)
        self._send(dest, envelope)

    def _send_copy_request(self, request: CopyRequest | None) -> None:
        if request is not None:
            self._send_envelope(request.dest, "", 0, request.request)
