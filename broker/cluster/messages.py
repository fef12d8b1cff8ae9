"""Plain-data records exchanged between the brokers of a cluster (besides the overlay queries).

Two families, both carried by the gRPC transport (``broker.adapters.transport``, the only module that
knows the protobuf schema in ``protos/skipmq/v1/``):

* **Overlay payloads** ride inside the overlay's PUB query (seed 003 §3.5.4, ``PUB.payload``):
  :class:`ForwardedMessage` (an MQTT application message for the subscribers of one topic
  class), :class:`RetainedUpdate` (cluster-wide retained store) and :class:`SessionClaim`
  (a broker asks, on the cluster control class, for a client id's session).
* **Directed messages** travel point to point inside an :class:`Envelope` in the sense of seed
  002 (to client, dest broker, from client, orig broker, ref, TTL against cycles):
  :class:`ClaimReply`, :class:`RetainedSyncRequest` and :class:`RetainedSyncReply`.

MQTT messages and sessions are the broker's own types (``broker.core.session.Message`` and
``SessionSnapshot``), so nothing is copied field by field on the way in or out.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.core.session import Message, SessionSnapshot

DEFAULT_ENVELOPE_TTL = 8  # relays a directed message may take before it is dropped (seed 002)


@dataclass(frozen=True, slots=True)
class ForwardedMessage:
    """An application message for one topic class's subscribers.

    ``seq`` numbers the messages ``origin`` sent on ``stream`` (the topic class) from 1 upwards
    with no gaps; receivers re-establish this order (per-publisher, per-topic order across
    one-hop/multi-hop switches). ``message.origin`` is the accepting broker's node id.
    """

    origin: str  # cluster peer id (host:port) of the broker that accepted the message
    stream: str  # the topic class (overlay topic) the message was published on
    seq: int
    message: Message


@dataclass(frozen=True, slots=True)
class RetainedUpdate:
    """A retained message (empty payload = delete) replicated to every broker.

    Last writer wins on ``(version_ms, origin)``: the accepting broker's wall clock in
    milliseconds, ties broken by the accepting broker's peer id.
    """

    origin: str
    version_ms: int
    message: Message


@dataclass(frozen=True, slots=True)
class SessionClaim:
    """Broker ``origin`` has a CONNECT for ``client_id``: whoever holds the client disconnects it
    and answers with a :class:`ClaimReply` (with the session unless ``clean_start``)."""

    origin: str
    client_id: str
    claim_id: int
    clean_start: bool


OverlayPayload = ForwardedMessage | RetainedUpdate | SessionClaim


@dataclass(frozen=True, slots=True)
class ClaimReply:
    """Answer to a :class:`SessionClaim`: ``had_client`` says whether the replier held the client
    (connected or as a stored session); ``snapshot`` is its session when it is handed over."""

    claim_id: int
    client_id: str
    had_client: bool
    snapshot: SessionSnapshot | None


@dataclass(frozen=True, slots=True)
class RetainedSyncRequest:
    """A broker that just joined asks a peer for every retained message it holds."""

    request_id: int


@dataclass(frozen=True, slots=True)
class RetainedSyncReply:
    """One chunk of a retained-store copy; ``last`` marks the final chunk."""

    request_id: int
    updates: tuple[RetainedUpdate, ...]
    last: bool


DirectedBody = ClaimReply | RetainedSyncRequest | RetainedSyncReply


@dataclass(frozen=True, slots=True)
class Envelope:
    """A directed message (seed 002 §2): ``orig``/``dest`` are broker peer ids,
    ``from_client``/``to_client`` client ids ("" when none), ``ref`` the request it answers
    (0 when none), ``ttl`` the relays left."""

    orig: str
    dest: str
    from_client: str
    to_client: str
    ref: int
    ttl: int
    body: DirectedBody
