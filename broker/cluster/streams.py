"""Reliable streams in the cluster engine: forwarding through the send log, receiving in order,
and catching a moved session up (issue #10; seed 004 adapted, docs/cluster.md "Reliable streams").

:class:`StreamsMixin` is the part of ``broker.cluster.engine.ClusterEngine`` that carries out the
actions of the pure cores ``stream_sender`` and ``stream_receiver``: it appends forwarded messages
to the send log (durable with the publish's commit, before the PUBACK), publishes them through the
overlay, sends RET / ACK vectors / resends as directed envelopes, delivers what is ready to local
subscribers with the positions that cover it, and - when a session moves between brokers - hands
over and applies stream positions so the moved client gets what was published during the move.
A moved session's catch-up and the messages held for it are written to the store as they change
(``broker.cluster.catch_up_state``), in the transaction of the deliveries they go with, and
resumed by a restarted broker (:meth:`StreamsMixin._restore_catch_ups`).
A peer's resends of a stream new here wait for its answer to a claim of ours that may bring a
session from it (:meth:`StreamsMixin._hold_resend`); a stream new here that starts below its first
message waits, for a client whose older session may still come, for that session's positions
(:meth:`StreamsMixin._hold_for_older_sessions`).
It holds no state of its own; the engine owns everything (attributes declared below).

Size: about 930 lines - the engine's glue of both stream cores and of the moved sessions'
catch-ups and holds, which share the receive positions and the held messages; the next thing to go
out of it is the catch-up part (``_catch_up`` to ``_release_older_session_holds``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

from broker.cluster import catch_up_state
from broker.cluster.messages import (
    ClassInterest,
    ForwardedBatch,
    ForwardedMessage,
    StreamAck,
    StreamPosition,
    StreamResend,
    StreamRet,
)
from broker.cluster.stream_receiver import SendAck, SendRet, StreamReceiver, origin_peer
from broker.cluster.stream_sender import Forget, GaveUp, ReceiverAt, Republish, Resend, StreamSender
from overlay import api
from overlay.api import Role

if TYPE_CHECKING:
    from broker.cluster.causal_clock import CausalClock
    from broker.cluster.class_stats import ClassCounters
    from broker.cluster.interest import Interest
    from broker.cluster.interest_table import InterestTable
    from broker.cluster.stats import ClusterStats
    from broker.cluster.store_port import ClusterStore
    from broker.cluster.takeover import Takeover
    from broker.config import ClusterConfig
    from broker.core.ports import BrokerApi, Scheduler
    from broker.core.session import Message

log = logging.getLogger("skipmq.cluster")

CONTROL_CLASS = "!ctl"  # every broker subscribes: retained updates and session claims
# batching (issue #11): the messages forwarded on one class within one event-loop iteration go out
# as one overlay publication (``ForwardedBatch``) of at most this many messages / bytes (estimated,
# ``_batch_cost``), and at most half a cluster frame (``cluster.max_frame_bytes``: the transport
# refuses an item larger than a frame)
BATCH_MAX_MESSAGES = 256
_NOBODY: frozenset[str] = frozenset()  # no moved session waits for a catch-up of this stream
BATCH_MAX_BYTES = 256 * 1024
BATCH_ITEM_OVERHEAD_BYTES = 256  # per message beyond payload, topic and properties (fields, framing)
# a peer's resends of streams new here wait for its answer to our claim at most this many claim
# repeat periods (one lost claim or answer is repeated within that), then go on as they came
RESEND_HOLD_REPEATS = 2.0
# a stream new here that starts below its first message is held for a client whose older session
# may still come (``_hold_for_older_sessions``) at most this long: a killed broker that restarts
# answers the client's claim within its start-up and a claim repeat; one away longer is not waited
# for (what was held goes, duplicates possible, nothing lost)
OLDER_SESSION_HOLD_S = 15.0


def _batch_cost(forwarded: ForwardedMessage) -> int:
    """A generous estimate of the encoded size of ``forwarded`` in a batch."""
    message = forwarded.message
    cost = len(message.payload) + len(message.topic) + BATCH_ITEM_OVERHEAD_BYTES
    if message.properties:
        cost += len(repr(message.properties))
    if forwarded.deps or forwarded.copies:
        cost += 64 * (len(forwarded.deps) + len(forwarded.copies)) + len(repr(forwarded.deps))
    return cost


class StreamsMixin:
    """See the module docstring."""

    # owned by the engine
    broker: BrokerApi | None
    store: ClusterStore
    sender: StreamSender | None
    receiver: StreamReceiver
    causal: CausalClock | None
    interest: Interest
    interest_table: InterestTable
    stats: ClusterStats
    class_counters: ClassCounters
    peer_id: str
    _published: dict[str, float]
    _publication_id: int
    _deliver_pending_commit: bool
    scheduler: Scheduler
    cluster: ClusterConfig
    stopped: bool
    # (origin, class) -> forwarded, not yet published: a batch holds one stream only (a restarted
    # broker republishes its previous incarnation's stream beside its new one on the same class)
    _outbox: dict[tuple[str, str], list[ForwardedMessage]]
    _outbox_armed: bool  # a flush is scheduled (``call_soon``)
    # while ``_on_deliver`` takes one ForwardedBatch: class -> (its local filter, topic -> matches)
    _route_memos: dict[str, tuple[Callable[[str], bool], dict[str, list[Any]]]] | None
    _batch_parts: dict[int, list[int]]  # batch publication id -> its messages' publication ids
    _arm_timer: Callable[[], None]
    _after_event: Callable[[], None]
    _catch_ups: dict[tuple[str, str], list[list[Any]]]
    _moved_positions: dict[str, tuple[StreamPosition, ...]]
    _awaiting_start: dict[tuple[str, str], list[tuple[int, str, float]]]
    _held_for: dict[tuple[tuple[str, str], str], list[ForwardedMessage]]
    # stream key -> {client: since}: streams new here held for a client's older session
    _older_session_holds: dict[tuple[str, str], dict[str, float]]
    # stream key -> {client: SEQ}: what still arrives below SEQ is not delivered to the client
    _skip_below: dict[tuple[str, str], dict[str, int]]
    _room_for: Callable[[tuple[str, str]], int]
    _catch_up_stalled: Callable[[tuple[str, str], int], int]
    _hold_for_absent: Callable[[tuple[str, str]], bool]
    _next_catch_up: float | None
    retransmit_s: float
    # peer -> (since, its resends of streams new here) held until its answer to our claim
    _resends_held: dict[str, tuple[float, list[StreamResend]]]
    takeover: Takeover | None
    _late_session_end: Callable[[str, Collection[str] | None], Callable[[tuple[str, str], int], int]]
    _now: Callable[[], float]
    _start_claim_grace: Callable[[float], None]
    _commit: Callable[[], None]
    _handle: Callable[[Any], None]
    _send_envelope: Callable[[str, str, int, Any], None]
    _answer_log_taken_over: Callable[[str, StreamRet], bool]
    _receive_log_taken_over: Callable[[StreamResend], bool]
    _announce_interest: Callable[[ClassInterest], None]

    def _forward(
        self,
        cls: str,
        message: Message,
        *,
        overlay: bool = True,
        held: bool = False,
        deps: tuple[StreamPosition, ...] = (),
        copies: tuple[tuple[str, int], ...] = (),
        stored: bool = True,
    ) -> None:
        sender = self.sender
        assert sender is not None
        forwarded = sender.append(
            cls, message, self._now(), confirmed=not overlay, held=held, deps=deps, copies=copies,
            stored=stored,
        )  # fmt: skip
        if message.qos and stored:
            self.store.log_append(forwarded)  # in this publish's commit, before its PUBACK
            new_receivers = sender.take_new_receivers()
            if new_receivers:  # a new stream's receivers, in the same commit
                self._sender_actions(new_receivers)
        if overlay and not held:
            self._publish_forwarded(forwarded)

    def _publishing(self, cls: str, now: float) -> None:
        """This broker publishes on ``cls`` (joins it as a publisher the first time)."""
        if cls not in self._published:
            self._handle(api.JoinTopic(cls, Role.PUBLISHER))
        self._published[cls] = now

    def _publish_forwarded(self, forwarded: ForwardedMessage) -> None:
        """Publish ``forwarded`` through the overlay: queued, and published with the other messages
        of its class forwarded in this event-loop iteration as one ``ForwardedBatch`` (one PUB,
        ACK and DONE per hop for all of them; ``_flush_outbox``, issue #11)."""
        if forwarded.stream not in self._published:  # a republish after a restart, a held one
            self._publishing(forwarded.stream, self._now())
        self.stats.forwarded += 1
        self.class_counters.forwarded(forwarded.stream)
        key = (forwarded.origin, forwarded.stream)
        queued = self._outbox.get(key)
        if queued is None:
            self._outbox[key] = [forwarded]
        else:
            queued.append(forwarded)
        if not self._outbox_armed:
            self._outbox_armed = True
            self.scheduler.call_soon(self._flush_outbox)

    def _flush_outbox(self) -> None:
        """Publish what ``_publish_forwarded`` queued: per class, in the order queued, batches of
        at most ``BATCH_MAX_MESSAGES`` messages and ``BATCH_MAX_BYTES`` (or half a cluster frame)
        of estimated encoded size (a single larger message goes alone, as it always did)."""
        self._outbox_armed = False
        outbox = self._outbox
        if not outbox:
            return
        self._outbox = {}
        if self.stopped:
            return  # QoS >= 1 ones are in the send log: published again after a restart
        # durable here first (send-log row, the publisher's QoS 2 packet id): a kill -9 between
        # the two delivered a message we rolled back, and the PUBLISH sent again twice
        self._commit()
        now = self._now()
        budget = min(BATCH_MAX_BYTES, self.cluster.max_frame_bytes // 2)
        for (_origin, cls), queued in outbox.items():
            self._publishing(cls, now)
            start, count = 0, len(queued)
            while start < count:
                end = start + 1
                size = _batch_cost(queued[start])
                while end < count and end - start < BATCH_MAX_MESSAGES:
                    size += _batch_cost(queued[end])
                    if size > budget:
                        break
                    end += 1
                try:
                    self._publish_batch(cls, queued[start:end])
                except Exception:
                    log.exception("cluster: publishing %d messages on %s failed", end - start, cls)
                start = end
        self._arm_timer()
        if self.broker is not None:
            self.broker.after_batch()

    def _publish_batch(self, cls: str, part: list[ForwardedMessage]) -> None:
        sender = self.sender
        assert sender is not None
        self._publication_id += 1
        pid = self._publication_id
        if len(part) == 1:
            forwarded = part[0]
            if forwarded.message.qos:
                sender.published(pid, forwarded)  # before the overlay sees it: PublishDone may come at once
            self._handle(api.Publish(cls, forwarded, pid))
            return
        parts: list[int] = []
        for forwarded in part:
            if forwarded.message.qos:  # each logged message is completed by the batch's PublishDone
                self._publication_id += 1
                sender.published(self._publication_id, forwarded)
                parts.append(self._publication_id)
        if parts:
            self._batch_parts[pid] = parts
        self._handle(api.Publish(cls, ForwardedBatch(tuple(part)), pid))

    def _publication_done(self, publication_id: int, complete: bool, reached: bool = True) -> None:
        """The overlay's ``PublishDone`` for one of our publications (a message or a batch)."""
        sender = self.sender
        if sender is None:
            return
        now = self._now()
        parts = self._batch_parts.pop(publication_id, None)
        if parts is None:
            self._sender_actions(sender.done(publication_id, complete, now, reached))
            return
        actions: list[Any] = []
        for part in parts:
            actions += sender.done(part, complete, now, reached)
        self._sender_actions(actions)

    def _sender_actions(self, actions: list[Any]) -> None:
        store = self.store
        for action in actions:
            if isinstance(action, Forget):
                store.log_forget(action.key, action.below_seq)
            elif isinstance(action, ReceiverAt):
                store.set_receiver(action.key, action.peer, action.next_seq)
            elif isinstance(action, Republish):
                self.stats.republished += 1
                self._publish_forwarded(action.forwarded)
            elif isinstance(action, Resend):
                self.stats.resent += len(action.resend.messages)
                self._send_stream(action.peer, action.resend)
            elif isinstance(action, GaveUp):
                self.stats.receivers_given_up += 1
                log.warning(
                    "cluster_receiver_given_up stream=%s receiver=%s missing=%d",
                    action.key,
                    action.peer,
                    action.missing,
                )

    def _receiver_actions(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, SendRet):
                self.stats.rets_sent += 1
                self._send_stream(action.peer, action.request)
            elif isinstance(action, SendAck):
                self._send_stream(action.peer, action.ack)

    def _send_stream(self, peer: str, body: StreamAck | StreamRet | StreamResend) -> None:
        if peer == self.peer_id:
            return
        self._send_envelope(peer, "", 0, body)

    def _receive_forwarded(self, forwarded: ForwardedMessage, hops: int) -> None:
        if (
            forwarded.stream != CONTROL_CLASS
            and not self.interest.subscribes(forwarded.stream)
            and not self.receiver.has_stream((forwarded.origin, forwarded.stream))
        ):
            # a class we no longer subscribe (a resend, or the overlay still routing to us): tell
            # its sender we left, so it stops keeping messages for us
            position = StreamPosition(forwarded.origin, forwarded.stream, forwarded.seq)
            self._send_stream(origin_peer(forwarded.origin), StreamAck((), (position,)))
            return
        key = (forwarded.origin, forwarded.stream)
        new_stream = forwarded.stream != CONTROL_CLASS and not self.receiver.has_stream(key)
        new_here = new_stream and forwarded.low
        if new_stream and not forwarded.copies:  # (not in a causal group: see the method)
            # before anything of it is accepted: the flow condition paces it from its first message
            self._hold_for_older_sessions(key, forwarded)
        ready = self.receiver.receive(forwarded, hops, self._now())
        if new_here:
            log.info(
                "cluster_stream_started origin=%s stream=%s first_seq=%d low=%d start=%d",
                forwarded.origin,
                forwarded.stream,
                forwarded.seq,
                forwarded.low,
                self.receiver.start_of(key),
            )
        if self._awaiting_start:  # before the delivery: the catch-up holds the client's copies
            self._stream_started((forwarded.origin, forwarded.stream))
        self._deliver(ready)

    def _stream_started(self, key: tuple[str, str]) -> None:
        """Moved sessions waiting for ``key`` to start here: what lies between their position and
        the stream's start here is asked for, for each of them only."""
        start = self.receiver.start_of(key)
        if not start:
            return
        started = self._awaiting_start.pop(key, ())
        for next_seq, client_id, _since in started:
            if next_seq < start:
                self._catch_ups.setdefault(key, []).append([next_seq, start, client_id, self._now(), True])
                self._send_stream(origin_peer(key[0]), StreamRet(key[0], key[1], next_seq, start))
        self._persist_catch_ups(entry[1] for entry in started)

    def _deliver(self, ready: list[tuple[ForwardedMessage, int]]) -> None:
        if not ready:
            return
        broker = self.broker
        assert broker is not None
        stats = self.stats
        class_counters = self.class_counters
        causal = self.causal
        catch_ups = self._catch_ups
        older_holds = self._older_session_holds
        skip_below = self._skip_below
        memos = self._route_memos
        for forwarded, hops in ready:
            if forwarded.copies and causal is not None:
                causal.accepted(forwarded)  # what this broker sends from now on follows it
            stats.received += 1
            stats.observe_hops(hops)
            stream = forwarded.stream
            key = (forwarded.origin, stream)
            pending = catch_ups.get(key) if catch_ups else None
            waiting: Collection[str] = _NOBODY
            if pending:
                waiting = {catch_up[2] for catch_up in pending}
            if older_holds and key in older_holds:
                waiting = set(waiting) | older_holds[key].keys()
            skipped: Collection[str] = _NOBODY
            if skip_below and key in skip_below:
                skipped = self._skip_had(key, forwarded.seq)
            if waiting or skipped:
                for client_id in waiting:
                    # a moved session still catching up on this stream gets this message after
                    # the older ones it waits for (order per publisher): held for it until then
                    # (durable with this delivery's commit: the receive position moves past it)
                    self._held_for.setdefault((key, client_id), []).append(forwarded)
                    self.store.hold(client_id, forwarded)
                accept = self._class_filter(stream)
                except_clients = set(waiting) | set(skipped) if skipped else waiting
                matched = broker.deliver_remote(forwarded.message, accept, except_clients=except_clients)
            else:
                # the messages of one batch share their class's filter and, mostly, their topic:
                # matched once (``_route_memos`` lives while ``_on_deliver`` takes one batch)
                route = memos.get(stream) if memos is not None else None
                if route is None:
                    route = (self._class_filter(stream), {})
                    if memos is not None:
                        memos[stream] = route
                matched = broker.deliver_remote(forwarded.message, route[0], memo=route[1])
            if not matched and not waiting and not skipped:
                stats.wasted += 1  # the class reached us, no local filter matched the topic
            class_counters.received(forwarded.stream, hops, bool(matched or waiting))
        if older_holds:
            self._end_full_holds()
        if memos is None:  # (in a batch: once after its last message, ``_on_deliver``)
            self._persist_positions()
        self._deliver_pending_commit = True

    def _persist_positions(self) -> None:
        """The receive positions that moved go to the store, written with its next commit: the one
        of the deliveries they cover when those went into persistent sessions (a delivery to no
        persistent session needs no durable position: nothing of it survives a restart)."""
        changed = self.receiver.changed
        if changed:
            store = self.store
            for key, next_seq in changed.items():
                store.set_position(key, next_seq)
            changed.clear()

    def _class_filter(self, stream_class: str) -> Callable[[str], bool]:
        """A message received on class ``c`` goes to the local subscriptions of class ``c`` only."""
        class_of = self.interest.class_of
        return lambda topic_filter: class_of(topic_filter) == stream_class

    def _catch_up(
        self, client_id: str, positions: tuple[StreamPosition, ...], filters: Collection[str] | None = None
    ) -> None:
        """A session moved here: deliver it what its old broker did not. ``filters``: the
        subscriptions of a late session merged into the client's session here, which may have
        received part of it already (``catch_up_state.upper_bound``)."""
        sender = self.sender
        broker = self.broker
        assert sender is not None and broker is not None
        now = self._now()
        log.info(
            "cluster_catch_up client_id=%s late=%s from=%s",
            client_id,
            filters is not None,
            ",".join(f"{p.origin}/{p.stream}@{p.next_seq}" for p in positions),
        )
        held_keys = self._older_session_arrived(client_id, positions)
        self._skip_what_the_session_had(client_id, positions, held_keys)
        end = self._late_session_end(client_id, filters)
        # the positions name every stream of the session's classes the old broker received (its
        # own included); a stream they do not name never reached it (the overlay delivered late),
        # nor the brokers the session was on before it, whose positions it had adopted. The
        # session gets such a stream from the start of its origin's log: our streams of those
        # classes from our send log; where the old broker stood as a receiver (it registered when
        # it subscribed, after the session's own subscription) is no bound.
        # the classes the session brought, new here, are registered at their senders from the
        # start of their logs (as for a broker that comes back), not from their next message: the
        # session needs what they published since its old broker's positions, which may not name
        # their streams (they never reached it, or the overlay completed them without it)
        self._announce_interest(ClassInterest(tuple(self.interest.classes()), (), True))
        named = {(position.origin, position.stream) for position in positions}
        classes = {position.stream for position in positions}
        for cls in sorted(classes):
            for key in sender.streams_of(cls):
                if key in named:
                    continue
                messages, _kept_from = sender.logged_from(key, 0)
                self._deliver_backlog(client_id, messages, self._class_filter(cls), end(key, 1 << 62))
        # other brokers' streams of those classes received here: what this broker delivered of
        # them before the session arrived is asked for, for this client only (not counted as a
        # gap where the origin's log no longer has it: the client may never have needed it)
        for key, here in sorted(self.receiver.positions().items()):
            if key[1] in classes and key not in named and origin_peer(key[0]) != self.peer_id:
                here = end(key, here)
                if here > 1:
                    self._catch_ups.setdefault(key, []).append([1, here, client_id, now, False])
                    self._send_stream(origin_peer(key[0]), StreamRet(key[0], key[1], 1, here))
        for position in positions:
            key = (position.origin, position.stream)
            if origin_peer(position.origin) == self.peer_id:  # our stream (any incarnation): our log
                messages, kept_from = sender.logged_from(key, position.next_seq)
                self._count_given_up(key, kept_from - position.next_seq)
                accept = self._class_filter(position.stream)
                self._deliver_backlog(client_id, messages, accept, end(key, 1 << 62))
                continue
            here = self.receiver.position(key)
            if here:
                here = end(key, here)
            if not here and self.interest.subscribed_by_others(position.stream, client_id):
                # the stream is on its way here for the class's other subscribers (nothing of it
                # arrived yet): starting it at the session's position would drop what they still
                # need. The session is caught up from where the stream starts here instead.
                self._awaiting_start.setdefault(key, []).append((position.next_seq, client_id, now))
            elif not here:
                self.receiver.adopt(key, position.next_seq, now)  # the sender resends from there
            elif position.next_seq < here:
                # delivered here before the session arrived: asked again, for this client only
                self._catch_ups.setdefault(key, []).append([position.next_seq, here, client_id, now, True])
                request = StreamRet(position.origin, position.stream, position.next_seq, here)
                self._send_stream(origin_peer(position.origin), request)
        for key in held_keys:  # what the older session lacked of them follows its catch-up
            self._trim_held(key, client_id, [c[1] for c in self._catch_ups.get(key, ()) if c[2] == client_id])
            self._release_held(key, client_id)
        self._persist_catch_ups((client_id,))
        # streams started at the session's positions (``adopt``) are durable in the same commit:
        # nothing may be delivered on them for a while (a paced catch-up), and a crash meanwhile
        # restarted them at their next message - what lay between came after newer ones (seed 381
        # of ``--faults crash,partition,move --loss 0.05 --finite-clients``)
        self._persist_positions()

    def _deliver_backlog(
        self, client_id: str, messages: list[ForwardedMessage], accept: Callable[[str], bool], stop: int
    ) -> None:
        """Our send log (``messages`` below SEQ ``stop``) to a session that moved here: the cluster's
        backlog, queued whole (``BrokerApi.allow_backlog``; docs/notes/recovery.md, 2,988 lost)."""
        broker = self.broker
        assert broker is not None
        backlog = [forwarded for forwarded in messages if forwarded.seq < stop]
        broker.allow_backlog(client_id, len(backlog))
        for forwarded in backlog:
            broker.deliver_remote(forwarded.message, accept, client_id)
        if backlog:
            self._deliver_pending_commit = True

    def _repeat_catch_ups(self, now: float, retransmit_s: float, give_up_s: float) -> float | None:
        """Ask again for what a moved session still waits for (a RET or its answer was lost); give
        a catch-up up after ``give_up_s`` (counted as a gap given up). The next deadline, if any."""
        deadline: float | None = None
        given_up: list[str] = []
        for key, pending in list(self._catch_ups.items()):
            for catch_up in list(pending):
                next_seq, end, _client_id, started, counted = catch_up
                if now - started > give_up_s:
                    pending.remove(catch_up)
                    given_up.append(_client_id)
                    if counted:
                        self._count_given_up(key, end - next_seq)
                    self._release_held(key, _client_id)
                    continue
                self._send_stream(origin_peer(key[0]), StreamRet(key[0], key[1], next_seq, end))
            if not pending:
                del self._catch_ups[key]
            else:
                deadline = now + retransmit_s
        self._persist_catch_ups(given_up)
        if self._older_session_holds and self._release_older_session_holds(now):
            deadline = now + retransmit_s
        return deadline

    # ------------------------------------------------- what an older session had, not again
    def _skip_what_the_session_had(
        self, client_id: str, positions: tuple[StreamPosition, ...], held_keys: list[tuple[str, str]]
    ) -> None:
        """The older session of ``client_id`` arrived with ``positions``: of a stream that was held
        for it (``held_keys``, :meth:`_hold_for_older_sessions`) and that this broker stands behind
        them in (a stream new here still filling its first gap, a full hold paced), what arrives
        below the session's position is not delivered to the client - the hold's own rule
        (:meth:`_older_session_arrived` drops what was held below it), kept until the stream here
        reaches the position (``_skip_had``). Seed 11 of the chaos soak: 199 duplicates, 206-404
        arriving 77 ms after the older session with its position at 405 (docs/notes/recovery.md).
        Only for held streams: a position of the sending broker's own stream says what it
        published, not what the session had (seed 75 of ``--faults crash,partition,move --loss
        0.05 --finite-clients`` lost 30 PUBACKed messages with the rule on every stream)."""
        for position in positions:
            key = (position.origin, position.stream)
            if key not in held_keys or origin_peer(position.origin) == self.peer_id:
                continue
            here = self.receiver.position(key)
            if 0 < here < position.next_seq:
                marks = self._skip_below.setdefault(key, {})
                marks[client_id] = max(marks.get(client_id, 0), position.next_seq)
                log.info(
                    "cluster_stream_skip_had client_id=%s origin=%s stream=%s from_seq=%d below=%d",
                    client_id,
                    key[0],
                    key[1],
                    here,
                    position.next_seq,
                )

    def _skip_had(self, key: tuple[str, str], seq: int) -> Collection[str]:
        """The clients not to get SEQ ``seq`` of ``key`` (their older session had it); a client's
        entry ends with the last SEQ below its mark."""
        below = self._skip_below[key]
        skipped = [client_id for client_id, mark in below.items() if seq < mark]
        for client_id, mark in list(below.items()):
            if seq + 1 >= mark:
                del below[client_id]
        if not below:
            del self._skip_below[key]
        if skipped:
            self.stats.duplicates_dropped += len(skipped)
        return skipped

    # ------------------------------------------------- streams held for a client's older session
    def _room_with_holds(self, key: tuple[str, str]) -> int:
        """The flow condition's budget for ``key`` (``StreamReceiver.budget``): the room of its
        class's local sessions (``_room_for``), and for a client it is held for
        (``_hold_for_older_sessions``) what is held counts as queued: a full hold stops taking the
        stream, which stays in its sender's log (seed 004 §3.2 flow condition) until the older
        session's positions drop what it had, or the hold ends."""
        room = self._room_for(key)
        holds = self._older_session_holds.get(key)
        broker = self.broker
        if holds and broker is not None:
            for client_id in holds:
                depth = broker.queue_depth(client_id)
                if depth is not None:
                    held = len(self._held_for.get((key, client_id), ()))
                    room = min(room, max(1, depth[1] // 2) - depth[0] - held)
        return room

    def _held_or_absent(self, key: tuple[str, str]) -> bool:
        """``StreamReceiver.hold_live``: a stream held for an older session is paced (its budget
        counts what is held, ``_room_with_holds``), as is one whose sessions are all away."""
        return bool(self._older_session_holds.get(key)) or self._hold_for_absent(key)

    def _stalled_unless_held(self, key: tuple[str, str], behind: int) -> int:
        """``StreamReceiver.stalled``: a stream held for an older session does not go unpaced at
        the stall (it would overflow the hold); the hold's own ends (``OLDER_SESSION_HOLD_S``, the
        answers) release it. Otherwise the engine's rule (``_catch_up_stalled``)."""
        if self._older_session_holds.get(key):
            return 1  # (as if set aside: the receiver measures the stall again, paced)
        return self._catch_up_stalled(key, behind)

    def _hold_for_older_sessions(self, key: tuple[str, str], first: ForwardedMessage) -> None:
        """Stream ``key`` is new here: it starts at the sender's ``low`` (what some receiver may
        still lack), or at a republication, a resend of the sender's log - often well before the
        live stream. A local client of its class whose session here was made empty while its
        claim may still bring its older session (its broker was killed and has not answered:
        :meth:`Takeover.awaits_older_session`) had much of that on its old broker: delivered now,
        it all came twice (the chaos soak's duplicates "new streams started at ``low``",
        docs/notes/recovery.md). The stream is
        held for such a client - every message of it, in order, durable as a catch-up's held
        messages - until that session arrives (its positions then drop what it had:
        :meth:`_older_session_arrived`), every broker answered without it, or
        ``OLDER_SESSION_HOLD_S`` passed (:meth:`_release_older_session_holds`). Nothing is dropped
        otherwise. The stream is paced by the flow condition meanwhile, what is held counted as
        queued (:meth:`_room_with_holds`): a hold at half the client's queue limit stops taking
        it - the sender's log keeps the rest, and the other clients of its class here wait with
        it, at most the hold - rather than being released at once, which gave the older session's
        messages back (seed 13 of the chaos soak: 792 duplicates). Not for a stream of a causal
        group: the group's other streams, not held, would overtake what their messages depend on
        (``tests/sim/cluster/test_causal_sim.py``, seed 9 broke causal order with the hold)."""
        takeover = self.takeover
        if takeover is None or key[1] == CONTROL_CLASS:
            return
        now = self._now()
        for client_id in self.interest.clients_of(key[1]):
            if takeover.awaits_older_session(client_id):
                self._older_session_holds.setdefault(key, {})[client_id] = now
                log.info(
                    "cluster_stream_held_for_older_session client_id=%s origin=%s stream=%s from_seq=%d",
                    client_id,
                    key[0],
                    key[1],
                    first.low if 0 < first.low < first.seq else first.seq,
                )
        if self._older_session_holds.get(key) and self._next_catch_up is None:
            self._next_catch_up = now + self.retransmit_s

    def _older_session_arrived(
        self, client_id: str, positions: tuple[StreamPosition, ...]
    ) -> list[tuple[str, str]]:
        """The older session of ``client_id`` arrived with ``positions`` (``_catch_up``): the
        streams held for it stop being held; of each, what the session had - below its position
        there - is dropped. The streams, whose held rest goes once the catch-up is set up."""
        at = {(position.origin, position.stream): position.next_seq for position in positions}
        keys = self._drop_older_session_holds(client_id)
        for key in keys:
            held = self._held_for.get((key, client_id), ())
            if key in at:
                self._trim_held(key, client_id, [at[key]])
            log.info(
                "cluster_stream_hold_ended client_id=%s origin=%s stream=%s held=%d had=%d",
                client_id,
                key[0],
                key[1],
                len(held),
                len(held) - len(self._held_for.get((key, client_id), ())),
            )
        return keys

    def _drop_older_session_holds(self, client_id: str) -> list[tuple[str, str]]:
        """``client_id``'s streams held for its older session, no longer held (the messages held
        stay in ``_held_for``, for the caller)."""
        keys = []
        for key, clients in list(self._older_session_holds.items()):
            if clients.pop(client_id, None) is not None:
                keys.append(key)
            if not clients:
                del self._older_session_holds[key]
        return keys

    def _trim_held(self, key: tuple[str, str], client_id: str, below: list[int]) -> None:
        """The messages held for ``client_id`` on ``key`` below the highest of ``below`` are not
        delivered: the client had them (or gets them from a catch-up)."""
        held = self._held_for.get((key, client_id))
        if not held or not below or held[0].seq >= max(below):
            return
        kept = [forwarded for forwarded in held if forwarded.seq >= max(below)]
        self.store.release_held(client_id, key)
        for forwarded in kept:
            self.store.hold(client_id, forwarded)
        if kept:
            self._held_for[(key, client_id)] = kept
        else:
            del self._held_for[(key, client_id)]
        self._deliver_pending_commit = True

    def _end_full_holds(self) -> None:
        """The flow condition keeps a hold within half the client's queue limit
        (``_room_with_holds``); one whose held messages and queue reach the whole limit all the
        same (the stream accepted unpaced) ends now: released at once, a longer hold would
        overflow the queue with them (a stream of 500 msg/s held 11 s unpaced: 5,443 messages,
        495 dropped as ``queue_full_oldest``)."""
        broker = self.broker
        assert broker is not None
        for key, clients in list(self._older_session_holds.items()):
            for client_id in list(clients):
                depth = broker.queue_depth(client_id)
                held = len(self._held_for.get((key, client_id), ()))
                if depth is None or depth[0] + held >= depth[1]:
                    del clients[client_id]
                    log.info(
                        "cluster_stream_hold_released client_id=%s origin=%s stream=%s held=%d full",
                        client_id,
                        key[0],
                        key[1],
                        held,
                    )
                    self._release_held(key, client_id)
            if not clients:
                del self._older_session_holds[key]

    def _release_older_session_holds(self, now: float) -> bool:
        """Holds whose client no longer awaits its older session (every broker answered without
        it, its claim ended, a newer connection) or that lasted ``OLDER_SESSION_HOLD_S``: what was
        held goes now. Whether holds remain."""
        takeover = self.takeover
        for key, clients in list(self._older_session_holds.items()):
            for client_id, since in list(clients.items()):
                if (
                    takeover is None
                    or now - since > OLDER_SESSION_HOLD_S
                    or not takeover.awaits_older_session(client_id)
                ):
                    del clients[client_id]
                    log.info(
                        "cluster_stream_hold_released client_id=%s origin=%s stream=%s held_s=%.1f",
                        client_id,
                        key[0],
                        key[1],
                        now - since,
                    )
                    self._release_held(key, client_id)
            if not clients:
                del self._older_session_holds[key]
        return bool(self._older_session_holds)

    def _caught_up(self, forwarded: ForwardedMessage) -> None:
        """A resent message some moved session waits for: to that client only."""
        key = (forwarded.origin, forwarded.stream)
        pending = self._catch_ups.get(key)
        if not pending:
            return
        broker = self.broker
        assert broker is not None
        progressed: list[str] = []
        for catch_up in list(pending):
            next_seq, end, client_id, _started, _counted = catch_up
            if forwarded.seq != next_seq:
                continue
            broker.deliver_remote(forwarded.message, self._class_filter(forwarded.stream), client_id)
            self._deliver_pending_commit = True
            catch_up[0] = next_seq + 1
            progressed.append(client_id)
            if catch_up[0] >= end:
                pending.remove(catch_up)
                self._release_held(key, client_id)
        if not pending:
            self._catch_ups.pop(key, None)
        self._persist_catch_ups(progressed)  # with the deliveries' commit

    def _catch_ups_gone(self, key: tuple[str, str], gone_below: int) -> None:
        """The origin of ``key`` no longer logs SEQs below ``gone_below``: the catch-ups waiting
        for them go on from there (counted where the session's position was known)."""
        pending = self._catch_ups.get(key)
        if not pending:
            return
        moved_on: list[str] = []
        for catch_up in list(pending):
            next_seq, end = catch_up[0], catch_up[1]
            if next_seq >= gone_below:
                continue
            moved_on.append(catch_up[2])
            if catch_up[4]:
                self._count_given_up(key, min(gone_below, end) - next_seq)
            catch_up[0] = gone_below
            if gone_below >= end:
                pending.remove(catch_up)
                self._release_held(key, catch_up[2])
        if not pending:
            self._catch_ups.pop(key, None)
        self._persist_catch_ups(moved_on)

    def _release_held(self, key: tuple[str, str], client_id: str) -> None:
        """``client_id`` caught up on ``key`` (or gave up): the newer messages held for it go now."""
        if any(catch_up[2] == client_id for catch_up in self._catch_ups.get(key, ())):
            return  # another catch-up of this client on this stream still runs
        if client_id in self._older_session_holds.get(key, ()):
            return  # held for its older session still (``_hold_for_older_sessions``)
        held = self._held_for.pop((key, client_id), None)
        if not held:
            return
        broker = self.broker
        assert broker is not None
        broker.allow_backlog(client_id, len(held))  # the cluster's backlog, as ``_deliver_backlog``
        for forwarded in held:
            broker.deliver_remote(forwarded.message, self._class_filter(forwarded.stream), client_id)
        self.store.release_held(client_id, key)  # in the commit of these deliveries
        self._deliver_pending_commit = True

    def _persist_catch_ups(self, client_ids: Iterable[str]) -> None:
        """What each of ``client_ids`` still waits for goes to the store, in the open transaction
        (that of the deliveries that changed it): a restarted broker resumes it."""
        for client_id in sorted(set(client_ids)):
            rows = catch_up_state.rows_of(client_id, self._catch_ups, self._awaiting_start)
            self.store.set_catch_ups(client_id, rows)

    def _restore_catch_ups(self, now: float) -> None:
        """At start: the catch-ups a previous incarnation left, and the messages held for them, are
        resumed (their requests are repeated by the catch-up timer; a catch-up's give-up clock
        starts again). Messages held for a client with no catch-up left on their stream go now."""
        self._catch_ups, self._awaiting_start, self._held_for = catch_up_state.restore(
            self.store.load_catch_ups(), self.store.load_held(), now
        )
        self._start_claim_grace(now)  # stored sessions whose client moved on while we were down
        for key, client_id in list(self._held_for):
            self._release_held(key, client_id)

    def _count_given_up(self, key: tuple[str, str], missing: int) -> None:
        if missing > 0:
            self.stats.gaps_skipped += missing
            log.warning("cluster_gap_given_up origin=%s stream=%s missing=%d", key[0], key[1], missing)

    def _on_stream_body(self, orig: str, body: object) -> None:
        """A reliable-stream message from broker ``orig`` (ACK vector, RET, resend)."""
        if isinstance(body, StreamAck):
            sender = self.sender
            assert sender is not None
            peer = orig
            actions = sender.acked(peer, body.positions, self._now()) if body.positions else []
            if body.left:
                actions += sender.left(peer, body.left, self._now())
            self._sender_actions(actions)
        elif isinstance(body, StreamRet):
            assert self.sender is not None
            if not self._answer_log_taken_over(orig, body):  # (``streams_taken_over``)
                self._sender_actions(self.sender.ret(orig, body, self._now()))
        elif isinstance(body, StreamResend) and not self._hold_resend(orig, body):
            self._on_resend(body)

    def _hold_resend(self, orig: str, body: StreamResend) -> bool:
        """Whether ``body`` - messages of a stream of ``orig``'s that is new here - waits for
        ``orig``'s answer to a claim of ours that may bring a session from it
        (:meth:`Takeover.awaits_session_from`). A broker that restarts sends each peer at first
        contact what its log holds of its earlier incarnation's streams; the client that was on it
        and reconnected here had all of that, directly there, and the answer's positions name those
        streams at their end: started at them (``_catch_up``: ``StreamReceiver.adopt``), the stream
        drops what the positions prove delivered when the held messages go on. Started first, it
        delivered all of it again (the chaos soak's largest cause of duplicates,
        docs/notes/recovery.md). Only while every such claim's client has no session here older
        than the one the answer may bring (its CONNECT waits, or attached with an empty session):
        a session resumed here may need what lies below a newer session's positions (seed 842).
        Nothing is dropped here: held messages go on, as they came, once the answer is applied
        (:meth:`_release_resends`), after ``RESEND_HOLD_REPEATS`` claim repeat periods at most."""
        takeover = self.takeover
        if (
            takeover is None
            or not body.messages
            or origin_peer(body.origin) != orig
            or self.receiver.has_stream((body.origin, body.stream))
            or not takeover.awaits_session_from(orig)
        ):
            return False
        now = self._now()
        since, held = self._resends_held.setdefault(orig, (now, []))
        if now - since > RESEND_HOLD_REPEATS * takeover.repeat_s:
            self._release_resends(orig)  # (the older ones first)
            return False
        held.append(body)
        log.info(
            "cluster_resend_held origin=%s stream=%s first_seq=%d count=%d",
            body.origin,
            body.stream,
            body.messages[0].seq,
            len(body.messages),
        )
        return True

    def _release_resends(self, peer: str | None = None) -> None:
        """Resends held for ``peer``'s answer (all peers: ``None``) go on once it no longer owes one
        (answered, or the claim ended) or after ``RESEND_HOLD_REPEATS`` claim repeat periods.
        Called after a claim answer is applied, and at each timer event."""
        takeover = self.takeover
        if not self._resends_held or takeover is None or self.stopped:
            return
        now = self._now()
        for orig in [peer] if peer is not None else sorted(self._resends_held):
            entry = self._resends_held.get(orig)
            if entry is None:
                continue
            held_for_s = now - entry[0]
            if takeover.awaits_session_from(orig) and held_for_s <= RESEND_HOLD_REPEATS * takeover.repeat_s:
                continue
            del self._resends_held[orig]
            for body in entry[1]:
                self._on_resend(body)

    def _release_resends_answered(self, peer: str) -> None:
        """Scheduled after ``peer``'s answer to a claim of ours was applied: an event of its own."""
        if self._resends_held.get(peer) is not None and not self.stopped:
            self._release_resends(peer)
            self._after_event()

    def _on_resend(self, body: StreamResend) -> None:
        """A resend (or a RET's answer) from the stream's origin: into the receiver, and to the moved
        sessions that wait for these messages; nothing of an earlier incarnation whose log its
        replica holders took over (``streams_taken_over``)."""
        if self._receive_log_taken_over(body):
            return
        now = self._now()
        if body.gone_below and self._catch_ups:
            self._catch_ups_gone((body.origin, body.stream), body.gone_below)
        for forwarded in body.messages:
            if self._catch_ups:
                self._caught_up(forwarded)
            self._receive_forwarded(forwarded, 1)
        if body.gone_below:
            skipped_before = self.stats.gaps_skipped
            self._deliver(self.receiver.gone(body.origin, body.stream, body.gone_below, now))
            self._persist_positions()
            if self.stats.gaps_skipped > skipped_before:
                log.warning(
                    "cluster_gap_given_up origin=%s stream=%s missing=%d",
                    body.origin,
                    body.stream,
                    self.stats.gaps_skipped - skipped_before,
                )
