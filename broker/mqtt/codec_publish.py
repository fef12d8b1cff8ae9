"""PUBLISH and its acknowledgements (PUBACK, PUBREC, PUBREL, PUBCOMP) in the MQTT codec
(``broker.mqtt.codec``): MQTT 3.1.1 §3.3-§3.7, MQTT 5 §3.3-§3.7. The hot path of the broker.

* ``encode_publish`` (the broker's shortcut, with its cache of encoded topic fields) and the
  acknowledgement encoders;
* decoding the acknowledgements, and ``PublishDecoding``: the PUBLISH method of ``Decoder`` (a
  base class of it, so ``_decode_publish`` stays a direct method of the decoder; the decoder loop
  itself decodes a PUBACK without reason code inline), with the cache of decoded topic names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.mqtt.codec_primitives import (
    _FIRST_BYTES,
    _PT,
    _VARINT_CACHE,
    DecoderState,
    _bad_utf8,
    _check_level,
    _check_packet_id,
    _check_reason,
    _decode_properties,
    _encode_properties,
    _malformed,
    _pack_u16,
    _packet,
    _packet_id_zero,
    _protocol_error,
    _put_str,
    _topic_name_error,
    encode_variable_byte_integer,
)
from broker.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    Packet,
    PacketType,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
)

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


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------
# UTF-8 topic names of received PUBLISHes that decoded and passed the topic-name checks, by their
# bytes: decoding and scanning the same topic again for every message was a tenth of the decode
_TOPIC_NAMES: dict[bytes, str] = {}
_TOPIC_NAMES_LIMIT = 4096


class PublishDecoding(DecoderState):
    """The PUBLISH method of ``broker.mqtt.codec.Decoder`` (one of its base classes)."""

    __slots__ = ()

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
