"""Who answers a dial, on real grpc.aio links with mutual TLS in this process
(broker/adapters/transport/link.py's Hello, broker/cluster/origin_hello.py).

A certified impostor - a transport holding a certificate of the cluster CA for its *own* id X,
bound to the address (so the peer id) of broker d - is dialed by a: refused when a asks the
challenge (its answer is signed with X's key; an older broker's answer is missing), taken as d
when a does not ask (``cluster.origin_proofs = off``: what the check prevents)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from broker.adapters.transport import GrpcTransport, TransportConfig
from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert, make_ca
from broker.cluster.messages import ClassInterest, Envelope
from broker.cluster.origin_hello import LinkIdentity
from broker.cluster.origin_proof import Signer, Verifier
from tools.ports import free_port

HOST = "127.0.0.1"
# The Hello check is what guards links on grpc.aio, whose client cannot read the acceptor's
# certificate: these tests run on it. (A runtime that reads the certificate itself - the links
# branch's h2 runtime - refuses the impostor earlier, reason "certificate"; tested there.)
_HAS_RUNTIMES = "runtime" in {field.name for field in fields(TransportConfig)}
_GRPCIO: dict[str, Any] = {"runtime": "grpcio"} if _HAS_RUNTIMES else {}
FAST = TransportConfig(
    connect_timeout_s=2.0, reconnect_backoff_initial_s=0.02, reconnect_backoff_max_s=0.2, **_GRPCIO
)


class _Node:
    """A transport's certificate files and its Hello identity (``mode``; None: an older broker
    that neither asks nor answers)."""

    def __init__(self, ca: Path, cert_id: str, name: str, mode: str | None) -> None:
        cert, key = issue_broker_cert(ca, cert_id, name=name)
        self.tls = ClusterTls(TlsFiles(str(ca / "ca.pem"), str(cert), str(key)))
        signer = Signer.from_pem(cert.read_bytes(), key.read_bytes())
        verifier = Verifier((ca / "ca.pem").read_bytes())
        self.identity = None if mode is None else LinkIdentity(mode, lambda: signer, lambda: verifier)
        self.received: list[tuple[str, object]] = []

    def transport(self) -> GrpcTransport:
        return GrpcTransport(
            advertise_host=HOST,
            on_receive=lambda sender, item: self.received.append((sender, item)),
            on_peer_down=lambda *_: None,
            config=FAST,
            tls=self.tls,
            identity=self.identity,
        )


async def _dial(dialer: GrpcTransport, target_id: str, within_s: float = 3.0) -> bool:
    """Send to ``target_id`` until a link is up (True) or ``within_s`` passed (False)."""
    dialer.send(target_id, Envelope(dialer.self_id, target_id, "", "", 0, 4, ClassInterest(())))
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if target_id in dialer.connected_peers():
            return True
        if dialer.dial_refusals and within_s > 1.0:
            within_s = 1.0  # refused once: a few more redials, then stop waiting
            deadline = min(deadline, time.monotonic() + within_s)
        await asyncio.sleep(0.02)
    return False


def _scenario(tmp_path: Path, dialer_mode: str, acceptor: str) -> tuple[bool, GrpcTransport, _Node]:
    """a (``dialer_mode``) dials d's address, where ``acceptor`` listens: "d" (the real broker),
    "impostor" (X's certificate, answering with X's key) or "old-impostor" (X, no answer)."""
    make_ca(tmp_path / "ca")
    ca = tmp_path / "ca"
    port_a, port_d, port_x = free_port(), free_port(), free_port()
    a = _Node(ca, f"{HOST}:{port_a}", "a", dialer_mode)
    if acceptor == "d":
        server = _Node(ca, f"{HOST}:{port_d}", "d", "required")
    else:
        server = _Node(ca, f"{HOST}:{port_x}", "x", None if acceptor == "old-impostor" else "required")

    async def run() -> tuple[bool, GrpcTransport]:
        dialer, listener = a.transport(), server.transport()
        await dialer.start(HOST, port_a)
        await listener.start(HOST, port_d)  # on d's address: its self_id is d's peer id
        try:
            return await _dial(dialer, f"{HOST}:{port_d}"), dialer
        finally:
            await listener.stop(drain_timeout_s=0.2)
            await dialer.stop(drain_timeout_s=0.2)

    linked, dialer = asyncio.run(run())
    return linked, dialer, server


def test_the_real_broker_proves_its_id(tmp_path: Path) -> None:
    linked, dialer, d = _scenario(tmp_path, "required", "d")
    assert linked and dialer.dial_refusals == {} and dialer.unproven_links == 0
    assert [type(item).__name__ for _sender, item in d.received] == ["Envelope"]


@pytest.mark.parametrize("dialer_mode", ["required", "optional"])
def test_a_certified_impostor_on_a_brokers_address_is_refused(
    tmp_path: Path, dialer_mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="skipmq.transport")
    linked, dialer, impostor = _scenario(tmp_path, dialer_mode, "impostor")
    assert not linked
    assert set(dialer.dial_refusals) == {"wrong_proof"} and dialer.dial_refusals["wrong_proof"] >= 1
    assert impostor.received == [], "the impostor got data frames"
    events = [r for r in caplog.records if r.getMessage() == "cluster_link_refused"]
    assert events and "DIAL_WRONG_PROOF" in str(events[0].__dict__) and "names" in str(events[0].__dict__)


def test_an_impostor_that_does_not_answer_is_refused_unless_optional(tmp_path: Path) -> None:
    linked, dialer, impostor = _scenario(tmp_path / "required", "required", "old-impostor")
    assert not linked and set(dialer.dial_refusals) == {"no_proof"}
    assert impostor.received == []
    # optional (a rolling upgrade from a broker that does not answer): taken, and counted
    linked, dialer, impostor = _scenario(tmp_path / "optional", "optional", "old-impostor")
    assert linked and dialer.dial_refusals == {} and dialer.unproven_links == 1
    assert len(impostor.received) == 1


def test_with_the_check_off_the_impostor_is_taken_for_the_broker(tmp_path: Path) -> None:
    """What the check prevents (cluster.origin_proofs = off on the dialer)."""
    linked, dialer, impostor = _scenario(tmp_path, "off", "impostor")
    assert linked and dialer.dial_refusals == {}
    assert len(impostor.received) == 1
