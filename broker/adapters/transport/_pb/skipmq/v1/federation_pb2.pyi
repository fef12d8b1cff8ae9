# ruff: noqa
# fmt: off
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FedLinkRequest(_message.Message):
    __slots__ = ("place", "requester", "one_way", "schema_version", "site", "challenge")
    PLACE_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    ONE_WAY_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    place: str
    requester: str
    one_way: bool
    schema_version: int
    site: str
    challenge: bytes
    def __init__(self, place: _Optional[str] = ..., requester: _Optional[str] = ..., one_way: _Optional[bool] = ..., schema_version: _Optional[int] = ..., site: _Optional[str] = ..., challenge: _Optional[bytes] = ...) -> None: ...

class FedIdentityProof(_message.Message):
    __slots__ = ("signature", "certificate")
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    signature: bytes
    certificate: bytes
    def __init__(self, signature: _Optional[bytes] = ..., certificate: _Optional[bytes] = ...) -> None: ...

class FedLinkAccepted(_message.Message):
    __slots__ = ("place", "mode", "description", "topology", "site", "identity_proof")
    PLACE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_PROOF_FIELD_NUMBER: _ClassVar[int]
    place: str
    mode: str
    description: str
    topology: _containers.RepeatedScalarFieldContainer[str]
    site: str
    identity_proof: FedIdentityProof
    def __init__(self, place: _Optional[str] = ..., mode: _Optional[str] = ..., description: _Optional[str] = ..., topology: _Optional[_Iterable[str]] = ..., site: _Optional[str] = ..., identity_proof: _Optional[_Union[FedIdentityProof, _Mapping]] = ...) -> None: ...

class FedLinkRefused(_message.Message):
    __slots__ = ("place", "reason")
    PLACE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    place: str
    reason: str
    def __init__(self, place: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class FedTopologyUpdate(_message.Message):
    __slots__ = ("topology",)
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    topology: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topology: _Optional[_Iterable[str]] = ...) -> None: ...

class FedLeave(_message.Message):
    __slots__ = ("replacement",)
    REPLACEMENT_FIELD_NUMBER: _ClassVar[int]
    replacement: str
    def __init__(self, replacement: _Optional[str] = ...) -> None: ...

class FedRegister(_message.Message):
    __slots__ = ("key", "ttl", "own_site")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    OWN_SITE_FIELD_NUMBER: _ClassVar[int]
    key: str
    ttl: int
    own_site: bool
    def __init__(self, key: _Optional[str] = ..., ttl: _Optional[int] = ..., own_site: _Optional[bool] = ...) -> None: ...

class FedUnregister(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class FedEvent(_message.Message):
    __slots__ = ("topic", "payload", "qos", "retain", "site", "event_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    RETAIN_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    payload: bytes
    qos: int
    retain: bool
    site: str
    event_id: str
    def __init__(self, topic: _Optional[str] = ..., payload: _Optional[bytes] = ..., qos: _Optional[int] = ..., retain: _Optional[bool] = ..., site: _Optional[str] = ..., event_id: _Optional[str] = ...) -> None: ...

class FedEventAck(_message.Message):
    __slots__ = ("event_id",)
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    def __init__(self, event_id: _Optional[str] = ...) -> None: ...

class FedRetained(_message.Message):
    __slots__ = ("topic", "payload", "qos", "version_ms", "origin")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    VERSION_MS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    payload: bytes
    qos: int
    version_ms: int
    origin: str
    def __init__(self, topic: _Optional[str] = ..., payload: _Optional[bytes] = ..., qos: _Optional[int] = ..., version_ms: _Optional[int] = ..., origin: _Optional[str] = ...) -> None: ...

class FedProbe(_message.Message):
    __slots__ = ("round", "hops_left", "attribute", "trail")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    HOPS_LEFT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    TRAIL_FIELD_NUMBER: _ClassVar[int]
    round: int
    hops_left: int
    attribute: str
    trail: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, round: _Optional[int] = ..., hops_left: _Optional[int] = ..., attribute: _Optional[str] = ..., trail: _Optional[_Iterable[str]] = ...) -> None: ...

class FedProbeReply(_message.Message):
    __slots__ = ("round", "attribute", "responder", "hop", "route")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    RESPONDER_FIELD_NUMBER: _ClassVar[int]
    HOP_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    round: int
    attribute: str
    responder: str
    hop: int
    route: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, round: _Optional[int] = ..., attribute: _Optional[str] = ..., responder: _Optional[str] = ..., hop: _Optional[int] = ..., route: _Optional[_Iterable[str]] = ...) -> None: ...

class FedMessage(_message.Message):
    __slots__ = ("link_request", "link_accepted", "link_refused", "topology_update", "leave", "register", "unregister", "event", "probe", "probe_reply", "event_ack", "retained")
    LINK_REQUEST_FIELD_NUMBER: _ClassVar[int]
    LINK_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    LINK_REFUSED_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_UPDATE_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    UNREGISTER_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    PROBE_FIELD_NUMBER: _ClassVar[int]
    PROBE_REPLY_FIELD_NUMBER: _ClassVar[int]
    EVENT_ACK_FIELD_NUMBER: _ClassVar[int]
    RETAINED_FIELD_NUMBER: _ClassVar[int]
    link_request: FedLinkRequest
    link_accepted: FedLinkAccepted
    link_refused: FedLinkRefused
    topology_update: FedTopologyUpdate
    leave: FedLeave
    register: FedRegister
    unregister: FedUnregister
    event: FedEvent
    probe: FedProbe
    probe_reply: FedProbeReply
    event_ack: FedEventAck
    retained: FedRetained
    def __init__(self, link_request: _Optional[_Union[FedLinkRequest, _Mapping]] = ..., link_accepted: _Optional[_Union[FedLinkAccepted, _Mapping]] = ..., link_refused: _Optional[_Union[FedLinkRefused, _Mapping]] = ..., topology_update: _Optional[_Union[FedTopologyUpdate, _Mapping]] = ..., leave: _Optional[_Union[FedLeave, _Mapping]] = ..., register: _Optional[_Union[FedRegister, _Mapping]] = ..., unregister: _Optional[_Union[FedUnregister, _Mapping]] = ..., event: _Optional[_Union[FedEvent, _Mapping]] = ..., probe: _Optional[_Union[FedProbe, _Mapping]] = ..., probe_reply: _Optional[_Union[FedProbeReply, _Mapping]] = ..., event_ack: _Optional[_Union[FedEventAck, _Mapping]] = ..., retained: _Optional[_Union[FedRetained, _Mapping]] = ...) -> None: ...

class FedFrame(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[FedMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[FedMessage, _Mapping]]] = ...) -> None: ...
