"""Every federation link message survives the skipmq.v1 protobuf round trip; bad items are refused."""

from __future__ import annotations

import pytest

from broker.adapters.federation import wire
from broker.adapters.transport._pb.skipmq.v1 import federation_pb2 as pb
from broker.federation.messages import (
    Event,
    EventAck,
    HopAttribute,
    Leave,
    LinkAccepted,
    LinkMessage,
    LinkRefused,
    LinkRequest,
    Probe,
    ProbeReply,
    Register,
    Retained,
    TopologyUpdate,
    Unregister,
)

MESSAGES: list[LinkMessage] = [
    LinkRequest("plant", "10.0.0.1:7990", one_way=True),
    LinkAccepted("plant", "type_only", "telemetry", ("a:1", "b:2")),
    LinkRefused("plant", "already linked"),
    TopologyUpdate(("a:1", "b:2", "c:3")),
    Leave("a:1"),
    Leave(None),
    Register("f:plant/+/temp", 15),
    Unregister("t:=plant"),
    Event("plant/a", b"\x00\xff payload", 2, True, "edge-a", "b:2/x/7"),
    Event("plant/b", b""),
    EventAck("b:2/x/7"),
    Retained("plant/cfg", b"speed=3", 1, 1_764_000_000_000, "b:2"),
    Retained("plant/cfg", b"", 0, 7, "a:1"),
    Probe(3, 2, HopAttribute.UPSTREAM, ("c:3",)),
    ProbeReply(3, HopAttribute.ALL, "a:1", 2, ("c:3",)),
]


@pytest.mark.parametrize("message", MESSAGES, ids=[type(m).__name__ for m in MESSAGES])
def test_round_trip(message: LinkMessage) -> None:
    encoded = wire.encode(message).SerializeToString()
    assert wire.decode(pb.FedMessage.FromString(encoded)) == message


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        (pb.FedMessage(), "unknown federation message None"),
        (pb.FedMessage(register=pb.FedRegister(key="f:x", ttl=0)), "bad registration"),
        (pb.FedMessage(register=pb.FedRegister(key="", ttl=3)), "bad registration"),
        (pb.FedMessage(event=pb.FedEvent(topic="x", qos=3)), "event QoS 3"),
        (pb.FedMessage(probe=pb.FedProbe(attribute="sideways")), "sideways"),
        (pb.FedMessage(retained=pb.FedRetained(topic="plant/#")), "not a topic name"),
        (pb.FedMessage(retained=pb.FedRetained(topic="$SYS/x")), "not a topic name"),
        (pb.FedMessage(retained=pb.FedRetained(topic="")), "not a topic name"),
        (pb.FedMessage(retained=pb.FedRetained(topic="a", qos=3)), "retained QoS 3"),
        (
            pb.FedMessage(link_request=pb.FedLinkRequest(place="p", requester="a:1", schema_version=2)),
            "schema",
        ),
    ],
)
def test_bad_items_are_refused_with_a_reason(item: pb.FedMessage, problem: str) -> None:
    with pytest.raises(wire.FederationWireError, match=problem):
        wire.decode(item)
