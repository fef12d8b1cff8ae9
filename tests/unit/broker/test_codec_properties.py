"""Property tests (hypothesis) for broker/mqtt/codec.py.

1. Round trip: for generated packets of every type, in MQTT 3.1, 3.1.1 and 5.0 (v5 with random
   subsets of every property the packet allows, MQTT 5 §2.2.2.2), ``decode(encode(p)) == p``,
   also when a whole stream is fed in random chunks.
2. Robustness: any byte string (random, or a valid packet stream with bytes flipped, dropped or
   inserted) either decodes or raises ``MQTTProtocolError`` - never another exception and never
   the decoder's internal-error fallback - for both roles and every protocol level.

Runs derandomized (fixed seed) so results are reproducible; about 10-20 s in total.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parents[3]
from broker.mqtt.codec import REASON_CODES_ALLOWED, Decoder, encode  # noqa: E402
from broker.mqtt.packets import (  # noqa: E402
    PROPERTIES,
    WILL,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MQTTProtocolError,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Properties,
    PropType,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)

PT = PacketType
FIXED = settings(
    derandomize=True,
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---------------------------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------------------------
# MQTT strings: well-formed UTF-8, no surrogates (Cs), no U+0000 (MQTT-1.5.3-1/2).
mqtt_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12)
topic_names = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00+#"), min_size=1, max_size=12
)
topic_filters = mqtt_text  # filter syntax is not the codec's business: any string must round-trip
packet_ids = st.integers(1, 0xFFFF)
payloads = st.binary(max_size=64)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)

_VALUE_STRATEGIES: dict[PropType, st.SearchStrategy[Any]] = {
    PropType.BYTE: st.integers(0, 1),
    PropType.TWO_BYTE_INT: u16,
    PropType.FOUR_BYTE_INT: u32,
    PropType.VARINT: st.integers(1, 268_435_455),
    PropType.UTF8: mqtt_text,
    PropType.BINARY: st.binary(max_size=16),
}
_NONZERO = {"receive_maximum", "topic_alias", "maximum_packet_size"}


def _value_strategy(name: str, ptype: PropType, where: object, client_side: bool) -> st.SearchStrategy[Any]:
    if name == "user_property":
        return st.lists(st.tuples(mqtt_text, mqtt_text), min_size=1, max_size=3)
    if name == "subscription_identifier" and where == PT.PUBLISH:
        return st.lists(_VALUE_STRATEGIES[PropType.VARINT], min_size=1, max_size=3)
    if name == "response_topic":
        return topic_names  # MQTT-3.3.2-14: no wildcards
    strategy = _VALUE_STRATEGIES[ptype]
    if name in _NONZERO:
        strategy = strategy.filter(bool)
    return strategy


@st.composite
def properties(draw: st.DrawFn, where: object, *, to_client: bool = False) -> Properties:
    """A random subset of the properties MQTT 5 allows in ``where`` (a packet type or WILL)."""
    props: Properties = {}
    for _pid, (name, ptype, allowed) in PROPERTIES.items():
        if where not in allowed:
            continue
        if name == "subscription_identifier" and where == PT.PUBLISH and not to_client:
            continue  # MQTT-3.3.4-6: never in a client's PUBLISH
        if draw(st.booleans()):
            props[name] = draw(_value_strategy(name, ptype, where, to_client))
    if where == PT.CONNECT and "authentication_data" in props and "authentication_method" not in props:
        del props["authentication_data"]
    return props


def _props(draw: st.DrawFn, level: int, where: object, *, to_client: bool = False) -> Properties:
    return draw(properties(where, to_client=to_client)) if level == 5 else {}


def _reason(draw: st.DrawFn, level: int, ptype: PacketType) -> int:
    return draw(st.sampled_from(sorted(REASON_CODES_ALLOWED[ptype]))) if level == 5 else 0


@st.composite
def publishes(draw: st.DrawFn, level: int, to_client: bool) -> Publish:
    qos = draw(st.integers(0, 2))
    props = _props(draw, level, PT.PUBLISH, to_client=to_client)
    topic = draw(topic_names)
    if level == 5 and "topic_alias" in props and draw(st.booleans()):
        topic = ""  # an established alias may replace the topic
    return Publish(
        topic,
        draw(payloads),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(packet_ids) if qos else None,
        props,
    )


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topic_names),
            draw(payloads),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            _props(draw, level, WILL),
        )
    username = draw(st.none() | mqtt_text)
    password = draw(st.none() | st.binary(max_size=16))
    if level != 5 and username is None:
        password = None  # MQTT-3.1.2-22
    clean_start = draw(st.booleans())
    client_id = draw(mqtt_text)
    if level == 3 and not client_id:
        client_id = "c"  # MQTT 3.1: 1-23 characters (mqtt_text is at most 12)
    if level == 4 and not client_id:
        clean_start = True  # MQTT-3.1.3-8
    return Connect(
        client_id,
        level,
        "MQIsdp" if level == 3 else "MQTT",
        clean_start,
        draw(u16),
        username,
        password,
        will,
        _props(draw, level, PT.CONNECT),
    )


@st.composite
def connacks(draw: st.DrawFn, level: int) -> Connack:
    if level == 5:
        code = draw(st.sampled_from(sorted(REASON_CODES_ALLOWED[PT.CONNACK])))
    else:
        code = draw(st.sampled_from([0x00, 0x84, 0x85, 0x88, 0x86, 0x87]))
    session_present = draw(st.booleans()) if code == 0 and level != 3 else False  # 3.1: reserved byte
    return Connack(session_present, code, _props(draw, level, PT.CONNACK))


@st.composite
def subscribes(draw: st.DrawFn, level: int) -> Subscribe:
    subs = []
    for _ in range(draw(st.integers(1, 4))):
        topic_filter = draw(topic_filters)
        if level == 5:
            no_local = draw(st.booleans()) and not topic_filter.startswith("$share/")  # MQTT-3.8.3-4
            sub = Subscription(
                topic_filter, draw(st.integers(0, 2)), no_local, draw(st.booleans()), draw(st.integers(0, 2))
            )
        else:
            sub = Subscription(topic_filter, draw(st.integers(0, 2)))
        subs.append(sub)
    return Subscribe(draw(packet_ids), subs, _props(draw, level, PT.SUBSCRIBE))


@st.composite
def acks(draw: st.DrawFn, level: int) -> Packet:
    ptype = draw(st.sampled_from([PT.PUBACK, PT.PUBREC, PT.PUBREL, PT.PUBCOMP]))
    classes: dict[PacketType, type[Puback] | type[Pubrec] | type[Pubrel] | type[Pubcomp]] = {
        PT.PUBACK: Puback,
        PT.PUBREC: Pubrec,
        PT.PUBREL: Pubrel,
        PT.PUBCOMP: Pubcomp,
    }
    cls = classes[ptype]
    packet: Packet = cls(draw(packet_ids), _reason(draw, level, ptype), _props(draw, level, ptype))
    return packet


@st.composite
def reason_only(draw: st.DrawFn, level: int, to_client: bool) -> Packet:
    if level == 5 and draw(st.booleans()):
        return Auth(_reason(draw, 5, PT.AUTH), _props(draw, 5, PT.AUTH))
    props = _props(draw, level, PT.DISCONNECT)
    if to_client:
        props.pop("session_expiry_interval", None)  # MQTT-3.14.2-2
    return Disconnect(_reason(draw, level, PT.DISCONNECT), props)


@st.composite
def client_to_server(draw: st.DrawFn, level: int) -> Packet:
    kind = draw(st.sampled_from(["publish", "ack", "subscribe", "unsubscribe", "ping", "disconnect"]))
    if kind == "publish":
        return draw(publishes(level, to_client=False))
    if kind == "ack":
        return draw(acks(level))
    if kind == "subscribe":
        return draw(subscribes(level))
    if kind == "unsubscribe":
        filters = draw(st.lists(topic_filters, min_size=1, max_size=4))
        return Unsubscribe(draw(packet_ids), filters, _props(draw, level, PT.UNSUBSCRIBE))
    if kind == "ping":
        return Pingreq()
    return draw(reason_only(level, to_client=False))


@st.composite
def server_to_client(draw: st.DrawFn, level: int) -> Packet:
    kinds = ["publish", "ack", "suback", "unsuback", "ping"] + (["disconnect"] if level == 5 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "publish":
        return draw(publishes(level, to_client=True))
    if kind == "ack":
        return draw(acks(level))
    if kind == "suback":
        if level == 5:
            codes = st.sampled_from(sorted(REASON_CODES_ALLOWED[PT.SUBACK]))
        else:
            codes = st.sampled_from([0, 1, 2, 0x80])
        return Suback(
            draw(packet_ids), draw(st.lists(codes, min_size=1, max_size=5)), _props(draw, level, PT.SUBACK)
        )
    if kind == "unsuback":
        if level != 5:
            return Unsuback(draw(packet_ids))
        codes = st.sampled_from(sorted(REASON_CODES_ALLOWED[PT.UNSUBACK]))
        return Unsuback(
            draw(packet_ids), draw(st.lists(codes, min_size=1, max_size=5)), _props(draw, 5, PT.UNSUBACK)
        )
    if kind == "ping":
        return Pingresp()
    return draw(reason_only(level, to_client=True))


levels = st.sampled_from([3, 4, 5])


def feed_in_chunks(decoder: Decoder, data: bytes, cuts: list[int]) -> list[Packet]:
    out: list[Packet] = []
    previous = 0
    for cut in sorted({min(c, len(data)) for c in cuts}):
        out.extend(decoder.feed(data[previous:cut]))
        previous = cut
    out.extend(decoder.feed(data[previous:]))
    return out


# ---------------------------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------------------------
@FIXED
@given(st.data())
def test_client_session_round_trip(data: st.DataObject) -> None:
    """CONNECT then a stream of client packets, fed to a server decoder in random chunks."""
    level = data.draw(levels)
    connect = data.draw(connects(level))
    packets: list[Packet] = [connect, *data.draw(st.lists(client_to_server(level), max_size=8))]
    wire = b"".join(encode(p, level) for p in packets)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=6))
    decoder = Decoder()
    assert feed_in_chunks(decoder, wire, cuts) == packets
    assert decoder.protocol_level == level


@FIXED
@given(st.data())
def test_server_session_round_trip(data: st.DataObject) -> None:
    """CONNACK then a stream of server packets, fed to a client decoder in random chunks."""
    level = data.draw(levels)
    packets: list[Packet] = [
        data.draw(connacks(level)),
        *data.draw(st.lists(server_to_client(level), max_size=8)),
    ]
    wire = b"".join(encode(p, level) for p in packets)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=6))
    decoder = Decoder(role="client", protocol_level=level)
    assert feed_in_chunks(decoder, wire, cuts) == packets


@FIXED
@given(st.data())
def test_single_packet_round_trip_each_type(data: st.DataObject) -> None:
    level = data.draw(levels)
    if data.draw(st.booleans()):
        packet = data.draw(client_to_server(level))
        decoder = Decoder(protocol_level=level, handshake_done=True)
    else:
        packet = data.draw(server_to_client(level))
        decoder = Decoder(role="client", protocol_level=level, handshake_done=True)
    assert decoder.feed(encode(packet, level)) == [packet]


# ---------------------------------------------------------------------------------------------
# robustness: any input decodes or raises MQTTProtocolError
# ---------------------------------------------------------------------------------------------
DECODER_SETUPS: list[tuple[str, int | None, bool]] = [
    ("server", None, False),
    ("server", 3, True),
    ("server", 4, True),
    ("server", 5, True),
    ("client", None, False),
    ("client", 4, False),
    ("client", 5, False),
    ("client", 4, True),
    ("client", 5, True),
]


def make_decoder(index: int) -> Decoder:
    role, level, handshake_done = DECODER_SETUPS[index]
    return Decoder(role=role, protocol_level=level, handshake_done=handshake_done)  # type: ignore[arg-type]


def assert_accepted_packets_are_canonical(
    decoder: Decoder, role: str, packets: list[Packet], consumed: int
) -> None:
    """Whatever the decoder accepted must be representable, round-trip, and never be longer when
    re-encoded than the bytes it came from (the encoder always writes the shortest form), so a
    decoder that silently read past a field's end would be caught here."""
    level = decoder.protocol_level
    assert level in (3, 4, 5) or not packets
    total = 0
    for packet in packets:
        assert level is not None
        wire = encode(packet, level)
        total += len(wire)
        if isinstance(packet, Connect):
            again = Decoder().feed(wire)
        elif isinstance(packet, Connack):
            again = Decoder(role="client", protocol_level=level).feed(wire)
        else:
            again = Decoder(role=role, protocol_level=level, handshake_done=True).feed(wire)  # type: ignore[arg-type]
        assert again == [packet]
    assert total <= consumed, (total, consumed, packets)


def assert_parses_or_protocol_error(decoder: Decoder, chunks: list[bytes]) -> None:
    role = decoder.role
    packets: list[Packet] = []
    fed = 0
    try:
        for chunk in chunks:
            fed += len(chunk)
            packets.extend(decoder.feed(chunk))
        fed -= len(decoder._pending)  # bytes held back for an incomplete packet
    except MQTTProtocolError as err:
        assert err.reason_code != ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, f"decoder bug: {err}"
        assert 0x80 <= err.reason_code <= 0xA2
        assert str(err)
        packets.extend(err.packets_before_error)  # came from at most ``fed`` bytes
    assert_accepted_packets_are_canonical(decoder, role, packets, fed)


@settings(FIXED, max_examples=600)
@given(st.integers(0, len(DECODER_SETUPS) - 1), st.lists(st.binary(max_size=40), max_size=4))
def test_random_bytes_parse_or_raise(setup: int, chunks: list[bytes]) -> None:
    assert_parses_or_protocol_error(make_decoder(setup), chunks)


@st.composite
def mutated_streams(draw: st.DrawFn) -> tuple[int, bytes]:
    """A valid stream for a decoder setup, then bytes flipped / removed / inserted."""
    setup = draw(st.integers(0, len(DECODER_SETUPS) - 1))
    role, level, handshake_done = DECODER_SETUPS[setup]
    wire_level = level or draw(levels)
    if role == "server":
        packets: list[Packet] = [] if handshake_done else [draw(connects(wire_level))]
        packets += draw(st.lists(client_to_server(wire_level), min_size=1, max_size=3))
    else:
        packets = [] if handshake_done else [draw(connacks(wire_level))]
        packets += draw(st.lists(server_to_client(wire_level), min_size=1, max_size=3))
    wire = bytearray(b"".join(encode(p, wire_level) for p in packets))
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["flip", "delete", "insert", "set"]))
        index = draw(st.integers(0, max(len(wire) - 1, 0)))
        if action == "flip" and wire:
            wire[index] ^= 1 << draw(st.integers(0, 7))
        elif action == "delete" and wire:
            del wire[index]
        elif action == "insert":
            wire.insert(index, draw(st.integers(0, 255)))
        elif wire:
            wire[index] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, 0x01, 0x02]))
    return setup, bytes(wire)


@settings(FIXED, max_examples=800)
@given(mutated_streams(), st.lists(st.integers(0, 400), max_size=3))
def test_mutated_valid_streams_parse_or_raise(case: tuple[int, bytes], cuts: list[int]) -> None:
    setup, wire = case
    previous = 0
    chunks = []
    for cut in sorted({min(c, len(wire)) for c in cuts}):
        chunks.append(wire[previous:cut])
        previous = cut
    chunks.append(wire[previous:])
    assert_parses_or_protocol_error(make_decoder(setup), chunks)


# Every first byte a well-behaved peer could send (valid flags), plus PUBLISH flag variants.
VALID_FIRST_BYTES = [0x10, 0x20, 0x40, 0x50, 0x62, 0x70, 0x82, 0x90, 0xA2, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0]
VALID_FIRST_BYTES += [0x30 | flags for flags in range(16)]


@st.composite
def framed_random_bodies(draw: st.DrawFn) -> tuple[int, bytes]:
    """Correct fixed headers around random bodies: reaches every body parser's bounds checks."""
    setup = draw(st.integers(0, len(DECODER_SETUPS) - 1))
    role, level, handshake_done = DECODER_SETUPS[setup]
    wire_level = level or draw(levels)
    prefix = b""
    if not handshake_done:
        first = (
            Connect("c", wire_level, "MQIsdp" if wire_level == 3 else "MQTT")
            if role == "server"
            else Connack()
        )
        prefix = encode(first, wire_level)
    frames = []
    for _ in range(draw(st.integers(1, 4))):
        body = draw(st.binary(max_size=24))
        frames.append(bytes((draw(st.sampled_from(VALID_FIRST_BYTES)), len(body))) + body)
    return setup, prefix + b"".join(frames)


@settings(FIXED, max_examples=1500)
@given(framed_random_bodies())
def test_framed_random_bodies_parse_or_raise(case: tuple[int, bytes]) -> None:
    setup, wire = case
    assert_parses_or_protocol_error(make_decoder(setup), [wire])


@st.composite
def random_connects(draw: st.DrawFn) -> bytes:
    """CONNECT packets with a valid protocol name/level and random flags, properties and payload."""
    level = draw(levels)
    name = b"MQIsdp" if level == 3 else b"MQTT"
    head = len(name).to_bytes(2, "big") + name + bytes((level, draw(st.integers(0, 255)))) + b"\x00\x3c"
    pieces = []
    for _ in range(draw(st.integers(0, 6))):
        raw = draw(st.binary(max_size=6))
        kind = draw(st.sampled_from(["field", "property", "raw"]))
        if kind == "field":  # a length-prefixed field whose length may lie
            pieces.append(draw(st.integers(0, len(raw) + 2)).to_bytes(2, "big") + raw)
        elif kind == "property":
            pid = draw(st.sampled_from(sorted(PROPERTIES)))
            pieces.append(bytes((draw(st.integers(0, 8)), pid)) + raw)
        else:
            pieces.append(raw)
    body = head + b"".join(pieces)
    return bytes((0x10, len(body))) + body


@settings(FIXED, max_examples=1500)
@given(random_connects())
def test_random_connects_parse_or_raise(wire: bytes) -> None:
    assert_parses_or_protocol_error(Decoder(), [wire])


@st.composite
def publishes_with_random_properties(draw: st.DrawFn) -> tuple[str, bytes]:
    """v5 PUBLISH whose property block holds real property ids followed by random value bytes;
    the payload absorbs whatever follows, so many of these decode and get re-encoded."""
    block = b""
    for _ in range(draw(st.integers(1, 4))):
        pid = draw(st.sampled_from(sorted(PROPERTIES)))
        value = draw(st.sampled_from([b"", b"\x00", b"\x00\x01", b"\x00\x02", b"\x00\x00\x00\x05"]))
        block += bytes((pid,)) + value + draw(st.binary(max_size=4))
    declared = max(0, len(block) + draw(st.integers(-3, 3)))
    body = b"\x00\x01t" + bytes((declared,)) + block + draw(st.binary(max_size=8))
    return draw(st.sampled_from(["server", "client"])), bytes((0x30, len(body))) + body


@settings(FIXED, max_examples=1500)
@given(publishes_with_random_properties())
def test_random_property_blocks_parse_or_raise(case: tuple[str, bytes]) -> None:
    role, wire = case
    decoder = Decoder(role=role, protocol_level=5, handshake_done=True)  # type: ignore[arg-type]
    assert_parses_or_protocol_error(decoder, [wire])
