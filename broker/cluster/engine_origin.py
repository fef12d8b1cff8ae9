"""The cluster engine's glue of origin checks (docs/security.md "Origin proofs").

:class:`OriginGlue` is the part of ``broker.cluster.engine.ClusterEngine`` that acts on the verdicts
of ``broker.cluster.origin_checks`` (pure): a cluster message refused as invalid from its sender or
for its origin proof is dropped, counted and logged, and copies of our own retained messages are
signed under our current certificate before they leave. It holds no state of its own.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from broker.cluster.engine_driver import EngineDriver
from broker.cluster.messages import RetainedSyncReply
from broker.cluster.origin_checks import Refusal

log = logging.getLogger("skipmq.cluster")


class OriginGlue(EngineDriver):
    """See the module docstring."""

    def _reject(self, sender: str, body: object, problem: str) -> None:
        """A cluster message not valid from the broker that sent it (``broker.cluster.inbound``)."""
        self.stats.inbound_rejected += 1
        log.warning("cluster_message_rejected %s from %s: %s", type(body).__name__, sender, problem)

    def _wall_s(self) -> float:
        return self.scheduler.wall_time()

    def _origin_refused(self, refusal: Refusal | None) -> bool:
        """An item whose origin proof does not hold (``broker.cluster.origin_checks``): dropped,
        counted and logged; True when refused."""
        if refusal is None:
            return False
        self.stats.origin_proofs_rejected[refusal.kind] += 1
        if self.broker is not None:
            self.broker.log_event(
                logging.WARNING,
                "cluster_origin_proof_rejected",
                kind=refusal.kind,
                origin=refusal.origin,
                sender=self._receiving_from,
                reason=refusal.problem,
            )
        return True

    def _prove_own_retained(self, reply: RetainedSyncReply) -> RetainedSyncReply:
        """A copy's updates of our own origin without a proof under our current certificate (a
        version restored from an older store, or signed before a certificate rotation) are signed
        now, and that proof kept."""
        checks = self.origin_checks
        retained_sync = self.retained_sync
        if checks is None or retained_sync is None:
            return reply
        current = checks.certificate()
        updates = list(reply.updates)
        for index, update in enumerate(updates):
            proof = update.proof
            if update.origin != self.peer_id or (proof is not None and proof.certificate == current):
                continue
            update = checks.sign_retained(update)
            updates[index] = update
            retained_sync.set_proof(update.message.topic, update.proof)
        return replace(reply, updates=tuple(updates))
