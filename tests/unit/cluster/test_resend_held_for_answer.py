"""A peer's resends of a stream new here wait for its answer to our claim (``Takeover.awaits_session_from``,
``StreamsMixin._hold_resend``): the pure rule, claim by claim."""

from __future__ import annotations

from broker.cluster.messages import ClaimReply
from broker.cluster.takeover import Takeover


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
