"""Flow control of catch-up (seed 004 §3.2 flow condition; docs/cluster.md "Flow control"):
scripted tests of the pure core ``stream_receiver``. A receiver stream that is live (REQ within
``LIVE_SLACK`` of the highest SEQ seen) is never gated; one that is catching up accepts only
within the budget the engine grants, holds at most ``HOLD_WINDOW`` ahead of REQ, asks for windows
no larger than the budget (RET), the next one at once when the last is in, and goes on unpaced
after a stall. Events with an explicit ``now`` in, exact outputs asserted."""

from __future__ import annotations

from broker.cluster.interest import Interest
from broker.cluster.messages import ForwardedMessage
from broker.cluster.stream_receiver import (
    HOLD_WINDOW,
    LIVE_SLACK,
    POLL_S,
    SendRet,
    StreamReceiver,
)
from broker.core.session import Message

A = "a:1/inc1"
CLS = "=t"
KEY = (A, CLS)


def _fwd(seq: int) -> ForwardedMessage:
    return ForwardedMessage(A, CLS, seq, Message("t/x", str(seq).encode(), qos=1))


def _seqs(ready: list[tuple[ForwardedMessage, int]]) -> list[int]:
    return [forwarded.seq for forwarded, _hops in ready]


def _rets(actions: list[object]) -> list[tuple[int, int]]:
    return [(a.request.from_seq, a.request.to_seq) for a in actions if isinstance(a, SendRet)]


class Room:
    """The budget the engine would grant: a number the test sets."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.asked: list[tuple[str, str]] = []

    def __call__(self, key: tuple[str, str]) -> int:
        self.asked.append(key)
        return self.value


def _receiver(room: Room, stall_s: float = 10.0) -> StreamReceiver:
    return StreamReceiver(ret_delay_s=0.2, retransmit_s=1.0, ack_delay_s=0.02, budget=room, stall_s=stall_s)


def _behind(receiver: StreamReceiver, head: int) -> None:
    """The stream starts at 1 here and learns that the sender's log goes up to ``head``."""
    assert _seqs(receiver.receive(_fwd(1), 1, now=0.0)) == [1]
    assert receiver.receive(_fwd(head), 1, now=0.0) == []


def test_a_live_stream_is_never_gated_even_without_room() -> None:
    """A session slower than the live stream drops by its queue policy, as on one broker: the
    receiver does not hold a live stream back for it (nor ask the budget)."""
    room = Room(0)
    receiver = _receiver(room)
    delivered = [seq for n in range(1, 601) for seq in _seqs(receiver.receive(_fwd(n), 1, now=n * 0.001))]
    assert delivered == list(range(1, 601))
    assert room.asked == []


def test_a_catching_up_stream_accepts_only_within_the_budget_and_polls_for_room() -> None:
    room = Room(10)
    receiver = _receiver(room)
    _behind(receiver, 5000)  # 5000 is beyond the hold window: not kept (the sender's log has it)
    assert receiver.stats.beyond_window == 1 and receiver.held_count() == 0
    ready: list[int] = []
    for n in range(2, 51):
        got = _seqs(receiver.receive(_fwd(n), 1, now=0.5))
        room.value -= len(got)  # the engine delivers them: the sessions' room shrinks
        ready += got
    assert ready == list(range(2, 12))  # the budget: 10
    assert receiver.held_count() == 39  # the rest waits, held (within the window)
    room.value = 0
    assert receiver.poll(now=0.5 + POLL_S) == []  # still no room
    room.value = 5
    assert _seqs(receiver.poll(now=0.5 + 2 * POLL_S)) == [12, 13, 14, 15, 16]
    assert receiver.position(KEY) == 17


def test_only_the_hold_window_is_kept_ahead_of_req() -> None:
    receiver = _receiver(Room(0))
    _behind(receiver, 3)
    for seq in range(4, HOLD_WINDOW + 10):
        receiver.receive(_fwd(seq), 1, now=0.1)
    assert receiver.held_count() == HOLD_WINDOW - 1  # 3 .. HOLD_WINDOW + 1 (REQ is 2)


def test_a_catch_up_asks_for_windows_no_larger_than_the_budget_and_the_next_one_at_once() -> None:
    room = Room(100)
    receiver = _receiver(room)
    _behind(receiver, 5000)
    assert _rets(receiver.tick(now=0.3)) == [(2, 102)]  # [REQ, REQ + budget)
    assert _rets(receiver.tick(now=0.5)) == []  # answered within retransmit_s, not repeated
    for seq in range(2, 102):
        receiver.receive(_fwd(seq), 1, now=0.6)
    assert receiver.position(KEY) == 102
    assert receiver.next_deadline() == 0.6  # the window is in: the next RET at once
    room.value = 1000
    assert _rets(receiver.tick(now=0.6)) == [(102, 358)]  # at most RET_WINDOW (256) at a time
    room.value = 0
    for seq in range(102, 358):
        receiver.receive(_fwd(seq), 1, now=0.7)
    assert receiver.position(KEY) == 102  # no room: held, nothing asked
    assert _rets(receiver.tick(now=0.7)) == []
    assert receiver.stats.paced_waits > 0


def test_a_gap_in_a_live_stream_waits_the_reorder_hold_and_is_not_gated() -> None:
    receiver = _receiver(Room(0))
    assert _seqs(receiver.receive(_fwd(1), 1, now=0.0)) == [1]
    receiver.receive(_fwd(3), 1, now=0.01)
    assert _rets(receiver.tick(now=0.1)) == []
    assert _rets(receiver.tick(now=0.22)) == [(2, 3)]
    assert _seqs(receiver.receive(_fwd(2), 1, now=0.25)) == [2, 3]


def test_a_stalled_catch_up_goes_on_unpaced_until_the_stream_is_live_again() -> None:
    """A session that never makes room (slower than the live stream, or gone) does not hold the
    catch-up for ever: after ``stall_s`` without the backlog shrinking it goes on unpaced (that
    session drops by its queue policy), logged; once live, it is paced again."""
    room = Room(0)
    receiver = _receiver(room, stall_s=5.0)
    _behind(receiver, 600)
    for seq in range(2, 300):
        receiver.receive(_fwd(seq), 1, now=1.0)
    assert receiver.position(KEY) == 2
    assert receiver.poll(now=3.0) == []
    assert receiver.poll(now=5.9) == []  # the stall counts from the first look (1.0)
    ready = receiver.poll(now=6.2)
    assert _seqs(ready) == list(range(2, 300))
    # live again (REQ within LIVE_SLACK of the head): paced once more when it falls behind
    for seq in range(300, 601):
        receiver.receive(_fwd(seq), 1, now=7.1)
    assert receiver.position(KEY) == 601
    receiver.receive(_fwd(601 + LIVE_SLACK + 10), 1, now=7.2)
    assert receiver.receive(_fwd(601), 1, now=7.3) == []


def test_the_budget_reads_the_sessions_of_the_class_from_the_interest_index() -> None:
    """``Interest.clients_of``: the local clients whose subscriptions belong to a class (the
    engine's budget is the least room among them), kept per class as subscriptions come and go."""
    interest = Interest(1)
    interest.subscribe("a", "x/1", None)
    interest.subscribe("a", "x/#", None)
    interest.subscribe("b", "x/2", "g")  # a shared subscription's member paces too
    interest.subscribe("c", "y/1", None)
    assert sorted(interest.clients_of("=x")) == ["a", "b"]
    interest.unsubscribe("a", "x/1", None)
    assert sorted(interest.clients_of("=x")) == ["a", "b"]  # a still has x/#
    interest.unsubscribe("a", "x/#", None)
    interest.unsubscribe("b", "x/2", "g")
    assert interest.clients_of("=x") == []
    assert interest.clients_of("=y") == ["c"]


def test_a_restored_stream_is_paced_until_it_has_caught_up_once() -> None:
    """After a restart the receiver does not know how far behind it is (the sender's resends show
    only their own window): its restored streams are paced until REQ has passed every SEQ seen."""
    room = Room(0)
    receiver = _receiver(room)
    receiver.restore([(KEY, 100)], now=0.0)
    assert receiver.receive(_fwd(100), 1, now=0.1) == []  # no room: held
    room.value = 2
    assert _seqs(receiver.poll(now=0.2)) == [100]  # (one: the poll found 2, the engine delivers)
    room.value = 5
    for seq in range(101, 104):
        receiver.receive(_fwd(seq), 1, now=0.3)
    assert receiver.position(KEY) == 104  # caught up: nothing held, every SEQ seen taken
    room.value = 0
    assert _seqs(receiver.receive(_fwd(104), 1, now=0.4)) == [104]  # live now: not gated


def test_each_window_of_a_catch_up_says_whether_it_fell_behind_the_live_stream() -> None:
    """No head-of-line blocking: every ``window_s`` of a catch-up the engine learns whether REQ
    moved less than the head did (the sessions that gated it are slower than the live stream),
    and when the stream is live again."""
    room = Room(10)
    receiver = _receiver(room)
    closed: list[tuple[tuple[str, str], bool, int]] = []
    caught_up: list[tuple[str, str]] = []
    receiver.window_closed = lambda key, fell_behind, behind: closed.append((key, fell_behind, behind)) or 0
    receiver.caught_up = caught_up.append
    _behind(receiver, 3000)
    assert _seqs(receiver.receive(_fwd(2), 1, now=0.1)) == [2]  # opens a window: REQ 2, head 3000
    receiver.receive(_fwd(4000), 1, now=0.5)  # the live stream goes on: head 4000
    assert _seqs(receiver.receive(_fwd(3), 1, now=1.2)) == [3]
    assert closed == [(KEY, True, 3998)]  # REQ moved 1, the head 1,000: fell behind
    room.value = 10**6  # a session that drains fast paces it now
    for n in range(4, 1501):
        assert _seqs(receiver.receive(_fwd(n), 1, now=1.5)) == [n]
    assert _seqs(receiver.receive(_fwd(1501), 1, now=2.3)) == [1501]
    assert closed[1:] == [(KEY, False, 2500)]  # REQ moved 1,498, the head 0
    assert caught_up == []
    for n in range(1502, 4001):
        receiver.receive(_fwd(n), 1, now=2.4)
    assert receiver.position(KEY) == 4001
    assert caught_up == [KEY]  # live again: every session paces the next catch-up


def test_a_stall_first_sets_aside_the_sessions_holding_it_and_goes_on_paced() -> None:
    """After ``stall_s`` the engine is asked to set aside the sessions that still hold the catch-up
    (``stalled``: clients away all along); when it did, the catch-up goes on paced by the others
    (the budget they grant), not unpaced for every session."""
    room = Room(0)
    receiver = _receiver(room, stall_s=5.0)
    stalls: list[tuple[tuple[str, str], int]] = []

    def stalled(key: tuple[str, str], behind: int) -> int:
        stalls.append((key, behind))
        room.value = 3  # the session away no longer counts: the others' room
        return 1

    receiver.stalled = stalled
    _behind(receiver, 600)
    for seq in range(2, 300):
        receiver.receive(_fwd(seq), 1, now=1.0)
    assert receiver.poll(now=5.9) == []
    assert _seqs(receiver.poll(now=6.2)) == [2, 3, 4]  # paced by the others' room, not unpaced
    assert stalls == [(KEY, 599)]
