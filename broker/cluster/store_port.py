"""The cluster's durable state as the engine sees it: a port, and an in-memory implementation.

``ClusterStore`` is implemented for brokers by ``broker.adapters.cluster_store`` (tables in the
broker's SQLite store, in its group-commit transaction); :class:`MemoryClusterStore` keeps nothing
across a restart (an engine without persistence, and tests). What it holds is seed 004's state
that must survive a crash: the send log (SL), the receivers' positions it waits for (AL) and this
broker's own receive positions (REQ); the replies that carried sessions to other brokers, for a
claim repeated because its reply was lost (``broker.cluster.takeover``); the versions of the
retained topics (last writer wins, deletions included), so a restarted broker's anti-entropy
digest covers what its disk holds; and the catch-ups of sessions moved here with the messages held
for them until those are done (``broker.cluster.catch_up_state``), so a crash mid catch-up loses
nothing; and the epoch of this broker's announcements of interest
(``broker.cluster.interest_table``), one more at each start, so they stay ordered across restarts.
"""

from __future__ import annotations

from typing import Protocol

from broker.cluster.catch_up_state import CatchUpRow
from broker.cluster.messages import ClaimReply, ForwardedMessage, SessionClaim

__all__ = ["ClusterStore", "MemoryClusterStore"]


class ClusterStore(Protocol):
    """The cluster's durable state (``broker.adapters.cluster_store``): the send log, the
    receivers' positions it waits for, and this broker's receive positions. Writes join the
    broker store's group-commit transaction."""

    def log_append(self, forwarded: ForwardedMessage) -> None: ...

    def log_forget(self, key: tuple[str, str], below_seq: int) -> None: ...

    def load_log(self) -> list[ForwardedMessage]: ...

    def set_receiver(self, key: tuple[str, str], peer: str, next_seq: int | None) -> None: ...

    def load_receivers(self) -> list[tuple[tuple[str, str], str, int]]: ...

    def set_position(self, key: tuple[str, str], next_seq: int) -> None: ...

    def load_positions(self) -> list[tuple[tuple[str, str], int]]: ...

    def set_handed_over(self, claim_id: int, claimant: str, reply: ClaimReply | None) -> None: ...

    def load_handed_over(self) -> list[tuple[int, str, ClaimReply]]: ...

    def set_pending_claim(self, claim_id: int, claim: SessionClaim | None) -> None: ...

    def load_pending_claims(self) -> list[SessionClaim]: ...

    def set_retained_version(self, topic: str, version_ms: int, origin: str) -> None: ...

    def load_retained_versions(self) -> list[tuple[str, int, str]]: ...

    def set_retained_proof(self, topic: str, proof: bytes | None) -> None: ...

    def load_retained_proofs(self) -> dict[str, bytes]: ...

    def set_catch_ups(self, client_id: str, rows: list[CatchUpRow]) -> None: ...

    def load_catch_ups(self) -> list[tuple[str, list[CatchUpRow]]]: ...

    def hold(self, client_id: str, forwarded: ForwardedMessage) -> None: ...

    def release_held(self, client_id: str, key: tuple[str, str] | None) -> None: ...

    def load_held(self) -> list[tuple[str, ForwardedMessage]]: ...

    def set_interest_epoch(self, epoch: int) -> None: ...

    def load_interest_epoch(self) -> int: ...


class MemoryClusterStore:
    """A ``ClusterStore`` that keeps nothing across a restart (tests of the engine alone)."""

    def __init__(self) -> None:
        self.log: dict[tuple[str, str, int], ForwardedMessage] = {}
        self.receivers: dict[tuple[tuple[str, str], str], int] = {}
        self.positions: dict[tuple[str, str], int] = {}
        self.handed_over: dict[tuple[int, str], ClaimReply] = {}
        self.pending_claims: dict[int, SessionClaim] = {}
        self.retained_versions: dict[str, tuple[int, str]] = {}
        self.retained_proofs: dict[str, bytes] = {}  # topic -> its version's origin proof
        self.catch_ups: dict[str, list[CatchUpRow]] = {}
        self.held: dict[tuple[str, str, str, int], ForwardedMessage] = {}
        self.interest_epoch = 0

    def log_append(self, forwarded: ForwardedMessage) -> None:
        self.log[(forwarded.origin, forwarded.stream, forwarded.seq)] = forwarded

    def log_forget(self, key: tuple[str, str], below_seq: int) -> None:
        for entry in [k for k in self.log if k[:2] == key and k[2] < below_seq]:
            del self.log[entry]

    def load_log(self) -> list[ForwardedMessage]:
        return [self.log[k] for k in sorted(self.log)]

    def set_receiver(self, key: tuple[str, str], peer: str, next_seq: int | None) -> None:
        if next_seq is None:
            self.receivers.pop((key, peer), None)
        else:
            self.receivers[(key, peer)] = next_seq

    def load_receivers(self) -> list[tuple[tuple[str, str], str, int]]:
        return [(key, peer, seq) for (key, peer), seq in sorted(self.receivers.items())]

    def set_position(self, key: tuple[str, str], next_seq: int) -> None:
        if next_seq:
            self.positions[key] = next_seq
        else:
            self.positions.pop(key, None)

    def load_positions(self) -> list[tuple[tuple[str, str], int]]:
        return sorted(self.positions.items())

    def set_handed_over(self, claim_id: int, claimant: str, reply: ClaimReply | None) -> None:
        if reply is None:
            self.handed_over.pop((claim_id, claimant), None)
        else:
            self.handed_over[(claim_id, claimant)] = reply

    def load_handed_over(self) -> list[tuple[int, str, ClaimReply]]:
        return [
            (claim_id, claimant, reply) for (claim_id, claimant), reply in sorted(self.handed_over.items())
        ]

    def set_pending_claim(self, claim_id: int, claim: SessionClaim | None) -> None:
        if claim is None:
            self.pending_claims.pop(claim_id, None)
        else:
            self.pending_claims[claim_id] = claim

    def load_pending_claims(self) -> list[SessionClaim]:
        return [claim for _id, claim in sorted(self.pending_claims.items())]

    def set_retained_version(self, topic: str, version_ms: int, origin: str) -> None:
        self.retained_versions[topic] = (version_ms, origin)

    def load_retained_versions(self) -> list[tuple[str, int, str]]:
        return [(topic, ms, origin) for topic, (ms, origin) in sorted(self.retained_versions.items())]

    def set_retained_proof(self, topic: str, proof: bytes | None) -> None:
        if proof is None:
            self.retained_proofs.pop(topic, None)
        else:
            self.retained_proofs[topic] = proof

    def load_retained_proofs(self) -> dict[str, bytes]:
        return dict(self.retained_proofs)

    def set_catch_ups(self, client_id: str, rows: list[CatchUpRow]) -> None:
        if rows:
            self.catch_ups[client_id] = list(rows)
        else:
            self.catch_ups.pop(client_id, None)

    def load_catch_ups(self) -> list[tuple[str, list[CatchUpRow]]]:
        return sorted(self.catch_ups.items())

    def hold(self, client_id: str, forwarded: ForwardedMessage) -> None:
        self.held[(client_id, forwarded.origin, forwarded.stream, forwarded.seq)] = forwarded

    def release_held(self, client_id: str, key: tuple[str, str] | None) -> None:
        for entry in [k for k in self.held if k[0] == client_id and (key is None or k[1:3] == key)]:
            del self.held[entry]

    def load_held(self) -> list[tuple[str, ForwardedMessage]]:
        return [(k[0], self.held[k]) for k in sorted(self.held)]

    def set_interest_epoch(self, epoch: int) -> None:
        self.interest_epoch = epoch

    def load_interest_epoch(self) -> int:
        return self.interest_epoch
