"""Scripted tests of the reliable streams between brokers (seed 004 adapted, issue #10): the pure
cores ``stream_sender`` (SEQ, send log, pre-acknowledgement frees it, RET answers, resends,
receivers given up, presence grace), ``stream_receiver`` (acceptance, duplicates, failure
condition (1) -> RET, never a timed skip, ACK vectors, restart positions) and ``subscribe_waits``.
Events with an explicit ``now`` go in; the exact outputs are asserted. No broker, clock or I/O.
"""

from __future__ import annotations

from broker.cluster.interest_table import InterestTable
from broker.cluster.messages import (
    ClassInterest,
    ForwardedMessage,
    StreamAck,
    StreamPosition,
    StreamResend,
    StreamRet,
)
from broker.cluster.stream_receiver import SendAck, SendRet, StreamReceiver, origin_peer
from broker.cluster.stream_sender import Forget, GaveUp, ReceiverAt, Republish, Resend, StreamSender
from broker.cluster.subscribe_waits import SubscribeWaits
from broker.core.session import Message

A = "a:1/inc1"  # a sender's stream origin
CLS = "=t"


def _msg(n: int, qos: int = 1) -> Message:
    return Message("t/x", str(n).encode(), qos=qos)


def _fwd(seq: int, *, low: int = 0, origin: str = A) -> ForwardedMessage:
    return ForwardedMessage(origin, CLS, seq, _msg(seq), low)


def _seqs(ready: list[tuple[ForwardedMessage, int]]) -> list[int]:
    return [forwarded.seq for forwarded, _hops in ready]


def _sender() -> StreamSender:
    return StreamSender(A, retransmit_s=1.0, retention_s=100.0, presence_grace_s=2.0)


def _receiver() -> StreamReceiver:
    return StreamReceiver(ret_delay_s=0.2, retransmit_s=1.0, ack_delay_s=0.05)


# ============================================================================ sender
def test_sender_numbers_each_class_stream_from_one_with_no_gaps() -> None:
    sender = _sender()
    assert [sender.append(CLS, _msg(i), now=0.0).seq for i in range(3)] == [1, 2, 3]
    assert sender.append("=u", _msg(9), now=0.0).seq == 1
    assert sender.logged_count() == 4


def test_sender_frees_an_entry_only_when_the_overlay_completed_it_and_every_receiver_acked() -> None:
    """The pre-acknowledgement condition (seed 004 §3.4): SEQ < min(AL) over the known receivers."""
    sender = _sender()
    first = sender.append(CLS, _msg(1), now=0.0)
    second = sender.append(CLS, _msg(2), now=0.0)
    sender.published(10, first)
    sender.published(11, second)
    # receiver b acknowledges both before the overlay's completion
    position = StreamPosition(A, CLS, 3)
    assert sender.acked("b:1", (position,), now=0.1) == [ReceiverAt((A, CLS), "b:1", 3)]
    assert sender.logged_count() == 2
    assert sender.done(10, True, now=0.2) == [Forget((A, CLS), 2)]
    # receiver c appears and has only the first one: the second is kept for it
    assert sender.acked("c:1", (StreamPosition(A, CLS, 2),), now=0.3) == [ReceiverAt((A, CLS), "c:1", 2)]
    assert sender.done(11, True, now=0.4) == []
    assert sender.acked("c:1", (StreamPosition(A, CLS, 3),), now=0.5) == [
        ReceiverAt((A, CLS), "c:1", 3),
        Forget((A, CLS), 3),
    ]
    assert sender.logged_count() == 0


def test_sender_republishes_what_the_overlay_did_not_complete() -> None:
    sender = _sender()
    forwarded = sender.append(CLS, _msg(1), now=0.0)
    sender.published(1, forwarded)
    assert sender.done(1, False, now=5.0) == []  # e.g. a subscriber broker crashed mid-delivery
    assert sender.tick(now=5.0) == []  # not yet: half a retransmit period since the failure
    actions = sender.tick(now=5.6)
    assert actions == [Republish(forwarded)]
    assert sender.logged_count() == 1


def test_sender_answers_ret_from_the_log_and_says_what_is_gone() -> None:
    sender = _sender()
    for i in range(1, 6):
        forwarded = sender.append(CLS, _msg(i), now=0.0)
        sender.published(i, forwarded)
    sender.acked("b:1", (StreamPosition(A, CLS, 3),), now=0.0)
    for i in range(1, 6):
        sender.done(i, True, now=0.0)  # 1, 2 freed; 3..5 kept for b
    [resend] = sender.ret("c:1", StreamRet(A, CLS, 1, 5), now=0.1)
    assert isinstance(resend, Resend) and resend.peer == "c:1"
    assert [f.seq for f in resend.resend.messages] == [3, 4]
    assert resend.resend.gone_below == 3


def test_sender_resends_unacknowledged_entries_to_a_known_receiver() -> None:
    """The last paragraph of seed 004 §3.3: the sender sends again what is not acknowledged."""
    sender = _sender()
    # the overlay says nobody subscribes, but b (which acknowledged the stream) is cut off
    forwarded = sender.append(CLS, _msg(1), now=0.0, confirmed=True)
    sender.acked("b:1", (StreamPosition(A, CLS, 1),), now=0.0)
    assert sender.tick(now=0.5) == []  # sent just now: its acknowledgement may be on the way
    actions = sender.tick(now=1.5)
    assert actions == [Resend("b:1", StreamResend(A, CLS, (forwarded,), 0))]
    assert sender.tick(now=2.0) == []  # rate-limited per receiver


def test_sender_gives_up_a_receiver_silent_for_the_retention_and_counts_what_it_missed() -> None:
    sender = StreamSender(A, retransmit_s=1.0, retention_s=10.0, presence_grace_s=2.0)
    forwarded = sender.append(CLS, _msg(1), now=0.0)
    sender.acked("b:1", (StreamPosition(A, CLS, 1),), now=0.0)
    sender.published(1, forwarded)
    sender.done(1, True, now=0.0)
    assert sender.logged_count() == 1
    actions = sender.tick(now=10.6)
    assert GaveUp((A, CLS), "b:1", 1) in actions
    assert Forget((A, CLS), 2) in actions
    assert sender.logged_count() == 0


def test_sender_keeps_messages_skipped_while_nobody_subscribed_for_the_presence_grace() -> None:
    sender = _sender()
    assert not sender.recently_present(CLS, now=0.0)  # never had subscribers: memory only
    sender.skip(CLS, _msg(1), now=0.0)
    sender.skip(CLS, _msg(2), now=1.5)
    messages, held = sender.presence_on(CLS, now=2.5)
    assert [(m.payload, deps) for m, deps in messages] == [(b"2", None)] and held == []  # 1 is older than 2 s
    assert sender.presence_on(CLS, now=2.6) == ([], [])


def test_sender_holds_log_entries_of_a_class_whose_subscribers_just_went_away() -> None:
    """A subscriber moving or restarting: presence is off for a moment. The messages are log
    entries (durable for QoS >= 1), published when presence returns - or dropped after the grace."""
    sender = _sender()
    sender.present(CLS, now=10.0)
    assert sender.recently_present(CLS, now=11.0)
    held = sender.append(CLS, _msg(1), now=11.0, held=True)
    assert sender.tick(now=11.6) == []  # not published while held
    messages, republish = sender.presence_on(CLS, now=11.8)
    assert messages == [] and republish == [held]
    late = sender.append(CLS, _msg(2), now=12.0, held=True)
    assert late.seq == 2
    assert Republish(late) not in sender.tick(now=14.5)  # the grace ran out: given up, not published
    assert not sender.recently_present(CLS, now=14.5)


def test_sender_left_receiver_no_longer_holds_the_log_and_restore_resumes_it() -> None:
    sender = _sender()
    forwarded = sender.append(CLS, _msg(1), now=0.0)
    sender.published(1, forwarded)
    sender.acked("b:1", (StreamPosition(A, CLS, 1),), now=0.0)
    sender.done(1, True, now=0.0)
    assert sender.has_receivers(CLS)
    assert sender.left("b:1", (StreamPosition(A, CLS, 1),), now=0.0) == [
        ReceiverAt((A, CLS), "b:1", None),
        Forget((A, CLS), 2),
    ]
    # a restarted broker: the log and the positions of a previous incarnation come back
    restarted = StreamSender("a:1/inc2", retransmit_s=1.0, retention_s=100.0, presence_grace_s=2.0)
    restarted.restore([forwarded], [((A, CLS), "b:1", 1)], now=50.0)
    assert Republish(forwarded) in restarted.tick(now=50.5)


# ============================================================================ receiver
def test_receiver_accepts_in_order_holds_early_ones_and_drops_duplicates() -> None:
    receiver = _receiver()
    assert _seqs(receiver.receive(_fwd(5), 1, now=0.0)) == [5]  # a stream new here starts here
    assert _seqs(receiver.receive(_fwd(7), 1, now=0.1)) == []  # held: 6 missing
    assert _seqs(receiver.receive(_fwd(7), 1, now=0.1)) == []  # duplicate of a held one
    assert _seqs(receiver.receive(_fwd(6), 1, now=0.2)) == [6, 7]
    assert _seqs(receiver.receive(_fwd(6), 1, now=0.3)) == []  # duplicate of a delivered one
    assert receiver.stats.duplicates_dropped == 2
    assert receiver.changed[(A, CLS)] == 8


def test_receiver_asks_for_a_gap_with_ret_and_never_skips_it_on_a_timer() -> None:
    """Seed 004 §3.3 failure condition (1): [REQ, seq) is missing -> RET, repeated, no skip."""
    receiver = _receiver()
    receiver.receive(_fwd(1), 1, now=0.0)
    receiver.receive(_fwd(4), 1, now=1.0)
    rets = [a for a in receiver.tick(now=1.2) if isinstance(a, SendRet)]
    assert rets == [SendRet("a:1", StreamRet(A, CLS, 2, 4))]
    assert [a for a in receiver.tick(now=1.5) if isinstance(a, SendRet)] == []
    assert [a for a in receiver.tick(now=2.2) if isinstance(a, SendRet)] == [rets[0]]  # asked again
    assert [a for a in receiver.tick(now=600.0) if isinstance(a, SendRet)] == [rets[0]]  # never skipped
    assert receiver.held_count() == 1
    assert _seqs(receiver.receive(_fwd(2), 1, now=600.1) + receiver.receive(_fwd(3), 1, now=600.1)) == [
        2,
        3,
        4,
    ]


def test_receiver_skips_only_what_the_origin_says_is_gone_and_counts_it() -> None:
    receiver = _receiver()
    receiver.receive(_fwd(1), 1, now=0.0)
    receiver.receive(_fwd(5), 1, now=0.0)
    assert _seqs(receiver.gone(A, CLS, 3, now=0.1)) == []  # 2 skipped, 3 and 4 still asked for
    assert receiver.stats.gaps_skipped == 1
    assert _seqs(receiver.gone(A, CLS, 9, now=0.2)) == [5]  # never past a held message
    assert receiver.stats.gaps_skipped == 3


def test_receiver_new_stream_starts_at_the_senders_low_and_asks_for_the_rest() -> None:
    """A message sent while earlier ones were still unconfirmed: the earlier ones may still be on
    their way here (or lost), so the stream starts at ``low`` rather than overtaking them."""
    receiver = _receiver()
    assert _seqs(receiver.receive(_fwd(7, low=5), 1, now=0.0)) == []
    assert [a for a in receiver.tick(now=0.2) if isinstance(a, SendRet)] == [
        SendRet("a:1", StreamRet(A, CLS, 5, 7))
    ]
    assert _seqs(receiver.receive(_fwd(5), 1, now=0.3)) == [5]
    assert _seqs(receiver.receive(_fwd(6), 1, now=0.3)) == [6, 7]
    # below where the stream started: published before this broker subscribed
    assert _seqs(receiver.receive(_fwd(2), 1, now=0.4)) == []


def test_receiver_acknowledges_positions_as_one_vector_per_sender_and_again_after_a_duplicate() -> None:
    receiver = _receiver()
    receiver.receive(_fwd(1), 1, now=0.0)
    receiver.receive(ForwardedMessage(A, "=u", 3, _msg(3)), 1, now=0.0)
    assert receiver.next_deadline() == 0.05
    assert receiver.tick(now=0.05) == [
        SendAck("a:1", StreamAck((StreamPosition(A, CLS, 2), StreamPosition(A, "=u", 4))))
    ]
    assert receiver.tick(now=1.0) == []
    receiver.receive(_fwd(1), 1, now=1.0)  # the sender resent it: our ack was lost
    assert receiver.tick(now=1.05) == [SendAck("a:1", StreamAck((StreamPosition(A, CLS, 2),)))]


def test_receiver_restored_positions_are_acknowledged_at_once_and_leaving_a_class_tells_the_origin() -> None:
    receiver = _receiver()
    receiver.restore([((A, CLS), 10)], now=5.0)
    assert receiver.tick(now=5.0) == [SendAck("a:1", StreamAck((StreamPosition(A, CLS, 10),)))]
    assert _seqs(receiver.receive(_fwd(9), 1, now=5.1)) == []  # already delivered before the restart
    assert _seqs(receiver.receive(_fwd(10), 1, now=5.1)) == [10]
    assert receiver.leave_class(CLS) == [SendAck("a:1", StreamAck((), (StreamPosition(A, CLS, 11),)))]
    assert not receiver.has_stream((A, CLS))
    assert receiver.changed[(A, CLS)] == 0


def test_origin_peer_is_the_peer_id_before_the_incarnation() -> None:
    assert origin_peer("10.0.0.1:7883/abc") == "10.0.0.1:7883"


# ============================================================================ subscribe waits
def test_subscribe_waits_finish_when_every_class_is_joined_or_time_out() -> None:
    waits = SubscribeWaits(timeout_s=3.0)
    joined: set[str] = set()
    first = waits.add(["=a", "=b"], now=0.0)
    second = waits.add(["=c"], now=1.0)
    assert waits.poll(joined.__contains__) == []
    joined.add("=a")
    assert waits.poll(joined.__contains__) == []
    joined.add("=b")
    assert waits.poll(joined.__contains__) == [(first, True)]
    assert waits.next_deadline() == 4.0
    assert waits.tick(now=4.0) == [(second, False)]
    assert not waits.waiting()


# ============================================================================ filter propagation
def test_interest_table_applies_deltas_and_full_lists() -> None:
    table = InterestTable()
    assert table.apply("b:1", ClassInterest(("=a", "=b"))) == (["=a", "=b"], [])
    assert table.peers_of("=a") == frozenset({"b:1"})
    assert table.apply("b:1", ClassInterest((), ("=a",))) == ([], ["=a"])
    assert table.apply("b:1", ClassInterest(("=c",), (), full=True)) == (["=c"], ["=b"])
    assert table.classes_of("b:1") == frozenset({"=c"})
    assert table.peers_of("=a") == frozenset()


def test_sender_registers_subscriber_brokers_it_was_told_of_and_keeps_messages_for_them() -> None:
    """Filter propagation (seed 000): a broker that subscribes the class is a receiver from the
    next message on, even before it acknowledged anything (the overlay may not reach it)."""
    sender = StreamSender(
        A,
        retransmit_s=1.0,
        retention_s=100.0,
        presence_grace_s=2.0,
        min_retention_s=10.0,
        receivers_of=lambda cls: ["b:1"] if cls == CLS else [],
    )
    first = sender.append(CLS, _msg(1), now=0.0)
    sender.published(1, first)
    sender.done(1, True, now=0.0)  # the overlay says done (it did not reach b)
    assert sender.tick(now=20.0)[-1:] == [Resend("b:1", StreamResend(A, CLS, (first,), 0))]
    assert sender.logged_count() == 1  # kept for b, past the minimum retention


def test_an_assumed_receiver_position_gives_way_to_its_own_lower_acknowledgement() -> None:
    """A broker registered by interest at the next message may acknowledge an earlier position
    (a session that moved to it brought its old broker's): the sender resends from there."""
    sender = StreamSender(A, retransmit_s=1.0, retention_s=100.0, presence_grace_s=2.0, min_retention_s=10.0)
    for i in range(1, 4):
        forwarded = sender.append(CLS, _msg(i), now=0.0)
        sender.published(i, forwarded)
        sender.done(i, True, now=0.0)
    assert sender.register("b:1", CLS, now=0.0, from_log_start=False) == [ReceiverAt((A, CLS), "b:1", 4)]
    assert sender.acked("b:1", (StreamPosition(A, CLS, 2),), now=0.1) == [ReceiverAt((A, CLS), "b:1", 2)]
    [resend] = [a for a in sender.tick(now=1.5) if isinstance(a, Resend)]
    assert [f.seq for f in resend.resend.messages] == [2, 3]
    # a broker that comes back is registered from the log's first entry
    assert sender.register("c:1", CLS, now=2.0, from_log_start=True) == [ReceiverAt((A, CLS), "c:1", 1)]
    assert sender.unregister("c:1", CLS, now=2.0)[0] == ReceiverAt((A, CLS), "c:1", None)


def test_low_covers_a_registered_receiver_that_has_not_acknowledged_yet() -> None:
    """A broker registered by interest at SEQ 1 that missed it (the overlay reported the
    publication complete without it) starts the stream at ``low`` = 1 and asks for it, instead of
    acknowledging its first message as a fresh start."""
    sender = StreamSender(
        A,
        retransmit_s=1.0,
        retention_s=100.0,
        presence_grace_s=2.0,
        min_retention_s=10.0,
        receivers_of=lambda cls: ["b:1"] if cls == CLS else [],
    )
    first = sender.append(CLS, _msg(1), now=0.0)
    sender.published(1, first)
    sender.done(1, True, now=0.0)
    second = sender.append(CLS, _msg(2), now=0.1)
    assert second.low == 1
    receiver = _receiver()
    assert _seqs(receiver.receive(second, 1, now=0.2)) == []  # waits for 1
    assert _seqs(receiver.receive(first, 1, now=0.3)) == [1, 2]


def test_a_confirmation_that_reached_no_other_broker_stays_in_low_while_no_receiver_is_known() -> None:
    """Seed 145 of the causal conversation (issue #11's coalesced replies moved the timing onto
    it): a broker restarted during a partition published SEQ 1 - its overlay view held no
    subscriber, so the publication completed having reached nobody - and held the next ones
    (presence gone). When the partition healed they reached a subscriber broker before the
    log's resend of SEQ 1 did, with ``low`` 0 ("nothing below is missing"): it started the stream
    at 2 and dropped SEQ 1 as stale. A blind confirmation keeps ``low`` down while this broker
    knows no receiver of the stream (or some broker is down); a receiver it knows bounds ``low``
    itself (its registration point), and the blind entry leaves once the log frees it."""
    sender = StreamSender(A, retransmit_s=1.0, retention_s=100.0, presence_grace_s=2.0, min_retention_s=10.0)
    first = sender.append(CLS, _msg(1), now=0.0)
    sender.published(1, first)
    sender.done(1, True, now=0.01, reached=False)  # complete, no delegation to another broker
    second = sender.append(CLS, _msg(2), now=0.2, held=True)
    assert second.low == 1
    receiver = _receiver()
    assert _seqs(receiver.receive(second, 1, now=9.6)) == []  # waits for 1 (RET), not stale
    assert _seqs(receiver.receive(first, 1, now=9.61)) == [1, 2]
    # with a receiver known (registered from its next message), that receiver's start bounds low
    sender.register("b:1", CLS, now=0.3, from_log_start=False)
    third = sender.append(CLS, _msg(3), now=0.4)
    assert third.low == 2  # (the held SEQ 2 is still unconfirmed)
    # a confirmation that reached other brokers is one: low moves past it
    plain = StreamSender(A, retransmit_s=1.0, retention_s=100.0, presence_grace_s=2.0)
    one = plain.append(CLS, _msg(1), now=0.0)
    plain.published(1, one)
    plain.done(1, True, now=0.01)
    assert plain.append(CLS, _msg(2), now=0.2).low == 0


def test_a_blind_confirmation_leaves_low_once_the_log_frees_it() -> None:
    sender = StreamSender(A, retransmit_s=1.0, retention_s=100.0, presence_grace_s=2.0, min_retention_s=10.0)
    first = sender.append(CLS, _msg(1), now=0.0)
    sender.published(1, first)
    sender.done(1, True, now=0.01, reached=False)
    assert sender.append(CLS, _msg(2), now=0.1, confirmed=True).low == 1  # (only to known receivers: none)
    sender.tick(now=11.0)  # past the minimum retention: both freed
    assert sender.append(CLS, _msg(3), now=11.1, confirmed=True).low == 0


def test_a_class_never_published_here_has_receivers_once_a_subscriber_broker_was_announced() -> None:
    """Seed 79 (crash + partition): the first message of a stream, published while every
    subscriber broker of its class is down (the rendezvous point reports none), must not be
    skipped as exhaust data when filter propagation named subscriber brokers: it is logged for
    them (``ROUTE_DIRECT``) and resent when they are back."""
    subscribers: list[str] = []
    sender = StreamSender(
        A,
        retransmit_s=1.0,
        retention_s=100.0,
        presence_grace_s=2.0,
        min_retention_s=10.0,
        receivers_of=lambda cls: list(subscribers) if cls == CLS else [],
    )
    assert not sender.has_receivers(CLS)  # nobody subscribes: exhaust data
    subscribers.append("b:1")
    assert sender.has_receivers(CLS)  # before the stream's first message
    assert not sender.has_receivers("=other")
    first = sender.append(CLS, _msg(1), now=0.0, confirmed=True)  # ROUTE_DIRECT: not via the overlay
    assert sender.has_receivers(CLS)
    assert sender.tick(now=20.0)[-1:] == [Resend("b:1", StreamResend(A, CLS, (first,), 0))]


def test_a_restarted_broker_counts_the_receivers_of_its_previous_incarnations_streams() -> None:
    """Seed 521 of the causal conversation with every fault (``python -m simulation --seed 521
    --conversation --loss 0.05 --faults crash,partition``): a broker restarted while cut off from
    a subscriber broker, so its interest table (refilled by announcements) did not name it; the
    overlay, whose half did not reach it, called the new stream's first message complete and the
    second one went out with ``low`` = 2: the subscriber started the stream at 2 and dropped 1 as
    stale. Its store still said that broker received the class from the previous incarnation:
    the new stream starts with it as a receiver, so ``low`` covers 1 and 1 is resent to it."""
    old = ForwardedMessage(A, CLS, 3, _msg(3), 0)
    restarted = StreamSender("a:1/inc2", retransmit_s=1.0, retention_s=100.0, presence_grace_s=2.0)
    restarted.restore([old], [((A, CLS), "b:1", 3)], now=50.0)
    assert restarted.has_receivers(CLS)  # before the new stream's first message
    first = restarted.append(CLS, _msg(1), now=51.0)
    restarted.published(1, first)
    restarted.done(1, True, now=51.1)  # the overlay's half did not reach b
    second = restarted.append(CLS, _msg(2), now=51.2)
    assert second.low == 1
    resends = [a for a in restarted.tick(now=53.0) if isinstance(a, Resend) and a.resend.origin == "a:1/inc2"]
    assert resends == [Resend("b:1", StreamResend("a:1/inc2", CLS, (first, second), 0))]
    receiver = _receiver()  # b: whichever arrives first, it gets both
    assert _seqs(receiver.receive(second, 1, now=51.3)) == []
    assert _seqs(receiver.receive(first, 1, now=53.1)) == [1, 2]


def test_a_known_receiver_behind_gets_a_resend_while_the_overlay_cannot_complete_the_publication() -> None:
    """Seed 24 of the causal conversation with every fault (``python -m simulation --seed 24
    --conversation --loss 0.05 --faults crash,partition``): after a heal, a receiver broker
    acknowledged position 7 while the overlay, not yet repaired, reported every publication of 7
    and on incomplete. Each republication counted as "sent recently", so the direct resend to
    the receiver waited for the overlay's repair (4.5 s there). Now a republication of what the
    overlay could not complete does not hold the resend back."""
    sender = _sender()
    first = sender.append(CLS, _msg(1), now=0.0)
    sender.published(1, first)
    sender.acked("b:1", (StreamPosition(A, CLS, 1),), now=0.1)  # b knows the stream, lacks 1
    sender.done(1, False, now=0.2)  # the overlay did not reach b
    publication = 1
    resends: list[float] = []
    now = 0.5
    while now <= 3.0:
        for action in sender.tick(now):
            if isinstance(action, Republish):  # the overlay fails again, as right after a heal
                publication += 1
                sender.published(publication, action.forwarded)
                sender.done(publication, False, now=now + 0.01)
            elif isinstance(action, Resend) and action.peer == "b:1":
                assert action.resend.messages == (first,)
                resends.append(now)
        now += 0.5
    assert resends and resends[0] <= 1.5
