"""The core's value types: :class:`Message`, :class:`SubOptions`, :class:`OutEntry`,
:class:`SessionSnapshot` (MQTT 3.1.1 §4.1 / MQTT 5 §4.1 "Session State", the parts that are data).

A leaf module (it imports no other module of ``broker.core`` but ``records``): the ports
(``broker.core.ports``) and every part of the core name these types, and ``broker.core.session``
(the mutable :class:`~broker.core.session.Session`, which holds a connection and timers) builds
on them. ``broker.core.session`` re-exports every name here, its historical import path.
:class:`SessionSnapshot` hands a session to another broker of the cluster
(``BrokerApi.hand_over`` / ``import_session``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.core.records import PUBLISH_SENT, PUBREL_SENT, QUEUED
from broker.mqtt.packets import Properties, Will

__all__ = [
    "STATE_PUBLISH_SENT",
    "STATE_PUBREL_SENT",
    "STATE_QUEUED",
    "Message",
    "OutEntry",
    "SessionSnapshot",
    "SubOptions",
]

# Outgoing entry states (the store keeps the same numbers: broker.core.records).
STATE_QUEUED = QUEUED
STATE_PUBLISH_SENT = PUBLISH_SENT
STATE_PUBREL_SENT = PUBREL_SENT


@dataclass(slots=True)
class Message:
    """An application message inside the broker.

    ``expiry_at`` is an absolute wall-clock time (from message_expiry_interval) or None;
    ``origin`` is the node id of the broker that accepted it; ``publisher_id`` the client id of
    the publisher (None for $SYS, remote or injected messages).
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=dict)
    expiry_at: float | None = None
    origin: str = ""
    publisher_id: str | None = None


@dataclass(slots=True)
class SubOptions:
    """One subscription of a session (the filter includes any ``$share/group/`` prefix)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_identifier: int | None = None
    share_group: str | None = None
    match_filter: str = ""  # the filter without the $share prefix

    def copy(self) -> SubOptions:
        return SubOptions(
            self.topic_filter,
            self.qos,
            self.no_local,
            self.retain_as_published,
            self.retain_handling,
            self.subscription_identifier,
            self.share_group,
            self.match_filter,
        )


@dataclass(slots=True)
class OutEntry:
    """A QoS>0 message towards the client: queued (no packet id yet) or in flight."""

    message: Message
    qos: int
    retain: bool
    subscription_identifiers: list[int]
    seq: int | None = None  # store sequence number (persistent sessions only)
    packet_id: int | None = None
    state: int = STATE_QUEUED
    # (group, filter) when delivered through a shared subscription: handed to another member of
    # the group if this session ends before the message is completed (MQTT 5 §4.8.2)
    share_key: tuple[str, str] | None = None


@dataclass(slots=True)
class SessionSnapshot:
    """A session's transferable state (for moving a client between brokers of the cluster)."""

    client_id: str
    protocol_level: int
    expiry_interval_s: int
    username: str | None
    subscriptions: list[SubOptions]
    pending: list[OutEntry]  # in-flight first (with packet ids and states), then queued
    incoming_qos2: set[int]
    next_packet_id: int = 1
    # the will and the expiry clock (MQTT 5 §3.1.2.5, §3.1.3.2; MQTT 3.1.1 §3.1.2.5): what a broker
    # that adopts the session after its home's loss needs to publish the will with its delay
    # (docs/cluster.md, Replicas). ``will_fire_at``: the wall time a delayed will is due (the client
    # left, the delay runs); None while the client is connected or when there is no delayed will.
    # ``disconnected_at``: the wall time the client left (the expiry interval runs from it); None
    # while it is connected. A hand-over to the client's new broker ignores both (it reconnected).
    will: Will | None = None
    will_fire_at: float | None = None
    disconnected_at: float | None = None
