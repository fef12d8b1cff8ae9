"""Round trips of the skipmq.v1 wire (broker/transport/wire.py, protos/skipmq/v1/cluster.proto).

Every overlay message kind of overlay/messages.py (seed 003 Table 1 queries and maintenance),
every PUB payload and directed body of broker/cluster/messages.py (seed 002 envelope), None
fields, nested GONE, sessions with pending entries and every PUBLISH property kind; bad values
and malformed bytes raise WireError naming the problem.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.adapters.transport import wire
from broker.adapters.transport._pb.skipmq.v1 import cluster_pb2 as pb
from broker.cluster.messages import (
    ClaimReply,
    Envelope,
    ForwardedBatch,
    ForwardedMessage,
    RetainedSyncReply,
    RetainedSyncRequest,
    RetainedUpdate,
    SessionClaim,
)
from broker.core.session import (
    STATE_PUBLISH_SENT,
    STATE_PUBREL_SENT,
    Message,
    OutEntry,
    SessionSnapshot,
    SubOptions,
)
from overlay import messages as om

# ------------------------------------------------------------------------------- strategies

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
peer_ids = st.builds(
    lambda host, port: f"{host}:{port}", st.sampled_from(["10.0.0.1", "b2", "::1"]), st.integers(1, 65535)
)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
node_keys = st.tuples(texts, st.integers(0, 1), peer_ids)
keys = st.one_of(node_keys, st.tuples(texts, st.integers(0, 2)), st.just(()))
refs = st.tuples(node_keys, u64)

all_properties = st.fixed_dictionaries(
    {},
    optional={
        "payload_format_indicator": st.integers(0, 1),
        "message_expiry_interval": u32,
        "content_type": texts.filter(lambda s: "\x00" not in s),
        "response_topic": st.text(alphabet="abc/", min_size=1, max_size=8),
        "correlation_data": st.binary(max_size=16),
        "user_property": st.lists(
            st.tuples(st.text("xyz", max_size=4), st.text("uvw", max_size=4)), min_size=1, max_size=3
        ),
        "subscription_identifier": st.lists(st.integers(1, 268_435_455), min_size=1, max_size=3),
    },
)
mqtt_messages = st.builds(
    Message,
    topic=texts,
    payload=st.binary(max_size=64),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    properties=all_properties,
    expiry_at=st.one_of(st.none(), st.floats(0, 4e9, allow_nan=False)),
    origin=st.one_of(st.just(""), peer_ids),
    publisher_id=st.one_of(st.none(), texts),
)
retained_updates = st.builds(
    RetainedUpdate, origin=peer_ids, version_ms=st.integers(0, 2**62), message=mqtt_messages
)
payloads = st.one_of(
    st.builds(ForwardedMessage, origin=peer_ids, stream=texts, seq=u64, message=mqtt_messages),
    retained_updates,
    st.builds(SessionClaim, origin=peer_ids, client_id=texts, claim_id=u64, clean_start=st.booleans()),
)
_FIELD_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "int": u32,
    "bool": st.booleans(),
    "str": texts,
    "Key": keys,
    "Key | None": st.one_of(st.none(), keys),
    "NodeRef": refs,
    "NodeRef | None": st.one_of(st.none(), refs),
    "tuple[Key, ...]": st.lists(keys, max_size=4).map(tuple),
}


def _overlay_strategy(cls: type, bounced: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for field in dataclasses.fields(cls):
        if (cls, field.name) == (om.PUB, "payload"):
            kwargs[field.name] = payloads
        elif (cls, field.name) == (om.SEARCH, "origin"):
            kwargs[field.name] = peer_ids
        elif (cls, field.name) == (om.GONE, "bounced"):
            kwargs[field.name] = bounced
        else:
            kwargs[field.name] = _FIELD_STRATEGIES[str(field.type)]
    return st.builds(cls, **kwargs)


flat_overlay = st.one_of([_overlay_strategy(cls, st.none()) for cls in wire.OVERLAY_KINDS])
overlay_messages = st.one_of(
    [_overlay_strategy(cls, st.one_of(st.none(), flat_overlay)) for cls in wire.OVERLAY_KINDS]
)

sub_options = st.builds(
    SubOptions,
    topic_filter=texts,
    qos=st.integers(0, 2),
    no_local=st.booleans(),
    retain_as_published=st.booleans(),
    retain_handling=st.integers(0, 2),
    subscription_identifier=st.one_of(st.none(), st.integers(1, 268_435_455)),
    share_group=st.one_of(st.none(), texts),
    match_filter=texts,
)
out_entries = st.builds(
    OutEntry,
    message=mqtt_messages,
    qos=st.integers(1, 2),
    retain=st.booleans(),
    subscription_identifiers=st.lists(st.integers(1, 268_435_455), max_size=3),
    seq=st.one_of(st.none(), u64),
    packet_id=st.one_of(st.none(), st.integers(1, 65535)),
    state=st.sampled_from([0, STATE_PUBLISH_SENT, STATE_PUBREL_SENT]),
    share_key=st.one_of(st.none(), st.tuples(texts, texts)),
)
snapshots = st.builds(
    SessionSnapshot,
    client_id=texts,
    protocol_level=st.sampled_from([3, 4, 5]),
    expiry_interval_s=u32,
    username=st.one_of(st.none(), texts),
    subscriptions=st.lists(sub_options, max_size=3),
    pending=st.lists(out_entries, max_size=3),
    incoming_qos2=st.sets(st.integers(1, 65535), max_size=4),
    next_packet_id=st.integers(1, 65535),
)
bodies = st.one_of(
    st.builds(
        ClaimReply,
        claim_id=u64,
        client_id=texts,
        had_client=st.booleans(),
        snapshot=st.one_of(st.none(), snapshots),
    ),
    st.builds(RetainedSyncRequest, request_id=u64),
    st.builds(
        RetainedSyncReply,
        request_id=u64,
        updates=st.lists(retained_updates, max_size=3).map(tuple),
        last=st.booleans(),
    ),
)
envelopes = st.builds(
    Envelope,
    orig=peer_ids,
    dest=peer_ids,
    from_client=texts,
    to_client=texts,
    ref=u64,
    ttl=st.integers(0, 255),
    body=bodies,
)

# ------------------------------------------------------------------------------- fixtures

A = "10.0.0.1:1883"
B = "10.0.0.2:1883"
KEY = ("sensors/t", 1, A)
REF = (KEY, 0xDEAD_BEEF_CAFE_F00D)
REF_B = (("sensors/t", 0, B), 7)
LO, HI = ("sensors/t", 1), ("sensors/t", 2)
FULL_PROPERTIES: dict[str, Any] = {
    "payload_format_indicator": 1,
    "message_expiry_interval": 3600,
    "content_type": "application/json",
    "response_topic": "replies/a",
    "correlation_data": b"\x00\x01corr",
    "user_property": [("k", "v"), ("k", "v2"), ("é", "ü")],
    "subscription_identifier": [3, 268_435_455],
}


def _message(**changes: Any) -> Message:
    base = Message(
        "a/b", b"\x00payload\xff", 1, False, dict(FULL_PROPERTIES), 1_900_000_000.25, A, "client-1"
    )
    return dataclasses.replace(base, **changes)


def _round_trip(item: object) -> object:
    data = wire.encode_item(item)
    assert isinstance(data, bytes) and data
    return wire.decode_item(data)


def _one_of_each_overlay_kind() -> list[object]:
    pub = om.PUB(
        KEY, REF_B, "sensors/t", ForwardedMessage(B, "sensors/t", 5, _message()), 9, REF, 2, LO, HI, 77
    )
    return [
        om.REXP(KEY, REF_B, REF, (KEY, ("x", 0, B)), 3),
        om.EEXP(KEY, REF_B, REF, (KEY,), 12, LO, HI, False),
        om.EEXP(KEY, REF_B, REF, (), 5, (), (), True),
        pub,
        om.UNSUB(KEY, REF_B, REF, "sensors/t", LO, HI, 0),
        om.NEW(KEY, REF_B),
        om.SEARCH(None, A, KEY, 4, None),
        om.SEARCH(KEY, B, ("", 0, B), 5, REF, contact_hops=3),
        om.FOUND(6, KEY, None, None),
        om.FOUND(6, KEY, REF, REF_B),
        om.SEARCH_FAIL(7),
        om.LINK(KEY, REF_B),
        om.LINK(KEY, REF_B, reply=True),
        om.LEAVE(KEY, REF_B, None),
        om.LEAVE(KEY, REF_B, REF),
        om.PRESENCE(KEY, REF_B, REF, "sensors/t", True, KEY, KEY),
        om.PRESENCE_QUERY(KEY, REF_B, "sensors/t"),
        om.PING(2**64 - 1),
        om.PONG(0),
        om.GONE(KEY, None),
        om.GONE(KEY, pub),
        om.GONE(KEY, om.SEARCH(KEY, A, KEY, 8, None)),
        om.ACK(11),
        om.DONE(12),
    ]


# ------------------------------------------------------------------------------- tests


def test_every_overlay_kind_has_a_wire_mapping() -> None:
    kinds = {value for value in vars(om).values() if isinstance(value, type) and hasattr(value, "kind")}
    kinds = {cls for cls in kinds if dataclasses.is_dataclass(cls)}
    assert kinds == set(wire.OVERLAY_KINDS), "overlay/messages.py and wire.OVERLAY_KINDS disagree"
    covered = {type(item) for item in _one_of_each_overlay_kind()}
    assert covered == kinds


@pytest.mark.parametrize("item", _one_of_each_overlay_kind(), ids=lambda item: type(item).__name__)
def test_overlay_message_round_trip(item: object) -> None:
    assert _round_trip(item) == item


def test_nested_gone_keeps_the_bounced_message_and_its_payload() -> None:
    inner = om.UNSUB(KEY, REF_B, REF, "t", LO, HI, 3)
    decoded = _round_trip(om.GONE(("t", 1, B), om.GONE(KEY, inner)))
    assert isinstance(decoded, om.GONE) and isinstance(decoded.bounced, om.GONE)
    assert decoded.bounced.bounced == inner


@pytest.mark.parametrize(
    "payload",
    [
        ForwardedMessage(A, "sensors/#", 1, _message()),
        ForwardedMessage(A, "s", 2, _message(properties={}, expiry_at=None, publisher_id=None, origin="")),
        RetainedUpdate(B, 1_700_000_000_123, _message(payload=b"", retain=True)),
        SessionClaim(A, "client-9", 42, True),
        ForwardedBatch(
            (
                ForwardedMessage(A, "sensors/#", 7, _message()),
                ForwardedMessage(A, "sensors/#", 8, _message(payload=b"", qos=0)),
                ForwardedMessage(A, "sensors/#", 3, _message(properties={}, publisher_id=None), low=3),
            )
        ),
    ],
    ids=["forwarded-all-properties", "forwarded-none-fields", "retained", "claim", "batch"],
)
def test_pub_payload_round_trip(payload: object) -> None:
    pub = om.PUB(KEY, REF_B, "sensors/t", payload, 1, REF, 1, LO, HI, 0)
    assert _round_trip(pub) == pub


def test_a_batch_is_encoded_once_for_every_destination_and_an_empty_one_is_refused() -> None:
    batch = ForwardedBatch(tuple(ForwardedMessage(A, "s", n, _message()) for n in range(1, 4)))
    first = wire.encode_item(om.PUB(KEY, REF_B, "s", batch, 1, REF, 1, LO, HI, 0))
    second = wire.encode_item(om.PUB(("s", 1, B), REF_B, "s", batch, 1, REF, 1, LO, HI, 0))
    assert wire.decode_item(first).payload == wire.decode_item(second).payload == batch
    with pytest.raises(wire.WireError, match="empty ForwardedBatch"):
        wire.encode_item(om.PUB(KEY, REF_B, "s", ForwardedBatch(()), 1, REF, 1, LO, HI, 0))


def test_session_snapshot_with_pending_entries_round_trip() -> None:
    snapshot = SessionSnapshot(
        client_id="dev-1",
        protocol_level=5,
        expiry_interval_s=86_400,
        username=None,
        subscriptions=[
            SubOptions("a/+", 1, True, True, 2, 17, None, "a/+"),
            SubOptions("$share/g/b/#", 2, False, False, 0, None, "g", "b/#"),
        ],
        pending=[
            OutEntry(
                _message(), 2, False, [17], seq=101, packet_id=5, state=STATE_PUBREL_SENT, share_key=None
            ),
            OutEntry(_message(qos=1), 1, True, [], seq=None, packet_id=6, state=STATE_PUBLISH_SENT),
            OutEntry(_message(properties={}), 1, False, [1, 2], share_key=("g", "b/#")),
        ],
        incoming_qos2={3, 9},
        next_packet_id=7,
    )
    for reply in (ClaimReply(42, "dev-1", True, snapshot), ClaimReply(43, "dev-2", False, None)):
        envelope = Envelope(A, B, "dev-1", "", 42, 8, reply)
        assert _round_trip(envelope) == envelope


def test_retained_sync_round_trip() -> None:
    updates = (RetainedUpdate(A, 1, _message(retain=True)), RetainedUpdate(B, 2, _message(payload=b"")))
    for body in (
        RetainedSyncRequest(5),
        RetainedSyncReply(5, updates, False),
        RetainedSyncReply(5, (), True),
    ):
        envelope = Envelope(A, B, "", "", 5, 1, body)
        assert _round_trip(envelope) == envelope


@settings(max_examples=150, deadline=None)
@given(overlay_messages)
def test_any_overlay_message_round_trips(item: object) -> None:
    assert _round_trip(item) == item


@settings(max_examples=100, deadline=None)
@given(envelopes)
def test_any_envelope_round_trips(envelope: Envelope) -> None:
    assert _round_trip(envelope) == envelope


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(overlay_messages, envelopes), max_size=6))
def test_frame_from_encoded_items_equals_protobuf_serialization(items: list[object]) -> None:
    encoded = [wire.encode_item(item) for item in items]
    frame = wire.encode_frame_from_items(encoded)
    reference = pb.Frame(items=[pb.Item.FromString(data) for data in encoded]).SerializeToString()
    assert frame == reference
    assert wire.decode_frame(frame) == items


def test_hello_round_trip_and_placement() -> None:
    hello = wire.decode_hello(wire.encode_hello(A, 128))
    assert hello == wire.Hello(A, wire.SCHEMA_VERSION, 128)
    with pytest.raises(wire.WireError, match="a Hello after the link's first frame"):
        wire.decode_frame(wire.encode_hello(A, 1))
    with pytest.raises(wire.WireError, match="must hold a Hello"):
        wire.decode_hello(wire.encode_frame([om.PING(1)]))


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        (om.PING(-1), r"PING\.nonce"),
        (om.PING(2**64), r"PING\.nonce"),
        (om.REXP(KEY, REF_B, REF, (), True), r"REXP\.level: expected int"),
        (om.NEW(("t", 0, 5), REF_B), r"NEW\.dest: key peer_id must be a str"),
        (om.NEW(("t", 0, A, "extra"), REF_B), r"NEW\.dest: a key must be a tuple"),
        (om.NEW(KEY, (KEY, -3)), r"NEW\.sender: membership vector"),
        (om.NEW(KEY, KEY), r"NEW\.sender: a NodeRef must be"),  # type: ignore[arg-type]
        (om.PUB(KEY, REF, "t", b"raw", 1, REF, 1, LO, HI, 0), r"PUB\.payload: a PUB payload must be"),
        (om.SEARCH(None, 7, KEY, 1, None), r"SEARCH\.origin: a peer id must be a str"),
        ("not a message", r"not an overlay message kind the wire knows: str"),
        (Envelope(A, B, "", "", 0, 1, "body"), r"envelope\.body: must be ClaimReply"),  # type: ignore[arg-type]
        (
            om.PUB(
                KEY,
                REF,
                "t",
                ForwardedMessage(A, "t", 1, _message(properties={"session_expiry_interval": 5})),
                1,
                REF,
                1,
                LO,
                HI,
                0,
            ),
            r"properties",
        ),
        (
            om.PUB(
                KEY,
                REF,
                "t",
                ForwardedMessage(A, "t", 1, _message(properties={"bogus": 1})),
                1,
                REF,
                1,
                LO,
                HI,
                0,
            ),
            r"unknown MQTT 5 property 'bogus'",
        ),
    ],
)
def test_bad_values_raise_a_named_wire_error(item: object, problem: str) -> None:
    with pytest.raises(wire.WireError, match=problem):
        wire.encode_item(item)


def test_malformed_bytes_raise_a_clear_error() -> None:
    with pytest.raises(wire.WireError, match=r"not a valid skipmq\.v1\.Frame"):
        wire.decode_frame(b"\x12\x05\x0a")  # items field claims 5 bytes, 1 follows
    with pytest.raises(wire.WireError, match=r"not a valid skipmq\.v1\.Item"):
        wire.decode_item(b"\xff\xff\xff")
    with pytest.raises(wire.WireError, match="Item without a kind"):
        wire.decode_item(b"")
    empty_overlay = pb.Item(overlay=pb.OverlayMessage()).SerializeToString()
    with pytest.raises(wire.WireError, match="OverlayMessage without a kind"):
        wire.decode_item(empty_overlay)


def test_missing_required_fields_and_bad_keys_are_named() -> None:
    no_dest = pb.Item(
        overlay=pb.OverlayMessage(new=pb.New(sender=pb.NodeRef(key=pb.Key(topic="t"))))
    ).SerializeToString()
    with pytest.raises(wire.WireError, match=r"NEW\.dest: required field missing"):
        wire.decode_item(no_dest)
    gap_key = pb.Key(topic="t", peer_id=A)  # peer id without role
    bad = pb.Item(overlay=pb.OverlayMessage(new=pb.New(dest=gap_key, sender=pb.NodeRef(key=gap_key))))
    with pytest.raises(wire.WireError, match=r"NEW\.dest: key fields must form a prefix"):
        wire.decode_item(bad.SerializeToString())
    no_message = pb.Item(
        overlay=pb.OverlayMessage(
            pub=pb.Pub(
                dest=pb.Key(topic="t"),
                sender=pb.NodeRef(key=pb.Key()),
                forwarder=pb.NodeRef(key=pb.Key()),
                lo=pb.Key(),
                hi=pb.Key(),
                payload=pb.OverlayPayload(forwarded=pb.ForwardedMessage(origin=A)),
            )
        )
    )
    with pytest.raises(wire.WireError, match=r"ForwardedMessage\.message: required field missing"):
        wire.decode_item(no_message.SerializeToString())


def test_malformed_mqtt_properties_are_rejected() -> None:
    bad_block = pb.MqttMessage(topic="t", properties=b"\x02\x01\x07")  # payload_format_indicator = 7
    item = pb.Item(
        overlay=pb.OverlayMessage(
            pub=pb.Pub(
                dest=pb.Key(),
                sender=pb.NodeRef(key=pb.Key()),
                forwarder=pb.NodeRef(key=pb.Key()),
                lo=pb.Key(),
                hi=pb.Key(),
                payload=pb.OverlayPayload(forwarded=pb.ForwardedMessage(message=bad_block)),
            )
        )
    )
    with pytest.raises(wire.WireError, match=r"message\.properties: .*payload_format_indicator"):
        wire.decode_item(item.SerializeToString())


@pytest.mark.parametrize(
    "pub",
    [
        om.PUB(KEY, REF_B, "sensors/t", None, 1, REF, 1, LO, HI, 0),
        om.PUB((), REF_B, "", None, 0, REF, 0, (), (), 0),
        om.PUB(
            ("s" * 300, 2**32 - 1, B), REF_B, "s" * 300, None, 2**64 - 1, REF, 2**32 - 1, LO, HI, 2**64 - 1
        ),
    ],
    ids=["common", "defaults", "large"],
)
def test_a_pub_of_a_batch_written_around_the_batch_bytes_is_the_pub_the_generated_classes_write(
    pub: om.PUB,
) -> None:
    batch = ForwardedBatch(
        (
            ForwardedMessage(A, "s", 1, _message()),
            ForwardedMessage(A, "s", 2, _message(properties={}, expiry_at=None)),
        )
    )
    pub = dataclasses.replace(pub, payload=batch)
    spliced = wire.encode_item(pub)  # (the batch's bytes appended as the PUB's payload field)
    generated = bytes(wire.item_to_proto(pub).SerializeToString())
    assert len(spliced) == len(generated)
    assert wire.decode_item(spliced) == wire.decode_item(generated) == pub
    parsed = pb.Item()
    parsed.ParseFromString(spliced)
    assert bytes(parsed.SerializeToString()) == generated


def test_pubs_on_one_route_share_their_encoded_header_and_keep_their_own_numbers() -> None:
    """The publisher's broker encodes a route's PUB fields once (wire._PUB_HEADERS): PUBs that
    differ in publication id, ack id, hops or batch still decode to themselves."""
    batches = [ForwardedBatch((ForwardedMessage(A, "s", n, _message()),)) for n in (1, 2)]
    pubs = [
        om.PUB(KEY, REF_B, "s", batches[0], 1, REF, 1, LO, HI, 0),
        om.PUB(KEY, REF_B, "s", batches[1], 2, REF, 1, LO, HI, 7),
        om.PUB(KEY, REF_B, "s", batches[1], 2**64 - 1, REF, 3, LO, HI, 2**64 - 1),
        om.PUB(KEY, REF, "s", batches[0], 1, REF_B, 1, LO, HI, 0),
    ]
    for pub in pubs * 2:
        assert wire.decode_item(wire.encode_item(pub)) == pub
    with pytest.raises(wire.WireError, match="role"):
        wire.encode_item(om.PUB(("s", True, A), REF_B, "s", batches[0], 1, REF, 1, LO, HI, 0))
