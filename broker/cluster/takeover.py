"""Session takeover across brokers: claims, their order, and the wait for a hand-over (pure core).

MQTT allows one connection per client id (MQTT-3.1.4-3: a new CONNECT takes over the old one,
0x8E). In a cluster the two connections may be on different brokers: a CONNECT makes its broker
publish a ``SessionClaim`` on the control class; the broker holding the client disconnects it and
answers (seed 002 envelope) with a ``ClaimReply`` carrying the session unless the claim asked for a
clean start. The CONNECT waits for the replies of every connected broker, at most ``wait_s``.

Claims are ordered by ``(claim id, peer id)``, the claim id being wall-clock nanoseconds (strictly
increasing per broker): with the peer id as tie-breaker every broker orders two CONNECTs of one
client id the same way, and an older claim never takes the client from a newer connection - its
broker answers "no" and its own claim, arriving at the other broker, closes the older one. A
local CONNECT that already attached while a newer claim for its client id arrived from
elsewhere yields to it (:meth:`Takeover.yields`).

A claim a broker did not answer (cut off by a partition, or down) is repeated to it directly every
``repeat_s`` for as long as the claiming connection holds the client, at most ``repeat_for_s``
(:meth:`Takeover.repeats`): when the partition heals, the older connection is taken over and its
session - with what was queued for it meanwhile - moves to the newer one, so each client id ends
with one owner (issue #10). Once the connection is gone, a claim that may still bring a session
goes on as ``recover`` to the brokers that have not answered it; a CONNECT that attaches sends its
claim to the brokers that came back while it waited (:meth:`Takeover.unasked`).

Recovering a session lost in flight: a broker that hands a session over keeps the reply (durably)
for a repeat of the claim. The claimant keeps, durably too, each claim that may still bring a
session (``pending``) until one arrived or every broker it asked answered without one. If the
claimant restarts with such a claim - it crashed with the reply on its way, and a restarted broker
does not repeat its connections' claims - it asks every broker again with the claim marked
``recover``: whoever kept a reply for it answers with the session, the others with none, and nobody
hands anything new over. The old broker's memory that the claimant went down
(:meth:`Takeover.claimant_down`) did this before only while the old broker stayed up (seeds 27 of
``--faults crash,move`` and 392 of ``--faults crash,partition,move``: both brokers crashed).

Events in, decisions and finished claims out; the claimant's wait is identified by its claim id.
No I/O.

Size: about 620 lines - one table of claims, hand-overs and pending sessions whose rules (order,
repeats, recovery, which session is older) read each other's state; most of it is docstrings
naming the seed each rule was made for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from broker.cluster.messages import ClaimReply, SessionClaim
from broker.core.session import SessionSnapshot

ClaimOrder = tuple[int, str]  # (claim id = wall-clock ns, peer id)


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer ``claim`` with "no": our connection of the client is the newer one."""

    claim: SessionClaim


@dataclass(frozen=True, slots=True)
class HandOver:
    """Disconnect the client here and answer ``claim`` (with the session when ``transfer``)."""

    claim: SessionClaim
    transfer: bool


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer ``claim`` again with ``reply``: the session already handed over to this very claim
    (its first reply may have been lost; the session is no longer here). ``moved_from``: the
    older claim the reply was kept for, when it goes to this newer claim instead (its claimant
    went down right after the hand-over: :meth:`Takeover.claimant_down`)."""

    claim: SessionClaim
    reply: ClaimReply
    moved_from: ClaimOrder | None = None


@dataclass(frozen=True, slots=True)
class NoSession:
    """Answer the ``recover`` claim ``claim`` with "no session": nothing was kept for it."""

    claim: SessionClaim


Decision = Refuse | HandOver | Answer | NoSession


@dataclass(frozen=True, slots=True)
class ClaimFinished:
    """The CONNECT of claim ``claim_id`` may attach (with the session, if one was handed over)."""

    claim_id: int
    snapshot: SessionSnapshot | None


@dataclass(frozen=True, slots=True)
class LateSession:
    """A session handed over after its claim stopped waiting: keep its messages."""

    snapshot: SessionSnapshot


@dataclass
class _Claim:
    waiting_for: set[str]
    deadline: float


@dataclass
class _HandedOver:
    reply: ClaimReply
    until: float
    at: float = 0.0  # when it was handed over
    unconfirmed: bool = False  # its claimant went down right after: it may never have got it


@dataclass
class _Pending:
    claim: SessionClaim
    # brokers that may still answer with the session; None: not known (a claim restored after a
    # restart, asked again as ``recover``: only a session, or its age, ends it)
    waiting: set[str] | None
    until: float


@dataclass
class _Unanswered:
    claim: SessionClaim
    peers: set[str]
    next_at: float
    until: float


class Takeover:
    """This broker's claims and what it knows of other brokers' claims."""

    def __init__(
        self,
        peer_id: str,
        *,
        wait_s: float,
        repeat_s: float = 1.0,
        repeat_for_s: float = 600.0,
        unconfirmed_s: float = 2.0,
    ) -> None:
        self.peer_id = peer_id
        self.unconfirmed_s = unconfirmed_s
        self.wait_s = wait_s
        self.repeat_s = repeat_s
        self.repeat_for_s = repeat_for_s
        self._unanswered: dict[int, _Unanswered] = {}
        self._last_claim_id = 0
        self._claims: dict[int, _Claim] = {}
        # client id -> the claim its current local connection made (a newer claim wins)
        self._connection_claims: dict[str, ClaimOrder] = {}
        self._clean_starts: dict[str, bool] = {}  # client id -> its local connection's clean start
        self._usernames: dict[str, str | None] = {}  # client id -> its local connection's user name
        # our claims (claim id -> client id) still answerable: a ClaimReply to anything else is
        # not an answer to this broker and is dropped (a forged reply must not inject a session)
        self._own: dict[int, tuple[str, float]] = {}
        # client id -> the newest claim seen from another broker (a local CONNECT still waiting
        # for its own claim's answers must not win against it)
        self._newest_remote: dict[str, ClaimOrder] = {}
        # (claim id, claimant) -> the reply that carried a session away: a claim repeated because
        # that reply was lost gets it again (the session is no longer here to be handed over)
        self._handed_over: dict[ClaimOrder, _HandedOver] = {}
        # our claims that may still bring a session (the engine keeps them in the store too)
        self._pending: dict[int, _Pending] = {}
        # client id -> the brokers its current local connection's claim went to
        self._asked: dict[str, frozenset[str]] = {}
        # (claim id, replier) of our claims whose session arrived from that broker: another answer
        # from it with the session - to a repeat of the claim sent before its first answer came -
        # is the same session again (another broker's is another session: both are merged)
        self._arrived: set[tuple[int, str]] = set()
        # clients whose session here was made empty by their current local connection's CONNECT
        # (no session came in time, none was stored here): any session a pending claim of theirs
        # brings later is the older one (:meth:`attached`, :meth:`awaits_session_from`)
        self._fresh: set[str] = set()
        # our claims whose session a broker brought for the waiting CONNECT: claim id -> that broker
        # (``_arrived`` once the client attached with it, :meth:`attached`)
        self._brought_by: dict[int, str] = {}

    def claim(
        self,
        client_id: str,
        clean_start: bool,
        peers: Iterable[str],
        now: float,
        wall_ns: int,
        unreachable: Iterable[str] = (),
        username: str | None = None,
    ) -> tuple[SessionClaim, bool]:
        """A local CONNECT for ``client_id``: the claim to publish, and whether the CONNECT waits
        for the replies of ``peers`` (not for a clean start: there is nothing to hand over). The
        claim is repeated to whichever of ``peers`` and ``unreachable`` does not answer."""
        self._last_claim_id = claim_id = max(self._last_claim_id + 1, wall_ns)
        self._connection_claims[client_id] = (claim_id, self.peer_id)
        self._fresh.discard(client_id)  # (until this CONNECT attaches: :meth:`attached`)
        self._clean_starts[client_id] = clean_start
        self._usernames[client_id] = username
        self._own[claim_id] = (client_id, now + self.repeat_for_s + self.wait_s)
        peers = set(peers)
        waits = bool(peers) and not clean_start and self.wait_s > 0
        if waits:
            self._claims[claim_id] = _Claim(peers, now + self.wait_s)
        claim = SessionClaim(self.peer_id, client_id, claim_id, clean_start, username)
        everyone = peers | set(unreachable)
        everyone.discard(self.peer_id)
        self._asked[client_id] = frozenset(everyone)
        if everyone and not clean_start:
            self._pending[claim_id] = _Pending(claim, set(everyone), now + self.repeat_for_s)
        if everyone and self.repeat_s > 0:
            self._unanswered[claim_id] = _Unanswered(
                claim, everyone, now + max(self.repeat_s, self.wait_s), now + self.repeat_for_s
            )
        return claim, waits

    def on_claim(self, claim: SessionClaim, *, connected_here: bool) -> Decision | None:
        """Another broker's claim arrived (``connected_here``: the client has a live connection here)."""
        if claim.origin == self.peer_id:
            return None
        incoming = (claim.claim_id, claim.origin)
        handed = self._handed_over.get(incoming)
        if claim.recover:  # its claimant restarted without the session: only what we kept for it
            return Answer(claim, handed.reply) if handed is not None else NoSession(claim)
        if handed is not None:
            mine = self._connection_claims.get(claim.client_id)
            if mine is None or mine < incoming:
                return Answer(claim, handed.reply)  # repeated: our reply with the session was lost
            del self._handed_over[incoming]  # the client connected here again since: newer
        if incoming > self._newest_remote.get(claim.client_id, (0, "")):
            self._newest_remote[claim.client_id] = incoming
        mine = self._connection_claims.get(claim.client_id)
        if mine is not None and mine > incoming and (connected_here or mine[0] in self._claims):
            # our connection is the newer one (attached, or its CONNECT still waiting for its own
            # claim's answers): it keeps the client; the claimant's connection is closed when our
            # own claim reaches it
            return Refuse(claim)
        if not claim.clean_start and (moved := self._unconfirmed_for(claim, mine)) is not None:
            return moved
        return HandOver(claim, transfer=not claim.clean_start)

    def _unconfirmed_for(self, claim: SessionClaim, mine: ClaimOrder | None) -> Answer | None:
        """A session of ``claim``'s client handed over to an older claim whose broker went down
        right after (it may have crashed before importing it, and a restarted broker does not
        repeat its claims): it goes to this newer claim of the client instead of being lost."""
        incoming = (claim.claim_id, claim.origin)
        for key, handed in sorted(self._handed_over.items()):
            if (
                not handed.unconfirmed
                or handed.reply.client_id != claim.client_id
                or key >= incoming
                or (mine is not None and mine > key)  # the client connected here again since
            ):
                continue
            del self._handed_over[key]
            reply = replace(handed.reply, claim_id=claim.claim_id)
            self._handed_over[incoming] = _HandedOver(reply, handed.until, handed.at)
            return Answer(claim, reply, moved_from=key)
        return None

    def handed_over(
        self, claim_id: int, claimant: str, reply: ClaimReply, now: float, *, claimant_down: bool = False
    ) -> None:
        """``reply`` carried the client's session to broker ``claimant`` for claim ``claim_id``: a
        repeat of that claim (the reply was lost; the claimant repeats a claim until it is
        answered) gets the same reply, for ``repeat_for_s``. Without it the session would be lost
        with the reply: the next answer would say there is none. ``claimant_down``: the claimant
        is reported down already (a late session passed on to the client's newer broker, which
        crashed since: seed 263 of ``--faults crash,move,partition``) - as with
        :meth:`claimant_down`, the client's next newer claim gets the session."""
        if reply.snapshot is not None:
            handed = _HandedOver(reply, now + self.repeat_for_s, now, unconfirmed=claimant_down)
            self._handed_over[(claim_id, claimant)] = handed

    def claimant_down(self, peer: str, now: float) -> None:
        """Broker ``peer`` was reported down: the sessions handed over to it in the last
        ``unconfirmed_s`` may never have reached it (it crashed with the reply on its way, or before
        importing it). The next newer claim of such a client, from any broker, gets the session
        (at least once: if ``peer`` did import it, its messages come twice)."""
        for (_claim_id, claimant), handed in self._handed_over.items():
            if claimant == peer and now - handed.at <= self.unconfirmed_s:
                handed.unconfirmed = True

    def is_own_claim(self, claim_id: int, client_id: str) -> bool:
        """Whether ``claim_id`` is a claim this broker made for ``client_id`` and may still be
        answered (a reply to anything else is forged or stray: dropped)."""
        own = self._own.get(claim_id)
        return own is not None and own[0] == client_id

    def refused(self, claim_id: int, client_id: str) -> bool:
        """Our claim ``claim_id`` was refused (another broker holds the client id's session for
        another user): it stops waiting and repeating. True when the client's current local
        connection is the one that made it (to be disconnected with 0x87)."""
        self._claims.pop(claim_id, None)
        self._unanswered.pop(claim_id, None)
        return self._connection_claims.get(client_id) == (claim_id, self.peer_id)

    def on_reply(
        self, replier: str, reply: ClaimReply, *, client_here: bool = False
    ) -> ClaimFinished | LateSession | None:
        """A reply to one of our claims from broker ``replier`` (``client_here``: the client is
        connected here, so a session it brings is merged into the client's live session)."""
        unanswered = self._unanswered.get(reply.claim_id)
        if unanswered is not None:
            unanswered.peers.discard(replier)
            if not unanswered.peers:
                del self._unanswered[reply.claim_id]
        if reply.snapshot is not None and (reply.claim_id, replier) in self._arrived:
            # the answer to a repeat of a claim whose session arrived already and was merged into
            # the client's live session here (the claimant repeats a claim every ``repeat_s`` until
            # it is answered; a restarting broker answers each repeat with the reply it kept):
            # merging it again would queue every message it holds a second time - the chaos soak's
            # bursts of re-deliveries (issue #30). Only then: a session that arrived while the
            # client was elsewhere went to the store or on to the client's newer broker, and a
            # later answer may be what brings it to the client (seed 939 of --faults
            # crash,partition,move --loss 0.05 --finite-clients lost 119 messages otherwise)
            return None
        if reply.snapshot is not None and client_here:
            self._arrived.add((reply.claim_id, replier))
        claim = self._claims.get(reply.claim_id)
        if claim is None:
            return LateSession(reply.snapshot) if reply.snapshot is not None else None
        claim.waiting_for.discard(replier)
        if reply.snapshot is not None:
            del self._claims[reply.claim_id]
            self._brought_by[reply.claim_id] = replier  # (arrived once the client attaches with it)
            return ClaimFinished(reply.claim_id, reply.snapshot)
        if not claim.waiting_for:
            del self._claims[reply.claim_id]
            return ClaimFinished(reply.claim_id, None)
        return None

    def peer_down(self, peer: str) -> list[ClaimFinished]:
        """A broker went away: claims waiting only for it finish without a session."""
        finished = []
        for claim_id, claim in list(self._claims.items()):
            claim.waiting_for.discard(peer)
            if not claim.waiting_for:
                del self._claims[claim_id]
                finished.append(ClaimFinished(claim_id, None))
        return finished

    def newest_remote_claim(self, client_id: str) -> ClaimOrder | None:
        """The newest claim for ``client_id`` from another broker, when it is newer than this
        broker's own connection's claim (or there is none)."""
        newer = self._newest_remote.get(client_id)
        mine = self._connection_claims.get(client_id)
        if newer is None or (mine is not None and mine > newer):
            return None
        return newer

    def yields(self, client_id: str) -> bool:
        """A local CONNECT of ``client_id`` attached: True if a newer claim for it came from another
        broker meanwhile (the newer connection wins: disconnect ours with 0x8E)."""
        mine = self._connection_claims.get(client_id)
        newer = self._newest_remote.get(client_id)
        return mine is not None and newer is not None and newer > mine

    def repeats(self, now: float) -> list[tuple[str, SessionClaim]]:
        """(peer, claim) to send again directly: claims some broker has not answered yet, while
        their connection still holds the client; after that, as ``recover``, while the broker
        may still have the session in flight to us."""
        out: list[tuple[str, SessionClaim]] = []
        for claim_id, unanswered in list(self._unanswered.items()):
            if unanswered.next_at > now:
                continue
            claim = unanswered.claim
            holder = self._connection_claims.get(claim.client_id)
            newer = self._newest_remote.get(claim.client_id)
            if now > unanswered.until:
                del self._unanswered[claim_id]  # given up
                continue
            if not claim.recover and (  # (a recover claim needs no connection)
                holder != (claim_id, self.peer_id) or (newer is not None and newer > (claim_id, self.peer_id))
            ):
                # the connection is gone or replaced - also by a newer connection on another
                # broker, which our session moved to: repeated as it was, our claim would take the
                # client's older session from a broker that has not answered yet, and this broker
                # no longer holds the client. But a broker that has not answered may have handed
                # the session over already, its reply lost (seeds 229 and 263 of
                # ``--faults crash,move,partition``: the client gave up on this CONNECT before its
                # CONNACK): the claim goes on as ``recover``, which only asks for a session kept
                # for it; one that comes goes on to the client's newer broker (or stays here)
                pending = self._pending.get(claim_id)
                still = unanswered.peers & pending.waiting if pending and pending.waiting else set()
                if not still:
                    del self._unanswered[claim_id]
                    continue
                unanswered.claim = claim = replace(claim, recover=True)
                unanswered.peers = still
            unanswered.next_at = now + self.repeat_s
            out += [(peer, claim) for peer in sorted(unanswered.peers)]
        return out

    def unasked(self, client_id: str, peers: Iterable[str]) -> tuple[SessionClaim, list[str]] | None:
        """A local CONNECT of ``client_id`` attached: its claim and those of ``peers`` (the brokers
        connected now) it was not sent to - they came back while the CONNECT waited (its replies, or
        its moved session's classes before the CONNACK) - to send to them and repeat until they
        answer (:meth:`repeat_to`). Seed 147 of ``--faults crash,move``: the client's old broker
        came back in that window with the client's stored session - and the positions of what was
        published while it was down - and kept it."""
        mine = self._connection_claims.get(client_id)
        asked = self._asked.get(client_id)
        if mine is None or mine[1] != self.peer_id or asked is None:
            return None
        newcomers = set(peers) - asked - {self.peer_id}
        if not newcomers:
            return None
        self._asked[client_id] = asked | newcomers
        clean_start, username = self._clean_starts.get(client_id, False), self._usernames.get(client_id)
        claim = SessionClaim(self.peer_id, client_id, mine[0], clean_start, username)
        return claim, sorted(newcomers)

    def claims_to_repeat(self, connected: Callable[[str], bool]) -> list[SessionClaim]:
        """The claims of the clients connected here, or whose CONNECT still waits for its replies,
        to repeat to a broker that was unreachable (a partition healed, or it or this broker
        restarted): one client id ends with one owner, the newest connection (issue #10)."""
        return [
            SessionClaim(
                self.peer_id,
                client_id,
                order[0],
                self._clean_starts.get(client_id, False),
                self._usernames.get(client_id),
            )
            for client_id, order in sorted(self._connection_claims.items())
            if order[1] == self.peer_id and (connected(client_id) or order[0] in self._claims)
        ]

    def repeat_to(self, peer: str, claims: Iterable[SessionClaim], now: float) -> None:
        """``claims`` (of :meth:`claims_to_repeat`) were sent again to broker ``peer``, back after
        a restart or a heal: each is repeated to it until it answers, like a claim it did not answer
        when made (a lost repeat would leave the client's older session there for good)."""
        if self.repeat_s <= 0 or peer == self.peer_id:
            return
        for claim in claims:
            self._own[claim.claim_id] = (claim.client_id, now + self.repeat_for_s + self.wait_s)
            asked = self._asked.get(claim.client_id)
            current = self._connection_claims.get(claim.client_id) == (claim.claim_id, claim.origin)
            if asked is not None and current:
                self._asked[claim.client_id] = asked | {peer}
            unanswered = self._unanswered.get(claim.claim_id)
            if unanswered is None:
                self._unanswered[claim.claim_id] = _Unanswered(
                    claim, {peer}, now + self.repeat_s, now + self.repeat_for_s
                )
            else:
                unanswered.peers.add(peer)

    def tick(self, now: float) -> list[ClaimFinished]:
        due = [claim_id for claim_id, claim in self._claims.items() if claim.deadline <= now]
        for claim_id in due:
            del self._claims[claim_id]
        return [ClaimFinished(claim_id, None) for claim_id in due]

    def next_deadline(self) -> float | None:
        if not self._claims and not self._unanswered:  # the common case, asked after every event
            return None
        deadlines = [claim.deadline for claim in self._claims.values()]
        deadlines += [unanswered.next_at for unanswered in self._unanswered.values()]
        return min(deadlines)

    def forget(self, has_session: Callable[[str], bool]) -> None:
        """Periodic clean-up: claim records of clients with no session here any more, and remote
        claims (only races within a clean-up period matter, or a session still on its way to us)."""
        for client_id in [c for c in self._connection_claims if not has_session(c)]:
            del self._connection_claims[client_id]
            self._clean_starts.pop(client_id, None)
            self._usernames.pop(client_id, None)
            self._asked.pop(client_id, None)
            self._fresh.discard(client_id)
        # kept for a claim of ours that may still bring a session: it goes on to that claim's broker
        awaited = {pending.claim.client_id for pending in self._pending.values()}
        self._newest_remote = {c: order for c, order in self._newest_remote.items() if c in awaited}

    def forget_handed_over(self, now: float) -> list[ClaimOrder]:
        """Drop the replies kept for repeated claims once ``repeat_for_s`` passed (the claimant
        repeats its claim no longer than that); the (claim id, claimant) pairs dropped."""
        for claim_id in [c for c, (_client, until) in self._own.items() if until < now]:
            del self._own[claim_id]
        self._arrived = {key for key in self._arrived if key[0] in self._own}
        self._brought_by = {claim_id: b for claim_id, b in self._brought_by.items() if claim_id in self._own}
        dropped = [key for key, handed in self._handed_over.items() if handed.until < now]
        for key in dropped:
            del self._handed_over[key]
        return dropped

    # ------------------------------------------------------------------ claims whose session may be in flight
    def pending_claim(self, claim_id: int) -> SessionClaim | None:
        """Our claim ``claim_id`` if it may still bring a session (to keep in the store)."""
        pending = self._pending.get(claim_id)
        return pending.claim if pending is not None else None

    def may_bring_session(self, client_id: str) -> bool:
        """Whether a claim of ours for ``client_id`` may still bring an older session (a broker it
        asked has not answered: down, cut off): the session attached here meanwhile may have that
        one merged into it later (a late session, :class:`LateSession`)."""
        return any(pending.claim.client_id == client_id for pending in self._pending.values())

    def attached(self, client_id: str, session_present: bool) -> None:
        """The local CONNECT of ``client_id`` attached, with a session (stored here, or brought by
        its claim) or with an empty one (``session_present`` False)."""
        if not session_present:
            self._fresh.add(client_id)
            return
        self._fresh.discard(client_id)
        mine = self._connection_claims.get(client_id)
        replier = self._brought_by.pop(mine[0], None) if mine is not None else None
        if mine is not None and replier is not None and mine[1] == self.peer_id:
            # the session the CONNECT waited for is the client's live session here: an answer to a
            # repeat of that claim from the same broker is that session again (``on_reply``). A
            # broker that restarts is sent its peers' claims again and answers each with the reply
            # it kept: merged as a late session, the copy's old positions fetched again what the
            # client had had since (the chaos soak's duplicates, docs/notes/recovery.md)
            self._arrived.add((mine[0], replier))

    def awaits_older_session(self, client_id: str) -> bool:
        """Whether the session of ``client_id`` here was made empty by its current connection's
        CONNECT (:meth:`attached`) while that connection's claim may still bring the client's
        older session from a broker that has not answered it (down, cut off). That session, merged
        later (:class:`LateSession`), brings the positions it stood at: below them the client had
        every message (delivered there, or in the queue that comes with it). A stream new here that
        starts below its first message meanwhile is held for the client until then
        (``StreamsMixin._hold_for_older_sessions``)."""
        if client_id not in self._fresh:
            return False
        mine = self._connection_claims.get(client_id)
        if mine is None or mine[1] != self.peer_id:
            return False
        pending = self._pending.get(mine[0])
        return pending is not None and not pending.claim.recover and bool(pending.waiting)

    def awaits_session_from(self, peer: str) -> bool:
        """Whether broker ``peer`` has not yet answered a claim of ours that may still bring a
        session (sent or repeated to ``peer`` - also after it came back - and unanswered by it),
        and every such claim is one whose answer may only bring the client's *older* session: its
        connection's CONNECT still waits for the answers, or attached with an empty session made
        here (:meth:`attached`). That answer carries the positions the older session stood at on
        ``peer``: below them it had every message of ``peer``'s streams it needed (delivered, or
        in the queue that comes with it), and the session here, made later, needs nothing from
        before it. A stream of ``peer``'s that is new here and arrives before the answer (a
        restarted broker's earlier incarnation's log, sent at first contact) waits for it
        (``StreamsMixin._hold_resend``) instead of being delivered whole to the client's session
        here, which had all of it on ``peer``.

        False as soon as one such claim is of a client whose session here was resumed (stored here
        or brought by another broker's answer): the session ``peer`` may still hand over is then
        perhaps the *newer* one - made on ``peer`` while its claim could not reach us - whose
        positions say nothing of what the session here still needs from ``peer``'s streams.
        Started at them, the stream dropped what only the session here had not had (seed 842 of
        ``--faults crash,move,partition --loss 0.05 --finite-clients`` lost acknowledged messages
        that way, docs/notes/recovery.md)."""
        awaited = False
        for claim_id, unanswered in self._unanswered.items():
            if peer not in unanswered.peers or claim_id not in self._pending:
                continue
            claim = unanswered.claim
            client_id = claim.client_id
            current = self._connection_claims.get(client_id) == (claim_id, self.peer_id)
            waiting = claim_id in self._claims  # (its CONNECT has not attached yet)
            if claim.recover or not current or not (waiting or client_id in self._fresh):
                return False
            awaited = True
        return awaited

    def answered_without_session(self, claim_id: int, replier: str) -> bool:
        """Broker ``replier`` answered our claim without a session; True when that settles it:
        every broker it asked has answered so (the engine forgets the stored claim)."""
        pending = self._pending.get(claim_id)
        if pending is None or pending.waiting is None:
            return False
        pending.waiting.discard(replier)
        if pending.waiting:
            return False
        del self._pending[claim_id]
        return True

    def settled(self, claim_id: int) -> bool:
        """The session of our claim ``claim_id`` arrived and is stored here (or went on to the
        client's newer broker); True if it was pending."""
        return self._pending.pop(claim_id, None) is not None

    def restore_pending(self, claims: Iterable[SessionClaim], now: float) -> None:
        """Claims a previous incarnation made whose session never arrived: asked again, as
        ``recover``, of every broker that talks to us (:meth:`recovery_claims`)."""
        for claim in claims:
            until = now + self.repeat_for_s
            self._pending[claim.claim_id] = _Pending(replace(claim, recover=True), None, until)
            self._own[claim.claim_id] = (claim.client_id, until + self.wait_s)

    def recovery_claims(self) -> list[SessionClaim]:
        """The ``recover`` claims to send to a broker that talks to us (after this one restarted)."""
        return [pending.claim for _id, pending in sorted(self._pending.items()) if pending.waiting is None]

    def expire_pending(self, now: float) -> list[int]:
        """Pending claims older than ``repeat_for_s`` (no broker keeps a reply that long): forgotten;
        their ids."""
        expired = [claim_id for claim_id, pending in self._pending.items() if pending.until < now]
        for claim_id in expired:
            del self._pending[claim_id]
        return expired

    def restore_handed_over(self, replies: list[tuple[int, str, ClaimReply]], now: float) -> None:
        """The replies a previous incarnation kept (durable with the hand-overs): a claim repeated
        after this broker restarted still gets its session, and a ``recover`` claim of a claimant
        that restarted too. A restored reply's hand-over is at least one restart old, so it is
        never taken for one whose claimant went down right after (:meth:`claimant_down`): a
        claimant reported down after our restart does not pass the old session on to the client's
        next newer claim, which would deliver again what the client had since (the chaos soak's
        "restored reply handed again" duplicates)."""
        for claim_id, claimant, reply in replies:
            if reply.snapshot is not None:
                self._handed_over[(claim_id, claimant)] = _HandedOver(
                    reply, now + self.repeat_for_s, -math.inf
                )

    def abort_all(self) -> list[ClaimFinished]:
        finished = [ClaimFinished(claim_id, None) for claim_id in self._claims]
        self._claims.clear()
        self._unanswered.clear()
        return finished
