"""The cluster engine's glue of retained sync (last writer wins, anti-entropy; docs/cluster.md).

:class:`RetainedGlue` is the part of ``broker.cluster.engine.ClusterEngine`` that carries out the
pure core ``retained_sync``: a local retained publish goes out on the control class, retained
updates and copies from other brokers are applied to the core's store, and the retained versions
that changed are written in the transaction of the rows they stamp. It holds no state of its own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from broker.cluster.engine_base import RETAINED_ASK_MEMORY_S
from broker.cluster.engine_interest import InterestGlue
from broker.cluster.messages import RetainedUpdate
from broker.cluster.streams import CONTROL_CLASS
from overlay import api

if TYPE_CHECKING:
    from broker.core.session import Message


class RetainedGlue(InterestGlue):
    """See the module docstring."""

    def _publish_control(self, payload: object) -> None:
        self._publication_id += 1
        self._published[CONTROL_CLASS] = self._now()
        self._handle(api.Publish(CONTROL_CLASS, payload, self._publication_id))

    def _publish_retained(self, message: Message) -> None:
        assert self.retained_sync is not None
        wall_ms = int(self.scheduler.wall_time() * 1000)
        update = self.retained_sync.local_write(message, wall_ms)
        if self.origin_checks is not None:  # signed once, kept with the version for copies
            update = self.origin_checks.sign_retained(update)
            self.retained_sync.set_proof(message.topic, update.proof)
        self._publish_control(update)
        self._persist_retained_versions()

    def _persist_retained_versions(self) -> None:
        """Retained versions that changed go to the store, in the transaction of the retained rows
        they stamp (a restarted broker's anti-entropy digest then covers what its disk holds)."""
        assert self.retained_sync is not None
        changed = self.retained_sync.changed
        if changed:
            store = self.store
            for topic, (version_ms, origin) in changed.items():
                store.set_retained_version(topic, version_ms, origin)
            changed.clear()
        proofs = self.retained_sync.changed_proofs
        if proofs:
            for topic, proof in proofs.items():
                self.store.set_retained_proof(topic, proof.to_bytes() if proof is not None else None)
            proofs.clear()

    def _apply_retained(self, update: RetainedUpdate) -> None:
        assert self.retained_sync is not None and self.broker is not None
        if self.origin_checks is not None and update.proof is not None:
            update = replace(update, proof=self.origin_checks.kept(update.proof))
        if not self.retained_sync.accept(update):
            return
        self.broker.set_retained(replace(update.message))
        self._persist_retained_versions()
        self.stats.retained_updates_applied += 1
        self._deliver_pending_commit = True

    def _unasked_retained_reply(self, sender: str, request_id: int) -> str | None:
        """A retained-store copy is taken only from a broker this one asked, with that request's
        id, in the last RETAINED_ASK_MEMORY_S: an unsolicited one would plant retained messages."""
        asked = self._retained_asked.get(sender, {})
        asked_at = asked.get(request_id)
        if asked_at is None or self._now() - asked_at > RETAINED_ASK_MEMORY_S:
            return f"RetainedSyncReply to request {request_id}, which was not asked"
        return None
