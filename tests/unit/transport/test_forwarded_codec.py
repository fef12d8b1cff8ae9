"""The hand-written ForwardedMessage encoding equals the generated classes' serialization."""

from __future__ import annotations

import itertools
import random

import pytest

from broker.adapters.transport import wire
from broker.adapters.transport._pb.skipmq.v1 import cluster_pb2 as pb
from broker.adapters.transport.forwarded_codec import encode_forwarded_fast, varint
from broker.cluster.messages import ForwardedMessage, StreamPosition
from broker.core.session import Message


def _generated(forwarded: ForwardedMessage) -> bytes:
    out = pb.ForwardedMessage()
    wire._forwarded_to_proto(forwarded, out, "test")
    return bytes(out.SerializeToString())


def _message(**changes: object) -> Message:
    values: dict[str, object] = {
        "topic": "a/b",
        "payload": b"x" * 64,
        "qos": 0,
        "retain": False,
        "origin": "node-0",
        "publisher_id": "pub",
    }
    values.update(changes)
    return Message(**values)  # type: ignore[arg-type]


def test_varint_matches_the_generated_encoding() -> None:
    for value in (0, 1, 127, 128, 300, 16383, 16384, 2**32 - 1, 2**63, 2**64 - 1):
        position = pb.StreamPosition(next_seq=value)
        assert bytes(position.SerializeToString()) == (b"\x18" + varint(value) if value else b"")


@pytest.mark.parametrize(
    ("topic", "payload", "qos", "retain", "origin", "publisher_id"),
    list(
        itertools.product(
            ("a/b", "", "ü/∆/" + "t" * 200),
            (b"x" * 64, b"", bytearray(b"y" * 200), memoryview(b"z" * 130)),
            (0, 1, 2),
            (False, True),
            ("node-0", ""),
            ("pub", "", None),
        )
    ),
)
def test_common_shapes_equal_the_generated_bytes(
    topic: str, payload: bytes, qos: int, retain: bool, origin: str, publisher_id: str | None
) -> None:
    message = _message(
        topic=topic, payload=payload, qos=qos, retain=retain, origin=origin, publisher_id=publisher_id
    )
    for seq, low in ((1, 0), (0, 0), (127, 5), (128, 128), (2**40, 2**40 - 3), (2**64 - 1, 1)):
        for stream_origin, stream in (("127.0.0.1:1/17", "a/b"), ("", ""), ("ö:1/2", "c/#")):
            forwarded = ForwardedMessage(stream_origin, stream, seq, message, low)
            assert encode_forwarded_fast(forwarded) == _generated(forwarded)


def test_random_messages_equal_the_generated_bytes() -> None:
    rng = random.Random(11)
    for _ in range(500):
        message = _message(
            topic="/".join(rng.choice(["a", "bb", "ç", "x" * 90]) for _ in range(rng.randint(0, 4))),
            payload=rng.randbytes(rng.choice([0, 1, 127, 128, 129, 1000, 20000])),
            qos=rng.randint(0, 2),
            retain=rng.random() < 0.5,
            origin=rng.choice(["", "n", "node-" + "9" * 130]),
            publisher_id=rng.choice([None, "", "c" * rng.randint(1, 300)]),
        )
        forwarded = ForwardedMessage(
            "o/" + "1" * rng.randint(0, 140), "s", rng.randint(0, 2**64 - 1), message
        )
        assert encode_forwarded_fast(forwarded) == _generated(forwarded)
        assert wire.decode_forwarded(wire.encode_forwarded(forwarded)) == forwarded


@pytest.mark.parametrize(
    "forwarded",
    [
        ForwardedMessage("o", "s", 1, _message(properties={1: 1})),
        ForwardedMessage("o", "s", 1, _message(expiry_at=5.0)),
        ForwardedMessage("o", "s", 1, _message(), 0, (StreamPosition("o", "t", 3),), (("s", 1),)),
        ForwardedMessage("o", "s", 1, _message(qos=True)),
        ForwardedMessage("o", "s", 1, _message(qos=2**32)),
        ForwardedMessage("o", "s", -1, _message()),
        ForwardedMessage("o", "s", 2**64, _message()),
        ForwardedMessage("o", "s", True, _message()),
        ForwardedMessage("o", "s", 1, _message(topic=b"a/b")),
        ForwardedMessage("o", "s", 1, _message(topic="\udc80")),
        ForwardedMessage("\udc80", "s", 1, _message()),
        ForwardedMessage("o", 5, 1, _message()),  # type: ignore[arg-type]
        ForwardedMessage("o", "s", 1, _message(payload="text")),
        ForwardedMessage("o", "s", 1, _message(publisher_id=3)),
    ],
)
def test_other_shapes_take_the_general_path(forwarded: ForwardedMessage) -> None:
    assert encode_forwarded_fast(forwarded) is None


def test_a_bool_qos_is_not_taken_for_the_cached_int() -> None:
    assert encode_forwarded_fast(ForwardedMessage("o", "s", 1, _message(qos=1))) is not None
    assert encode_forwarded_fast(ForwardedMessage("o", "s", 1, _message(qos=True))) is None
    with pytest.raises(wire.WireError):
        wire.encode_forwarded(ForwardedMessage("o", "s", 1, _message(qos=True)))


def test_a_truthy_retain_is_written_as_the_general_path_writes_it() -> None:
    for retain in (1, 0):
        forwarded = ForwardedMessage("o", "s", 1, _message(retain=retain))
        assert encode_forwarded_fast(forwarded) == _generated(forwarded)
