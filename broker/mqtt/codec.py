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

The codec is split by packet family, one module each; this module is the stream decoder and the
encoder dispatch, and re-exports the public names (import them from here):

* ``codec_primitives``: errors, the data types (strings, binary, varints), the MQTT 5 property
  block and the reason-code tables every family shares;
* ``codec_connect``: CONNECT / CONNACK and ``connack_for_error``;
* ``codec_publish``: PUBLISH and PUBACK / PUBREC / PUBREL / PUBCOMP (``encode_publish``);
* ``codec_subscribe``: SUBSCRIBE / SUBACK / UNSUBSCRIBE / UNSUBACK;
* ``codec_control``: DISCONNECT / AUTH (PINGREQ / PINGRESP have no body: encoded from the table
  below, decoded in ``Decoder._decode_other``).

``Decoder``'s CONNECT and PUBLISH methods live in their family's module as base classes of it
(``ConnectDecoding``, ``PublishDecoding``), so they stay direct methods of the decoder; the other
families' decoders are module-level functions called directly from ``_decode_other``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from broker.mqtt.codec_connect import (
    CONNACK_V3_FROM_V5,
    CONNACK_V5_FROM_V3,
    ConnectDecoding,
    _decode_connack,
    _encode_connack,
    _encode_connect,
    connack_for_error,
)
from broker.mqtt.codec_control import _decode_reason_only, _encode_reason_only
from broker.mqtt.codec_primitives import (
    MAX_REMAINING_LENGTH,
    REASON_CODES_ALLOWED,
    _check_level,
    _malformed,
    _packet_id_zero,
    _protocol_error,
    encode_variable_byte_integer,
)
from broker.mqtt.codec_primitives import _decode_properties as _decode_properties
from broker.mqtt.codec_primitives import _encode_properties as _encode_properties
from broker.mqtt.codec_publish import (
    PublishDecoding,
    _decode_ack,
    _encode_ack,
    _encode_publish_packet,
    encode_publish,
)
from broker.mqtt.codec_subscribe import (
    _decode_suback,
    _decode_subscribe,
    _decode_unsuback,
    _decode_unsubscribe,
    _encode_suback,
    _encode_subscribe,
    _encode_unsuback,
    _encode_unsubscribe,
)
from broker.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MQTTProtocolError,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
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

_PT = PacketType
_PACKET_NAMES = {int(t): t.name for t in PacketType}

# Fixed-header flags (low nibble of byte 1) every non-PUBLISH packet must carry (§2.2.2 / §2.1.3).
_REQUIRED_FLAGS = {1: 0, 2: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 9: 0, 10: 2, 11: 0, 12: 0, 13: 0, 14: 0, 15: 0}
_FLAG_STATEMENT = {6: "MQTT-3.6.1-1", 8: "MQTT-3.8.1-1", 10: "MQTT-3.10.1-1"}

# Packet types each side may receive.
_SERVER_RECEIVES = frozenset({1, 3, 4, 5, 6, 7, 8, 10, 12, 14, 15})
_CLIENT_RECEIVES = frozenset({2, 3, 4, 5, 6, 7, 9, 11, 13, 14, 15})


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


class Decoder(PublishDecoding, ConnectDecoding):
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

    __slots__ = ()  # the state's slots: DecoderState (codec_primitives)

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
        # a partial packet's bytes: a bytearray once there is one (b"": 56 B less per idle connection)
        self._pending: bytearray | bytes = b""
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
            self._pending = b""
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
