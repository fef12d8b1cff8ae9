"""A peer's resends of a stream new here wait for its answer to our claim (``Takeover.awaits_session_from``,
``StreamsMixin._hold_resend``) only while that answer can only bring the client's older session;
and an answer that brings again the session the client attached with is not merged a second time
(``Takeover.attached``): the pure rules, claim by claim."""

from __future__ import annotations

from broker.cluster.messages import ClaimReply
from broker.cluster.takeover import ClaimFinished, LateSession, Takeover
from broker.core.session import SessionSnapshot


def _claim(takeover: Takeover, *, clean_start: bool = False, unreachable: tuple[str, ...] = ("r:1",)) -> int:
    claim, _waits = takeover.claim("sub", clean_start, ["b:1"], 0.0, 1_000, unreachable=unreachable)
    return claim.claim_id


def test_a_claim_that_may_bring_a_session_awaits_each_unanswered_broker_until_it_answers() -> None:
    takeover = Takeover("c:1", wait_s=1.0, repeat_s=1.0)
    claim_id = _claim(takeover)
    assert takeover.awaits_session_from("r:1") and takeover.awaits_session_from("b:1")
    assert not takeover.awaits_session_from("x:1")  # never asked
    takeover.on_reply("r:1", ClaimReply(claim_id, "sub", False, None), client_here=True)
    assert not takeover.awaits_session_from("r:1")  # its answer came: its stream goes on
    assert takeover.awaits_session_from("b:1")


def test_an_answer_without_the_session_from_a_broker_ends_the_wait_for_it() -> None:
    takeover = Takeover("c:1", wait_s=1.0, repeat_s=1.0)
    claim_id = _claim(takeover)
    takeover.on_reply("b:1", ClaimReply(claim_id, "sub", False, None), client_here=True)
    takeover.answered_without_session(claim_id, "b:1")
    takeover.attached("sub", session_present=False)
    assert not takeover.awaits_session_from("b:1")
    assert takeover.awaits_session_from("r:1")


def test_a_clean_start_brings_no_session_so_nothing_waits_for_it() -> None:
    takeover = Takeover("c:1", wait_s=1.0, repeat_s=1.0)
    _claim(takeover, clean_start=True)
    assert not takeover.awaits_session_from("r:1")


def test_a_claim_repeated_to_a_broker_that_came_back_awaits_it_until_it_answers() -> None:
    takeover = Takeover("c:1", wait_s=1.0, repeat_s=1.0)
    claim_id = _claim(takeover, unreachable=())  # r:1 was not known when the client connected
    assert not takeover.awaits_session_from("r:1")
    claims = takeover.claims_to_repeat(lambda _client: True)
    takeover.repeat_to("r:1", claims, 2.0)
    assert takeover.awaits_session_from("r:1")  # it may hold the client's older session
    takeover.on_reply("r:1", ClaimReply(claim_id, "sub", False, None), client_here=True)
    assert not takeover.awaits_session_from("r:1")


def test_a_claim_whose_session_arrived_and_settled_awaits_nobody() -> None:
    takeover = Takeover("c:1", wait_s=1.0, repeat_s=1.0)
    claim_id = _claim(takeover)
    takeover.on_reply("b:1", ClaimReply(claim_id, "sub", False, None), client_here=True)
    assert takeover.settled(claim_id)
    assert not takeover.awaits_session_from("r:1")  # (the claim may still be repeated to it)


def test_a_client_attached_with_an_empty_session_here_awaits_the_older_one() -> None:
    takeover = Takeover("c:1", wait_s=1.0, repeat_s=1.0)
    claim_id = _claim(takeover)
    takeover.tick(5.0)  # the CONNECT stopped waiting (r:1 down): attached with a session made here
    takeover.attached("sub", session_present=False)
    assert takeover.awaits_session_from("r:1")  # what r:1 brings is the older session
    takeover.on_reply("r:1", ClaimReply(claim_id, "sub", False, None), client_here=True)
    assert not takeover.awaits_session_from("r:1")


def test_a_client_whose_session_here_was_resumed_awaits_nothing_a_newer_session_may_bring() -> None:
    """Seed 842 of --faults crash,move,partition --loss 0.05 --finite-clients: the client resumed
    its older session here while the broker it had just been on (cut off) still held a newer one,
    made there after its claim to us was lost. That broker's positions say nothing of what the
    session here still needs from its streams: a stream of it is not held for them."""
    takeover = Takeover("c:1", wait_s=1.0, repeat_s=1.0)
    _claim(takeover)
    takeover.tick(5.0)
    takeover.attached("sub", session_present=True)
    assert not takeover.awaits_session_from("r:1")


def test_one_resumed_session_among_the_awaiting_claims_ends_the_wait_for_that_broker() -> None:
    takeover = Takeover("c:1", wait_s=1.0, repeat_s=1.0)
    takeover.claim("fresh", False, ["b:1"], 0.0, 1_000, unreachable=("r:1",))
    takeover.claim("resumed", False, ["b:1"], 0.0, 2_000, unreachable=("r:1",))
    takeover.tick(5.0)
    takeover.attached("fresh", session_present=False)
    # "resumed" stopped waiting and has not attached yet: which session it gets is not known
    assert not takeover.awaits_session_from("r:1")
    takeover.attached("resumed", session_present=False)
    assert takeover.awaits_session_from("r:1")
    takeover.claim("resumed", False, ["b:1"], 6.0, 3_000, unreachable=("r:1",))  # connects again
    takeover.tick(8.0)
    takeover.attached("resumed", session_present=True)
    assert not takeover.awaits_session_from("r:1")


def test_a_claim_whose_connection_is_gone_awaits_nothing() -> None:
    """The connection that made the claim was replaced by a newer one (here or elsewhere): a
    session that still comes goes to the store or on to the newer broker, not to a session here
    made after it."""
    takeover = Takeover("c:1", wait_s=1.0, repeat_s=1.0)
    _claim(takeover)
    takeover.tick(5.0)
    takeover.attached("sub", session_present=False)
    takeover.claim("sub", False, [], 6.0, 9_000, unreachable=())  # the client connected again
    assert not takeover.awaits_session_from("r:1")


def test_the_answer_to_a_repeat_of_a_claim_whose_session_the_connect_attached_is_not_merged_again() -> None:
    """The session the CONNECT waited for came from r:1 and the client attached with it. r:1 then
    restarted and was sent the claim again (``claims_to_repeat``); it answers with the reply it
    kept - the same session, its positions as they were when it left. Merged as a late session,
    those positions fetched again everything the client had received here since (the chaos soak:
    B1's stream from SEQ 1, 187 duplicates in one burst, docs/notes/recovery.md)."""
    takeover = Takeover("c:1", wait_s=1.0, repeat_s=1.0)
    claim, _waits = takeover.claim("sub", False, ["r:1"], 0.0, 1_000)
    session = SessionSnapshot("sub", 5, 3600, None, [], [], set())
    finished = takeover.on_reply("r:1", ClaimReply(claim.claim_id, "sub", True, session), client_here=False)
    assert isinstance(finished, ClaimFinished) and finished.snapshot is session
    takeover.attached("sub", session_present=True)
    takeover.repeat_to("r:1", takeover.claims_to_repeat(lambda _client: True), 5.0)  # r:1 came back
    again = takeover.on_reply("r:1", ClaimReply(claim.claim_id, "sub", True, session), client_here=True)
    assert again is None


def test_a_session_brought_for_a_connect_that_never_attached_still_counts_when_it_comes_again() -> None:
    """The client gave up before its CONNACK (the snapshot was not imported here): a later answer
    with the session may be what brings it to the client (seed 939), so it is not dropped."""
    takeover = Takeover("c:1", wait_s=1.0, repeat_s=1.0)
    claim, _waits = takeover.claim("sub", False, ["r:1"], 0.0, 1_000)
    session = SessionSnapshot("sub", 5, 3600, None, [], [], set())
    takeover.on_reply("r:1", ClaimReply(claim.claim_id, "sub", True, session), client_here=False)
    again = takeover.on_reply("r:1", ClaimReply(claim.claim_id, "sub", True, session), client_here=False)
    assert isinstance(again, LateSession)
