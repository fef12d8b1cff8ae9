"""A reply kept for a repeated claim and restored after a restart is not handed to a newer claim.

The chaos soak's "kind 2" duplicates (docs/notes/recovery.md, 2026-11-29 dups): a broker that
restarted restored the replies it kept (``restore_handed_over``) stamped with its restart time;
a claimant reported down within ``unconfirmed_s`` of *that* marked them unconfirmed
(``claimant_down``), and the client's next claim, from any broker, got the old session again with
the positions it left with - everything the client had received since was delivered again. A
restored reply's hand-over is at least one restart old: only a repeat of its own claim, or that
claim's ``recover``, gets it.
"""

from __future__ import annotations

from broker.cluster.messages import ClaimReply, SessionClaim, StreamPosition
from broker.cluster.store_port import MemoryClusterStore
from broker.cluster.takeover import Answer, HandOver, Takeover
from broker.core.session import SessionSnapshot


def _reply(claim: SessionClaim) -> ClaimReply:
    snapshot = SessionSnapshot(claim.client_id, 4, 3600, None, [], [], set())
    return ClaimReply(claim.claim_id, claim.client_id, True, snapshot, (StreamPosition("p:1/x", "=t", 5),))


def _restarted_with_kept_reply() -> tuple[Takeover, SessionClaim, ClaimReply]:
    """Broker a handed the client's session to b's claim, kept the reply durably, restarted at 10.0."""
    store = MemoryClusterStore()
    a = Takeover("a:1", wait_s=0.5, repeat_s=1.0)
    claim = SessionClaim("b:1", "c", 100, False)
    assert a.on_claim(claim, connected_here=True) == HandOver(claim, transfer=True)
    reply = _reply(claim)
    a.handed_over(claim.claim_id, claim.origin, reply, now=1.0)
    store.set_handed_over(claim.claim_id, claim.origin, reply)
    restarted = Takeover("a:2", wait_s=0.5, repeat_s=1.0)
    restarted.restore_handed_over(store.load_handed_over(), now=10.0)
    return restarted, claim, reply


def test_a_restored_reply_is_not_handed_to_a_newer_claim_when_its_claimant_goes_down_after_the_restart() -> (
    None
):
    a, _claim, _reply_kept = _restarted_with_kept_reply()
    a.claimant_down("b:1", now=10.5)  # b is killed 0.5 s after a's restart (not after the hand-over)
    newer = SessionClaim("d:1", "c", 200, False)
    decision = a.on_claim(newer, connected_here=False)
    assert not isinstance(decision, Answer), decision  # the old session is not handed out again
    assert decision == HandOver(newer, transfer=True)  # (a holds no session: answered without one)


def test_a_restored_reply_still_answers_a_repeat_and_a_recover_of_its_own_claim() -> None:
    a, claim, reply = _restarted_with_kept_reply()
    a.claimant_down("b:1", now=10.5)
    assert a.on_claim(claim, connected_here=False) == Answer(claim, reply)  # repeated: reply lost
    recover = SessionClaim(claim.origin, claim.client_id, claim.claim_id, False, recover=True)
    assert a.on_claim(recover, connected_here=False) == Answer(recover, reply)


def test_a_fresh_hand_over_whose_claimant_goes_down_still_goes_to_the_newer_claim() -> None:
    """The rule the restored replies leave alone (seeds 27, 263): a claimant down right after the
    hand-over may never have got the session, so the client's next claim gets it (at least once)."""
    a = Takeover("a:1", wait_s=0.5, repeat_s=1.0)
    claim = SessionClaim("b:1", "c", 100, False)
    a.on_claim(claim, connected_here=True)
    reply = _reply(claim)
    a.handed_over(claim.claim_id, claim.origin, reply, now=1.0)
    a.claimant_down("b:1", now=1.5)
    newer = SessionClaim("d:1", "c", 200, False)
    decision = a.on_claim(newer, connected_here=False)
    assert isinstance(decision, Answer) and decision.moved_from == (100, "b:1")
