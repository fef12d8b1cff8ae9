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
from typing import TYPE_CHECKING, NoReturn

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

# What an idle session holds instead of an empty queue / QoS 2 id set: an empty ``deque``
# allocates a 64-slot block up front (0.76 KiB) and an empty ``set`` 0.2 KiB, per session. Readers
# (``len``, truth, iteration, ``in``) see no difference; writers take the real container from
# ``Session.queue_to_fill`` / ``Session.incoming_qos2_to_fill``, which create it on first use.
NO_ENTRIES: tuple[()] = ()
NO_PACKET_IDS: frozenset[int] = frozenset()


class _NoInflight(dict):
    """The in-flight dict of a session that has sent no QoS>0 message yet: one shared, empty
    and read-only instance. Reads are a dict's own (no property on the publish path); a write
    raises instead of reaching every session (writers go through ``Session.allocate_packet_id``
    or ``Session.inflight_to_fill``, which put a dict of the session's own in its place)."""

    __slots__ = ()

    def _refuse(self, *_args: object, **_kwargs: object) -> NoReturn:
        raise TypeError("NO_INFLIGHT is shared and read-only: Session.inflight_to_fill() first")

    __setitem__ = __delitem__ = pop = popitem = clear = update = setdefault = __ior__ = _refuse


NO_INFLIGHT: dict[int, OutEntry] = _NoInflight()

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
        "overdraft",
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
        self.queue: deque[OutEntry] | tuple[()] = NO_ENTRIES  # QoS>0 messages waiting to be sent
        # QoS>0 messages sent and not yet acknowledged, by packet id: NO_INFLIGHT (shared,
        # read-only) until the first packet id is allocated (``allocate_packet_id``) or an entry
        # restored (``inflight_to_fill``): 64 bytes less per idle session
        self.inflight: dict[int, OutEntry] = NO_INFLIGHT
        self.incoming_qos2: set[int] | frozenset[int] = NO_PACKET_IDS
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
        # messages the queue may hold beyond the queue limit: another session of the same client,
        # merged in (a session handed over late by another broker of the cluster), is the
        # cluster's backlog, not this client's falling behind (so is a catch-up's); it follows the
        # queue down once the queue has drained below it (``Outbound.allow_backlog``, ``pump``)
        self.overdraft = 0

    def inflight_to_fill(self) -> dict[int, OutEntry]:
        """The in-flight dict, to add to (created on first use)."""
        inflight = self.inflight
        if inflight is NO_INFLIGHT:
            inflight = self.inflight = {}
        return inflight

    def clear_inflight(self) -> None:
        if self.inflight is not NO_INFLIGHT:
            self.inflight.clear()

    def queue_to_fill(self) -> deque[OutEntry]:
        """The session's queue, to append to (created on the first queued message)."""
        queue = self.queue
        if isinstance(queue, deque):
            return queue
        created: deque[OutEntry] = deque()
        self.queue = created
        return created

    def set_queue(self, entries: list[OutEntry]) -> None:
        """Replace the queue with ``entries`` (none: back to no queue at all)."""
        self.queue = deque(entries) if entries else NO_ENTRIES

    def incoming_qos2_to_fill(self) -> set[int]:
        """The QoS 2 ids received and not yet released, to change (created on first use)."""
        ids = self.incoming_qos2
        if isinstance(ids, set):
            return ids
        created: set[int] = set()
        self.incoming_qos2 = created
        return created

    def set_incoming_qos2(self, packet_ids: set[int] | frozenset[int]) -> None:
        self.incoming_qos2 = set(packet_ids) if packet_ids else NO_PACKET_IDS

    def allocate_packet_id(self) -> int:
        """Next free packet identifier (1..65535) not used by an in-flight message. The caller
        puts the message in ``inflight`` under it: the session's first one makes the dict."""
        packet_id = self.next_packet_id
        inflight = self.inflight
        if inflight is NO_INFLIGHT:
            self.inflight = {}
            self.next_packet_id = packet_id + 1 if packet_id < 65535 else 1
            return packet_id
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
