"""Origin checks: the cluster engine's side of origin proofs (pure; docs/security.md "Origin proofs").

The engine calls :class:`OriginChecks` where it originates and where it receives:

* **signing** - an overlay publication of ours (``sign_payload``: a forwarded message, sent as a
  batch of one, or a batch; a retained update; a session claim) and every directed envelope we
  send (``sign_envelope``: acknowledgements, interest announcements, claim answers, resends,
  retained copies, claim repeats, requests). One signature per publication or envelope, never per
  message of a batch.
* **checking** - what the overlay delivers (``check_payload``; after any number of relays, which
  carry the proof unchanged), every envelope (``check_envelope``: bound to the link by the
  transport *and* to its sender's key by the proof), and each retained update of a retained-store
  copy (``check_retained``: a copy relays other brokers' updates with their own proofs).

**Straight from a proven link.** A forwarded batch or an envelope whose origin is the very broker
whose link delivered it (``link_peer``: the transport's link to it proved that id with the key of
that broker's cluster certificate - mutual TLS on an accepted link, the Hello's challenge on a
dialed one; ``broker.adapters.transport.link``) is authenticated by that link already: only
that broker can write on it. Its proof is still required and its certificate checked as always
(chains to the bundle in force, names the origin, valid now: a revoked or rotated-out member's
items are refused as before), but the signature arithmetic is skipped (one ECDSA verification,
~64 us here, and the canonical bytes; counted in ``stats.origin_proofs_link_bound``). The proof
travels on unchanged, so a broker it is relayed to checks the signature. An item whose origin is
another broker than the link's - a relay's, or a forgery - is verified in full.

``mode`` is ``cluster.origin_proofs``: ``required`` refuses what carries no proof; ``optional``
only what carries a wrong one (a rolling upgrade from a version that does not sign). The keys come
from callables (``broker.adapters.origin_keys`` re-reads the certificate files when they change):
this module reads no file and takes the wall clock as an argument.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from broker.cluster.inbound import origin_peer
from broker.cluster.messages import (
    Envelope,
    ForwardedBatch,
    ForwardedMessage,
    OriginProof,
    RetainedUpdate,
    SessionClaim,
)
from broker.cluster.origin_proof import (
    Signer,
    Verifier,
    claim_bytes,
    envelope_bytes,
    forwarded_bytes,
    retained_bytes,
)
from broker.cluster.stats import ClusterStats

MODES = ("required", "optional", "off")
# what a refusal names (skipmq_cluster_origin_proofs_rejected_total{kind})
KIND_FORWARDED = "forwarded"
KIND_RETAINED = "retained"
KIND_CLAIM = "claim"
KIND_ENVELOPE = "envelope"
KINDS = (KIND_FORWARDED, KIND_RETAINED, KIND_CLAIM, KIND_ENVELOPE)


@dataclass(frozen=True, slots=True)
class Refusal:
    """An item refused: its kind, the broker it names as its origin, and why."""

    kind: str
    origin: str
    problem: str


class OriginChecks:
    """See the module docstring. Proofs made and checked are counted in ``stats`` (the engine's,
    once bound)."""

    def __init__(
        self,
        mode: str,
        signer: Callable[[], Signer | None],
        verifier: Callable[[], Verifier | None],
        stats: ClusterStats | None = None,
    ) -> None:
        if mode not in ("required", "optional"):
            raise ValueError(f"origin proofs mode must be 'required' or 'optional', got {mode!r}")
        self.mode = mode
        self.required = mode == "required"
        self._signer = signer
        self._verifier = verifier
        self.stats = stats if stats is not None else ClusterStats()

    # ------------------------------------------------------------------ signing
    def _sign(self, data: bytes) -> OriginProof | None:
        signer = self._signer()
        if signer is None:
            return None  # (no usable key: receivers that require proofs refuse it, and say so)
        self.stats.origin_proofs_signed += 1
        return signer.sign(data)

    def certificate(self) -> bytes | None:
        """The DER certificate proofs are made with now (a proof under another one is re-made)."""
        signer = self._signer()
        return signer.certificate if signer is not None else None

    def sign_payload(self, payload: object) -> object:
        """An overlay publication of ours, with its proof (a single forwarded message becomes a
        batch of one: the batch is what carries a proof)."""
        kind = type(payload)
        if kind is ForwardedBatch:
            batch: ForwardedBatch = payload  # type: ignore[assignment]
            if batch.proof is not None:
                return batch
            return ForwardedBatch(batch.messages, self._sign(forwarded_bytes(batch.messages)))
        if kind is ForwardedMessage:
            messages = (payload,)
            return ForwardedBatch(messages, self._sign(forwarded_bytes(messages)))  # type: ignore[arg-type]
        if kind is RetainedUpdate:
            update: RetainedUpdate = payload  # type: ignore[assignment]
            return update if update.proof is not None else self.sign_retained(update)
        if kind is SessionClaim:
            claim: SessionClaim = payload  # type: ignore[assignment]
            if claim.proof is not None:
                return claim
            return dataclasses.replace(claim, proof=self._sign(claim_bytes(claim)))
        return payload

    def sign_retained(self, update: RetainedUpdate) -> RetainedUpdate:
        return dataclasses.replace(update, proof=self._sign(retained_bytes(update)))

    def sign_envelope(self, envelope: Envelope) -> Envelope:
        return dataclasses.replace(envelope, proof=self._sign(envelope_bytes(envelope)))

    # ------------------------------------------------------------------ checking
    def check_payload(self, payload: object, now_s: float, link_peer: str | None = None) -> Refusal | None:
        """Why an overlay payload is refused (its proof does not show its origin made it), or None.
        ``link_peer``: the broker whose proven link delivered this very payload (module docstring)."""
        kind = type(payload)
        if kind is ForwardedBatch:
            batch: ForwardedBatch = payload  # type: ignore[assignment]
            if not batch.messages:
                return None  # (refused as malformed by the inbound validation)
            origin = origin_peer(batch.messages[0].origin)
            return self._check(
                KIND_FORWARDED,
                origin,
                batch.proof,
                lambda: forwarded_bytes(batch.messages),
                now_s,
                link_bound=origin == link_peer,  # (all of one stream: ``inbound.payload_problem``)
            )
        if kind is ForwardedMessage:  # unsigned: a sender that does not make proofs
            forwarded: ForwardedMessage = payload  # type: ignore[assignment]
            return self._check(KIND_FORWARDED, origin_peer(forwarded.origin), None, bytes, now_s)
        if kind is RetainedUpdate:
            return self.check_retained(payload, now_s)  # type: ignore[arg-type]
        if kind is SessionClaim:
            claim: SessionClaim = payload  # type: ignore[assignment]
            return self._check(KIND_CLAIM, claim.origin, claim.proof, lambda: claim_bytes(claim), now_s)
        return None

    def check_retained(self, update: RetainedUpdate, now_s: float) -> Refusal | None:
        return self._check(KIND_RETAINED, update.origin, update.proof, lambda: retained_bytes(update), now_s)

    def check_envelope(
        self, envelope: Envelope, now_s: float, link_peer: str | None = None
    ) -> Refusal | None:
        return self._check(
            KIND_ENVELOPE,
            envelope.orig,
            envelope.proof,
            lambda: envelope_bytes(envelope),
            now_s,
            link_bound=envelope.orig == link_peer,
        )

    def _check(
        self,
        kind: str,
        origin: str,
        proof: OriginProof | None,
        data: Callable[[], bytes],
        now_s: float,
        link_bound: bool = False,
    ) -> Refusal | None:
        if proof is None:
            if self.required:
                return Refusal(kind, origin, "no origin proof (cluster.origin_proofs = required)")
            return None
        verifier = self._verifier()
        if verifier is None:
            return Refusal(kind, origin, "no CA bundle to check origin proofs against")
        if link_bound:
            problem = verifier.certificate_problem(origin, proof, now_s)
            if problem is not None:
                return Refusal(kind, origin, problem)
            self.stats.origin_proofs_link_bound += 1
            return None
        problem = verifier.problem(origin, data(), proof, now_s)
        if problem is not None:
            return Refusal(kind, origin, problem)
        self.stats.origin_proofs_verified += 1
        return None

    def kept(self, proof: OriginProof | None) -> OriginProof | None:
        """``proof`` as kept in memory (with a retained version): certificate bytes shared."""
        verifier = self._verifier()
        if proof is None or verifier is None:
            return proof
        return verifier.shared(proof)
