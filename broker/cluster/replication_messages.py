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

from broker.core.messages import Message

LogKey = tuple[str, str]  # (origin peer id, origin incarnation): one replication log


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


ReplicaItem = ReplicaHello | ReplicaAppend | ReplicaAck | ReplicaRelease


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


ReplicationAction = SendReplica | Durable | Persist | Drop | TakeOver
