"""The cluster engine's glue of session takeover (session claims; seed 002 envelopes,
docs/cluster.md "Session takeover").

:class:`TakeoverGlue` is the part of ``broker.cluster.engine.ClusterEngine`` that carries out the
decisions of the pure core ``takeover``: it answers claims (handing a session over with its stream
positions, or refusing one bound to another user), passes on a session whose client moved on,
settles our own claims and finishes the CONNECTs waiting for them. The stream positions a session
leaves with (:meth:`TakeoverGlue._hand_over_positions`) and, for a session that may have an older
one merged into it later (a late session), where its own subscriptions here began to get each
stream (:meth:`TakeoverGlue._note_subscribed`: the late session's catch-up stops there). After a
restart, a stored session whose client has not come back yet takes no catch-up for
``CLAIM_GRACE_REPEATS`` claim repeat periods (:meth:`TakeoverGlue._claimable_after_restart`): its
client may have moved to another broker while this one was down, and that broker's repeated
claim takes the session - with the positions it stood at, not with a queue of what the client got
there meanwhile (issue #30, docs/notes/recovery.md). It holds no state of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from typing import Any

from broker.cluster import catch_up_state
from broker.cluster.engine_retained import RetainedGlue
from broker.cluster.messages import ClaimReply, SessionClaim, StreamPosition
from broker.cluster.stream_receiver import origin_peer
from broker.cluster.takeover import Answer, ClaimFinished, HandOver, NoSession, Refuse
from broker.core.session import SessionSnapshot

log = logging.getLogger("skipmq.cluster")

# after a restart, how many claim repeat periods (``Takeover.repeat_s``) a stored session whose
# client has not reconnected here takes no catch-up (``_claimable_after_restart``): a claimant
# repeats its unanswered claim every period, and at once when it sees this broker back
CLAIM_GRACE_REPEATS = 3.0


def _take_client_entries(
    table: dict[tuple[str, str], Any], client_id: str, client_at: int
) -> Iterator[tuple[tuple[str, str], int]]:
    """Remove the entries of ``client_id`` (at index ``client_at``; their first field is a SEQ)
    from the lists of ``table``, dropping emptied keys; yield (stream key, SEQ) of each."""
    for key, entries in list(table.items()):
        for entry in [e for e in entries if e[client_at] == client_id]:
            entries.remove(entry)
            yield key, entry[0]
        if not entries:
            del table[key]


class TakeoverGlue(RetainedGlue):
    """See the module docstring."""

    _claim_grace_until: float = 0.0  # set when the engine starts (``StreamsMixin._restore_catch_ups``)
    # clients that connected here since this start: their sessions are no stored ones a claim may
    # take, so the grace does not hold their streams (``_claimable_after_restart``)
    _connected_since_start: frozenset[str] = frozenset()

    def _claimable_after_restart(self, client_id: str) -> bool:
        """Whether the stored session of ``client_id`` (its client not connected here) should take
        no catch-up now: this broker restarted less than ``CLAIM_GRACE_REPEATS`` claim repeat
        periods ago. Its client found this broker down and may have connected to another one,
        whose claim - repeated until this broker answers - is on its way: the session then leaves
        with the stream positions it stood at, and the new broker fetches from there what its own
        session of the client did not get (``catch_up_state.upper_bound``). Catching the session
        up here first queued into it the messages the client had received there meanwhile, which
        the merge delivered again (the chaos soak's duplicates after a kill -9 of the subscriber's
        broker, docs/notes/recovery.md). Delaying never loses: the senders keep what this broker
        has not taken."""
        if client_id in self._connected_since_start:
            return False  # its client came here after this start: it did not find us down
        return self._now() < self._claim_grace_until and not self.stopped

    def _start_claim_grace(self, now: float) -> None:
        assert self.takeover is not None
        self._connected_since_start = frozenset()
        self._claim_grace_until = now + CLAIM_GRACE_REPEATS * self.takeover.repeat_s
        log.info("cluster_claim_grace_started for_s=%.1f", CLAIM_GRACE_REPEATS * self.takeover.repeat_s)

    def _on_claim(self, claim: SessionClaim) -> None:
        assert self.takeover is not None and self.broker is not None
        broker = self.broker
        if claim.origin != self.peer_id and broker.owned_by_other(claim.client_id, claim.username):
            # sessions are bound to their owner (docs/security.md): the session stays here, its
            # client stays connected, and the claimant refuses its CONNECT with 0x87
            self.stats.claims_refused += 1
            broker.log_event(
                logging.WARNING,
                "session_owner_mismatch",
                client_id=claim.client_id,
                username=claim.username,
                claimant=claim.origin,
            )
            refusal = ClaimReply(claim.claim_id, claim.client_id, True, None, (), refused=True)
            self._send_envelope(claim.origin, claim.client_id, claim.claim_id, refusal)
            return
        decision = self.takeover.on_claim(claim, connected_here=broker.client_connected(claim.client_id))
        if decision is None:
            return
        if isinstance(decision, Refuse | NoSession):
            reply = ClaimReply(claim.claim_id, claim.client_id, False, None)
        elif isinstance(decision, Answer):
            reply = decision.reply  # the claim was repeated: our reply with the session was lost
            if decision.moved_from is not None:
                # handed over to a broker that went down right after: it goes to this claim now
                self.store.set_handed_over(*decision.moved_from, None)
                self.store.set_handed_over(claim.claim_id, claim.origin, reply)
        else:
            assert isinstance(decision, HandOver)
            before = self.receiver.positions()  # (the hand-over may leave classes)
            had, snapshot = broker.hand_over(claim.client_id, transfer=decision.transfer)
            if had:
                self.stats.sessions_handed_over += 1
                self._deliver_pending_commit = True
            positions = self._hand_over_positions(snapshot, before) if snapshot is not None else ()
            reply = ClaimReply(claim.claim_id, claim.client_id, had, snapshot, positions)
            self._handed_over(claim.claim_id, claim.origin, reply)
            log.info(
                "cluster_session_handed_over client_id=%s claimant=%s claim=%d queued=%d",
                claim.client_id,
                claim.origin,
                claim.claim_id,
                len(snapshot.pending) if snapshot is not None else -1,
            )
        self._send_envelope(claim.origin, claim.client_id, claim.claim_id, reply)

    def _pass_on_if_claimed_elsewhere(self, client_id: str) -> None:
        """A session handed to us arrived after a newer claim for its client came from another
        broker (the client gave up on us and connected there): it is passed on to that broker,
        which merges it (nothing queued in it is lost)."""
        takeover = self.takeover
        broker = self.broker
        if self.stopped or takeover is None or broker is None:
            return
        newer = takeover.newest_remote_claim(client_id)
        if newer is None or broker.client_connected(client_id) or not broker.has_session(client_id):
            return
        before = self.receiver.positions()
        had, snapshot = broker.hand_over(client_id, transfer=True)
        if not had or snapshot is None:
            return
        self.stats.sessions_handed_over += 1
        self._deliver_pending_commit = True
        positions = self._hand_over_positions(snapshot, before)
        claim_id, origin = newer
        reply = ClaimReply(claim_id, client_id, True, snapshot, positions)
        self._handed_over(claim_id, origin, reply)
        self._send_envelope(origin, client_id, claim_id, reply)
        self._after_event()

    def _apply_moved_positions(self, client_id: str) -> None:
        """A session handed to us was imported: catch it up from the positions it brought."""
        broker = self.broker
        if self.stopped or broker is None or not broker.has_session(client_id):
            return  # not imported: kept for the CONNACK, or passed on with the session
        positions = self._moved_positions.pop(client_id, None)
        if positions:
            self._catch_up(client_id, positions, self._moved_catch_up_filters(client_id))
            self._after_event()

    def _pass_on_late(self, reply: ClaimReply) -> bool:
        """A session answering an old claim of ours arrived after the client had moved on from here
        to a newer connection elsewhere (the old claim went on through the overlay after a heal):
        the session and its old broker's positions go on to that connection's broker as they came,
        instead of staying here as a stored session nobody connects to."""
        takeover = self.takeover
        broker = self.broker
        assert takeover is not None and broker is not None
        client_id = reply.client_id
        newer = takeover.newest_remote_claim(client_id)
        if newer is None or broker.client_connected(client_id) or broker.has_session(client_id):
            return False
        claim_id, origin = newer
        passed = ClaimReply(claim_id, client_id, True, reply.snapshot, reply.positions)
        log.info("cluster_late_session_passed_on client_id=%s to=%s", client_id, origin)
        self._handed_over(claim_id, origin, passed)
        self.stats.sessions_handed_over += 1
        self._send_envelope(origin, client_id, claim_id, passed)
        return True

    def _handed_over(self, claim_id: int, claimant: str, reply: ClaimReply) -> None:
        """``reply`` carries a session to ``claimant``: kept for a repeat of the claim, in memory
        and in the store (in the hand-over's commit: a crash before the reply arrived does not lose
        the session)."""
        assert self.takeover is not None
        if reply.snapshot is None:
            return
        down = claimant in self._down_peers
        self.takeover.handed_over(claim_id, claimant, reply, self._now(), claimant_down=down)
        self.store.set_handed_over(claim_id, claimant, reply)

    def _claim_settled(self, claim_id: int) -> None:
        """The session our claim ``claim_id`` brought is stored here (or went on): nothing of it is
        in flight any more."""
        if self.takeover is not None and self.takeover.settled(claim_id):
            self.store.set_pending_claim(claim_id, None)
            if self.broker is not None:
                self.broker.after_batch()

    def _claim_refused(self, reply: ClaimReply) -> None:
        """Another broker holds the client id's session for another user: the CONNECT waiting for
        the claim is refused (0x87); a connection already attached without waiting (clean start)
        is disconnected with 0x87."""
        assert self.takeover is not None and self.broker is not None
        current = self.takeover.refused(reply.claim_id, reply.client_id)
        completion = self._claim_waits.pop(reply.claim_id, None)
        if completion is not None:
            error = PermissionError(f"client id {reply.client_id!r} belongs to another user")
            self.scheduler.call_soon(completion.set_exception, error)
        elif current and self.broker.client_connected(reply.client_id):
            self.scheduler.call_soon(self.broker.kick, reply.client_id, 0x87)

    def _finish_claims(self, finished: list[ClaimFinished]) -> None:
        for outcome in finished:
            completion = self._claim_waits.pop(outcome.claim_id, None)
            if completion is not None:
                self.scheduler.call_soon(completion.set_result, outcome.snapshot)

    def _note_subscribed(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        """A local subscription of ``client_id``: where the streams of the filter's class stand now
        is kept - the subscription gets every message from there on, so the catch-up of an older
        session merged into it later (a late session: its broker was down or cut off when the
        client connected here), or of one handed over that replaces it (``_keep_local_record``),
        stops there (``_catch_up``, :meth:`_late_session_end`) instead of delivering again what the
        client already got here. Kept for every subscription, not only while a claim is pending:
        a session here may be replaced by one from a broker that was cut off when it was made."""
        if share_group is not None or self.takeover is None:
            return
        recorded = self._subscribed_at.setdefault(client_id, {})
        if topic_filter in recorded:
            return  # subscribed before: the first time counts
        cls = self.interest.class_of(topic_filter)
        at = {key: seq for key, seq in self.receiver.positions().items() if key[1] == cls}
        sender = self.sender
        if sender is not None:
            at[(sender.origin, cls)] = sender.position(cls)  # local publishes reach it directly
        recorded[topic_filter] = at

    def _late_session_end(
        self, client_id: str, filters: Collection[str] | None
    ) -> Callable[[tuple[str, str], int], int]:
        """For ``_catch_up`` of ``client_id`` (``filters``: the subscriptions of a late session
        merged into its session here): where the catch-up of a stream stops - ``here`` (the
        stream's position), or where the session's own subscriptions here began to get the
        stream, if that is lower (``catch_up_state.upper_bound``). Uses up the record."""
        subscribed_at = self._subscribed_at.pop(client_id, None)
        if subscribed_at is None or not filters:
            return lambda key, here: here
        by_class: dict[str, list[str]] = {}
        for topic_filter in filters:
            by_class.setdefault(self.interest.class_of(topic_filter), []).append(topic_filter)
        sender = self.sender
        assert sender is not None

        def end(key: tuple[str, str], here: int) -> int:
            own = origin_peer(key[0]) == self.peer_id
            if own and key[0] == sender.origin:
                here = min(here, sender.position(key[1]))
            start = 0 if own else self.receiver.start_of(key)
            bound = catch_up_state.upper_bound(subscribed_at, by_class.get(key[1], ()), key, start)
            return here if bound is None else min(here, bound)

        return end

    def _hand_over_positions(
        self, snapshot: SessionSnapshot, before: dict[tuple[str, str], int]
    ) -> tuple[StreamPosition, ...]:
        """Where this broker stood in the streams of the classes of a session it hands over: the
        new broker gets the messages published after (none is lost in the move)."""
        sender = self.sender
        assert sender is not None
        classes = {self.interest.class_of(sub.match_filter) for sub in snapshot.subscriptions}
        at = {key: p for key, p in before.items() if key[1] in classes}
        for c in classes:
            at[(sender.origin, c)] = sender.position(c)
            # an earlier incarnation's streams still logged here reached the session whole (local
            # publishes directly, the rest from this log when it moved here): named at their end.
            # Unnamed, the new broker asked for them from SEQ 1 and delivered the whole log again
            # (the chaos soak's bursts of duplicates when the subscriber's and the publisher's
            # broker were one and restarted, docs/notes/recovery.md)
            for key in sender.streams_of(c):
                end = sender.next_seq_of(key)
                if key[0] != sender.origin and origin_peer(key[0]) == self.peer_id and end is not None:
                    at[key] = end
        # positions the session brought here and that were never applied (its client left before
        # the CONNACK): the earliest of the two for each stream goes on with it
        for position in self._moved_positions.pop(snapshot.client_id, ()):
            key = (position.origin, position.stream)
            at[key] = min(at.get(key, position.next_seq), position.next_seq)
        # catch-ups of the session still running here (and the newer messages held for it): the
        # next broker fetches them from where the session stands
        client_id = snapshot.client_id
        self._subscribed_at.pop(client_id, None)  # (its subscriptions leave with it)
        # streams this broker stands behind the session in (its older session had them up to a
        # mark, ``streams._skip_what_the_session_had``): the session goes on from the mark
        for key, marks in list(self._skip_below.items()):
            mark = marks.pop(client_id, None)
            if mark is not None:
                at[key] = max(at.get(key, mark), mark)
            if not marks:
                del self._skip_below[key]
        for table, client_at in ((self._catch_ups, 2), (self._awaiting_start, 1)):
            for key, seq in _take_client_entries(table, client_id, client_at):
                at[key] = min(at.get(key, seq), seq)
        self._drop_older_session_holds(client_id)  # (what was held for it goes on, as positions)
        for held_key in [k for k in self._held_for if k[1] == client_id]:
            held = self._held_for.pop(held_key)
            key = held_key[0]
            at[key] = min(at.get(key, held[0].seq), held[0].seq)
        # (in the hand-over's commit: the session and what it waited for leave together)
        self.store.set_catch_ups(client_id, [])
        self.store.release_held(client_id, None)
        return tuple(StreamPosition(o, c, p) for (o, c), p in sorted(at.items()))
