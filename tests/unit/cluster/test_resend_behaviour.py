"""Resends under load (issue #10, "seen in logs, not fixed"): scripted tests of the causes found
with the whole-cluster simulation counting resends (``bench``-free: virtual time).

* A burst stalled ~1 s behind every second lost message: after the RET of a gap was answered,
  the receiver stopped at the next gap and asked for it only when the first RET would have been
  repeated (``retransmit_s`` later) instead of after the reorder hold.
* Already-delivered messages were published again through the overlay every ``retransmit_s``
  while the overlay could not complete them (a subscriber's virtual node left and its neighbours'
  view was on probation): republished to every receiver, again and again, though every known
  receiver had acknowledged them. They are now republished with a doubling interval.
"""

from __future__ import annotations

import itertools

from broker.cluster.messages import ForwardedMessage, StreamPosition, StreamRet
from broker.cluster.stream_receiver import SendRet, StreamReceiver
from broker.cluster.stream_sender import Republish, StreamSender
from broker.core.session import Message

KEY = ("a:1/inc", "=r")


def _forwarded(seq: int) -> ForwardedMessage:
    return ForwardedMessage(KEY[0], KEY[1], seq, Message("r/x", b"%d" % seq, qos=1))


def _rets(actions: list[object]) -> list[tuple[int, int]]:
    return [(a.request.from_seq, a.request.to_seq) for a in actions if isinstance(a, SendRet)]


def test_the_next_gap_is_asked_for_after_the_reorder_hold_not_a_retransmit_period_later() -> None:
    receiver = StreamReceiver(ret_delay_s=0.2, retransmit_s=1.0, ack_delay_s=0.02)
    assert [f.seq for f, _h in receiver.receive(_forwarded(1), 1, now=0.0)] == [1]
    receiver.receive(_forwarded(3), 1, now=0.005)  # 2 was lost
    assert _rets(receiver.tick(now=0.21)) == [(2, 3)]
    receiver.receive(_forwarded(5), 1, now=0.215)  # 4 was lost too
    ready = receiver.receive(_forwarded(2), 1, now=0.22)  # the answer to the RET
    assert [f.seq for f, _h in ready] == [2, 3]
    # the new gap (4) is asked for after the reorder hold: not at 1.21, where the RET of 2 was due
    assert _rets(receiver.tick(now=0.3)) == []
    assert _rets(receiver.tick(now=0.43)) == [(4, 5)]
    ready = receiver.receive(_forwarded(4), 1, now=0.44)
    assert [f.seq for f, _h in ready] == [4, 5]


def test_a_gap_whose_ret_was_not_answered_is_asked_for_again_after_retransmit_s() -> None:
    receiver = StreamReceiver(ret_delay_s=0.2, retransmit_s=1.0, ack_delay_s=0.02)
    receiver.receive(_forwarded(1), 1, now=0.0)
    receiver.receive(_forwarded(3), 1, now=0.005)
    assert _rets(receiver.tick(now=0.21)) == [(2, 3)]
    receiver.receive(_forwarded(4), 1, now=0.3)  # more behind the same gap: no earlier repeat
    assert _rets(receiver.tick(now=0.9)) == []
    assert _rets(receiver.tick(now=1.22)) == [(2, 3)]


def _republished_until(sender: StreamSender, end_s: float, acknowledged: bool) -> list[float]:
    """The overlay reports every publication of message 1 incomplete; B and C acknowledge it at
    once (or never). When was it republished?"""
    forwarded = sender.append("=r", Message("r/x", b"1", qos=1), now=0.0)
    sender.published(0, forwarded)
    if acknowledged:
        for peer in ("b:1", "c:1"):
            sender.acked(peer, (StreamPosition(*forwarded_key(forwarded), 2),), now=0.01)
    sender.done(0, False, now=0.05)
    times: list[float] = []
    publication_id = 0
    now = 0.0
    while now < end_s:
        now = round(now + 0.05, 2)
        for action in sender.tick(now):
            if isinstance(action, Republish):
                times.append(now)
                publication_id += 1
                sender.published(publication_id, action.forwarded)
                sender.done(publication_id, False, now + 0.01)
    return times


def forwarded_key(forwarded: ForwardedMessage) -> tuple[str, str]:
    return forwarded.origin, forwarded.stream


def _sender() -> StreamSender:
    return StreamSender(
        "a:1/inc",
        retransmit_s=1.0,
        retention_s=3600.0,
        presence_grace_s=2.0,
        min_retention_s=10.0,
        receivers_of=lambda cls: ["b:1", "c:1"],
    )


def test_a_message_every_known_receiver_acknowledged_is_republished_ever_less_often() -> None:
    times = _republished_until(_sender(), 30.0, acknowledged=True)
    assert 3 <= len(times) <= 6, times  # 1, 2, 4, 8, 16 s apart (was every 1 s: 30 times)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps == sorted(gaps) and gaps[-1] >= 8, times


def test_a_message_some_receiver_lacks_is_still_republished_every_retransmit_period() -> None:
    times = _republished_until(_sender(), 10.0, acknowledged=False)
    assert len(times) >= 9, times


def test_a_ret_is_still_answered_at_once() -> None:
    sender = _sender()
    forwarded = sender.append("=r", Message("r/x", b"1", qos=1), now=0.0)
    actions = sender.ret("b:1", StreamRet(forwarded.origin, forwarded.stream, 1, 2), now=0.1)
    assert [m.seq for a in actions for m in a.resend.messages] == [1]  # type: ignore[attr-defined]
