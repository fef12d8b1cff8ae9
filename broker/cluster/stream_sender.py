"""Store and forward: the sending side of the reliable streams between brokers (pure core).

Seed 004 (CO protocol, Sakamoto et al.) adapted to a cluster whose groups follow the overlay:

* **Streams and SEQ (§3.1, §3.2 send procedure).** Every broker that forwards is a sender. The
  messages it forwards on one topic class form one stream ``(origin, class)`` - ``origin`` is
  ``"<peer id>/<incarnation>"`` - numbered 1, 2, ... with no gaps.
* **The send log (SL of §2.2).** Every message stays in the log until it is *freed*: the
  overlay reported its publication complete (seed 003 ``PublishDone``: every subscriber broker
  the multicast tree reached stored it) **and** every receiver the stream knows acknowledged it,
  ``seq < min(AL)`` - the pre-acknowledgement condition of §3.4 with the group being the brokers
  that acknowledged the stream and have not left it (the seed fixes the group in advance; here
  it follows the overlay's subscriber run, docs/cluster.md "Reliable streams"). The engine keeps
  QoS >= 1 entries durable in the store (``Durable`` / ``Forget`` actions), so a restarted broker
  resumes its streams (``restore``).
* **Retransmission (§3.3).** A receiver that detects a gap sends RET (``ret``) and gets the
  missing messages from the log (``Resend``); below the log's first entry they are gone
  (``gone_below``). The sender also sends again, on its own, what a known receiver has not
  acknowledged within ``retransmit_s`` (the last paragraph of §3.3), and publishes again through
  the overlay what the overlay could not complete (``Republish``).
* **Receivers given up.** A receiver that acknowledges nothing for ``retention_s`` (a broker
  removed from the cluster) stops holding the log; counted and reported (``GaveUp``).
* **Presence grace.** A message of a class whose rendezvous point says "no subscriber" is not
  forwarded (exhaust data, seed 003 §3.2) but kept ``presence_grace_s``: when presence turns on
  (a subscription elsewhere just became reachable), the kept messages go out first
  (``presence_on``), so a message published right after a SUBACK on another broker is not lost
  to the rendezvous point's notification delay. For a class that had subscribers within the
  grace (one just moved or restarted), the kept messages are log entries (``append(held=True)``:
  durable for QoS >= 1, published when presence returns, after a restart at once); for a class
  without recent subscribers they are kept in memory only, at no cost per message.

Events in (``append``, ``published``, ``done``, ``acked``, ``ret``, ``tick`` with ``now``),
actions out as plain data. No I/O, no clock of its own.

Size: one class whose parts - numbering, the log, republication, resends, freeing - all read and
write the same per-stream state (``_Stream``); split, each part would reach into the others'.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sortedcontainers import SortedDict, SortedSet

from broker.cluster.messages import ForwardedMessage, StreamPosition, StreamResend, StreamRet
from broker.cluster.stats import LATENCY_SAMPLE_EVERY
from broker.core.session import Message
from broker.core.stats import Histogram

StreamKey = tuple[str, str]  # (origin, topic class)
_SAMPLE_MASK = LATENCY_SAMPLE_EVERY - 1
RESEND_BATCH = 256  # messages in one Resend / Republish round per stream and receiver
# a message every known receiver acknowledged, whose publication the overlay keeps reporting
# incomplete (a subscriber's virtual node left: its neighbours' view is on probation), is published
# again after 1, 2, 4 ... retransmit periods, at most this far apart
REPUBLISH_BACKOFF_MAX_S = 30.0


@dataclass(frozen=True, slots=True)
class Republish:
    """Publish ``forwarded`` through the overlay again (its last publication did not complete)."""

    forwarded: ForwardedMessage


@dataclass(frozen=True, slots=True)
class Resend:
    """Send ``resend`` to broker ``peer`` directly (an answer to RET, or unacknowledged)."""

    peer: str
    resend: StreamResend


@dataclass(frozen=True, slots=True)
class Forget:
    """Entries of ``key`` below ``below_seq`` are freed: delete them from the durable log."""

    key: StreamKey
    below_seq: int


@dataclass(frozen=True, slots=True)
class ReceiverAt:
    """Receiver ``peer`` of ``key`` acknowledged up to ``next_seq`` (None: it left or was given up)."""

    key: StreamKey
    peer: str
    next_seq: int | None


@dataclass(frozen=True, slots=True)
class GaveUp:
    """Receiver ``peer`` of ``key`` was silent for ``retention_s``: ``missing`` messages it had not
    acknowledged are no longer kept for it."""

    key: StreamKey
    peer: str
    missing: int


SenderAction = Republish | Resend | Forget | ReceiverAt | GaveUp


@dataclass(slots=True)
class _Entry:
    forwarded: ForwardedMessage
    durable: bool
    confirmed: bool  # the overlay reported its (last) publication complete
    sent_at: float
    created_at: float
    held: bool = False  # waits for the class's presence before it is published
    incomplete: bool = False  # the overlay reported a publication of it incomplete
    stored: bool = True  # (durable entries) the engine wrote it to the durable log too
    backoff_s: float = 0.0  # the last wait before republishing it (acknowledged everywhere known)


@dataclass(slots=True)
class _Stream:
    entries: SortedDict = field(default_factory=SortedDict)  # seq -> _Entry
    unconfirmed: SortedSet = field(default_factory=SortedSet)  # seqs the overlay has not completed
    # durable seqs confirmed without reaching another broker (the overlay completed with no
    # delegation elsewhere, sent to known receivers while none is known, held past the grace): a
    # receiver this broker does not know yet (cut off) may still lack them (``_low``)
    blind: SortedSet = field(default_factory=SortedSet)
    receivers: dict[str, int] = field(default_factory=dict)  # peer -> AL (next seq it expects)
    heard: dict[str, float] = field(default_factory=dict)  # peer -> when it last acknowledged
    resent_at: dict[str, float] = field(default_factory=dict)  # peer -> last unprompted resend
    assumed: set[str] = field(default_factory=set)  # registered by interest, not acknowledged yet
    # (SEQ, until): what a receiver that left had not acknowledged is kept ``min_retention_s`` more
    # (``left``): it may have handed a session over whose new broker fetches from its position
    kept_for_left: tuple[int, float] | None = None
    next_seq: int = 1


class StreamSender:
    """The send side of every stream this broker forwards (and of those restored from its store)."""

    def __init__(
        self,
        origin: str,
        *,
        retransmit_s: float,
        retention_s: float,
        presence_grace_s: float,
        min_retention_s: float = 0.0,
        receivers_of: Callable[[str], Iterable[str]] = lambda cls: (),
        absent_since: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.origin = origin
        # since when some broker this one knew is cut off or down (None: every one is reachable)
        self._absent_since = absent_since
        self._receivers_of = receivers_of
        self.min_retention_s = min_retention_s
        self.retransmit_s = retransmit_s
        self.retention_s = retention_s
        self.presence_grace_s = presence_grace_s
        self._streams: dict[StreamKey, _Stream] = {}
        self._publications: dict[int, tuple[StreamKey, int]] = {}  # publication id -> (key, seq)
        # class -> (when, message, causal deps) kept while it had no subscriber
        self._skipped: dict[str, deque[tuple[float, Message, tuple[StreamPosition, ...] | None]]] = {}
        self._present_at: dict[str, float] = {}  # class -> when it last had subscribers
        self._next_check: float | None = None
        # class -> the receivers of a previous incarnation's stream of it (``restore``)
        self._restored_receivers: dict[str, set[str]] = {}
        # receivers a new stream started with (``append``), for the store: ``take_new_receivers``
        self._new_receivers: list[ReceiverAt] = []
        # figures read at scrape time (broker.metrics): messages not forwarded because their class
        # had no subscriber, RETs answered, and (when set) one in LATENCY_SAMPLE_EVERY publication
        # confirmations timed from the entry's (last) publication to the overlay's DONE
        self.skipped_total = 0
        self.rets_received = 0
        self.confirm_seconds: Histogram | None = None

    # ------------------------------------------------------------------ sending
    def append(
        self,
        cls: str,
        message: Message,
        now: float,
        *,
        confirmed: bool = False,
        held: bool = False,
        deps: tuple[StreamPosition, ...] = (),
        copies: tuple[tuple[str, int], ...] = (),
        stored: bool = True,
    ) -> ForwardedMessage:
        """Number ``message`` on this broker's stream of ``cls`` and keep it in the log
        (``confirmed``: it does not go through the overlay, only to the known receivers;
        ``held``: published when the class's presence returns, see ``presence_on``; ``deps`` and
        ``copies``: a message of a causal group, ``broker.cluster.causal_clock``; ``stored``
        False: a QoS >= 1 entry the engine keeps in memory only - freeing it needs no ``Forget``)."""
        key = (self.origin, cls)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream()
            # the subscriber brokers of the class we were told of (filter propagation), or that
            # received it from a previous incarnation (our store), receive it from its first
            # message on; later ones are added by ``register``
            for peer in self._subscribers(cls):
                stream.receivers[peer] = 1
                stream.heard[peer] = now
                stream.assumed.add(peer)
                self._new_receivers.append(ReceiverAt(key, peer, 1))
        seq = stream.next_seq
        stream.next_seq = seq + 1
        low = self._low(stream, now)
        forwarded = ForwardedMessage(self.origin, cls, seq, message, low, deps, copies)
        # QoS 0 is kept in memory only (at most once: nothing to keep across a crash) and needs no
        # overlay completion; it still answers RET while the broker runs
        durable = message.qos > 0
        if not durable and not stream.receivers:
            return forwarded  # QoS 0 that no known receiver may ask for again: nothing to keep
        if durable and confirmed and not stream.receivers:
            stream.blind.add(seq)  # (not through the overlay, and no receiver we know of)
        confirmed = confirmed or not durable
        stream.entries[seq] = _Entry(forwarded, durable, confirmed, now, now, held, False, stored)
        if not confirmed:
            stream.unconfirmed.add(seq)
        self._arm(now)
        return forwarded

    def take_new_receivers(self) -> list[ReceiverAt]:
        """The receivers streams started with since the last call (``append``): durable with the
        first message, so a restarted broker still keeps the stream for a receiver that was cut
        off (a long partition) and has acknowledged nothing yet (seed 59 of ``--faults
        crash,long-partition``)."""
        taken = self._new_receivers
        if taken:
            self._new_receivers = []
        return taken

    def published(self, publication_id: int, forwarded: ForwardedMessage) -> None:
        """``forwarded`` went into the overlay as publication ``publication_id``."""
        self._publications[publication_id] = ((forwarded.origin, forwarded.stream), forwarded.seq)

    def done(
        self, publication_id: int, complete: bool, now: float, reached: bool = True
    ) -> list[SenderAction]:
        """The overlay's ``PublishDone`` for a publication of a logged message (``reached``: it
        went to another broker, ``overlay.api.PublishDone``)."""
        found = self._publications.pop(publication_id, None)
        if found is None:
            return []
        key, seq = found
        stream = self._streams.get(key)
        if stream is None:
            return []
        entry = stream.entries.get(seq)
        if entry is None:
            return []
        if complete:
            histogram = self.confirm_seconds
            if histogram is not None and not publication_id & _SAMPLE_MASK:
                histogram.observe(now - entry.sent_at)
            entry.confirmed = True
            stream.unconfirmed.discard(seq)
            if not reached:
                stream.blind.add(seq)
            return self._free(key, stream, now)
        entry.incomplete = True  # its republications do not stand for resends to known receivers
        receivers = stream.receivers
        if receivers and seq < min(receivers.values()):
            # every known receiver has it: the republication is only for a subscriber broker this
            # one does not know of (cut off before its interest arrived), which also gets the log
            # when it is back (``logged_for``). Every retransmit period it sent the whole run of
            # them to every receiver again while the overlay could not complete (issue #10)
            entry.backoff_s = min(2 * entry.backoff_s or self.retransmit_s, REPUBLISH_BACKOFF_MAX_S)
            entry.sent_at = now - self.retransmit_s + entry.backoff_s
        else:
            entry.backoff_s = 0.0
            entry.sent_at = now - self.retransmit_s / 2  # published again soon, not at once
        self._arm(now)
        return []

    def has_receivers(self, cls: str) -> bool:
        """Whether a receiver broker of this broker's stream of ``cls`` still expects messages
        (a known receiver that crashed or is cut off must get them when it is back). Before the
        stream's first message: whether a broker that subscribes ``cls`` was announced (filter
        propagation) - the receivers the stream will start with (``append``)."""
        stream = self._streams.get((self.origin, cls))
        if stream is None:
            return bool(self._subscribers(cls))
        return bool(stream.receivers)

    def skip(
        self, cls: str, message: Message, now: float, deps: tuple[StreamPosition, ...] | None = None
    ) -> None:
        """``message`` of ``cls`` was not forwarded: the rendezvous point reports no subscriber
        (``deps``: its dependencies, if it is a message of a causal group)."""
        self.skipped_total += 1
        kept = self._skipped.get(cls)
        if kept is None:
            kept = self._skipped[cls] = deque()
        kept.append((now, message, deps))
        horizon = now - self.presence_grace_s
        while kept and kept[0][0] < horizon:
            kept.popleft()

    def present(self, cls: str, now: float) -> None:
        """``cls`` has subscribers (its presence turned on, or a message was forwarded on it)."""
        self._present_at[cls] = now

    def recently_present(self, cls: str, now: float) -> bool:
        return now - self._present_at.get(cls, float("-inf")) <= self.presence_grace_s

    def presence_on(
        self, cls: str, now: float
    ) -> tuple[list[tuple[Message, tuple[StreamPosition, ...] | None]], list[ForwardedMessage]]:
        """Presence of ``cls`` turned on: the messages kept in memory while it was off (with their
        causal dependencies, see ``skip``), and the held log entries to publish now, oldest first."""
        self._present_at[cls] = now
        kept = self._skipped.pop(cls, None)
        horizon = now - self.presence_grace_s
        messages = [(message, deps) for at, message, deps in kept if at >= horizon] if kept else []
        held: list[ForwardedMessage] = []
        stream = self._streams.get((self.origin, cls))
        if stream is not None:
            for seq in stream.unconfirmed:
                entry = stream.entries[seq]
                if entry.held:
                    entry.held = False
                    entry.sent_at = now
                    held.append(entry.forwarded)
        return messages, held

    # ------------------------------------------------------------------ receivers
    def acked(self, peer: str, positions: tuple[StreamPosition, ...], now: float) -> list[SenderAction]:
        """Receiver ``peer``'s ACK vector (§3.2 ACK; AL of §3.1)."""
        actions: list[SenderAction] = []
        for position in positions:
            key = (position.origin, position.stream)
            stream = self._streams.get(key)
            if stream is None:
                continue  # nothing logged for it any more (freed, or an unknown incarnation)
            stream.heard[peer] = now
            previous = stream.receivers.get(peer)
            if peer in stream.assumed:
                # registered by interest at a guessed position: its own acknowledgement rules, even
                # lower (a session moved to it brought an earlier position)
                stream.assumed.discard(peer)
            elif previous is not None and position.next_seq <= previous:
                continue
            stream.receivers[peer] = position.next_seq
            actions.append(ReceiverAt(key, peer, position.next_seq))
            actions += self._free(key, stream, now)
        return actions

    def register(self, peer: str, cls: str, now: float, *, from_log_start: bool) -> list[SenderAction]:
        """Broker ``peer`` subscribes ``cls`` (filter propagation): a receiver of every stream of
        ``cls`` here - from the next message (a new subscription), or from the log's first entry
        (a broker that starts or comes back: it may have missed them)."""
        actions: list[SenderAction] = []
        for key, stream in self._streams.items():
            if key[1] != cls:
                continue
            if key[0] != self.origin and not stream.entries:
                continue  # an old incarnation's stream, all delivered
            first = stream.entries.peekitem(0)[0] if stream.entries else stream.next_seq
            start = int(first) if from_log_start else stream.next_seq
            known = stream.receivers.get(peer)
            if known is not None and not (peer in stream.assumed and start < known):
                continue  # acknowledged (its own position rules), or registered lower already
            stream.receivers[peer] = start
            stream.heard[peer] = now
            stream.assumed.add(peer)
            actions.append(ReceiverAt(key, peer, start))
        if actions:
            self._arm(now)
        return actions

    def unregister(self, peer: str, cls: str, now: float) -> list[SenderAction]:
        """Broker ``peer`` no longer subscribes ``cls``."""
        positions = tuple(StreamPosition(key[0], key[1], 0) for key in self._streams if key[1] == cls)
        return self.left(peer, positions, now)

    def left(self, peer: str, positions: tuple[StreamPosition, ...], now: float) -> list[SenderAction]:
        """Receiver ``peer`` no longer subscribes these streams' classes."""
        actions: list[SenderAction] = []
        for position in positions:
            key = (position.origin, position.stream)
            stream = self._streams.get(key)
            if stream is None or peer not in stream.receivers:
                continue
            acknowledged = stream.receivers.pop(peer)
            stream.heard.pop(peer, None)
            stream.resent_at.pop(peer, None)
            stream.assumed.discard(peer)
            if self.min_retention_s > 0:
                # a broker leaves a class when its last session of it is handed over: the session's
                # new broker asks for what follows the position it left with (a session held back
                # after a restart, issue #30), perhaps just after this leave arrived
                kept = stream.kept_for_left
                if kept is not None and kept[1] > now:
                    acknowledged = min(acknowledged, kept[0])
                stream.kept_for_left = (acknowledged, now + self.min_retention_s)
            actions.append(ReceiverAt(key, peer, None))
            actions += self._free(key, stream, now)
        return actions

    def ret(self, peer: str, request: StreamRet, now: float) -> list[SenderAction]:
        """RET from ``peer`` (§3.3 retransmission procedure (2)): send what the log holds."""
        self.rets_received += 1
        key = (request.origin, request.stream)
        stream = self._streams.get(key)
        entries = stream.entries if stream is not None else SortedDict()
        if stream is not None and peer in stream.receivers:
            stream.heard[peer] = now
        return [Resend(peer, self._resend(key, entries, request.from_seq, request.to_seq))]

    # ------------------------------------------------------------------ restart
    def restore(
        self, logged: list[ForwardedMessage], receivers: list[tuple[StreamKey, str, int]], now: float
    ) -> None:
        """Load the durable log and the receivers' positions a previous incarnation left."""
        for forwarded in logged:
            key = (forwarded.origin, forwarded.stream)
            stream = self._streams.get(key)
            if stream is None:
                stream = self._streams[key] = _Stream()
            # sent_at in the past: published again through the overlay on the first tick
            stream.entries[forwarded.seq] = _Entry(forwarded, True, False, now - self.retransmit_s, now)
            stream.unconfirmed.add(forwarded.seq)
            # an earlier incarnation's stream ends after its last logged message: a session moving
            # away names it there (everything of it reached this broker's own sessions), and a new
            # receiver starts there - not at SEQ 1, from where the whole log was delivered again
            stream.next_seq = max(stream.next_seq, forwarded.seq + 1)
        for key, peer, next_seq in receivers:
            if key[0] != self.origin:
                # a broker restarted while cut off from some subscriber brokers does not hear of
                # them (filter propagation) until they talk again, and the overlay may complete a
                # publication without them (seed 521 of the causal conversation): they are the
                # new streams' receivers from the first message on (one that left answers "left")
                self._restored_receivers.setdefault(key[1], set()).add(peer)
            stream = self._streams.get(key)
            if stream is not None:
                stream.receivers[peer] = next_seq
                stream.heard[peer] = now
        if logged:
            self._arm(now)

    # ------------------------------------------------------------------ timer
    def tick(self, now: float) -> list[SenderAction]:
        """Republish what the overlay did not complete, resend what receivers did not acknowledge,
        give up receivers silent for ``retention_s``."""
        if self._next_check is None or self._next_check > now:
            return []
        self._next_check = None
        actions: list[SenderAction] = []
        due = now - self.retransmit_s
        for key, stream in list(self._streams.items()):
            entries = stream.entries
            if not entries:
                if key[0] != self.origin and not stream.receivers:
                    del self._streams[key]  # an old incarnation's stream, all delivered
                continue
            republished = 0
            for seq in list(stream.unconfirmed):
                if republished >= RESEND_BATCH:
                    break
                entry = entries[seq]
                if entry.held:
                    if entry.created_at + self.presence_grace_s < now:
                        entry.held = False  # nobody subscribed again within the grace: done
                        entry.confirmed = True
                        stream.unconfirmed.discard(seq)
                        stream.blind.add(seq)
                    continue
                if entry.sent_at <= due:
                    entry.sent_at = now
                    republished += 1
                    actions.append(Republish(entry.forwarded))
            last = entries.peekitem(-1)[0]
            for peer, next_seq in list(stream.receivers.items()):
                if stream.heard.get(peer, now) < now - self.retention_s:
                    missing = sum(1 for seq in entries.irange(minimum=next_seq))
                    del stream.receivers[peer]
                    stream.heard.pop(peer, None)
                    stream.resent_at.pop(peer, None)
                    actions.append(GaveUp(key, peer, missing))
                    actions.append(ReceiverAt(key, peer, None))
                    continue
                if next_seq > last or stream.resent_at.get(peer, -1e18) > due:
                    continue
                oldest = entries.get(next_seq)
                if oldest is not None and oldest.sent_at > due and not oldest.incomplete:
                    # sent recently: its acknowledgement may be on the way (but not when the
                    # overlay could not complete it: republishing it through a half of the overlay
                    # that does not reach this receiver - a heal not yet repaired - would hold
                    # it back until the overlay is repaired, seed 24 of the causal conversation)
                    continue
                stream.resent_at[peer] = now
                actions.append(Resend(peer, self._resend(key, entries, next_seq, last + 1)))
            actions += self._free(key, stream, now)
        if any(stream.entries for stream in self._streams.values()):
            self._arm(now)
        return actions

    def next_deadline(self) -> float | None:
        return self._next_check

    def logged_for(self, peer: str) -> list[SenderAction]:
        """Broker ``peer`` is reachable again (a heal, a restart): what the log still holds (not
        acknowledged everywhere, or within ``min_retention_s``) is sent to it directly - it may be
        a receiver this broker never heard from, whose half of the overlay was cut off, and the
        overlay may have called a publication complete without it. It drops what it already has
        and answers "left" for classes it does not subscribe."""
        actions: list[SenderAction] = []
        for key, stream in self._streams.items():
            if not stream.entries or peer in stream.receivers:
                continue  # a known receiver gets its resends from tick()
            messages = [entry.forwarded for entry in stream.entries.values()[:RESEND_BATCH]]
            actions.append(Resend(peer, StreamResend(key[0], key[1], tuple(messages), 0)))
        return actions

    # ------------------------------------------------------------------ sessions moving away
    def position(self, cls: str) -> int:
        """The SEQ this broker's next message on ``cls`` will get."""
        stream = self._streams.get((self.origin, cls))
        return stream.next_seq if stream is not None else 1

    def next_seq_of(self, key: StreamKey) -> int | None:
        """The SEQ the next message of stream ``key`` would get (for an earlier incarnation's
        stream: one past its last); None for a stream this sender does not keep."""
        stream = self._streams.get(key)
        return stream.next_seq if stream is not None else None

    def streams_of(self, cls: str) -> list[StreamKey]:
        """This broker's streams of ``cls`` (this incarnation's, and earlier ones' still logged)."""
        return sorted(key for key in self._streams if key[1] == cls)

    def logged_from(self, key: StreamKey, from_seq: int) -> tuple[list[ForwardedMessage], int]:
        """The logged messages of ``key`` from ``from_seq`` on, and the SEQ below which the log no
        longer holds them (``from_seq`` when nothing is missing)."""
        stream = self._streams.get(key)
        if stream is None or not stream.entries:
            next_seq = stream.next_seq if stream is not None else from_seq
            return [], max(from_seq, next_seq)
        entries = stream.entries
        first = entries.peekitem(0)[0]
        messages = [entries[seq].forwarded for seq in entries.irange(minimum=from_seq)]
        return messages, max(from_seq, first)

    # ------------------------------------------------------------------ introspection
    def logged_count(self) -> int:
        return sum(len(stream.entries) for stream in self._streams.values())

    def receiver_count(self) -> int:
        return sum(len(stream.receivers) for stream in self._streams.values())

    # ------------------------------------------------------------------ internals
    def _subscribers(self, cls: str) -> list[str]:
        """The brokers known to subscribe ``cls``: announced, or receivers of our store's streams."""
        return sorted({*self._receivers_of(cls), *self._restored_receivers.get(cls, ())})

    def _arm(self, now: float) -> None:
        if self._next_check is None:
            self._next_check = now + self.retransmit_s / 2

    def _low(self, stream: _Stream, now: float) -> int:
        """The lowest SEQ some receiver may still lack (0: none), where a receiver new to the stream
        starts: the first one the overlay has not confirmed, where a receiver registered by interest
        (not heard from yet) starts, and - while no receiver is known or some broker is down - the
        first blind confirmation (``_Stream.blind``; conversation seed 145, docs/cluster.md).

        An unconfirmed message that every known receiver has acknowledged, whose publication the
        overlay reported incomplete and that is older than ``min_retention_s`` is not on its way to
        anyone (``_settled_unconfirmed``): it does not hold ``low`` back. It did: under churn (a
        broker killed every 5 s) one such message stayed unconfirmed for minutes - its
        republications, backed off to 30 s apart, met a broker down each time - and every broker
        that started receiving the stream for a new subscription (a client that moved there)
        started at it and delivered the whole log from there again: the chaos soak's bursts of
        200-500 duplicates (docs/notes/recovery.md). A broker cut off meanwhile gets the log when
        it talks again (``logged_for``)."""
        low = self._first_unsettled(stream, now)
        blind = stream.blind
        if blind and (not stream.receivers or self._absent_since() is not None):
            first = int(blind[0])
            if not low or first < low:
                low = first
        for peer in stream.assumed:
            start = stream.receivers.get(peer)
            if start is not None and (not low or start < low):
                low = start
        return low

    def _first_unsettled(self, stream: _Stream, now: float) -> int:
        """The first unconfirmed SEQ of ``stream`` that is not settled (0: none), see ``_low``. A
        message is settled when every known receiver acknowledged it, the overlay reported its
        publication incomplete and it was appended ``min_retention_s`` ago or more. At most
        ``RESEND_BATCH`` settled ones are passed over (the scan runs at every append)."""
        unconfirmed = stream.unconfirmed
        if not unconfirmed:
            return 0
        receivers = stream.receivers
        floor = min(receivers.values()) if receivers else 0
        settled_before = now - self.min_retention_s
        entries = stream.entries
        for passed, seq in enumerate(unconfirmed):
            entry = entries.get(seq)
            if (
                passed >= RESEND_BATCH
                or seq >= floor
                or entry is None
                or not entry.incomplete
                or entry.created_at > settled_before
            ):
                return int(seq)
        return 0

    def _resend(self, key: StreamKey, entries: SortedDict, from_seq: int, to_seq: int) -> StreamResend:
        first = entries.peekitem(0)[0] if entries else None
        gone_below = 0
        if first is None:
            gone_below = to_seq
        elif from_seq < first:
            gone_below = min(first, to_seq)
        messages = []
        for seq in entries.irange(minimum=from_seq, maximum=to_seq - 1):
            messages.append(entries[seq].forwarded)
            if len(messages) >= RESEND_BATCH:
                break
        return StreamResend(key[0], key[1], tuple(messages), gone_below)

    def _free(self, key: StreamKey, stream: _Stream, now: float) -> list[SenderAction]:
        """Free entries from the bottom while confirmed and acknowledged by every receiver
        (the pre-acknowledgement condition of §3.4), and (QoS >= 1) at least ``min_retention_s``
        old: a receiver the sender does not know yet - cut off before its first acknowledgement
        arrived - can still ask for them when it is back."""
        entries = stream.entries
        floor = min(stream.receivers.values()) if stream.receivers else None
        freed_durable = False
        below = 0
        kept_since = now - self.min_retention_s
        kept_for_left = stream.kept_for_left
        if kept_for_left is not None and kept_for_left[1] <= now:
            stream.kept_for_left = kept_for_left = None
        absent_since = self._absent_since()
        if absent_since is not None:
            # a broker is cut off or down: what was sent since it went (and the minimum retention
            # before) is kept until it is back - it may subscribe the class without this broker
            # having heard of it (its interest lost with the cut), and gets the log when it is
            # back (``logged_for``). Without it, such a receiver cut off longer than
            # ``min_retention_s`` missed them (docs/cluster.md, Known limits)
            kept_since = min(kept_since, absent_since - self.min_retention_s)
        while entries:
            seq, entry = entries.peekitem(0)
            if not entry.confirmed or (floor is not None and seq >= floor):
                break
            if entry.durable and entry.created_at > kept_since:
                break
            if kept_for_left is not None and seq >= kept_for_left[0]:
                break
            entries.popitem(0)
            stream.blind.discard(seq)
            below = seq + 1
            freed_durable = freed_durable or (entry.durable and entry.stored)
        if freed_durable:
            return [Forget(key, below)]
        return []
