# ruff: noqa
# fmt: off
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Key(_message.Message):
    __slots__ = ("topic", "role", "peer_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    role: int
    peer_id: str
    def __init__(self, topic: _Optional[str] = ..., role: _Optional[int] = ..., peer_id: _Optional[str] = ...) -> None: ...

class NodeRef(_message.Message):
    __slots__ = ("key", "membership_vector")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIP_VECTOR_FIELD_NUMBER: _ClassVar[int]
    key: Key
    membership_vector: int
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ..., membership_vector: _Optional[int] = ...) -> None: ...

class Rexp(_message.Message):
    __slots__ = ("dest", "sender", "forwarder", "existing", "level")
    DEST_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    FORWARDER_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    existing: _containers.RepeatedCompositeFieldContainer[Key]
    level: int
    def __init__(self, dest: _Optional[_Union[Key, _Mapping]] = ..., sender: _Optional[_Union[NodeRef, _Mapping]] = ..., forwarder: _Optional[_Union[NodeRef, _Mapping]] = ..., existing: _Optional[_Iterable[_Union[Key, _Mapping]]] = ..., level: _Optional[int] = ...) -> None: ...

class Eexp(_message.Message):
    __slots__ = ("dest", "sender", "forwarder", "existing", "missing", "lo", "hi", "random_walk")
    DEST_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    FORWARDER_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    RANDOM_WALK_FIELD_NUMBER: _ClassVar[int]
    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    existing: _containers.RepeatedCompositeFieldContainer[Key]
    missing: int
    lo: Key
    hi: Key
    random_walk: bool
    def __init__(self, dest: _Optional[_Union[Key, _Mapping]] = ..., sender: _Optional[_Union[NodeRef, _Mapping]] = ..., forwarder: _Optional[_Union[NodeRef, _Mapping]] = ..., existing: _Optional[_Iterable[_Union[Key, _Mapping]]] = ..., missing: _Optional[int] = ..., lo: _Optional[_Union[Key, _Mapping]] = ..., hi: _Optional[_Union[Key, _Mapping]] = ..., random_walk: _Optional[bool] = ...) -> None: ...

class Pub(_message.Message):
    __slots__ = ("dest", "sender", "topic", "payload", "publication_id", "forwarder", "hops", "lo", "hi", "ack_id")
    DEST_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PUBLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    FORWARDER_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    ACK_ID_FIELD_NUMBER: _ClassVar[int]
    dest: Key
    sender: NodeRef
    topic: str
    payload: OverlayPayload
    publication_id: int
    forwarder: NodeRef
    hops: int
    lo: Key
    hi: Key
    ack_id: int
    def __init__(self, dest: _Optional[_Union[Key, _Mapping]] = ..., sender: _Optional[_Union[NodeRef, _Mapping]] = ..., topic: _Optional[str] = ..., payload: _Optional[_Union[OverlayPayload, _Mapping]] = ..., publication_id: _Optional[int] = ..., forwarder: _Optional[_Union[NodeRef, _Mapping]] = ..., hops: _Optional[int] = ..., lo: _Optional[_Union[Key, _Mapping]] = ..., hi: _Optional[_Union[Key, _Mapping]] = ..., ack_id: _Optional[int] = ...) -> None: ...

class Unsub(_message.Message):
    __slots__ = ("dest", "sender", "forwarder", "topic", "lo", "hi", "ack_id")
    DEST_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    FORWARDER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    ACK_ID_FIELD_NUMBER: _ClassVar[int]
    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    topic: str
    lo: Key
    hi: Key
    ack_id: int
    def __init__(self, dest: _Optional[_Union[Key, _Mapping]] = ..., sender: _Optional[_Union[NodeRef, _Mapping]] = ..., forwarder: _Optional[_Union[NodeRef, _Mapping]] = ..., topic: _Optional[str] = ..., lo: _Optional[_Union[Key, _Mapping]] = ..., hi: _Optional[_Union[Key, _Mapping]] = ..., ack_id: _Optional[int] = ...) -> None: ...

class New(_message.Message):
    __slots__ = ("dest", "sender")
    DEST_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    dest: Key
    sender: NodeRef
    def __init__(self, dest: _Optional[_Union[Key, _Mapping]] = ..., sender: _Optional[_Union[NodeRef, _Mapping]] = ...) -> None: ...

class Search(_message.Message):
    __slots__ = ("dest", "origin", "target", "request_id", "forwarder", "contact_hops")
    DEST_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FORWARDER_FIELD_NUMBER: _ClassVar[int]
    CONTACT_HOPS_FIELD_NUMBER: _ClassVar[int]
    dest: Key
    origin: str
    target: Key
    request_id: int
    forwarder: NodeRef
    contact_hops: int
    def __init__(self, dest: _Optional[_Union[Key, _Mapping]] = ..., origin: _Optional[str] = ..., target: _Optional[_Union[Key, _Mapping]] = ..., request_id: _Optional[int] = ..., forwarder: _Optional[_Union[NodeRef, _Mapping]] = ..., contact_hops: _Optional[int] = ...) -> None: ...

class Found(_message.Message):
    __slots__ = ("request_id", "target", "pred", "succ", "peers")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PRED_FIELD_NUMBER: _ClassVar[int]
    SUCC_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    target: Key
    pred: NodeRef
    succ: NodeRef
    peers: int
    def __init__(self, request_id: _Optional[int] = ..., target: _Optional[_Union[Key, _Mapping]] = ..., pred: _Optional[_Union[NodeRef, _Mapping]] = ..., succ: _Optional[_Union[NodeRef, _Mapping]] = ..., peers: _Optional[int] = ...) -> None: ...

class SearchFail(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class Link(_message.Message):
    __slots__ = ("dest", "sender", "reply")
    DEST_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    dest: Key
    sender: NodeRef
    reply: bool
    def __init__(self, dest: _Optional[_Union[Key, _Mapping]] = ..., sender: _Optional[_Union[NodeRef, _Mapping]] = ..., reply: _Optional[bool] = ...) -> None: ...

class Leave(_message.Message):
    __slots__ = ("dest", "sender", "replacement")
    DEST_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENT_FIELD_NUMBER: _ClassVar[int]
    dest: Key
    sender: NodeRef
    replacement: NodeRef
    def __init__(self, dest: _Optional[_Union[Key, _Mapping]] = ..., sender: _Optional[_Union[NodeRef, _Mapping]] = ..., replacement: _Optional[_Union[NodeRef, _Mapping]] = ...) -> None: ...

class Presence(_message.Message):
    __slots__ = ("dest", "sender", "forwarder", "topic", "present", "lo", "hi")
    DEST_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    FORWARDER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    topic: str
    present: bool
    lo: Key
    hi: Key
    def __init__(self, dest: _Optional[_Union[Key, _Mapping]] = ..., sender: _Optional[_Union[NodeRef, _Mapping]] = ..., forwarder: _Optional[_Union[NodeRef, _Mapping]] = ..., topic: _Optional[str] = ..., present: _Optional[bool] = ..., lo: _Optional[_Union[Key, _Mapping]] = ..., hi: _Optional[_Union[Key, _Mapping]] = ...) -> None: ...

class PresenceQuery(_message.Message):
    __slots__ = ("dest", "sender", "topic")
    DEST_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    dest: Key
    sender: NodeRef
    topic: str
    def __init__(self, dest: _Optional[_Union[Key, _Mapping]] = ..., sender: _Optional[_Union[NodeRef, _Mapping]] = ..., topic: _Optional[str] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    def __init__(self, nonce: _Optional[int] = ...) -> None: ...

class Pong(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: int
    def __init__(self, nonce: _Optional[int] = ...) -> None: ...

class Gone(_message.Message):
    __slots__ = ("gone", "bounced")
    GONE_FIELD_NUMBER: _ClassVar[int]
    BOUNCED_FIELD_NUMBER: _ClassVar[int]
    gone: Key
    bounced: OverlayMessage
    def __init__(self, gone: _Optional[_Union[Key, _Mapping]] = ..., bounced: _Optional[_Union[OverlayMessage, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("ack_id",)
    ACK_ID_FIELD_NUMBER: _ClassVar[int]
    ack_id: int
    def __init__(self, ack_id: _Optional[int] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ("ack_id",)
    ACK_ID_FIELD_NUMBER: _ClassVar[int]
    ack_id: int
    def __init__(self, ack_id: _Optional[int] = ...) -> None: ...

class OverlayMessage(_message.Message):
    __slots__ = ("rexp", "eexp", "pub", "unsub", "new", "search", "found", "search_fail", "link", "leave", "presence", "presence_query", "ping", "pong", "gone", "ack", "done")
    REXP_FIELD_NUMBER: _ClassVar[int]
    EEXP_FIELD_NUMBER: _ClassVar[int]
    PUB_FIELD_NUMBER: _ClassVar[int]
    UNSUB_FIELD_NUMBER: _ClassVar[int]
    NEW_FIELD_NUMBER: _ClassVar[int]
    SEARCH_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    SEARCH_FAIL_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_QUERY_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    GONE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    rexp: Rexp
    eexp: Eexp
    pub: Pub
    unsub: Unsub
    new: New
    search: Search
    found: Found
    search_fail: SearchFail
    link: Link
    leave: Leave
    presence: Presence
    presence_query: PresenceQuery
    ping: Ping
    pong: Pong
    gone: Gone
    ack: Ack
    done: Done
    def __init__(self, rexp: _Optional[_Union[Rexp, _Mapping]] = ..., eexp: _Optional[_Union[Eexp, _Mapping]] = ..., pub: _Optional[_Union[Pub, _Mapping]] = ..., unsub: _Optional[_Union[Unsub, _Mapping]] = ..., new: _Optional[_Union[New, _Mapping]] = ..., search: _Optional[_Union[Search, _Mapping]] = ..., found: _Optional[_Union[Found, _Mapping]] = ..., search_fail: _Optional[_Union[SearchFail, _Mapping]] = ..., link: _Optional[_Union[Link, _Mapping]] = ..., leave: _Optional[_Union[Leave, _Mapping]] = ..., presence: _Optional[_Union[Presence, _Mapping]] = ..., presence_query: _Optional[_Union[PresenceQuery, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ..., pong: _Optional[_Union[Pong, _Mapping]] = ..., gone: _Optional[_Union[Gone, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ...) -> None: ...

class MqttMessage(_message.Message):
    __slots__ = ("topic", "payload", "qos", "retain", "properties", "expiry_at", "origin", "publisher_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    RETAIN_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_AT_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: bytes
    expiry_at: float
    origin: str
    publisher_id: str
    def __init__(self, topic: _Optional[str] = ..., payload: _Optional[bytes] = ..., qos: _Optional[int] = ..., retain: _Optional[bool] = ..., properties: _Optional[bytes] = ..., expiry_at: _Optional[float] = ..., origin: _Optional[str] = ..., publisher_id: _Optional[str] = ...) -> None: ...

class ForwardedMessage(_message.Message):
    __slots__ = ("origin", "stream", "seq", "message", "low", "deps", "copies")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    DEPS_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    origin: str
    stream: str
    seq: int
    message: MqttMessage
    low: int
    deps: _containers.RepeatedCompositeFieldContainer[StreamPosition]
    copies: _containers.RepeatedCompositeFieldContainer[StreamCopy]
    def __init__(self, origin: _Optional[str] = ..., stream: _Optional[str] = ..., seq: _Optional[int] = ..., message: _Optional[_Union[MqttMessage, _Mapping]] = ..., low: _Optional[int] = ..., deps: _Optional[_Iterable[_Union[StreamPosition, _Mapping]]] = ..., copies: _Optional[_Iterable[_Union[StreamCopy, _Mapping]]] = ...) -> None: ...

class ForwardedBatch(_message.Message):
    __slots__ = ("messages", "proof")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ForwardedMessage]
    proof: OriginProof
    def __init__(self, messages: _Optional[_Iterable[_Union[ForwardedMessage, _Mapping]]] = ..., proof: _Optional[_Union[OriginProof, _Mapping]] = ...) -> None: ...

class OriginProof(_message.Message):
    __slots__ = ("signature", "certificate")
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    signature: bytes
    certificate: bytes
    def __init__(self, signature: _Optional[bytes] = ..., certificate: _Optional[bytes] = ...) -> None: ...

class StreamCopy(_message.Message):
    __slots__ = ("stream", "seq")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    stream: str
    seq: int
    def __init__(self, stream: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class RetainedUpdate(_message.Message):
    __slots__ = ("origin", "version_ms", "message", "proof")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    VERSION_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    origin: str
    version_ms: int
    message: MqttMessage
    proof: OriginProof
    def __init__(self, origin: _Optional[str] = ..., version_ms: _Optional[int] = ..., message: _Optional[_Union[MqttMessage, _Mapping]] = ..., proof: _Optional[_Union[OriginProof, _Mapping]] = ...) -> None: ...

class SessionClaim(_message.Message):
    __slots__ = ("origin", "client_id", "claim_id", "clean_start", "username", "recover", "proof")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    CLEAN_START_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    RECOVER_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    origin: str
    client_id: str
    claim_id: int
    clean_start: bool
    username: str
    recover: bool
    proof: OriginProof
    def __init__(self, origin: _Optional[str] = ..., client_id: _Optional[str] = ..., claim_id: _Optional[int] = ..., clean_start: _Optional[bool] = ..., username: _Optional[str] = ..., recover: _Optional[bool] = ..., proof: _Optional[_Union[OriginProof, _Mapping]] = ...) -> None: ...

class OverlayPayload(_message.Message):
    __slots__ = ("forwarded", "retained", "session_claim", "forwarded_batch")
    FORWARDED_FIELD_NUMBER: _ClassVar[int]
    RETAINED_FIELD_NUMBER: _ClassVar[int]
    SESSION_CLAIM_FIELD_NUMBER: _ClassVar[int]
    FORWARDED_BATCH_FIELD_NUMBER: _ClassVar[int]
    forwarded: ForwardedMessage
    retained: RetainedUpdate
    session_claim: SessionClaim
    forwarded_batch: ForwardedBatch
    def __init__(self, forwarded: _Optional[_Union[ForwardedMessage, _Mapping]] = ..., retained: _Optional[_Union[RetainedUpdate, _Mapping]] = ..., session_claim: _Optional[_Union[SessionClaim, _Mapping]] = ..., forwarded_batch: _Optional[_Union[ForwardedBatch, _Mapping]] = ...) -> None: ...

class SubOptions(_message.Message):
    __slots__ = ("topic_filter", "qos", "no_local", "retain_as_published", "retain_handling", "subscription_identifier", "share_group", "match_filter")
    TOPIC_FILTER_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    NO_LOCAL_FIELD_NUMBER: _ClassVar[int]
    RETAIN_AS_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    RETAIN_HANDLING_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_IDENTIFIER_FIELD_NUMBER: _ClassVar[int]
    SHARE_GROUP_FIELD_NUMBER: _ClassVar[int]
    MATCH_FILTER_FIELD_NUMBER: _ClassVar[int]
    topic_filter: str
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int
    subscription_identifier: int
    share_group: str
    match_filter: str
    def __init__(self, topic_filter: _Optional[str] = ..., qos: _Optional[int] = ..., no_local: _Optional[bool] = ..., retain_as_published: _Optional[bool] = ..., retain_handling: _Optional[int] = ..., subscription_identifier: _Optional[int] = ..., share_group: _Optional[str] = ..., match_filter: _Optional[str] = ...) -> None: ...

class ShareKey(_message.Message):
    __slots__ = ("group", "filter")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    group: str
    filter: str
    def __init__(self, group: _Optional[str] = ..., filter: _Optional[str] = ...) -> None: ...

class OutEntry(_message.Message):
    __slots__ = ("message", "qos", "retain", "subscription_identifiers", "seq", "packet_id", "state", "share_key")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    RETAIN_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_IDENTIFIERS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PACKET_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SHARE_KEY_FIELD_NUMBER: _ClassVar[int]
    message: MqttMessage
    qos: int
    retain: bool
    subscription_identifiers: _containers.RepeatedScalarFieldContainer[int]
    seq: int
    packet_id: int
    state: int
    share_key: ShareKey
    def __init__(self, message: _Optional[_Union[MqttMessage, _Mapping]] = ..., qos: _Optional[int] = ..., retain: _Optional[bool] = ..., subscription_identifiers: _Optional[_Iterable[int]] = ..., seq: _Optional[int] = ..., packet_id: _Optional[int] = ..., state: _Optional[int] = ..., share_key: _Optional[_Union[ShareKey, _Mapping]] = ...) -> None: ...

class SessionSnapshot(_message.Message):
    __slots__ = ("client_id", "protocol_level", "expiry_interval_s", "username", "subscriptions", "pending", "incoming_qos2", "next_packet_id", "will", "will_delay_interval_s", "will_fire_at", "disconnected_at")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_LEVEL_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    INCOMING_QOS2_FIELD_NUMBER: _ClassVar[int]
    NEXT_PACKET_ID_FIELD_NUMBER: _ClassVar[int]
    WILL_FIELD_NUMBER: _ClassVar[int]
    WILL_DELAY_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    WILL_FIRE_AT_FIELD_NUMBER: _ClassVar[int]
    DISCONNECTED_AT_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    protocol_level: int
    expiry_interval_s: int
    username: str
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubOptions]
    pending: _containers.RepeatedCompositeFieldContainer[OutEntry]
    incoming_qos2: _containers.RepeatedScalarFieldContainer[int]
    next_packet_id: int
    will: MqttMessage
    will_delay_interval_s: int
    will_fire_at: float
    disconnected_at: float
    def __init__(self, client_id: _Optional[str] = ..., protocol_level: _Optional[int] = ..., expiry_interval_s: _Optional[int] = ..., username: _Optional[str] = ..., subscriptions: _Optional[_Iterable[_Union[SubOptions, _Mapping]]] = ..., pending: _Optional[_Iterable[_Union[OutEntry, _Mapping]]] = ..., incoming_qos2: _Optional[_Iterable[int]] = ..., next_packet_id: _Optional[int] = ..., will: _Optional[_Union[MqttMessage, _Mapping]] = ..., will_delay_interval_s: _Optional[int] = ..., will_fire_at: _Optional[float] = ..., disconnected_at: _Optional[float] = ...) -> None: ...

class ClaimReply(_message.Message):
    __slots__ = ("claim_id", "client_id", "had_client", "snapshot", "positions", "refused")
    CLAIM_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    HAD_CLIENT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    claim_id: int
    client_id: str
    had_client: bool
    snapshot: SessionSnapshot
    positions: _containers.RepeatedCompositeFieldContainer[StreamPosition]
    refused: bool
    def __init__(self, claim_id: _Optional[int] = ..., client_id: _Optional[str] = ..., had_client: _Optional[bool] = ..., snapshot: _Optional[_Union[SessionSnapshot, _Mapping]] = ..., positions: _Optional[_Iterable[_Union[StreamPosition, _Mapping]]] = ..., refused: _Optional[bool] = ...) -> None: ...

class RetainedSyncRequest(_message.Message):
    __slots__ = ("request_id", "digest")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    digest: int
    def __init__(self, request_id: _Optional[int] = ..., digest: _Optional[int] = ...) -> None: ...

class RetainedSyncReply(_message.Message):
    __slots__ = ("request_id", "updates", "last")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    updates: _containers.RepeatedCompositeFieldContainer[RetainedUpdate]
    last: bool
    def __init__(self, request_id: _Optional[int] = ..., updates: _Optional[_Iterable[_Union[RetainedUpdate, _Mapping]]] = ..., last: _Optional[bool] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("orig", "dest", "from_client", "to_client", "ref", "ttl", "proof", "claim_reply", "retained_sync_request", "retained_sync_reply", "stream_ack", "stream_ret", "stream_resend", "session_claim", "class_interest")
    ORIG_FIELD_NUMBER: _ClassVar[int]
    DEST_FIELD_NUMBER: _ClassVar[int]
    FROM_CLIENT_FIELD_NUMBER: _ClassVar[int]
    TO_CLIENT_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    CLAIM_REPLY_FIELD_NUMBER: _ClassVar[int]
    RETAINED_SYNC_REQUEST_FIELD_NUMBER: _ClassVar[int]
    RETAINED_SYNC_REPLY_FIELD_NUMBER: _ClassVar[int]
    STREAM_ACK_FIELD_NUMBER: _ClassVar[int]
    STREAM_RET_FIELD_NUMBER: _ClassVar[int]
    STREAM_RESEND_FIELD_NUMBER: _ClassVar[int]
    SESSION_CLAIM_FIELD_NUMBER: _ClassVar[int]
    CLASS_INTEREST_FIELD_NUMBER: _ClassVar[int]
    orig: str
    dest: str
    from_client: str
    to_client: str
    ref: int
    ttl: int
    proof: OriginProof
    claim_reply: ClaimReply
    retained_sync_request: RetainedSyncRequest
    retained_sync_reply: RetainedSyncReply
    stream_ack: StreamAck
    stream_ret: StreamRet
    stream_resend: StreamResend
    session_claim: SessionClaim
    class_interest: ClassInterest
    def __init__(self, orig: _Optional[str] = ..., dest: _Optional[str] = ..., from_client: _Optional[str] = ..., to_client: _Optional[str] = ..., ref: _Optional[int] = ..., ttl: _Optional[int] = ..., proof: _Optional[_Union[OriginProof, _Mapping]] = ..., claim_reply: _Optional[_Union[ClaimReply, _Mapping]] = ..., retained_sync_request: _Optional[_Union[RetainedSyncRequest, _Mapping]] = ..., retained_sync_reply: _Optional[_Union[RetainedSyncReply, _Mapping]] = ..., stream_ack: _Optional[_Union[StreamAck, _Mapping]] = ..., stream_ret: _Optional[_Union[StreamRet, _Mapping]] = ..., stream_resend: _Optional[_Union[StreamResend, _Mapping]] = ..., session_claim: _Optional[_Union[SessionClaim, _Mapping]] = ..., class_interest: _Optional[_Union[ClassInterest, _Mapping]] = ...) -> None: ...

class ClassInterest(_message.Message):
    __slots__ = ("subscribed", "unsubscribed", "full", "epoch", "version", "leaving")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    subscribed: _containers.RepeatedScalarFieldContainer[str]
    unsubscribed: _containers.RepeatedScalarFieldContainer[str]
    full: bool
    epoch: int
    version: int
    leaving: bool
    def __init__(self, subscribed: _Optional[_Iterable[str]] = ..., unsubscribed: _Optional[_Iterable[str]] = ..., full: _Optional[bool] = ..., epoch: _Optional[int] = ..., version: _Optional[int] = ..., leaving: _Optional[bool] = ...) -> None: ...

class StreamPosition(_message.Message):
    __slots__ = ("origin", "stream", "next_seq")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    origin: str
    stream: str
    next_seq: int
    def __init__(self, origin: _Optional[str] = ..., stream: _Optional[str] = ..., next_seq: _Optional[int] = ...) -> None: ...

class StreamAck(_message.Message):
    __slots__ = ("positions", "left")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[StreamPosition]
    left: _containers.RepeatedCompositeFieldContainer[StreamPosition]
    def __init__(self, positions: _Optional[_Iterable[_Union[StreamPosition, _Mapping]]] = ..., left: _Optional[_Iterable[_Union[StreamPosition, _Mapping]]] = ...) -> None: ...

class StreamRet(_message.Message):
    __slots__ = ("origin", "stream", "from_seq", "to_seq")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    TO_SEQ_FIELD_NUMBER: _ClassVar[int]
    origin: str
    stream: str
    from_seq: int
    to_seq: int
    def __init__(self, origin: _Optional[str] = ..., stream: _Optional[str] = ..., from_seq: _Optional[int] = ..., to_seq: _Optional[int] = ...) -> None: ...

class StreamResend(_message.Message):
    __slots__ = ("origin", "stream", "messages", "gone_below")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    GONE_BELOW_FIELD_NUMBER: _ClassVar[int]
    origin: str
    stream: str
    messages: _containers.RepeatedCompositeFieldContainer[ForwardedMessage]
    gone_below: int
    def __init__(self, origin: _Optional[str] = ..., stream: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ForwardedMessage, _Mapping]]] = ..., gone_below: _Optional[int] = ...) -> None: ...

class ReplicaHello(_message.Message):
    __slots__ = ("incarnation", "started_empty", "wants_reply")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STARTED_EMPTY_FIELD_NUMBER: _ClassVar[int]
    WANTS_REPLY_FIELD_NUMBER: _ClassVar[int]
    incarnation: str
    started_empty: bool
    wants_reply: bool
    def __init__(self, incarnation: _Optional[str] = ..., started_empty: _Optional[bool] = ..., wants_reply: _Optional[bool] = ...) -> None: ...

class ReplicaAppend(_message.Message):
    __slots__ = ("incarnation", "first_seq", "messages", "released")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    incarnation: str
    first_seq: int
    messages: _containers.RepeatedCompositeFieldContainer[MqttMessage]
    released: int
    def __init__(self, incarnation: _Optional[str] = ..., first_seq: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[MqttMessage, _Mapping]]] = ..., released: _Optional[int] = ...) -> None: ...

class ReplicaAck(_message.Message):
    __slots__ = ("incarnation", "next_seq")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    incarnation: str
    next_seq: int
    def __init__(self, incarnation: _Optional[str] = ..., next_seq: _Optional[int] = ...) -> None: ...

class ReplicaRelease(_message.Message):
    __slots__ = ("incarnation", "upto")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    UPTO_FIELD_NUMBER: _ClassVar[int]
    incarnation: str
    upto: int
    def __init__(self, incarnation: _Optional[str] = ..., upto: _Optional[int] = ...) -> None: ...

class SessionReplica(_message.Message):
    __slots__ = ("incarnation", "client_id", "version", "snapshot", "positions")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    incarnation: str
    client_id: str
    version: int
    snapshot: SessionSnapshot
    positions: _containers.RepeatedCompositeFieldContainer[StreamPosition]
    def __init__(self, incarnation: _Optional[str] = ..., client_id: _Optional[str] = ..., version: _Optional[int] = ..., snapshot: _Optional[_Union[SessionSnapshot, _Mapping]] = ..., positions: _Optional[_Iterable[_Union[StreamPosition, _Mapping]]] = ...) -> None: ...

class SessionAck(_message.Message):
    __slots__ = ("incarnation", "client_id", "version")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    incarnation: str
    client_id: str
    version: int
    def __init__(self, incarnation: _Optional[str] = ..., client_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ReplicaLeaving(_message.Message):
    __slots__ = ("incarnation",)
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    incarnation: str
    def __init__(self, incarnation: _Optional[str] = ...) -> None: ...

class ReplicaHandedOver(_message.Message):
    __slots__ = ("incarnation",)
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    incarnation: str
    def __init__(self, incarnation: _Optional[str] = ...) -> None: ...

class SessionLookup(_message.Message):
    __slots__ = ("lookup_id", "client_id")
    LOOKUP_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    lookup_id: int
    client_id: str
    def __init__(self, lookup_id: _Optional[int] = ..., client_id: _Optional[str] = ...) -> None: ...

class SessionCopy(_message.Message):
    __slots__ = ("lookup_id", "home", "incarnation", "snapshot", "positions")
    LOOKUP_ID_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    lookup_id: int
    home: str
    incarnation: str
    snapshot: SessionSnapshot
    positions: _containers.RepeatedCompositeFieldContainer[StreamPosition]
    def __init__(self, lookup_id: _Optional[int] = ..., home: _Optional[str] = ..., incarnation: _Optional[str] = ..., snapshot: _Optional[_Union[SessionSnapshot, _Mapping]] = ..., positions: _Optional[_Iterable[_Union[StreamPosition, _Mapping]]] = ...) -> None: ...

class SessionCopyTaken(_message.Message):
    __slots__ = ("incarnation", "home", "client_id")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    HOME_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    incarnation: str
    home: str
    client_id: str
    def __init__(self, incarnation: _Optional[str] = ..., home: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class Replica(_message.Message):
    __slots__ = ("hello", "append", "ack", "release", "session", "session_ack", "leaving", "handed_over", "lookup", "copy", "copy_taken")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_ACK_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    HANDED_OVER_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_FIELD_NUMBER: _ClassVar[int]
    COPY_FIELD_NUMBER: _ClassVar[int]
    COPY_TAKEN_FIELD_NUMBER: _ClassVar[int]
    hello: ReplicaHello
    append: ReplicaAppend
    ack: ReplicaAck
    release: ReplicaRelease
    session: SessionReplica
    session_ack: SessionAck
    leaving: ReplicaLeaving
    handed_over: ReplicaHandedOver
    lookup: SessionLookup
    copy: SessionCopy
    copy_taken: SessionCopyTaken
    def __init__(self, hello: _Optional[_Union[ReplicaHello, _Mapping]] = ..., append: _Optional[_Union[ReplicaAppend, _Mapping]] = ..., ack: _Optional[_Union[ReplicaAck, _Mapping]] = ..., release: _Optional[_Union[ReplicaRelease, _Mapping]] = ..., session: _Optional[_Union[SessionReplica, _Mapping]] = ..., session_ack: _Optional[_Union[SessionAck, _Mapping]] = ..., leaving: _Optional[_Union[ReplicaLeaving, _Mapping]] = ..., handed_over: _Optional[_Union[ReplicaHandedOver, _Mapping]] = ..., lookup: _Optional[_Union[SessionLookup, _Mapping]] = ..., copy: _Optional[_Union[SessionCopy, _Mapping]] = ..., copy_taken: _Optional[_Union[SessionCopyTaken, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("peer_id", "schema_version", "max_batch_items", "http_port", "challenge", "identity_proof")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_ITEMS_FIELD_NUMBER: _ClassVar[int]
    HTTP_PORT_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_PROOF_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    schema_version: int
    max_batch_items: int
    http_port: int
    challenge: bytes
    identity_proof: OriginProof
    def __init__(self, peer_id: _Optional[str] = ..., schema_version: _Optional[int] = ..., max_batch_items: _Optional[int] = ..., http_port: _Optional[int] = ..., challenge: _Optional[bytes] = ..., identity_proof: _Optional[_Union[OriginProof, _Mapping]] = ...) -> None: ...

class Item(_message.Message):
    __slots__ = ("overlay", "envelope", "replica")
    OVERLAY_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    overlay: OverlayMessage
    envelope: Envelope
    replica: Replica
    def __init__(self, overlay: _Optional[_Union[OverlayMessage, _Mapping]] = ..., envelope: _Optional[_Union[Envelope, _Mapping]] = ..., replica: _Optional[_Union[Replica, _Mapping]] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("hello", "items")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    items: _containers.RepeatedCompositeFieldContainer[Item]
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., items: _Optional[_Iterable[_Union[Item, _Mapping]]] = ...) -> None: ...
