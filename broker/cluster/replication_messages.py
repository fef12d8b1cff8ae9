"""Plain-data records of replicated durability (``cluster.replicas``): between brokers, and the
actions the pure core ``broker.cluster.replication`` asks its adapter to carry out.

Seed 004's vocabulary (§2.4, §3.3-§3.5) over a *replica group* - an origin broker and its N-1
replica holders (docs/notes/replication.md): a holder's :class:`ReplicaAck` is its *acceptance*
(the entries are committed on its disk, cumulative like a stream's REQ), the origin's
:class:`Durable` is *pre-acknowledgement* (every holder accepted: durable on N, the PUBACK may
go), and :class:`ReplicaRelease` carries *acknowledgement* (the origin's send log no longer needs
the entries: every receiver broker took them), after which the holders drop them.

Not yet in ``protos/``: the simulation carries these records as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.cluster.messages import StreamPosition
from broker.core.messages import Message, SessionSnapshot

LogKey = tuple[str, str]  # (origin peer id, origin incarnation): one replication log

# A stream's RET answered with this ``gone_below`` (``StreamResend``): the answering broker has
# no log of that stream of its *earlier* incarnation at all (its disk was lost, or replaced by a
# later one's) and runs with ``cluster.replicas`` > 1 - so what that log held and was
# acknowledged is published again by its replica holders, in log order, on their own streams.
# The receiver drops what it holds of that incarnation's streams instead of delivering it after
# the gap (seeds 172, 341, 554 and 649 of the ``--sessions`` sweep: the held messages came
# before the gap's, which came later from the holder). An ordinary "gone" is a SEQ below this.
LOG_TAKEN_OVER = 1 << 62


# ---------------------------------------------------------------------- between brokers
@dataclass(frozen=True, slots=True)
class ReplicaHello:
    """A broker's incarnation, sent to every member when it starts (``wants_reply``) and answered
    once by each. ``started_empty``: this incarnation found no state of its own on disk (a wiped or
    new disk) - the logs of its earlier incarnations exist only on their holders now."""

    incarnation: str
    started_empty: bool
    wants_reply: bool = True


@dataclass(frozen=True, slots=True)
class ReplicaAppend:
    """Entries ``first_seq``, ``first_seq + 1``, ... of the origin's log ``incarnation`` (sent,
    or sent again: seed 004 §3.3's retransmission), and ``released``: every entry below it is no
    longer needed anywhere."""

    incarnation: str
    first_seq: int
    messages: tuple[Message, ...]
    released: int


@dataclass(frozen=True, slots=True)
class ReplicaAck:
    """A holder's acceptance (seed 004 §2.4 (1)): every entry of ``incarnation`` below
    ``next_seq`` is on its disk (the AL the origin's pre-acknowledgement condition reads)."""

    incarnation: str
    next_seq: int


@dataclass(frozen=True, slots=True)
class ReplicaRelease:
    """Seed 004 §3.5's acknowledgement, as far as holders need it: entries of ``incarnation``
    below ``upto`` were taken by every receiver broker; drop them."""

    incarnation: str
    upto: int


@dataclass(frozen=True, slots=True)
class SessionReplica:
    """The home broker's latest state of the persistent session ``client_id`` (``version``
    numbered per home incarnation, increasing: a holder keeps the highest). ``snapshot`` None:
    the session ended here (clean start, expiry, moved to another broker) - the holders delete it."""

    incarnation: str
    client_id: str
    version: int
    snapshot: SessionSnapshot | None
    # where the home stood in the streams of the session's classes when the snapshot was taken:
    # a holder that adopts the session catches it up from there (what came after is in the
    # origins' send logs, as for a session that moves)
    positions: tuple[StreamPosition, ...] = ()


@dataclass(frozen=True, slots=True)
class SessionAck:
    """A holder's acceptance of a session: ``version`` (or a later one) of ``client_id`` is on its
    disk."""

    incarnation: str
    client_id: str
    version: int


@dataclass(frozen=True, slots=True)
class ReplicaLeaving:
    """A broker being removed gracefully (a drain): hold nothing more on it; what it holds of your
    log and sessions, give to your next holder, then answer :class:`ReplicaHandedOver`. When its
    link breaks afterwards its own log and sessions are taken over at once (no failover wait)."""

    incarnation: str


@dataclass(frozen=True, slots=True)
class ReplicaHandedOver:
    """An origin's answer to :class:`ReplicaLeaving`: everything of ``incarnation`` (its log and
    its sessions) is on N brokers without the leaving one: drop what you hold of it."""

    incarnation: str


@dataclass(frozen=True, slots=True)
class SessionLookup:
    """A CONNECT (clean start 0) for ``client_id`` arrived at the sender: who holds a copy of its
    session? Asked beside the cluster's takeover claim, answered only by holders."""

    lookup_id: int
    client_id: str


@dataclass(frozen=True, slots=True)
class SessionCopy:
    """A member's answer to :class:`SessionLookup`: a holder's copy of the session, of ``home``'s
    ``incarnation``, or (``snapshot`` None, ``home`` and ``incarnation`` empty) "no copy here".
    A copy is used by the asking broker only if the takeover claim found no session (the home did
    not answer within the CONNECT's wait: it is gone, or cut off); the "no copy" answers tell it
    when every live member has answered, so that it need not wait longer for a copy."""

    lookup_id: int
    home: str
    incarnation: str
    snapshot: SessionSnapshot | None
    positions: tuple[StreamPosition, ...] = ()


@dataclass(frozen=True, slots=True)
class SessionCopyTaken:
    """The asking broker made the copy its client's session: the holder drops it (it is no longer
    the home's latest state: the session lives on the asking broker now)."""

    incarnation: str  # the home's
    home: str
    client_id: str


ReplicaItem = (
    SessionLookup
    | SessionCopy
    | SessionCopyTaken
    | ReplicaHello
    | ReplicaAppend
    | ReplicaAck
    | ReplicaRelease
    | SessionReplica
    | SessionAck
    | ReplicaLeaving
    | ReplicaHandedOver
)
# the same kinds as a tuple, once: the wire codec (``broker.adapters.transport.wire``) and the
# engine's input check (``EngineReplication.on_receive``) both read it
REPLICA_KINDS: tuple[type, ...] = (
    ReplicaHello,
    ReplicaAppend,
    ReplicaAck,
    ReplicaRelease,
    SessionReplica,
    SessionAck,
    ReplicaLeaving,
    ReplicaHandedOver,
    SessionLookup,
    SessionCopy,
    SessionCopyTaken,
)


# ---------------------------------------------------------------------- actions for the adapter
@dataclass(frozen=True, slots=True)
class SendReplica:
    """Send ``item`` to broker ``peer``."""

    peer: str
    item: ReplicaItem


@dataclass(frozen=True, slots=True)
class Durable:
    """Origin: entries ``first_seq`` .. ``end_seq - 1`` of this broker's log are durable on N
    (pre-acknowledged in the replica group): their publishers' PUBACK/PUBREC may go."""

    first_seq: int
    end_seq: int


@dataclass(frozen=True, slots=True)
class Persist:
    """Holder: commit these entries of ``key`` (from ``first_seq`` on) to disk. The adapter runs
    the actions in order and commits before it sends the :class:`SendReplica` that follows (the
    ack must never run ahead of the disk)."""

    key: LogKey
    first_seq: int
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class Drop:
    """Holder: delete the entries of ``key`` below ``below_seq`` from disk (None: all of them)."""

    key: LogKey
    below_seq: int | None


@dataclass(frozen=True, slots=True)
class TakeOver:
    """Holder: the origin of ``key`` is gone with these entries (its disk lost, or down for good):
    publish them again as this broker's own publishes, in order (the failover), then tell the core
    ``taken_over(key)`` once they are durable here."""

    key: LogKey
    first_seq: int
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class PersistSession:
    """Holder: commit the session ``client_id`` of ``key``'s home (``snapshot`` None: delete it)
    before the :class:`SendReplica` that follows (its ack)."""

    key: LogKey
    client_id: str
    snapshot: SessionSnapshot | None
    positions: tuple[StreamPosition, ...] = ()


@dataclass(frozen=True, slots=True)
class SessionDurable:
    """Home: ``version`` of the session ``client_id`` is on N brokers (what waited on it - a stream
    acknowledgement of a message queued into it, a SUBACK - may go)."""

    client_id: str
    version: int


@dataclass(frozen=True, slots=True)
class AdoptSessions:
    """Holder: the home of ``key`` is gone (disk lost, down for good, or removed gracefully): make
    these sessions this broker's own stored sessions (a client reconnecting to any broker gets its
    session through the cluster's takeover claim, ``session present``), then tell the core
    ``sessions_adopted(key)``."""

    key: LogKey
    snapshots: tuple[SessionSnapshot, ...]
    positions: tuple[tuple[StreamPosition, ...], ...] = ()  # each snapshot's (SessionReplica)


@dataclass(frozen=True, slots=True)
class DropSessions:
    """Holder: delete every session held of ``key``'s home."""

    key: LogKey


@dataclass(frozen=True, slots=True)
class CopyFound:
    """Asking broker: a member's answer to the lookup ``lookup_id``: a holder's copy (the adapter
    keeps the first one for the CONNECT that asked) or, ``copy.snapshot`` None, none held there."""

    lookup_id: int
    holder: str
    copy: SessionCopy


ReplicationAction = (
    CopyFound
    | SendReplica
    | Durable
    | Persist
    | Drop
    | TakeOver
    | PersistSession
    | SessionDurable
    | AdoptSessions
    | DropSessions
)
