"""Dataclass <-> protobuf conversion of the overlay messages (protos/skipmq/v1/cluster.proto,
``OverlayMessage``): every message of ``overlay/messages.py``, the REXP, EEXP, PUB, UNSUB, NEW
queries of seed 003 Table 1 and the Skip Graph maintenance messages. A PUB's payload is converted by
broker.adapters.transport.wire_cluster.

Overlay messages are mapped field by field *by name*: a dataclass field ``x`` is the proto field
``x`` of the message whose oneof case in ``OverlayMessage`` is the dataclass's ``kind`` in lower
case; the field's annotation ("Key", "NodeRef | None", "tuple[Key, ...]", "int", ...) picks the
converter. Adding an overlay kind therefore takes: the message and its oneof case in
``cluster.proto``, ``scripts/gen_protos.py``, and one entry in ``OVERLAY_KINDS`` below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from broker.adapters.transport._pb.skipmq.v1 import cluster_pb2 as pb
from broker.adapters.transport.wire_base import WireError, _require
from broker.adapters.transport.wire_cluster import payload_from_proto, payload_to_proto
from overlay import messages as om

# Every overlay message kind the wire knows: dataclass -> oneof case name in OverlayMessage.
OVERLAY_KINDS: dict[type, str] = {
    om.REXP: "rexp",
    om.EEXP: "eexp",
    om.PUB: "pub",
    om.UNSUB: "unsub",
    om.NEW: "new",
    om.SEARCH: "search",
    om.FOUND: "found",
    om.SEARCH_FAIL: "search_fail",
    om.LINK: "link",
    om.LEAVE: "leave",
    om.PRESENCE: "presence",
    om.PRESENCE_QUERY: "presence_query",
    om.PING: "ping",
    om.PONG: "pong",
    om.GONE: "gone",
    om.ACK: "ack",
    om.DONE: "done",
}


# ---------------------------------------------------------------------------- keys and refs


def _put_key(out: Any, key: Any, where: str) -> None:
    if type(key) is tuple and len(key) == 3:  # the common case, checked without isinstance chains
        topic, role, peer_id = key
        if type(topic) is str and type(role) is int and 0 <= role < 2**32 and type(peer_id) is str:
            out.SetInParent()
            out.topic = topic
            out.role = role
            out.peer_id = peer_id
            return
    if not isinstance(key, tuple) or len(key) > 3:
        raise WireError(
            f"{where}: a key must be a tuple (topic, role, peer_id) or a prefix of it, got {key!r}"
        )
    out.SetInParent()  # present even when empty: () is a valid (empty) range bound
    if len(key) >= 1:
        if not isinstance(key[0], str):
            raise WireError(f"{where}: key topic must be a str, got {key[0]!r}")
        out.topic = key[0]
    if len(key) >= 2:
        role = key[1]
        if isinstance(role, bool) or not isinstance(role, int) or not 0 <= role < 2**32:
            raise WireError(f"{where}: key role must be an int in 0..2**32-1, got {role!r}")
        out.role = role
    if len(key) == 3:
        if not isinstance(key[2], str):
            raise WireError(f"{where}: key peer_id must be a str (host:port), got {key[2]!r}")
        out.peer_id = key[2]


def _get_key(src: Any, where: str) -> tuple[Any, ...]:
    has = src.HasField
    if has("peer_id") and has("role") and has("topic"):  # (a node's key: the common case)
        return (src.topic, src.role, src.peer_id)
    has_topic, has_role, has_peer = has("topic"), has("role"), has("peer_id")
    if (has_peer and not has_role) or (has_role and not has_topic):
        raise WireError(f"{where}: key fields must form a prefix of (topic, role, peer_id)")
    if has_peer:
        return (src.topic, src.role, src.peer_id)
    if has_role:
        return (src.topic, src.role)
    if has_topic:
        return (src.topic,)
    return ()


def _put_ref(out: Any, ref: Any, where: str) -> None:
    if not isinstance(ref, tuple) or len(ref) != 2:
        raise WireError(f"{where}: a NodeRef must be a (key, membership_vector) pair, got {ref!r}")
    key, mv = ref
    if type(mv) is not int or not 0 <= mv < 2**64:
        raise WireError(f"{where}: membership vector must be an int in 0..2**64-1, got {mv!r}")
    _put_key(out.key, key, where + ".key")
    out.membership_vector = mv


def _get_ref(src: Any, where: str) -> tuple[Any, int]:
    if not src.HasField("key"):
        raise WireError(f"{where}: NodeRef without a key")
    return (_get_key(src.key, f"{where}.key"), src.membership_vector)


# ---------------------------------------------------------------------------- field converters
# (annotation string of the dataclass field) -> (put(pb_msg, name, value, where), get(pb_msg, name, where))

_Put = Callable[[Any, str, Any, str], None]
_Get = Callable[[Any, str, str], Any]


def _put_scalar(kind: type) -> _Put:
    def put(out: Any, name: str, value: Any, where: str) -> None:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise WireError(f"{where}: expected {kind.__name__}, got {value!r}")
        try:
            setattr(out, name, value)
        except (ValueError, TypeError) as exc:
            raise WireError(f"{where}: {value!r} does not fit the wire field ({exc})") from None

    return put


def _get_scalar(src: Any, name: str, where: str) -> Any:
    return getattr(src, name)


def _put_key_field(out: Any, name: str, value: Any, where: str) -> None:
    _put_key(getattr(out, name), value, where)


def _get_key_field(src: Any, name: str, where: str) -> Any:
    return _get_key(_require(src, name, where), where)


def _put_opt_key_field(out: Any, name: str, value: Any, where: str) -> None:
    if value is not None:
        _put_key(getattr(out, name), value, where)


def _get_opt_key_field(src: Any, name: str, where: str) -> Any:
    return _get_key(getattr(src, name), where) if src.HasField(name) else None


def _put_ref_field(out: Any, name: str, value: Any, where: str) -> None:
    _put_ref(getattr(out, name), value, where)


def _get_ref_field(src: Any, name: str, where: str) -> Any:
    return _get_ref(_require(src, name, where), where)


def _put_opt_ref_field(out: Any, name: str, value: Any, where: str) -> None:
    if value is not None:
        _put_ref(getattr(out, name), value, where)


def _get_opt_ref_field(src: Any, name: str, where: str) -> Any:
    return _get_ref(getattr(src, name), where) if src.HasField(name) else None


def _put_keys_field(out: Any, name: str, value: Any, where: str) -> None:
    if not isinstance(value, tuple):
        raise WireError(f"{where}: expected a tuple of keys, got {value!r}")
    repeated = getattr(out, name)
    for index, key in enumerate(value):
        _put_key(repeated.add(), key, f"{where}[{index}]")


def _get_keys_field(src: Any, name: str, where: str) -> Any:
    return tuple(_get_key(key, f"{where}[{index}]") for index, key in enumerate(getattr(src, name)))


def _put_peer_id_field(out: Any, name: str, value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise WireError(f"{where}: a peer id must be a str (host:port), got {value!r}")
    setattr(out, name, value)


def _put_payload_field(out: Any, name: str, value: Any, where: str) -> None:
    payload_to_proto(value, getattr(out, name), where)


def _get_payload_field(src: Any, name: str, where: str) -> Any:
    return payload_from_proto(_require(src, name, where), where)


def _put_bounced_field(out: Any, name: str, value: Any, where: str) -> None:
    if value is not None:
        overlay_to_proto(value, getattr(out, name), where)


def _get_bounced_field(src: Any, name: str, where: str) -> Any:
    return overlay_from_proto(getattr(src, name), where) if src.HasField(name) else None


_BY_ANNOTATION: dict[str, tuple[_Put, _Get]] = {
    "int": (_put_scalar(int), _get_scalar),
    "bool": (_put_scalar(bool), _get_scalar),
    "str": (_put_scalar(str), _get_scalar),
    "Key": (_put_key_field, _get_key_field),
    "Key | None": (_put_opt_key_field, _get_opt_key_field),
    "NodeRef": (_put_ref_field, _get_ref_field),
    "NodeRef | None": (_put_opt_ref_field, _get_opt_ref_field),
    "tuple[Key, ...]": (_put_keys_field, _get_keys_field),
}
# Fields typed Any in overlay/messages.py, by (kind, field name).
_BY_FIELD: dict[tuple[str, str], tuple[_Put, _Get]] = {
    ("pub", "payload"): (_put_payload_field, _get_payload_field),
    ("search", "origin"): (_put_peer_id_field, _get_scalar),
    ("gone", "bounced"): (_put_bounced_field, _get_bounced_field),
}


@dataclasses.dataclass(frozen=True, slots=True)
class _KindCodec:
    cls: type
    case: str
    fields: tuple[tuple[str, _Put, _Get], ...]
    wheres: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


def _build_codecs() -> dict[type, _KindCodec]:
    codecs: dict[type, _KindCodec] = {}
    oneof_cases = {field.name for field in pb.OverlayMessage.DESCRIPTOR.oneofs_by_name["kind"].fields}
    for cls, case in OVERLAY_KINDS.items():
        if case not in oneof_cases:
            raise RuntimeError(
                f"OverlayMessage has no oneof case {case!r} for {cls.__name__}: update the proto"
            )
        proto_fields = set(pb.OverlayMessage.DESCRIPTOR.fields_by_name[case].message_type.fields_by_name)
        entries: list[tuple[str, _Put, _Get]] = []
        for field in dataclasses.fields(cls):
            if field.name not in proto_fields:
                raise RuntimeError(f"{cls.__name__}.{field.name} has no field in the proto message {case!r}")
            pair = _BY_FIELD.get((case, field.name)) or _BY_ANNOTATION.get(str(field.type))
            if pair is None:
                raise RuntimeError(f"no wire converter for {cls.__name__}.{field.name}: {field.type}")
            entries.append((field.name, pair[0], pair[1]))
        codecs[cls] = _KindCodec(cls, case, tuple(entries))
    return codecs


_CODECS = _build_codecs()
_CODECS_BY_CASE = {codec_.case: codec_ for codec_ in _CODECS.values()}


def overlay_to_proto(message: Any, out: Any | None = None, where: str = "overlay") -> Any:
    """An ``overlay.messages`` dataclass as ``pb.OverlayMessage`` (written into ``out`` if given)."""
    kind_codec = _CODECS.get(type(message))
    if kind_codec is None:
        raise WireError(f"{where}: not an overlay message kind the wire knows: {type(message).__name__}")
    if out is None:
        out = pb.OverlayMessage()
    body = getattr(out, kind_codec.case)
    body.SetInParent()
    wheres = kind_codec.wheres.get(where)
    if wheres is None:  # the error-message paths of the fields, built once per ``where``
        wheres = kind_codec.wheres[where] = tuple(
            f"{where}.{kind_codec.cls.__name__}.{name}" for name, _put, _get in kind_codec.fields
        )
    for (name, put, _get), field_where in zip(kind_codec.fields, wheres, strict=True):
        put(body, name, getattr(message, name), field_where)
    return out


def overlay_from_proto(src: Any, where: str = "overlay") -> Any:
    case = src.WhichOneof("kind")
    if case is None:
        raise WireError(f"{where}: OverlayMessage without a kind (unknown to this schema version?)")
    if case == "pub":
        pub = src.pub
        has = pub.HasField
        if has("dest") and has("sender") and has("payload") and has("forwarder") and has("lo") and has("hi"):
            return _pub_from_proto(pub, where)  # (the hot kind, without the generic field loop)
    kind_codec = _CODECS_BY_CASE[case]
    body = getattr(src, case)
    wheres = kind_codec.wheres.get(where)
    if wheres is None:  # the error-message paths of the fields, built once per ``where``
        wheres = kind_codec.wheres[where] = tuple(
            f"{where}.{kind_codec.cls.__name__}.{name}" for name, _put, _get in kind_codec.fields
        )
    # (positional, in the dataclass's field order: the fields of a codec are built in that order)
    return kind_codec.cls(
        *[
            get(body, name, field_where)
            for (name, _put, get), field_where in zip(kind_codec.fields, wheres, strict=True)
        ]
    )


_PUB_WHERES: dict[str, tuple[str, ...]] = {}


def _pub_from_proto(body: Any, where: str) -> om.PUB:
    """A PUB whose message fields are all present: the same values as the generic path's."""
    wheres = _PUB_WHERES.get(where)
    if wheres is None:
        names = ("dest", "sender", "payload", "forwarder", "lo", "hi")
        wheres = _PUB_WHERES[where] = tuple(f"{where}.PUB.{name}" for name in names)
    return om.PUB(
        _get_key(body.dest, wheres[0]),
        _get_ref(body.sender, wheres[1]),
        body.topic,
        payload_from_proto(body.payload, wheres[2]),
        body.publication_id,
        _get_ref(body.forwarder, wheres[3]),
        body.hops,
        _get_key(body.lo, wheres[4]),
        _get_key(body.hi, wheres[5]),
        body.ack_id,
    )
