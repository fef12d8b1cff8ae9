"""The shared grammar of the MQTT codec (``broker.mqtt.codec``): what every packet family's
encoder and decoder is built from.

* the error constructors (Malformed Packet 0x81, Protocol Error 0x82, bad UTF-8, NUL, packet id 0,
  topic name) with the normative statement of each check (MQTT 5 §4.13);
* the reason codes each v5 packet may carry (MQTT 5 §3.x.2.1 tables) and their check;
* bounded readers of the data types (MQTT 3.1.1 §1.5, MQTT 5 §1.5: two byte integer, UTF-8
  string, binary data, Variable Byte Integer) and their writers;
* the MQTT 5 property block (§2.2.2), read and written;
* the Variable Byte Integer / fixed header encoding and the protocol level and packet id checks.

No I/O, no clock, no logging (see ``broker.mqtt.codec``).
"""

from __future__ import annotations

import struct
from typing import Any, Literal

from broker.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    PROPERTIES,
    PROPERTY_IDS,
    WILL,
    MQTTProtocolError,
    PacketType,
    Properties,
    PropType,
    ReasonCode,
)

MAX_REMAINING_LENGTH = 268_435_455  # largest Variable Byte Integer (§1.5.5 / §2.2.3)

_MALFORMED = int(ReasonCode.MALFORMED_PACKET)
_PROTOCOL_ERROR = int(ReasonCode.PROTOCOL_ERROR)
_TOPIC_NAME_INVALID = int(ReasonCode.TOPIC_NAME_INVALID)

_PT = PacketType
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


def _check_reason(code: int, ptype: PacketType) -> None:
    if code not in REASON_CODES_ALLOWED[ptype]:
        raise _protocol_error(f"{ptype.name} reason code 0x{code:02X} is not valid", _REASON_STATEMENT[ptype])


# ---------------------------------------------------------------------------------------------
# Decoder state
# ---------------------------------------------------------------------------------------------
class DecoderState:
    """The per-connection state of ``broker.mqtt.codec.Decoder`` (its slots), declared once for the
    decoder and its per-family base classes (``ConnectDecoding``, ``PublishDecoding``)."""

    __slots__ = ("_connected", "_failed", "_need", "_pending", "max_packet_size", "protocol_level", "role")

    role: Literal["server", "client"]
    max_packet_size: int
    protocol_level: int | None
    _connected: bool
    _failed: bool
    _pending: bytearray | bytes
    _need: int
