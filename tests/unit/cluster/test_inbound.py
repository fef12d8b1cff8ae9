"""broker.cluster.inbound: a broker speaks only for itself (issue #12). Each forged shape the
issue found is rejected; what honest brokers send passes."""

from __future__ import annotations

from broker.cluster.inbound import envelope_problem, payload_problem
from broker.cluster.messages import (
    ClaimReply,
    Envelope,
    ForwardedBatch,
    ForwardedMessage,
    RetainedSyncRequest,
    RetainedUpdate,
    SessionClaim,
    StreamResend,
)
from broker.core.session import Message

A, B, C = "10.0.0.1:7883", "10.0.0.2:7883", "10.0.0.3:7883"
MESSAGE = Message("t/x", b"p", qos=1)


def _envelope(orig: str, dest: str, body: object) -> Envelope:
    return Envelope(orig, dest, "", "", 0, 8, body)  # type: ignore[arg-type]


def test_an_honest_envelope_passes() -> None:
    assert envelope_problem(A, B, _envelope(A, B, ClaimReply(1, "c", False, None))) is None
    assert envelope_problem(A, B, _envelope(A, B, RetainedSyncRequest(0, 5))) is None
    resend = StreamResend(f"{A}/inc", "cls", (ForwardedMessage(f"{A}/inc", "cls", 1, MESSAGE),))
    assert envelope_problem(A, B, _envelope(A, B, resend)) is None


def test_forged_envelopes_are_rejected() -> None:
    assert "origin" in str(envelope_problem(C, B, _envelope(A, B, ClaimReply(1, "c", True, None))))
    assert "relayed" in str(envelope_problem(A, B, _envelope(A, "203.0.113.9:80", RetainedSyncRequest(0))))
    assert envelope_problem(A, B, _envelope(A, B, SessionClaim(C, "c", 1, False))) is not None
    other_stream = StreamResend(f"{C}/inc", "cls", (ForwardedMessage(f"{C}/inc", "cls", 1, MESSAGE),))
    assert envelope_problem(A, B, _envelope(A, B, other_stream)) is not None
    mixed = StreamResend(f"{A}/inc", "cls", (ForwardedMessage(f"{C}/inc", "cls", 1, MESSAGE),))
    assert envelope_problem(A, B, _envelope(A, B, mixed)) is not None


def test_overlay_payloads_name_their_publisher() -> None:
    assert payload_problem(A, RetainedUpdate(A, 1, MESSAGE)) is None
    assert payload_problem(A, ForwardedMessage(f"{A}/inc", "cls", 1, MESSAGE)) is None
    assert payload_problem(A, SessionClaim(A, "c", 1, False)) is None
    assert payload_problem(A, RetainedUpdate(C, 1, MESSAGE)) is not None
    assert payload_problem(A, ForwardedMessage(f"{C}/inc", "cls", 1, MESSAGE)) is not None
    assert payload_problem(A, SessionClaim(C, "c", 1, False)) is not None


def test_a_batch_holds_only_its_publishers_messages_of_one_stream() -> None:
    ours = ForwardedMessage(f"{A}/inc", "cls", 1, MESSAGE)
    assert payload_problem(A, ForwardedBatch((ours, ForwardedMessage(f"{A}/inc", "cls", 2, MESSAGE)))) is None
    assert payload_problem(A, ForwardedBatch(())) is not None
    assert (
        payload_problem(A, ForwardedBatch((ours, ForwardedMessage(f"{C}/inc", "cls", 2, MESSAGE))))
        is not None
    )
    assert (
        payload_problem(A, ForwardedBatch((ours, ForwardedMessage(f"{A}/inc", "other", 2, MESSAGE))))
        is not None
    )
    assert payload_problem(C, ForwardedBatch((ours,))) is not None
