"""One list of the replication record kinds (``replication_messages.REPLICA_KINDS``): the wire
codec and the engine's input check read the same tuple, and it names every member of the
``ReplicaItem`` union - a record added to one and not the other fails here."""

from __future__ import annotations

import typing

from broker.adapters.transport import wire, wire_replication
from broker.cluster import engine_replication, replication_messages
from broker.cluster.replication_messages import REPLICA_KINDS, ReplicaItem


def test_the_tuple_names_every_replica_item_once() -> None:
    assert len(set(REPLICA_KINDS)) == len(REPLICA_KINDS) == 11
    assert set(REPLICA_KINDS) == set(typing.get_args(ReplicaItem))


def test_the_wire_and_the_engine_read_the_same_tuple() -> None:
    assert wire_replication.REPLICA_KINDS is replication_messages.REPLICA_KINDS
    assert wire.REPLICA_KINDS is replication_messages.REPLICA_KINDS
    assert engine_replication.REPLICA_KINDS is replication_messages.REPLICA_KINDS
