"""The broker links are gRPC on the wire: stock grpcio peers, with the stubs grpcio-tools generated
from protos/skipmq/v1 (broker/adapters/transport/_pb) and nothing of SkipMQ's link code, over
mutual TLS with certificates of the cluster's CA.

* A stock client talks to a real broker's cluster port (tools.launcher: a broker process): it
  opens ``PeerLink/Open``, exchanges Hellos, sends a frame holding an overlay PING and gets the
  broker's PONG back in a frame, and asks the standard ``grpc.health.v1.Health`` service.
* A stock server is dialed by SkipMQ's transport: it reads the transport's Hello (whose peer id
  its client certificate names), answers with its own and receives the queued items, in order.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.adapters.transport import GrpcTransport, TransportConfig, wire
from broker.adapters.transport._pb.skipmq.v1 import cluster_pb2 as pb
from broker.adapters.transport._pb.skipmq.v1 import cluster_pb2_grpc as pb_grpc
from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert, make_ca, peer_ids_of
from overlay import messages as om
from tools.launcher import start_cluster
from tools.ports import free_port

pytestmark = pytest.mark.slow

HOST = "127.0.0.1"


def _credentials(ca_dir: Path, peer_id: str, out: Path) -> ClusterTls:
    cert, key = issue_broker_cert(ca_dir, peer_id, out_dir=out, name=peer_id.replace(":", "_"))
    return ClusterTls(TlsFiles(str(ca_dir / "ca.pem"), str(cert), str(key)))


def test_a_stock_grpcio_client_talks_to_a_brokers_cluster_port(tmp_path: Path) -> None:
    cluster = start_cluster(1, data_root=str(tmp_path / "cluster"))
    try:
        broker = cluster.brokers[0]
        own_id = f"{HOST}:{free_port()}"
        tls = _credentials(Path(cluster.data_root) / "certs", own_id, tmp_path)

        async def scenario() -> tuple[pb.Frame, list[pb.Item], int]:
            async with grpc.aio.secure_channel(broker.peer_id, tls.channel_credentials()) as channel:
                call = pb_grpc.PeerLinkStub(channel).Open()
                async with asyncio.timeout(15.0):
                    await call.write(
                        pb.Frame(hello=pb.Hello(peer_id=own_id, schema_version=1, max_batch_items=16))
                    )
                    hello = await call.read()
                    ping = om.PING(424242)
                    await call.write(pb.Frame(items=[pb.Item.FromString(wire.encode_item(ping))]))
                    items: list[pb.Item] = []
                    while not any(item.overlay.WhichOneof("kind") == "pong" for item in items):
                        frame = await call.read()
                        assert frame is not grpc.aio.EOF
                        items.extend(frame.items)
                    health = await health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service="skipmq.v1.PeerLink")
                    )
                    call.cancel()
            return hello, items, health.status

        hello, items, status = asyncio.run(scenario())
        assert hello.hello.peer_id == broker.peer_id and hello.hello.schema_version == 1
        pongs = [item.overlay.pong.nonce for item in items if item.overlay.WhichOneof("kind") == "pong"]
        assert pongs == [424242]
        assert status == health_pb2.HealthCheckResponse.SERVING
    finally:
        cluster.close()


class _StockPeerLink(pb_grpc.PeerLinkServicer):
    """A PeerLink server written against the generated servicer only."""

    def __init__(self, own_id: str) -> None:
        self.own_id = own_id
        self.hello: pb.Hello | None = None
        self.certificate_names: set[str] = set()
        self.items: list[pb.Item] = []

    async def Open(self, request_iterator: Any, context: Any) -> Any:  # the proto's method name
        first = await context.read()
        self.hello = first.hello
        self.certificate_names = peer_ids_of(context.auth_context()["x509_pem_cert"][0])
        await context.write(
            pb.Frame(hello=pb.Hello(peer_id=self.own_id, schema_version=1, max_batch_items=16))
        )
        while True:
            frame = await context.read()
            if frame is grpc.aio.EOF:
                return
            self.items.extend(frame.items)


def test_skipmq_dials_a_stock_grpcio_server(tmp_path: Path) -> None:
    ca = tmp_path / "ca"
    make_ca(ca)
    server_id, client_port = f"{HOST}:{free_port()}", free_port()
    client_id = f"{HOST}:{client_port}"
    server_tls = _credentials(ca, server_id, tmp_path)
    servicer = _StockPeerLink(server_id)

    async def scenario() -> None:
        server = grpc.aio.server()
        pb_grpc.add_PeerLinkServicer_to_server(servicer, server)
        server.add_secure_port(server_id, server_tls.server_credentials())
        await server.start()
        transport = GrpcTransport(
            advertise_host=HOST,
            on_receive=lambda *_: None,
            on_peer_down=lambda *_: None,
            config=TransportConfig(connect_timeout_s=5.0),
            tls=_credentials(ca, client_id, tmp_path),
        )
        await transport.start(HOST, client_port)
        try:
            for nonce in range(5):
                transport.send(server_id, om.PING(nonce))
            async with asyncio.timeout(15.0):
                while len(servicer.items) < 5:
                    await asyncio.sleep(0.02)
            assert server_id in transport.connected_peers()
        finally:
            await transport.stop(drain_timeout_s=1.0)
            await server.stop(grace=1.0)

    asyncio.run(scenario())
    assert servicer.hello is not None and servicer.hello.peer_id == client_id
    assert servicer.hello.schema_version == wire.SCHEMA_VERSION
    assert servicer.certificate_names == {client_id}
    assert [item.overlay.ping.nonce for item in servicer.items] == [0, 1, 2, 3, 4]
