"""Mutual TLS of the gRPC transport (broker/adapters/transport/tls.py) with real grpc.aio servers
in this process: certificates from `skipmq certs`' functions, a link between two certified
transports, and rotation without a restart (the server re-reads its files for a new handshake)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from broker.adapters.transport import GrpcTransport, TransportConfig
from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert, make_ca, peer_ids_of
from broker.certs import main as certs_main
from broker.cluster.messages import ClassInterest, Envelope
from tools.ports import free_port

HOST = "127.0.0.1"
FAST = TransportConfig(connect_timeout_s=2.0, reconnect_backoff_initial_s=0.02, reconnect_backoff_max_s=0.2)


def _tls(ca_dir: Path, peer_id: str, name: str) -> ClusterTls:
    cert, key = issue_broker_cert(ca_dir, peer_id, name=name)
    return ClusterTls(TlsFiles(str(ca_dir / "ca.pem"), str(cert), str(key)))


def test_certs_command_names_the_peer_id(tmp_path: Path) -> None:
    assert certs_main(["init", str(tmp_path)]) == 0
    assert certs_main(["init", str(tmp_path)]) == 1  # never overwrites a CA
    assert certs_main(["issue", str(tmp_path), "10.0.0.7:7883", "--name", "b7"]) == 0
    assert peer_ids_of((tmp_path / "b7.pem").read_bytes()) == {"10.0.0.7:7883"}
    assert oct((tmp_path / "b7.key").stat().st_mode & 0o777) == "0o600"
    assert certs_main(["issue", str(tmp_path), "no-port"]) == 1


async def _linked(dialer: GrpcTransport, target: GrpcTransport) -> bool:
    dialer.send(target.self_id, Envelope(dialer.self_id, target.self_id, "", "", 0, 4, ClassInterest(())))
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if target.self_id in dialer.connected_peers():
            return True
        await asyncio.sleep(0.05)
    return False


def test_certified_transports_link_and_a_rotated_server_certificate_is_used_without_restart(
    tmp_path: Path,
) -> None:
    ca1, ca2 = tmp_path / "ca1", tmp_path / "ca2"
    make_ca(ca1)
    make_ca(ca2)
    port_a, port_b, port_c = free_port(), free_port(), free_port()
    tls_a = _tls(ca1, f"{HOST}:{port_a}", "a")

    def transport(tls: ClusterTls) -> GrpcTransport:
        return GrpcTransport(
            advertise_host=HOST,
            on_receive=lambda *_: None,
            on_peer_down=lambda *_: None,
            config=FAST,
            tls=tls,
        )

    async def scenario() -> tuple[bool, bool]:
        a = transport(tls_a)
        b = transport(_tls(ca1, f"{HOST}:{port_b}", "b"))
        await a.start(HOST, port_a)
        await b.start(HOST, port_b)
        try:
            first = await _linked(b, a)
            # rotate a's certificate to one of another CA (same peer id): a new dial from a broker
            # that trusts only ca1 now fails, so a serves the new files without a restart
            cert, key = issue_broker_cert(ca2, f"{HOST}:{port_a}", out_dir=tmp_path / "new", name="a")
            for src, dst in ((cert, tls_a.files.cert_file), (key, tls_a.files.key_file)):
                os.replace(src, dst)
            c = transport(_tls(ca1, f"{HOST}:{port_c}", "c"))
            await c.start(HOST, port_c)
            try:
                after = await _linked(c, a)
            finally:
                await c.stop(drain_timeout_s=0.2)
            return first, after
        finally:
            await b.stop(drain_timeout_s=0.2)
            await a.stop(drain_timeout_s=0.2)

    first, after_rotation = asyncio.run(scenario())
    assert first, "two certified transports did not link"
    assert not after_rotation, "the server kept its old certificate after the files changed"


def test_a_key_that_does_not_match_the_certificate_is_refused(tmp_path: Path) -> None:
    make_ca(tmp_path)
    cert, _key = issue_broker_cert(tmp_path, "127.0.0.1:1", name="one")
    _cert2, key2 = issue_broker_cert(tmp_path, "127.0.0.1:2", name="two")
    with pytest.raises(ValueError, match="does not belong"):
        ClusterTls(TlsFiles(str(tmp_path / "ca.pem"), str(cert), str(key2)))
