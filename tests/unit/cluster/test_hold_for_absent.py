"""A live stream held for sessions that are all away (docs/cluster.md "Flow control"): scripted
tests of the pure core ``stream_receiver`` with the engine's ``hold_live`` rule as a switch the test
sets. While every local session of the class is away and out of room, the live stream is paced as
a catch-up - nothing is accepted beyond the budget, the sender's log keeps the rest - and it becomes
live again once it has caught up. Without the rule (``hold_live`` None) the live stream is never
held (a single broker's offline session drops by its queue policy). Events with an explicit ``now``
in, exact outputs asserted."""

from __future__ import annotations

from broker.cluster.messages import ForwardedMessage
from broker.cluster.stream_receiver import HOLD_WINDOW, POLL_S, SendRet, StreamReceiver
from broker.core.session import Message

A = "a:1/inc1"
CLS = "=t"
KEY = (A, CLS)


def _fwd(seq: int) -> ForwardedMessage:
    return ForwardedMessage(A, CLS, seq, Message("t/x", str(seq).encode(), qos=1))


def _seqs(ready: list[tuple[ForwardedMessage, int]]) -> list[int]:
    return [forwarded.seq for forwarded, _hops in ready]


class Sessions:
    """What the engine would say: the room its sessions have, and whether they are all away."""

    def __init__(self, room: int, away: bool) -> None:
        self.room = room
        self.away = away
        self.hold_asked = 0

    def budget(self, _key: tuple[str, str]) -> int:
        return self.room

    def hold(self, _key: tuple[str, str]) -> bool:
        self.hold_asked += 1
        return self.away and self.room <= 0


def _receiver(sessions: Sessions, *, hold: bool = True) -> StreamReceiver:
    receiver = StreamReceiver(ret_delay_s=0.2, retransmit_s=1.0, ack_delay_s=0.02, budget=sessions.budget)
    if hold:
        receiver.hold_live = sessions.hold
    return receiver


def _stream(receiver: StreamReceiver, sessions: Sessions, first: int, last: int, now: float) -> list[int]:
    delivered = []
    for seq in range(first, last + 1):
        got = _seqs(receiver.receive(_fwd(seq), 1, now=now))
        sessions.room -= len(got)  # the engine queues them into the sessions
        delivered += got
    return delivered


def test_a_live_stream_for_sessions_all_away_and_full_is_held_and_its_sender_keeps_the_rest() -> None:
    sessions = Sessions(room=100, away=True)
    receiver = _receiver(sessions)
    assert _stream(receiver, sessions, 1, 100, now=0.0) == list(range(1, 101))  # room below half
    # no room left, everyone away: the live stream is held from here (at most every POLL_S asked)
    assert _stream(receiver, sessions, 101, 101 + HOLD_WINDOW + 50, now=0.1) == []
    assert receiver.position(KEY) == 101
    assert receiver.held_count() == HOLD_WINDOW  # REQ and what follows it; the rest: the sender's log
    assert receiver.stats.beyond_window > 0
    # nothing asked for while there is no room
    assert [a for a in receiver.tick(0.5) if isinstance(a, SendRet)] == []
    # the client is back (or the session moved and its queue drained): room again, paced
    sessions.away = False
    sessions.room = 300
    got = _seqs(receiver.poll(0.5 + POLL_S))
    assert got == list(range(101, 401))  # exactly the room, in order
    rets = [a.request for a in receiver.tick(0.6) if isinstance(a, SendRet)]
    assert rets == []  # the held window covers it: nothing to ask yet


def test_a_connected_session_of_the_class_means_nothing_is_held() -> None:
    """No head-of-line blocking: the rule holds a live stream only when no session of its class
    here is connected (the engine's ``hold_live`` says False then) - it is live as before."""
    sessions = Sessions(room=0, away=False)
    receiver = _receiver(sessions)
    assert _stream(receiver, sessions, 1, 600, now=0.0) == list(range(1, 601))


def test_without_the_rule_a_live_stream_is_never_held() -> None:
    sessions = Sessions(room=0, away=True)
    receiver = _receiver(sessions, hold=False)
    assert _stream(receiver, sessions, 1, 600, now=0.0) == list(range(1, 601))


def test_the_rule_is_asked_at_most_every_poll_period_per_stream() -> None:
    sessions = Sessions(room=10**6, away=False)
    receiver = _receiver(sessions)
    for n in range(1, 1001):
        receiver.receive(_fwd(n), 1, now=n * 0.001)  # 1 s of a 1,000 msg/s live stream
    assert 1000 * 0.001 / POLL_S - 1 <= sessions.hold_asked <= 1000 * 0.001 / POLL_S + 1
