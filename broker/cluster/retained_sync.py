"""Cluster-wide retained messages: last writer wins, and a copy for a broker that joins (pure core).

Every retained write (a payload, or an empty payload = delete, MQTT §3.3.1.3) accepted by a broker
is replicated to every broker on the control class as a ``RetainedUpdate`` stamped with a version
``(wall-clock ms, origin peer id)``; a broker applies an update only if its version is newer than
the newest it has seen for the topic, so every broker ends with the same value whatever the order
updates arrive in. A local write is stamped above every version seen for its topic (two writes in
one millisecond, or after an update from a broker whose clock runs ahead). A broker that joins asks
one contact for its whole retained store, deletions included (tombstones: a broker that was down
when a topic was deleted still holds it on disk); without an answer within ``request_timeout_s``
it asks the next contact.

**Anti-entropy** (issue #10: retained converges after a partition heals, and under message loss):
every ``anti_entropy_s`` a broker sends the next connected peer (round robin) a digest of its
versions - an XOR of one 64-bit hash per (topic, version), kept up to date per write - and the peer
answers with its whole copy when its own digest differs. Last writer wins makes the merge
order-free, so after a heal every broker converges within a few rounds.

**Restarts.** The versions are durable (``changed``: the engine writes them with the retained rows
they stamp) and a restarted broker starts from them (``restore``): its digest covers what its disk
holds - a write accepted here whose update was lost (a partition, then a crash) is still offered
to the others, and a deletion is still known. A retained message on disk without a version (a store
from before versions were kept) gets the oldest possible one, ``(0, this peer)``.

**Origin proofs** (``broker.cluster.origin_proof``): each version keeps the proof its update came
with (``proofs``, durable with it), and a copy relays it with the update, so a broker that gets a
copy checks each update against its own origin, not against the broker that sent the copy.

Events in (a local write with the wall clock, an update, a copy request / reply, ``tick``);
decisions, updates and directed messages out. No I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from broker.cluster.messages import OriginProof, RetainedSyncReply, RetainedSyncRequest, RetainedUpdate
from broker.core.session import Message

RETAINED_SYNC_CHUNK = 256
Version = tuple[int, str]  # (wall-clock ms, origin peer id)


@dataclass(frozen=True, slots=True)
class CopyRequest:
    """Send ``request`` to ``dest`` (the next contact to copy the retained store from)."""

    dest: str
    request: RetainedSyncRequest


def _version_hash(topic: str, version: Version) -> int:
    data = f"{topic}\x00{version[0]}\x00{version[1]}".encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class RetainedSync:
    """Versions of every retained topic seen, and the state of this broker's copy request."""

    def __init__(self, peer_id: str, *, request_timeout_s: float, anti_entropy_s: float = 0.0) -> None:
        self.peer_id = peer_id
        self.request_timeout_s = request_timeout_s
        self.anti_entropy_s = anti_entropy_s
        self.versions: dict[str, Version] = {}
        self.digest = 0  # XOR of _version_hash over ``versions``
        self.changed: dict[str, Version] = {}  # versions to persist (the engine drains it)
        self.proofs: dict[str, OriginProof] = {}  # topic -> the origin proof of its version
        self.changed_proofs: dict[str, OriginProof | None] = {}  # proofs to persist (drained too)
        self._next_round: float | None = None
        self._round = 0
        self._contacts: list[str] = []
        self._request_id = 0
        self._current_request = 0
        self._request_deadline: float | None = None

    # ------------------------------------------------------------------ replication
    def local_write(self, message: Message, wall_ms: int) -> RetainedUpdate:
        """A retained write accepted here: the update to replicate."""
        current = self.versions.get(message.topic)
        if current is not None and current[0] >= wall_ms:
            wall_ms = current[0] + 1
        self._set_version(message.topic, (wall_ms, self.peer_id))
        return RetainedUpdate(self.peer_id, wall_ms, message)

    def accept(self, update: RetainedUpdate) -> bool:
        """Whether ``update`` is newer than anything seen for its topic (then it is applied, and
        its proof kept with its version)."""
        if not self.newer(update):
            return False
        topic = update.message.topic
        self._set_version(topic, (update.version_ms, update.origin))
        self.set_proof(topic, update.proof)
        return True

    def newer(self, update: RetainedUpdate) -> bool:
        """``update`` is newer than anything seen for its topic (it would be applied)."""
        current = self.versions.get(update.message.topic)
        return current is None or current < (update.version_ms, update.origin)

    def set_proof(self, topic: str, proof: OriginProof | None) -> None:
        """The origin proof of ``topic``'s current version (a local write's, once signed)."""
        if proof is None:
            if self.proofs.pop(topic, None) is None:
                return
        else:
            self.proofs[topic] = proof
        self.changed_proofs[topic] = proof

    def _set_version(self, topic: str, version: Version) -> None:
        current = self.versions.get(topic)
        if current is not None:
            self.digest ^= _version_hash(topic, current)
            if current != version:
                self.set_proof(topic, None)  # (the old version's proof goes with it)
        self.versions[topic] = version
        self.digest ^= _version_hash(topic, version)
        self.changed[topic] = version

    def restore(
        self,
        versions: Iterable[tuple[str, int, str]],
        held: Iterable[str],
        proofs: dict[str, bytes] | None = None,
    ) -> None:
        """The durable versions a previous incarnation left ((topic, ms, origin)) and their origin
        proofs, and the topics whose retained message the store holds (one without a version gets
        ``(0, this peer)``)."""
        for topic, version_ms, origin in versions:
            self._set_version(topic, (version_ms, origin))
        for topic, data in (proofs or {}).items():
            if topic in self.versions:
                try:
                    self.proofs[topic] = OriginProof.from_bytes(data)
                except ValueError:
                    continue  # (not relayed: a receiver that requires proofs asks the origin)
        self.changed.clear()  # already durable
        self.changed_proofs.clear()
        for topic in held:
            if topic not in self.versions:
                self._set_version(topic, (0, self.peer_id))

    # ------------------------------------------------------------------ anti-entropy
    def anti_entropy(self, peers: Iterable[str], now: float) -> CopyRequest | None:
        """When a round is due: the digest request for the next peer (round robin)."""
        if self.anti_entropy_s <= 0:
            return None
        if self._next_round is None:
            self._next_round = now + self.anti_entropy_s
            return None
        if self._next_round > now:
            return None
        self._next_round = now + self.anti_entropy_s
        ordered = sorted(peers)
        if not ordered:
            return None
        self._round += 1
        peer = ordered[self._round % len(ordered)]
        return CopyRequest(peer, RetainedSyncRequest(0, self.digest))

    def differs(self, digest: int) -> bool:
        return digest != self.digest

    # ------------------------------------------------------------------ the copy for a new broker
    def start_copy(self, contacts: Iterable[str], now: float) -> CopyRequest | None:
        self._contacts = list(contacts)
        return self._next_request(now)

    def copy_for(self, request_id: int, retained: Iterable[Message]) -> list[RetainedSyncReply]:
        """The chunks answering another broker's copy request: every retained message held here
        and a deletion for every topic known to be deleted."""
        updates: list[RetainedUpdate] = []
        held: set[str] = set()
        for message in retained:
            held.add(message.topic)
            version = self.versions.get(message.topic)
            if version is None:  # restored from disk without a version: the oldest possible
                version = (0, self.peer_id)
                self._set_version(message.topic, version)
            updates.append(RetainedUpdate(version[1], version[0], message, self.proofs.get(message.topic)))
        for topic, (version_ms, origin) in list(self.versions.items()):
            if topic not in held:
                tombstone = Message(topic, b"", qos=0, retain=True, origin=origin)
                updates.append(RetainedUpdate(origin, version_ms, tombstone, self.proofs.get(topic)))
        chunks = [updates[i : i + RETAINED_SYNC_CHUNK] for i in range(0, len(updates), RETAINED_SYNC_CHUNK)]
        last = max(0, len(chunks) - 1)
        return [
            RetainedSyncReply(request_id, tuple(chunk), index == last)
            for index, chunk in enumerate(chunks or [[]])
        ]

    def reply_received(self, reply: RetainedSyncReply) -> list[RetainedUpdate]:
        """A chunk of our copy: the updates to consider (``accept``); the last chunk of the current
        request ends the copy."""
        if reply.last and reply.request_id == self._current_request:
            self._contacts = []
            self._request_deadline = None
        return list(reply.updates)

    def tick(self, now: float) -> CopyRequest | None:
        if self._request_deadline is None or self._request_deadline > now:
            return None
        return self._next_request(now)

    def next_deadline(self) -> float | None:
        deadline = self._request_deadline
        if self._next_round is not None and (deadline is None or self._next_round < deadline):
            deadline = self._next_round
        return deadline

    def stop(self) -> None:
        self._contacts = []
        self._request_deadline = None
        self._next_round = None

    def _next_request(self, now: float) -> CopyRequest | None:
        if not self._contacts:
            self._request_deadline = None
            return None
        contact = self._contacts.pop(0)
        self._request_id += 1
        self._current_request = self._request_id
        self._request_deadline = now + self.request_timeout_s
        return CopyRequest(contact, RetainedSyncRequest(self._request_id))
