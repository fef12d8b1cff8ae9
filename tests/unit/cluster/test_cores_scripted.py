"""Scripted interaction tests of the cluster's pure protocol cores (etcd-raft style): events with an
explicit ``now`` go in, the exact outputs are asserted. No broker, no clock, no I/O.

Cores: ``takeover`` (session claims), ``retained_sync`` (last writer wins, copies for a joining
broker), ``interest`` (SIONet-style aggregation of local subscriptions, seed 000; seed 003 §3.5.2/3).
Several of these guard regressions found in the issue #4 review (named in each test). The
reliable streams (seed 004) have their own file, ``test_streams_scripted.py``.
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
from broker.cluster.retained_sync import RetainedSync
from broker.cluster.takeover import ClaimFinished, HandOver, LateSession, Refuse, Takeover
from broker.core.session import Message, SessionSnapshot


def _fwd(seq: int, origin: str = "a:1/inc", stream: str = "=t") -> ForwardedMessage:
    return ForwardedMessage(origin, stream, seq, Message("t", str(seq).encode(), qos=1))


def _seqs(ready: list[tuple[ForwardedMessage, int]]) -> list[int]:
    return [forwarded.seq for forwarded, _hops in ready]


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


def test_takeover_the_same_session_answering_a_repeated_claim_again_is_not_merged_twice() -> None:
    """Issue #30: the claimant repeats an unanswered claim every ``repeat_s``; a restarting broker
    answers each repeat with the reply it kept. The session arrived with the first answer: the
    others are dropped (each merge queued every message of the session again - the chaos soak's
    bursts of re-deliveries). A session from another broker is another session: merged."""
    t = Takeover("a:1", wait_s=1.0)
    snapshot = SessionSnapshot("c", 5, 3600, None, [], [], set())
    other = SessionSnapshot("c", 5, 3600, None, [], [], {7})
    claim, _ = t.claim("c", False, ["x:1", "y:1"], now=0.0, wall_ns=1)
    assert t.tick(now=2.0) == [ClaimFinished(claim.claim_id, None)]  # x and y down: the wait ran out
    assert t.may_bring_session("c")
    reply = ClaimReply(claim.claim_id, "c", True, snapshot)
    assert t.on_reply("x:1", reply, client_here=True) == LateSession(snapshot)
    assert t.on_reply("x:1", reply, client_here=True) is None  # the answer to a repeat of the claim
    assert t.on_reply("x:1", reply, client_here=True) is None
    other_reply = ClaimReply(claim.claim_id, "c", True, other)
    assert t.on_reply("y:1", other_reply, client_here=True) == LateSession(other)
    # merged while the client was elsewhere (stored, or passed on): a later answer still counts
    claim2, _ = t.claim("d", False, ["x:1"], now=3.0, wall_ns=3)
    assert t.tick(now=5.0) == [ClaimFinished(claim2.claim_id, None)]
    reply2 = ClaimReply(claim2.claim_id, "d", True, snapshot)
    assert t.on_reply("x:1", reply2, client_here=False) == LateSession(snapshot)
    assert t.on_reply("x:1", reply2, client_here=False) == LateSession(snapshot)
    assert t.settled(claim.claim_id)
    assert not t.may_bring_session("c")


def test_takeover_peer_down_ends_claims_waiting_only_for_it_and_the_claim_is_repeated_to_it() -> None:
    """Issue #10: the CONNECT stops waiting for a broker that went down, but the claim is repeated
    to it (a partition heals, a broker restarts with a stored session): one owner per client id."""
    t = Takeover("a:1", wait_s=1.0, repeat_s=2.0)
    claim, _ = t.claim("c", False, ["x:1"], now=0.0, wall_ns=1)
    assert t.next_deadline() == 1.0
    assert t.peer_down("x:1") == [ClaimFinished(claim.claim_id, None)]
    assert t.next_deadline() == 2.0  # the first repeat
    assert t.repeats(now=1.9) == []
    assert t.repeats(now=2.0) == [("x:1", claim)]
    assert t.repeats(now=4.0) == [("x:1", claim)]
    assert t.on_reply("x:1", ClaimReply(claim.claim_id, "c", False, None)) is None
    assert t.repeats(now=6.0) == []  # answered
    assert t.next_deadline() is None


def test_takeover_repeats_stop_when_the_connection_no_longer_holds_the_client() -> None:
    t = Takeover("a:1", wait_s=0.0, repeat_s=1.0)
    claim, _ = t.claim("c", True, ["x:1"], now=0.0, wall_ns=1, unreachable=["y:1"])
    assert t.repeats(now=1.0) == [("x:1", claim), ("y:1", claim)]
    t.claim("c", True, [], now=1.5, wall_ns=2)  # the client reconnected here: a newer claim
    assert t.repeats(now=2.0) == []


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
