"""The cluster engine's glue of origin checks (docs/security.md "Origin proofs").

:class:`OriginGlue` is the part of ``broker.cluster.engine.ClusterEngine`` that acts on the verdicts
of ``broker.cluster.origin_checks`` (pure): a cluster message refused as invalid from its sender or
for its origin proof is dropped, counted and logged, and copies of our own retained messages are
signed under our current certificate before they leave. What arrives straight from its origin on
a link that proved the origin's id is checked without the signature arithmetic
(``broker.cluster.origin_checks``, "Straight from a proven link"): ``_note_link`` remembers, for
the item being received, the one object (an envelope, or a PUB's payload) that the transport's
proven link delivered, and ``_link_peer`` names that link's broker for exactly that object - a
payload the overlay delivers later, or another object, is verified in full.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from broker.cluster.engine_driver import EngineDriver
from broker.cluster.messages import RetainedSyncReply
from broker.cluster.origin_checks import Refusal
from overlay.messages import PUB

log = logging.getLogger("skipmq.cluster")


class OriginGlue(EngineDriver):
    """See the module docstring."""

    _link_proven_item: object = None  # (``_note_link``; set per received item)

    def _reject(self, sender: str, body: object, problem: str) -> None:
        """A cluster message not valid from the broker that sent it (``broker.cluster.inbound``)."""
        self.stats.inbound_rejected += 1
        log.warning("cluster_message_rejected %s from %s: %s", type(body).__name__, sender, problem)

    def _note_link(self, sender: str, item: object) -> None:
        """Called by ``on_receive`` for each item from ``sender``: the object its link vouches for
        (the transport's ``proven_sender`` is ``sender`` while a proven link delivers)."""
        proven = getattr(self.transport, "proven_sender", None)
        if proven is None or proven != sender:
            self._link_proven_item = None
        else:
            self._link_proven_item = item.payload if isinstance(item, PUB) else item

    def _link_peer(self, obj: object) -> str | None:
        """The broker whose proven link delivered ``obj`` itself in the item being received, or None."""
        return self._receiving_from if obj is self._link_proven_item else None

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
