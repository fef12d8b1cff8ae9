"""A certified impostor on a crashed parent's address (docs/federation.md "Security").

Real broker processes with mutual TLS from one place CA: a parent ``cloud`` and three children,
``edge`` (defaults: ``cluster.origin_proofs = required``, the mode of the federation dialer's
check), ``upgrading_edge`` (``optional``, a rolling upgrade) and ``open_edge`` (``off``: the
check switched off); edge and open_edge have a paho subscriber to ``t/#``. ``cloud`` gets
``kill -9`` and an impostor X - a gRPC server in this test holding a certificate of the same CA
for its *own* name (a compromised or misconfigured broker of the place) - listens on cloud's
address, accepts every ``LinkRequest`` in cloud's name (topology ``[cloud]``), answers the
challenge as well as it can (signed with its own key) and sends an event on the link. The
children keep requesting their link to cloud (``upstream``).
Checked:

* ``edge`` refuses X: counted in ``skipmq_federation_link_dial_refused_total{reason="wrong_proof"}``,
  logged as the structured event ``federation_identity_refused`` with ``side`` ``dialer``,
  ``code`` ``DIAL_WRONG_PROOF`` and the dialed name; it stays unlinked, its subscriber gets
  nothing from X;
* ``upgrading_edge`` refuses X's wrong answer too;
* ``open_edge`` (check off) takes X for cloud: linked to "cloud" while cloud is down, X's event
  delivered to its subscriber - what the check prevents;
* when X keeps quiet about the challenge instead, ``edge`` refuses it as ``no_proof`` and
  ``upgrading_edge`` takes it, counted in ``skipmq_federation_link_unproven_total`` (the modes
  docs/federation.md "Security" describes);
* after X is gone and cloud restarts on its address, ``edge`` links to it again and carries events.

Children have ``probe_hops = 0`` so that, with their root down, they do not elect each other (they
only ever request ``upstream``); the place's retry interval is the harness's 300 ms.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.adapters.transport._pb.skipmq.v1 import federation_pb2 as pb
from broker.adapters.transport._pb.skipmq.v1 import federation_pb2_grpc as pb_grpc
from broker.adapters.transport.tls import issue_broker_cert, make_ca
from broker.cluster.origin_hello import FEDERATION_CONTEXT, LinkIdentity
from broker.cluster.origin_proof import Signer, Verifier
from tests.support.cluster import metric_total, wait_until
from tests.support.federation import HOST, WAIT_S, Client, Site, Sites, key
from tools.ports import free_port

pytestmark = pytest.mark.slow

GRPCIO = ("--set", "federation.link_runtime=grpcio")  # the children whose Hello check is tested


class Impostor(pb_grpc.FederationServicer):
    """X on ``address``: X's certificate, accepts every LinkRequest as ``address``, answers the
    challenge with X's key, sends one event, then holds the stream open; records the requesters."""

    def __init__(self, ca_dir: Path, out_dir: Path, address: str) -> None:
        cert, key_file = issue_broker_cert(ca_dir, f"{HOST}:{free_port()}", out_dir=out_dir, name="x")
        signer = Signer.from_pem(cert.read_bytes(), key_file.read_bytes())
        verifier = Verifier((ca_dir / "ca.pem").read_bytes())
        self.identity = LinkIdentity("required", lambda: signer, lambda: verifier, context=FEDERATION_CONTEXT)
        self.address = address
        self.requests: list[tuple[str, bool]] = []  # (requester, asked a challenge)
        self.answers = True  # False: it keeps quiet about the challenge (as an older version does)
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_FederationServicer_to_server(self, self.server)
        credentials = grpc.ssl_server_credentials(
            [(key_file.read_bytes(), cert.read_bytes())],
            root_certificates=(ca_dir / "ca.pem").read_bytes(),
            require_client_auth=True,
        )
        assert self.server.add_secure_port(address, credentials) != 0, f"cannot bind {address}"
        self.server.start()

    def Link(self, request_iterator: Iterator[pb.FedFrame], context: Any) -> Iterator[pb.FedFrame]:
        request = next(request_iterator).messages[0].link_request
        with self.lock:
            self.requests.append((request.requester, bool(request.challenge)))
        accepted = pb.FedLinkAccepted(place=request.place, mode="full_filter", topology=[self.address])
        proof = self.identity.answer(bytes(request.challenge), request.requester, self.address)
        if proof is not None and self.answers:
            accepted.identity_proof.CopyFrom(
                pb.FedIdentityProof(signature=proof.signature, certificate=proof.certificate)
            )
        forged = pb.FedEvent(topic="t/forged", payload=b"from the impostor", qos=0)
        yield pb.FedFrame(messages=[pb.FedMessage(link_accepted=accepted), pb.FedMessage(event=forged)])
        for _frame in request_iterator:  # until the requester ends the stream
            pass

    def stop(self) -> None:
        self.server.stop(grace=0).wait()


def _metrics(site: Site) -> str:
    with urllib.request.urlopen(f"http://{HOST}:{site.http}/metrics", timeout=2) as response:
        return response.read().decode()


def _events(site: Site, name: str) -> list[dict[str, Any]]:
    found = []
    for line in site.log.read_text().splitlines():
        start = line.find("{")
        if f'"{name}"' in line and start >= 0:
            try:
                found.append(json.loads(line[start:]))
            except ValueError:
                continue
    return found


def test_a_child_refuses_a_certified_impostor_on_its_parents_address(sites: Sites, tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    make_ca(ca_dir)
    cloud = sites.start("cloud", ca_dir=ca_dir)
    # the Hello check is what these three children exercise: on the default link runtime (h2) the
    # dialer refuses X's certificate before any Hello (h2_edge below), so they dial with grpcio
    edge = sites.start("edge", cloud, ca_dir=ca_dir, args=GRPCIO, probe_hops="0")
    open_edge = sites.start(
        "open_edge",
        cloud,
        ca_dir=ca_dir,
        args=(*GRPCIO, "--set", "cluster.origin_proofs=off"),
        probe_hops="0",
    )
    upgrading = sites.start(
        "upgrading_edge",
        cloud,
        ca_dir=ca_dir,
        args=(*GRPCIO, "--set", "cluster.origin_proofs=optional"),
        probe_hops="0",
    )
    h2_edge = sites.start("h2_edge", cloud, ca_dir=ca_dir, probe_hops="0")
    at_cloud, at_edge, at_open = Client(cloud, "c-cloud"), Client(edge, "c-edge"), Client(open_edge, "c-open")
    impostor: Impostor | None = None
    try:
        at_edge.subscribe("t/#")
        at_open.subscribe("t/#")
        for child in (edge, open_edge):
            wait_until(lambda c=child: key("t/#") in cloud.state()["received_from"][c.address], WAIT_S)
        at_cloud.publish("t/real", b"before")  # both links carry events: the check passes the real cloud
        assert at_edge.received() == ("t/real", b"before")
        assert at_open.received() == ("t/real", b"before")
        assert metric_total(_metrics(edge), "skipmq_federation_link_dial_refused_total") == 0

        assert cloud.process is not None
        cloud.process.kill()  # kill -9
        cloud.process.wait()
        wait_until(
            lambda: all(c.state()["parent"] is None for c in (edge, open_edge, upgrading, h2_edge)), WAIT_S
        )
        impostor = Impostor(ca_dir, tmp_path / "x", cloud.address)

        # the check off: X is taken for cloud, and what it sends is delivered
        wait_until(lambda: open_edge.state()["parent"] == cloud.address, WAIT_S, what="open_edge on X")
        assert at_open.received() == ("t/forged", b"from the impostor")
        # the check on: refused at every retry, counted, logged; nothing from X delivered
        wait_until(
            lambda: (
                metric_total(
                    _metrics(edge), "skipmq_federation_link_dial_refused_total", reason="wrong_proof"
                )
                >= 2
            ),
            WAIT_S,
            what="edge refusing X twice",
        )
        with impostor.lock:
            assert (edge.address, True) in impostor.requests  # edge asked; X answered as it could
            assert (open_edge.address, False) in impostor.requests  # the check off asks nothing
        assert edge.state()["parent"] is None
        assert at_edge.nothing_within(1.0)
        refusals = _events(edge, "federation_identity_refused")
        assert refusals, edge.log.read_text()[-2000:]
        assert refusals[-1]["side"] == "dialer" and refusals[-1]["peer"] == cloud.address
        assert refusals[-1]["code"] == "DIAL_WRONG_PROOF"
        assert cloud.address in refusals[-1]["reason"]  # "... names [X], not '<cloud>'"
        assert metric_total(_metrics(open_edge), "skipmq_federation_link_dial_refused_total") == 0
        # the default runtime (h2): X's certificate does not name cloud's address, refused before a Hello
        wait_until(
            lambda: (
                metric_total(
                    _metrics(h2_edge), "skipmq_federation_link_dial_refused_total", reason="certificate"
                )
                >= 1
            ),
            WAIT_S,
            what="h2_edge refusing X's certificate",
        )
        assert h2_edge.state()["parent"] is None
        assert _events(h2_edge, "federation_identity_refused")[-1]["code"] == "DIAL_CERTIFICATE"
        wait_until(
            lambda: (
                metric_total(
                    _metrics(upgrading), "skipmq_federation_link_dial_refused_total", reason="wrong_proof"
                )
                >= 1
            ),
            WAIT_S,
            what="upgrading_edge refusing X's wrong answer",
        )
        assert upgrading.state()["parent"] is None

        # X keeps quiet about the challenge: required refuses (no_proof), optional takes it, counted
        impostor.answers = False
        wait_until(
            lambda: (
                metric_total(_metrics(edge), "skipmq_federation_link_dial_refused_total", reason="no_proof")
                >= 1
            ),
            WAIT_S,
            what="edge refusing X's missing answer",
        )
        wait_until(lambda: upgrading.state()["parent"] == cloud.address, WAIT_S, what="upgrading_edge on X")
        assert metric_total(_metrics(upgrading), "skipmq_federation_link_unproven_total") == 1
        assert _events(upgrading, "federation_link_unproven")[-1]["peer"] == cloud.address
        assert edge.state()["parent"] is None
        assert _events(edge, "federation_identity_refused")[-1]["code"] == "DIAL_NO_PROOF"

        # X gone, the real cloud back on its address: the checking child links again
        impostor.stop()
        impostor = None
        sites.restart(cloud, None)
        wait_until(lambda: edge.state()["parent"] == cloud.address, WAIT_S, what="edge re-linked to cloud")
        wait_until(lambda: key("t/#") in cloud.state()["received_from"].get(edge.address, []), WAIT_S)
        at_cloud.close()
        at_cloud = Client(cloud, "c-cloud-2")
        at_cloud.publish("t/real", b"after")
        assert at_edge.received() == ("t/real", b"after")
    finally:
        if impostor is not None:
            impostor.stop()
        for client in (at_cloud, at_edge, at_open):
            client.close()
