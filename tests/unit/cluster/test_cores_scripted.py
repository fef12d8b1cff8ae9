"""Scripted interaction tests of the cluster's pure protocol cores (etcd-raft style): events with an
explicit ``now`` go in, the exact outputs are asserted. No broker, no clock, no I/O.

Cores: ``broker.cluster.ordering`` (per-sender FIFO), ``publish_acks`` (remote storage before a
PUBACK), ``takeover`` (session claims), ``retained_sync`` (last writer wins, copies for a joining
broker), ``interest`` (SIONet-style aggregation of local subscriptions, seed 000; seed 003 §3.5.2/3).
Several of these guard regressions found in the issue #4 review (named in each test).
"""

from __future__ import annotations

from broker.cluster.interest import Interest, InterestChange
from broker.cluster.messages import (
    ClaimReply,
    ForwardedMessage,
    RetainedSyncReply,
    RetainedUpdate,
    SessionClaim,
)
from broker.cluster.ordering import FifoOrdering
from broker.cluster.publish_acks import PublishAcks
from broker.cluster.retained_sync import RetainedSync
from broker.cluster.takeover import ClaimFinished, HandOver, LateSession, Refuse, Takeover
from broker.core.session import Message, SessionSnapshot


def _fwd(seq: int, origin: str = "a:1/inc", stream: str = "=t") -> ForwardedMessage:
    return ForwardedMessage(origin, stream, seq, Message("t", str(seq).encode(), qos=1))


def _seqs(ready: list[tuple[ForwardedMessage, int]]) -> list[int]:
    return [forwarded.seq for forwarded, _hops in ready]


# ============================================================================ ordering
def test_ordering_restores_sequence_and_drops_duplicates() -> None:
    order = FifoOrdering(hold_s=1.0)
    assert _seqs(order.receive(_fwd(5), 1, now=0.0)) == [5]  # the first message sets the start
    assert _seqs(order.receive(_fwd(7), 1, now=0.1)) == []  # held: 6 missing
    assert order.next_deadline() == 1.1
    assert _seqs(order.receive(_fwd(7), 2, now=0.2)) == []  # duplicate of a held one
    assert _seqs(order.receive(_fwd(6), 1, now=0.3)) == [6, 7]
    assert _seqs(order.receive(_fwd(6), 1, now=0.4)) == []  # duplicate of a delivered one
    assert order.next_deadline() is None
    assert order.stats.duplicates_dropped == 2


def test_ordering_skips_a_gap_only_after_the_hold_time_and_counts_it() -> None:
    gaps: list[tuple[tuple[str, str], int]] = []
    order = FifoOrdering(hold_s=1.0, on_gap=lambda key, missing: gaps.append((key, missing)))
    order.receive(_fwd(1), 1, now=0.0)
    assert _seqs(order.receive(_fwd(4), 1, now=0.5)) == []
    assert _seqs(order.tick(now=1.4)) == []  # not yet
    assert _seqs(order.tick(now=1.5)) == [4]
    assert order.stats.gaps_skipped == 2
    assert gaps == [(("a:1/inc", "=t"), 2)]


def test_ordering_an_earlier_message_after_the_first_is_delivered_late_once() -> None:
    """Review #4: the first message of a stream seen here is not necessarily its earliest (it
    overtook one on a one-hop / multi-hop switch): the earlier one is delivered, not dropped."""
    order = FifoOrdering(hold_s=1.0)
    assert _seqs(order.receive(_fwd(5), 1, now=0.0)) == [5]
    assert _seqs(order.receive(_fwd(4), 2, now=0.1)) == [4]
    assert _seqs(order.receive(_fwd(4), 2, now=0.2)) == []  # its retransmission
    assert _seqs(order.receive(_fwd(5), 1, now=0.3)) == []
    assert _seqs(order.receive(_fwd(6), 1, now=0.4)) == [6]
    assert order.stats.duplicates_dropped == 2


def test_ordering_streams_are_independent_and_idle_ones_are_forgotten() -> None:
    order = FifoOrdering(hold_s=1.0)
    order.receive(_fwd(1, origin="a"), 1, now=0.0)
    order.receive(_fwd(3, origin="a"), 1, now=0.0)  # a holds 3
    assert _seqs(order.receive(_fwd(9, origin="b"), 1, now=0.0)) == [9]
    assert order.held_count() == 1
    order.forget_idle(now=100.0, idle_s=10.0)  # b is forgotten, a still holds a message
    assert _seqs(order.receive(_fwd(1, origin="b"), 1, now=100.0)) == [1]  # a new start for b
    assert order.held_count() == 1


# ============================================================================ publish acks
def test_publish_acks_finish_when_every_publication_is_done() -> None:
    acks = PublishAcks(timeout_s=5.0)
    wait = acks.open()
    acks.add(wait, 10)
    acks.add(wait, 11)
    assert acks.done(10, True) == []  # not sealed yet: more publications may come
    assert acks.close(wait, now=0.0) == []
    assert acks.next_deadline() == 5.0
    assert acks.done(11, True) == [(wait, True)]
    assert acks.next_deadline() is None


def test_publish_acks_done_before_close_finishes_at_close() -> None:
    """Review #4: a PublishDone that comes synchronously (only local subscribers) must not be
    lost: the wait finishes when it is closed instead of holding the PUBACK for the timeout."""
    acks = PublishAcks(timeout_s=5.0)
    wait = acks.open()
    acks.add(wait, 1)
    assert acks.done(1, True) == []
    assert acks.close(wait, now=0.0) == [(wait, True)]
    assert not acks.is_open(wait)


def test_publish_acks_time_out_unconfirmed_and_a_late_done_is_ignored() -> None:
    acks = PublishAcks(timeout_s=5.0)
    wait = acks.open()
    acks.add(wait, 1)
    acks.close(wait, now=1.0)
    assert acks.tick(now=5.9) == []
    assert acks.tick(now=6.0) == [(wait, False)]
    assert acks.done(1, True) == []


def test_publish_acks_with_no_publication_have_no_outcome() -> None:
    acks = PublishAcks(timeout_s=5.0)
    wait = acks.open()
    assert acks.close(wait, now=0.0) == []
    assert not acks.is_open(wait)


# ============================================================================ takeover
def test_takeover_claims_are_ordered_by_claim_id_then_peer() -> None:
    """Review #4: of two crossing claims, the older never takes the client from the newer one."""
    a = Takeover("a:1", wait_s=1.0)
    b = Takeover("b:1", wait_s=1.0)
    claim_a, waits_a = a.claim("c", False, ["b:1"], now=0.0, wall_ns=100)
    claim_b, waits_b = b.claim("c", False, ["a:1"], now=0.0, wall_ns=200)  # newer
    assert waits_a and waits_b
    # b is connected (its CONNECT is waiting for its own claim): a's older claim is refused
    assert b.on_claim(claim_a, connected_here=False) == Refuse(claim_a)
    # a's connection is older: it hands over to b
    assert a.on_claim(claim_b, connected_here=True) == HandOver(claim_b, transfer=True)
    assert a.yields("c")  # a newer claim came from elsewhere while a's CONNECT waited
    assert not b.yields("c")


def test_takeover_same_claim_id_is_broken_by_peer_id() -> None:
    a = Takeover("a:1", wait_s=1.0)
    b = Takeover("b:1", wait_s=1.0)
    claim_a, _ = a.claim("c", False, ["b:1"], now=0.0, wall_ns=500)
    claim_b, _ = b.claim("c", False, ["a:1"], now=0.0, wall_ns=500)
    assert a.on_claim(claim_b, connected_here=True) == HandOver(claim_b, transfer=True)
    assert b.on_claim(claim_a, connected_here=True) == Refuse(claim_a)


def test_takeover_claim_ids_increase_even_if_the_clock_does_not() -> None:
    t = Takeover("a:1", wait_s=1.0)
    first, _ = t.claim("c", True, [], now=0.0, wall_ns=1000)
    second, _ = t.claim("c", True, [], now=0.0, wall_ns=900)
    assert second.claim_id > first.claim_id


def test_takeover_a_relayed_reply_counts_for_the_broker_that_wrote_it() -> None:
    """Review #4: the reply is counted for the answering broker (envelope orig), whatever link."""
    t = Takeover("a:1", wait_s=1.0)
    claim, waits = t.claim("c", False, ["x:1", "y:1"], now=0.0, wall_ns=1)
    assert waits
    assert t.on_reply("x:1", ClaimReply(claim.claim_id, "c", False, None)) is None
    assert t.on_reply("y:1", ClaimReply(claim.claim_id, "c", False, None)) == ClaimFinished(
        claim.claim_id, None
    )


def test_takeover_snapshot_finishes_at_once_and_a_late_one_is_kept() -> None:
    t = Takeover("a:1", wait_s=1.0)
    snapshot = SessionSnapshot("c", 5, 3600, None, [], [], set())
    claim, _ = t.claim("c", False, ["x:1", "y:1"], now=0.0, wall_ns=1)
    finished = t.on_reply("x:1", ClaimReply(claim.claim_id, "c", True, snapshot))
    assert finished == ClaimFinished(claim.claim_id, snapshot)
    claim2, _ = t.claim("c", False, ["x:1"], now=2.0, wall_ns=2)
    assert t.tick(now=3.0) == [ClaimFinished(claim2.claim_id, None)]  # the wait ran out
    late = t.on_reply("x:1", ClaimReply(claim2.claim_id, "c", True, snapshot))
    assert late == LateSession(snapshot)


def test_takeover_peer_down_ends_claims_waiting_only_for_it() -> None:
    t = Takeover("a:1", wait_s=1.0)
    claim, _ = t.claim("c", False, ["x:1"], now=0.0, wall_ns=1)
    assert t.next_deadline() == 1.0
    assert t.peer_down("x:1") == [ClaimFinished(claim.claim_id, None)]
    assert t.next_deadline() is None


def test_takeover_clean_start_does_not_wait() -> None:
    t = Takeover("a:1", wait_s=1.0)
    claim, waits = t.claim("c", True, ["x:1"], now=0.0, wall_ns=1)
    assert not waits and claim.clean_start
    other = Takeover("x:1", wait_s=1.0)
    assert other.on_claim(claim, connected_here=True) == HandOver(claim, transfer=False)
    assert t.on_claim(SessionClaim("a:1", "c", 99, False), connected_here=True) is None  # our own


# ============================================================================ retained sync
def _retained(topic: str, payload: bytes) -> Message:
    return Message(topic, payload, qos=0, retain=True)


def test_retained_last_writer_wins_in_any_arrival_order() -> None:
    older = RetainedUpdate("b:1", 100, _retained("t", b"old"))
    newer = RetainedUpdate("a:1", 200, _retained("t", b"new"))
    first = RetainedSync("x:1", request_timeout_s=1.0)
    assert first.accept(older) and first.accept(newer)
    second = RetainedSync("y:1", request_timeout_s=1.0)
    assert second.accept(newer) and not second.accept(older)
    assert first.versions["t"] == second.versions["t"] == (200, "a:1")


def test_retained_local_write_beats_a_clock_running_ahead() -> None:
    """Review #4: after an update stamped by a clock a minute ahead, a local write still wins."""
    sync = RetainedSync("a:1", request_timeout_s=1.0)
    assert sync.accept(RetainedUpdate("z:1", 60_000, _retained("cfg", b"remote")))
    update = sync.local_write(_retained("cfg", b"local"), wall_ms=1_000)
    assert (update.version_ms, update.origin) > (60_000, "z:1")
    assert RetainedSync("b:1", request_timeout_s=1.0).accept(update)


def test_retained_two_writes_in_one_millisecond_get_increasing_versions() -> None:
    """Review #4: a set then a delete within one millisecond: the delete must win everywhere."""
    sync = RetainedSync("a:1", request_timeout_s=1.0)
    first = sync.local_write(_retained("t", b"set"), wall_ms=5)
    second = sync.local_write(_retained("t", b""), wall_ms=5)
    assert second.version_ms > first.version_ms


def test_retained_copy_carries_deletions_and_is_chunked_with_a_last_marker() -> None:
    """Review #4: a broker that was down when a topic was deleted must learn the deletion."""
    sync = RetainedSync("a:1", request_timeout_s=1.0)
    sync.accept(RetainedUpdate("b:1", 10, _retained("kept", b"v")))
    sync.accept(RetainedUpdate("b:1", 20, _retained("gone", b"")))
    replies = sync.copy_for(7, [_retained("kept", b"v")])
    assert [reply.last for reply in replies] == [True]
    updates = {u.message.topic: u for u in replies[0].updates}
    assert updates["gone"].message.payload == b"" and updates["gone"].version_ms == 20
    assert updates["kept"].version_ms == 10


def test_retained_copy_request_moves_to_the_next_contact_on_timeout() -> None:
    sync = RetainedSync("a:1", request_timeout_s=2.0)
    request = sync.start_copy(["b:1", "c:1"], now=0.0)
    assert request is not None and request.dest == "b:1"
    assert sync.tick(now=1.9) is None
    retry = sync.tick(now=2.0)
    assert retry is not None and retry.dest == "c:1"
    sync.reply_received(RetainedSyncReply(retry.request.request_id, (), True))
    assert sync.next_deadline() is None and sync.tick(now=100.0) is None


# ============================================================================ interest
def test_interest_joins_on_the_first_subscriber_and_leaves_on_the_last() -> None:
    interest = Interest(class_levels=1)
    assert interest.subscribe("c1", "a/b", None) == [InterestChange("=a", True)]
    assert interest.subscribe("c2", "a/c", None) == []
    assert interest.subscribe("c2", "a/c", None) == []  # replaced: counted once
    assert interest.unsubscribe("c1", "a/b", None) == []
    assert interest.unsubscribe("c2", "a/c", None) == [InterestChange("=a", False)]
    assert interest.unsubscribe("c2", "a/c", None) == []


def test_interest_share_groups_count_towards_their_own_topic() -> None:
    interest = Interest(class_levels=1)
    changes = interest.subscribe("c1", "a/b", "g")
    assert InterestChange("=a", True) in changes and InterestChange("!share/g/a/b", True) in changes
    assert interest.topics() == ["=a", "!share/g/a/b"]
    assert interest.class_of("+/x") != interest.class_of("a/x")
