"""Federation link messages <-> ``skipmq.v1`` protobuf (protos/skipmq/v1/federation.proto)."""

from __future__ import annotations

from broker.adapters.transport._pb.skipmq.v1 import federation_pb2 as pb
from broker.cluster.messages import OriginProof
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

SCHEMA_VERSION = 1


class FederationWireError(ValueError):
    """A frame item this broker cannot decode (a newer peer, or garbage)."""


def encode(message: LinkMessage) -> pb.FedMessage:
    out = pb.FedMessage()
    if isinstance(message, LinkRequest):
        out.link_request.CopyFrom(
            pb.FedLinkRequest(
                place=message.place,
                requester=message.requester,
                one_way=message.one_way,
                schema_version=SCHEMA_VERSION,
                site=message.site,
            )
        )
    elif isinstance(message, LinkAccepted):
        out.link_accepted.CopyFrom(
            pb.FedLinkAccepted(
                place=message.place,
                mode=message.mode,
                description=message.description,
                topology=list(message.topology),
                site=message.site,
            )
        )
    elif isinstance(message, LinkRefused):
        out.link_refused.CopyFrom(pb.FedLinkRefused(place=message.place, reason=message.reason))
    elif isinstance(message, TopologyUpdate):
        out.topology_update.CopyFrom(pb.FedTopologyUpdate(topology=list(message.topology)))
    elif isinstance(message, Leave):
        leave = pb.FedLeave()
        if message.replacement is not None:
            leave.replacement = message.replacement
        out.leave.CopyFrom(leave)
    elif isinstance(message, Register):
        out.register.CopyFrom(pb.FedRegister(key=message.key, ttl=message.ttl, own_site=message.own_site))
    elif isinstance(message, Unregister):
        out.unregister.CopyFrom(pb.FedUnregister(key=message.key))
    elif isinstance(message, Event):
        out.event.CopyFrom(
            pb.FedEvent(
                topic=message.topic,
                payload=message.payload,
                qos=message.qos,
                retain=message.retain,
                site=message.site,
                event_id=message.event_id,
            )
        )
    elif isinstance(message, EventAck):
        out.event_ack.CopyFrom(pb.FedEventAck(event_id=message.event_id))
    elif isinstance(message, Retained):
        out.retained.CopyFrom(
            pb.FedRetained(
                topic=message.topic,
                payload=message.payload,
                qos=message.qos,
                version_ms=message.version_ms,
                origin=message.origin,
            )
        )
    elif isinstance(message, Probe):
        out.probe.CopyFrom(
            pb.FedProbe(
                round=message.round,
                hops_left=message.hops_left,
                attribute=message.attribute.value,
                trail=list(message.trail),
            )
        )
    else:
        out.probe_reply.CopyFrom(
            pb.FedProbeReply(
                round=message.round,
                attribute=message.attribute.value,
                responder=message.responder,
                hop=message.hop,
                route=list(message.route),
            )
        )
    return out


def challenge_of(item: pb.FedMessage) -> bytes:
    """The challenge a ``LinkRequest`` asks (empty: none); the node answers it in its
    ``LinkAccepted`` (docs/federation.md "Security"), the router never sees it."""
    return bytes(item.link_request.challenge) if item.HasField("link_request") else b""


def set_answer(item: pb.FedMessage, proof: OriginProof) -> None:
    """Put the answer to the requester's challenge into an encoded ``LinkAccepted``."""
    item.link_accepted.identity_proof.CopyFrom(
        pb.FedIdentityProof(signature=proof.signature, certificate=proof.certificate)
    )


def answer_of(item: pb.FedMessage) -> OriginProof | None:
    """The answer a ``LinkAccepted`` carries, or None (an acceptor that was not asked, or that
    does not answer: an older version, or an impostor that keeps quiet)."""
    if not item.HasField("link_accepted") or not item.link_accepted.HasField("identity_proof"):
        return None
    proof = item.link_accepted.identity_proof
    return OriginProof(bytes(proof.signature), bytes(proof.certificate))


def decode(item: pb.FedMessage) -> LinkMessage:
    kind = item.WhichOneof("body")
    try:
        if kind == "link_request":
            request = item.link_request
            if request.schema_version != SCHEMA_VERSION:
                raise FederationWireError(f"schema version {request.schema_version}, this broker speaks 1")
            return LinkRequest(request.place, request.requester, request.one_way, request.site)
        if kind == "link_accepted":
            accepted = item.link_accepted
            return LinkAccepted(
                accepted.place, accepted.mode, accepted.description, tuple(accepted.topology), accepted.site
            )
        if kind == "link_refused":
            return LinkRefused(item.link_refused.place, item.link_refused.reason)
        if kind == "topology_update":
            return TopologyUpdate(tuple(item.topology_update.topology))
        if kind == "leave":
            leave = item.leave
            return Leave(leave.replacement if leave.HasField("replacement") else None)
        if kind == "register":
            if not item.register.key or item.register.ttl < 1:
                raise FederationWireError(f"bad registration {item.register.key!r} ttl {item.register.ttl}")
            return Register(item.register.key, item.register.ttl, item.register.own_site)
        if kind == "unregister":
            return Unregister(item.unregister.key)
        if kind == "event":
            event = item.event
            if event.qos > 2:
                raise FederationWireError(f"event QoS {event.qos}")
            return Event(
                event.topic, bytes(event.payload), event.qos, event.retain, event.site, event.event_id
            )
        if kind == "event_ack":
            return EventAck(item.event_ack.event_id)
        if kind == "retained":
            write = item.retained
            if not write.topic or write.topic.startswith("$") or "+" in write.topic or "#" in write.topic:
                raise FederationWireError(f"retained topic {write.topic!r} is not a topic name")
            if write.qos > 2:
                raise FederationWireError(f"retained QoS {write.qos}")
            return Retained(write.topic, bytes(write.payload), write.qos, write.version_ms, write.origin)
        if kind == "probe":
            probe = item.probe
            return Probe(probe.round, probe.hops_left, HopAttribute(probe.attribute), tuple(probe.trail))
        if kind == "probe_reply":
            reply = item.probe_reply
            return ProbeReply(
                reply.round, HopAttribute(reply.attribute), reply.responder, reply.hop, tuple(reply.route)
            )
    except ValueError as exc:
        raise FederationWireError(str(exc)) from None
    raise FederationWireError(f"unknown federation message {kind!r}")
