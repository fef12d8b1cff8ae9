"""Mutual TLS on federation links between real broker processes (docs/federation.md
"Security"): the place's CA (``skipmq certs``' code) signs one certificate per broker naming its
federation name ``skipmq://host:port``.

* Two certified brokers link and carry events.
* An uncertified process cannot open a link: a broker started with ``federation.insecure``
  never links to the TLS cloud, and a gRPC client without a client certificate fails in the
  handshake - no LinkRequest is read.
* A certified process claiming another broker's name is refused (PERMISSION_DENIED, a log
  line naming both, counted in ``skipmq_federation_link_refused_total{code="PERMISSION_DENIED"}``),
  and the real link is untouched.
* A certified broker reached at an address that is not its name (children dial a TCP port
  forward, as a NAT or a Service port would; the broker's certificate and ``LinkAccepted`` name
  its own port) is refused by the child: ``wrong_peer_id`` on the grpcio runtime (the answer's
  topology ends with another name), ``certificate`` on h2 (its TLS certificate names another
  port, before the answer) - counted, logged, never linked.
* Without the TLS files and without ``federation.insecure`` a broker refuses to start, naming
  the key.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from broker.adapters.transport._pb.skipmq.v1 import federation_pb2 as pb
from broker.adapters.transport._pb.skipmq.v1 import federation_pb2_grpc as pb_grpc
from broker.adapters.transport.tls import issue_broker_cert, make_ca
from tests.support.cluster import metric_total, wait_until
from tests.support.federation import HOST, WAIT_S, Client, Site, Sites, key
from tests.support.paths import REPO_ROOT
from tests.support.port_forward import PortForward

pytestmark = pytest.mark.slow


def _request(requester: str) -> Iterator[pb.FedFrame]:
    request = pb.FedLinkRequest(place="plant", requester=requester, schema_version=1)
    message = pb.FedMessage(link_request=request)
    yield pb.FedFrame(messages=[message])


def _events(site: Site, name: str) -> list[dict[str, object]]:
    lines = [line[line.find("{") :] for line in site.log.read_text().splitlines() if f'"{name}"' in line]
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_certified_brokers_link_and_others_are_refused(sites: Sites, tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    make_ca(ca_dir)
    cloud = sites.start("cloud", ca_dir=ca_dir)
    edge = sites.start("edge", cloud, ca_dir=ca_dir)
    at_cloud, at_edge = Client(cloud, "c-cloud"), Client(edge, "c-edge")
    ca_pem = (ca_dir / "ca.pem").read_bytes()
    try:
        at_edge.subscribe("t/#")
        wait_until(lambda: key("t/#") in cloud.state()["received_from"][edge.address], WAIT_S)
        at_cloud.publish("t/x", b"over mTLS")
        assert at_edge.received() == ("t/x", b"over mTLS")

        # an uncertified broker process (plaintext) never links
        stranger = sites.start("stranger", cloud, wait_linked=False)
        # a gRPC client that trusts the CA but has no client certificate: refused in the handshake
        no_cert = grpc.secure_channel(cloud.address, grpc.ssl_channel_credentials(root_certificates=ca_pem))
        with pytest.raises(grpc.RpcError) as failure:
            list(pb_grpc.FederationStub(no_cert).Link(_request(stranger.address), timeout=WAIT_S))
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        no_cert.close()

        # a certified process (its own name: 127.0.0.1:1) claiming the edge's name
        cert, key_file = issue_broker_cert(ca_dir, f"{HOST}:1", out_dir=tmp_path / "mallory", name="mallory")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca_pem, private_key=key_file.read_bytes(), certificate_chain=cert.read_bytes()
        )
        mallory = grpc.secure_channel(cloud.address, credentials)
        with pytest.raises(grpc.RpcError) as failure:
            list(pb_grpc.FederationStub(mallory).Link(_request(edge.address), timeout=WAIT_S))
        assert failure.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert edge.address in (failure.value.details() or "")
        mallory.close()
        assert '"federation_identity_refused"' in cloud.log.read_text()
        refused = metric_total(
            cloud.metrics(), "skipmq_federation_link_refused_total", code="PERMISSION_DENIED"
        )
        assert refused == 1  # the accepting side's refusal, counted once

        assert stranger.state()["parent"] is None
        assert cloud.state()["children"] == [edge.address]  # only the certified edge, untouched
        at_cloud.publish("t/y", b"still linked")
        assert at_edge.received() == ("t/y", b"still linked")
    finally:
        at_cloud.close()
        at_edge.close()


def test_a_broker_reached_under_another_name_is_refused_by_the_dialer(sites: Sites, tmp_path: Path) -> None:
    """wrong_peer_id: the broker at the dialed address proves a name, but not the dialed one."""
    ca_dir = tmp_path / "ca"
    make_ca(ca_dir)
    cloud = sites.start("cloud", ca_dir=ca_dir)
    forward = PortForward(cloud.fed)
    dialed = f"{HOST}:{forward.port}"
    try:
        grpcio_edge = sites.start(
            "grpcio_edge",
            ca_dir=ca_dir,
            args=("--set", "federation.link_runtime=grpcio", "--set", f"federation.upstream={dialed}"),
        )
        h2_edge = sites.start(
            "h2_edge",
            ca_dir=ca_dir,
            args=(
                "--set",
                f"federation.upstream={dialed}",
            ),
        )
        for edge, reason in ((grpcio_edge, "wrong_peer_id"), (h2_edge, "certificate")):
            wait_until(
                lambda e=edge, r=reason: (
                    metric_total(e.metrics(), "skipmq_federation_link_dial_refused_total", reason=r) >= 2
                ),
                WAIT_S,
                what=f"{edge.name} refusing the broker behind the forward twice ({reason})",
            )
            refusal = _events(edge, "federation_identity_refused")[-1]
            assert refusal["side"] == "dialer" and refusal["peer"] == dialed, refusal
            assert refusal["code"] == f"DIAL_{reason.upper()}", refusal
            assert cloud.address in str(refusal["reason"]), refusal  # names what it found instead
            assert edge.state()["parent"] is None
    finally:
        forward.close()


def test_a_federated_broker_without_tls_files_or_insecure_refuses_to_start(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "broker", "--data-dir", str(tmp_path), "--no-uvloop",
        "--set", "federation.enabled=true", "--set", "federation.place=plant",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=REPO_ROOT)
    assert done.returncode == 2
    assert "federation.tls_ca_file" in done.stderr and "federation.insecure" in done.stderr
