"""Who answers a dial (broker/cluster/origin_hello.py): the Hello challenge's answer proves the
dialed peer id, and nothing an impostor or a relaying member can make passes the dialer's check.

Certificates are made with ``skipmq certs``' own functions; the answer goes through the real wire
codec (the Hello a dialer decodes)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

from broker.adapters.transport import wire
from broker.adapters.transport.tls import issue_broker_cert, make_ca
from broker.cluster.messages import ClassInterest, Envelope, OriginProof, SessionClaim
from broker.cluster.origin_hello import (
    CHALLENGE_BYTES,
    FEDERATION_CONTEXT,
    NO_PROOF,
    NOT_ASKED,
    PROVEN,
    UNPROVEN,
    WRONG_PROOF,
    LinkIdentity,
    hello_bytes,
)
from broker.cluster.origin_proof import Signer, Verifier, claim_bytes, envelope_bytes

A, D, X = "10.0.0.1:7883", "10.0.0.4:7883", "10.0.0.9:7883"


def _now() -> float:
    return datetime.datetime.now(datetime.UTC).timestamp()


def _identity(ca: Path, peer_id: str, name: str, mode: str = "required") -> LinkIdentity:
    cert, key = issue_broker_cert(ca, peer_id, name=name)
    signer = Signer.from_pem(cert.read_bytes(), key.read_bytes())
    verifier = Verifier((ca / "ca.pem").read_bytes())
    return LinkIdentity(mode, lambda: signer, lambda: verifier)


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    make_ca(tmp_path / "ca")
    return tmp_path / "ca"


def _through_the_wire(acceptor_id: str, proof: OriginProof | None) -> OriginProof | None:
    return wire.decode_hello(wire.encode_hello(acceptor_id, 16, identity_proof=proof)).identity_proof


def test_the_dialed_broker_proves_its_id_and_an_impostor_cannot(ca: Path, tmp_path: Path) -> None:
    dialer = _identity(ca, A, "a")
    real_d = _identity(ca, D, "d")
    impostor = _identity(ca, X, "x")  # certified, for its own id, listening on d's address
    challenge = os.urandom(CHALLENGE_BYTES)
    good = _through_the_wire(D, real_d.answer(challenge, A, D))
    assert dialer.check(challenge, A, D, good, _now()).outcome == PROVEN
    # the impostor signs with its own key: its certificate does not name d
    verdict = dialer.check(challenge, A, D, _through_the_wire(D, impostor.answer(challenge, A, D)), _now())
    assert verdict.refused and verdict.outcome == WRONG_PROOF and "not '10.0.0.4:7883'" in verdict.problem
    # d's answer to another dial (replayed) or to the impostor's own dial (the challenge relayed
    # to the real d, which signs the id of whoever dialed it): refused
    other = os.urandom(CHALLENGE_BYTES)
    for proof in (real_d.answer(other, A, D), real_d.answer(challenge, X, D)):
        verdict = dialer.check(challenge, A, D, proof, _now())
        assert verdict.refused and "signature does not match" in verdict.problem, verdict
    # d's certificate with a signature made by the impostor's key
    assert good is not None
    forged = OriginProof(impostor.answer(challenge, A, D).signature, good.certificate)  # type: ignore[union-attr]
    assert dialer.check(challenge, A, D, forged, _now()).refused
    # a certificate for d from another CA
    make_ca(tmp_path / "other")
    foreign = _identity(tmp_path / "other", D, "d2")
    verdict = dialer.check(challenge, A, D, foreign.answer(challenge, A, D), _now())
    assert verdict.refused and "not signed by a CA of the bundle" in verdict.problem
    # an expired answer certificate: checked at a time after its validity
    later = _now() + 400 * 86400
    assert dialer.check(challenge, A, D, good, later).refused


def test_no_answer_follows_the_mode(ca: Path) -> None:
    challenge = os.urandom(CHALLENGE_BYTES)
    required = _identity(ca, A, "a")
    verdict = required.check(challenge, A, D, None, _now())
    assert verdict.refused and verdict.outcome == NO_PROOF
    assert required.check(challenge, A, D, OriginProof(b"", b""), _now()).outcome == NO_PROOF
    optional = _identity(ca, A, "a2", mode="optional")
    verdict = optional.check(challenge, A, D, None, _now())
    assert not verdict.refused and verdict.outcome == UNPROVEN
    impostor = _identity(ca, X, "x")  # optional still refuses a wrong answer
    assert optional.check(challenge, A, D, impostor.answer(challenge, A, D), _now()).refused
    off = _identity(ca, A, "a3", mode="off")
    assert not off.asks and off.check(b"", A, D, None, _now()).outcome == NOT_ASKED
    # a broker whose own mode is off still answers (a cluster in the middle of a mode change)
    assert off.answer(challenge, X, A) is not None


def test_challenges_of_a_bad_length_are_not_answered_nor_decoded(ca: Path) -> None:
    d = _identity(ca, D, "d")
    assert d.answer(b"", A, D) is None
    assert d.answer(b"x" * 15, A, D) is None
    assert d.answer(b"x" * 65, A, D) is None
    assert d.answer(b"x" * 64, A, D) is not None
    with pytest.raises(wire.WireError, match="challenge"):
        wire.decode_hello(wire.encode_hello(A, 16, challenge=b"x" * 65))
    hello = wire.decode_hello(wire.encode_hello(A, 16, 8080, challenge=b"c" * 32))
    assert (hello.challenge, hello.identity_proof, hello.http_port) == (b"c" * 32, None, 8080)


def test_the_signed_bytes_are_apart_from_every_origin_proof() -> None:
    challenge = b"\x00" * CHALLENGE_BYTES
    signed = hello_bytes(challenge, A, D)
    assert signed.startswith(b"('hello', ")
    assert hello_bytes(challenge, A, D) != hello_bytes(challenge, D, A)
    assert hello_bytes(challenge, A + "1", D) != hello_bytes(challenge, A, "1" + D)
    for other in (
        claim_bytes(SessionClaim(A, "c", 1, False)),
        envelope_bytes(Envelope(A, D, "", "", 0, 8, ClassInterest(()))),
    ):
        assert not other.startswith(b"('hello'")


def test_an_answer_for_one_kind_of_link_does_not_prove_the_other(ca: Path) -> None:
    """The federation's links use the same exchange with their own context string: a broker that
    holds one key for both answers a cluster dial with something no federation dialer takes, and
    the other way round (and each kind still proves itself)."""
    cert, key = issue_broker_cert(ca, D, name="d-both")
    signer = Signer.from_pem(cert.read_bytes(), key.read_bytes())
    verifier = Verifier((ca / "ca.pem").read_bytes())
    cluster_d = LinkIdentity("required", lambda: signer, lambda: verifier)
    federation_d = LinkIdentity("required", lambda: signer, lambda: verifier, context=FEDERATION_CONTEXT)
    cluster_a = _identity(ca, A, "a")
    federation_a = LinkIdentity(
        "required", lambda: None, lambda: Verifier((ca / "ca.pem").read_bytes()), context=FEDERATION_CONTEXT
    )
    challenge = os.urandom(CHALLENGE_BYTES)
    for_cluster = cluster_d.answer(challenge, A, D)
    for_federation = federation_d.answer(challenge, A, D)
    assert cluster_a.check(challenge, A, D, for_cluster, _now()).outcome == PROVEN
    assert federation_a.check(challenge, A, D, for_federation, _now()).outcome == PROVEN
    crossed = federation_a.check(challenge, A, D, for_cluster, _now())
    assert crossed.outcome == WRONG_PROOF and crossed.refused
    assert "signature" in crossed.problem
    assert cluster_a.check(challenge, A, D, for_federation, _now()).outcome == WRONG_PROOF
    assert hello_bytes(challenge, A, D) != hello_bytes(challenge, A, D, FEDERATION_CONTEXT)
