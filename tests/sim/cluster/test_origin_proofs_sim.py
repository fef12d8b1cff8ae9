"""The whole-cluster simulation with origin proofs on (docs/security.md "Origin proofs").

Real processes sign and check by default (every launcher cluster does); the simulation's brokers
have no certificates, so this test gives each simulated broker a certificate of one CA for its peer
id and the engine's origin checks, exactly as ``broker.adapters.origin_keys`` does in a process,
and runs seeds with crashes, partitions, session moves and 5 % loss (items cross the real wire
codec, are duplicated, reordered, relayed on multi-hop routes, resent from send logs after
restarts, and retained copies relay other brokers' updates). Every invariant holds, every proof
checked is good - nothing honest is refused - and proofs were checked.

The simulation's wall clock is a fixed date (``simulation.world.EPOCH_S``); certificate validity
is checked against the real clock here (the certificates are made now), the rest is unchanged."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from broker.adapters.transport.tls import issue_broker_cert, make_ca
from broker.cluster.messages import OriginProof
from broker.cluster.origin_checks import OriginChecks
from broker.cluster.origin_proof import Signer, Verifier
from simulation.process import SimBroker
from simulation.scenario import Run, random_scenario

SEEDS = (3, 11)
FAULTS = frozenset({"crash", "partition", "move"})


class _RealClockVerifier(Verifier):
    def problem(self, peer_id: str, data: bytes, proof: OriginProof, now_s: float) -> str | None:
        return super().problem(peer_id, data, proof, time.time())


@pytest.mark.parametrize("seed", SEEDS)
def test_a_simulated_cluster_with_origin_proofs_keeps_every_invariant_and_refuses_nothing_honest(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_ca(tmp_path / "ca")
    verifier = _RealClockVerifier((tmp_path / "ca" / "ca.pem").read_bytes())
    signers: dict[str, Signer] = {}
    started: list[SimBroker] = []
    original_start = SimBroker.start

    def start(self: SimBroker, contacts: list[str]) -> None:
        signer = signers.get(self.peer_id)
        if signer is None:
            cert, key = issue_broker_cert(tmp_path / "ca", self.peer_id, name=self.peer_id.replace(":", "_"))
            signer = signers[self.peer_id] = Signer.from_pem(cert.read_bytes(), key.read_bytes())
        self.engine.origin_checks = OriginChecks("required", lambda: signer, lambda: verifier)
        started.append(self)
        original_start(self, contacts)

    monkeypatch.setattr(SimBroker, "start", start)
    run = Run(seed, random_scenario(seed, faults=FAULTS, loss=0.05), workdir=str(tmp_path / "sim"))
    run.script_random()
    result = run.finish()
    assert result.ok, result.report()
    stats: Any = [broker.engine.stats for broker in started]
    rejected = sum(sum(s.origin_proofs_rejected.values()) for s in stats)
    assert rejected == 0, [dict(s.origin_proofs_rejected) for s in stats]
    assert sum(s.origin_proofs_verified for s in stats) > 100
    assert sum(s.origin_proofs_signed for s in stats) > 100
