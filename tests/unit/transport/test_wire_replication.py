"""The replication records on the wire (``skipmq.v1.Replica``, the ``replica`` kind of a link Item):
round trips, and bad input refused with a WireError naming the field."""

from __future__ import annotations

import pytest

from broker.adapters.transport import wire
from broker.adapters.transport.wire import WireError, pb
from broker.cluster.replication_messages import ReplicaAck, ReplicaAppend, ReplicaHello, ReplicaRelease
from broker.core.messages import Message


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
