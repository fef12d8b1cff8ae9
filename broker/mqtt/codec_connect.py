"""CONNECT and CONNACK in the MQTT codec (``broker.mqtt.codec``): MQTT 3.1.1 §3.1-§3.2, MQTT 5
§3.1-§3.2, MQTT 3.1 (MQIsdp).

* encoding CONNECT and CONNACK, with the CONNACK return-code mapping for levels 3/4 (the table in
  ``broker.mqtt.codec``'s docstring);
* ``connack_for_error``: the CONNACK to send when reading CONNECT failed (§4.13.1);
* decoding CONNACK, and ``ConnectDecoding``: the CONNECT methods of ``Decoder`` (a base class of
  it, so they stay direct methods of the decoder; they set its protocol level).
"""

from __future__ import annotations

from broker.mqtt.codec_primitives import (
    _PROTOCOL_ERROR,
    _PT,
    REASON_CODES_ALLOWED,
    DecoderState,
    _check_reason,
    _decode_properties,
    _encode_properties,
    _malformed,
    _pack_u16,
    _packet,
    _protocol_error,
    _put_binary,
    _put_str,
    _read_binary,
    _read_str,
    _topic_name_error,
)
from broker.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    WILL,
    Connack,
    Connect,
    MQTTProtocolError,
    Properties,
    ReasonCode,
    Will,
)

# CONNACK return-code mapping for protocol levels 3 and 4 (see the module docstring table).
CONNACK_V5_FROM_V3: dict[int, int] = {0: 0x00, 1: 0x84, 2: 0x85, 3: 0x88, 4: 0x86, 5: 0x87}
CONNACK_V3_FROM_V5: dict[int, int] = {0x00: 0, 0x84: 1, 0x85: 2, 0x86: 4, 0x8C: 4, 0x87: 5, 0x8A: 5}
_CONNACK_V3_OTHER_FAILURE = 3  # server unavailable: the closest 3.1.1 code for everything else


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


# Keep-alive values above 256 are int objects of their own (28 B each, held by every connection
# for its lifetime); devices use a few values (300, 600, 1200 s), so each is kept once here.
_SHARED_KEEP_ALIVES: dict[int, int] = {}
_SHARED_KEEP_ALIVES_MAX = 1024


def _share_keep_alive(value: int) -> int:
    if len(_SHARED_KEEP_ALIVES) < _SHARED_KEEP_ALIVES_MAX:
        _SHARED_KEEP_ALIVES[value] = value
    return value


class ConnectDecoding(DecoderState):
    """The CONNECT methods of ``broker.mqtt.codec.Decoder`` (one of its base classes)."""

    __slots__ = ()

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
        if keep_alive_s > 256:  # above CPython's cached small ints: one object per value
            keep_alive_s = _SHARED_KEEP_ALIVES.get(keep_alive_s) or _share_keep_alive(keep_alive_s)
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
