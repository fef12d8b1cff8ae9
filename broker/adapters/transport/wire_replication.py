"""The wire codec of replicated durability (``cluster.replicas``): the records of
``broker.cluster.replication_messages`` as ``skipmq.v1.Replica`` (protos/skipmq/v1/cluster.proto),
carried as the ``replica`` kind of a link ``Item`` (``broker.adapters.transport.wire``).

Every problem raises :class:`WireError` naming the message and field, like the rest of the wire.
"""

from __future__ import annotations

from typing import Any

from broker.adapters.transport.wire_base import WireError
from broker.adapters.transport.wire_cluster import (
    _positions_from_proto,
    _positions_to_proto,
    mqtt_message_from_proto,
    mqtt_message_to_proto,
    snapshot_from_proto,
    snapshot_to_proto,
)
from broker.cluster.replication_messages import (
    REPLICA_KINDS as REPLICA_KINDS,  # (re-exported: ``wire`` reads it from here)
)
from broker.cluster.replication_messages import (
    ReplicaAck,
    ReplicaAppend,
    ReplicaHandedOver,
    ReplicaHello,
    ReplicaItem,
    ReplicaLeaving,
    ReplicaRelease,
    SessionAck,
    SessionCopy,
    SessionCopyTaken,
    SessionLookup,
    SessionReplica,
)

_MAX_SEQ = 2**64 - 1


def _seq(value: int, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_SEQ:
        raise WireError(f"{where}: {value!r} is not a uint64")
    return value


def replica_to_proto(item: ReplicaItem, out: Any) -> None:
    """``item`` into ``out`` (a ``pb.Replica``)."""
    if isinstance(item, ReplicaAppend):
        body = out.append
        body.incarnation = item.incarnation
        body.first_seq = _seq(item.first_seq, "Replica.append.first_seq")
        body.released = _seq(item.released, "Replica.append.released")
        for index, message in enumerate(item.messages):
            mqtt_message_to_proto(message, body.messages.add(), f"Replica.append.messages[{index}]")
    elif isinstance(item, ReplicaAck):
        out.ack.incarnation = item.incarnation
        out.ack.next_seq = _seq(item.next_seq, "Replica.ack.next_seq")
    elif isinstance(item, ReplicaRelease):
        out.release.incarnation = item.incarnation
        out.release.upto = _seq(item.upto, "Replica.release.upto")
    elif isinstance(item, ReplicaHello):
        out.hello.incarnation = item.incarnation
        out.hello.started_empty = bool(item.started_empty)
        out.hello.wants_reply = bool(item.wants_reply)
    elif isinstance(item, SessionReplica):
        body = out.session
        body.incarnation = item.incarnation
        body.client_id = item.client_id
        body.version = _seq(item.version, "Replica.session.version")
        if item.snapshot is not None:
            snapshot_to_proto(item.snapshot, body.snapshot, "Replica.session.snapshot")
        _positions_to_proto(item.positions, body.positions, "Replica.session.positions")
    elif isinstance(item, SessionAck):
        out.session_ack.incarnation = item.incarnation
        out.session_ack.client_id = item.client_id
        out.session_ack.version = _seq(item.version, "Replica.session_ack.version")
    elif isinstance(item, ReplicaLeaving):
        out.leaving.incarnation = item.incarnation
    elif isinstance(item, ReplicaHandedOver):
        out.handed_over.incarnation = item.incarnation
    elif isinstance(item, SessionLookup):
        out.lookup.lookup_id = _seq(item.lookup_id, "Replica.lookup.lookup_id")
        out.lookup.client_id = item.client_id
    elif isinstance(item, SessionCopy):
        body = out.copy
        body.lookup_id = _seq(item.lookup_id, "Replica.copy.lookup_id")
        body.home = item.home
        body.incarnation = item.incarnation
        if item.snapshot is not None:  # (none: "no copy here")
            snapshot_to_proto(item.snapshot, body.snapshot, "Replica.copy.snapshot")
        _positions_to_proto(item.positions, body.positions, "Replica.copy.positions")
    elif isinstance(item, SessionCopyTaken):
        out.copy_taken.incarnation = item.incarnation
        out.copy_taken.home = item.home
        out.copy_taken.client_id = item.client_id
    else:
        raise WireError(f"Replica: {type(item).__name__} is not a replication record")


def replica_from_proto(src: Any) -> ReplicaItem:
    """A ``pb.Replica`` as its record; WireError for an empty or invalid one."""
    case = src.WhichOneof("kind")
    if case == "append":
        body = src.append
        if not body.incarnation:
            raise WireError("Replica.append: empty incarnation")
        if body.first_seq < 1:
            raise WireError("Replica.append: first_seq must be at least 1")
        messages = tuple(
            mqtt_message_from_proto(message, f"Replica.append.messages[{index}]")
            for index, message in enumerate(body.messages)
        )
        return ReplicaAppend(body.incarnation, body.first_seq, messages, body.released)
    if case == "ack":
        if not src.ack.incarnation:
            raise WireError("Replica.ack: empty incarnation")
        return ReplicaAck(src.ack.incarnation, src.ack.next_seq)
    if case == "release":
        if not src.release.incarnation:
            raise WireError("Replica.release: empty incarnation")
        return ReplicaRelease(src.release.incarnation, src.release.upto)
    if case == "hello":
        if not src.hello.incarnation:
            raise WireError("Replica.hello: empty incarnation")
        return ReplicaHello(src.hello.incarnation, src.hello.started_empty, src.hello.wants_reply)
    if case == "session":
        body = src.session
        if not body.incarnation or not body.client_id:
            raise WireError("Replica.session: empty incarnation or client_id")
        snapshot = None
        if body.HasField("snapshot"):
            snapshot = snapshot_from_proto(body.snapshot, "Replica.session.snapshot")
        if snapshot is not None and snapshot.client_id != body.client_id:
            raise WireError("Replica.session: the snapshot is of another client id")
        positions = _positions_from_proto(body.positions)
        return SessionReplica(body.incarnation, body.client_id, body.version, snapshot, positions)
    if case == "session_ack":
        body = src.session_ack
        if not body.incarnation or not body.client_id:
            raise WireError("Replica.session_ack: empty incarnation or client_id")
        return SessionAck(body.incarnation, body.client_id, body.version)
    if case == "leaving":
        if not src.leaving.incarnation:
            raise WireError("Replica.leaving: empty incarnation")
        return ReplicaLeaving(src.leaving.incarnation)
    if case == "handed_over":
        if not src.handed_over.incarnation:
            raise WireError("Replica.handed_over: empty incarnation")
        return ReplicaHandedOver(src.handed_over.incarnation)
    if case == "lookup":
        if not src.lookup.client_id:
            raise WireError("Replica.lookup: empty client_id")
        return SessionLookup(src.lookup.lookup_id, src.lookup.client_id)
    if case == "copy":
        body = src.copy
        if not body.HasField("snapshot"):  # "no copy here" (an answer that names nothing)
            if body.home or body.incarnation or body.positions:
                raise WireError("Replica.copy: a home, incarnation or positions without a snapshot")
            return SessionCopy(body.lookup_id, "", "", None)
        if not body.home or not body.incarnation:
            raise WireError("Replica.copy: empty home or incarnation")
        copy_snapshot = snapshot_from_proto(body.snapshot, "Replica.copy.snapshot")
        return SessionCopy(
            body.lookup_id, body.home, body.incarnation, copy_snapshot, _positions_from_proto(body.positions)
        )
    if case == "copy_taken":
        body = src.copy_taken
        if not body.incarnation or not body.home or not body.client_id:
            raise WireError("Replica.copy_taken: empty incarnation, home or client_id")
        return SessionCopyTaken(body.incarnation, body.home, body.client_id)
    raise WireError("Replica: without a kind (unknown to this schema version?)")
