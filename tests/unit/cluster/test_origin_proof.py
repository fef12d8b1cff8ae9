"""Origin proofs (broker/cluster/origin_proof.py, origin_checks.py): what is signed survives the
wire and relays, and the verify decision refuses every forgery a certified member could make.

Certificates are made with ``skipmq certs``' own functions; items go through the real wire codec
(what relays and receivers decode), so "canonical bytes" are checked where they matter: after a
decode and a re-encode."""

from __future__ import annotations

import datetime
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from broker.adapters.transport import wire
from broker.adapters.transport.tls import issue_broker_cert, make_ca
from broker.cluster.messages import (
    ClaimReply,
    ClassInterest,
    Envelope,
    ForwardedBatch,
    ForwardedMessage,
    OriginProof,
    RetainedSyncReply,
    RetainedSyncRequest,
    RetainedUpdate,
    SessionClaim,
    StreamAck,
    StreamPosition,
    StreamResend,
    StreamRet,
)
from broker.cluster.origin_checks import OriginChecks
from broker.cluster.origin_proof import (
    Signer,
    Verifier,
    claim_bytes,
    envelope_bytes,
    forwarded_bytes,
    retained_bytes,
)
from broker.core.session import Message, OutEntry, SessionSnapshot, SubOptions
from overlay import messages as om

A, B, X = "10.0.0.1:7883", "10.0.0.2:7883", "10.0.0.9:7883"


def _now() -> float:
    """The time a verifier is asked at: now, not at import (certificates made by a test are valid
    from 5 minutes before they were made, and a test may run long after the module was imported)."""
    return datetime.datetime.now(datetime.UTC).timestamp()


def _signer(ca: Path, peer_id: str, name: str) -> Signer:
    cert, key = issue_broker_cert(ca, peer_id, name=name)
    return Signer.from_pem(cert.read_bytes(), key.read_bytes())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("pki")
    make_ca(root / "ca")
    make_ca(root / "other")  # same base name, another CA: a look-alike
    return {
        "ca": root / "ca",
        "verifier": Verifier((root / "ca" / "ca.pem").read_bytes()),
        "a": _signer(root / "ca", A, "a"),
        "x": _signer(root / "ca", X, "x"),  # a certified member: the attacker
        "lookalike_a": _signer(root / "other", A, "a"),  # names a, from a look-alike CA
    }


def _message(n: int, **properties: object) -> Message:
    return Message(f"s/{n}", b"payload %d" % n, 1, False, dict(properties), None, A, "pub-1")


def _forwarded(n: int, **properties: object) -> ForwardedMessage:
    return ForwardedMessage(f"{A}/abc", "=s", n, _message(n, **properties), low=max(1, n - 2))


def _over_the_wire(item: object) -> object:
    return wire.decode_item(wire.encode_item(item))


def _pub(payload: object) -> om.PUB:
    key = ("=s", 0, A)
    return om.PUB(("=s", 1, B), (key, 5), "=s", payload, 7, (key, 5), 1, (), ("~",), 3)


def test_canonical_bytes_survive_the_wire_for_every_signed_kind() -> None:
    causal = ForwardedMessage(
        f"{A}/abc",
        "=f",
        4,
        _message(4, user_property=[("k", "v"), ("k", "w")], content_type="t", correlation_data=b"\x00\x01"),
        2,
        (StreamPosition(f"{B}/d", "=f", 9),),
        (("=f", 4), ("*0:", 11)),
    )
    batch = ForwardedBatch((_forwarded(1), _forwarded(2, message_expiry_interval=60), causal))
    decoded = _over_the_wire(_pub(batch)).payload  # type: ignore[attr-defined]
    assert forwarded_bytes(decoded.messages) == forwarded_bytes(batch.messages)
    retained = RetainedUpdate(
        A, 1234, Message("r/t", b"v", 1, True, {"payload_format_indicator": 1}, 99.5, A)
    )
    assert retained_bytes(_over_the_wire(_pub(retained)).payload) == retained_bytes(retained)  # type: ignore[attr-defined]
    claim = SessionClaim(A, "c1", 77, False, "alice", True)
    assert claim_bytes(_over_the_wire(_pub(claim)).payload) == claim_bytes(claim)  # type: ignore[attr-defined]
    snapshot = SessionSnapshot(
        "c1",
        5,
        300,
        "alice",
        [
            SubOptions("s/#", 1, True, False, 2, 7, None, "s/#"),
            SubOptions("$share/g/t", 2, share_group="g", match_filter="t"),
        ],
        [OutEntry(_message(1), 1, False, [7], 3, 12, 1, ("g", "t")), OutEntry(_message(2), 1, True, [])],
        {3, 9},
        13,
    )
    bodies: list[object] = [
        ClaimReply(77, "c1", True, snapshot, (StreamPosition(f"{A}/abc", "=s", 5),)),
        ClaimReply(78, "c1", False, None, refused=True),
        StreamAck((StreamPosition(f"{A}/abc", "=s", 5),), (StreamPosition(f"{A}/abc", "=t", 2),)),
        StreamRet(f"{A}/abc", "=s", 1, 4),
        StreamResend(f"{A}/abc", "=s", (_forwarded(1), _forwarded(2)), 1),
        ClassInterest(("=s",), ("=t",), True, 5, 6, leaving=True),
        RetainedSyncRequest(3, 2**63),
        RetainedSyncReply(3, (retained, replace(retained, proof=OriginProof(b"s", b"c"))), True),
        claim,
    ]
    for body in bodies:
        envelope = Envelope(A, B, "", "c1", 77, 8, body)  # type: ignore[arg-type]
        decoded_envelope = _over_the_wire(envelope)
        assert envelope_bytes(decoded_envelope) == envelope_bytes(envelope), body  # type: ignore[arg-type]
        relayed = replace(decoded_envelope, ttl=3)  # type: ignore[type-var]
        assert envelope_bytes(relayed) == envelope_bytes(envelope)  # ttl is not signed


def test_a_deletion_is_signed_as_what_a_copy_rebuilds() -> None:
    deleted = RetainedUpdate(A, 5, Message("r/t", b"", 1, True, {"content_type": "x"}, None, "z"))
    rebuilt = RetainedUpdate(A, 5, Message("r/t", b"", qos=0, retain=True, origin=A))
    assert retained_bytes(deleted) == retained_bytes(rebuilt)
    assert retained_bytes(deleted) != retained_bytes(replace(deleted, version_ms=6))


def test_different_items_never_share_their_bytes() -> None:
    one = _forwarded(1)
    assert forwarded_bytes((one,)) != forwarded_bytes((replace_message(one, b"payload 2"),))
    assert forwarded_bytes((one,)) != forwarded_bytes(
        (ForwardedMessage(one.origin, one.stream, 2, one.message, one.low),)
    )
    # a boundary moved between fields is another item (strings and payloads are length-framed)
    left = ForwardedMessage("a/b", "c", 1, Message("t", b"xy", origin="o"))
    right = ForwardedMessage("a/b", "c", 1, Message("t", b"x", origin="o"))
    assert forwarded_bytes((left,)) != forwarded_bytes((right,))
    assert forwarded_bytes((one, one)) != forwarded_bytes((one,))


def replace_message(forwarded: ForwardedMessage, payload: bytes) -> ForwardedMessage:
    message = forwarded.message
    return ForwardedMessage(
        forwarded.origin, forwarded.stream, forwarded.seq, replace(message, payload=payload), forwarded.low
    )


def test_the_verify_decision(pki: dict[str, object]) -> None:
    verifier: Verifier = pki["verifier"]  # type: ignore[assignment]
    a: Signer = pki["a"]  # type: ignore[assignment]
    x: Signer = pki["x"]  # type: ignore[assignment]
    lookalike: Signer = pki["lookalike_a"]  # type: ignore[assignment]
    data = forwarded_bytes((_forwarded(1),))
    good = a.sign(data)
    assert verifier.problem(A, data, good, _now()) is None
    # the attacker signs with its own (valid) key: its certificate does not name a
    problem = verifier.problem(A, data, x.sign(data), _now())
    assert problem is not None and "names" in problem
    # a's proof on other content (the forger changed the message, kept a's signature)
    tampered = forwarded_bytes((replace_message(_forwarded(1), b"forged"),))
    assert verifier.problem(A, tampered, good, _now()) == "the signature does not match the content"
    # a's real certificate with the attacker's signature
    assert (
        verifier.problem(A, data, OriginProof(x.sign(data).signature, good.certificate), _now()) is not None
    )
    # a certificate naming a, from a CA of the same base name that is not in the bundle
    problem = verifier.problem(A, data, lookalike.sign(data), _now())
    assert problem is not None and "not signed by a CA of the bundle" in problem
    # outside its validity
    assert "expired" in (verifier.problem(A, data, good, _now() + 400 * 86400) or "")
    assert verifier.problem(A, data, OriginProof(good.signature, b"not a certificate"), _now()) is not None


def test_a_bundle_of_two_cas_checks_certificates_of_both(tmp_path: Path) -> None:
    make_ca(tmp_path / "old")
    make_ca(tmp_path / "new")
    old, new = (tmp_path / "old" / "ca.pem").read_bytes(), (tmp_path / "new" / "ca.pem").read_bytes()
    assert x509.load_pem_x509_certificate(old).subject != x509.load_pem_x509_certificate(new).subject
    bundle = Verifier(old + new)
    data = b"content"
    for ca in ("old", "new"):
        signer = _signer(tmp_path / ca, A, f"a-{ca}")
        assert bundle.problem(A, data, signer.sign(data), _now()) is None
    assert Verifier(new).problem(A, data, _signer(tmp_path / "old", A, "a2").sign(data), _now()) is not None


def test_a_ca_certificate_cannot_sign_for_a_broker(tmp_path: Path) -> None:
    make_ca(tmp_path / "ca")
    ca_pem = (tmp_path / "ca" / "ca.pem").read_bytes()
    ca_signer = Signer.from_pem(ca_pem, (tmp_path / "ca" / "ca.key").read_bytes())
    problem = Verifier(ca_pem).problem(A, b"d", ca_signer.sign(b"d"), _now())
    assert problem is not None and "CA certificate" in problem


def test_a_key_that_is_not_the_certificates_is_refused(tmp_path: Path) -> None:
    make_ca(tmp_path / "ca")
    cert, _key = issue_broker_cert(tmp_path / "ca", A, name="a")
    other = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(ValueError, match="does not belong"):
        Signer(x509.load_pem_x509_certificate(cert.read_bytes()), other)


def _checks(signer: Signer | None, verifier: Verifier, mode: str = "required") -> OriginChecks:
    return OriginChecks(mode, lambda: signer, lambda: verifier)


def test_origin_checks_sign_what_is_originated_and_refuse_forgeries(pki: dict[str, object]) -> None:
    verifier: Verifier = pki["verifier"]  # type: ignore[assignment]
    at_a = _checks(pki["a"], verifier)  # type: ignore[arg-type]
    at_b = _checks(None, verifier)
    at_x = _checks(pki["x"], verifier)  # type: ignore[arg-type]
    single = at_a.sign_payload(_forwarded(1))
    assert isinstance(single, ForwardedBatch) and single.proof is not None  # a batch of one
    relayed = _over_the_wire(_pub(single)).payload  # type: ignore[attr-defined]
    assert at_b.check_payload(relayed, _now()) is None
    # x forges a's stream: signed by x, or with a's proof from another batch, or with none
    forged = ForwardedBatch((replace_message(_forwarded(2), b"forged"),))
    for attempt in (at_x.sign_payload(forged), replace(forged, proof=single.proof), forged, _forwarded(2)):
        refusal = at_b.check_payload(attempt, _now())
        assert refusal is not None and refusal.kind == "forwarded" and refusal.origin == A, attempt
    # optional: an unsigned item passes, a wrong proof still does not
    lenient = _checks(None, verifier, "optional")
    assert lenient.check_payload(forged, _now()) is None
    assert lenient.check_payload(at_x.sign_payload(forged), _now()) is not None
    # retained updates, claims and envelopes alike
    update = RetainedUpdate(A, 10, Message("r", b"v", retain=True))
    assert at_b.check_payload(at_a.sign_payload(update), _now()) is None
    assert at_b.check_payload(at_x.sign_payload(update), _now()) is not None
    claim = SessionClaim(A, "victim", 5, False)
    assert at_b.check_payload(at_a.sign_payload(claim), _now()) is None
    assert (at_b.check_payload(at_x.sign_payload(claim), _now()) or None) is not None
    ack = Envelope(A, B, "", "", 0, 8, StreamAck((StreamPosition(f"{A}/abc", "=s", 99),)))
    assert at_b.check_envelope(at_a.sign_envelope(ack), _now()) is None
    refusal = at_b.check_envelope(at_x.sign_envelope(ack), _now())
    assert refusal is not None and refusal.kind == "envelope"
    assert at_b.stats.origin_proofs_verified == 4
    assert at_a.stats.origin_proofs_signed == 4


def test_proof_bytes_round_trip_for_the_store(pki: dict[str, object]) -> None:
    proof = pki["a"].sign(b"x")  # type: ignore[attr-defined]
    assert OriginProof.from_bytes(proof.to_bytes()) == proof
    with pytest.raises(ValueError):
        OriginProof.from_bytes(b"\x00\x09abc")


def test_an_rsa_certificate_signs_too(tmp_path: Path) -> None:
    """A CA made elsewhere (openssl, cert-manager) may issue RSA keys: they work as well."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    make_ca(tmp_path / "ca")
    ca_cert = x509.load_pem_x509_certificate((tmp_path / "ca" / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((tmp_path / "ca" / "ca.key").read_bytes(), password=None)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.fromtimestamp(_now(), datetime.UTC)  # the verifier is asked now
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"skipmq://{A}")]), False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    signer = Signer(cert, key)
    verifier = Verifier((tmp_path / "ca" / "ca.pem").read_bytes())
    assert verifier.problem(A, b"d", signer.sign(b"d"), _now()) is None
