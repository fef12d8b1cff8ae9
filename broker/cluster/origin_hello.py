"""Who answers a dial: the link Hello's challenge and its answer (pure; docs/security.md "Who
answers a dial").

Mutual TLS lets the *accepting* broker read the dialer's certificate, and the link checks that it
names the peer id of the dialer's ``Hello``. The *dialing* broker's TLS checks only that the
acceptor's certificate chains to the CA and names the dialed host - any member's certificate names
127.0.0.1 or a shared host - and grpc.aio's client API cannot show the certificate itself. So a
certified node X listening on a crashed broker d's address, saying "d" in its Hello, was taken
for d. The Hello closes that on any runtime:

* the dialer's Hello carries a fresh random challenge (:data:`CHALLENGE_BYTES`, made by the
  adapter: this module takes no randomness);
* the acceptor's Hello answers with an :class:`OriginProof` over :func:`hello_bytes` - a context
  string, the challenge, the dialer's peer id (which the acceptor has checked against the dialer's
  client certificate) and its own - made with the key of its own cluster certificate, plus that
  certificate;
* the dialer checks the proof with the origin proofs' :class:`Verifier` (the certificate chains
  to the CA bundle, is valid and names the **dialed** peer id; the signature matches).

A proof cannot be replayed on another dial (the challenge is fresh), nor borrowed from a real
broker by an impostor relaying the challenge to it: the real broker signs the id of whoever dialed
*it* (the impostor's own, which its client certificate names), not the victim's. The context
string keeps the signature apart from every origin proof made with the same key
(``origin_proof``: their canonical bytes begin with another tag), and one kind of link apart from
the other: the federation's shared links (``broker.adapters.federation.node``: the child's
``LinkRequest`` asks, the parent's ``LinkAccepted`` answers) use the same exchange with
:data:`FEDERATION_CONTEXT`, so an answer made for a cluster dial never proves a federation one
(a broker may hold one key for both).

``mode`` follows ``cluster.origin_proofs``: ``required`` refuses an acceptor that does not answer
or answers wrongly; ``optional`` (a rolling upgrade from a version whose Hello does not answer)
refuses only a wrong answer and takes a missing one, reported as ``unproven``; ``off`` asks
nothing. A broker with keys answers whenever it is asked, whatever its own mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker.cluster.messages import OriginProof
from broker.cluster.origin_proof import Signer, Verifier, _join

HELLO_CONTEXT = "skipmq.v1 PeerLink Hello: the acceptor answers the dialer's challenge"
FEDERATION_CONTEXT = "skipmq.v1 Federation LinkAccepted: the parent answers the child's challenge"
CHALLENGE_BYTES = 32  # what a dialer sends
MIN_CHALLENGE_BYTES = 16  # what an acceptor answers (shorter: not answered)
MAX_CHALLENGE_BYTES = 64

# outcomes of a dial's check (skipmq_cluster_link_dial_refused_total{reason} names the refusals)
PROVEN = "proven"
UNPROVEN = "unproven"  # no answer, taken (mode optional)
NO_PROOF = "no_proof"  # no answer, refused (mode required)
WRONG_PROOF = "wrong_proof"  # an answer that does not prove the dialed id, refused in any mode
NOT_ASKED = "not_asked"  # mode off
WRONG_PEER_ID = "wrong_peer_id"  # the acceptor's Hello names another peer id (checked by the link)
DIAL_REFUSAL_REASONS = (NO_PROOF, WRONG_PROOF, WRONG_PEER_ID)


def hello_bytes(challenge: bytes, dialer_id: str, acceptor_id: str, context: str = HELLO_CONTEXT) -> bytes:
    """What the acceptor signs: injective in its parts, and never equal to an origin proof's
    canonical bytes (their first tuple element is another tag) nor to another link kind's
    (``context``)."""
    return _join(("hello", context, dialer_id, acceptor_id, len(challenge)), [bytes(challenge)])


@dataclass(frozen=True, slots=True)
class DialVerdict:
    """The dialer's decision on the acceptor's answer: ``outcome`` (one of the constants above),
    ``refused`` (the link must not come up) and ``problem`` (why, for the log)."""

    outcome: str
    problem: str = ""

    @property
    def refused(self) -> bool:
        return self.outcome in (NO_PROOF, WRONG_PROOF)


class LinkIdentity:
    """One broker's side of the Hello challenge (see the module docstring); the keys come from
    callables (``broker.adapters.origin_keys`` re-reads the certificate files when they change);
    ``context`` names the kind of link (:data:`HELLO_CONTEXT`, :data:`FEDERATION_CONTEXT`)."""

    def __init__(
        self,
        mode: str,
        signer: Callable[[], Signer | None],
        verifier: Callable[[], Verifier | None],
        context: str = HELLO_CONTEXT,
    ) -> None:
        if mode not in ("required", "optional", "off"):
            raise ValueError(f"mode must be 'required', 'optional' or 'off', got {mode!r}")
        self.mode = mode
        self.asks = mode != "off"  # does this broker's dialer send a challenge
        self._signer = signer
        self._verifier = verifier
        self.context = context

    def answer(self, challenge: bytes, dialer_id: str, own_id: str) -> OriginProof | None:
        """The proof for a dialer's challenge, or None (not asked; a challenge of a bad length)."""
        if not MIN_CHALLENGE_BYTES <= len(challenge) <= MAX_CHALLENGE_BYTES:
            return None
        signer = self._signer()
        return (
            None if signer is None else signer.sign(hello_bytes(challenge, dialer_id, own_id, self.context))
        )

    def check(
        self,
        challenge: bytes,
        dialer_id: str,
        dialed_id: str,
        proof: OriginProof | None,
        now_s: float,
    ) -> DialVerdict:
        """The dialer's verdict on the acceptor's answer (``now_s``: wall-clock seconds)."""
        if not self.asks:
            return DialVerdict(NOT_ASKED)
        if proof is None or not proof.signature:
            if self.mode == "required":
                return DialVerdict(NO_PROOF, "the acceptor's Hello does not answer the challenge")
            return DialVerdict(UNPROVEN, "the acceptor's Hello does not answer the challenge")
        verifier = self._verifier()
        if verifier is None:
            return DialVerdict(WRONG_PROOF, "no CA bundle to check the answer against")
        data = hello_bytes(challenge, dialer_id, dialed_id, self.context)
        problem = verifier.problem(dialed_id, data, proof, now_s)
        if problem is not None:
            return DialVerdict(WRONG_PROOF, problem)
        return DialVerdict(PROVEN)
