"""Scripted tests of ``StreamReceiver.taken_over`` (the answer ``LOG_TAKEN_OVER``): a broker back
with its disk lost, with ``cluster.replicas`` > 1, answers a RET for its earlier incarnation's
stream saying that log is published again by its replica holders. The receiver then drops what it
holds of that incarnation - and whatever of it still arrives - instead of delivering it ahead of
the gap's messages, which come later from a holder (seeds 172, 341, 554, 649 of the replication
``--sessions`` sweep, docs/notes/replication.md). Events with an explicit ``now`` in, the exact
outputs asserted; no broker, clock or I/O."""

from __future__ import annotations

from broker.adapters.transport import wire
from broker.cluster.messages import Envelope, ForwardedMessage, StreamPosition, StreamResend
from broker.cluster.replication_messages import LOG_TAKEN_OVER
from broker.cluster.stream_receiver import SendAck, SendRet, StreamReceiver
from broker.core.session import Message

OLD = "b:1/inc1"  # the earlier incarnation of broker b (its disk went)
OTHER = "c:1/inc7"
CLS = "=plant"


def _fwd(seq: int, origin: str = OLD, deps: tuple[StreamPosition, ...] = ()) -> ForwardedMessage:
    copies = ((CLS, seq),) if deps else ()
    return ForwardedMessage(origin, CLS, seq, Message("plant/a", str(seq).encode(), qos=1), 0, deps, copies)


def _receiver() -> StreamReceiver:
    return StreamReceiver(ret_delay_s=0.2, retransmit_s=1.0, ack_delay_s=0.05)


def _held_behind_a_gap() -> StreamReceiver:
    receiver = _receiver()
    assert [f.seq for f, _h in receiver.receive(_fwd(209), 1, now=0.0)] == [209]
    # 210 lost on the link; 211 and 212 wait behind the gap
    assert receiver.receive(_fwd(211), 1, now=0.1) == []
    assert receiver.receive(_fwd(212), 1, now=0.1) == []
    rets = [a for a in receiver.tick(now=0.5) if isinstance(a, SendRet)]
    assert [(r.request.from_seq, r.request.to_seq) for r in rets] == [(210, 211)]
    return receiver


def test_an_ordinary_gone_delivers_what_was_held_behind_the_gap() -> None:
    """Today's answer of an origin that no longer logs the gap (replicas 1: nobody else has it)."""
    receiver = _held_behind_a_gap()
    assert [f.seq for f, _h in receiver.gone(OLD, CLS, 211, now=0.6)] == [211, 212]


def test_a_log_taken_over_drops_what_was_held_and_what_still_arrives_of_that_incarnation() -> None:
    receiver = _held_behind_a_gap()
    dropped, ready = receiver.taken_over(OLD, now=0.6)
    assert (dropped, ready) == (2, [])
    assert receiver.held_count() == 0
    assert not receiver.has_stream((OLD, CLS))
    # a relay's copy, or a late resend, of that incarnation: dropped too (the holders publish it)
    assert receiver.receive(_fwd(213), 1, now=0.7) == []
    assert receiver.receive(_fwd(210), 1, now=0.7) == []
    # nothing more is asked of it, and its position is no longer kept
    assert not [a for a in receiver.tick(now=5.0) if isinstance(a, SendRet)]
    assert receiver.changed.get((OLD, CLS)) == 0
    # other origins' streams go on as before
    assert [f.seq for f, _h in receiver.receive(_fwd(1, OTHER), 1, now=0.8)] == [1]


def test_a_message_waiting_on_the_taken_over_log_is_released() -> None:
    """A message of another origin whose causal dependency lies in the taken-over log does not
    wait for it any more: that log's messages come again as the holders' own."""
    receiver = _held_behind_a_gap()
    receiver.set_causal("a:1", lambda cls: True, wait_s=10.0)
    waiting = _fwd(1, OTHER, deps=(StreamPosition(OLD, CLS, 213),))
    assert receiver.receive(waiting, 1, now=0.2) == []
    dropped, ready = receiver.taken_over(OLD, now=0.6)
    assert dropped == 2
    assert [(f.origin, f.seq) for f, _h in ready] == [(OTHER, 1)]
    assert any(isinstance(a, SendAck) for a in receiver.tick(now=1.0))


def test_the_answer_is_a_gone_below_no_stream_reaches() -> None:
    """An older receiver reads ``LOG_TAKEN_OVER`` as an ordinary "gone" (it skips to what it
    holds and delivers it, as before): the value is a SEQ no stream reaches."""
    assert LOG_TAKEN_OVER > 1 << 60
    receiver = _held_behind_a_gap()
    assert [f.seq for f, _h in receiver.gone(OLD, CLS, LOG_TAKEN_OVER, now=0.6)] == [211, 212]


def test_the_answer_crosses_the_wire_unchanged() -> None:
    """``gone_below`` is a uint64 on the wire (``skipmq.v1.StreamResend``): the value fits."""
    answer = Envelope("b:1", "a:1", "", "", 0, 8, StreamResend(OLD, CLS, (), LOG_TAKEN_OVER))
    decoded = wire.decode_item(wire.encode_item(answer))
    assert isinstance(decoded, Envelope) and decoded.body == answer.body
