"""The broker core's ports: every interface between the core and what drives or surrounds it.

The core (``broker.core``) does no I/O of its own. It is driven through :class:`BrokerApi` (by
the listeners, the HTTP endpoint, the cluster engine and later the pull gateway) and it reaches
the outside only through the ports it is given:

* :class:`Scheduler` - time and deferred calls (the asyncio loop in a broker process, the
  simulator's event queue in ``simulation``);
* :class:`ClientTransport` - the byte stream of one client (TCP, TLS, WebSocket, simulated);
* :class:`StorePort` - durable state (SQLite in ``broker.adapters.sqlite_store``);
* :class:`AuthPort` / :class:`AclPort` - password check and topic permissions;
* :class:`ClusterPort` - the cluster engine (``broker.cluster.engine``) or :class:`NullCluster`.

What the core needs from one client connection is :class:`ClientPort`, what its adapter drives
is :class:`ClientHandler` (both implemented by ``broker.core.client.ClientConnection``). Results
travel as values: a publish returns a :class:`PublishResult`; work the cluster has to finish first
is a :class:`Completion`, a one-shot result holder that needs no event loop (the core's equivalent
of an asyncio future).

This module names no module of ``broker.core`` but the leaves ``records`` and ``messages``: every
other part imports it, and the import graph of ``broker.core`` (type references included) stays
acyclic.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from broker.core.records import QueueEntry, SessionRecord, StoredMessage, StoredSubscription

if TYPE_CHECKING:
    from broker.core.messages import Message, SessionSnapshot

T = TypeVar("T")

__all__ = [
    "AclPort",
    "AuthPort",
    "BrokerApi",
    "ClientHandler",
    "ClientPort",
    "ClientTransport",
    "ClusterPort",
    "Completion",
    "NullCluster",
    "PublishResult",
    "Scheduler",
    "StorePort",
    "TimerHandle",
]


class Completion(Generic[T]):
    """A one-shot result (or exception) with done-callbacks; no event loop involved.

    Callbacks run synchronously inside :meth:`set_result` / :meth:`set_exception`, or at once in
    :meth:`add_done_callback` when the result is already there. Whoever resolves a completion
    does so from a point where the callbacks may re-enter the core (the cluster engine resolves
    them from a scheduled call, never from inside the overlay's ``handle``).
    """

    __slots__ = ("_callbacks", "_done", "_exception", "_result")

    def __init__(self) -> None:
        self._done = False
        self._result: Any = None
        self._exception: BaseException | None = None
        self._callbacks: list[Callable[[Completion[T]], object]] = []

    def done(self) -> bool:
        return self._done

    def result(self) -> T:
        if not self._done:
            raise RuntimeError("result() of a completion that is not done")
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self) -> BaseException | None:
        if not self._done:
            raise RuntimeError("exception() of a completion that is not done")
        return self._exception

    def set_result(self, value: T) -> None:
        if self._done:
            raise RuntimeError("completion already done")
        self._done = True
        self._result = value
        self._run_callbacks()

    def set_exception(self, exc: BaseException) -> None:
        if self._done:
            raise RuntimeError("completion already done")
        self._done = True
        self._exception = exc
        self._run_callbacks()

    def add_done_callback(self, callback: Callable[[Completion[T]], object]) -> None:
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def _run_callbacks(self) -> None:
        callbacks = self._callbacks
        self._callbacks = []
        for callback in callbacks:
            callback(self)


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """Time and deferred calls. ``time()`` is monotonic seconds (the loop clock, used for
    keep-alive and cluster timers), ``wall_time()`` seconds since the epoch (message expiry,
    session records, retained versions). ``call_soon`` callbacks run after the current event, in
    order. ``run_blocking`` runs ``func`` where it may block (a worker thread in a broker) and
    resolves the completion back on the core's thread."""

    def time(self) -> float: ...

    def wall_time(self) -> float: ...

    def call_soon(self, callback: Callable[..., object], *args: Any) -> object: ...

    def call_later(self, delay_s: float, callback: Callable[..., object], *args: Any) -> TimerHandle: ...

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> TimerHandle: ...

    def run_blocking(self, func: Callable[[], T]) -> Completion[T]: ...


class ClientTransport(Protocol):
    """The byte stream of one client: what TCP, TLS, WebSocket and simulated sockets provide."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...

    def get_write_buffer_size(self) -> int: ...


class ClientPort(Protocol):
    """What the core needs from the connection of a connected client.

    ``out`` is the connection's pending output of this event-loop iteration (None when empty):
    the fan-out path appends encoded packets to it directly and the core flushes every dirty
    connection once per iteration (``Broker.flush_writes``).
    """

    client_id: str
    username: str | None
    transport: ClientTransport

    @property
    def peer(self) -> str: ...

    out: list[bytes] | None
    # output held for the next group commit (acknowledgements, new QoS 2 PUBLISHes; None: none)
    deferred: list[bytes] | None

    def write(self, data: bytes) -> None: ...

    def flush(self) -> None: ...

    def disconnect(
        self, reason_code: int, reason_string: str | None = None, *, fire_will: bool = True
    ) -> None:
        """Server-initiated close (v5: DISCONNECT with the reason code first)."""

    def close(self, *, fire_will: bool = True) -> None: ...

    def flush_deferred(self, count: int | None = None) -> None:
        """The group commit ran: send the acknowledgements that waited for it (the first
        ``count`` held ones when given: those held when a background commit started)."""

    def deferred_count(self) -> int:
        """How many acknowledgements are held for a group commit now."""

    def drop_deferred(self) -> None:
        """The group commit failed: forget the acknowledgements that waited for it, close."""

    def check_timeouts(self, now: float, connect_timeout_s: float) -> None:
        """CONNECT timeout and keep alive (1.5 x keep alive, MQTT-3.1.2-24) at ``now``."""


class ClientHandler(ClientPort, Protocol):
    """A client connection as its adapter drives it (what ``BrokerApi.new_client`` returns,
    implemented by ``broker.core.client.ClientConnection``): bytes in, the end of the stream."""

    def receive(self, data: bytes) -> None: ...

    def lost(self) -> None: ...


class StorePort(Protocol):
    """Durable state with group commit: every call joins the open transaction, ``commit`` ends it.
    ``errors`` lists the exception types a failing store raises (the core then resynchronises)."""

    errors: tuple[type[BaseException], ...]

    @property
    def pending(self) -> bool: ...

    def commit(self) -> None: ...

    def commit_in_background(self, done: Callable[[BaseException | None], None]) -> bool:
        """Start the commit where it may block (a thread of the store's); ``done(error)`` runs on
        the core's thread when it returned. False when this store cannot (then ``commit``)."""

    def wait_background_commit(self) -> None:
        """Block until a commit started by ``commit_in_background`` returned; runs its ``done``."""

    def close(self) -> None: ...

    def upsert_session(
        self,
        client_id: str,
        *,
        protocol_level: int,
        expiry_interval_s: int,
        username: str | None,
        disconnected_at: float | None,
    ) -> None: ...

    def delete_session(self, client_id: str) -> None: ...

    def load_sessions(self) -> list[SessionRecord]: ...

    def add_subscription(self, client_id: str, sub: StoredSubscription) -> None: ...

    def remove_subscription(self, client_id: str, topic_filter: str) -> None: ...

    def enqueue(
        self, client_id: str, message: StoredMessage, subscription_identifiers: list[int] | None = None
    ) -> int: ...

    def set_inflight(self, client_id: str, seq: int, packet_id: int | None, state: int) -> None: ...

    def ack(self, client_id: str, seq: int) -> None: ...

    def load_queue(self, client_id: str, limit: int | None = None) -> list[QueueEntry]: ...

    def queue_depth(self, client_id: str) -> int: ...

    def add_incoming_qos2(self, client_id: str, packet_id: int) -> None: ...

    def remove_incoming_qos2(self, client_id: str, packet_id: int) -> None: ...

    def set_retained(self, topic: str, message: StoredMessage) -> None: ...

    def delete_retained(self, topic: str) -> None: ...

    def load_retained(self) -> list[StoredMessage]: ...

    def set_will(self, client_id: str, will: bytes | None, fire_at: float | None) -> None: ...

    def load_wills(self) -> list[tuple[str, bytes, float | None]]: ...


class AuthPort(Protocol):
    def needs_password_check(self, username: str | None) -> bool:
        """Whether ``authenticate`` hashes a password (slow: run it with ``run_blocking``)."""

    def authenticate(self, username: str | None, password: bytes | None) -> int:
        """A CONNACK reason code: 0 accepted, otherwise why not."""

    def reload(self) -> None: ...


class AclPort(Protocol):
    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool: ...

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool: ...

    def can_receive(self, client_id: str, username: str | None, topic: str) -> bool: ...


class ClusterPort(Protocol):
    """What the core tells the cluster (all calls on the core's thread; none may block)."""

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        """A local client subscribed (or replaced a subscription); topic_filter excludes $share/group."""

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        """A local subscription ended (UNSUBSCRIBE, or the session ended)."""

    def on_publish(self, message: Message, from_client_id: str | None) -> Completion[bool] | None:
        """A message was accepted locally (after local routing, before the publisher's ack). A
        returned completion holds the publisher's PUBACK/PUBREC (QoS 1/2) until it is done."""

    def before_attach(
        self, client_id: str, clean_start: bool, username: str | None = None
    ) -> Completion[SessionSnapshot | None] | None:
        """A CONNECT for ``client_id`` by user ``username`` is about to attach its session. A
        returned completion holds the CONNACK until it is done; a snapshot it yields is imported
        first (session moved here); a ``PermissionError`` it fails with refuses the CONNECT
        (another broker holds the client id's session for another user)."""

    def owns_share_group(self, group: str, topic_filter: str) -> bool:
        """Whether this broker delivers the copy of share group (group, filter) (one per cluster)."""

    def subscriptions_ready(
        self, topic_filters: list[tuple[str, str | None]], client_id: str | None = None
    ) -> Completion[bool] | None:
        """A completion done once messages published anywhere reach these (filter, share group)
        subscriptions (their classes joined the overlay); None when they already do. It holds the
        SUBACK, and the CONNACK of a session that moved here. ``client_id``: the persistent session
        whose SUBACK it holds (with replicas, until its state is on N brokers too); with no filters,
        a persistent session's UNSUBACK (its state without them on N brokers)."""

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        """A client finished CONNECT successfully: its CONNACK and the re-sends of its session's
        unacknowledged messages are out (what the cluster delivers now comes after them)."""

    def on_client_disconnected(self, client_id: str) -> None:
        """A client's network connection ended (its session may live on)."""


class NullCluster:
    """The cluster port of a stand-alone broker: every event is ignored."""

    __slots__ = ()

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        return None

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        return None

    def on_publish(self, message: Message, from_client_id: str | None) -> Completion[bool] | None:
        return None

    def before_attach(
        self, client_id: str, clean_start: bool, username: str | None = None
    ) -> Completion[SessionSnapshot | None] | None:
        return None

    def owns_share_group(self, group: str, topic_filter: str) -> bool:
        return True

    def subscriptions_ready(
        self, topic_filters: list[tuple[str, str | None]], client_id: str | None = None
    ) -> Completion[bool] | None:
        return None

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        return None

    def on_client_disconnected(self, client_id: str) -> None:
        return None


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What accepting a publish did. ``matched``: some local subscription matched the topic (even if
    its copy was then dropped: queue full, ACL, too large, expired, slow consumer). ``wait``: the
    cluster's confirmation that the publisher's PUBACK/PUBREC must wait for, or None."""

    matched: bool
    wait: Completion[bool] | None = None


MATCHED = PublishResult(True)
UNMATCHED = PublishResult(False)


class BrokerApi(Protocol):
    """The core as its adapters see it (listeners, HTTP endpoint, cluster engine, gateway)."""

    node_id: str

    # ---------------------------------------------------------------- listeners
    def new_client(
        self,
        transport: ClientTransport,
        listener: str = "tcp",
        *,
        peer: str | None = "",
        cert_username: str | None = None,
    ) -> ClientHandler | None:
        """A handler for a new client socket of ``listener`` ("tcp", "tls", "websocket", ...);
        None (and the transport closed) when the broker refuses more sockets. ``peer`` None: the
        transport's ``get_extra_info("peername")``, asked when needed."""

    # ---------------------------------------------------------------- cluster engine
    def deliver_remote(
        self,
        message: Message,
        accept_filter: Callable[[str], bool] | None = None,
        only_client: str | None = None,
        except_clients: Collection[str] = (),
        memo: dict[str, list[Any]] | None = None,
    ) -> bool:
        """Deliver a message another broker accepted to local subscribers (whose filter
        ``accept_filter`` accepts; only ``only_client``'s when given; none of ``except_clients``');
        True when some local subscription matched. ``memo`` (topic -> matches) is the caller's, for
        the messages of one batch with the same ``accept_filter`` and no client restriction."""

    def queue_depth(self, client_id: str) -> tuple[int, int] | None:
        """(messages queued for ``client_id`` beyond its in-flight window, the queue limit); None
        without a session (the cluster's flow control of catch-up)."""

    def allow_backlog(self, client_id: str, count: int) -> None:
        """``count`` messages the cluster kept for ``client_id``'s session while it moved (this
        broker's own send log since the old broker's position) are about to be queued into it: the
        queue may exceed its limit by them, as by a merged session's queue; the allowance follows the
        queue down once the client has drained below it (docs/cluster.md "Merging two sessions")."""

    def count_backlog_apart(self, client_id: str, backlog: int, held: bool) -> None:
        """``backlog`` messages of what ``client_id``'s queue holds and of what is to enter it are
        the cluster's backlog (a catch-up paced into the queue, or set to enter it unpaced): the
        queue limit applies beyond them (``Outbound.allow_backlog``); ``held``: some of it is on
        its way, the allowance stands until ``backlog_in``."""

    def backlog_in(self, client_id: str) -> None:
        """The backlog announced with ``count_backlog_apart(held=True)`` is in the queue: the
        allowance follows the queue down once it has drained below it."""

    def set_retained(self, message: Message) -> None:
        """Store (or, with an empty payload, delete) a retained message without routing it."""

    def retained_messages(self) -> Iterable[Message]: ...

    def has_retained(self, topic: str) -> bool: ...

    def has_session(self, client_id: str) -> bool: ...

    def owned_by_other(self, client_id: str, username: str | None) -> bool:
        """Whether ``client_id`` has a session here that belongs to a user other than
        ``username`` (sessions are bound to their owner: docs/security.md)."""
        ...

    def client_connected(self, client_id: str) -> bool: ...

    def hand_over(self, client_id: str, *, transfer: bool) -> tuple[bool, SessionSnapshot | None]:
        """Another broker got a CONNECT for ``client_id``: disconnect it here and end the session;
        (whether this broker had the client, its snapshot when ``transfer``)."""

    def import_session(self, snapshot: SessionSnapshot) -> None: ...

    def receive_late_session(self, snapshot: SessionSnapshot, *, adopted: bool = False) -> None:
        """A session handed over after its client's CONNECT stopped waiting: keep its messages."""

    def kick(self, client_id: str, reason_code: int) -> bool: ...

    def store_pending(self) -> bool: ...

    def commit_now(self) -> bool: ...

    def after_batch(self) -> None: ...

    def log_event(self, level: int, event: str, **fields: Any) -> None: ...
