"""The wire codec of replicated durability (``cluster.replicas``): the records of
``broker.cluster.replication_messages`` as ``skipmq.v1.Replica`` (protos/skipmq/v1/cluster.proto),
carried as the ``replica`` kind of a link ``Item`` (``broker.adapters.transport.wire``).

Every problem raises :class:`WireError` naming the message and field, like the rest of the wire.
"""

from __future__ import annotations

from typing import Any

from broker.adapters.transport.wire_base import WireError
from broker.adapters.transport.wire_cluster import mqtt_message_from_proto, mqtt_message_to_proto
from broker.cluster.replication_messages import (
    ReplicaAck,
    ReplicaAppend,
    ReplicaHello,
    ReplicaItem,
    ReplicaRelease,
)

REPLICA_KINDS: tuple[type, ...] = (ReplicaHello, ReplicaAppend, ReplicaAck, ReplicaRelease)
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
    raise WireError("Replica: without a kind (unknown to this schema version?)")
