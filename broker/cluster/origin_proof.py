"""Origin proofs: what a broker originates carries a signature only that broker can make (pure).

Mutual TLS tells a broker which member sent a frame, but not who *originated* what the frame
carries: overlay publications (stream items, retained updates, session claims) are relayed on
multi-hop routes (seed 003 §3.5.4), and a relay - or any member posing as one - could put another
broker's name on an item. An :class:`OriginProof` closes that: the originating broker signs a
canonical byte string of the item with the private key of its own cluster certificate (the one its
mutual TLS uses) and sends the certificate along; every receiver checks the certificate against
the cluster CA bundle, checks that it names the item's origin (``skipmq://host:port`` URI SAN), and
checks the signature. Relays carry the proof unchanged (it is part of the payload they forward).

What is signed (docs/security.md "Origin proofs"): the *canonical bytes* below, built from the
fields of the record - not the protobuf bytes, which a relay decodes and encodes again. A field a
receiver acts on is in them; the envelope's ``ttl`` (decremented by relays) is not. Each string is
length-framed by ``repr`` of a tuple (an injective, self-delimiting encoding), each binary payload
is appended after the tuple with its length inside it, so two different records never give the
same bytes.

* a batch of forwarded messages (also a single one, sent as a batch of one): every message's
  origin, stream, SEQ, low, deps, copies and MQTT message (topic, payload, QoS, retain,
  properties, expiry, accepting broker, publisher): one signature per batch;
* a retained update: origin, version, topic, payload, QoS, properties, expiry (a deletion - empty
  payload - is its topic, version and origin only, so the tombstone a broker rebuilds for a copy
  still verifies);
* a session claim: all of its fields;
* a directed envelope: orig, dest, from, to, ref and every field of its body (acknowledgements,
  interest announcements, claim answers with their sessions, resends, retained copies).

This module decides; it reads no file. :class:`Signer` is built from the broker's certificate and
key (PEM bytes the adapter read), :class:`Verifier` from the CA bundle; ``now_s`` (wall-clock
seconds, for certificate validity) is passed in. The ``cryptography`` package does the
arithmetic (ECDSA P-256 with SHA-256 for the EC keys ``skipmq certs`` makes; Ed25519 and RSA
keys work too).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from broker.cluster.messages import (
    Envelope,
    ForwardedMessage,
    OriginProof,
    RetainedUpdate,
    SessionClaim,
    StreamPosition,
)
from broker.core.session import Message

URI_SCHEME = "skipmq://"
CERT_CACHE_LIMIT = 256  # certificates checked once and remembered (by their DER bytes)


# ---------------------------------------------------------------------------- canonical bytes


def _norm(value: Any, blobs: list[bytes]) -> Any:
    """A value as a tuple of primitives (lists and tuples alike, sets and dicts sorted, binary
    values moved to ``blobs`` with their length left in place, dataclasses field by field)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        blobs.append(data)
        return ("b", len(data))
    if isinstance(value, list | tuple):
        return tuple(_norm(item, blobs) for item in value)
    if isinstance(value, set | frozenset):
        return ("set", tuple(sorted(_norm(item, blobs) for item in value)))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(key), _norm(item, blobs)) for key, item in value.items())))
    if isinstance(value, Message):
        return _message(value, blobs)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if isinstance(value, OriginProof):
            return None  # a nested proof is checked on its own (a retained copy's updates)
        return (
            type(value).__name__,
            tuple(_norm(getattr(value, field.name), blobs) for field in dataclasses.fields(value)),
        )
    raise TypeError(f"no canonical form for {type(value).__name__}")


def _properties(properties: dict[str, Any], blobs: list[bytes]) -> Any:
    if not properties:
        return ()
    out = []
    for key, value in sorted(properties.items()):
        if key == "subscription_identifier" and isinstance(value, int):
            value = (value,)  # (a scalar or a list: the codec writes both alike)
        out.append((key, _norm(value, blobs)))
    return tuple(out)


def _message(message: Message, blobs: list[bytes]) -> tuple[Any, ...]:
    payload = message.payload
    blobs.append(payload if type(payload) is bytes else bytes(payload))
    return (
        message.topic,
        len(payload),
        message.qos,
        bool(message.retain),
        _properties(message.properties, blobs) if message.properties else (),
        message.expiry_at,
        message.origin,
        message.publisher_id,
    )


def _join(head: Any, blobs: list[bytes]) -> bytes:
    return repr(head).encode() + b"".join(blobs)


def forwarded_bytes(messages: Sequence[ForwardedMessage]) -> bytes:
    """The canonical bytes of forwarded messages published together (one signature per batch)."""
    blobs: list[bytes] = []
    items = []
    for forwarded in messages:
        message = forwarded.message
        payload = message.payload
        blobs.append(payload if type(payload) is bytes else bytes(payload))
        items.append(
            (
                forwarded.origin,
                forwarded.stream,
                forwarded.seq,
                forwarded.low,
                message.topic,
                len(payload),
                message.qos,
                bool(message.retain),
                _properties(message.properties, blobs) if message.properties else (),
                message.expiry_at,
                message.origin,
                message.publisher_id,
                tuple((p.origin, p.stream, p.next_seq) for p in forwarded.deps) if forwarded.deps else (),
                tuple(forwarded.copies),
            )
        )
    return _join(("fwd", tuple(items)), blobs)


def retained_bytes(update: RetainedUpdate) -> bytes:
    message = update.message
    if not message.payload:  # a deletion: what a copy's rebuilt tombstone still has
        return _join(("ret-del", update.origin, update.version_ms, message.topic), [])
    blobs = [bytes(message.payload)]
    head = (
        "ret",
        update.origin,
        update.version_ms,
        message.topic,
        len(message.payload),
        message.qos,
        _properties(message.properties, blobs),
        message.expiry_at,
    )
    return _join(head, blobs)


def claim_bytes(claim: SessionClaim) -> bytes:
    head = ("claim", claim.origin, claim.client_id, claim.claim_id, claim.clean_start, claim.username)
    return _join((*head, claim.recover), [])


def envelope_bytes(envelope: Envelope) -> bytes:
    blobs: list[bytes] = []
    head = (
        "env",
        envelope.orig,
        envelope.dest,
        envelope.from_client,
        envelope.to_client,
        envelope.ref,
        _norm(envelope.body, blobs),
    )
    return _join(head, blobs)


def positions_bytes(positions: Iterable[StreamPosition]) -> bytes:
    """(For tests and tools: positions as the envelope encoding writes them.)"""
    return repr(tuple((p.origin, p.stream, p.next_seq) for p in positions)).encode()


# ---------------------------------------------------------------------------- keys


def _sign_with(key: Any, data: bytes) -> bytes:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return bytes(key.sign(data, ec.ECDSA(hashes.SHA256())))
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return bytes(key.sign(data))
    if isinstance(key, rsa.RSAPrivateKey):
        return bytes(key.sign(data, padding.PKCS1v15(), hashes.SHA256()))
    raise ValueError(f"{type(key).__name__} keys cannot sign origin proofs (EC, Ed25519 or RSA)")


def _verify_with(key: Any, signature: bytes, data: bytes) -> None:
    """Raises InvalidSignature (or ValueError for a key type that cannot verify)."""
    if isinstance(key, ec.EllipticCurvePublicKey):
        key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    elif isinstance(key, ed25519.Ed25519PublicKey):
        key.verify(signature, data)
    elif isinstance(key, rsa.RSAPublicKey):
        key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
    else:
        raise ValueError(f"a {type(key).__name__} key cannot make origin proofs")


def peer_ids_named(cert: x509.Certificate) -> frozenset[str]:
    """The peer ids a broker certificate names (its ``skipmq://host:port`` URI SANs)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    return frozenset(
        uri[len(URI_SCHEME) :]
        for uri in san.get_values_for_type(x509.UniformResourceIdentifier)
        if uri.startswith(URI_SCHEME)
    )


class Signer:
    """This broker's signing key and the certificate that binds it to its peer id."""

    def __init__(self, certificate: x509.Certificate, key: Any) -> None:
        public = serialization.PublicFormat.SubjectPublicKeyInfo
        der = serialization.Encoding.DER
        if certificate.public_key().public_bytes(der, public) != key.public_key().public_bytes(der, public):
            raise ValueError("the private key does not belong to the certificate")
        _sign_with(key, b"check")  # a key type that cannot sign fails here, not per message
        self.certificate = certificate.public_bytes(serialization.Encoding.DER)
        self.fingerprint = hashlib.sha256(self.certificate).digest()
        self.peer_ids = peer_ids_named(certificate)
        self._key = key

    @classmethod
    def from_pem(cls, cert_pem: bytes, key_pem: bytes) -> Signer:
        certificate = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        return cls(certificate, key)

    def sign(self, data: bytes) -> OriginProof:
        return OriginProof(_sign_with(self._key, data), self.certificate)


@dataclass(frozen=True, slots=True)
class _Admitted:
    """A certificate that chains to the bundle: its key, names and validity (wall seconds)."""

    key: Any
    peer_ids: frozenset[str]
    not_before: float
    not_after: float
    certificate: bytes  # the one kept (identical proofs share it in memory)


class Verifier:
    """The verify decision against one CA bundle (a new one is built when the bundle changes).

    A certificate is admitted once - issued directly by a CA of the bundle (issuer name and, when
    both carry them, authority/subject key identifiers match; the CA's signature verifies; the CA
    is valid), not a CA itself - and remembered by its DER bytes; then each proof costs one
    signature check."""

    def __init__(self, ca_bundle_pem: bytes) -> None:
        self.authorities = [
            ca
            for ca in x509.load_pem_x509_certificates(ca_bundle_pem)
            if _is_ca(ca)  # (a bundle may hold other certificates: they authorize nothing)
        ]
        if not self.authorities:
            raise ValueError("the CA bundle holds no CA certificate")
        self._admitted: dict[bytes, _Admitted | str] = {}

    def problem(self, peer_id: str, data: bytes, proof: OriginProof, now_s: float) -> str | None:
        """Why ``proof`` does not show that ``peer_id`` signed ``data``, or None."""
        admitted = self._admitted_for(peer_id, proof, now_s)
        if isinstance(admitted, str):
            return admitted
        try:
            _verify_with(admitted.key, proof.signature, data)
        except (InvalidSignature, ValueError):
            return "the signature does not match the content"
        return None

    def certificate_problem(self, peer_id: str, proof: OriginProof, now_s: float) -> str | None:
        """Why ``proof``'s certificate is not one ``peer_id`` may prove with now (every check of
        :meth:`problem` but the signature's), or None. For content whose sender is known to be
        ``peer_id`` by other means (``origin_checks``: a link that proved that id)."""
        admitted = self._admitted_for(peer_id, proof, now_s)
        return admitted if isinstance(admitted, str) else None

    def _admitted_for(self, peer_id: str, proof: OriginProof, now_s: float) -> _Admitted | str:
        admitted = self._admitted.get(proof.certificate)
        if admitted is None:
            admitted = self._admit(proof.certificate, now_s)
        if isinstance(admitted, str):
            return f"the proof's {admitted}"
        if peer_id not in admitted.peer_ids:
            return f"the proof's certificate names {sorted(admitted.peer_ids)}, not {peer_id!r}"
        if not admitted.not_before <= now_s <= admitted.not_after:
            return "the proof's certificate is expired or not yet valid"
        return admitted

    def issued_by_bundle(self, cert: x509.Certificate, now_s: float) -> str | None:
        """Why ``cert`` was not issued by a (valid) CA of the bundle, or None."""
        outcome = self._chain(cert, b"", now_s)
        return outcome if isinstance(outcome, str) else None

    def shared(self, proof: OriginProof) -> OriginProof:
        """``proof`` holding the certificate bytes already kept for it (memory per retained topic)."""
        admitted = self._admitted.get(proof.certificate)
        if isinstance(admitted, _Admitted) and admitted.certificate is not proof.certificate:
            return OriginProof(proof.signature, admitted.certificate)
        return proof

    def _admit(self, der: bytes, now_s: float) -> _Admitted | str:
        if len(self._admitted) >= CERT_CACHE_LIMIT:
            self._admitted.clear()
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            outcome: _Admitted | str = "certificate does not parse"
        else:
            outcome = self._chain(cert, der, now_s)
        if isinstance(outcome, _Admitted) or "expired" not in outcome:
            self._admitted[der] = outcome  # (a CA expiry is re-checked: the bundle may be replaced)
        return outcome

    def _chain(self, cert: x509.Certificate, der: bytes, now_s: float) -> _Admitted | str:
        if _is_ca(cert):
            return "certificate is a CA certificate"
        issuers = [ca for ca in self.authorities if ca.subject == cert.issuer and _key_ids_match(ca, cert)]
        for ca in issuers:
            try:
                cert.verify_directly_issued_by(ca)
            except (ValueError, TypeError, InvalidSignature):
                continue
            if not ca.not_valid_before_utc.timestamp() <= now_s <= ca.not_valid_after_utc.timestamp():
                return "certificate's CA is expired"
            return _Admitted(
                cert.public_key(),
                peer_ids_named(cert),
                cert.not_valid_before_utc.timestamp(),
                cert.not_valid_after_utc.timestamp(),
                der,
            )
        issuer = cert.issuer.rfc4514_string()
        return f"certificate (issuer {issuer!r}) is not signed by a CA of the bundle"


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _key_ids_match(ca: x509.Certificate, cert: x509.Certificate) -> bool:
    """The certificate's authority key identifier names the CA's subject key identifier (when
    both are there: two CAs of one name - a rotation - are told apart by it)."""
    try:
        aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
        ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    except x509.ExtensionNotFound:
        return True
    return aki is None or aki == ski
