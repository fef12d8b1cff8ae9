"""The keys of origin proofs, read from the cluster's TLS files (docs/security.md "Origin proofs").

A broker signs what it originates with the private key of its cluster certificate
(``cluster.tls_cert_file`` / ``cluster.tls_key_file``) and checks what others originated against
the CA bundle (``cluster.tls_ca_file``) - the same files its mutual TLS uses, so nothing else needs
to be made or distributed. The files are re-read when they change (checked at most every
``RECHECK_S``; a certificate rotation, a CA bundle [old, new] during a CA rotation); a half-written
or mismatched pair is not taken (logged; the previous keys stay in force), as for the TLS links.

The decisions live in the pure ``broker.cluster.origin_checks`` / ``origin_proof``; this module
only reads files.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from broker.cluster.origin_checks import OriginChecks
from broker.cluster.origin_hello import FEDERATION_CONTEXT, LinkIdentity
from broker.cluster.origin_proof import Signer, Verifier

if TYPE_CHECKING:
    from broker.config import ClusterConfig, FederationConfig

log = logging.getLogger("skipmq.cluster")

RECHECK_S = 1.0


class ProofKeys:
    """The current :class:`Signer` and :class:`Verifier` from three PEM files."""

    def __init__(
        self,
        ca_file: str,
        cert_file: str,
        key_file: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ca_file, self.cert_file, self.key_file = ca_file, cert_file, key_file
        self._clock = clock
        self._checked_at = clock()
        self._signer_mtimes = self._mtimes(cert_file, key_file)
        self._ca_mtime = self._mtimes(ca_file)
        # at start a bad file is an error (the broker refuses to start: broker.certs checks first)
        self._signer: Signer = Signer.from_pem(Path(cert_file).read_bytes(), Path(key_file).read_bytes())
        self._verifier: Verifier = Verifier(Path(ca_file).read_bytes())

    @staticmethod
    def _mtimes(*paths: str) -> tuple[int, ...]:
        return tuple(os.stat(path).st_mtime_ns for path in paths)

    def _recheck(self) -> None:
        now = self._clock()
        if now - self._checked_at < RECHECK_S:
            return
        self._checked_at = now
        try:
            signer_mtimes = self._mtimes(self.cert_file, self.key_file)
            if signer_mtimes != self._signer_mtimes:
                self._signer = Signer.from_pem(
                    Path(self.cert_file).read_bytes(), Path(self.key_file).read_bytes()
                )
                self._signer_mtimes = signer_mtimes
                log.info("origin proofs: signing with the new certificate %s", self.cert_file)
            ca_mtime = self._mtimes(self.ca_file)
            if ca_mtime != self._ca_mtime:
                self._verifier = Verifier(Path(self.ca_file).read_bytes())
                self._ca_mtime = ca_mtime
                log.info("origin proofs: checking against the new CA bundle %s", self.ca_file)
        except (OSError, ValueError) as exc:  # half-written files during a rotation: tried again
            log.warning("origin proof keys not re-read (%s); keeping the previous ones", exc)

    def signer(self) -> Signer:
        self._recheck()
        return self._signer

    def verifier(self) -> Verifier:
        self._recheck()
        return self._verifier


def origin_checks_for(cluster: ClusterConfig) -> OriginChecks | None:
    """The engine's origin checks for this broker's configuration; None when off (also with
    ``cluster.insecure``: there is no key to sign with)."""
    if not cluster.enabled or cluster.insecure or cluster.origin_proofs == "off":
        return None
    if not (cluster.tls_ca_file and cluster.tls_cert_file and cluster.tls_key_file):
        return None  # (an in-process engine without links; a broker process needs the files)
    keys = ProofKeys(cluster.tls_ca_file, cluster.tls_cert_file, cluster.tls_key_file)
    return OriginChecks(cluster.origin_proofs, keys.signer, keys.verifier)


def link_identity_for(cluster: ClusterConfig) -> LinkIdentity | None:
    """The links' Hello challenge and answer (docs/security.md "Who answers a dial"), with the
    same keys as origin proofs; ``cluster.origin_proofs`` says whether this broker's dials ask
    (``off``: they do not, but it still answers). None with ``cluster.insecure`` (no keys)."""
    if not cluster.enabled or cluster.insecure:
        return None
    if not (cluster.tls_ca_file and cluster.tls_cert_file and cluster.tls_key_file):
        return None
    keys = ProofKeys(cluster.tls_ca_file, cluster.tls_cert_file, cluster.tls_key_file)
    return LinkIdentity(cluster.origin_proofs, keys.signer, keys.verifier)


def federation_link_identity_for(federation: FederationConfig, mode: str) -> LinkIdentity | None:
    """The federation links' challenge and answer (docs/federation.md "Security"): the same
    exchange as the cluster links' Hello, with the federation's own files (its certificate, the
    place's CA) and context string; ``mode`` is ``cluster.origin_proofs``. None with
    ``federation.insecure`` (no keys: nothing to ask or answer with)."""
    if federation.insecure:
        return None
    if not (federation.tls_ca_file and federation.tls_cert_file and federation.tls_key_file):
        return None
    keys = ProofKeys(federation.tls_ca_file, federation.tls_cert_file, federation.tls_key_file)
    return LinkIdentity(mode, keys.signer, keys.verifier, context=FEDERATION_CONTEXT)
