"""Origin proofs of items that arrive straight from their origin on a proven link (docs/security.md
"Origin proofs"; broker/cluster/origin_checks.py "Straight from a proven link").

Such an item's signature is not checked again (the link already authenticates its sender); every
other check stays. These tests pin both halves: what the shortcut still refuses (a forgery with the
origin's genuine proof, relayed by another member; a proof whose certificate does not name the
origin, is expired or was issued by another CA; no proof), and which links count as proven (the
transport's ``proven_sender``: a dialed link whose acceptor answered the Hello's challenge, an
accepted link whose client certificate named the Hello's id - not a link taken unproven in
``optional`` mode, not a plaintext link)."""

from __future__ import annotations

import asyncio
import datetime
import time
from dataclasses import replace
from pathlib import Path

import pytest

from broker.adapters.transport import GrpcTransport, TransportConfig
from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert, make_ca
from broker.cluster.messages import (
    ClassInterest,
    Envelope,
    ForwardedBatch,
    ForwardedMessage,
    StreamAck,
    StreamPosition,
)
from broker.cluster.origin_checks import OriginChecks
from broker.cluster.origin_hello import LinkIdentity
from broker.cluster.origin_proof import Signer, Verifier
from broker.core.session import Message
from tools.ports import free_port

A, X = "10.0.0.1:7883", "10.0.0.9:7883"
HOST = "127.0.0.1"


def _now() -> float:
    return datetime.datetime.now(datetime.UTC).timestamp()


def _signer(ca: Path, peer_id: str, name: str, days: int = 365) -> Signer:
    cert, key = issue_broker_cert(ca, peer_id, name=name, days=days)
    return Signer.from_pem(cert.read_bytes(), key.read_bytes())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("pki")
    make_ca(root / "ca")
    make_ca(root / "other")
    return {
        "verifier": Verifier((root / "ca" / "ca.pem").read_bytes()),
        "a": _signer(root / "ca", A, "a"),
        "x": _signer(root / "ca", X, "x"),
        "lookalike_a": _signer(root / "other", A, "a"),
    }


def _batch(first_seq: int, text: bytes = b"genuine") -> tuple[ForwardedMessage, ...]:
    return tuple(
        ForwardedMessage(f"{A}/inc", "=t", seq, Message("t/1", text + b" %d" % seq, 1, origin=A), first_seq)
        for seq in range(first_seq, first_seq + 3)
    )


def test_straight_from_the_origin_only_the_signature_is_skipped(pki: dict[str, object]) -> None:
    verifier, a, x = pki["verifier"], pki["a"], pki["x"]
    assert isinstance(verifier, Verifier) and isinstance(a, Signer) and isinstance(x, Signer)
    checks = OriginChecks("required", lambda: None, lambda: verifier)
    genuine = OriginChecks("required", lambda: a, lambda: verifier).sign_payload(ForwardedBatch(_batch(1)))
    assert isinstance(genuine, ForwardedBatch) and genuine.proof is not None
    now = _now()
    # from a's own proven link: taken, counted apart from full verifications
    assert checks.check_payload(genuine, now, link_peer=A) is None
    assert (checks.stats.origin_proofs_link_bound, checks.stats.origin_proofs_verified) == (1, 0)
    # the same proof on other content: a's link vouches for it (a could sign it anyway) ...
    other = ForwardedBatch(_batch(1, b"other"), genuine.proof)
    assert checks.check_payload(other, now, link_peer=A) is None
    # ... but coming from any other link (X relaying, or forging, with a's genuine proof): refused
    refusal = checks.check_payload(other, now, link_peer=X)
    assert refusal is not None and refusal.problem == "the signature does not match the content"
    refusal = checks.check_payload(other, now)
    assert refusal is not None and refusal.problem == "the signature does not match the content"
    assert checks.check_payload(genuine, now, link_peer=X) is None  # a genuine relay: verified in full
    assert checks.stats.origin_proofs_verified == 1
    # every check but the signature's still holds on a's own link
    by_x = ForwardedBatch(_batch(1), x.sign(b"anything"))  # X's certificate on a's stream
    refusal = checks.check_payload(by_x, now, link_peer=A)
    assert refusal is not None and "names" in refusal.problem and X in refusal.problem
    lookalike = pki["lookalike_a"]
    assert isinstance(lookalike, Signer)
    refusal = checks.check_payload(ForwardedBatch(_batch(1), lookalike.sign(b"x")), now, link_peer=A)
    assert refusal is not None and "not signed by a CA of the bundle" in refusal.problem
    refusal = checks.check_payload(genuine, now + 400 * 86400, link_peer=A)  # a's certificate expired
    assert refusal is not None and "expired" in refusal.problem
    refusal = checks.check_payload(ForwardedBatch(_batch(1)), now, link_peer=A)
    assert refusal is not None and "no origin proof" in refusal.problem


def test_envelopes_from_the_proven_link_of_their_orig(pki: dict[str, object]) -> None:
    verifier, a = pki["verifier"], pki["a"]
    assert isinstance(verifier, Verifier) and isinstance(a, Signer)
    checks = OriginChecks("required", lambda: None, lambda: verifier)
    ack = Envelope(A, X, "", "", 0, 8, StreamAck((StreamPosition(f"{A}/i", "=t", 5),), ()))
    signed = OriginChecks("required", lambda: a, lambda: verifier).sign_envelope(ack)
    tampered = replace(signed, body=StreamAck((StreamPosition(f"{A}/i", "=t", 9000),), ()))
    now = _now()
    assert checks.check_envelope(signed, now, link_peer=A) is None
    assert checks.check_envelope(tampered, now, link_peer=A) is None  # (what a's own link carries)
    refusal = checks.check_envelope(tampered, now, link_peer=X)
    assert refusal is not None and refusal.problem == "the signature does not match the content"
    refusal = checks.check_envelope(tampered, now)
    assert refusal is not None and refusal.problem == "the signature does not match the content"
    assert (checks.stats.origin_proofs_link_bound, checks.stats.origin_proofs_verified) == (2, 0)


# ---------------------------------------------------------------------------- which links are proven


class _Node:
    """A transport with a certificate (or none: plaintext) and a Hello identity mode (None: an
    older broker that neither asks nor answers); records (sender, item, proven_sender)."""

    def __init__(self, ca: Path | None, peer_id: str, name: str, mode: str | None, runtime: str) -> None:
        self.tls: ClusterTls | None = None
        self.identity: LinkIdentity | None = None
        if ca is not None:
            cert, key = issue_broker_cert(ca, peer_id, name=name)
            self.tls = ClusterTls(TlsFiles(str(ca / "ca.pem"), str(cert), str(key)))
            signer = Signer.from_pem(cert.read_bytes(), key.read_bytes())
            verifier = Verifier((ca / "ca.pem").read_bytes())
            if mode is not None:
                self.identity = LinkIdentity(mode, lambda: signer, lambda: verifier)
        self.runtime = runtime
        self.received: list[tuple[str, object, str | None]] = []
        self.transport: GrpcTransport | None = None

    def make(self) -> GrpcTransport:
        def on_receive(sender: str, item: object) -> None:
            assert self.transport is not None
            self.received.append((sender, item, self.transport.proven_sender))

        self.transport = GrpcTransport(
            advertise_host=HOST,
            on_receive=on_receive,
            on_peer_down=lambda *_: None,
            config=TransportConfig(
                connect_timeout_s=2.0,
                reconnect_backoff_initial_s=0.02,
                reconnect_backoff_max_s=0.2,
                runtime=self.runtime,
            ),
            tls=self.tls,
            identity=self.identity,
        )
        return self.transport


async def _exchange(dialer: _Node, acceptor: _Node, port_d: int, port_a: int) -> None:
    """The dialer sends first (it dials), then the acceptor answers on the same link."""
    d, a = dialer.make(), acceptor.make()
    await d.start(HOST, port_d)
    await a.start(HOST, port_a)
    try:
        d.send(a.self_id, Envelope(d.self_id, a.self_id, "", "", 0, 4, ClassInterest(())))
        deadline = time.monotonic() + 5.0
        while not acceptor.received and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        a.send(d.self_id, Envelope(a.self_id, d.self_id, "", "", 0, 4, ClassInterest(())))
        while not dialer.received and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    finally:
        await a.stop(drain_timeout_s=0.2)
        await d.stop(drain_timeout_s=0.2)


@pytest.mark.parametrize("runtime", ["h2", "grpcio"])
def test_a_link_is_proven_both_ways_with_mutual_tls_and_the_hello(tmp_path: Path, runtime: str) -> None:
    make_ca(tmp_path / "ca")
    port_d, port_a = free_port(), free_port()
    dialer = _Node(tmp_path / "ca", f"{HOST}:{port_d}", "d", "required", runtime)
    acceptor = _Node(tmp_path / "ca", f"{HOST}:{port_a}", "a", "required", runtime)
    asyncio.run(_exchange(dialer, acceptor, port_d, port_a))
    assert [(s, p) for s, _item, p in acceptor.received] == [(f"{HOST}:{port_d}", f"{HOST}:{port_d}")]
    assert [(s, p) for s, _item, p in dialer.received] == [(f"{HOST}:{port_a}", f"{HOST}:{port_a}")]
    assert dialer.transport is not None and dialer.transport.proven_sender is None  # (only while delivering)


def test_a_link_taken_unproven_or_plaintext_vouches_for_nothing(tmp_path: Path) -> None:
    make_ca(tmp_path / "ca")
    # optional dialer, an acceptor that does not answer the challenge (a rolling upgrade):
    # the dialer takes the link unproven; the acceptor's side read the dialer's certificate
    port_d, port_a = free_port(), free_port()
    dialer = _Node(tmp_path / "ca", f"{HOST}:{port_d}", "d", "optional", "grpcio")
    acceptor = _Node(tmp_path / "ca", f"{HOST}:{port_a}", "a", None, "grpcio")
    asyncio.run(_exchange(dialer, acceptor, port_d, port_a))
    assert dialer.transport is not None and dialer.transport.unproven_links == 1
    assert [(s, p) for s, _item, p in dialer.received] == [(f"{HOST}:{port_a}", None)]
    assert [(s, p) for s, _item, p in acceptor.received] == [(f"{HOST}:{port_d}", f"{HOST}:{port_d}")]
    # plaintext links (cluster.insecure): nothing is proven either way
    port_d, port_a = free_port(), free_port()
    dialer = _Node(None, f"{HOST}:{port_d}", "d", None, "h2")
    acceptor = _Node(None, f"{HOST}:{port_a}", "a", None, "h2")
    asyncio.run(_exchange(dialer, acceptor, port_d, port_a))
    assert [p for _s, _item, p in dialer.received] == [None]
    assert [p for _s, _item, p in acceptor.received] == [None]
