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

Each class is a frozen dataclass (equality, hashing, ``repr``, ``replace`` and ``fields``, which
the gRPC codec reads) with two things written out by hand, so that mypyc can compile the module
for the simulator sweeps (``bench/compiled_core.py``): the ``__init__``, which sets the frozen
fields with ``object.__setattr__`` as the generated one does, and ``kind`` as a property, where a
``ClassVar`` would do (mypyc refuses a ``ClassVar`` in a dataclass). Compiled, a message is then
built by a C function in ~40 ns; with the ``__init__`` that ``dataclasses`` generates it took
~650 ns, compiled or not, and the simulator builds one per message sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from overlay.keys import Key, NodeRef

NO_ACK = 0  # ack_id of a delegation that wants no acknowledgement
SEARCH_MAX_CONTACT_HOPS = 16  # a peer with no virtual node passes a SEARCH to its own contact


@dataclass(frozen=True, slots=True)
class REXP:
    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    existing: tuple[Key, ...]
    level: int

    def __init__(
        self,
        dest: Key,
        sender: NodeRef,
        forwarder: NodeRef,
        existing: tuple[Key, ...],
        level: int,
    ) -> None:
        object.__setattr__(self, "dest", dest)
        object.__setattr__(self, "sender", sender)
        object.__setattr__(self, "forwarder", forwarder)
        object.__setattr__(self, "existing", existing)
        object.__setattr__(self, "level", level)

    @property
    def kind(self) -> str:
        return "REXP"


@dataclass(frozen=True, slots=True)
class EEXP:
    """Range mode (``random_walk`` False): delivered over [lo, hi) by range multicast with the
    missing count split among delegates. Random mode: a random walk of ``missing`` hops."""

    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    existing: tuple[Key, ...]
    missing: int
    lo: Key
    hi: Key
    random_walk: bool

    def __init__(
        self,
        dest: Key,
        sender: NodeRef,
        forwarder: NodeRef,
        existing: tuple[Key, ...],
        missing: int,
        lo: Key,
        hi: Key,
        random_walk: bool,
    ) -> None:
        object.__setattr__(self, "dest", dest)
        object.__setattr__(self, "sender", sender)
        object.__setattr__(self, "forwarder", forwarder)
        object.__setattr__(self, "existing", existing)
        object.__setattr__(self, "missing", missing)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "random_walk", random_walk)

    @property
    def kind(self) -> str:
        return "EEXP"


@dataclass(frozen=True, slots=True)
class PUB:
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

    def __init__(
        self,
        dest: Key,
        sender: NodeRef,
        topic: str,
        payload: Any,
        publication_id: int,
        forwarder: NodeRef,
        hops: int,
        lo: Key,
        hi: Key,
        ack_id: int,
    ) -> None:
        object.__setattr__(self, "dest", dest)
        object.__setattr__(self, "sender", sender)
        object.__setattr__(self, "topic", topic)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "publication_id", publication_id)
        object.__setattr__(self, "forwarder", forwarder)
        object.__setattr__(self, "hops", hops)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "ack_id", ack_id)

    @property
    def kind(self) -> str:
        return "PUB"


@dataclass(frozen=True, slots=True)
class UNSUB:
    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    topic: str
    lo: Key
    hi: Key
    ack_id: int

    def __init__(
        self,
        dest: Key,
        sender: NodeRef,
        forwarder: NodeRef,
        topic: str,
        lo: Key,
        hi: Key,
        ack_id: int,
    ) -> None:
        object.__setattr__(self, "dest", dest)
        object.__setattr__(self, "sender", sender)
        object.__setattr__(self, "forwarder", forwarder)
        object.__setattr__(self, "topic", topic)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "ack_id", ack_id)

    @property
    def kind(self) -> str:
        return "UNSUB"


@dataclass(frozen=True, slots=True)
class NEW:
    dest: Key
    sender: NodeRef

    def __init__(
        self,
        dest: Key,
        sender: NodeRef,
    ) -> None:
        object.__setattr__(self, "dest", dest)
        object.__setattr__(self, "sender", sender)

    @property
    def kind(self) -> str:
        return "NEW"


@dataclass(frozen=True, slots=True)
class SEARCH:
    """Find the insertion position of ``target``; ``dest`` None = any virtual node of the peer."""

    dest: Key | None
    origin: Any  # peer id of the joining peer
    target: Key
    request_id: int
    forwarder: NodeRef | None
    contact_hops: int = 0  # peers without virtual nodes passed so far (bounded by SEARCH_MAX_CONTACT_HOPS)

    def __init__(
        self,
        dest: Key | None,
        origin: Any,
        target: Key,
        request_id: int,
        forwarder: NodeRef | None,
        contact_hops: int = 0,
    ) -> None:
        object.__setattr__(self, "dest", dest)
        object.__setattr__(self, "origin", origin)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "forwarder", forwarder)
        object.__setattr__(self, "contact_hops", contact_hops)

    @property
    def kind(self) -> str:
        return "SEARCH"


@dataclass(frozen=True, slots=True)
class FOUND:
    request_id: int
    target: Key
    pred: NodeRef | None
    succ: NodeRef | None
    peers: int = 0  # distinct peers in the answerer's routing tables, itself included (formation)

    def __init__(
        self,
        request_id: int,
        target: Key,
        pred: NodeRef | None,
        succ: NodeRef | None,
        peers: int = 0,
    ) -> None:
        object.__setattr__(self, "request_id", request_id)
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "pred", pred)
        object.__setattr__(self, "succ", succ)
        object.__setattr__(self, "peers", peers)

    @property
    def kind(self) -> str:
        return "FOUND"


@dataclass(frozen=True, slots=True)
class SEARCH_FAIL:
    request_id: int

    def __init__(
        self,
        request_id: int,
    ) -> None:
        object.__setattr__(self, "request_id", request_id)

    @property
    def kind(self) -> str:
        return "SEARCH_FAIL"


@dataclass(frozen=True, slots=True)
class LINK:
    """``sender`` believes it is the receiver's level-0 neighbour; ``reply``: an answer that
    confirms the adjacency (it is never answered itself)."""

    dest: Key
    sender: NodeRef
    reply: bool = False

    def __init__(
        self,
        dest: Key,
        sender: NodeRef,
        reply: bool = False,
    ) -> None:
        object.__setattr__(self, "dest", dest)
        object.__setattr__(self, "sender", sender)
        object.__setattr__(self, "reply", reply)

    @property
    def kind(self) -> str:
        return "LINK"


@dataclass(frozen=True, slots=True)
class LEAVE:
    """``sender`` leaves; ``replacement`` is its level-0 neighbour on the receiver's far side."""

    dest: Key
    sender: NodeRef
    replacement: NodeRef | None

    def __init__(
        self,
        dest: Key,
        sender: NodeRef,
        replacement: NodeRef | None,
    ) -> None:
        object.__setattr__(self, "dest", dest)
        object.__setattr__(self, "sender", sender)
        object.__setattr__(self, "replacement", replacement)

    @property
    def kind(self) -> str:
        return "LEAVE"


@dataclass(frozen=True, slots=True)
class PRESENCE:
    dest: Key
    sender: NodeRef
    forwarder: NodeRef
    topic: str
    present: bool
    lo: Key
    hi: Key

    def __init__(
        self,
        dest: Key,
        sender: NodeRef,
        forwarder: NodeRef,
        topic: str,
        present: bool,
        lo: Key,
        hi: Key,
    ) -> None:
        object.__setattr__(self, "dest", dest)
        object.__setattr__(self, "sender", sender)
        object.__setattr__(self, "forwarder", forwarder)
        object.__setattr__(self, "topic", topic)
        object.__setattr__(self, "present", present)
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    @property
    def kind(self) -> str:
        return "PRESENCE"


@dataclass(frozen=True, slots=True)
class PRESENCE_QUERY:
    dest: Key
    sender: NodeRef
    topic: str

    def __init__(
        self,
        dest: Key,
        sender: NodeRef,
        topic: str,
    ) -> None:
        object.__setattr__(self, "dest", dest)
        object.__setattr__(self, "sender", sender)
        object.__setattr__(self, "topic", topic)

    @property
    def kind(self) -> str:
        return "PRESENCE_QUERY"


@dataclass(frozen=True, slots=True)
class PING:
    nonce: int

    def __init__(
        self,
        nonce: int,
    ) -> None:
        object.__setattr__(self, "nonce", nonce)

    @property
    def kind(self) -> str:
        return "PING"


@dataclass(frozen=True, slots=True)
class PONG:
    nonce: int

    def __init__(
        self,
        nonce: int,
    ) -> None:
        object.__setattr__(self, "nonce", nonce)

    @property
    def kind(self) -> str:
        return "PONG"


@dataclass(frozen=True, slots=True)
class GONE:
    """The virtual node ``gone`` does not exist at the replying peer; ``bounced`` is the
    range/search message that was addressed to it (re-routed by its forwarder), or None."""

    gone: Key
    bounced: Any

    def __init__(
        self,
        gone: Key,
        bounced: Any,
    ) -> None:
        object.__setattr__(self, "gone", gone)
        object.__setattr__(self, "bounced", bounced)

    @property
    def kind(self) -> str:
        return "GONE"


@dataclass(frozen=True, slots=True)
class ACK:
    ack_id: int

    def __init__(
        self,
        ack_id: int,
    ) -> None:
        object.__setattr__(self, "ack_id", ack_id)

    @property
    def kind(self) -> str:
        return "ACK"


@dataclass(frozen=True, slots=True)
class DONE:
    """The receiver of the PUB delegation ``ack_id`` has handled it (its ``Deliver``, if any, was
    emitted) and every delegation it made for it, recursively, reported DONE as well."""

    ack_id: int

    def __init__(
        self,
        ack_id: int,
    ) -> None:
        object.__setattr__(self, "ack_id", ack_id)

    @property
    def kind(self) -> str:
        return "DONE"


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
