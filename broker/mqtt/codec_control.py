"""DISCONNECT and AUTH bodies in the MQTT codec (``broker.mqtt.codec``): MQTT 5 §3.14-§3.15
(reason code and properties, both omitted when 0 / empty), encoded and decoded. PINGREQ and
PINGRESP have no body: ``broker.mqtt.codec`` encodes them from its table and decodes them in its
dispatch, as it does the MQTT 3.1.1 DISCONNECT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.mqtt.codec_primitives import (
    _PT,
    _check_reason,
    _decode_properties,
    _encode_properties,
    _malformed,
    _packet,
)
from broker.mqtt.packets import (
    MQTT_5,
    Disconnect,
    PacketType,
)


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
