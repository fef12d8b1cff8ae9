"""Messages between peers: the queries of seed 003 Table 1 plus Skip Graph maintenance.

Table 1 queries (fields as in the table; "sender/forwarder information" is a ``NodeRef`` =
(key, membership vector), the key carrying the peer id, i.e. the address):

=======  ====================================================================================
REXP     sender, forwarder, existing-entry list, exploration level (§3.5.2, §3.5.5, §3.5.6)
EEXP     sender, forwarder, existing-entry list, missing-entry count (§3.5.2, §3.5.4, §3.5.6)
PUB      sender (the publisher's virtual node), topic, publish data, forwarder (§3.5.4)
UNSUB    sender, forwarder (§3.5.3)
NEW      sender: the node offered as a new routing-table entry candidate (§3.5.6)
=======  ====================================================================================

Range-multicast messages (EEXP to a range, PUB, UNSUB, PRESENCE) also carry the sub-range
``[lo, hi)`` delegated to the receiver (§3.5.1). Every message names the virtual node it is for
(``dest``) except the per-peer ones (FOUND, SEARCH_FAIL, PING, PONG, GONE, ACK, DONE).

Maintenance kinds decided by SkipMQ (docs/overlay.md): SEARCH/FOUND/SEARCH_FAIL (insert position),
LINK (level-0 adoption), LEAVE (unlink), PRESENCE/PRESENCE_QUERY (rendezvous point, §3.2),
PING/PONG (crash detection), GONE (no such virtual node here), ACK (per-hop PUB/UNSUB ack),
DONE (end-to-end completion of a PUB delegation, ``publish_done_enabled``).

All fields are plain data: str, int, bool, tuples of those, the opaque payload and peer ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from overlay.keys import Key, NodeRef
from overlay.slot_init import slot_init

NO_ACK = 0  # ack_id of a delegation that wants no acknowledgement
SEARCH_MAX_CONTACT_HOPS = 16  # a peer with no virtual node passes a SEARCH to its own contact


@slot_init
@dataclass(frozen=True, slots=True)
class REXP:
    kind: ClassVar[str] = "REXP"
    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    existing: tuple[Key, ...]
    level: int


@slot_init
@dataclass(frozen=True, slots=True)
class EEXP:
    """Range mode (``random_walk`` False): delivered over [lo, hi) by range multicast with the
    missing count split among delegates. Random mode: a random walk of ``missing`` hops."""

    kind: ClassVar[str] = "EEXP"
    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    existing: tuple[Key, ...]
    missing: int
    lo: Key
    hi: Key
    random_walk: bool


@slot_init
@dataclass(frozen=True, slots=True)
class PUB:
    kind: ClassVar[str] = "PUB"
    dest: Key
    sender: NodeRef
    topic: str
    payload: Any
    publication_id: int
    forwarder: NodeRef
    hops: int  # overlay hops from the publisher's virtual node to ``dest``
    lo: Key
    hi: Key
    ack_id: int


@slot_init
@dataclass(frozen=True, slots=True)
class UNSUB:
    kind: ClassVar[str] = "UNSUB"
    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    topic: str
    lo: Key
    hi: Key
    ack_id: int


@slot_init
@dataclass(frozen=True, slots=True)
class NEW:
    kind: ClassVar[str] = "NEW"
    dest: Key
    sender: NodeRef


@slot_init
@dataclass(frozen=True, slots=True)
class SEARCH:
    """Find the insertion position of ``target``; ``dest`` None = any virtual node of the peer."""

    kind: ClassVar[str] = "SEARCH"
    dest: Key | None
    origin: Any  # peer id of the joining peer
    target: Key
    request_id: int
    forwarder: NodeRef | None
    contact_hops: int = 0  # peers without virtual nodes passed so far (bounded by SEARCH_MAX_CONTACT_HOPS)


@slot_init
@dataclass(frozen=True, slots=True)
class FOUND:
    kind: ClassVar[str] = "FOUND"
    request_id: int
    target: Key
    pred: NodeRef | None
    succ: NodeRef | None
    peers: int = 0  # distinct peers in the answerer's routing tables, itself included (formation)


@slot_init
@dataclass(frozen=True, slots=True)
class SEARCH_FAIL:
    kind: ClassVar[str] = "SEARCH_FAIL"
    request_id: int


@slot_init
@dataclass(frozen=True, slots=True)
class LINK:
    """``sender`` believes it is the receiver's level-0 neighbour; ``reply``: an answer that
    confirms the adjacency (it is never answered itself)."""

    kind: ClassVar[str] = "LINK"
    dest: Key
    sender: NodeRef
    reply: bool = False


@slot_init
@dataclass(frozen=True, slots=True)
class LEAVE:
    """``sender`` leaves; ``replacement`` is its level-0 neighbour on the receiver's far side."""

    kind: ClassVar[str] = "LEAVE"
    dest: Key
    sender: NodeRef
    replacement: NodeRef | None


@slot_init
@dataclass(frozen=True, slots=True)
class PRESENCE:
    kind: ClassVar[str] = "PRESENCE"
    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    topic: str
    present: bool
    lo: Key
    hi: Key


@slot_init
@dataclass(frozen=True, slots=True)
class PRESENCE_QUERY:
    kind: ClassVar[str] = "PRESENCE_QUERY"
    dest: Key
    sender: NodeRef
    topic: str


@slot_init
@dataclass(frozen=True, slots=True)
class PING:
    kind: ClassVar[str] = "PING"
    nonce: int


@slot_init
@dataclass(frozen=True, slots=True)
class PONG:
    kind: ClassVar[str] = "PONG"
    nonce: int


@slot_init
@dataclass(frozen=True, slots=True)
class GONE:
    """The virtual node ``gone`` does not exist at the replying peer; ``bounced`` is the
    range/search message that was addressed to it (re-routed by its forwarder), or None."""

    kind: ClassVar[str] = "GONE"
    gone: Key
    bounced: Any


@slot_init
@dataclass(frozen=True, slots=True)
class ACK:
    kind: ClassVar[str] = "ACK"
    ack_id: int


@slot_init
@dataclass(frozen=True, slots=True)
class DONE:
    """The receiver of the PUB delegation ``ack_id`` has handled it (its ``Deliver``, if any, was
    emitted) and every delegation it made for it, recursively, reported DONE as well."""

    kind: ClassVar[str] = "DONE"
    ack_id: int


Message = (
    REXP
    | EEXP
    | PUB
    | UNSUB
    | NEW
    | SEARCH
    | FOUND
    | SEARCH_FAIL
    | LINK
    | LEAVE
    | PRESENCE
    | PRESENCE_QUERY
    | PING
    | PONG
    | GONE
    | ACK
    | DONE
)
