"""Causally ordered group communication: the CO protocol of seed 004 (pure core).

Sakamoto, Nakamura, Tachikawa, Takizawa, "Causally Ordered Group Communication Protocol Using
Sequence Numbers of Messages". One ``CausalGroup`` is the entity E_i of one group C = <E_1..E_n>;
members are broker peer ids. Every message carries CID, SRC, SEQ, the ACK vector and BUF
(§3.1, Fig. 3); the entity keeps SEQ, REQ_j, the matrices AL_kj / PAL_kj and BUF_j (§3.1).

* §3.2 flow condition ``can_send``; send procedure ``_send_now``; acceptance condition and
  procedure ``_accept_ready`` / ``_accept``. Own messages are accepted at once (the seed's
  sender receives its own broadcast: Table 1 has ACK_i = SEQ in E_i's messages).
* §3.3 failure conditions (1) gap in SEQ and (2) ``q.ACK_j > REQ_j`` in ``_detect_losses``;
  retransmission procedure: ``Ret`` out, ``_on_ret`` resends ``r.ACK_j <= g.SEQ < r.LSEQ`` (the
  printed ``r.ACK_j < g.SEQ <= r.LSEQ`` contradicts Fig. 4, see docs/causal.md); the sender's
  own timer for messages not acknowledged by all in ``tick``.
* §3.4 pre-acknowledgement condition ``p.SEQ < minAL_src``, Theorem 1 ``precedes``, CPI
  ``_cpi_insert``, pre-ack procedure ``_pre_acknowledge`` (frees the sender's log: ``Freed``).
* §3.5 acknowledgement condition ``p.SEQ < minPAL_src`` and procedure ``_acknowledge``:
  ``Deliver`` in causal order (ARL).
* §4 "a message is sent after a time even without data": idle ACK (``data is None``) in ``tick``.

Decisions the seed leaves open (all in docs/causal.md): a message meeting the acceptance
condition but showing failure condition (2) is held until the missing messages are accepted
(Lemma 3's proof: "g_j is not accepted"), so REQ is a vector clock; messages ahead of REQ are
held, not dropped; AL/PAL entries only rise (max); idle ACKs are sent only while undelivered data
exists, are not counted by the window and skip PRL/ARL; a member stuck with undelivered data asks every member
for anything after its REQ (``Ret`` with ``lseq=None``). Membership: ``add_member`` /
``remove_member``; a removed member's column stops constraining minAL/minPAL, its held messages
and the dependencies on its messages never received are given up (counted).

Events in (``send``, ``receive``, ``tick`` with ``now``), actions out as data. No I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

FIRST_SEQ = 1  # the initial SEQ of every member (group establishment, §3.1; Example 1 uses 1)


@dataclass(frozen=True)
class CoMessage:
    """A CO message (Fig. 3). ``ack[j]`` = the SEQ the sender expects next from E_j;
    ``buf`` = the sender's free buffer (bytes); ``data is None``: an idle ACK."""

    cid: str
    src: str
    seq: int
    ack: Mapping[str, int]
    buf: int
    data: bytes | None = None


@dataclass(frozen=True)
class Ret:
    """Retransmission request (§3.3) from ``src`` to ``lsrc``: resend ``ack[lsrc] <= SEQ < lseq``
    (``lseq is None``: everything from ``ack[lsrc]`` on, the stuck member's probe)."""

    cid: str
    src: str
    ack: Mapping[str, int]
    lsrc: str
    lseq: int | None


@dataclass(frozen=True)
class Broadcast:
    message: CoMessage


@dataclass(frozen=True)
class SendTo:
    member: str
    message: CoMessage | Ret


@dataclass(frozen=True)
class Deliver:
    """The message entered ARL_i: hand it to the application, in this order."""

    message: CoMessage


@dataclass(frozen=True)
class Freed:
    """An own message was pre-acknowledged (every member accepted it): it left the send log."""

    message: CoMessage


Action = Broadcast | SendTo | Deliver | Freed


@dataclass
class CausalStats:
    sent: int = 0
    idle_acks_sent: int = 0
    accepted: int = 0
    duplicates_dropped: int = 0
    held_ahead: int = 0  # arrived before a predecessor (SEQ gap or missing dependency)
    gaps_seen: int = 0  # failure condition (1)
    dependencies_missing: int = 0  # failure condition (2): also an overtaking on another link
    rets_sent: int = 0
    probes_sent: int = 0
    retransmitted: int = 0
    delivered: int = 0
    given_up: int = 0  # held messages and dependencies of a removed member
    ignored: int = 0  # other group, unknown or removed source


@dataclass
class _Sent:
    message: CoMessage
    last_sent_at: float


class _Matrix:
    """AL or PAL: ``rows[k][j]`` = the SEQ E_j expects next from E_k, as E_i knows (§3.1).
    The row minima (minAL_k / minPAL_k) are kept incrementally: a raise costs O(1) unless it
    lifts the last column at the minimum (then O(n) for that row)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, int]] = {}
        self._min: dict[str, int] = {}
        self._at_min: dict[str, int] = {}

    def add_row(self, k: str, values: dict[str, int]) -> None:
        self.rows[k] = values
        self._recompute(k)

    def add_column(self, j: str, values: Mapping[str, int]) -> None:
        for k, row in self.rows.items():
            row[j] = values.get(k, FIRST_SEQ)
            self._recompute(k)

    def remove_column(self, j: str) -> None:
        for k, row in self.rows.items():
            row.pop(j, None)
            self._recompute(k)

    def row_min(self, k: str) -> int:
        return self._min[k]

    def raise_to(self, k: str, j: str, value: int) -> bool:
        """``rows[k][j] := max(rows[k][j], value)``; True when minimum of row k rose."""
        row = self.rows.get(k)
        if row is None:
            return False
        old = row.get(j)
        if old is None or value <= old:
            return False
        row[j] = value
        if old == self._min[k]:
            self._at_min[k] -= 1
            if self._at_min[k] == 0:
                self._recompute(k)
                return True
        return False

    def _recompute(self, k: str) -> None:
        values = self.rows[k].values()
        lowest = min(values) if values else FIRST_SEQ
        self._min[k] = lowest
        self._at_min[k] = sum(1 for value in values if value == lowest)


def precedes(p: CoMessage, q: CoMessage) -> bool:
    """Theorem 1: p causally precedes q (same source: p.SEQ < q.SEQ; else p.SEQ < q.ACK_src(p))."""
    if p.src == q.src:
        return p.seq < q.seq
    return p.seq < q.ack.get(p.src, FIRST_SEQ)


class CausalGroup:
    """The CO entity E_``member_id`` of group ``cid`` (one per member, per group)."""

    def __init__(
        self,
        member_id: str,
        members: Iterable[str],
        *,
        cid: str = "C",
        window: int = 8,
        max_message_bytes: int = 1024,
        buffer_bytes: int = 1 << 30,
        retransmit_timeout_s: float = 1.0,
        ack_delay_s: float = 0.05,
        start_seqs: Mapping[str, int] | None = None,
    ) -> None:
        self.member_id = member_id
        self.cid = cid
        self.window = window  # W (§3.2)
        self.max_message_bytes = max_message_bytes  # H (§3.2)
        self.buffer_bytes = buffer_bytes
        self.retransmit_timeout_s = retransmit_timeout_s
        self.ack_delay_s = ack_delay_s
        self.stats = CausalStats()
        starts = dict(start_seqs or {})
        self._members: list[str] = []  # active members, in group order (the seed's j = 1..n)
        self._removed: set[str] = set()
        self._seq = starts.get(member_id, FIRST_SEQ)  # SEQ: next to send
        self._req: dict[str, int] = {}  # REQ_j
        self._al = _Matrix()  # AL_kj
        self._pal = _Matrix()  # PAL_kj
        self._buf: dict[str, int] = {}  # BUF_j
        self._rrl: dict[str, deque[CoMessage]] = {}  # RRL_ij, accepted, not pre-acknowledged
        self._held: dict[str, dict[int, CoMessage]] = {}  # received ahead of REQ or a dependency
        self._prl: deque[CoMessage] = deque()  # PRL_i, pre-acknowledged, causally ordered
        self._send_log: dict[int, _Sent] = {}  # SL_i until pre-acknowledged
        self._queue: deque[bytes] = deque()  # data refused by the flow condition, in order
        self._stored = 0  # messages in held + RRL + PRL (the BUF we report)
        self._undelivered_data = 0  # data messages in held + RRL + PRL
        self._outstanding_data = 0  # own data messages in the send log
        self._unacked_since: float | None = None  # accepted from others since our last message
        self._last_reported_buf = buffer_bytes
        self._last_progress_at = 0.0
        self._ret_asked: dict[str, tuple[int | None, float]] = {}  # lsrc -> (lseq, when)
        for member in dict.fromkeys(members):
            self._join(member, starts)
        if member_id not in self._req:
            raise ValueError(f"{member_id!r} is not a member of its group")

    # ------------------------------------------------------------------ membership
    def _join(self, member: str, starts: Mapping[str, int]) -> None:
        existing = list(self._members)
        self._members.append(member)
        self._removed.discard(member)
        start = starts.get(member, FIRST_SEQ)
        self._req[member] = start
        self._buf[member] = self.buffer_bytes
        self._rrl[member] = deque()
        self._held[member] = {}
        for matrix in (self._al, self._pal):
            # what the newcomer expects from each member: its start there (or where we are)
            matrix.add_column(member, {k: starts.get(k, self._req[k]) for k in existing})
            # what every member expects from the newcomer: its stream's start
            matrix.add_row(member, dict.fromkeys([*existing, member], start))

    def members(self) -> list[str]:
        return list(self._members)

    def add_member(self, member: str, joined_at: Mapping[str, int] | None = None) -> None:
        """A member joins. ``joined_at[k]``: the first SEQ of E_k it will accept (default: our
        REQ_k, i.e. it is owed nothing we already accepted); its own stream starts at
        ``joined_at[member]`` (default FIRST_SEQ). The group-establishment step that agrees on
        these numbers is out of scope (§3.1)."""
        if member in self._req:
            if member in self._removed:
                raise ValueError(f"{member!r} was removed: it rejoins under a new id (incarnation)")
            return
        starts = dict(joined_at or {})
        starts.setdefault(member, FIRST_SEQ)
        for other in self._members:
            starts.setdefault(other, self._req[other])
        self._join(member, starts)

    def remove_member(self, member: str, now: float) -> list[Action]:
        """A member leaves (it left the subscriber set or failed). Its column stops constraining
        minAL/minPAL, its held messages and the dependencies of others on its messages not
        received here are given up; its accepted messages still go through pre-ack and ack."""
        if member == self.member_id:
            raise ValueError("an entity does not remove itself")
        if member not in self._members:
            return []
        self._members.remove(member)
        self._removed.add(member)
        self._buf.pop(member, None)
        self._ret_asked.pop(member, None)
        for message in self._held.pop(member, {}).values():
            self._forget_held(message)
            self.stats.given_up += 1
        self._al.remove_column(member)
        self._pal.remove_column(member)
        actions: list[Action] = []
        self._accept_ready(None, now, actions)
        self._progress(set(self._rrl), now, actions)
        self._acknowledge(actions)  # minPAL may have risen without a pre-acknowledgement
        return actions

    # ------------------------------------------------------------------ sending (§3.2)
    def flow_window(self) -> int:
        """min(W, minBUF / (H * n)) of the flow condition (§3.2)."""
        min_buf = min(self._buf[member] for member in self._members)
        return min(self.window, min_buf // (self.max_message_bytes * len(self._members)))

    def can_send(self) -> bool:
        """The flow condition minAL_i <= SEQ < minAL_i + min(W, minBUF/(H n)), counting own data
        messages not yet pre-acknowledged (idle ACKs are not counted, docs/causal.md)."""
        return self._outstanding_data < self.flow_window()

    def send(self, data: bytes, now: float) -> list[Action]:
        """A data request of A_i: sent now if the flow condition holds, else queued in order."""
        self._queue.append(data)
        actions: list[Action] = []
        self._flush_queue(now, actions)
        return actions

    def queued(self) -> int:
        return len(self._queue)

    def _flush_queue(self, now: float, actions: list[Action]) -> None:
        while self._queue and self.can_send():
            self._send_now(self._queue.popleft(), now, actions)

    def _send_now(self, data: bytes | None, now: float, actions: list[Action]) -> None:
        """The send procedure (§3.2), then the own message is accepted here like any other."""
        message = CoMessage(
            self.cid,
            self.member_id,
            self._seq,
            {m: self._req[m] for m in self._members},
            self._free_buf(),
            data,
        )
        self._seq += 1
        self._send_log[message.seq] = _Sent(message, now)
        self._last_reported_buf = message.buf
        self._unacked_since = None
        if data is None:
            self.stats.idle_acks_sent += 1
        else:
            self.stats.sent += 1
            self._outstanding_data += 1
            self._undelivered_data += 1
        self._stored += 1
        actions.append(Broadcast(message))
        rows = self._accept(message, now)
        self._progress(rows, now, actions, flush=False)

    def _free_buf(self) -> int:
        return max(0, self.buffer_bytes - self.max_message_bytes * self._stored)

    # ------------------------------------------------------------------ receiving (§3.2, §3.3)
    def receive(self, message: CoMessage | Ret, now: float) -> list[Action]:
        actions: list[Action] = []
        if isinstance(message, Ret):
            self._on_ret(message, now, actions)
            return actions
        src = message.src
        if message.cid != self.cid or src not in self._req or src in self._removed:
            self.stats.ignored += 1
            return actions
        if src == self.member_id or message.seq < self._req[src] or message.seq in self._held[src]:
            self.stats.duplicates_dropped += 1
            return actions
        self._detect_losses(message, now, actions)
        self._held[src][message.seq] = message
        self._stored += 1
        if message.data is not None:
            self._undelivered_data += 1
        self._last_progress_at = now
        rows = self._accept_ready(src, now, actions)
        if rows:
            self._progress(rows, now, actions)
        else:
            self.stats.held_ahead += 1
        return actions

    def _detect_losses(self, message: CoMessage, now: float, actions: list[Action]) -> None:
        """Failure conditions (1) and (2) of §3.3 -> retransmission procedure (1)."""
        src = message.src
        if self._lacks(src, message.seq):  # (1): REQ_j <= g.SEQ < p.SEQ lost
            self.stats.gaps_seen += 1
            self._ask(src, message.seq, now, actions)
        for j, ack_j in message.ack.items():  # (2): REQ_j <= g.SEQ < q.ACK_j lost, j != k
            if j != src and j != self.member_id and j in self._buf and self._lacks(j, ack_j):
                self.stats.dependencies_missing += 1
                self._ask(j, ack_j, now, actions)

    def _lacks(self, member: str, end: int) -> bool:
        """Some message of ``member`` with REQ <= SEQ < ``end`` is neither accepted nor held."""
        first = self._req[member]
        if first >= end:
            return False
        held = self._held[member]
        return sum(1 for seq in held if seq < end) < end - first

    def _ask(self, lsrc: str, lseq: int | None, now: float, actions: list[Action]) -> None:
        asked = self._ret_asked.get(lsrc)
        if asked is not None:
            asked_lseq, asked_at = asked
            covered = asked_lseq is None or (lseq is not None and lseq <= asked_lseq)
            if covered and now < asked_at + self.retransmit_timeout_s:
                return
        self._ret_asked[lsrc] = (lseq, now)
        ack = {m: self._req[m] for m in self._members}
        actions.append(SendTo(lsrc, Ret(self.cid, self.member_id, ack, lsrc, lseq)))
        if lseq is None:
            self.stats.probes_sent += 1
        else:
            self.stats.rets_sent += 1

    def _on_ret(self, ret: Ret, now: float, actions: list[Action]) -> None:
        """Retransmission procedure (2): resend g with r.ACK_j <= g.SEQ < r.LSEQ."""
        if ret.cid != self.cid or ret.lsrc != self.member_id or ret.src not in self._buf:
            self.stats.ignored += 1
            return
        first = ret.ack.get(self.member_id, FIRST_SEQ)
        end = self._seq if ret.lseq is None else min(ret.lseq, self._seq)
        for seq in range(first, end):
            sent = self._send_log.get(seq)
            if sent is not None:
                sent.last_sent_at = now
                actions.append(SendTo(ret.src, sent.message))
                self.stats.retransmitted += 1
        if ret.lseq is None and (
            self._unacked_since is not None or self._free_buf() > self._last_reported_buf
        ):
            self._send_now(None, now, actions)  # the prober learns our ACK vector and BUF

    def _dependencies_met(self, message: CoMessage) -> bool:
        req = self._req
        src = message.src
        for j, ack_j in message.ack.items():
            if j != src and req.get(j, ack_j) < ack_j and j not in self._removed:
                return False
        return True

    def _accept_ready(self, first: str | None, now: float, actions: list[Action]) -> set[str]:
        """Accept every held message meeting the acceptance condition p.SEQ = REQ_j (§3.2) whose
        dependencies (failure condition (2)) are accepted; the rows of AL that may have moved."""
        moved: set[str] = set()
        candidates = [first] if first is not None else list(self._members)
        while candidates:
            progressed: set[str] = set()
            for src in candidates:
                held = self._held.get(src)
                while held:
                    message = held.get(self._req[src])
                    if message is None or not self._dependencies_met(message):
                        break
                    del held[message.seq]
                    moved.update(self._accept(message, now))
                    progressed.add(src)
            # an accepted message may unblock a held message of any source
            candidates = [m for m in self._members if self._held[m]] if progressed else []
        return moved

    def _accept(self, message: CoMessage, now: float) -> set[str]:
        """The acceptance procedure (§3.2)."""
        src = message.src
        self._req[src] = message.seq + 1
        moved = {src}
        for k, ack_k in message.ack.items():  # AL_kj := p.ACK_k (only rises, see module doc)
            if self._al.raise_to(k, src, ack_k):
                moved.add(k)
        if src in self._buf:
            self._buf[src] = message.buf
        self._rrl[src].append(message)
        self.stats.accepted += 1
        self._last_progress_at = now
        if src != self.member_id and self._unacked_since is None:
            self._unacked_since = now
        return moved

    # ------------------------------------------------------------------ pre-ack and ack (§3.4, §3.5)
    def _progress(self, rows: set[str], now: float, actions: list[Action], *, flush: bool = True) -> None:
        if self._pre_acknowledge(rows, actions):
            self._acknowledge(actions)
        if flush:
            self._flush_queue(now, actions)

    def _pre_acknowledge(self, rows: set[str], actions: list[Action]) -> bool:
        """Pre-ack procedure: for j = 1..n, while top(RRL_ij).SEQ < minAL_j, move it to PRL_i by
        CPI and set PAL_kj := p.ACK_k."""
        moved = False
        for j in self._rrl:  # group order; rows of removed members drain too
            if j not in rows:
                continue
            rrl = self._rrl[j]
            min_al = self._al.row_min(j)
            while rrl and rrl[0].seq < min_al:
                message = rrl.popleft()
                for k, ack_k in message.ack.items():
                    self._pal.raise_to(k, j, ack_k)
                moved = True
                if message.data is None:
                    self._stored -= 1  # an idle ACK has nothing to deliver: it skips PRL/ARL
                else:
                    self._cpi_insert(message)
                if j == self.member_id:
                    del self._send_log[message.seq]
                    if message.data is not None:
                        self._outstanding_data -= 1
                    actions.append(Freed(message))
        return moved

    def _cpi_insert(self, message: CoMessage) -> None:
        """CPI operation PRL_i <| p: p goes right before the first message it causally precedes,
        else at the end. Scanning from the end stops at the first predecessor of p: in a
        causally ordered PRL no successor of p lies before a predecessor of p."""
        prl = self._prl
        position = len(prl)
        for index in range(len(prl) - 1, -1, -1):
            other = prl[index]
            if precedes(other, message):
                break
            if precedes(message, other):
                position = index
        prl.insert(position, message)

    def _acknowledge(self, actions: list[Action]) -> None:
        """Ack procedure: while top(PRL_i).SEQ < minPAL_src, move it to ARL_i (deliver)."""
        prl = self._prl
        while prl and prl[0].seq < self._pal.row_min(prl[0].src):
            message = prl.popleft()
            self._stored -= 1
            if message.data is not None:
                self._undelivered_data -= 1
                self.stats.delivered += 1
                actions.append(Deliver(message))

    def _forget_held(self, message: CoMessage) -> None:
        self._stored -= 1
        if message.data is not None:
            self._undelivered_data -= 1

    # ------------------------------------------------------------------ timers
    def _pending(self) -> bool:
        return self._undelivered_data > 0 or bool(self._queue)

    def tick(self, now: float) -> list[Action]:
        """Sender retransmission (§3.3), the stuck member's probe, the idle ACK (§4)."""
        actions: list[Action] = []
        timeout_s = self.retransmit_timeout_s
        own_row = self._al.rows[self.member_id]
        for seq, sent in self._send_log.items():
            if sent.message.data is None or now < sent.last_sent_at + timeout_s:
                continue
            sent.last_sent_at = now
            for member in self._members:
                if member != self.member_id and own_row.get(member, FIRST_SEQ) <= seq:
                    actions.append(SendTo(member, sent.message))
                    self.stats.retransmitted += 1
        if self._pending() and now >= self._last_progress_at + timeout_s:
            self._last_progress_at = now
            for member in self._members:
                if member != self.member_id:
                    self._ask(member, None, now, actions)
        if self._idle_ack_due(now):
            self._send_now(None, now, actions)
        return actions

    def _idle_ack_due(self, now: float) -> bool:
        since = self._unacked_since
        return since is not None and now >= since + self.ack_delay_s and self._pending()

    def next_deadline(self) -> float | None:
        deadlines: list[float] = [
            sent.last_sent_at + self.retransmit_timeout_s
            for sent in self._send_log.values()
            if sent.message.data is not None
        ]
        if self._pending():
            deadlines.append(self._last_progress_at + self.retransmit_timeout_s)
            if self._unacked_since is not None:
                deadlines.append(self._unacked_since + self.ack_delay_s)
        return min(deadlines) if deadlines else None

    # ------------------------------------------------------------------ inspection (tests, docs)
    def req(self) -> dict[str, int]:
        return dict(self._req)

    def al(self) -> dict[str, dict[str, int]]:
        return {k: dict(row) for k, row in self._al.rows.items()}

    def pal(self) -> dict[str, dict[str, int]]:
        return {k: dict(row) for k, row in self._pal.rows.items()}

    def min_al(self, member: str) -> int:
        return self._al.row_min(member)

    def min_pal(self, member: str) -> int:
        return self._pal.row_min(member)

    def rrl(self, member: str) -> list[CoMessage]:
        return list(self._rrl[member])

    def prl(self) -> list[CoMessage]:
        return list(self._prl)

    def send_log(self) -> list[CoMessage]:
        return [sent.message for sent in self._send_log.values()]

    def held(self) -> list[CoMessage]:
        return [message for held in self._held.values() for message in held.values()]

    def next_seq(self) -> int:
        return self._seq
