"""The inter-broker wire contract (protos/skipmq/v1): the link's ``Hello`` and ``Frame`` and the
``Item`` each frame carries (an overlay message or an ``Envelope``), built from the two codecs
it re-exports: overlay messages (seed 003 Table 1 queries and maintenance,
broker.adapters.transport.wire_overlay) and the cluster's items (seed 002 envelope, forwarded
batches, claims, interest, retained; broker.adapters.transport.wire_cluster). Together with
``link.py`` these are the only modules that import generated code.

Every problem (wrong type, value out of range, missing required field, undecodable bytes)
raises :class:`WireError` naming the message and field. ``broker.adapters.transport.wire`` keeps
exporting every name of the codec (the link, the cluster store, the simulator's network and the
tests import it from here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from broker.adapters.transport._pb.skipmq.v1 import cluster_pb2 as pb
from broker.adapters.transport.forwarded_codec import varint
from broker.adapters.transport.wire_base import WireError, _parse
from broker.adapters.transport.wire_cluster import (
    _encoded_batch,
    _forwarded_to_proto,
    _length_delimited,
    decode_forwarded,
    encode_forwarded,
    envelope_from_proto,
    envelope_to_proto,
    mqtt_message_from_proto,
    mqtt_message_to_proto,
    payload_from_proto,
    payload_to_proto,
    snapshot_from_proto,
    snapshot_to_proto,
)
from broker.adapters.transport.wire_overlay import (
    _CODECS,
    OVERLAY_KINDS,
    overlay_from_proto,
    overlay_to_proto,
)
from broker.adapters.transport.wire_replication import REPLICA_KINDS, replica_from_proto, replica_to_proto
from broker.cluster.messages import (
    Envelope,
    ForwardedBatch,
    OriginProof,
)
from broker.cluster.origin_hello import MAX_CHALLENGE_BYTES
from overlay import messages as om

SCHEMA_VERSION = 1  # the "v1" of package skipmq.v1; Hello.schema_version
PEER_LINK_OPEN_METHOD = "/skipmq.v1.PeerLink/Open"


# ---------------------------------------------------------------------------- items and frames


def item_to_proto(item: object) -> Any:
    """An overlay message, an :class:`Envelope` or a replication record as ``pb.Item``."""
    out = pb.Item()
    if isinstance(item, Envelope):
        envelope_to_proto(item, out.envelope)
    elif type(item) in REPLICA_KINDS:  # replicated durability (cluster.replicas, wire_replication)
        replica_to_proto(item, out.replica)  # type: ignore[arg-type]
    else:
        overlay_to_proto(item, out.overlay, "item")
    return out


def item_from_proto(src: Any) -> object:
    case = src.WhichOneof("kind")
    if case == "overlay":
        return overlay_from_proto(src.overlay, "item")
    if case == "envelope":
        return envelope_from_proto(src.envelope)
    if case == "replica":
        return replica_from_proto(src.replica)
    raise WireError("item: Item without a kind (unknown to this schema version?)")


def encode_item(item: object) -> bytes:
    """The serialized ``pb.Item`` of an overlay message or envelope (raises WireError)."""
    if type(item) is om.PUB and type(item.payload) is ForwardedBatch:
        return _encode_batch_pub(item)
    return bytes(item_to_proto(item).SerializeToString())


_PUB_CODEC = _CODECS[om.PUB]
_PUB_PAYLOAD_NUMBER = pb.Pub.DESCRIPTOR.fields_by_name["payload"].number
_PAYLOAD_BATCH_NUMBER = pb.OverlayPayload.DESCRIPTOR.fields_by_name["forwarded_batch"].number
_OVERLAY_PUB_NUMBER = pb.OverlayMessage.DESCRIPTOR.fields_by_name["pub"].number
_ITEM_OVERLAY_NUMBER = pb.Item.DESCRIPTOR.fields_by_name["overlay"].number


def _encode_batch_pub(pub: om.PUB) -> bytes:
    """A PUB carrying a ForwardedBatch as a ``pb.Item``: the PUB's own fields through the generated
    class, the batch's bytes (built once per batch, ``_encoded_batch``) appended as its payload
    field and the enclosing lengths written here - not parsed into the PUB and serialized again
    for every destination (issue #11). The PUB's fields that repeat on a route are encoded once
    (``_PUB_HEADERS``; a value equal to a cached one, such as True for 1, takes its encoding).
    A parser reads fields in any order: the same Item."""
    route = (pub.dest, pub.sender, pub.topic, pub.forwarder, pub.hops, pub.lo, pub.hi)
    header_key: tuple[object, ...] | None = route
    try:
        header = _PUB_HEADERS.get(route)
    except TypeError:  # (an unhashable value: not a valid PUB, the codec below says why)
        header_key, header = None, None
    if header is None:  # the fields that repeat from PUB to PUB on a route, encoded once
        body = pb.Pub()
        for name, put, _get in _PUB_CODEC.fields:
            if name not in _PUB_PER_MESSAGE:
                put(body, name, getattr(pub, name), f"item.PUB.{name}")
        header = bytes(body.SerializeToString())
        if len(_PUB_HEADERS) >= _PUB_HEADERS_LIMIT:
            _PUB_HEADERS.clear()
        if header_key is not None:
            _PUB_HEADERS[header_key] = header
    body = pb.Pub()
    for name, put, _get in _PUB_NUMBERS:
        put(body, name, getattr(pub, name), f"item.PUB.{name}")
    payload = _length_delimited(
        _PAYLOAD_BATCH_NUMBER, _encoded_batch(pub.payload, "item.PUB.payload.ForwardedBatch")
    )
    pub_bytes = header + bytes(body.SerializeToString()) + _length_delimited(_PUB_PAYLOAD_NUMBER, payload)
    return _length_delimited(_ITEM_OVERLAY_NUMBER, _length_delimited(_OVERLAY_PUB_NUMBER, pub_bytes))


# a PUB's fields that change from message to message (the rest: ``_PUB_HEADERS``)
_PUB_PER_MESSAGE = ("payload", "publication_id", "ack_id")
_PUB_NUMBERS = tuple(entry for entry in _PUB_CODEC.fields if entry[0] in ("publication_id", "ack_id"))
# (dest, sender, topic, forwarder, hops, lo, hi) -> those fields of a pb.Pub, serialized
_PUB_HEADERS: dict[tuple[object, ...], bytes] = {}
_PUB_HEADERS_LIMIT = 1024


def decode_item(data: bytes) -> object:
    return item_from_proto(_parse(pb.Item, data, "Item"))


_varint = varint


_FRAME_ITEMS_TAG = bytes(((2 << 3) | 2,))  # Frame.items: field 2, length-delimited


def frame_item_overhead_bytes(encoded_item: bytes) -> int:
    """Bytes an encoded item adds to a Frame (tag + length + item)."""
    return 1 + len(_varint(len(encoded_item))) + len(encoded_item)


def encode_frame_from_items(encoded_items: Iterable[bytes]) -> bytes:
    """A serialized ``Frame`` holding already-encoded items (``encode_item``) in order.

    Equal to ``Frame(items=[...]).SerializeToString()``: a repeated message field is the
    concatenation of its tagged, length-prefixed elements.
    """
    parts: list[bytes] = []
    for data in encoded_items:
        parts.append(_FRAME_ITEMS_TAG)
        parts.append(_varint(len(data)))
        parts.append(data)
    return b"".join(parts)


def encode_frame(items: Sequence[object]) -> bytes:
    return encode_frame_from_items(encode_item(item) for item in items)


def encode_hello(
    peer_id: str,
    max_batch_items: int,
    http_port: int = 0,
    *,
    challenge: bytes = b"",
    identity_proof: OriginProof | None = None,
) -> bytes:
    """A link's first frame. ``challenge``: the dialer's (broker/cluster/origin_hello.py);
    ``identity_proof``: the acceptor's answer to it."""
    frame = pb.Frame()
    frame.hello.peer_id = peer_id
    frame.hello.schema_version = SCHEMA_VERSION
    frame.hello.max_batch_items = max_batch_items
    frame.hello.http_port = http_port
    if challenge:
        frame.hello.challenge = bytes(challenge)
    if identity_proof is not None:
        frame.hello.identity_proof.signature = bytes(identity_proof.signature)
        frame.hello.identity_proof.certificate = bytes(identity_proof.certificate)
    return bytes(frame.SerializeToString())


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    peer_id: str
    schema_version: int
    max_batch_items: int
    http_port: int = 0  # the sender's HTTP port; 0 = unknown (an older broker) or HTTP off
    challenge: bytes = b""  # the dialer's; empty = not asked (mode off, an older broker)
    identity_proof: OriginProof | None = None  # the acceptor's answer; None = none given


def decode_hello(data: bytes) -> Hello:
    """The Hello of a link's first frame; WireError if the frame is not a Hello."""
    frame = _parse(pb.Frame, data, "Frame")
    if not frame.HasField("hello") or len(frame.items):
        raise WireError("Frame: the first frame of a link must hold a Hello and nothing else")
    hello = frame.hello
    if not hello.peer_id:
        raise WireError("Hello: empty peer_id")
    if hello.http_port > 65535:
        raise WireError(f"Hello: http_port {hello.http_port} is not a port")
    if len(hello.challenge) > MAX_CHALLENGE_BYTES:
        raise WireError(f"Hello: a challenge of {len(hello.challenge)} bytes (at most {MAX_CHALLENGE_BYTES})")
    proof = None
    if hello.HasField("identity_proof"):
        proof = OriginProof(bytes(hello.identity_proof.signature), bytes(hello.identity_proof.certificate))
    return Hello(
        hello.peer_id,
        hello.schema_version,
        hello.max_batch_items,
        hello.http_port,
        bytes(hello.challenge),
        proof,
    )


def decode_frame(data: bytes) -> list[object]:
    """The items of a data frame, in order; WireError for bad bytes, a Hello here or a bad item."""
    frame = _parse(pb.Frame, data, "Frame")
    if frame.HasField("hello"):
        raise WireError("Frame: a Hello after the link's first frame")
    return [item_from_proto(item) for item in frame.items]


def decode_frame_items(data: bytes) -> list[Any]:
    """The raw ``pb.Item`` messages of a data frame (decode each with ``item_from_proto``)."""
    frame = _parse(pb.Frame, data, "Frame")
    if frame.HasField("hello"):
        raise WireError("Frame: a Hello after the link's first frame")
    return list(frame.items)


__all__ = [
    "OVERLAY_KINDS",
    "PEER_LINK_OPEN_METHOD",
    "SCHEMA_VERSION",
    "Hello",
    "WireError",
    "decode_forwarded",
    "decode_frame",
    "decode_frame_items",
    "decode_hello",
    "decode_item",
    "encode_forwarded",
    "encode_frame",
    "encode_frame_from_items",
    "encode_hello",
    "encode_item",
    "envelope_from_proto",
    "envelope_to_proto",
    "frame_item_overhead_bytes",
    "item_from_proto",
    "item_to_proto",
    "mqtt_message_from_proto",
    "mqtt_message_to_proto",
    "overlay_from_proto",
    "overlay_to_proto",
    "payload_from_proto",
    "payload_to_proto",
    "pb",
    "snapshot_from_proto",
    "snapshot_to_proto",
    "_forwarded_to_proto",  # tests/unit/transport/test_forwarded_codec.py checks the fast codec against it
]
