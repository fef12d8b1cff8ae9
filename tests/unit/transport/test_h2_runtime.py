"""What the h2 link runtime (broker/adapters/transport/h2_runtime.py) adds over grpc.aio, against
stock grpcio peers in this process (real sockets, real mutual TLS with a CA of its own):

* the dialer reads the answering broker's certificate: a certified impostor on the dialed address
  (a stock grpcio server whose certificate names another peer id, answering with the dialed id in
  its Hello) gets no Hello; the refusal is counted and logged as ``cluster_link_refused``;
* a frame over ``max_message_bytes`` from a stock client ends its stream with RESOURCE_EXHAUSTED,
  and the accepting side logs and counts it (grpc.aio shows the accepting side only an end of
  stream); the frames before it were delivered;
* the standard health service's Watch streams SERVING, then NOT_SERVING when the transport stops.
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
from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert, make_ca
from overlay import messages as om
from tools.ports import free_port

HOST = "127.0.0.1"
H2 = TransportConfig(
    runtime="h2", connect_timeout_s=2.0, reconnect_backoff_initial_s=0.02, reconnect_backoff_max_s=0.2
)


def _tls(ca: Path, peer_id: str, out: Path) -> ClusterTls:
    cert, key = issue_broker_cert(ca, peer_id, out_dir=out, name=peer_id.replace(":", "_"))
    return ClusterTls(TlsFiles(str(ca / "ca.pem"), str(cert), str(key)))


async def _until(predicate: Any, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


class _Impostor(pb_grpc.PeerLinkServicer):
    """A stock grpcio PeerLink server that answers every Hello with the id it was dialed as."""

    def __init__(self, claimed: str) -> None:
        self.claimed = claimed
        self.hellos: list[pb.Hello] = []

    async def Open(self, request_iterator: Any, context: Any) -> Any:  # the proto's method name
        first = await context.read()
        self.hellos.append(first.hello)
        await context.write(
            pb.Frame(hello=pb.Hello(peer_id=self.claimed, schema_version=1, max_batch_items=16))
        )
        while await context.read() is not grpc.aio.EOF:
            pass


def test_the_dialer_refuses_a_broker_whose_certificate_names_another_peer_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = tmp_path / "ca"
    make_ca(ca)
    dialed = f"{HOST}:{free_port()}"
    impostor_tls = _tls(ca, f"{HOST}:{free_port()}", tmp_path)  # certified, for another broker
    impostor = _Impostor(claimed=dialed)
    own_port = free_port()
    downs: list[str] = []

    async def scenario() -> GrpcTransport:
        server = grpc.aio.server()
        pb_grpc.add_PeerLinkServicer_to_server(impostor, server)
        server.add_secure_port(dialed, impostor_tls.server_credentials())
        await server.start()
        transport = GrpcTransport(
            advertise_host=HOST,
            on_receive=lambda *_: None,
            on_peer_down=downs.append,
            config=H2,
            tls=_tls(ca, f"{HOST}:{own_port}", tmp_path),
        )
        await transport.start(HOST, own_port)
        try:
            transport.send(dialed, om.PING(1))
            await _until(lambda: transport.stats.dials_refused >= 2)  # refused, redialed, refused
            assert transport.connected_peers() == frozenset()
            assert transport.queued(dialed) == 1  # kept for the real broker
        finally:
            await transport.stop(drain_timeout_s=0.2)
            await server.stop(grace=0.5)
        return transport

    with caplog.at_level("WARNING", logger="skipmq.transport"):
        transport = asyncio.run(scenario())
    assert impostor.hellos == []  # nothing of ours reached it, not even the Hello
    assert downs == [dialed]
    assert transport.dial_refusals == {"certificate": transport.stats.dials_refused}
    events = [r.skipmq_fields for r in caplog.records if r.getMessage() == "cluster_link_refused"]  # type: ignore[attr-defined]
    assert events and all(event["side"] == "dialer" and event["peer"] == dialed for event in events)
    assert "names ['127.0.0.1:" in events[0]["reason"] and dialed in events[0]["reason"]


def test_an_oversized_frame_ends_the_stream_and_the_accepting_side_logs_and_counts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    received: list[tuple[str, object]] = []
    limit = 4096
    raw_peer = f"{HOST}:{free_port()}"

    async def scenario() -> tuple[GrpcTransport, grpc.aio.AioRpcError]:
        config = TransportConfig(runtime="h2", connect_timeout_s=2.0, max_message_bytes=limit)
        transport = GrpcTransport(
            advertise_host=HOST,
            on_receive=lambda sender, item: received.append((sender, item)),
            on_peer_down=lambda *_: None,
            config=config,
        )
        port = await transport.start(HOST, 0)
        channel = grpc.aio.insecure_channel(f"{HOST}:{port}")
        try:
            call = channel.stream_stream(wire.PEER_LINK_OPEN_METHOD)()
            await call.write(wire.encode_hello(raw_peer, 8))
            assert wire.decode_hello(await call.read()).peer_id == transport.self_id
            await call.write(wire.encode_frame([om.PING(1)]))
            await _until(lambda: len(received) == 1)
            await call.write(b"\x0a" + b"x" * (limit * 3))  # 3x the limit: refused from its prefix
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async with asyncio.timeout(10.0):
                    while True:
                        await call.read()
            await _until(lambda: raw_peer not in transport.connected_peers())
        finally:
            await channel.close()
            await transport.stop(drain_timeout_s=0.2)
        return transport, info.value

    with caplog.at_level("WARNING", logger="skipmq.transport"):
        transport, error = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"{limit * 3 + 1} vs. {limit}" in (error.details() or "")
    assert received == [(raw_peer, om.PING(1))]
    assert transport.stats.frames_oversized == 1
    events = [
        r.skipmq_fields  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage() == "cluster_link_frame_oversized"
    ]
    assert len(events) == 1 and events[0]["size"] == limit * 3 + 1 and events[0]["limit"] == limit
    assert events[0]["peer"].startswith("ipv4:127.0.0.1:")
    downs = [r.getMessage() for r in caplog.records if r.getMessage().startswith("link down")]
    assert downs and "RESOURCE_EXHAUSTED" in downs[0]


def test_health_watch_streams_serving_then_not_serving_while_stopping() -> None:
    async def scenario() -> list[int]:
        transport = GrpcTransport(
            advertise_host=HOST, on_receive=lambda *_: None, on_peer_down=lambda *_: None, config=H2
        )
        port = await transport.start(HOST, 0)
        seen: list[int] = []
        async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            watch = stub.Watch(health_pb2.HealthCheckRequest(service="skipmq.v1.PeerLink"))
            async with asyncio.timeout(10.0):
                seen.append((await watch.read()).status)
                stopping = asyncio.create_task(transport.stop(drain_timeout_s=0.2))
                seen.append((await watch.read()).status)
                await stopping
            watch.cancel()
        return seen

    assert asyncio.run(scenario()) == [
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    ]


def test_a_broker_on_h2_and_one_on_grpcio_link_both_ways_in_order() -> None:
    """The runtimes speak the same wire: a cluster switches runtime one broker at a time."""

    async def scenario() -> None:
        got: dict[str, list[object]] = {"h2": [], "grpcio": []}
        transports = {
            name: GrpcTransport(
                advertise_host=HOST,
                on_receive=lambda _sender, item, name=name: got[name].append(item),  # type: ignore[misc]
                on_peer_down=lambda *_: None,
                config=TransportConfig(runtime=name, connect_timeout_s=2.0),
            )
            for name in ("h2", "grpcio")
        }
        for transport in transports.values():
            await transport.start(HOST, 0)
        h2_side, grpcio_side = transports["h2"], transports["grpcio"]
        for n in range(300):
            h2_side.send(grpcio_side.self_id, om.PING(n))
            grpcio_side.send(h2_side.self_id, om.PONG(n))
            if n % 50 == 0:
                await asyncio.sleep(0)
        await _until(lambda: len(got["h2"]) == 300 and len(got["grpcio"]) == 300)
        assert got["grpcio"] == [om.PING(n) for n in range(300)]
        assert got["h2"] == [om.PONG(n) for n in range(300)]
        assert len(h2_side.connected_peers()) == 1 and len(grpcio_side.connected_peers()) == 1
        for transport in transports.values():
            await transport.stop(drain_timeout_s=0.5)

    asyncio.run(scenario())
