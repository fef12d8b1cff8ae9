"""Hostile input on the federation gRPC service of a real broker process: a stream that does not
start with a LinkRequest is rejected (INVALID_ARGUMENT, counted in
skipmq_federation_link_refused_total), a request for another event place is refused with a
reason, undecodable bytes and an invalid registration close that one stream with a log line -
and the broker's real shared link keeps carrying events."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest

from broker.adapters.transport._pb.skipmq.v1 import federation_pb2 as pb
from broker.adapters.transport._pb.skipmq.v1 import federation_pb2_grpc as pb_grpc
from tests.support.cluster import metric_total, wait_until
from tests.support.federation import WAIT_S, Client, Sites, key

pytestmark = pytest.mark.slow


def _request(place: str, requester: str) -> pb.FedFrame:
    message = pb.FedMessage(
        link_request=pb.FedLinkRequest(place=place, requester=requester, schema_version=1)
    )
    return pb.FedFrame(messages=[message])


def _frames(*frames: pb.FedFrame, hold: threading.Event | None = None) -> Iterator[pb.FedFrame]:
    yield from frames
    if hold is not None:
        hold.wait(WAIT_S)


def test_hostile_streams_are_refused_and_the_real_link_keeps_working(sites: Sites) -> None:
    cloud = sites.start("cloud")
    edge = sites.start("edge", cloud)
    at_cloud, at_edge = Client(cloud, "c-cloud"), Client(edge, "c-edge")
    channel = grpc.insecure_channel(cloud.address)
    stub = pb_grpc.FederationStub(channel)
    try:
        at_edge.subscribe("t/#")
        wait_until(lambda: key("t/#") in cloud.state()["received_from"][edge.address], WAIT_S)

        # 1. the first frame is not a LinkRequest
        event = pb.FedFrame(messages=[pb.FedMessage(event=pb.FedEvent(topic="t/x", payload=b"forged"))])
        with pytest.raises(grpc.RpcError) as failure:
            list(stub.Link(_frames(event), timeout=WAIT_S))
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "LinkRequest" in (failure.value.details() or "")
        refused = metric_total(
            cloud.metrics(), "skipmq_federation_link_refused_total", code="INVALID_ARGUMENT"
        )
        assert refused == 1  # counted as the accepting side's refusal

        # 2. another event place: refused with a reason, the stream ends
        answers = list(stub.Link(_frames(_request("hospital", "127.0.0.1:1")), timeout=WAIT_S))
        refused = [m.link_refused for frame in answers for m in frame.messages if m.HasField("link_refused")]
        assert len(refused) == 1 and "unknown event place 'hospital'" in refused[0].reason

        # 3. bytes that are no FedFrame
        raw = channel.stream_stream("/skipmq.v1.Federation/Link", request_serializer=lambda b: b)
        with pytest.raises(grpc.RpcError):
            list(raw(iter([b"\xff\xff\xff garbage"]), timeout=WAIT_S))

        # 4. a linked stream sends an invalid registration (TTL 0): that stream is closed
        hold = threading.Event()
        bad = pb.FedFrame(messages=[pb.FedMessage(register=pb.FedRegister(key="f:#", ttl=0))])
        stream = stub.Link(_frames(_request("plant", "127.0.0.1:2"), bad, hold=hold), timeout=WAIT_S)
        first = next(stream)
        assert first.messages[0].HasField("link_accepted")
        wait_until(lambda: '"federation_bad_frame"' in cloud.log.read_text(), WAIT_S, what="bad frame logged")
        wait_until(lambda: "127.0.0.1:2" not in cloud.state()["children"], WAIT_S, what="stream dropped")
        hold.set()

        # the real link is untouched
        assert cloud.state()["children"] == [edge.address]
        at_cloud.publish("t/ok", b"still linked")
        assert at_edge.received() == ("t/ok", b"still linked")
    finally:
        channel.close()
        at_cloud.close()
        at_edge.close()
