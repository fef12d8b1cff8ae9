"""The replication records on the wire (``skipmq.v1.Replica``, the ``replica`` kind of a link Item):
round trips, and bad input refused with a WireError naming the field."""

from __future__ import annotations

import pytest

from broker.adapters.transport import wire
from broker.adapters.transport.wire import WireError, pb
from broker.cluster.messages import StreamPosition
from broker.cluster.replication_messages import (
    ReplicaAck,
    ReplicaAppend,
    ReplicaHandedOver,
    ReplicaHello,
    ReplicaLeaving,
    ReplicaRelease,
    SessionAck,
    SessionCopy,
    SessionCopyTaken,
    SessionLookup,
    SessionReplica,
)
from broker.core.messages import STATE_PUBLISH_SENT, Message, OutEntry, SessionSnapshot, SubOptions


def test_every_replication_record_round_trips_as_a_link_item() -> None:
    message = Message("a/b", b"\x00payload", 1, True, {"user_property": [("k", "v")]}, 1.5e9, "node-1", "pub")
    bare = Message("c", b"", 2, False, {}, None, "node-2", None)
    records = [
        ReplicaHello("0123456789ab", started_empty=True, wants_reply=False),
        ReplicaHello("0123456789ab", started_empty=False),
        ReplicaAppend("0123456789ab", 7, (message, bare), 3),
        ReplicaAppend("0123456789ab", 1, (), 1),
        ReplicaAck("0123456789ab", 2**40),
        ReplicaRelease("0123456789ab", 9),
    ]
    for record in records:
        assert wire.decode_item(wire.encode_item(record)) == record
    frame = wire.encode_frame(records)
    assert wire.decode_frame(frame) == records


def test_bad_replication_records_are_refused_naming_the_field() -> None:
    cases = []
    item = pb.Item()
    item.replica.SetInParent()  # a Replica without a kind
    cases.append((item, "Replica: without a kind"))
    item = pb.Item()
    item.replica.ack.next_seq = 3  # no incarnation
    cases.append((item, "Replica.ack: empty incarnation"))
    item = pb.Item()
    item.replica.append.incarnation = "x"  # first_seq 0
    cases.append((item, "Replica.append: first_seq"))
    item = pb.Item()
    item.replica.append.incarnation = "x"
    item.replica.append.first_seq = 1
    item.replica.append.messages.add().properties = b"\x05\xff"  # a broken property block
    cases.append((item, r"Replica.append.messages\[0\].properties"))
    for bad, match in cases:
        with pytest.raises(WireError, match=match):
            wire.decode_item(bad.SerializeToString())
    with pytest.raises(WireError, match=r"Replica\.ack\.next_seq"):
        wire.encode_item(ReplicaAck("x", -1))


def test_the_session_and_drain_records_round_trip_and_bad_ones_are_refused() -> None:
    message = Message("a/b", b"q", 1, False, {}, None, "node-1", "pub")
    snapshot = SessionSnapshot(
        client_id="dev-1",
        protocol_level=5,
        expiry_interval_s=600,
        username="u",
        subscriptions=[SubOptions("a/+", 1, False, False, 0, 7, None, "a/+")],
        pending=[
            OutEntry(message, 1, False, [7], seq=3, packet_id=4, state=STATE_PUBLISH_SENT),
            OutEntry(message, 1, False, [], seq=4),
        ],
        incoming_qos2={2},
        next_packet_id=5,
    )
    positions = (StreamPosition("n1", "a", 12), StreamPosition("n2", "a", 1))
    records = [
        SessionReplica("inc1", "dev-1", 9, snapshot, positions),
        SessionReplica("inc1", "dev-1", 10, None),
        SessionAck("inc1", "dev-1", 10),
        ReplicaLeaving("inc1"),
        ReplicaHandedOver("inc2"),
        SessionLookup(3, "dev-1"),
        SessionCopy(3, "10.0.0.1:7000", "inc1", snapshot, positions),
        SessionCopy(3, "", "", None),  # "no copy here"
        SessionCopyTaken("inc1", "10.0.0.1:7000", "dev-1"),
    ]
    for record in records:
        assert wire.decode_item(wire.encode_item(record)) == record
    assert wire.decode_frame(wire.encode_frame(records)) == records
    bad = pb.Item()
    bad.replica.session.incarnation = "inc1"  # no client id
    with pytest.raises(WireError, match=r"Replica\.session: empty"):
        wire.decode_item(bad.SerializeToString())
    bad = pb.Item()
    bad.replica.session.incarnation = "inc1"
    bad.replica.session.client_id = "dev-1"
    bad.replica.session.snapshot.client_id = "dev-2"
    with pytest.raises(WireError, match="another client id"):
        wire.decode_item(bad.SerializeToString())
    bad = pb.Item()
    bad.replica.copy.home = "h"  # no snapshot, yet a home
    with pytest.raises(WireError, match=r"Replica\.copy: a home"):
        wire.decode_item(bad.SerializeToString())
    bad = pb.Item()
    bad.replica.copy.snapshot.client_id = "dev-1"  # a snapshot, no home
    with pytest.raises(WireError, match=r"Replica\.copy: empty home"):
        wire.decode_item(bad.SerializeToString())
