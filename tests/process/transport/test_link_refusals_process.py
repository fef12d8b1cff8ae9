"""A real broker's cluster port refusing PeerLink handshakes (tools.launcher: a broker process with
its default mutual TLS; a stock grpcio client in this process with a certificate of the cluster's
own CA for its own peer id). Each refusal ends the stream with its status, is served on /metrics as
``skipmq_cluster_link_refused_total{code}`` and is logged as the structured event
``cluster_link_refused`` naming who claimed what; the same certified client speaking for itself is
let in and counted as nothing. A frame over the default ``cluster.max_frame_bytes`` from it ends
the stream with RESOURCE_EXHAUSTED, read from its length prefix: the broker counts it
(``skipmq_cluster_link_frames_oversized_total``) and logs ``cluster_link_frame_oversized``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.adapters.transport import wire
from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert
from tests.support.cluster import metric_total, wait_until
from tools.launcher import start_cluster
from tools.ports import free_port

pytestmark = pytest.mark.slow

HOST = "127.0.0.1"


async def _hello(target: str, credentials: grpc.ChannelCredentials, first: bytes, then: bytes = b"") -> Any:
    """Open PeerLink/Open, write ``first``; the acceptor's first answer or the error (with
    ``then``: written after that answer; the error that ends the call, or EOF: frames the broker
    sends the linked peer meanwhile, such as its overlay PINGs, are read past)."""
    channel = grpc.aio.secure_channel(target, credentials)
    try:
        call = channel.stream_stream(wire.PEER_LINK_OPEN_METHOD)()
        async with asyncio.timeout(20.0):
            await call.write(first)
            answer = await call.read()
            if then:
                await call.write(then)
                while answer is not grpc.aio.EOF:
                    answer = await call.read()
            return answer
    except grpc.aio.AioRpcError as exc:
        return exc
    finally:
        await channel.close()


def test_refused_handshakes_are_counted_on_metrics_and_logged(tmp_path: Path) -> None:
    cluster = start_cluster(1, data_root=str(tmp_path / "cluster"))
    try:
        broker = cluster.brokers[0]
        certs = Path(cluster.data_root) / "certs"
        own_id = f"{HOST}:{free_port()}"
        cert, key = issue_broker_cert(certs, own_id, out_dir=tmp_path, name="rogue")
        credentials = ClusterTls(TlsFiles(str(certs / "ca.pem"), str(cert), str(key))).channel_credentials()
        victim = f"{HOST}:{free_port()}"
        posing = asyncio.run(_hello(broker.peer_id, credentials, wire.encode_hello(victim, 16)))
        assert isinstance(posing, grpc.aio.AioRpcError) and posing.code() == grpc.StatusCode.PERMISSION_DENIED
        newer = wire.pb.Frame(hello=wire.pb.Hello(peer_id=own_id, schema_version=99)).SerializeToString()
        schema = asyncio.run(_hello(broker.peer_id, credentials, newer))
        assert (
            isinstance(schema, grpc.aio.AioRpcError) and schema.code() == grpc.StatusCode.FAILED_PRECONDITION
        )
        itself = asyncio.run(_hello(broker.peer_id, credentials, wire.encode_hello(own_id, 16)))
        assert not isinstance(itself, grpc.aio.AioRpcError), itself  # let in: not a refusal
        # then a frame over the default cluster.max_frame_bytes (64 MiB): refused from its prefix
        huge = b"\x0a" + b"x" * (64 * 1024 * 1024)
        oversized = asyncio.run(_hello(broker.peer_id, credentials, wire.encode_hello(own_id, 16), huge))
        assert isinstance(oversized, grpc.aio.AioRpcError), oversized
        assert oversized.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        def refused(code: str) -> float:
            return metric_total(cluster.metrics_text(0), "skipmq_cluster_link_refused_total", code=code)

        wait_until(lambda: refused("PERMISSION_DENIED") == 1, 10.0, what="the refusal on /metrics")
        assert refused("FAILED_PRECONDITION") == 1
        assert refused("INVALID_ARGUMENT") == 0
        assert metric_total(cluster.metrics_text(0), "skipmq_cluster_link_frames_oversized_total") == 1
        events = [
            json.loads(line)
            for line in broker.log_text().splitlines()
            if line.startswith("{") and '"cluster_link_refused"' in line
        ]
        assert [(event["code"], event["claimed"]) for event in events] == [
            ("PERMISSION_DENIED", victim),
            ("FAILED_PRECONDITION", own_id),
        ]
        assert "certificate names" in events[0]["reason"] and own_id in events[0]["reason"]
        assert events[0]["level"] == "warning" and events[0]["peer"].startswith("ipv4:127.0.0.1:")
        oversized_events = [
            json.loads(line)
            for line in broker.log_text().splitlines()
            if line.startswith("{") and '"cluster_link_frame_oversized"' in line
        ]
        assert [(event["size"], event["limit"]) for event in oversized_events] == [
            (len(huge), 64 * 1024 * 1024)
        ]
    finally:
        cluster.close()
