"""The receiving side of the reliable streams between brokers (pure core).

Seed 004 (CO protocol) §3.2-§3.3 on each ``(origin, topic class)`` stream a broker receives
(``broker.cluster.stream_sender`` numbers them):

* **Acceptance (§3.2).** ``REQ`` (here ``next_seq``) is the SEQ expected next; a message with
  ``seq == REQ`` is accepted and delivered, then every held successor in order. Per-publisher,
  per-topic order (MQTT §4.6) thus survives the overlay's one-hop / multi-hop switches.
* **Duplicates** (``seq < REQ``, or held already) are dropped by (sender, SEQ); each one makes
  the receiver acknowledge again (the sender resent it because an acknowledgement was lost).
* **Loss detection (§3.3 failure condition (1)).** ``seq > REQ`` reveals the gap
  ``[REQ, seq)``: the message is held and, after ``ret_delay_s`` (room for the overlay's own
  reordering), RET asks the origin for the gap, again every ``retransmit_s`` until it is filled.
  A gap is never skipped on a timer. Only the origin saying the messages are gone from its log
  (``gone``: it gave this receiver up, or lost its disk) skips it, counted and reported.
* **A stream new here** starts at the first message received, or at its ``low`` (the lowest SEQ
  the sender had not confirmed when it sent it): the messages in between may still be on their
  way to this broker, so they are asked for rather than overtaken. A message below where the
  stream started is stale (published before this broker subscribed) and dropped.
* **Causal groups (§3.2 acceptance condition with §3.3 failure condition (2); docs/causal.md
  decision 2).** A message that carries ``deps`` (``broker.cluster.causal_clock``) is accepted
  only when, for every stream of those this broker receives (a class it subscribes, another
  broker's), its own REQ reached the dependency: until then it is held at the head of its
  stream, and what it waits for is asked for with RET after ``ret_delay_s`` (a stream never
  heard of here is asked from the dependency's SEQ: the sender resends it, or answers that it is
  gone). A dependency whose origin never answers is given up after ``causal_wait_s`` (counted):
  the message is delivered without it.
* **Acknowledgements (§3.2 ACK).** Positions that moved are reported to each origin as one
  :class:`StreamAck` vector, ``ack_delay_s`` after the first change (alone when the receiver has
  nothing else to send). The engine persists positions with the deliveries they cover, so a
  restarted broker resumes where it stood and its acknowledgements make senders resend the rest.
  Every ``refresh_s`` the positions of the streams heard from recently are acknowledged again,
  alone (an acknowledgement lost in a partition would otherwise leave the sender not knowing
  this receiver, and free what it still has to send here).

* **Flow condition (§3.2) for catch-up.** A stream whose highest SEQ seen here (``head``: the
  sender's log holds at least that much) is more than ``LIVE_SLACK`` ahead of REQ is *catching
  up* (a restart, a heal, a resend): it accepts a message only within the ``budget`` the engine
  grants (the room the class's local sessions have below half their queue limit, minus what this
  receiver already asked for), holds at most ``HOLD_WINDOW`` messages ahead of REQ (the rest stay
  in the sender's log) and asks for the next window itself (RET ``[REQ, REQ + budget)``, at most
  ``RET_WINDOW``), again as soon as the last window is in. A live stream (REQ within
  ``LIVE_SLACK`` of its head) is never gated: a session slower than the live stream drops by its
  queue policy, as on one broker. A catch-up whose backlog has not shrunk for ``stall_s`` (a
  session slower than the live stream gates it, or one that stays away) goes on unpaced until the
  stream is live again (docs/cluster.md, "Flow control").
* **No head-of-line blocking.** A catch-up is measured over windows of ``window_s``: one that fell
  further behind its head (REQ moved less than the head did) is reported to the engine
  (``window_closed``), which stops pacing it by the connected sessions that gated it throughout
  the window - they drain slower than the live stream and take its messages with their queue
  policy, as on one broker - so the others' catch-up goes on at their pace; ``caught_up`` when the
  stream is live again. A session that is away keeps gating up to ``stall_s`` (its client is
  reconnecting, e.g. to this restarted broker); then ``stalled`` sets it aside too (it takes the
  backlog with its queue policy, as an offline session on one broker), and only a stall with no
  session to set aside goes on unpaced.

Events in (``receive``, ``gone``, ``restore``, ``tick`` with ``now``), deliveries and actions out.
No I/O, no clock of its own.

Size: one class whose every part - acceptance, gaps, causal holds, the flow condition - reads and
moves the same per-stream REQ and held messages; split, each part would reach into the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from sortedcontainers import SortedDict

from broker.cluster.messages import ForwardedMessage, StreamAck, StreamPosition, StreamRet
from broker.cluster.replication_messages import LOG_TAKEN_OVER
from broker.cluster.stats import ClusterStats

log = logging.getLogger("skipmq.cluster")

Delivery = tuple[ForwardedMessage, int]  # (message, overlay hops)
_SETTLED_LIMIT = 10_000
# flow control of catch-up (seed 004 §3.2 flow condition, docs/cluster.md "Flow control")
LIVE_SLACK = 256  # a stream whose head is at most this far ahead of REQ is live (one batch)
HOLD_WINDOW = 1024  # messages held ahead of REQ at most; further ones stay in the sender's log
RET_WINDOW = 256  # messages asked for in one RET at most (what one resend carries)
POLL_S = 0.02  # a catch-up waiting for room looks again this often
SLOW_WINDOW_S = 1.0  # a catch-up is measured over windows this long (slower than the live stream?)
UNLIMITED = 1 << 62
StreamKey = tuple[str, str]  # (origin, topic class)


def origin_peer(origin: str) -> str:
    """The peer id of a stream origin ``"<peer id>/<incarnation>"``."""
    return origin.rsplit("/", 1)[0]


@dataclass(frozen=True, slots=True)
class SendRet:
    """Ask broker ``peer`` for missing messages (RET)."""

    peer: str
    request: StreamRet


@dataclass(frozen=True, slots=True)
class SendAck:
    """Tell broker ``peer`` where this broker stands in its streams (ACK vector)."""

    peer: str
    ack: StreamAck


ReceiverAction = SendRet | SendAck


@dataclass(slots=True)
class _Stream:
    next_seq: int = 0  # REQ; 0 = nothing received yet
    start: int = 0  # where the stream started here (its first REQ)
    held: SortedDict = field(default_factory=SortedDict)  # seq -> Delivery
    ret_at: float | None = None  # when to ask (again) for the gap before the first held message
    acked: int = 0  # the position last acknowledged to the origin
    last_seen: float = 0.0
    blocked_at: float | None = None  # the head (seq == REQ) waits for its causal dependencies since
    dep_ret_at: float | None = None  # when to ask (again) for those dependencies
    head: int = 0  # the highest SEQ seen of the stream (the sender's log holds at least that)
    asked_to: int = 0  # the last RET asked up to here (exclusive; 0: none outstanding)
    least_behind: int = 0  # while catching up: the smallest backlog seen ...
    improved_at: float = 0.0  # ... and when it last shrank (a stall ends the pacing)
    unpaced: bool = False  # the catch-up stalled: accepted without a budget until live again
    # restored after a restart, or started at a moved session's position: behind by an unknown
    # amount, so paced until it has caught up once (REQ past every SEQ seen, nothing held)
    resumed: bool = False
    # the catch-up's current measuring window (no head-of-line blocking): since when, and REQ and
    # head at its start (0: none open)
    window_at: float = 0.0
    window_req: int = 0
    window_head: int = 0
    hold_checked_at: float = -1.0  # when ``hold_live`` was last asked for this live stream


class StreamReceiver:
    """The receive state of every ``(origin, class)`` stream reaching this broker."""

    def __init__(
        self,
        *,
        ret_delay_s: float,
        retransmit_s: float,
        ack_delay_s: float,
        refresh_s: float = 0.0,
        stats: ClusterStats | None = None,
        budget: Callable[[StreamKey], int] | None = None,
        stall_s: float = 10.0,
        window_s: float = SLOW_WINDOW_S,
    ) -> None:
        # flow control: how many more messages of a stream the local sessions take now (None:
        # unlimited), and how long a catch-up may go without its backlog shrinking
        self.budget = budget
        self.stall_s = stall_s
        # no head-of-line blocking: every ``window_s`` of a catch-up, ``window_closed(key,
        # fell_behind, behind)`` tells the engine whether the stream fell further behind its head
        # (REQ moved less than the head did): the sessions that gated it throughout are then slower
        # than the live stream and stop pacing it; ``caught_up(key)`` when it is live again
        self.window_s = window_s
        self.window_closed: Callable[[StreamKey, bool, int], int] | None = None
        self.caught_up: Callable[[StreamKey], None] | None = None
        # a catch-up stalled for ``stall_s``: ``stalled(key, behind)`` sets aside the sessions that
        # still hold it (its clients away all along); only when there are none it goes unpaced
        self.stalled: Callable[[StreamKey, int], int] | None = None
        # a live stream whose every local session is away and out of room (``hold_live(key)``, asked
        # at most every POLL_S) is paced as a catch-up: the sender's log keeps the rest, not the
        # sessions' queues, until a client is back or its session has moved (docs/cluster.md "Flow
        # control"); the stall sets such sessions aside as for any catch-up
        self.hold_live: Callable[[StreamKey], bool] | None = None
        self.refresh_s = refresh_s
        self._next_refresh: float | None = None
        self.ret_delay_s = ret_delay_s
        self.retransmit_s = retransmit_s
        self.ack_delay_s = ack_delay_s
        self.stats = stats if stats is not None else ClusterStats()
        self._streams: dict[StreamKey, _Stream] = {}
        self._gaps: set[StreamKey] = set()  # streams holding messages behind a gap
        self._unacked: set[StreamKey] = set()  # streams whose position moved since the last ack
        self._ack_at: float | None = None
        self.changed: dict[StreamKey, int] = {}  # positions to persist (the engine drains it)
        # causal groups (``set_causal``)
        self._self_peer = ""
        self._wants_class: Callable[[str], bool] = lambda cls: True
        self.causal_wait_s = 0.0
        self._blocked: set[StreamKey] = set()  # streams whose head waits for its dependencies
        self._waiting: dict[StreamKey, float] = {}  # streams whose head waits for room -> when to look
        self._settled: dict[StreamKey, int] = {}  # streams not received here: "gone below" answers
        # earlier origin incarnations whose logs their replica holders publish again (``taken_over``):
        # whatever still arrives of them (a relay's copy, a late resend) is dropped
        self._taken_over: set[str] = set()

    def set_causal(self, self_peer: str, wants_class: Callable[[str], bool], wait_s: float) -> None:
        """Causal groups: dependencies on this broker's own streams, and on streams of classes it
        does not subscribe (``wants_class``), hold nothing; ``wait_s`` bounds a wait."""
        self._self_peer = self_peer
        self._wants_class = wants_class
        self.causal_wait_s = wait_s

    # ------------------------------------------------------------------ receiving
    def receive(self, forwarded: ForwardedMessage, hops: int, now: float) -> list[Delivery]:
        """``forwarded`` arrived (overlay delivery or resend); the messages now deliverable."""
        if self._taken_over and forwarded.origin in self._taken_over:
            self.stats.duplicates_dropped += 1  # published again by the origin's replica holders
            return []
        key = (forwarded.origin, forwarded.stream)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream()
            self._settled.pop(key, None)
        stream.last_seen = now
        seq = forwarded.seq
        if seq > stream.head:
            stream.head = seq
        if stream.next_seq == 0:
            low = forwarded.low
            stream.next_seq = low if 0 < low < seq else seq  # §3.2: REQ of a stream new here
            stream.start = stream.next_seq
            stream.acked = stream.next_seq
        if seq < stream.next_seq or seq in stream.held:
            self.stats.duplicates_dropped += 1
            self._mark_unacked(key, now)  # the sender resent it: our acknowledgement was lost
            return []
        if seq > stream.next_seq:  # §3.3 failure condition (1): [REQ, seq) is missing
            if seq - stream.next_seq < HOLD_WINDOW:
                stream.held[seq] = (forwarded, hops)
                self.stats.reordered += 1
            else:
                self.stats.beyond_window += 1  # the sender's log keeps it: asked for in its turn
            if stream.ret_at is None:
                stream.ret_at = now + self.ret_delay_s
                self._gaps.add(key)
            return []
        if forwarded.copies and not self._deps_met(forwarded):
            stream.held[seq] = (forwarded, hops)  # §3.3 failure condition (2): not accepted yet
            self._block(key, stream, now)
            return []
        allowance = self._allowance(key, stream, now)
        if allowance <= 0:
            stream.held[seq] = (forwarded, hops)  # waits for room (flow condition)
            self._wait_for_room(key, stream, now)
            return []
        ready = [(forwarded, hops)]
        stream.next_seq = seq + 1
        self._drain(key, stream, ready, now, allowance - 1)
        self._moved(key, stream, now)
        if self._blocked:
            self._release(ready, now)
        return ready

    def gone(self, origin: str, cls: str, gone_below: int, now: float) -> list[Delivery]:
        """The origin no longer has SEQs below ``gone_below``: stop waiting for them (counted)."""
        key = (origin, cls)
        stream = self._streams.get(key)
        ready: list[Delivery] = []
        if stream is None:
            if self._blocked and gone_below > self._settled.get(key, 0):
                # the answer to a RET for a dependency on a stream not received here
                if len(self._settled) >= _SETTLED_LIMIT:
                    self._settled.clear()
                self._settled[key] = gone_below
                self._release(ready, now)
            return ready
        if stream.next_seq == 0 or gone_below <= stream.next_seq:
            return []
        first_held = stream.held.peekitem(0)[0] if stream.held else None
        target = gone_below if first_held is None else min(gone_below, first_held)
        self.stats.gaps_skipped += target - stream.next_seq
        stream.next_seq = target
        self._drain(key, stream, ready, now)
        self._moved(key, stream, now)
        if self._blocked:
            self._release(ready, now)
        return ready

    def taken_over(self, origin: str, now: float) -> tuple[int, list[Delivery]]:
        """The log of ``origin`` (an earlier incarnation of a broker whose disk went, with
        ``cluster.replicas`` > 1) is published again by its replica holders, in log order, on
        their own streams: what is held here of its streams - behind a gap, a causal dependency
        or the flow condition - is dropped, not delivered after the gap (it comes again from the
        holders, after the gap's messages), and so is whatever of it still arrives (a relay's
        copy: seed 341). Its streams are forgotten here (their dependants' waits are over).
        Returns how many were dropped, and what other streams held behind them delivers now."""
        if len(self._taken_over) >= _SETTLED_LIMIT:
            self._taken_over.clear()
        self._taken_over.add(origin)
        dropped = 0
        ready: list[Delivery] = []
        for key in [key for key in self._streams if key[0] == origin]:
            stream = self._streams.pop(key)
            dropped += len(stream.held)
            self._gaps.discard(key)
            self._blocked.discard(key)
            self._waiting.pop(key, None)
            self._unacked.discard(key)
            self.changed[key] = 0
            self._settled[key] = LOG_TAKEN_OVER
        if self._blocked:
            self._release(ready, now)
        return dropped, ready

    def restore(self, positions: list[tuple[StreamKey, int]], now: float) -> None:
        """Positions persisted by a previous incarnation; acknowledged to their origins at once,
        so they resend what this broker missed while it was down."""
        for key, next_seq in positions:
            self._streams[key] = _Stream(next_seq=next_seq, last_seen=now, resumed=True)
            self._unacked.add(key)
        if positions:
            self._ack_at = now

    def leave_class(self, cls: str) -> list[SendAck]:
        """This broker's last subscription of ``cls`` ended: forget its streams, tell the origins."""
        by_peer: dict[str, list[StreamPosition]] = {}
        for key in [key for key in self._streams if key[1] == cls]:
            stream = self._streams.pop(key)
            self._gaps.discard(key)
            self._blocked.discard(key)
            self._waiting.pop(key, None)
            self._unacked.discard(key)
            self.changed[key] = 0
            by_peer.setdefault(origin_peer(key[0]), []).append(
                StreamPosition(key[0], key[1], stream.next_seq)
            )
        return [SendAck(peer, StreamAck((), tuple(left))) for peer, left in sorted(by_peer.items())]

    def has_stream(self, key: StreamKey) -> bool:
        return key in self._streams

    def position(self, key: StreamKey) -> int:
        """REQ of ``key`` (0: no such stream here)."""
        stream = self._streams.get(key)
        return stream.next_seq if stream is not None else 0

    def start_of(self, key: StreamKey) -> int:
        """Where ``key`` started here: its first REQ (0: no such stream, or restored)."""
        stream = self._streams.get(key)
        return stream.start if stream is not None else 0

    def positions(self) -> dict[StreamKey, int]:
        return {key: stream.next_seq for key, stream in self._streams.items() if stream.next_seq}

    def adopt(self, key: StreamKey, next_seq: int, now: float) -> None:
        """Start the stream ``key`` at ``next_seq`` (a session that moved here brought where its old
        broker stood); acknowledged at once, so the sender sends what came after."""
        if key in self._streams:
            return
        self._streams[key] = _Stream(next_seq=next_seq, last_seen=now, resumed=True)
        self._moved(key, self._streams[key], now)

    # ------------------------------------------------------------------ timer
    def tick(self, now: float) -> list[ReceiverAction]:
        actions: list[ReceiverAction] = []
        for key in sorted(self._gaps):
            stream = self._streams[key]
            if stream.ret_at is None or stream.ret_at > now:
                continue
            if not stream.held and stream.head < stream.next_seq:
                stream.ret_at = None  # nothing known missing any more
                self._gaps.discard(key)
                continue
            first_held = stream.held.peekitem(0)[0] if stream.held else stream.head + 1
            if first_held == stream.next_seq:  # no gap: the head waits for its dependencies or room
                stream.ret_at = None
                self._gaps.discard(key)
                continue
            # windowed RET (the flow condition): no more than the sessions here have room for
            grant = min(self._allowance(key, stream, now), RET_WINDOW)
            if grant <= 0:
                stream.ret_at = now + POLL_S
                self.stats.paced_waits += 1
                continue
            to_seq = min(first_held, stream.next_seq + grant)
            actions.append(SendRet(origin_peer(key[0]), StreamRet(key[0], key[1], stream.next_seq, to_seq)))
            stream.asked_to = to_seq
            stream.ret_at = now + self.retransmit_s
        if self._blocked:
            actions += self._ask_dependencies(now)
        if self._next_refresh is not None and self._next_refresh <= now:
            self._next_refresh = None
            recent = now - self.refresh_s * 3
            for key, stream in self._streams.items():
                if stream.last_seen >= recent and stream.next_seq:
                    self._mark_unacked(key, now)
        if self._ack_at is not None and self._ack_at <= now:
            self._ack_at = None
            by_peer: dict[str, list[StreamPosition]] = {}
            for key in sorted(self._unacked):
                unacked = self._streams.get(key)
                if unacked is None:
                    continue
                unacked.acked = unacked.next_seq
                by_peer.setdefault(origin_peer(key[0]), []).append(
                    StreamPosition(key[0], key[1], unacked.next_seq)
                )
            self._unacked.clear()
            actions += [
                SendAck(peer, StreamAck(tuple(positions))) for peer, positions in sorted(by_peer.items())
            ]
        return actions

    def next_deadline(self) -> float | None:
        deadline = self._ack_at
        refresh = self._next_refresh
        if refresh is not None and (deadline is None or refresh < deadline):
            deadline = refresh
        for key in self._gaps:
            at = self._streams[key].ret_at
            if at is not None and (deadline is None or at < deadline):
                deadline = at
        for key in self._blocked:
            at = self._streams[key].dep_ret_at
            if at is not None and (deadline is None or at < deadline):
                deadline = at
        for at in self._waiting.values():
            if deadline is None or at < deadline:
                deadline = at
        return deadline

    def forget_idle(self, now: float, idle_s: float) -> list[StreamKey]:
        """Drop the state of streams silent for ``idle_s`` with nothing held or unacknowledged."""
        forgotten = []
        for key, stream in list(self._streams.items()):
            if now - stream.last_seen > idle_s and not stream.held and key not in self._unacked:
                del self._streams[key]
                self.changed[key] = 0
                forgotten.append(key)
        return forgotten

    def held_count(self) -> int:
        return sum(len(stream.held) for stream in self._streams.values())

    def causal_held_count(self) -> int:
        """Messages held behind a causal dependency: the causal hold-back's depth."""
        streams = self._streams
        return sum(len(streams[key].held) for key in self._blocked if key in streams)

    def blocked_count(self) -> int:
        """Streams whose next message waits for a causal dependency (the causal hold-back)."""
        return len(self._blocked)

    def clear_deadlines(self) -> None:
        """Nothing is delivered or sent any more (the broker stops)."""
        self._gaps.clear()
        self._blocked.clear()
        self._waiting.clear()
        self._ack_at = None
        self._next_refresh = None

    # ------------------------------------------------------------------ internals
    def _drain(
        self,
        key: StreamKey,
        stream: _Stream,
        ready: list[Delivery],
        now: float,
        allowance: int | None = None,
    ) -> None:
        held = stream.held
        while held and held.peekitem(0)[0] == stream.next_seq:
            forwarded = held.peekitem(0)[1][0]
            if forwarded.copies and not self._deps_met(forwarded):
                self._block(key, stream, now)
                return
            if allowance is None or allowance < UNLIMITED:
                allowance = self._allowance(key, stream, now, allowance)
                if allowance <= 0:
                    self._wait_for_room(key, stream, now)
                    return
                allowance -= 1
            _seq, delivery = held.popitem(0)
            ready.append(delivery)
            stream.next_seq += 1
        if not held and stream.head < stream.next_seq:
            stream.ret_at = None
            stream.resumed = False  # caught up once: live from here on
            self._gaps.discard(key)
        elif (
            stream.asked_to
            and stream.next_seq >= stream.asked_to
            and (stream.resumed or stream.head - stream.next_seq >= LIVE_SLACK)
        ):
            # catching up, and the window asked for is in: the next one at once (the catch-up goes
            # as fast as the room here allows, not one window per RET repeat)
            stream.asked_to = 0
            stream.ret_at = now
            self._gaps.add(key)
        elif stream.ret_at is None or stream.ret_at > now + self.ret_delay_s:
            # stopped at a gap behind what was released: a new one (the position moved), asked for
            # after the reorder hold - not when the RET of the gap just filled would have been
            # repeated (``retransmit_s`` later: a burst stalled 1 s behind every second loss)
            stream.ret_at = now + self.ret_delay_s
            self._gaps.add(key)

    # ------------------------------------------------------------------ flow condition
    def _allowance(self, key: StreamKey, stream: _Stream, now: float, left: int | None = None) -> int:
        """How many more messages of ``key`` may be accepted now: unlimited while the stream is
        live (REQ within LIVE_SLACK of its head), without a budget, or after a stall; else the
        engine's budget for it (``left``: what is left of one already taken) minus what other
        streams of its class asked for and did not get yet."""
        budget = self.budget
        if (
            budget is not None
            and not stream.resumed
            and stream.head - stream.next_seq < LIVE_SLACK
            and self._holds_live(key, stream, now)
        ):
            stream.resumed = True  # paced from here until it has caught up once
        if budget is None or (not stream.resumed and stream.head - stream.next_seq < LIVE_SLACK):
            if stream.unpaced or stream.least_behind:
                stream.unpaced = False
                stream.least_behind = 0
            if stream.window_at:
                stream.window_at = 0.0
                if self.caught_up is not None:
                    self.caught_up(key)
            return UNLIMITED
        behind = max(1, stream.head - stream.next_seq + 1)
        if stream.head > stream.next_seq:  # the head is known (a restored stream learns it)
            if not stream.window_at:
                stream.window_at, stream.window_req, stream.window_head = now, stream.next_seq, stream.head
            elif now - stream.window_at >= self.window_s:
                # no head-of-line blocking: did the catch-up fall further behind the live stream?
                fell_behind = stream.next_seq - stream.window_req < stream.head - stream.window_head
                if self.window_closed is not None and self.window_closed(key, fell_behind, behind):
                    stream.least_behind = 0  # paced by other sessions from here: a new stall measure
                elif stream.next_seq - stream.window_req > stream.head - stream.window_head:
                    # the backlog shrank over the window: progress, not a stall (behind may still be
                    # above its least, taken before the head was learned after a restart)
                    stream.least_behind = 0
                stream.window_at, stream.window_req, stream.window_head = now, stream.next_seq, stream.head
        if not stream.least_behind or behind < stream.least_behind:
            stream.least_behind = behind
            stream.improved_at = now
        elif not stream.unpaced and now - stream.improved_at > self.stall_s:
            if self.stalled is not None and self.stalled(key, behind):
                # the sessions that held it (away for the whole stall) take it with their queue
                # policy now, as an offline session on one broker; the others pace it on
                stream.least_behind = behind
                stream.improved_at = now
            else:
                stream.unpaced = True
                log.warning(
                    "cluster_catch_up_unpaced origin=%s stream=%s behind=%d stalled_s=%.1f budget=%d "
                    "held=%d asked_to=%d req=%d",
                    key[0],
                    key[1],
                    behind,
                    now - stream.improved_at,
                    budget(key),
                    len(stream.held),
                    stream.asked_to,
                    stream.next_seq,
                )
        if stream.unpaced:
            return UNLIMITED
        if left is not None:
            return left
        cls = key[1]
        reserved = 0
        for other in self._gaps:
            if other[1] == cls and other != key:
                other_stream = self._streams[other]
                if other_stream.asked_to > other_stream.next_seq:
                    reserved += other_stream.asked_to - other_stream.next_seq
        return budget(key) - reserved

    def _holds_live(self, key: StreamKey, stream: _Stream, now: float) -> bool:
        """Whether the live stream ``key`` is to be held for its local sessions, all away and out of
        room (``hold_live``): asked at most every POLL_S per stream (the live path's cost)."""
        hold_live = self.hold_live
        if hold_live is None or now - stream.hold_checked_at < POLL_S:
            return False
        stream.hold_checked_at = now
        return hold_live(key)

    def _wait_for_room(self, key: StreamKey, stream: _Stream, now: float) -> None:
        """The head of ``key`` waits for room here: looked at again every POLL_S (``poll``)."""
        self.stats.paced_waits += 1
        self._waiting[key] = now + POLL_S

    def poll(self, now: float) -> list[Delivery]:
        """Streams whose head waited for room: what the room now lets through."""
        ready: list[Delivery] = []
        for key, at in sorted(self._waiting.items()):
            if at > now:
                continue
            del self._waiting[key]
            stream = self._streams.get(key)
            if stream is None:
                continue
            before = len(ready)
            self._drain(key, stream, ready, now)
            if len(ready) > before:
                self._moved(key, stream, now)
        if ready and self._blocked:
            self._release(ready, now)
        return ready

    # ------------------------------------------------------------------ causal groups
    def _unmet(self, forwarded: ForwardedMessage) -> list[StreamPosition]:
        """The dependencies of ``forwarded`` this broker has not accepted yet (and will receive)."""
        unmet = []
        for dep in forwarded.deps:
            key = (dep.origin, dep.stream)
            stream = self._streams.get(key)
            if stream is not None:
                if stream.next_seq >= dep.next_seq:
                    continue
            elif self._settled.get(key, 0) >= dep.next_seq or not self._wants_class(dep.stream):
                continue
            if origin_peer(dep.origin) == self._self_peer:
                continue  # our own messages (any incarnation) were accepted when sent
            unmet.append(dep)
        return unmet

    def _deps_met(self, forwarded: ForwardedMessage) -> bool:
        return not self._unmet(forwarded)

    def _block(self, key: StreamKey, stream: _Stream, now: float) -> None:
        if key in self._blocked:
            return
        self._blocked.add(key)
        self.stats.causal_held += 1
        stream.blocked_at = now
        stream.dep_ret_at = now + self.ret_delay_s

    def _release(self, ready: list[Delivery], now: float, *, give_up: bool = False) -> None:
        """Accept the held heads whose dependencies are now met (``give_up``: waited too long)."""
        progress = True
        while progress and self._blocked:
            progress = False
            for key in sorted(self._blocked):
                stream = self._streams[key]
                forwarded, hops = stream.held.peekitem(0)[1]
                waited_s = now - stream.blocked_at if stream.blocked_at is not None else 0.0
                if self._deps_met(forwarded):
                    pass
                elif give_up and waited_s >= self.causal_wait_s:
                    self.stats.causal_given_up += 1
                    log.warning(
                        "cluster_causal_dependency_given_up origin=%s stream=%s seq=%d missing=%s",
                        key[0],
                        key[1],
                        forwarded.seq,
                        ",".join(f"{d.origin}:{d.stream}<{d.next_seq}" for d in self._unmet(forwarded)),
                    )
                else:
                    continue
                self._blocked.discard(key)
                stream.blocked_at = stream.dep_ret_at = None
                stream.held.popitem(0)
                ready.append((forwarded, hops))
                stream.next_seq += 1
                self._drain(key, stream, ready, now)
                self._moved(key, stream, now)
                progress = True

    def _ask_dependencies(self, now: float) -> list[ReceiverAction]:
        """RET for the dependencies blocked heads wait for (§3.3 failure condition (2))."""
        actions: list[ReceiverAction] = []
        asked: set[tuple[str, str, int]] = set()
        for key in sorted(self._blocked):
            stream = self._streams[key]
            if stream.dep_ret_at is None or stream.dep_ret_at > now:
                continue
            stream.dep_ret_at = now + self.retransmit_s
            for dep in self._unmet(stream.held.peekitem(0)[1][0]):
                dep_key = (dep.origin, dep.stream)
                have = self._streams.get(dep_key)
                from_seq = have.next_seq if have is not None else dep.next_seq - 1
                if (dep.origin, dep.stream, dep.next_seq) in asked:
                    continue
                asked.add((dep.origin, dep.stream, dep.next_seq))
                self.stats.rets_sent += 1
                request = StreamRet(dep.origin, dep.stream, from_seq, dep.next_seq)
                actions.append(SendRet(origin_peer(dep.origin), request))
        return actions

    def give_up_waits(self, now: float) -> list[Delivery]:
        """Deliver the heads that waited ``causal_wait_s`` for a dependency (counted, logged)."""
        ready: list[Delivery] = []
        if self._blocked:
            self._release(ready, now, give_up=True)
        return ready

    def _moved(self, key: StreamKey, stream: _Stream, now: float) -> None:
        self.changed[key] = stream.next_seq
        self._mark_unacked(key, now)

    def _mark_unacked(self, key: StreamKey, now: float) -> None:
        self._unacked.add(key)
        if self._ack_at is None:
            self._ack_at = now + self.ack_delay_s
        if self.refresh_s > 0 and self._next_refresh is None:
            self._next_refresh = now + self.refresh_s
