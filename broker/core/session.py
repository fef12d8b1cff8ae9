"""Per-client session state (MQTT 3.1.1 §3.1.2.4 / §4.1, MQTT 5 §4.1 "Session State").

The server side of a session holds: the client's subscriptions, QoS 1/2 messages sent to the
client and not yet completely acknowledged (in flight), QoS 1/2 messages pending transmission
(queued), QoS 2 packet identifiers received from the client and not yet completely acknowledged,
the will message and the session-expiry timer. This module is data only: the logic that changes
it is in ``broker.core.sessions`` (life cycle), ``broker.core.outbound`` (queue and in flight)
and ``broker.core.client`` (one connection).

It also defines the broker's internal :class:`Message` and the :class:`SessionSnapshot` used to
hand a session to another broker of the cluster (``BrokerApi.hand_over`` / ``import_session``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.core.records import PUBLISH_SENT, PUBREL_SENT, QUEUED
from broker.mqtt.packets import Properties, Will

if TYPE_CHECKING:
    from broker.core.ports import ClientPort, TimerHandle

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


class Session:
    """Server-side state of one client id; outlives its connection when persistent."""

    __slots__ = (
        "client_id",
        "client_max_packet_size",
        "client_receive_maximum",
        "client_topic_alias_maximum",
        "connection",
        "disconnected_at",
        "ended",
        "expiry_handle",
        "expiry_interval_s",
        "incoming_qos2",
        "inflight",
        "next_packet_id",
        "out_aliases",
        "persistent",
        "present_at_connect",
        "protocol_level",
        "queue",
        "subscriptions",
        "unsent",
        "username",
        "will",
        "will_fire_at",
        "will_handle",
    )

    def __init__(self, client_id: str, protocol_level: int, username: str | None) -> None:
        self.client_id = client_id
        self.protocol_level = protocol_level
        self.username = username
        self.expiry_interval_s = 0
        self.subscriptions: dict[str, SubOptions] = {}
        self.connection: ClientPort | None = None  # the client's connection while connected
        self.queue: deque[OutEntry] = deque()
        self.inflight: dict[int, OutEntry] = {}
        self.incoming_qos2: set[int] = set()
        self.next_packet_id = 1
        self.will: Will | None = None
        self.will_handle: TimerHandle | None = None
        self.will_fire_at: float | None = None
        self.expiry_handle: TimerHandle | None = None
        self.disconnected_at: float | None = None
        self.client_receive_maximum = 65535
        self.client_max_packet_size = 268_435_455
        self.client_topic_alias_maximum = 0
        self.out_aliases: dict[str, int] | None = None
        self.persistent = False  # stored in the store (expiry_interval_s > 0)
        # in-flight entries not yet re-sent on this connection (window smaller than after the
        # reconnect); they go out before any queued message as acknowledgements arrive
        self.unsent: deque[OutEntry] | None = None
        self.ended = False
        # the last CONNACK said "session present": the client relies on its subscriptions
        self.present_at_connect = False

    def allocate_packet_id(self) -> int:
        """Next free packet identifier (1..65535) not used by an in-flight message."""
        packet_id = self.next_packet_id
        inflight = self.inflight
        for _ in range(65536):
            if packet_id not in inflight:
                break
            packet_id = packet_id + 1 if packet_id < 65535 else 1
        else:  # pragma: no cover - the in-flight window is far below 65535
            raise RuntimeError("no free packet identifier")
        self.next_packet_id = packet_id + 1 if packet_id < 65535 else 1
        return packet_id

    @property
    def connected(self) -> bool:
        return self.connection is not None

    def pending_entries(self) -> list[OutEntry]:
        """In-flight entries first (oldest packet first), then queued ones."""
        return [*self.inflight.values(), *self.queue]

    def cancel_timers(self) -> None:
        if self.expiry_handle is not None:
            self.expiry_handle.cancel()
            self.expiry_handle = None
        if self.will_handle is not None:
            self.will_handle.cancel()
            self.will_handle = None


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
