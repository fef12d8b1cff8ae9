"""MQTT control packets as plain data (MQTT 3.1.1 and 5.0).

This module is the contract between the sans-I/O codec (``codec.py``) and the broker core:
the codec turns bytes into these objects and back; the core never sees bytes.

Properties (MQTT 5 §2.2.2) are a ``dict[str, Any]`` keyed by the names in ``PROPERTIES``.
``user_property`` is a ``list[tuple[str, str]]``; ``subscription_identifier`` is a
``list[int]`` in PUBLISH and a single ``int`` in SUBSCRIBE. For MQTT 3.1.1 packets the
dict is always empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


# Protocol levels (the CONNECT "protocol level" byte).
MQTT_3_1 = 3  # protocol name "MQIsdp"
MQTT_3_1_1 = 4
MQTT_5 = 5


class PropType(IntEnum):
    BYTE = 1
    TWO_BYTE_INT = 2
    FOUR_BYTE_INT = 3
    VARINT = 4
    UTF8 = 5
    BINARY = 6
    UTF8_PAIR = 7


# Will properties travel in CONNECT's payload; "WILL" marks where they are allowed.
WILL = "WILL"

# id -> (name, type, packet types (or WILL) where the property may appear)  (MQTT 5 §2.2.2.2)
_P = PacketType
PROPERTIES: dict[int, tuple[str, PropType, frozenset[Any]]] = {
    0x01: ("payload_format_indicator", PropType.BYTE, frozenset({_P.PUBLISH, WILL})),
    0x02: ("message_expiry_interval", PropType.FOUR_BYTE_INT, frozenset({_P.PUBLISH, WILL})),
    0x03: ("content_type", PropType.UTF8, frozenset({_P.PUBLISH, WILL})),
    0x08: ("response_topic", PropType.UTF8, frozenset({_P.PUBLISH, WILL})),
    0x09: ("correlation_data", PropType.BINARY, frozenset({_P.PUBLISH, WILL})),
    0x0B: ("subscription_identifier", PropType.VARINT, frozenset({_P.PUBLISH, _P.SUBSCRIBE})),
    0x11: (
        "session_expiry_interval",
        PropType.FOUR_BYTE_INT,
        frozenset({_P.CONNECT, _P.CONNACK, _P.DISCONNECT}),
    ),
    0x12: ("assigned_client_identifier", PropType.UTF8, frozenset({_P.CONNACK})),
    0x13: ("server_keep_alive", PropType.TWO_BYTE_INT, frozenset({_P.CONNACK})),
    0x15: ("authentication_method", PropType.UTF8, frozenset({_P.CONNECT, _P.CONNACK, _P.AUTH})),
    0x16: ("authentication_data", PropType.BINARY, frozenset({_P.CONNECT, _P.CONNACK, _P.AUTH})),
    0x17: ("request_problem_information", PropType.BYTE, frozenset({_P.CONNECT})),
    0x18: ("will_delay_interval", PropType.FOUR_BYTE_INT, frozenset({WILL})),
    0x19: ("request_response_information", PropType.BYTE, frozenset({_P.CONNECT})),
    0x1A: ("response_information", PropType.UTF8, frozenset({_P.CONNACK})),
    0x1C: ("server_reference", PropType.UTF8, frozenset({_P.CONNACK, _P.DISCONNECT})),
    0x1F: (
        "reason_string",
        PropType.UTF8,
        frozenset(
            {
                _P.CONNACK,
                _P.PUBACK,
                _P.PUBREC,
                _P.PUBREL,
                _P.PUBCOMP,
                _P.SUBACK,
                _P.UNSUBACK,
                _P.DISCONNECT,
                _P.AUTH,
            }
        ),
    ),
    0x21: ("receive_maximum", PropType.TWO_BYTE_INT, frozenset({_P.CONNECT, _P.CONNACK})),
    0x22: ("topic_alias_maximum", PropType.TWO_BYTE_INT, frozenset({_P.CONNECT, _P.CONNACK})),
    0x23: ("topic_alias", PropType.TWO_BYTE_INT, frozenset({_P.PUBLISH})),
    0x24: ("maximum_qos", PropType.BYTE, frozenset({_P.CONNACK})),
    0x25: ("retain_available", PropType.BYTE, frozenset({_P.CONNACK})),
    0x26: ("user_property", PropType.UTF8_PAIR, frozenset(set(_P) | {WILL})),
    0x27: ("maximum_packet_size", PropType.FOUR_BYTE_INT, frozenset({_P.CONNECT, _P.CONNACK})),
    0x28: ("wildcard_subscription_available", PropType.BYTE, frozenset({_P.CONNACK})),
    0x29: ("subscription_identifier_available", PropType.BYTE, frozenset({_P.CONNACK})),
    0x2A: ("shared_subscription_available", PropType.BYTE, frozenset({_P.CONNACK})),
}
PROPERTY_IDS: dict[str, int] = {name: pid for pid, (name, _t, _w) in PROPERTIES.items()}

Properties = dict[str, Any]


class ReasonCode(IntEnum):
    """MQTT 5 reason codes (§2.4). 3.1.1 CONNACK return codes are mapped by the codec."""

    SUCCESS = 0x00  # also NORMAL_DISCONNECTION, GRANTED_QOS_0
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class MQTTProtocolError(Exception):
    """A packet violated the protocol. The connection must be closed.

    ``reason_code`` is the MQTT 5 reason code for the DISCONNECT (or CONNACK when raised while
    reading CONNECT); ``statement`` names the normative statement, e.g. "MQTT-3.1.2-3".
    """

    def __init__(self, message: str, reason_code: int = ReasonCode.MALFORMED_PACKET, statement: str = ""):
        super().__init__(message)
        self.reason_code = int(reason_code)
        self.statement = statement
        # Set by the codec's Decoder (additions; the core may ignore them):
        # True when the error happened while reading the CONNECT packet (see codec.connack_for_error).
        self.during_connect: bool = False
        # The protocol level known when the error happened (None before a CONNECT named one).
        self.protocol_level: int | None = None
        # Packets fully decoded by the same ``feed`` call before the bad one, in order. The caller
        # may still act on them (e.g. deliver a PUBLISH that preceded garbage) before closing.
        self.packets_before_error: list[Any] = []


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connect:
    client_id: str
    protocol_level: int = MQTT_3_1_1
    protocol_name: str = "MQTT"
    clean_start: bool = True
    keep_alive_s: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Connack:
    session_present: bool = False
    reason_code: int = 0  # MQTT 5 reason code; the codec maps to/from 3.1.1 return codes
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Puback:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pubrec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pubrel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pubcomp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE with its options (MQTT 5 §3.8.3.1)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0  # 0 send, 1 send if new subscription, 2 do not send


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Suback:
    packet_id: int
    reason_codes: list[int]  # granted QoS 0/1/2 or a failure code (3.1.1: 0x80)
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Unsuback:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)  # empty for 3.1.1
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Pingreq:
    pass


@dataclass(slots=True)
class Pingresp:
    pass


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


@dataclass(slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = field(default_factory=dict)


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)
