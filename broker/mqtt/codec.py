"""Sans-I/O MQTT 3.1 / 3.1.1 / 5.0 codec: bytes in, packet objects out, and back.

Follows MQTT 3.1.1 (OASIS, 2014) chapters 1-3 and MQTT 5.0 (OASIS, 2019) chapters 1-3 and
§4.13 (error handling). There is no I/O, no clock and no logging here (python-hyper/h11 style):

* ``Decoder.feed(data)`` buffers partial input and returns every complete packet; the first
  malformed packet raises ``MQTTProtocolError`` whose ``reason_code`` is the MQTT 5 reason code
  to close with and whose ``statement`` names the normative statement (e.g. "MQTT-3.3.1-4").
* ``encode(packet, protocol_level)`` turns any packet into bytes for the given protocol level;
  ``encode_publish`` is the broker's hot-path shortcut for PUBLISH.
* ``connack_for_error`` gives the CONNACK to send when reading CONNECT failed.

MQTT 3.1 (protocol name "MQIsdp", level 3) is accepted and treated like 3.1.1.

CONNACK reason codes in ``Connack.reason_code`` are always MQTT 5 codes. For protocol levels 3/4
they map to 3.1.1 return codes (§3.2.2.3) with this table (encode):

    ====================================================  =====================================
    MQTT 5 reason code                                    3.1.1 return code
    ====================================================  =====================================
    0x00 Success                                          0 accepted
    0x84 Unsupported protocol version                     1 unacceptable protocol version
    0x85 Client identifier not valid                      2 identifier rejected
    0x86 Bad user name or password, 0x8C Bad auth method  4 bad user name or password
    0x87 Not authorized, 0x8A Banned                      5 not authorized
    any other failure (0x88 Server unavailable, 0x89,     3 server unavailable
    0x8B, 0x9C, 0x9D, 0x9F, 0x80, 0x83, 0x97, ...)
    ====================================================  =====================================

and back (decode): 0->0x00, 1->0x84, 2->0x85, 3->0x88, 4->0x86, 5->0x87.

Decoded v5 PUBLISH packets keep the wire topic: an empty topic with a ``topic_alias`` property
is returned as is (resolving aliases needs connection state, which the core owns). Topic
FILTER syntax ("a/#/b") is not checked here (the topics module answers it with SUBACK 0x8F);
only the UTF-8 rules apply to filters.

Reason codes follow MQTT 5 §4.13 and the per-field text: syntax (truncation, bad UTF-8, reserved
bits, unknown property, a property not valid for the packet type - §2.2.2.2 says Malformed
Packet) -> 0x81; semantic rules ("It is a Protocol Error ...": duplicate property, value 0 where
forbidden, boolean byte not 0/1, retain handling 3, missing topic filters, wrong packet
direction/order) -> 0x82; wildcard in a topic name -> 0x90; topic alias 0 -> 0x94; too large
-> 0x95; unknown protocol -> 0x84; rejected client id -> 0x85. Checks that need connection state
or configuration (topic alias maximum, receive maximum, client id length in 3.1.1/5, payload
format validation - a MAY) are the core's. MQTT 3.1 (MQIsdp) additionally limits client ids to
1-23 characters (identifier rejected).

Size: the whole MQTT 3.1/3.1.1/5.0 wire format, encoder and decoder of all 15 packet types and
the property table, with the statement id of every check; split by packet type it would scatter
the shared grammar (strings, varints, properties) the checks depend on.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Literal

from broker.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    PROPERTIES,
    PROPERTY_IDS,
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

__all__ = [
    "CONNACK_V3_FROM_V5",
    "CONNACK_V5_FROM_V3",
    "MAX_REMAINING_LENGTH",
    "REASON_CODES_ALLOWED",
    "Decoder",
    "connack_for_error",
    "encode",
    "encode_publish",
    "encode_variable_byte_integer",
]

MAX_REMAINING_LENGTH = 268_435_455  # largest Variable Byte Integer (§1.5.5 / §2.2.3)

_MALFORMED = int(ReasonCode.MALFORMED_PACKET)
_PROTOCOL_ERROR = int(ReasonCode.PROTOCOL_ERROR)
_TOPIC_NAME_INVALID = int(ReasonCode.TOPIC_NAME_INVALID)

_PT = PacketType
_PACKET_NAMES = {int(t): t.name for t in PacketType}

# ---------------------------------------------------------------------------------------------
# Reason codes each v5 packet may carry (MQTT 5 §3.x.2.1 tables).
# ---------------------------------------------------------------------------------------------
_PUB_ACK_CODES = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
REASON_CODES_ALLOWED: dict[int, frozenset[int]] = {
    _PT.CONNACK: frozenset(
        {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97}
        | {0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
    ),
    _PT.PUBACK: _PUB_ACK_CODES,
    _PT.PUBREC: _PUB_ACK_CODES,
    _PT.PUBREL: frozenset({0x00, 0x92}),
    _PT.PUBCOMP: frozenset({0x00, 0x92}),
    _PT.SUBACK: frozenset({0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}),
    _PT.UNSUBACK: frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91}),
    _PT.DISCONNECT: frozenset(
        {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94}
        | {0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2}
    ),
    _PT.AUTH: frozenset({0x00, 0x18, 0x19}),
}
_REASON_STATEMENT = {
    _PT.CONNACK: "MQTT-3.2.2-8",
    _PT.PUBACK: "MQTT-3.4.2-1",
    _PT.PUBREC: "MQTT-3.5.2-1",
    _PT.PUBREL: "MQTT-3.6.2-1",
    _PT.PUBCOMP: "MQTT-3.7.2-1",
    _PT.SUBACK: "MQTT-3.9.3-2",
    _PT.UNSUBACK: "MQTT-3.11.3-2",
    _PT.DISCONNECT: "MQTT-3.14.2-1",
    _PT.AUTH: "MQTT-3.15.2-1",
}

# CONNACK return-code mapping for protocol levels 3 and 4 (see the module docstring table).
CONNACK_V5_FROM_V3: dict[int, int] = {0: 0x00, 1: 0x84, 2: 0x85, 3: 0x88, 4: 0x86, 5: 0x87}
CONNACK_V3_FROM_V5: dict[int, int] = {0x00: 0, 0x84: 1, 0x85: 2, 0x86: 4, 0x8C: 4, 0x87: 5, 0x8A: 5}
_CONNACK_V3_OTHER_FAILURE = 3  # server unavailable: the closest 3.1.1 code for everything else

# Fixed-header flags (low nibble of byte 1) every non-PUBLISH packet must carry (§2.2.2 / §2.1.3).
_REQUIRED_FLAGS = {1: 0, 2: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 9: 0, 10: 2, 11: 0, 12: 0, 13: 0, 14: 0, 15: 0}
_FLAG_STATEMENT = {6: "MQTT-3.6.1-1", 8: "MQTT-3.8.1-1", 10: "MQTT-3.10.1-1"}

# Packet types each side may receive.
_SERVER_RECEIVES = frozenset({1, 3, 4, 5, 6, 7, 8, 10, 12, 14, 15})
_CLIENT_RECEIVES = frozenset({2, 3, 4, 5, 6, 7, 9, 11, 13, 14, 15})

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_pack_u16 = _U16.pack
_pack_u32 = _U32.pack


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------
def _malformed(message: str, statement: str = "") -> MQTTProtocolError:
    return MQTTProtocolError(message, _MALFORMED, statement)


def _protocol_error(message: str, statement: str = "") -> MQTTProtocolError:
    return MQTTProtocolError(message, _PROTOCOL_ERROR, statement)


def _utf8_statements(level: int | None) -> tuple[str, str]:
    """(ill-formed / surrogate statement, U+0000 statement) for the protocol level."""
    if level == MQTT_5:
        return "MQTT-1.5.4-1", "MQTT-1.5.4-2"
    return "MQTT-1.5.3-1", "MQTT-1.5.3-2"


def _bad_utf8(what: str, level: int | None, exc: UnicodeDecodeError) -> MQTTProtocolError:
    return _malformed(
        f"{what} is not well-formed UTF-8 ({exc.reason} at byte {exc.start})", _utf8_statements(level)[0]
    )


def _nul_in_string(what: str, level: int | None) -> MQTTProtocolError:
    return _malformed(f"{what} contains the null character U+0000", _utf8_statements(level)[1])


def _packet_id_zero(name: str, level: int | None) -> MQTTProtocolError:
    statement = "MQTT-2.2.1-3" if level == MQTT_5 else "MQTT-2.3.1-1"
    return _protocol_error(f"{name} packet identifier must be non-zero", statement)


def _topic_name_error(topic: str, level: int | None) -> MQTTProtocolError:
    """The error for a PUBLISH/Will topic name that is empty or holds a NUL or wildcard."""
    if "\x00" in topic:
        return _nul_in_string("topic name", level)
    return MQTTProtocolError(
        f"topic name {topic!r} must not contain the wildcard characters '+' or '#'",
        _TOPIC_NAME_INVALID,
        "MQTT-3.3.2-2",
    )


# ---------------------------------------------------------------------------------------------
# Primitive readers (all bounded by ``end``; each raises MQTTProtocolError on truncation)
# ---------------------------------------------------------------------------------------------
def _read_u16(buf: bytes, pos: int, end: int, what: str) -> int:
    if pos + 2 > end:
        raise _malformed(f"{what}: packet ends inside a two byte integer")
    return (buf[pos] << 8) | buf[pos + 1]


def _read_str(buf: bytes, pos: int, end: int, what: str, level: int | None) -> tuple[str, int]:
    """A UTF-8 Encoded String (§1.5.3 / v5 §1.5.4) at ``pos``; returns (text, next position)."""
    if pos + 2 > end:
        raise _malformed(f"{what}: packet ends inside the string length")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise _malformed(f"{what}: string length exceeds the packet")
    try:
        text = buf[pos + 2 : stop].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad_utf8(what, level, exc)
    if "\x00" in text:
        raise _nul_in_string(what, level)
    return text, stop


def _read_binary(buf: bytes, pos: int, end: int, what: str) -> tuple[bytes, int]:
    """Binary Data (two byte length + bytes); returns (data, next position)."""
    if pos + 2 > end:
        raise _malformed(f"{what}: packet ends inside the binary data length")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise _malformed(f"{what}: binary data length exceeds the packet")
    return buf[pos + 2 : stop], stop


def _read_varint(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """A Variable Byte Integer (v5 §1.5.5) bounded by ``end``; returns (value, next position)."""
    value = 0
    shift = 0
    for index in range(4):
        if pos + index >= end:
            raise _malformed(f"{what}: packet ends inside a variable byte integer")
        byte = buf[pos + index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if index and byte == 0:
                raise _malformed(f"{what}: variable byte integer not minimally encoded", "MQTT-1.5.5-1")
            return value, pos + index + 1
        shift += 7
    raise _malformed(f"{what}: variable byte integer longer than 4 bytes")


# ---------------------------------------------------------------------------------------------
# Properties (MQTT 5 §2.2.2)
# ---------------------------------------------------------------------------------------------
_BOOLEAN_BYTE_PROPERTIES = frozenset(
    name for _pid, (name, ptype, _where) in PROPERTIES.items() if ptype == PropType.BYTE
)
_ALLOWED_PROPERTY_NAMES: dict[object, frozenset[str]] = {
    where: frozenset(name for _pid, (name, _t, allowed) in PROPERTIES.items() if where in allowed)
    for where in [*PacketType, WILL]
}


def _where_name(where: object) -> str:
    return where.name if isinstance(where, PacketType) else "Will properties"


def _decode_properties(buf: bytes, pos: int, end: int, where: object, role: str) -> tuple[Properties, int]:
    """The property block of a v5 packet (or the Will properties); returns (properties, next pos)."""
    where_name = _where_name(where)
    length, pos = _read_varint(buf, pos, end, f"{where_name} property length")
    stop = pos + length
    if stop > end:
        raise _malformed(f"{where_name} property length {length} exceeds the packet")
    props: Properties = {}
    while pos < stop:
        pid = buf[pos]
        pos += 1
        spec = PROPERTIES.get(pid)
        if spec is None:
            raise _malformed(f"{where_name}: unknown property identifier 0x{pid:02X}")
        name, ptype, allowed = spec
        if where not in allowed:  # MQTT 5 §2.2.2.2: "is a Malformed Packet"
            raise _malformed(f"{where_name}: property {name} (0x{pid:02X}) is not allowed here")
        value: Any
        if ptype == PropType.BYTE:
            if pos >= stop:
                raise _malformed(f"{where_name}: property {name} truncated")
            value = buf[pos]
            pos += 1
            if value > 1:
                raise _protocol_error(f"{where_name}: property {name} must be 0 or 1, got {value}")
        elif ptype == PropType.TWO_BYTE_INT:
            value = _read_u16(buf, pos, stop, f"{where_name} property {name}")
            pos += 2
            if value == 0:
                if name == "receive_maximum":
                    raise _protocol_error(f"{where_name}: receive_maximum must not be 0")
                if name == "topic_alias":
                    raise MQTTProtocolError(
                        "PUBLISH: topic_alias must not be 0", ReasonCode.TOPIC_ALIAS_INVALID, "MQTT-3.3.2-8"
                    )
        elif ptype == PropType.FOUR_BYTE_INT:
            if pos + 4 > stop:
                raise _malformed(f"{where_name}: property {name} truncated")
            value = int.from_bytes(buf[pos : pos + 4], "big")
            pos += 4
            if value == 0 and name == "maximum_packet_size":
                raise _protocol_error(f"{where_name}: maximum_packet_size must not be 0")
        elif ptype == PropType.VARINT:
            value, pos = _read_varint(buf, pos, stop, f"{where_name} property {name}")
            if value == 0:
                raise _protocol_error(f"{where_name}: subscription_identifier must not be 0")
        elif ptype == PropType.UTF8:
            value, pos = _read_str(buf, pos, stop, f"{where_name} property {name}", MQTT_5)
            if name == "response_topic" and ("+" in value or "#" in value):
                raise _protocol_error(
                    f"{where_name}: response_topic {value!r} contains wildcards", "MQTT-3.3.2-14"
                )
        elif ptype == PropType.BINARY:
            value, pos = _read_binary(buf, pos, stop, f"{where_name} property {name}")
        else:  # UTF8_PAIR
            key, pos = _read_str(buf, pos, stop, f"{where_name} user_property name", MQTT_5)
            val, pos = _read_str(buf, pos, stop, f"{where_name} user_property value", MQTT_5)
            value = (key, val)
        if name == "user_property":
            props.setdefault("user_property", []).append(value)
        elif name == "subscription_identifier" and where == _PT.PUBLISH:
            if role == "server":
                raise _protocol_error(
                    "PUBLISH from a client must not carry a subscription_identifier", "MQTT-3.3.4-6"
                )
            props.setdefault("subscription_identifier", []).append(value)
        elif name in props:
            raise _protocol_error(f"{where_name}: property {name} appears more than once")
        else:
            props[name] = value
    return props, stop


def _put_str(parts: list[bytes], text: str, what: str) -> None:
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} {text!r} cannot be encoded as UTF-8: {exc.reason}") from None
    if len(raw) > 0xFFFF:
        raise ValueError(f"{what} is {len(raw)} bytes long; a UTF-8 string field holds at most 65535")
    if "\x00" in text:
        raise ValueError(f"{what} {text!r} contains U+0000, which MQTT forbids")
    parts.append(_pack_u16(len(raw)))
    parts.append(raw)


def _put_binary(parts: list[bytes], data: bytes, what: str) -> None:
    if len(data) > 0xFFFF:
        raise ValueError(f"{what} is {len(data)} bytes long; binary data holds at most 65535")
    parts.append(_pack_u16(len(data)))
    parts.append(bytes(data))


def _encode_properties(props: Properties | None, where: object) -> bytes:
    """A v5 property block (length + properties) for ``where`` (a PacketType or WILL)."""
    if not props:
        return b"\x00"
    parts: list[bytes] = []
    allowed = _ALLOWED_PROPERTY_NAMES[where]
    for name, value in props.items():
        pid = PROPERTY_IDS.get(name)
        if pid is None:
            raise ValueError(f"unknown MQTT 5 property {name!r}")
        if name not in allowed:
            raise ValueError(f"property {name} is not allowed in {_where_name(where)}")
        ptype = PROPERTIES[pid][1]
        if name == "user_property":
            for key, val in value:
                parts.append(b"\x26")
                _put_str(parts, key, "user_property name")
                _put_str(parts, val, "user_property value")
        elif ptype == PropType.VARINT:
            for number in value if isinstance(value, list | tuple) else (value,):
                if not 1 <= number <= MAX_REMAINING_LENGTH:
                    raise ValueError(f"{name} must be 1..{MAX_REMAINING_LENGTH}, got {number}")
                parts.append(bytes((pid,)))
                parts.append(encode_variable_byte_integer(number))
        else:
            parts.append(bytes((pid,)))
            if ptype == PropType.BYTE:
                parts.append(bytes((int(value),)))
            elif ptype == PropType.TWO_BYTE_INT:
                parts.append(_pack_u16(value))
            elif ptype == PropType.FOUR_BYTE_INT:
                parts.append(_pack_u32(value))
            elif ptype == PropType.UTF8:
                _put_str(parts, value, name)
            else:  # BINARY
                _put_binary(parts, value, name)
    block = b"".join(parts)
    return encode_variable_byte_integer(len(block)) + block


# ---------------------------------------------------------------------------------------------
# Variable Byte Integer / fixed header encoding
# ---------------------------------------------------------------------------------------------
def _varint_slow(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_VARINT_CACHE: tuple[bytes, ...] = tuple(_varint_slow(n) for n in range(16_384))


def encode_variable_byte_integer(value: int) -> bytes:
    """Encode 0..268,435,455 as a Variable Byte Integer (§2.2.3 / v5 §1.5.5)."""
    if 0 <= value < 16_384:
        return _VARINT_CACHE[value]
    if not 0 <= value <= MAX_REMAINING_LENGTH:
        raise ValueError(f"variable byte integer out of range 0..{MAX_REMAINING_LENGTH}: {value}")
    return _varint_slow(value)


def _packet(first_byte: int, body: bytes) -> bytes:
    size = len(body)
    if size > MAX_REMAINING_LENGTH:
        raise ValueError(f"packet body of {size} bytes exceeds the MQTT maximum {MAX_REMAINING_LENGTH}")
    return b"".join((_FIRST_BYTES[first_byte], encode_variable_byte_integer(size), body))


_FIRST_BYTES: tuple[bytes, ...] = tuple(bytes((n,)) for n in range(256))


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------
def _check_level(protocol_level: int) -> None:
    if protocol_level not in (MQTT_3_1, MQTT_3_1_1, MQTT_5):
        raise ValueError(f"unsupported protocol level {protocol_level}; expected 3, 4 or 5")


def _check_packet_id(packet_id: int | None, name: str) -> int:
    if packet_id is None or not 1 <= packet_id <= 0xFFFF:
        raise ValueError(f"{name} needs a packet identifier in 1..65535, got {packet_id!r}")
    return packet_id


_TOPIC_CACHE: dict[str, bytes] = {}
_TOPIC_CACHE_LIMIT = 4096


def _topic_field(topic: str) -> bytes:
    """Length-prefixed UTF-8 topic name, cached: the same topics are published again and again."""
    field = _TOPIC_CACHE.get(topic)
    if field is None:
        parts: list[bytes] = []
        _put_str(parts, topic, "topic name")
        if "+" in topic or "#" in topic:
            raise ValueError(f"topic name {topic!r} must not contain '+' or '#'")
        field = b"".join(parts)
        if len(_TOPIC_CACHE) >= _TOPIC_CACHE_LIMIT:
            _TOPIC_CACHE.clear()
        _TOPIC_CACHE[topic] = field
    return field


def encode_publish(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: Properties | None,
    protocol_level: int,
) -> bytes:
    """Encode a PUBLISH (§3.3). Properties are written for protocol level 5 and dropped below it."""
    if qos == 0:
        if dup:
            raise ValueError("PUBLISH with QoS 0 must have DUP 0 (MQTT-3.3.1-2)")
        variable = _topic_field(topic)
        first = 0x31 if retain else 0x30
    elif qos == 1 or qos == 2:
        if packet_id is None or not 0 < packet_id <= 0xFFFF:
            raise ValueError(f"PUBLISH QoS {qos} needs a packet identifier in 1..65535, got {packet_id!r}")
        variable = _topic_field(topic) + _pack_u16(packet_id)
        first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
    else:
        raise ValueError(f"PUBLISH QoS must be 0, 1 or 2, got {qos!r}")
    if protocol_level == MQTT_5:
        variable += _encode_properties(properties, _PT.PUBLISH) if properties else b"\x00"
    elif protocol_level != MQTT_3_1_1 and protocol_level != MQTT_3_1:
        _check_level(protocol_level)
    size = len(variable) + len(payload)
    if size < 16_384:
        return b"".join((_FIRST_BYTES[first], _VARINT_CACHE[size], variable, payload))
    return b"".join((_FIRST_BYTES[first], encode_variable_byte_integer(size), variable, payload))


def _encode_connect(packet: Connect, level: int) -> bytes:
    parts: list[bytes] = []
    _put_str(parts, "MQIsdp" if level == MQTT_3_1 else "MQTT", "protocol name")
    flags = 0
    if packet.clean_start:
        flags |= 0x02
    will = packet.will
    if will is not None:
        if will.qos not in (0, 1, 2):
            raise ValueError(f"Will QoS must be 0, 1 or 2, got {will.qos!r}")
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if packet.password is not None:
        if packet.username is None and level != MQTT_5:
            raise ValueError("MQTT 3.1.1 CONNECT cannot carry a password without a user name (MQTT-3.1.2-22)")
        flags |= 0x40
    if packet.username is not None:
        flags |= 0x80
    if not 0 <= packet.keep_alive_s <= 0xFFFF:
        raise ValueError(f"keep_alive_s must be 0..65535, got {packet.keep_alive_s}")
    parts.append(bytes((level, flags)))
    parts.append(_pack_u16(packet.keep_alive_s))
    if level == MQTT_5:
        parts.append(_encode_properties(packet.properties, _PT.CONNECT))
    _put_str(parts, packet.client_id, "client identifier")
    if will is not None:
        if level == MQTT_5:
            parts.append(_encode_properties(will.properties, WILL))
        _put_str(parts, will.topic, "Will topic")
        _put_binary(parts, will.payload, "Will payload")
    if packet.username is not None:
        _put_str(parts, packet.username, "user name")
    if packet.password is not None:
        _put_binary(parts, packet.password, "password")
    return _packet(0x10, b"".join(parts))


def _encode_connack(packet: Connack, level: int) -> bytes:
    # MQTT 3.1 has no session-present flag: the whole byte is reserved there.
    flags = 1 if packet.session_present and level != MQTT_3_1 else 0
    if level == MQTT_5:
        body = bytes((flags, packet.reason_code)) + _encode_properties(packet.properties, _PT.CONNACK)
        return _packet(0x20, body)
    code = packet.reason_code
    return_code = CONNACK_V3_FROM_V5.get(code, _CONNACK_V3_OTHER_FAILURE if code >= 0x80 else None)
    if return_code is None:
        raise ValueError(f"CONNACK reason code 0x{code:02X} has no MQTT 3.1.1 equivalent")
    return bytes((0x20, 2, flags, return_code))


def _encode_ack(first_byte: int, ptype: PacketType) -> Callable[[Any, int], bytes]:
    def encode_ack(packet: Any, level: int) -> bytes:
        pid = _check_packet_id(packet.packet_id, ptype.name)
        if level != MQTT_5 or (packet.reason_code == 0 and not packet.properties):
            return bytes((first_byte, 2)) + _pack_u16(pid)
        if not packet.properties:
            return bytes((first_byte, 3)) + _pack_u16(pid) + bytes((packet.reason_code,))
        body = _pack_u16(pid) + bytes((packet.reason_code,)) + _encode_properties(packet.properties, ptype)
        return _packet(first_byte, body)

    return encode_ack


def _encode_subscribe(packet: Subscribe, level: int) -> bytes:
    parts = [_pack_u16(_check_packet_id(packet.packet_id, "SUBSCRIBE"))]
    if level == MQTT_5:
        parts.append(_encode_properties(packet.properties, _PT.SUBSCRIBE))
    if not packet.subscriptions:
        raise ValueError("SUBSCRIBE needs at least one topic filter (MQTT-3.8.3-3)")
    for sub in packet.subscriptions:
        if sub.qos not in (0, 1, 2):
            raise ValueError(f"subscription QoS must be 0, 1 or 2, got {sub.qos!r}")
        _put_str(parts, sub.topic_filter, "topic filter")
        options = sub.qos
        if level == MQTT_5:
            if sub.retain_handling not in (0, 1, 2):
                raise ValueError(f"retain_handling must be 0, 1 or 2, got {sub.retain_handling!r}")
            options |= (
                (4 if sub.no_local else 0)
                | (8 if sub.retain_as_published else 0)
                | (sub.retain_handling << 4)
            )
        parts.append(bytes((options,)))
    return _packet(0x82, b"".join(parts))


def _encode_suback(packet: Suback, level: int) -> bytes:
    parts = [_pack_u16(_check_packet_id(packet.packet_id, "SUBACK"))]
    if level == MQTT_5:
        parts.append(_encode_properties(packet.properties, _PT.SUBACK))
        parts.append(bytes(packet.reason_codes))
    else:
        parts.append(bytes(code if code in (0, 1, 2) else 0x80 for code in packet.reason_codes))
    return _packet(0x90, b"".join(parts))


def _encode_unsubscribe(packet: Unsubscribe, level: int) -> bytes:
    parts = [_pack_u16(_check_packet_id(packet.packet_id, "UNSUBSCRIBE"))]
    if level == MQTT_5:
        parts.append(_encode_properties(packet.properties, _PT.UNSUBSCRIBE))
    if not packet.topic_filters:
        raise ValueError("UNSUBSCRIBE needs at least one topic filter (MQTT-3.10.3-2)")
    for topic_filter in packet.topic_filters:
        _put_str(parts, topic_filter, "topic filter")
    return _packet(0xA2, b"".join(parts))


def _encode_unsuback(packet: Unsuback, level: int) -> bytes:
    pid = _check_packet_id(packet.packet_id, "UNSUBACK")
    if level != MQTT_5:
        return b"\xb0\x02" + _pack_u16(pid)
    body = _pack_u16(pid) + _encode_properties(packet.properties, _PT.UNSUBACK) + bytes(packet.reason_codes)
    return _packet(0xB0, body)


def _encode_reason_only(first_byte: int, ptype: PacketType) -> Callable[[Any, int], bytes]:
    """DISCONNECT and AUTH: reason code and properties both omitted when 0 / empty (v5)."""

    def encode_reason_only(packet: Any, level: int) -> bytes:
        if level != MQTT_5:
            if ptype == _PT.AUTH:
                raise ValueError("AUTH exists only in MQTT 5")
            return bytes((first_byte, 0))
        if not packet.properties:
            if packet.reason_code == 0:
                return bytes((first_byte, 0))
            return bytes((first_byte, 1, packet.reason_code))
        return _packet(
            first_byte, bytes((packet.reason_code,)) + _encode_properties(packet.properties, ptype)
        )

    return encode_reason_only


def _encode_publish_packet(packet: Publish, level: int) -> bytes:
    return encode_publish(
        packet.topic,
        packet.payload,
        packet.qos,
        packet.retain,
        packet.dup,
        packet.packet_id,
        packet.properties,
        level,
    )


_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: _encode_publish_packet,
    Puback: _encode_ack(0x40, _PT.PUBACK),
    Pubrec: _encode_ack(0x50, _PT.PUBREC),
    Pubrel: _encode_ack(0x62, _PT.PUBREL),
    Pubcomp: _encode_ack(0x70, _PT.PUBCOMP),
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_unsuback,
    Pingreq: lambda _packet, _level: b"\xc0\x00",
    Pingresp: lambda _packet, _level: b"\xd0\x00",
    Disconnect: _encode_reason_only(0xE0, _PT.DISCONNECT),
    Auth: _encode_reason_only(0xF0, _PT.AUTH),
}


def encode(packet: Packet, protocol_level: int) -> bytes:
    """Encode any packet for protocol level 3, 4 or 5.

    Below level 5 the v5-only parts (properties, most reason codes) are dropped: CONNACK codes are
    mapped (module docstring), SUBACK failures become 0x80. Raises ValueError for a packet that
    cannot be represented (e.g. QoS 3, packet id 0, AUTH below v5, a string over 65535 bytes).
    """
    _check_level(protocol_level)
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise TypeError(f"not an MQTT packet: {packet!r}")
    return encoder(packet, protocol_level)


# ---------------------------------------------------------------------------------------------
# CONNACK after a failed CONNECT
# ---------------------------------------------------------------------------------------------
def connack_for_error(err: MQTTProtocolError, protocol_level: int | None) -> bytes | None:
    """The CONNACK to send before closing when reading CONNECT failed, else None.

    MQTT 3.1/3.1.1 (or protocol still unknown) only have return codes for "unacceptable protocol
    version" (0x01, MQTT-3.1.2-2) and "identifier rejected" (0x02, MQTT-3.1.3-9); other CONNECT
    errors close the connection without a CONNACK. MQTT 5 may answer any CONNECT error with a
    CONNACK carrying the reason code (§4.13.1). ``protocol_level`` None falls back to the level
    the decoder recorded on the error.
    """
    if not err.during_connect:
        return None
    level = protocol_level if protocol_level is not None else err.protocol_level
    if level == MQTT_5:
        code = err.reason_code
        if code not in REASON_CODES_ALLOWED[_PT.CONNACK] or code < 0x80:
            code = _PROTOCOL_ERROR
        return bytes((0x20, 3, 0, code, 0))
    return_code = {0x84: 1, 0x85: 2}.get(err.reason_code)
    if return_code is None:
        return None
    return bytes((0x20, 2, 0, return_code))


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------
# UTF-8 topic names of received PUBLISHes that decoded and passed the topic-name checks, by their
# bytes: decoding and scanning the same topic again for every message was a tenth of the decode
_TOPIC_NAMES: dict[bytes, str] = {}
_TOPIC_NAMES_LIMIT = 4096


class Decoder:
    """Incremental MQTT decoder for one connection (sans-I/O).

    ``role="server"`` decodes client->server packets: the first must be CONNECT, whose protocol
    level then selects the grammar (``protocol_level`` is None until then). ``role="client"``
    decodes server->client packets with ``protocol_level`` set by the caller; if left None it is
    taken from the first packet, which must then be CONNACK (Remaining Length 2 means 3.1.1, more
    means 5) or AUTH (v5). With a known level the client role does not insist on CONNACK first
    (the core also uses it to decode stored PUBLISH bytes) but accepts only one CONNACK.
    ``handshake_done=True`` starts mid-connection: no CONNECT (server) / CONNACK (client) is
    accepted any more, and ``protocol_level`` must be given.

    After ``feed`` raised, the decoder is unusable (every later ``feed`` raises again).
    """

    __slots__ = ("_connected", "_failed", "_need", "_pending", "max_packet_size", "protocol_level", "role")

    def __init__(
        self,
        *,
        role: Literal["server", "client"] = "server",
        max_packet_size: int = MAX_REMAINING_LENGTH,
        protocol_level: int | None = None,
        handshake_done: bool = False,
    ) -> None:
        if role not in ("server", "client"):
            raise ValueError(f"role must be 'server' or 'client', got {role!r}")
        if protocol_level is not None and protocol_level not in (MQTT_3_1, MQTT_3_1_1, MQTT_5):
            raise ValueError(f"unsupported protocol level {protocol_level}; expected 3, 4 or 5")
        if handshake_done and protocol_level is None:
            raise ValueError("handshake_done=True needs protocol_level")
        self.role: Literal["server", "client"] = role
        self.max_packet_size = max_packet_size
        self.protocol_level = protocol_level
        self._connected = handshake_done
        self._failed = False
        self._pending = bytearray()
        self._need = 0  # bytes ``_pending`` must hold before parsing is worth trying again

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Add received bytes; return every packet completed by them (possibly none)."""
        if self._failed:
            raise _protocol_error(
                "decoder already failed on an earlier malformed packet; close the connection"
            )
        if self._pending:
            self._pending += data
            if len(self._pending) < self._need:
                return []
            buf = bytes(self._pending)
            self._pending = bytearray()
        else:
            buf = data if type(data) is bytes else bytes(data)
            if not buf:
                return []
        out: list[Packet] = []
        try:
            self._parse(buf, out)
        except MQTTProtocolError as err:
            self._failed = True
            if err.protocol_level is None:
                err.protocol_level = self.protocol_level
            err.packets_before_error = out
            raise
        except Exception as exc:  # defensive: a decoder bug must still look like a protocol error
            self._failed = True
            internal = MQTTProtocolError(
                f"internal decoder error {type(exc).__name__}: {exc}",
                ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR,
            )
            internal.protocol_level = self.protocol_level
            internal.packets_before_error = out
            raise internal from exc
        return out

    def _parse(self, buf: bytes, out: list[Packet]) -> None:
        size = len(buf)
        pos = 0
        need = 0
        append = out.append
        while True:
            if size - pos < 2:
                need = 2
                break
            first = buf[pos]
            remaining = buf[pos + 1]
            if remaining < 0x80:
                body = pos + 2
            else:
                remaining, body = self._long_remaining_length(buf, pos + 1, size)
                if body == 0:
                    need = size - pos + 1
                    break
            end = body + remaining
            if end - pos > self.max_packet_size:
                err = MQTTProtocolError(
                    f"{_PACKET_NAMES.get(first >> 4, 'reserved type')} packet of {end - pos} bytes exceeds "
                    f"the maximum packet size {self.max_packet_size}",
                    ReasonCode.PACKET_TOO_LARGE,
                )
                err.during_connect = (first >> 4) == 1 and not self._connected and self.role == "server"
                raise err
            if end > size:
                need = end - pos
                break
            if first >> 4 == 3 and self._connected:
                append(self._decode_publish(buf, first, body, end))
            elif first == 0x40 and end - body == 2 and self._connected:
                # PUBACK without reason code: the other hot packet (same checks as _decode_ack)
                packet_id = (buf[body] << 8) | buf[body + 1]
                if not packet_id:
                    raise _packet_id_zero("PUBACK", self.protocol_level)
                append(Puback(packet_id))
            else:
                append(self._decode_other(buf, first, body, end))
            pos = end
        if pos < size:
            self._pending = bytearray(memoryview(buf)[pos:])
            self._need = need
        else:
            self._need = 0

    def _long_remaining_length(self, buf: bytes, pos: int, size: int) -> tuple[int, int]:
        """Remaining Length of 2-4 bytes starting at ``pos``; (value, body start) or (0, 0) if incomplete."""
        value = 0
        shift = 0
        for index in range(4):
            if pos + index >= size:
                return 0, 0
            byte = buf[pos + index]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                if byte == 0 and self.protocol_level == MQTT_5:
                    raise _malformed("Remaining Length is not minimally encoded", "MQTT-1.5.5-1")
                return value, pos + index + 1
            shift += 7
        raise _malformed("Remaining Length is longer than 4 bytes")

    # -- PUBLISH (the hot path) ------------------------------------------------------------------
    def _decode_publish(self, buf: bytes, first: int, body: int, end: int) -> Publish:
        level = self.protocol_level
        qos = (first >> 1) & 3
        if qos == 3:
            raise _malformed("PUBLISH QoS bits are 3, which is invalid", "MQTT-3.3.1-4")
        if qos == 0 and first & 8:
            raise _malformed("PUBLISH with QoS 0 has DUP set", "MQTT-3.3.1-2")
        if body + 2 > end:
            raise _malformed("PUBLISH ends inside the topic name length")
        pos = body + 2 + ((buf[body] << 8) | buf[body + 1])
        if pos > end:
            raise _malformed("PUBLISH topic name length exceeds the packet")
        raw_topic = buf[body + 2 : pos]
        topic = _TOPIC_NAMES.get(raw_topic)  # decoded and checked before (the same topics recur)
        checked = topic is not None
        if topic is None:
            try:
                topic = raw_topic.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _bad_utf8("PUBLISH topic name", level, exc)
        if qos:
            if pos + 2 > end:
                raise _malformed("PUBLISH ends inside the packet identifier")
            packet_id: int | None = (buf[pos] << 8) | buf[pos + 1]
            if not packet_id:
                raise _packet_id_zero("PUBLISH", level)
            pos += 2
        else:
            packet_id = None
        if level == MQTT_5:
            if pos < end and buf[pos] == 0:  # no properties: the common case
                props: Properties = {}
                pos += 1
            else:
                props, pos = _decode_properties(buf, pos, end, _PT.PUBLISH, self.role)
            if not topic and "topic_alias" not in props:
                raise _protocol_error("PUBLISH has an empty topic name and no topic_alias")
        else:
            props = {}
            if not topic:
                raise _protocol_error("PUBLISH topic name must not be empty", "MQTT-4.7.3-1")
        if not checked:
            if "+" in topic or "#" in topic or "\x00" in topic:
                raise _topic_name_error(topic, level)
            if topic:
                if len(_TOPIC_NAMES) >= _TOPIC_NAMES_LIMIT:
                    _TOPIC_NAMES.clear()
                _TOPIC_NAMES[raw_topic] = topic
        return Publish(topic, buf[pos:end], qos, bool(first & 1), bool(first & 8), packet_id, props)

    # -- everything else ------------------------------------------------------------------------
    def _decode_other(self, buf: bytes, first: int, body: int, end: int) -> Packet:
        ptype = first >> 4
        flags = first & 0x0F
        level = self.protocol_level
        server = self.role == "server"
        if not self._connected:
            if server and ptype != 1:
                raise _protocol_error(
                    f"first packet must be CONNECT, got {_PACKET_NAMES.get(ptype, f'reserved type {ptype}')}",
                    "MQTT-3.1.0-1",
                )
            if not server and level is None and ptype not in (2, 15):
                raise _protocol_error(
                    f"protocol level unknown: the first packet from the server must be CONNACK, got "
                    f"{_PACKET_NAMES.get(ptype, f'reserved type {ptype}')}",
                    "MQTT-3.2.0-1",
                )
        if ptype == 0 or (ptype == 15 and level in (MQTT_3_1, MQTT_3_1_1)):
            raise _malformed(f"packet type {ptype} is reserved")
        if ptype not in (_SERVER_RECEIVES if server else _CLIENT_RECEIVES):
            side = "a client" if server else "a server"
            raise _protocol_error(f"{_PACKET_NAMES[ptype]} must not be sent by {side}")
        if ptype != 3 and flags != _REQUIRED_FLAGS[ptype]:
            statement = _FLAG_STATEMENT.get(ptype, "MQTT-2.1.3-1" if level == MQTT_5 else "MQTT-2.2.2-2")
            raise _malformed(
                f"{_PACKET_NAMES[ptype]} fixed header flags are 0b{flags:04b}, "
                f"must be 0b{_REQUIRED_FLAGS[ptype]:04b}",
                statement,
            )
        if ptype == 1:
            return self._decode_connect(buf, body, end)
        if ptype == 3:  # client role before CONNACK (the fast path needs the handshake done)
            return self._decode_publish(buf, first, body, end)
        if level is None:
            if ptype == 2:  # client role, level unknown: infer it from the CONNACK's length
                level = self.protocol_level = MQTT_3_1_1 if end - body == 2 else MQTT_5
            else:  # AUTH before CONNACK exists only in v5
                level = self.protocol_level = MQTT_5
        if ptype in (4, 5, 6, 7):
            return _decode_ack(buf, body, end, ptype, level)
        if ptype == 2:
            if self._connected:
                raise _protocol_error("second CONNACK on the connection")
            packet = _decode_connack(buf, body, end, level)
            self._connected = True
            return packet
        if ptype == 8:
            return _decode_subscribe(buf, body, end, level)
        if ptype == 10:
            return _decode_unsubscribe(buf, body, end, level)
        if ptype == 9:
            return _decode_suback(buf, body, end, level)
        if ptype == 11:
            return _decode_unsuback(buf, body, end, level)
        if ptype in (12, 13):
            if end != body:
                raise _malformed(f"{_PACKET_NAMES[ptype]} must have Remaining Length 0, got {end - body}")
            return Pingreq() if ptype == 12 else Pingresp()
        if ptype == 14:
            if level != MQTT_5:
                if not server:
                    raise _protocol_error("an MQTT 3.1.1 server never sends DISCONNECT")
                if end != body:
                    raise _malformed(f"MQTT 3.1.1 DISCONNECT must have Remaining Length 0, got {end - body}")
                return Disconnect()
            disconnect = _decode_reason_only(buf, body, end, _PT.DISCONNECT, self.role)
            if not server and "session_expiry_interval" in disconnect.properties:
                raise _protocol_error(
                    "a server must not send session_expiry_interval in DISCONNECT", "MQTT-3.14.2-2"
                )
            return Disconnect(disconnect.reason_code, disconnect.properties)
        # ptype == 15: AUTH (v5 only; reserved type in 3.1.1 was rejected above)
        auth = _decode_reason_only(buf, body, end, _PT.AUTH, self.role)
        return Auth(auth.reason_code, auth.properties)

    def _decode_connect(self, buf: bytes, pos: int, end: int) -> Connect:
        if self._connected:
            raise _protocol_error("second CONNECT on the connection", "MQTT-3.1.0-2")
        try:
            packet = self._decode_connect_body(buf, pos, end)
        except MQTTProtocolError as err:
            err.during_connect = True
            err.protocol_level = self.protocol_level
            raise
        self._connected = True
        return packet

    def _decode_connect_body(self, buf: bytes, pos: int, end: int) -> Connect:
        if pos + 2 > end:
            raise _malformed("CONNECT ends inside the protocol name")
        name_stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
        if name_stop + 1 > end:
            raise _malformed("CONNECT ends before the protocol level")
        raw_name = buf[pos + 2 : name_stop]
        level = buf[name_stop]
        if (raw_name, level) not in ((b"MQTT", MQTT_3_1_1), (b"MQTT", MQTT_5), (b"MQIsdp", MQTT_3_1)):
            raise MQTTProtocolError(
                f"unsupported protocol name {raw_name[:16]!r} / level {level}",
                ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                "MQTT-3.1.2-2" if raw_name in (b"MQTT", b"MQIsdp") else "MQTT-3.1.2-1",
            )
        self.protocol_level = level
        protocol_name = raw_name.decode("ascii")
        v5 = level == MQTT_5
        pos = name_stop + 1
        if pos + 3 > end:
            raise _malformed("CONNECT ends inside the connect flags / keep alive")
        flags = buf[pos]
        keep_alive_s = (buf[pos + 1] << 8) | buf[pos + 2]
        pos += 3
        if flags & 0x01:
            raise _malformed("CONNECT reserved flag (bit 0) must be 0", "MQTT-3.1.2-3")
        clean_start = bool(flags & 0x02)
        will_flag = flags & 0x04
        will_qos = (flags >> 3) & 3
        will_retain = bool(flags & 0x20)
        password_flag = flags & 0x40
        username_flag = flags & 0x80
        if not will_flag:
            if will_qos:
                raise _malformed(
                    "CONNECT Will QoS must be 0 when the Will flag is 0",
                    "MQTT-3.1.2-11" if v5 else "MQTT-3.1.2-13",
                )
            if will_retain:
                raise _malformed(
                    "CONNECT Will retain must be 0 when the Will flag is 0",
                    "MQTT-3.1.2-13" if v5 else "MQTT-3.1.2-15",
                )
        elif will_qos == 3:
            raise _malformed(
                "CONNECT Will QoS is 3, which is invalid", "MQTT-3.1.2-12" if v5 else "MQTT-3.1.2-14"
            )
        if password_flag and not username_flag and not v5:
            raise _malformed("CONNECT password flag set without the user name flag", "MQTT-3.1.2-22")
        if v5:
            props, pos = _decode_properties(buf, pos, end, _PT.CONNECT, self.role)
            if "authentication_data" in props and "authentication_method" not in props:
                raise _protocol_error("CONNECT has authentication_data without authentication_method")
        else:
            props = {}
        client_id, pos = _read_str(buf, pos, end, "CONNECT client identifier", level)
        if level == MQTT_3_1 and not 1 <= len(client_id) <= 23:
            raise MQTTProtocolError(
                f"MQTT 3.1 CONNECT client identifier must be 1 to 23 characters, got {len(client_id)}",
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                "MQTT 3.1 §3.1 Client Identifier",
            )
        if not client_id and not v5 and not clean_start:
            raise MQTTProtocolError(
                "CONNECT with an empty client identifier must set clean session",
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
                "MQTT-3.1.3-8",
            )
        will = None
        if will_flag:
            will_props: Properties = {}
            if v5:
                will_props, pos = _decode_properties(buf, pos, end, WILL, self.role)
            will_topic, pos = _read_str(buf, pos, end, "CONNECT Will topic", level)
            if not will_topic:
                raise MQTTProtocolError(
                    "CONNECT Will topic must not be empty", ReasonCode.TOPIC_NAME_INVALID, "MQTT-4.7.3-1"
                )
            if "+" in will_topic or "#" in will_topic:
                raise _topic_name_error(will_topic, level)
            will_payload, pos = _read_binary(buf, pos, end, "CONNECT Will payload")
            will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
        username = None
        if username_flag:
            username, pos = _read_str(buf, pos, end, "CONNECT user name", level)
        password = None
        if password_flag:
            password, pos = _read_binary(buf, pos, end, "CONNECT password")
        if pos != end:
            raise _malformed(f"CONNECT has {end - pos} unexpected bytes after its payload")
        return Connect(
            client_id, level, protocol_name, clean_start, keep_alive_s, username, password, will, props
        )


def _check_reason(code: int, ptype: PacketType) -> None:
    if code not in REASON_CODES_ALLOWED[ptype]:
        raise _protocol_error(f"{ptype.name} reason code 0x{code:02X} is not valid", _REASON_STATEMENT[ptype])


_ACK_CLASSES: dict[int, type[Puback] | type[Pubrec] | type[Pubrel] | type[Pubcomp]] = {
    4: Puback,
    5: Pubrec,
    6: Pubrel,
    7: Pubcomp,
}


def _decode_ack(buf: bytes, pos: int, end: int, ptype_value: int, level: int) -> Packet:
    """PUBACK / PUBREC / PUBREL / PUBCOMP (§3.4-§3.7)."""
    ptype = PacketType(ptype_value)
    length = end - pos
    if length < 2:
        raise _malformed(f"{ptype.name} Remaining Length {length} is too short for a packet identifier")
    packet_id = (buf[pos] << 8) | buf[pos + 1]
    if not packet_id:
        raise _packet_id_zero(ptype.name, level)
    cls = _ACK_CLASSES[ptype_value]
    if level != MQTT_5:
        if length != 2:
            raise _malformed(f"MQTT 3.1.1 {ptype.name} must have Remaining Length 2, got {length}")
        return cls(packet_id)
    if length == 2:
        return cls(packet_id)
    reason = buf[pos + 2]
    _check_reason(reason, ptype)
    if length == 3:
        return cls(packet_id, reason)
    props, stop = _decode_properties(buf, pos + 3, end, ptype, "")
    if stop != end:
        raise _malformed(f"{ptype.name} has {end - stop} unexpected bytes after its properties")
    return cls(packet_id, reason, props)


def _decode_connack(buf: bytes, pos: int, end: int, level: int) -> Connack:
    length = end - pos
    if length < 2:
        raise _malformed(f"CONNACK Remaining Length {length} is too short")
    flags = buf[pos]
    code = buf[pos + 1]
    if flags & 0xFE:
        raise _malformed("CONNACK acknowledge flags bits 7-1 are reserved and must be 0")
    session_present = bool(flags)
    if level != MQTT_5:
        if length != 2:
            raise _malformed(f"MQTT 3.1.1 CONNACK must have Remaining Length 2, got {length}")
        reason = CONNACK_V5_FROM_V3.get(code)
        if reason is None:
            raise _protocol_error(f"CONNACK return code {code} is reserved")
        if reason and session_present:
            raise _protocol_error(
                "CONNACK with a non-zero return code must not set session present", "MQTT-3.2.2-4"
            )
        return Connack(session_present, reason)
    _check_reason(code, _PT.CONNACK)
    if code and session_present:
        raise _protocol_error(
            "CONNACK with a failure reason code must not set session present", "MQTT-3.2.2-6"
        )
    props, stop = _decode_properties(buf, pos + 2, end, _PT.CONNACK, "client")
    if stop != end:
        raise _malformed(f"CONNACK has {end - stop} unexpected bytes after its properties")
    return Connack(session_present, code, props)


def _decode_subscribe(buf: bytes, pos: int, end: int, level: int) -> Subscribe:
    v5 = level == MQTT_5
    packet_id = _read_u16(buf, pos, end, "SUBSCRIBE packet identifier")
    if not packet_id:
        raise _packet_id_zero("SUBSCRIBE", level)
    pos += 2
    props: Properties = {}
    if v5:
        props, pos = _decode_properties(buf, pos, end, _PT.SUBSCRIBE, "server")
    subscriptions: list[Subscription] = []
    while pos < end:
        topic_filter, pos = _read_str(buf, pos, end, "SUBSCRIBE topic filter", level)
        if pos >= end:
            raise _malformed("SUBSCRIBE ends before the subscription options")
        options = buf[pos]
        pos += 1
        qos = options & 0x03
        if not v5:
            if options & 0xFC:
                raise _malformed("SUBSCRIBE requested QoS byte has reserved bits 7-2 set", "MQTT-3-8.3-4")
            if qos == 3:
                raise _malformed("SUBSCRIBE requested QoS is 3, which is invalid", "MQTT-3-8.3-4")
            subscriptions.append(Subscription(topic_filter, qos))
            continue
        if options & 0xC0:
            raise _malformed("SUBSCRIBE subscription options have reserved bits 7-6 set", "MQTT-3.8.3-5")
        if qos == 3:
            raise _protocol_error("SUBSCRIBE maximum QoS is 3, which is invalid")
        retain_handling = (options >> 4) & 0x03
        if retain_handling == 3:
            raise _protocol_error("SUBSCRIBE retain handling is 3, which is invalid")
        no_local = bool(options & 0x04)
        if no_local and topic_filter.startswith("$share/"):
            raise _protocol_error("SUBSCRIBE sets no_local on a shared subscription", "MQTT-3.8.3-4")
        subscriptions.append(Subscription(topic_filter, qos, no_local, bool(options & 0x08), retain_handling))
    if not subscriptions:
        raise _protocol_error(
            "SUBSCRIBE must contain at least one topic filter", "MQTT-3.8.3-2" if v5 else "MQTT-3.8.3-3"
        )
    return Subscribe(packet_id, subscriptions, props)


def _decode_unsubscribe(buf: bytes, pos: int, end: int, level: int) -> Unsubscribe:
    packet_id = _read_u16(buf, pos, end, "UNSUBSCRIBE packet identifier")
    if not packet_id:
        raise _packet_id_zero("UNSUBSCRIBE", level)
    pos += 2
    props: Properties = {}
    if level == MQTT_5:
        props, pos = _decode_properties(buf, pos, end, _PT.UNSUBSCRIBE, "server")
    topic_filters: list[str] = []
    while pos < end:
        topic_filter, pos = _read_str(buf, pos, end, "UNSUBSCRIBE topic filter", level)
        topic_filters.append(topic_filter)
    if not topic_filters:
        raise _protocol_error("UNSUBSCRIBE must contain at least one topic filter", "MQTT-3.10.3-2")
    return Unsubscribe(packet_id, topic_filters, props)


def _decode_suback(buf: bytes, pos: int, end: int, level: int) -> Suback:
    packet_id = _read_u16(buf, pos, end, "SUBACK packet identifier")
    if not packet_id:
        raise _packet_id_zero("SUBACK", level)
    pos += 2
    props: Properties = {}
    if level == MQTT_5:
        props, pos = _decode_properties(buf, pos, end, _PT.SUBACK, "client")
        codes = list(buf[pos:end])
        for code in codes:
            _check_reason(code, _PT.SUBACK)
    else:
        codes = list(buf[pos:end])
        for code in codes:
            if code not in (0, 1, 2, 0x80):
                raise _protocol_error(
                    f"MQTT 3.1.1 SUBACK return code 0x{code:02X} is reserved", "MQTT-3.9.3-2"
                )
    if not codes:
        raise _protocol_error("SUBACK must contain at least one return code")
    return Suback(packet_id, codes, props)


def _decode_unsuback(buf: bytes, pos: int, end: int, level: int) -> Unsuback:
    packet_id = _read_u16(buf, pos, end, "UNSUBACK packet identifier")
    if not packet_id:
        raise _packet_id_zero("UNSUBACK", level)
    if level != MQTT_5:
        if end - pos != 2:
            raise _malformed(f"MQTT 3.1.1 UNSUBACK must have Remaining Length 2, got {end - pos}")
        return Unsuback(packet_id)
    props, pos = _decode_properties(buf, pos + 2, end, _PT.UNSUBACK, "client")
    codes = list(buf[pos:end])
    for code in codes:
        _check_reason(code, _PT.UNSUBACK)
    if not codes:
        raise _protocol_error("UNSUBACK must contain at least one reason code")
    return Unsuback(packet_id, codes, props)


def _decode_reason_only(buf: bytes, pos: int, end: int, ptype: PacketType, role: str) -> Disconnect:
    """v5 DISCONNECT / AUTH body: optional reason code, optional properties (§3.14.2, §3.15.2)."""
    if pos == end:
        return Disconnect()
    reason = buf[pos]
    _check_reason(reason, ptype)
    if end - pos == 1:
        return Disconnect(reason)
    props, stop = _decode_properties(buf, pos + 1, end, ptype, role)
    if stop != end:
        raise _malformed(f"{ptype.name} has {end - stop} unexpected bytes after its properties")
    return Disconnect(reason, props)
