"""Per-client session state (MQTT 3.1.1 §3.1.2.4 / §4.1, MQTT 5 §4.1 "Session State").

The server side of a session holds: the client's subscriptions, QoS 1/2 messages sent to the
client and not yet completely acknowledged (in flight), QoS 1/2 messages pending transmission
(queued), QoS 2 packet identifiers received from the client and not yet completely acknowledged,
the will message and the session-expiry timer. This module is data only: the logic that changes
it is in ``broker.core.sessions`` (life cycle), ``broker.core.outbound`` (queue and in flight)
and ``broker.core.client`` (one connection).

The value types a session is made of - the broker's internal :class:`Message`,
:class:`SubOptions`, :class:`OutEntry` and the :class:`SessionSnapshot` used to hand a session to
another broker of the cluster - are defined in ``broker.core.messages`` (a leaf, below the ports)
and re-exported here.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from broker.core.messages import (
    STATE_PUBLISH_SENT,
    STATE_PUBREL_SENT,
    STATE_QUEUED,
    Message,
    OutEntry,
    SessionSnapshot,
    SubOptions,
)
from broker.mqtt.packets import Will

if TYPE_CHECKING:
    from broker.core.ports import ClientPort, TimerHandle

# the value types live in broker.core.messages (below the ports); this is their historical path
__all__ = [
    "STATE_PUBLISH_SENT",
    "STATE_PUBREL_SENT",
    "STATE_QUEUED",
    "Message",
    "OutEntry",
    "Session",
    "SessionSnapshot",
    "SubOptions",
]


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
