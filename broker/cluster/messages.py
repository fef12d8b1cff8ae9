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
class OriginProof:
    """What only the originating broker can give (``broker.cluster.origin_proof``): a signature
    over an item's canonical bytes and the DER certificate whose key made it."""

    signature: bytes
    certificate: bytes

    def to_bytes(self) -> bytes:
        """For the store (a retained update's proof is kept with its version)."""
        sig = self.signature
        return len(sig).to_bytes(2, "big") + sig + self.certificate

    @classmethod
    def from_bytes(cls, data: bytes) -> OriginProof:
        size = int.from_bytes(data[:2], "big")
        if len(data) < 2 + size:
            raise ValueError("truncated origin proof")
        return cls(bytes(data[2 : 2 + size]), bytes(data[2 + size :]))


@dataclass(frozen=True, slots=True)
class StreamPosition:
    """A receiver's REQ (seed 004 §3.1) for one (origin, stream): the SEQ it expects next."""

    origin: str
    stream: str
    next_seq: int


@dataclass(frozen=True, slots=True, init=False)
class ForwardedMessage:
    """An application message for one topic class's subscribers.

    ``seq`` numbers the messages ``origin`` sent on ``stream`` (the topic class) from 1 upwards
    with no gaps; receivers re-establish this order (per-publisher, per-topic order across
    one-hop/multi-hop switches). ``message.origin`` is the accepting broker's node id.
    """

    origin: str  # "<peer id>/<incarnation>" of the broker that accepted the message
    stream: str  # the topic class (overlay topic) the message was published on
    seq: int
    message: Message
    low: int = 0  # lowest SEQ of the stream still unconfirmed at the sender when sent (0: none)
    # causal groups (``broker.cluster.causal_clock``; empty for a topic in none): the sender's ACK
    # vector for the group (seed 004 §3.4 Theorem 1: every message below ``next_seq`` on each of
    # those streams precedes this one), and this message's (class, SEQ) on every stream of its
    # origin it went out on
    deps: tuple[StreamPosition, ...] = ()
    copies: tuple[tuple[str, int], ...] = ()

    def __init__(
        self,
        origin: str,
        stream: str,
        seq: int,
        message: Message,
        low: int = 0,
        deps: tuple[StreamPosition, ...] = (),
        copies: tuple[tuple[str, int], ...] = (),
    ) -> None:
        # what the generated __init__ of a frozen dataclass does (``object.__setattr__`` per
        # field) through the slots' own descriptors, at half the cost: one is built per message
        # forwarded and per message received (issue #11)
        set_origin, set_stream, set_seq, set_message, set_low, set_deps, set_copies = _FORWARDED_SLOTS
        set_origin(self, origin)
        set_stream(self, stream)
        set_seq(self, seq)
        set_message(self, message)
        set_low(self, low)
        set_deps(self, deps)
        set_copies(self, copies)


_FORWARDED_SLOTS = tuple(
    ForwardedMessage.__dict__[name].__set__
    for name in ("origin", "stream", "seq", "message", "low", "deps", "copies")
)
assert tuple(ForwardedMessage.__slots__) == ("origin", "stream", "seq", "message", "low", "deps", "copies")


@dataclass(frozen=True, slots=True)
class RetainedUpdate:
    """A retained message (empty payload = delete) replicated to every broker.

    Last writer wins on ``(version_ms, origin)``: the accepting broker's wall clock in
    milliseconds, ties broken by the accepting broker's peer id.
    """

    origin: str
    version_ms: int
    message: Message
    proof: OriginProof | None = None  # the origin's signature (relayed unchanged by copies)


@dataclass(frozen=True, slots=True)
class SessionClaim:
    """Broker ``origin`` has a CONNECT for ``client_id``: whoever holds the client disconnects it
    and answers with a :class:`ClaimReply` (with the session unless ``clean_start``)."""

    origin: str
    client_id: str
    claim_id: int
    clean_start: bool
    # the authenticated user name of the claiming connection: a broker holding the client id's
    # session for another user refuses the claim (sessions are bound to their owner, docs/security.md)
    username: str | None = None
    # a claim whose session never arrived, asked again after the claimant restarted: answered with
    # the session kept for it if the answering broker handed it over, else with "none" - never a
    # new hand-over (``broker.cluster.takeover``, "Recovering a session lost in flight")
    recover: bool = False
    proof: OriginProof | None = None  # the claimant's signature (a claim travels the overlay)


@dataclass(frozen=True, slots=True)
class ForwardedBatch:
    """Consecutive messages of one stream (same origin and class, rising SEQ) published as one
    overlay publication (issue #11): one PUB, ACK and DONE per hop for all of them."""

    messages: tuple[ForwardedMessage, ...]
    proof: OriginProof | None = None  # the origin's one signature over all of them


OverlayPayload = ForwardedMessage | ForwardedBatch | RetainedUpdate | SessionClaim


@dataclass(frozen=True, slots=True)
class ClaimReply:
    """Answer to a :class:`SessionClaim`: ``had_client`` says whether the replier held the client
    (connected or as a stored session); ``snapshot`` is its session when it is handed over;
    ``refused``: the replier holds the client id's session for another user (the claim's CONNECT
    is refused with 0x87 Not authorized, docs/security.md)."""

    claim_id: int
    client_id: str
    had_client: bool
    snapshot: SessionSnapshot | None
    # the answering broker's positions in the streams of the session's classes at the hand-over
    positions: tuple[StreamPosition, ...] = ()
    refused: bool = False


@dataclass(frozen=True, slots=True)
class RetainedSyncRequest:
    """A broker that just joined asks a peer for every retained message it holds; with a
    ``digest`` (anti-entropy), only if the peer's digest of its retained versions differs."""

    request_id: int
    digest: int | None = None


@dataclass(frozen=True, slots=True)
class RetainedSyncReply:
    """One chunk of a retained-store copy; ``last`` marks the final chunk."""

    request_id: int
    updates: tuple[RetainedUpdate, ...]
    last: bool


@dataclass(frozen=True, slots=True)
class StreamAck:
    """One receiver's ACK vector for the streams of one sender (seed 004 §3.2), and the streams
    it left (its last local subscription of the class ended)."""

    positions: tuple[StreamPosition, ...]
    left: tuple[StreamPosition, ...] = ()


@dataclass(frozen=True, slots=True)
class StreamRet:
    """RET (seed 004 §3.3): the receiver misses SEQs [from_seq, to_seq) of (origin, stream)."""

    origin: str
    stream: str
    from_seq: int
    to_seq: int


@dataclass(frozen=True, slots=True)
class StreamResend:
    """Messages of one stream sent again to one receiver, in SEQ order; SEQs below
    ``gone_below`` are no longer in the sender's log (0: none gone)."""

    origin: str
    stream: str
    messages: tuple[ForwardedMessage, ...]
    gone_below: int = 0


@dataclass(frozen=True, slots=True)
class ClassInterest:
    """The topic classes the sending broker subscribes (``full``: the whole list) or stopped
    subscribing: filter propagation (seed 000) that tells senders whom to keep messages for.

    ``(epoch, version)`` orders one sender's announcements (``broker.cluster.interest_table``):
    ``epoch`` is durable and grows at each start of the sender, ``version`` grows with each
    announcement of an epoch, so a receiver ignores what is older than what it applied (a whole
    list overtaken by a later change). ``(0, 0)``: unordered (a sender without versions)."""

    subscribed: tuple[str, ...]
    unsubscribed: tuple[str, ...] = ()
    full: bool = False
    epoch: int = 0
    version: int = 0
    # the sender leaves the cluster (a graceful stop): forget it, stop contacting it until it talks
    # again (with ``full`` and nothing subscribed)
    leaving: bool = False


StreamBody = StreamAck | StreamRet | StreamResend
DirectedBody = (
    ClaimReply
    | RetainedSyncRequest
    | RetainedSyncReply
    | StreamAck
    | StreamRet
    | StreamResend
    | SessionClaim
    | ClassInterest
)


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
    proof: OriginProof | None = None  # the sender's signature over the envelope and its body
