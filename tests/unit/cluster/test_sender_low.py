"""Where a broker new to a stream starts it (the ``low`` each forwarded message carries; issue #30,
docs/notes/recovery.md "the duplicate bursts traced in the real soak"): an unconfirmed message
that every known receiver has acknowledged and whose publication the overlay reported incomplete
does not hold ``low`` back once it is ``min_retention_s`` old; one that some receiver may still
lack does."""

from __future__ import annotations

from broker.cluster.messages import StreamPosition
from broker.cluster.stream_sender import StreamSender
from broker.core.session import Message

ORIGIN = "a:1/now"
CLS = "=soak"
RECEIVER = "b:1"


def _sender() -> StreamSender:
    return StreamSender(
        ORIGIN,
        retransmit_s=1.0,
        retention_s=3600.0,
        presence_grace_s=2.0,
        min_retention_s=10.0,
        receivers_of=lambda cls: [RECEIVER],
        absent_since=lambda: None,
    )


def _publish(sender: StreamSender, n: int, now: float, publication_id: int, complete: bool) -> int:
    """Message ``n`` appended and published; the overlay reports it ``complete`` or not."""
    forwarded = sender.append(CLS, Message(f"soak/{n}", b"x", qos=1), now)
    sender.published(publication_id, forwarded)
    sender.done(publication_id, complete, now)
    return forwarded.seq


def _acked(sender: StreamSender, next_seq: int, now: float) -> None:
    sender.acked(RECEIVER, (StreamPosition(ORIGIN, CLS, next_seq),), now)


def test_a_message_every_receiver_has_does_not_hold_low_back_for_ever() -> None:
    """Before: one publication the overlay kept reporting incomplete held ``low`` at its SEQ for
    as long as it stayed unconfirmed (minutes in the chaos soak): a broker that started receiving
    the stream for a moved client's new subscription got the whole log from there again."""
    sender = _sender()
    stuck = _publish(sender, 0, 0.0, 1, complete=False)  # a broker of the run went down
    for n in range(1, 400):  # 20 msg/s, all complete, all acknowledged by the one receiver
        now = n * 0.05
        seq = _publish(sender, n, now, 1 + n, complete=True)
        _acked(sender, seq + 1, now)
    forwarded = sender.append(CLS, Message("soak/400", b"x", qos=1), 20.0)
    assert stuck == 1
    assert forwarded.low == 0, f"a new receiver would start at {forwarded.low} of {forwarded.seq}"


def test_a_message_some_receiver_may_lack_still_holds_low() -> None:
    """The same stuck message while it is younger than ``min_retention_s``, or while the known
    receiver has not acknowledged it: a receiver new to the stream starts there."""
    sender = _sender()
    stuck = _publish(sender, 0, 0.0, 1, complete=False)
    for n in range(1, 100):  # 5 s: younger than the minimum retention
        now = n * 0.05
        seq = _publish(sender, n, now, 1 + n, complete=True)
        _acked(sender, seq + 1, now)
    assert sender.append(CLS, Message("soak/100", b"x", qos=1), 5.0).low == stuck

    lagging = _sender()
    stuck = _publish(lagging, 0, 0.0, 1, complete=False)
    for n in range(1, 400):  # the receiver never acknowledged the stuck one
        _publish(lagging, n, n * 0.05, 1 + n, complete=True)
    assert lagging.append(CLS, Message("soak/400", b"x", qos=1), 20.0).low == stuck
