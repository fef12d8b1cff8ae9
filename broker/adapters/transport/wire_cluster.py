"""Dataclass <-> protobuf conversion of the cluster's items (protos/skipmq/v1/cluster.proto): the
PUB payloads and directed messages of ``broker/cluster/messages.py``: forwarded messages and
batches (with their origin proofs), retained updates and sync, session claims and snapshots,
class interest, stream acknowledgements, and the seed 002 ``Envelope``. MQTT properties travel as
the MQTT 5 property block of a PUBLISH (``broker/mqtt/codec.py``). Forwarded messages and batches
are serialized once and their bytes reused for every destination and the send log (issue #11):
the small identity caches at the end of this module.

Size: one small mapping pair per cluster record of cluster.proto plus those caches, alike and
read together; a further split would part each record from its cache.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.adapters.transport._pb.skipmq.v1 import cluster_pb2 as pb
from broker.adapters.transport.forwarded_codec import encode_forwarded_fast, varint
from broker.adapters.transport.wire_base import WireError, _parse, _require
from broker.cluster.messages import (
    ClaimReply,
    ClassInterest,
    DirectedBody,
    Envelope,
    ForwardedBatch,
    ForwardedMessage,
    OriginProof,
    RetainedSyncReply,
    RetainedSyncRequest,
    RetainedUpdate,
    SessionClaim,
    StreamAck,
    StreamPosition,
    StreamResend,
    StreamRet,
)
from broker.core.session import Message, OutEntry, SessionSnapshot, SubOptions
from broker.mqtt import codec
from broker.mqtt.packets import MQTTProtocolError, PacketType, Will

# ---------------------------------------------------------------------------- broker messages


def _check_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{where}: expected int, got {value!r}")
    return value


def _set(out: Any, name: str, value: Any, where: str) -> None:
    try:
        setattr(out, name, value)
    except (ValueError, TypeError) as exc:
        raise WireError(f"{where}.{name}: {value!r} does not fit the wire field ({exc})") from None


_NO_PROPERTIES = b"\x00"  # an MQTT 5 property block of length 0 (what older senders wrote)


def mqtt_message_to_proto(message: Message, out: Any, where: str = "message") -> None:
    if not isinstance(message, Message):
        raise WireError(f"{where}: expected broker.core.session.Message, got {type(message).__name__}")
    _set(out, "topic", message.topic, where)
    _set(out, "payload", bytes(message.payload), where)
    _set(out, "qos", _check_int(message.qos, f"{where}.qos"), where)
    _set(out, "retain", bool(message.retain), where)
    if message.properties:  # (most messages have none: no property block at all)
        try:
            out.properties = codec._encode_properties(message.properties, PacketType.PUBLISH)
        except (ValueError, TypeError, KeyError) as exc:
            raise WireError(f"{where}.properties: {exc}") from None
    if message.expiry_at is not None:
        _set(out, "expiry_at", float(message.expiry_at), where)
    _set(out, "origin", message.origin, where)
    if message.publisher_id is not None:
        _set(out, "publisher_id", message.publisher_id, where)


def mqtt_message_from_proto(src: Any, where: str = "message") -> Message:
    block = src.properties
    if not block or block == _NO_PROPERTIES:  # most messages: no property to decode
        properties: dict[Any, Any] = {}
    else:
        try:
            properties, end = codec._decode_properties(block, 0, len(block), PacketType.PUBLISH, "client")
        except MQTTProtocolError as exc:
            raise WireError(f"{where}.properties: {exc}") from None
        if end != len(block):
            raise WireError(f"{where}.properties: {len(block) - end} bytes after the property block")
    has = src.HasField
    return Message(
        src.topic,
        src.payload,
        src.qos,
        src.retain,
        properties,
        src.expiry_at if has("expiry_at") else None,
        src.origin,
        src.publisher_id if has("publisher_id") else None,
    )


def _proof_to_proto(proof: OriginProof | None, out: Any, where: str) -> None:
    """An origin proof (broker/cluster/origin_proof.py) into the ``proof`` field of ``out``."""
    if proof is None:
        return
    if not isinstance(proof, OriginProof):
        raise WireError(f"{where}.proof: expected OriginProof, got {type(proof).__name__}")
    _set(out.proof, "signature", proof.signature, f"{where}.proof")
    _set(out.proof, "certificate", proof.certificate, f"{where}.proof")


def _proof_from_proto(src: Any) -> OriginProof | None:
    if not src.HasField("proof"):
        return None
    return OriginProof(src.proof.signature, src.proof.certificate)


def _retained_to_proto(update: RetainedUpdate, out: Any, where: str) -> None:
    if not isinstance(update, RetainedUpdate):
        raise WireError(f"{where}: expected RetainedUpdate, got {type(update).__name__}")
    _set(out, "origin", update.origin, where)
    _set(out, "version_ms", _check_int(update.version_ms, f"{where}.version_ms"), where)
    mqtt_message_to_proto(update.message, out.message, f"{where}.message")
    _proof_to_proto(update.proof, out, where)


def _retained_from_proto(src: Any, where: str) -> RetainedUpdate:
    message = mqtt_message_from_proto(_require(src, "message", f"{where}.message"), f"{where}.message")
    return RetainedUpdate(src.origin, src.version_ms, message, _proof_from_proto(src))


def _claim_to_proto(claim: SessionClaim, out: Any, where: str) -> None:
    out.SetInParent()
    _set(out, "origin", claim.origin, where)
    _set(out, "client_id", claim.client_id, where)
    _set(out, "claim_id", _check_int(claim.claim_id, f"{where}.claim_id"), where)
    _set(out, "clean_start", bool(claim.clean_start), where)
    if claim.username is not None:
        _set(out, "username", claim.username, where)
    if claim.recover:
        _set(out, "recover", True, where)
    _proof_to_proto(claim.proof, out, where)


def _claim_from_proto(body: Any) -> SessionClaim:
    username = body.username if body.HasField("username") else None
    return SessionClaim(
        body.origin,
        body.client_id,
        body.claim_id,
        body.clean_start,
        username,
        body.recover,
        _proof_from_proto(body),
    )


def _forwarded_to_proto(forwarded: ForwardedMessage, out: Any, where: str) -> None:
    _set(out, "origin", forwarded.origin, where)
    _set(out, "stream", forwarded.stream, where)
    _set(out, "seq", _check_int(forwarded.seq, f"{where}.seq"), where)
    if forwarded.low:
        _set(out, "low", _check_int(forwarded.low, f"{where}.low"), where)
    mqtt_message_to_proto(forwarded.message, out.message, f"{where}.message")
    if forwarded.copies:  # a message of a causal group
        _positions_to_proto(forwarded.deps, out.deps, f"{where}.deps")
        for index, (cls, seq) in enumerate(forwarded.copies):
            item = out.copies.add()
            _set(item, "stream", cls, f"{where}.copies[{index}]")
            _set(item, "seq", _check_int(seq, f"{where}.copies[{index}].seq"), f"{where}.copies[{index}]")


def _forwarded_from_proto(src: Any, where: str) -> ForwardedMessage:
    # (the error paths are formatted only on an error: this runs for every forwarded message)
    if not src.HasField("message"):
        raise WireError(f"{where}.message: required field missing")
    try:
        message = mqtt_message_from_proto(src.message)
    except WireError:  # again, naming the field
        mqtt_message_from_proto(src.message, f"{where}.message")
        raise
    if not src.copies:
        return ForwardedMessage(src.origin, src.stream, src.seq, message, src.low)
    copies = tuple((copy.stream, copy.seq) for copy in src.copies)
    return ForwardedMessage(
        src.origin, src.stream, src.seq, message, src.low, _positions_from_proto(src.deps), copies
    )


def _positions_to_proto(positions: Iterable[StreamPosition], out: Any, where: str) -> None:
    for index, position in enumerate(positions):
        item = out.add()
        _set(item, "origin", position.origin, f"{where}[{index}]")
        _set(item, "stream", position.stream, f"{where}[{index}]")
        _set(
            item, "next_seq", _check_int(position.next_seq, f"{where}[{index}].next_seq"), f"{where}[{index}]"
        )


def _positions_from_proto(src: Any) -> tuple[StreamPosition, ...]:
    return tuple(StreamPosition(p.origin, p.stream, p.next_seq) for p in src)


def _stream_body_to_proto(body: Any, out: Any, where: str) -> bool:
    """A reliable-stream body (seed 004) into ``pb.Envelope`` ``out``; False if ``body`` is none."""
    if isinstance(body, StreamAck):
        ack = out.stream_ack
        ack.SetInParent()
        _positions_to_proto(body.positions, ack.positions, f"{where}.StreamAck.positions")
        _positions_to_proto(body.left, ack.left, f"{where}.StreamAck.left")
    elif isinstance(body, StreamRet):
        ret = out.stream_ret
        ret.SetInParent()
        _set(ret, "origin", body.origin, f"{where}.StreamRet")
        _set(ret, "stream", body.stream, f"{where}.StreamRet")
        _set(ret, "from_seq", _check_int(body.from_seq, f"{where}.StreamRet.from_seq"), f"{where}.StreamRet")
        _set(ret, "to_seq", _check_int(body.to_seq, f"{where}.StreamRet.to_seq"), f"{where}.StreamRet")
    elif isinstance(body, StreamResend):
        resend = out.stream_resend
        resend.SetInParent()
        body_where = f"{where}.StreamResend"
        _set(resend, "origin", body.origin, body_where)
        _set(resend, "stream", body.stream, body_where)
        for index, forwarded in enumerate(body.messages):
            _forwarded_to_proto(forwarded, resend.messages.add(), f"{body_where}.messages[{index}]")
        if body.gone_below:
            _set(resend, "gone_below", _check_int(body.gone_below, f"{body_where}.gone_below"), body_where)
    else:
        return False
    return True


def _stream_body_from_proto(src: Any, case: str, where: str) -> StreamAck | StreamRet | StreamResend:
    if case == "stream_ack":
        return StreamAck(
            _positions_from_proto(src.stream_ack.positions), _positions_from_proto(src.stream_ack.left)
        )
    if case == "stream_ret":
        ret = src.stream_ret
        return StreamRet(ret.origin, ret.stream, ret.from_seq, ret.to_seq)
    resend = src.stream_resend
    messages = tuple(
        _forwarded_from_proto(item, f"{where}.StreamResend.messages[{index}]")
        for index, item in enumerate(resend.messages)
    )
    return StreamResend(resend.origin, resend.stream, messages, resend.gone_below)


def payload_to_proto(payload: Any, out: Any | None = None, where: str = "payload") -> Any:
    """A ``broker.cluster.messages.OverlayPayload`` as ``pb.OverlayPayload``."""
    if out is None:
        out = pb.OverlayPayload()
    if isinstance(payload, ForwardedMessage):
        # the same message goes to every destination of a publication and into the send log:
        # encoded once (issue #11), then copied in as bytes
        out.forwarded.MergeFromString(_encoded_forwarded(payload, f"{where}.ForwardedMessage"))
    elif isinstance(payload, ForwardedBatch):
        # one publication, several destinations: the batch's bytes are built once (issue #11)
        out.forwarded_batch.MergeFromString(_encoded_batch(payload, f"{where}.ForwardedBatch"))
    elif isinstance(payload, RetainedUpdate):
        _retained_to_proto(payload, out.retained, f"{where}.RetainedUpdate")
    elif isinstance(payload, SessionClaim):
        _claim_to_proto(payload, out.session_claim, f"{where}.SessionClaim")
    else:
        raise WireError(
            f"{where}: a PUB payload must be ForwardedMessage, ForwardedBatch, RetainedUpdate or "
            "SessionClaim, "
            f"got {type(payload).__name__}"
        )
    return out


def payload_from_proto(src: Any, where: str = "payload") -> Any:
    case = src.WhichOneof("kind")
    if case == "forwarded":
        return _forwarded_from_proto(src.forwarded, f"{where}.ForwardedMessage")
    if case == "forwarded_batch":
        return _batch_from_proto(src.forwarded_batch, f"{where}.ForwardedBatch")
    if case == "retained":
        return _retained_from_proto(src.retained, f"{where}.RetainedUpdate")
    if case == "session_claim":
        return _claim_from_proto(src.session_claim)
    raise WireError(f"{where}: OverlayPayload without a kind (unknown to this schema version?)")


def snapshot_to_proto(snapshot: SessionSnapshot, out: Any, where: str = "snapshot") -> None:
    if not isinstance(snapshot, SessionSnapshot):
        raise WireError(f"{where}: expected SessionSnapshot, got {type(snapshot).__name__}")
    _set(out, "client_id", snapshot.client_id, where)
    _set(out, "protocol_level", _check_int(snapshot.protocol_level, f"{where}.protocol_level"), where)
    _set(
        out, "expiry_interval_s", _check_int(snapshot.expiry_interval_s, f"{where}.expiry_interval_s"), where
    )
    if snapshot.username is not None:
        _set(out, "username", snapshot.username, where)
    for index, sub in enumerate(snapshot.subscriptions):
        sub_where = f"{where}.subscriptions[{index}]"
        if not isinstance(sub, SubOptions):
            raise WireError(f"{sub_where}: expected SubOptions, got {type(sub).__name__}")
        item = out.subscriptions.add()
        _set(item, "topic_filter", sub.topic_filter, sub_where)
        _set(item, "qos", _check_int(sub.qos, f"{sub_where}.qos"), sub_where)
        _set(item, "no_local", bool(sub.no_local), sub_where)
        _set(item, "retain_as_published", bool(sub.retain_as_published), sub_where)
        _set(
            item,
            "retain_handling",
            _check_int(sub.retain_handling, f"{sub_where}.retain_handling"),
            sub_where,
        )
        if sub.subscription_identifier is not None:
            _set(item, "subscription_identifier", sub.subscription_identifier, sub_where)
        if sub.share_group is not None:
            _set(item, "share_group", sub.share_group, sub_where)
        _set(item, "match_filter", sub.match_filter, sub_where)
    for index, entry in enumerate(snapshot.pending):
        entry_where = f"{where}.pending[{index}]"
        if not isinstance(entry, OutEntry):
            raise WireError(f"{entry_where}: expected OutEntry, got {type(entry).__name__}")
        item = out.pending.add()
        mqtt_message_to_proto(entry.message, item.message, f"{entry_where}.message")
        _set(item, "qos", _check_int(entry.qos, f"{entry_where}.qos"), entry_where)
        _set(item, "retain", bool(entry.retain), entry_where)
        try:
            item.subscription_identifiers.extend(entry.subscription_identifiers)
        except (ValueError, TypeError) as exc:
            raise WireError(f"{entry_where}.subscription_identifiers: {exc}") from None
        if entry.seq is not None:
            _set(item, "seq", entry.seq, entry_where)
        if entry.packet_id is not None:
            _set(item, "packet_id", entry.packet_id, entry_where)
        _set(item, "state", _check_int(entry.state, f"{entry_where}.state"), entry_where)
        if entry.share_key is not None:
            group, topic_filter = entry.share_key
            _set(item.share_key, "group", group, f"{entry_where}.share_key")
            _set(item.share_key, "filter", topic_filter, f"{entry_where}.share_key")
    try:
        out.incoming_qos2.extend(sorted(snapshot.incoming_qos2))
    except (ValueError, TypeError) as exc:
        raise WireError(f"{where}.incoming_qos2: {exc}") from None
    _set(out, "next_packet_id", _check_int(snapshot.next_packet_id, f"{where}.next_packet_id"), where)
    will = snapshot.will
    if will is not None:
        if not isinstance(will, Will):
            raise WireError(f"{where}.will: expected Will, got {type(will).__name__}")
        properties = {k: v for k, v in will.properties.items() if k != "will_delay_interval"}
        delay = _check_int(will.properties.get("will_delay_interval", 0), f"{where}.will.will_delay_interval")
        message = Message(will.topic, will.payload, will.qos, will.retain, properties)
        mqtt_message_to_proto(message, out.will, f"{where}.will")
        _set(out, "will_delay_interval_s", delay, where)
    if snapshot.will_fire_at is not None:
        _set(out, "will_fire_at", float(snapshot.will_fire_at), where)
    if snapshot.disconnected_at is not None:
        _set(out, "disconnected_at", float(snapshot.disconnected_at), where)


def _will_from_proto(src: Any, where: str) -> Will | None:
    if not src.HasField("will"):
        return None
    message = mqtt_message_from_proto(src.will, f"{where}.will")
    properties = dict(message.properties)
    if src.will_delay_interval_s:
        properties["will_delay_interval"] = src.will_delay_interval_s
    return Will(message.topic, message.payload, message.qos, message.retain, properties)


def snapshot_from_proto(src: Any, where: str = "snapshot") -> SessionSnapshot:
    subscriptions = [
        SubOptions(
            topic_filter=sub.topic_filter,
            qos=sub.qos,
            no_local=sub.no_local,
            retain_as_published=sub.retain_as_published,
            retain_handling=sub.retain_handling,
            subscription_identifier=(
                sub.subscription_identifier if sub.HasField("subscription_identifier") else None
            ),
            share_group=sub.share_group if sub.HasField("share_group") else None,
            match_filter=sub.match_filter,
        )
        for sub in src.subscriptions
    ]
    pending = []
    for index, entry in enumerate(src.pending):
        entry_where = f"{where}.pending[{index}]"
        pending.append(
            OutEntry(
                message=mqtt_message_from_proto(
                    _require(entry, "message", f"{entry_where}.message"), f"{entry_where}.message"
                ),
                qos=entry.qos,
                retain=entry.retain,
                subscription_identifiers=list(entry.subscription_identifiers),
                seq=entry.seq if entry.HasField("seq") else None,
                packet_id=entry.packet_id if entry.HasField("packet_id") else None,
                state=entry.state,
                share_key=(entry.share_key.group, entry.share_key.filter)
                if entry.HasField("share_key")
                else None,
            )
        )
    return SessionSnapshot(
        client_id=src.client_id,
        protocol_level=src.protocol_level,
        expiry_interval_s=src.expiry_interval_s,
        username=src.username if src.HasField("username") else None,
        subscriptions=subscriptions,
        pending=pending,
        incoming_qos2=set(src.incoming_qos2),
        next_packet_id=src.next_packet_id,
        will=_will_from_proto(src, where),
        will_fire_at=src.will_fire_at if src.HasField("will_fire_at") else None,
        disconnected_at=src.disconnected_at if src.HasField("disconnected_at") else None,
    )


def envelope_to_proto(envelope: Envelope, out: Any | None = None, where: str = "envelope") -> Any:
    """A seed 002 :class:`Envelope` (with its directed body) as ``pb.Envelope``."""
    if out is None:
        out = pb.Envelope()
    for name in ("orig", "dest", "from_client", "to_client"):
        _set(out, name, getattr(envelope, name), where)
    _set(out, "ref", _check_int(envelope.ref, f"{where}.ref"), where)
    _set(out, "ttl", _check_int(envelope.ttl, f"{where}.ttl"), where)
    _proof_to_proto(envelope.proof, out, where)
    body = envelope.body
    if isinstance(body, ClaimReply):
        reply = out.claim_reply
        body_where = f"{where}.ClaimReply"
        _set(reply, "claim_id", _check_int(body.claim_id, f"{body_where}.claim_id"), body_where)
        _set(reply, "client_id", body.client_id, body_where)
        _set(reply, "had_client", bool(body.had_client), body_where)
        if body.snapshot is not None:
            snapshot_to_proto(body.snapshot, reply.snapshot, f"{body_where}.snapshot")
        else:
            reply.SetInParent()
        _positions_to_proto(body.positions, reply.positions, f"{body_where}.positions")
        if body.refused:
            reply.refused = True
    elif isinstance(body, RetainedSyncRequest):
        body_where = f"{where}.RetainedSyncRequest"
        out.retained_sync_request.SetInParent()
        _set(out.retained_sync_request, "request_id", _check_int(body.request_id, body_where), body_where)
        if body.digest is not None:
            _set(
                out.retained_sync_request,
                "digest",
                _check_int(body.digest, f"{body_where}.digest"),
                body_where,
            )
    elif isinstance(body, RetainedSyncReply):
        body_where = f"{where}.RetainedSyncReply"
        sync = out.retained_sync_reply
        sync.SetInParent()
        _set(sync, "request_id", _check_int(body.request_id, f"{body_where}.request_id"), body_where)
        for index, update in enumerate(body.updates):
            _retained_to_proto(update, sync.updates.add(), f"{body_where}.updates[{index}]")
        _set(sync, "last", bool(body.last), body_where)
    elif isinstance(body, SessionClaim):
        _claim_to_proto(body, out.session_claim, f"{where}.SessionClaim")
    elif isinstance(body, ClassInterest):
        interest = out.class_interest
        interest.SetInParent()
        for name in ("subscribed", "unsubscribed"):
            for index, cls in enumerate(getattr(body, name)):
                if not isinstance(cls, str):
                    raise WireError(f"{where}.ClassInterest.{name}[{index}]: expected str")
                getattr(interest, name).append(cls)
        _set(interest, "full", bool(body.full), f"{where}.ClassInterest")
        _set(
            interest,
            "epoch",
            _check_int(body.epoch, f"{where}.ClassInterest.epoch"),
            f"{where}.ClassInterest",
        )
        _set(
            interest,
            "version",
            _check_int(body.version, f"{where}.ClassInterest.version"),
            f"{where}.ClassInterest",
        )
        if body.leaving:
            interest.leaving = True
    elif not _stream_body_to_proto(body, out, where):
        raise WireError(
            f"{where}.body: must be ClaimReply, RetainedSyncRequest, RetainedSyncReply, StreamAck, "
            "StreamRet or StreamResend, "
            f"got {type(body).__name__}"
        )
    return out


def envelope_from_proto(src: Any, where: str = "envelope") -> Envelope:
    case = src.WhichOneof("body")
    body: DirectedBody
    if case == "claim_reply":
        reply = src.claim_reply
        snapshot = (
            snapshot_from_proto(reply.snapshot, f"{where}.ClaimReply.snapshot")
            if reply.HasField("snapshot")
            else None
        )
        body = ClaimReply(
            reply.claim_id,
            reply.client_id,
            reply.had_client,
            snapshot,
            _positions_from_proto(reply.positions),
            reply.refused,
        )
    elif case == "retained_sync_request":
        request = src.retained_sync_request
        body = RetainedSyncRequest(request.request_id, request.digest if request.HasField("digest") else None)
    elif case == "retained_sync_reply":
        sync = src.retained_sync_reply
        updates = tuple(
            _retained_from_proto(update, f"{where}.RetainedSyncReply.updates[{index}]")
            for index, update in enumerate(sync.updates)
        )
        body = RetainedSyncReply(sync.request_id, updates, sync.last)
    elif case == "class_interest":
        interest = src.class_interest
        body = ClassInterest(
            tuple(interest.subscribed),
            tuple(interest.unsubscribed),
            interest.full,
            interest.epoch,
            interest.version,
            interest.leaving,
        )
    elif case == "session_claim":
        body = _claim_from_proto(src.session_claim)
    elif case in ("stream_ack", "stream_ret", "stream_resend"):
        body = _stream_body_from_proto(src, case, where)
    else:
        raise WireError(f"{where}: Envelope without a body (unknown to this schema version?)")
    return Envelope(
        src.orig, src.dest, src.from_client, src.to_client, src.ref, src.ttl, body, _proof_from_proto(src)
    )


def _length_delimited(number: int, data: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(data)) + data


_varint = varint
_SMALL_VARINTS = tuple(varint(value) for value in range(128))


def encode_forwarded(forwarded: ForwardedMessage) -> bytes:
    """A forwarded message as bytes (the send log's rows, ``broker.adapters.cluster_store``)."""
    return _encoded_forwarded(forwarded, "forwarded")


# the serialized pb.ForwardedMessage of the last few ForwardedMessage objects encoded (by
# identity; the objects are kept, so an id is not reused while its entry lives)
_ENCODED_FORWARDED: dict[int, tuple[ForwardedMessage, bytes]] = {}
_ENCODED_FORWARDED_LIMIT = 512  # >= a batch (broker.cluster.streams.BATCH_MAX_MESSAGES)
_BATCH_MESSAGES_TAG = bytes(((1 << 3) | 2,))  # ForwardedBatch.messages: field 1, length-delimited
_ENCODED_BATCH: dict[int, tuple[ForwardedBatch, bytes]] = {}  # as _ENCODED_FORWARDED, per batch
_ENCODED_BATCH_LIMIT = 8
_BATCH_PROOF_NUMBER = pb.ForwardedBatch.DESCRIPTOR.fields_by_name["proof"].number


def _encoded_forwarded(forwarded: ForwardedMessage, where: str) -> bytes:
    cached = _ENCODED_FORWARDED.get(id(forwarded))
    if cached is not None and cached[0] is forwarded:
        return cached[1]
    data = encode_forwarded_fast(forwarded)  # the common shape, written directly (issue #11)
    if data is None:
        out = pb.ForwardedMessage()
        _forwarded_to_proto(forwarded, out, where)
        data = bytes(out.SerializeToString())
    if len(_ENCODED_FORWARDED) >= _ENCODED_FORWARDED_LIMIT:
        del _ENCODED_FORWARDED[next(iter(_ENCODED_FORWARDED))]
    _ENCODED_FORWARDED[id(forwarded)] = (forwarded, data)
    return data


def _encoded_batch(batch: ForwardedBatch, where: str) -> bytes:
    """The serialized pb.ForwardedBatch, from each message's cached bytes (the send log encoded
    the QoS >= 1 ones already), built once per batch and reused for every destination."""
    cached = _ENCODED_BATCH.get(id(batch))
    if cached is not None and cached[0] is batch:
        return cached[1]
    if not batch.messages:
        raise WireError(f"{where}: an empty ForwardedBatch")
    parts: list[bytes] = []
    tag = _BATCH_MESSAGES_TAG
    cache = _ENCODED_FORWARDED
    small = _SMALL_VARINTS
    for index, forwarded in enumerate(batch.messages):
        # the send log encoded the QoS >= 1 ones (``encode_forwarded``); a QoS 0 one is encoded
        # here only, and not cached: nothing asks for its bytes again (issue #11)
        logged = cache.get(id(forwarded))
        if logged is not None and logged[0] is forwarded:
            data = logged[1]
        else:
            fast = encode_forwarded_fast(forwarded)
            data = fast if fast is not None else _encoded_forwarded(forwarded, f"{where}.messages[{index}]")
        size = len(data)
        parts += (tag, small[size] if size < 128 else _varint(size), data)
    proof = batch.proof
    if proof is not None:  # the origin's signature over the batch (broker/cluster/origin_proof.py)
        if not isinstance(proof, OriginProof):
            raise WireError(f"{where}.proof: expected OriginProof, got {type(proof).__name__}")
        # (OriginProof: 1 signature, 2 certificate)
        fields = _length_delimited(1, bytes(proof.signature)) + _length_delimited(2, bytes(proof.certificate))
        parts.append(_length_delimited(_BATCH_PROOF_NUMBER, fields))
    encoded = b"".join(parts)
    if len(_ENCODED_BATCH) >= _ENCODED_BATCH_LIMIT:
        del _ENCODED_BATCH[next(iter(_ENCODED_BATCH))]
    _ENCODED_BATCH[id(batch)] = (batch, encoded)
    return encoded


def _batch_from_proto(src: Any, where: str) -> ForwardedBatch:
    messages = src.messages
    if not messages:
        raise WireError(f"{where}: an empty ForwardedBatch")
    try:
        return ForwardedBatch(
            tuple(_forwarded_from_proto(item, where) for item in messages), _proof_from_proto(src)
        )
    except WireError:  # again, naming the message at fault
        for index, item in enumerate(messages):
            _forwarded_from_proto(item, f"{where}.messages[{index}]")
        raise


def decode_forwarded(data: bytes) -> ForwardedMessage:
    return _forwarded_from_proto(_parse(pb.ForwardedMessage, data, "ForwardedMessage"), "forwarded")
