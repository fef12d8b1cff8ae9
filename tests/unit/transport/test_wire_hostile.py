"""Hostile cluster items (issue #12, "the gRPC handlers with malformed and hostile frames"):
seeded mutations (bit flips, insertions, deletions, truncations, hostile length fields, splices:
``tools.fuzz_mqtt.mutate``) of well-encoded items of every overlay kind and of the cluster
envelopes (ClaimReply with a session, retained-store copies, session claims, stream resends).

Decoding a hostile item either gives an item or raises ``wire.WireError`` (which makes the link
skip that item, broker/adapters/transport/link.py) - never another exception; and what decodes
goes through the inbound validation (broker/cluster/inbound.py) without raising. The process
test of the same over a real certified link is
tests/process/cluster/test_cluster_security.py::test_mutated_items_close_at_most_their_own_stream.
"""

from __future__ import annotations

import random

import pytest

from broker.adapters.transport import wire
from broker.cluster.inbound import envelope_problem
from broker.cluster.messages import (
    ClaimReply,
    Envelope,
    ForwardedMessage,
    RetainedSyncReply,
    RetainedSyncRequest,
    RetainedUpdate,
    SessionClaim,
    StreamResend,
)
from broker.core.session import STATE_PUBLISH_SENT, Message, OutEntry, SessionSnapshot, SubOptions
from tests.unit.transport.test_wire import _one_of_each_overlay_kind
from tools.fuzz_mqtt import mutate

A, B = "10.0.0.1:7883", "10.0.0.2:7883"
MUTATIONS = 20_000


def _envelopes() -> list[Envelope]:
    message = Message("t/x", b"payload", qos=1, retain=False, origin=f"{A}/1")
    snapshot = SessionSnapshot(
        client_id="dev-1",
        protocol_level=5,
        expiry_interval_s=300,
        username="alice",
        subscriptions=[SubOptions("a/#", 1, False, False, 0, None, None, "a/#")],
        pending=[OutEntry(message, 1, False, [3], seq=7, packet_id=5, state=STATE_PUBLISH_SENT)],
        incoming_qos2={3},
        next_packet_id=9,
    )
    bodies: list[object] = [
        ClaimReply(42, "dev-1", True, snapshot),
        ClaimReply(43, "dev-2", False, None),
        RetainedSyncRequest(5),
        RetainedSyncReply(5, (RetainedUpdate(A, 1, Message("r/t", b"x", retain=True)),), True),
        StreamResend(f"{A}/1", "cls", (ForwardedMessage(f"{A}/1", "cls", 1, message),)),
    ]
    return [Envelope(A, B, "dev-1", "", 42, 8, body) for body in bodies]  # type: ignore[arg-type]


def _seeds() -> list[bytes]:
    items: list[object] = [*_one_of_each_overlay_kind(), *_envelopes(), SessionClaim(A, "dev-1", 1, False)]
    encoded = []
    for item in items:
        try:
            encoded.append(wire.encode_item(item))
        except wire.WireError:  # a kind that travels only inside another item
            continue
    return encoded


def test_the_seeds_decode() -> None:
    seeds = _seeds()
    assert len(seeds) >= 15
    for data in seeds:
        wire.decode_item(data)


@pytest.mark.parametrize("seed", [1, 2])
def test_mutated_items_decode_or_raise_a_wire_error_only(seed: int) -> None:
    rng = random.Random(seed)
    seeds = _seeds()
    decoded = rejected = 0
    for _ in range(MUTATIONS // 2):
        data = mutate(rng.choice(seeds), rng, seeds)
        try:
            item = wire.decode_item(data)
        except wire.WireError:
            rejected += 1
            continue
        decoded += 1
        if isinstance(item, Envelope):
            envelope_problem(A, B, item)  # must not raise on whatever decoded
    assert decoded and rejected  # both paths were exercised
