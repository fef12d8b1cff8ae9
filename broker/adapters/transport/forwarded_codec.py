"""Hand-written protobuf encoding of the common ``ForwardedMessage`` (issue #11).

A forwarded QoS 0 message is encoded once per batch on the publisher's broker; building a
``pb.ForwardedMessage`` and its ``pb.MqttMessage`` field by field costs ~4 us a message here,
which was the largest single item of the publisher's broker's cluster work at 3 brokers. This
module writes the same bytes directly for the shape nearly every message has - no MQTT property,
no expiry, no causal group - and returns None for anything else (``wire`` then takes the general
path, which also reports every invalid value). The output is byte for byte what
``SerializeToString`` of the generated classes gives (fields in number order, proto3 defaults
omitted; ``tests/unit/transport/test_forwarded_codec.py`` compares the two).

The schema (protos/skipmq/v1/cluster.proto)::

    message MqttMessage { string topic = 1; bytes payload = 2; uint32 qos = 3; bool retain = 4;
                          bytes properties = 5; optional double expiry_at = 6; string origin = 7;
                          optional string publisher_id = 8; }
    message ForwardedMessage { string origin = 1; string stream = 2; uint64 seq = 3;
                               MqttMessage message = 4; uint64 low = 5; ... deps = 6; copies = 7; }
"""

from __future__ import annotations

from broker.cluster.messages import ForwardedMessage
from broker.core.session import Message

_U64 = 1 << 64
_U32 = 1 << 32
# one-byte varints, the lengths and numbers nearly every field here has
_SMALL = tuple(bytes((value,)) for value in range(128))
# (topic, qos, retain, origin, publisher_id) -> the MqttMessage's bytes before and after its
# payload; (origin, stream) -> the ForwardedMessage's first two fields
_TEMPLATES: dict[tuple[object, ...], tuple[bytes, bytes]] = {}
_PREFIXES: dict[tuple[object, object], bytes] = {}
_CACHE_LIMIT = 4096

_TAG_TOPIC = 0x0A  # MqttMessage.topic: field 1, length-delimited
_TAG_PAYLOAD = b"\x12"  # MqttMessage.payload: field 2, length-delimited
_TAG_QOS = 0x18  # MqttMessage.qos: field 3, varint
_TAG_RETAIN_TRUE = b"\x20\x01"  # MqttMessage.retain = true: field 4, varint 1
_TAG_ORIGIN = 0x3A  # MqttMessage.origin: field 7, length-delimited
_TAG_PUBLISHER = 0x42  # MqttMessage.publisher_id: field 8, length-delimited
_TAG_F_ORIGIN = 0x0A  # ForwardedMessage.origin: field 1, length-delimited
_TAG_F_STREAM = 0x12  # ForwardedMessage.stream: field 2, length-delimited
_TAG_F_SEQ = b"\x18"  # ForwardedMessage.seq: field 3, varint
_TAG_F_MESSAGE = b"\x22"  # ForwardedMessage.message: field 4, length-delimited
_TAG_F_LOW = b"\x28"  # ForwardedMessage.low: field 5, varint


def varint(value: int) -> bytes:
    """The protobuf base-128 varint of ``value`` (0 <= value < 2**64)."""
    if value < 128:
        return _SMALL[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string_field(tag: int, text: object) -> bytes:
    if type(text) is not str:
        raise TypeError(f"expected str, got {type(text).__name__}")
    raw = text.encode("utf-8")  # UnicodeEncodeError (a lone surrogate): no fast encoding
    return bytes((tag,)) + varint(len(raw)) + raw if raw else b""


def _template(key: tuple[object, ...]) -> tuple[bytes, bytes] | None:
    """The ``MqttMessage`` bytes before and after the payload field for (topic, qos, retain,
    origin, publisher_id); None if a value has not the type or range the schema wants."""
    topic, qos, retain, origin, publisher_id = key
    if type(qos) is not int or not 0 <= qos < _U32 or type(retain) is not bool:
        return None
    try:
        head = _string_field(_TAG_TOPIC, topic)
        tail = bytes((_TAG_QOS,)) + varint(qos) if qos else b""
        if retain:
            tail += _TAG_RETAIN_TRUE
        tail += _string_field(_TAG_ORIGIN, origin)
        if publisher_id is not None:  # (optional: present even when empty)
            raw = _string_field(_TAG_PUBLISHER, publisher_id)
            tail += raw or bytes((_TAG_PUBLISHER, 0))
    except (TypeError, UnicodeEncodeError):
        return None
    return head, tail


def _prefix(key: tuple[object, object]) -> bytes | None:
    """The ``ForwardedMessage`` origin and stream fields; None for a value that is not a str."""
    try:
        return _string_field(_TAG_F_ORIGIN, key[0]) + _string_field(_TAG_F_STREAM, key[1])
    except (TypeError, UnicodeEncodeError):
        return None


def encode_forwarded_fast(forwarded: ForwardedMessage) -> bytes | None:
    """The serialized ``pb.ForwardedMessage`` of ``forwarded``, or None when it is not of the
    common shape (a property, an expiry, a causal group, an unexpected type or value).

    The fields that repeat from message to message (origin and class; the message's topic, QoS,
    retain flag, origin and publisher) are encoded once and kept (``_TEMPLATES``, ``_PREFIXES``):
    per message only the numbers and the payload are written."""
    message = forwarded.message
    if (
        forwarded.copies
        or forwarded.deps
        or type(message) is not Message
        or message.properties
        or message.expiry_at is not None
    ):
        return None
    payload = message.payload
    if type(payload) is not bytes:
        if not isinstance(payload, bytearray | memoryview):
            return None
        payload = bytes(payload)
    seq, low = forwarded.seq, forwarded.low
    if type(seq) is not int or type(low) is not int or not 0 <= seq < _U64 or not 0 <= low < _U64:
        return None
    key = (message.topic, message.qos, message.retain, message.origin, message.publisher_id)
    template = _TEMPLATES.get(key)
    if template is None or type(message.qos) is not int:
        template = _template(key)
        if template is None:
            return None
        if len(_TEMPLATES) >= _CACHE_LIMIT:
            _TEMPLATES.clear()
        _TEMPLATES[key] = template
    stream_key = (forwarded.origin, forwarded.stream)
    prefix = _PREFIXES.get(stream_key)
    if prefix is None:
        prefix = _prefix(stream_key)
        if prefix is None:
            return None
        if len(_PREFIXES) >= _CACHE_LIMIT:
            _PREFIXES.clear()
        _PREFIXES[stream_key] = prefix
    head, tail = template
    size = len(payload)
    if size:
        size_bytes = _SMALL[size] if size < 128 else varint(size)
        body_size = len(head) + 1 + len(size_bytes) + size + len(tail)
    else:  # (proto3: an empty payload is not written)
        size_bytes = payload = b""
        body_size = len(head) + len(tail)
    return b"".join(
        (
            prefix,
            _TAG_F_SEQ + varint(seq) if seq else b"",
            _TAG_F_MESSAGE,
            _SMALL[body_size] if body_size < 128 else varint(body_size),
            head,
            _TAG_PAYLOAD if size else b"",
            size_bytes,
            payload,
            tail,
            _TAG_F_LOW + varint(low) if low else b"",
        )
    )
