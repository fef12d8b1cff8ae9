"""SUBSCRIBE, SUBACK, UNSUBSCRIBE and UNSUBACK in the MQTT codec (``broker.mqtt.codec``): MQTT
3.1.1 §3.8-§3.11, MQTT 5 §3.8-§3.11, encoded and decoded. Topic FILTER syntax is the topics
module's (SUBACK 0x8F); only the UTF-8 rules apply here.
"""

from __future__ import annotations

from broker.mqtt.codec_primitives import (
    _PT,
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
    _read_str,
    _read_u16,
)
from broker.mqtt.packets import (
    MQTT_5,
    Properties,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
)


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
