"""The overlay core's interface: events and ``now`` in, actions out (sans-I/O).

Implements the boundary described in docs/overlay.md (style of aioquic / etcd-raft): a driver
(the deterministic simulator in ``overlay.sim`` or the real broker runtime in ``broker``) owns
the clock, the network and the randomness seed; the core (``overlay.node.OverlayNode``) owns the
SG-TBPS Skip Graph with Flexible Routing Tables of seed 003 (Banno & Shudo) and never performs
I/O.

Driver promise (needed by ``PublishDone``): a ``Deliver`` is made durable before any ``Send``
that follows it in the same action list is transmitted.

Driver loop::

    actions = node.handle(event, now)          # carry out every action in order
    deadline = node.next_deadline()            # call node.handle(Tick(), t) at t >= deadline

Peers (physical nodes = brokers) are identified by opaque, hashable, mutually comparable ids
(ints in the simulator, strings such as "host:port" in real clusters). All messages between
peers are the query dataclasses of ``overlay.messages`` (REXP, EEXP, PUB, UNSUB, NEW of seed 003
Table 1, plus the Skip Graph maintenance messages); each has a ``kind`` string and PUB has a
``topic`` so drivers can count and check traffic without knowing the protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

PeerId = Any  # int in the simulator, str in a real cluster; hashable and totally ordered


class Role(IntEnum):
    """A virtual node's kind (seed 003 §3.2). Publishers sort before subscribers of a topic."""

    PUBLISHER = 0
    SUBSCRIBER = 1


# ---------------------------------------------------------------- events (driver -> core)


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """Peers this node may contact to enter the overlay (empty for the very first node)."""

    contacts: tuple[PeerId, ...]


@dataclass(frozen=True, slots=True)
class JoinTopic:
    """Insert a virtual node (topic, role, self) into the Skip Graph (§3.5.2)."""

    topic: str
    role: Role


@dataclass(frozen=True, slots=True)
class LeaveTopic:
    """Remove the virtual node (topic, role, self); subscribers send UNSUB (§3.5.3)."""

    topic: str
    role: Role


@dataclass(frozen=True, slots=True)
class Publish:
    """A local publisher's message for ``topic`` (§3.5.4). ``payload`` is opaque to the core."""

    topic: str
    payload: Any
    publication_id: int


@dataclass(frozen=True, slots=True)
class Receive:
    """A message from another peer arrived."""

    sender: PeerId
    message: Any  # one of overlay.messages

    def __init__(self, sender: PeerId, message: Any) -> None:  # see Send
        object.__setattr__(self, "sender", sender)
        object.__setattr__(self, "message", message)


@dataclass(frozen=True, slots=True)
class Tick:
    """Timers are due (the driver calls this at or after ``next_deadline()``)."""

    def __init__(self) -> None:  # see Send
        pass


@dataclass(frozen=True, slots=True)
class PeerUnreachable:
    """The transport gave up on a peer (connection refused/broken). Optional hint; the core
    also detects silent crashes by its own timeouts."""

    peer: PeerId


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Leave every topic gracefully before the process stops."""


Event = Bootstrap | JoinTopic | LeaveTopic | Publish | Receive | Tick | PeerUnreachable | Shutdown

# ---------------------------------------------------------------- actions (core -> driver)


@dataclass(frozen=True, slots=True)
class Send:
    """Transmit ``message`` to peer ``dest`` (best effort; may be lost or reordered)."""

    dest: PeerId
    message: Any

    def __init__(self, dest: PeerId, message: Any) -> None:
        # written out, as the generated one does it, so that a mypyc build of this module (the
        # simulator's sweeps, bench/compiled_core.py) builds one in C: one is built per message
        object.__setattr__(self, "dest", dest)
        object.__setattr__(self, "message", message)


@dataclass(frozen=True, slots=True)
class Deliver:
    """A PUB reached this peer's subscriber virtual node for ``topic``.

    ``hops`` is the overlay path length from the publisher's virtual node (1 = direct).
    """

    topic: str
    payload: Any
    publication_id: int
    publisher: PeerId
    hops: int


@dataclass(frozen=True, slots=True)
class SubscriberPresence:
    """The rendezvous point told this publisher whether ``topic`` has subscribers (§3.2).

    While ``present`` is False the publisher's ``Publish`` events send nothing (exhaust data).
    """

    topic: str
    present: bool


@dataclass(frozen=True, slots=True)
class PublishDone:
    """End-to-end outcome of one ``Publish`` event of this peer (only with
    ``OverlayConfig.publish_done_enabled``; emitted exactly once per ``Publish``).

    ``complete`` True: every delegation of the multicast tree reported DONE, i.e. every
    subscriber peer reached has emitted its ``Deliver`` (and, by the driver's promise, made it
    durable) - or the publisher knew there were no subscribers and sent nothing. False: a
    delegation was given up, the pending-join queue overflowed, the publisher left, or
    ``publish_done_timeout_s`` passed since the ``Publish``; the driver should treat the
    message as not confirmed (e.g. keep the MQTT PUBACK back or retry).

    ``reached`` False: complete, but no delegation went to another peer - the publisher's view
    held no subscriber elsewhere (none exists, or its tables do not know one yet: after a restart
    or a partition). A driver that promises more than the overlay's view (SkipMQ's streams: a
    receiver new to a stream skips what was confirmed) must not take it as delivered everywhere.
    """

    topic: str
    publication_id: int
    complete: bool
    reached: bool = True


Action = Send | Deliver | SubscriberPresence | PublishDone


class OverlayCore(Protocol):
    """What drivers rely on; ``overlay.node.OverlayNode`` implements it."""

    peer_id: PeerId

    def handle(self, event: Event, now: float) -> list[Action]: ...

    def next_deadline(self) -> float | None: ...
