"""A restarted broker's send log (issue #30, docs/notes/recovery.md "two of the re-delivery bursts
removed"): the stream of its previous incarnation ends after its last logged message, and a
receiver that leaves keeps its unacknowledged entries ``min_retention_s`` more."""

from __future__ import annotations

from broker.cluster.messages import ForwardedMessage, StreamPosition, StreamRet
from broker.cluster.stream_sender import ReceiverAt, Resend, StreamSender
from broker.core.session import Message

OLD = "a:1/old"  # the previous incarnation's stream origin
CLS = "=plant"


def _sender(receivers: list[str]) -> StreamSender:
    return StreamSender(
        "a:1/new",
        retransmit_s=1.0,
        retention_s=3600.0,
        presence_grace_s=2.0,
        min_retention_s=10.0,
        receivers_of=lambda cls: receivers,
    )


def _logged(first: int, last: int) -> list[ForwardedMessage]:
    return [
        ForwardedMessage(OLD, CLS, seq, Message(f"plant/{seq}", b"x", qos=1))
        for seq in range(first, last + 1)
    ]


def test_a_previous_incarnations_stream_ends_after_its_last_logged_message() -> None:
    """Before: it was restored with its next SEQ at 1 - a hand-over named it at SEQ 1 and a
    receiver registered from the next message started at 1, so the whole log was delivered again
    to a client that had got it (the simulated chaos soak, 200-500 duplicates per burst)."""
    sender = _sender([])
    sender.restore(_logged(101, 300), [], now=0.0)
    actions = sender.register("c:1", CLS, 1.0, from_log_start=False)
    assert ReceiverAt((OLD, CLS), "c:1", 301) in actions
    # a broker that comes back still gets the log from its start
    assert ReceiverAt((OLD, CLS), "d:1", 101) in sender.register("d:1", CLS, 1.0, from_log_start=True)
    assert sender.next_seq_of((OLD, CLS)) == 301  # (what a hand-over names it at)


def test_a_receiver_that_leaves_keeps_its_unacknowledged_entries_for_the_minimum_retention() -> None:
    """Its last session of the class was handed over with the position it stood at: the new
    broker asks for what follows, perhaps just after the leave arrived."""
    sender = _sender(["b:1"])
    for n in range(20):
        sender.append(CLS, Message(f"plant/{n}", b"x", qos=1), now=0.0, confirmed=True)
    key = ("a:1/new", CLS)
    sender.acked("b:1", (StreamPosition(key[0], CLS, 6),), now=30.0)  # b:1 has 1-5
    sender.left("b:1", (StreamPosition(key[0], CLS, 0),), now=31.0)
    sender.tick(32.0)
    messages, kept_from = sender.logged_from(key, 6)
    assert kept_from == 6 and [m.seq for m in messages] == list(range(6, 21))
    resend = [a for a in sender.ret("c:1", StreamRet(key[0], CLS, 6, 21), now=35.0) if isinstance(a, Resend)]
    assert [m.seq for m in resend[0].resend.messages] == list(range(6, 21))
    sender.tick(42.0)  # the minimum retention after the leave is over: freed
    assert sender.logged_from(key, 6)[0] == []
