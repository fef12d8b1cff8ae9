"""Durability: the core's side of the store port, and the group commit (seed 001 §4.1).

Every persistent-session change goes through :class:`Durability`, which writes it into the open
store transaction; the group commit (:meth:`Durability.after_batch`, once per event-loop
iteration) makes the whole iteration durable and only then releases the acknowledgements that
depend on it (PUBACK/PUBREC of messages queued for persistent sessions, SUBACKs of persistent
sessions). A failed commit is survived: memory still holds every routed message, so the store
is rewritten from memory (:meth:`Durability.resync`) and committed again; only if that fails too
are the waiting connections closed without their acknowledgements (their clients re-send).

Where the store can run its COMMIT on a thread of its own (``StorePort.commit_in_background``,
the SQLite store in a broker process), the group commit does so: the event loop goes on serving
every client while the COMMIT waits on the disk, and the acknowledgements held for it leave when
it returned - only the ones held when it started (a connection's later ones wait for the next
commit, in order). One COMMIT is in flight at a time; what arrives meanwhile forms the next group.
A failed background COMMIT is retried once on the loop after the rewrite from memory, as above.

A new QoS 2 PUBLISH to a persistent session is held the same way until the commit that records
its packet id (:meth:`Durability.write_after_commit`, MQTT-4.3.3: a crash must not let it go out
again under another packet id).

A commit that nothing waits for and that carries only the deletions of acknowledged deliveries
and the packet ids of QoS 1 deliveries (``ack``, ``set_inflight`` at QoS 1) is put off by
``lazy_commit_s`` (a broker without a cluster or federation: 5 ms) and usually rides with the next
publish's commit: a subscriber's PUBACK no longer costs a COMMIT of its own. What a crash inside
that window can undo is the broker's record that a QoS 1 message was delivered and acknowledged:
it is delivered again (with MQTT's at-least-once, as any un-acknowledged delivery is). Every other
write (a queued message, a session, a subscription, a will, a QoS 2 state, a retained message)
and every held acknowledgement still commits at the end of the loop iteration.

Queued messages carry per-session sequence numbers and are deleted only when acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.core.records import StoredMessage, StoredSubscription
from broker.core.session import Message, OutEntry, Session, SubOptions
from broker.mqtt import codec
from broker.mqtt.packets import MQTT_5, Publish, Will
from broker.mqtt.retained import RetainedIndex

if TYPE_CHECKING:
    from broker.core.ports import ClientPort, Scheduler, StorePort

LogEvent = Callable[..., None]


class Durability:
    """Writes persistent state through the store port and runs the group commit."""

    __slots__ = (
        "_commit_failed_last",
        "_commit_scheduled",
        "_commit_waiters",
        "_lazy_handle",
        "_log_event",
        "_resync_needed",
        "_retained",
        "_retried",
        "_running",
        "_scheduler",
        "_sessions",
        "_store_errors",
        "_urgent",
        "lazy_commit_s",
        "store",
    )

    def __init__(
        self,
        store: StorePort | None,
        scheduler: Scheduler,
        *,
        sessions: dict[str, Session],
        retained: RetainedIndex[Message],
        log_event: LogEvent,
        store_errors: dict[str, int] | None = None,
    ) -> None:
        self.store = store
        # BrokerStats.store_errors (kind -> count, exported as skipmq_store_errors_total)
        self._store_errors = store_errors if store_errors is not None else {}
        self._scheduler = scheduler
        self._sessions = sessions
        self._retained = retained
        self._log_event = log_event
        self._commit_scheduled = False
        # connections holding acknowledgements for the next commit (a dict: an ordered set)
        self._commit_waiters: dict[ClientPort, None] = {}
        # the COMMIT in flight in the background: its waiters, each with how many held acks it covers
        self._running: list[tuple[ClientPort, int]] | None = None
        self._retried = False  # the next commit is the retry of a failed background COMMIT
        self._resync_needed = False  # a commit failed: rewrite the store from memory first
        self._commit_failed_last = False
        # > 0: a commit of only lazy writes (see the module doc) waits this long for company
        self.lazy_commit_s = 0.0
        self._lazy_handle: Any = None
        # a write other than the lazy ones since the last COMMIT started (True until the first)
        self._urgent = True

    # ================================================================== group commit
    def pending(self) -> bool:
        """Whether the store holds uncommitted work an acknowledgement must wait for (lazy writes
        alone, see the module doc, hold nothing back)."""
        store = self.store
        return store is not None and store.pending and (self._urgent or not self.lazy_commit_s)

    def defer_until_commit(self, conn: ClientPort) -> None:
        self._commit_waiters[conn] = None
        self.after_batch()

    def after_batch(self) -> None:
        """Schedule the group commit for the end of this loop iteration if the store has work
        (in ``lazy_commit_s`` if that work is only lazy writes and nothing waits for it)."""
        store = self.store
        if self._commit_scheduled or store is None:
            return
        pending = store.pending
        if self._commit_waiters or (pending and (self._urgent or not self.lazy_commit_s)):
            self._commit_scheduled = True
            self._scheduler.call_soon(self.flush_commit)
        elif pending and self._lazy_handle is None:
            self._lazy_handle = self._scheduler.call_later(self.lazy_commit_s, self._lazy_commit)

    def _lazy_commit(self) -> None:
        self._lazy_handle = None
        if not self._commit_scheduled:
            self.flush_commit()

    def commit_now(self) -> bool:
        """Run the group commit at once, on this thread (after the one in flight in the
        background, if any); False if it failed (its waiters were closed)."""
        self._wait_background()
        self._flush(background=False)
        return not self._commit_failed_last

    def flush_commit(self) -> None:
        """Make the open transaction durable, then release the held acknowledgements."""
        self._flush(background=True)

    def _flush(self, *, background: bool) -> None:
        self._commit_scheduled = False
        if self._running is not None:
            return  # the COMMIT in flight calls back, then the next group commits
        lazy = self._lazy_handle
        if lazy is not None:  # this commit carries the lazy writes too
            self._lazy_handle = None
            lazy.cancel()
        self._urgent = False
        waiters = self._commit_waiters
        self._commit_waiters = {}
        store = self.store
        if background and store is not None and not self._resync_needed and store.pending:
            try:
                started = store.commit_in_background(self._background_done)
            except Exception as exc:
                started = False
                self._commit_error(exc)
            if started:
                self._running = [(conn, conn.deferred_count()) for conn in waiters]
                return
        retry = self._retried  # a failed background COMMIT was the first attempt: one more only
        self._retried = False
        if store is not None and not (self._try_commit() or (not retry and self._try_commit())):
            for conn in waiters:
                conn.drop_deferred()
            self.after_batch()
            return
        for conn in waiters:
            conn.flush_deferred()

    def _background_done(self, error: BaseException | None) -> None:
        """The background COMMIT returned (on the loop): release what it covered, or retry."""
        running = self._running or []
        self._running = None
        if error is None:
            self._commit_failed_last = False
            for conn, count in running:
                conn.flush_deferred(count)
        else:
            self._commit_error(error)
            # retried on the loop after the rewrite from memory; its acks wait for that commit
            waiters = {conn: None for conn, _count in running}
            waiters.update(self._commit_waiters)
            self._commit_waiters = waiters
            self._retried = True
        self.after_batch()

    def _wait_background(self) -> None:
        store = self.store
        if self._running is not None and store is not None:
            store.wait_background_commit()  # calls _background_done

    def _commit_error(self, exc: BaseException) -> None:
        self._urgent = True
        self._commit_failed_last = True
        self._resync_needed = True
        self._count_error("commit")
        self._log_event(logging.ERROR, "store_commit_failed", message=str(exc))

    def is_store_error(self, exc: BaseException) -> bool:
        store = self.store
        return store is not None and isinstance(exc, store.errors)

    def store_failed(self, exc: BaseException) -> None:
        """A store call raised while handling a packet: SQLite may have rolled back the whole open
        transaction (SQLITE_FULL, SQLITE_IOERR), so the store is rewritten from memory before the
        next commit, and acks held for that commit wait for it."""
        self._count_error("operation")
        self._log_event(logging.ERROR, "store_error", message=str(exc))
        self._urgent = True
        self._resync_needed = True
        self._resync_now()
        self.after_batch()

    def close(self) -> None:
        if self.store is not None:
            self._wait_background()
            self._flush(background=False)
            self.store.close()
            self.store = None

    def _try_commit(self) -> bool:
        store = self.store
        assert store is not None
        try:
            if self._resync_needed:
                self.resync()
                self._resync_needed = False
            store.commit()
        except Exception as exc:
            self._urgent = True
            self._commit_failed_last = True
            self._resync_needed = True  # memory is the truth: rewrite it before committing
            self._count_error("commit")
            self._log_event(logging.ERROR, "store_commit_failed", message=str(exc))
            self._resync_now()
            return False
        self._commit_failed_last = False
        return True

    def _resync_now(self) -> None:
        """Rewrite the store from memory now, so the sequence numbers memory holds are valid again
        for the next store calls (set_inflight, ack); on failure it is retried before the commit."""
        try:
            self.resync()
            self._resync_needed = False
        except Exception as exc:
            self._count_error("resync")
            self._log_event(logging.ERROR, "store_resync_failed", message=str(exc))

    def _count_error(self, kind: str) -> None:
        errors = self._store_errors
        errors[kind] = errors.get(kind, 0) + 1

    def resync(self) -> None:
        """Rewrite the durable state from memory after a failed (rolled back) commit.

        The rolled-back transaction took queued messages, in-flight states, incoming QoS 2 ids,
        subscriptions, wills and retained changes with it while memory kept them (and their
        sequence numbers). The next commit must make the store match memory again, otherwise an
        acknowledgement sent later (say, a PUBREC for a re-sent QoS 2 PUBLISH that memory knows)
        could cover a message that is not on disk. Idempotent, so a failed attempt is retried.
        """
        store = self.store
        assert store is not None
        sessions = self._sessions
        for record in store.load_sessions():
            session = sessions.get(record.client_id)
            if session is None or not session.persistent:
                store.delete_session(record.client_id)
        for session in sessions.values():
            if not session.persistent:
                continue
            store.delete_session(session.client_id)
            self.save_session(session)
            self.save_contents(session)
            if session.will is not None:
                store.set_will(session.client_id, encode_will(session.will), session.will_fire_at)
        retained = self._retained
        for stored_message in store.load_retained():
            if stored_message.topic not in retained:
                store.delete_retained(stored_message.topic)
        for topic in list(retained.topics()):
            message = retained.get(topic)
            if message is not None and not topic.startswith("$SYS"):
                store.set_retained(topic, stored(message))

    # ================================================================== sessions
    def save_session(self, session: Session) -> None:
        """The one upsert of a persistent session's record (disconnected_at None while connected)."""
        self._urgent = True
        store = self.store
        if store is None or not session.persistent:
            return
        store.upsert_session(
            session.client_id,
            protocol_level=session.protocol_level,
            expiry_interval_s=session.expiry_interval_s,
            username=session.username,
            disconnected_at=None if session.connection is not None else session.disconnected_at,
        )

    def save_contents(self, session: Session) -> None:
        """Write a session's subscriptions, queue, in-flight states and QoS 2 ids (it just became
        persistent, or arrived from another broker, or the store is being rewritten)."""
        self._urgent = True
        store = self.store
        assert store is not None
        client_id = session.client_id
        for opts in session.subscriptions.values():
            store.add_subscription(client_id, stored_subscription(opts))
        for entry in session.pending_entries():
            entry.seq = store.enqueue(client_id, stored(entry.message), entry.subscription_identifiers)
            if entry.packet_id is not None:
                store.set_inflight(client_id, entry.seq, entry.packet_id, entry.state)
        for packet_id in session.incoming_qos2:
            store.add_incoming_qos2(client_id, packet_id)

    def make_persistent(self, session: Session, persistent: bool) -> None:
        """Start or stop keeping ``session`` in the store (its expiry interval changed)."""
        self._urgent = True
        was = session.persistent
        session.persistent = persistent and self.store is not None
        if session.persistent:
            self.save_session(session)
            if not was:
                self.save_contents(session)
        elif was and self.store is not None:
            self.store.delete_session(session.client_id)
            for entry in session.pending_entries():
                entry.seq = None

    def delete_session(self, session: Session) -> None:
        self._urgent = True
        store = self.store
        if store is not None and session.persistent:
            store.delete_session(session.client_id)
            store.set_will(session.client_id, None, None)

    def add_subscription(self, session: Session, opts: SubOptions) -> None:
        self._urgent = True
        if session.persistent and self.store is not None:
            self.store.add_subscription(session.client_id, stored_subscription(opts))

    def remove_subscription(self, session: Session, topic_filter: str) -> None:
        self._urgent = True
        if session.persistent and self.store is not None:
            self.store.remove_subscription(session.client_id, topic_filter)

    def set_will(self, session: Session, will: Will | None, fire_at: float | None = None) -> None:
        self._urgent = True
        if session.persistent and self.store is not None:
            self.store.set_will(session.client_id, encode_will(will) if will is not None else None, fire_at)

    def add_incoming_qos2(self, session: Session, packet_id: int) -> None:
        self._urgent = True
        if session.persistent and self.store is not None:
            self.store.add_incoming_qos2(session.client_id, packet_id)

    def remove_incoming_qos2(self, session: Session, packet_id: int) -> None:
        self._urgent = True
        if session.persistent and self.store is not None:
            self.store.remove_incoming_qos2(session.client_id, packet_id)

    # ================================================================== queues
    def enqueue(self, session: Session, entry: OutEntry) -> None:
        """Give ``entry`` its store sequence number (persistent sessions only)."""
        self._urgent = True
        if session.persistent and self.store is not None:
            entry.seq = self.store.enqueue(
                session.client_id, stored(entry.message), entry.subscription_identifiers
            )

    def set_inflight(self, session: Session, entry: OutEntry) -> None:
        if entry.qos != 1:  # a QoS 2 state is what stops a second delivery: never lazy
            self._urgent = True
        if entry.seq is not None and session.persistent and self.store is not None:
            self.store.set_inflight(session.client_id, entry.seq, entry.packet_id, entry.state)

    def write_after_commit(self, conn: ClientPort, data: bytes) -> None:
        """Send ``data`` (a new QoS 2 PUBLISH, broker.core.outbound) once the commit that carries
        its ``set_inflight`` has returned: held with the connection's acknowledgements, in order,
        and released with them (``flush_deferred``; a failed commit closes the connection and the
        client gets the message again, DUP=1, when it resumes the session)."""
        deferred = conn.deferred
        if deferred is not None:
            deferred.append(data)
        elif self.pending():
            conn.deferred = [data]
        else:
            conn.write(data)
            return
        self.defer_until_commit(conn)

    def ack(self, session: Session, entry: OutEntry) -> None:
        """The entry is complete (or dropped): delete it from the store."""
        if entry.seq is not None and session.persistent and self.store is not None:
            self.store.ack(session.client_id, entry.seq)

    # ================================================================== retained
    def set_retained(self, message: Message) -> None:
        self._urgent = True
        if self.store is not None and not message.topic.startswith("$SYS"):
            self.store.set_retained(message.topic, stored(message))

    def delete_retained(self, topic: str) -> None:
        self._urgent = True
        if self.store is not None and not topic.startswith("$SYS"):
            self.store.delete_retained(topic)


# ====================================================================== conversions
def stored(message: Message) -> StoredMessage:
    return StoredMessage(
        message.topic,
        message.payload,
        message.qos,
        message.retain,
        message.properties,
        message.expiry_at,
        message.origin,
    )


def message_from(record: StoredMessage) -> Message:
    return Message(
        record.topic,
        record.payload,
        record.qos,
        record.retain,
        dict(record.properties or {}),
        record.expiry_at,
        record.origin,
        None,
    )


def stored_subscription(opts: SubOptions) -> StoredSubscription:
    return StoredSubscription(
        opts.topic_filter,
        opts.qos,
        opts.no_local,
        opts.retain_as_published,
        opts.retain_handling,
        opts.subscription_identifier,
    )


def encode_will(will: Will) -> bytes:
    """Wills are stored as an MQTT 5 PUBLISH (lossless for payload and properties) plus its delay."""
    props: dict[str, Any] = {k: v for k, v in will.properties.items() if k != "will_delay_interval"}
    delay = int(will.properties.get("will_delay_interval", 0))
    body = codec.encode_publish(
        will.topic, will.payload, will.qos, will.retain, False, 1 if will.qos else None, props or None, MQTT_5
    )
    return delay.to_bytes(4, "big") + body


def decode_will(data: bytes) -> Will:
    delay = int.from_bytes(data[:4], "big")
    decoder = codec.Decoder(role="client", protocol_level=MQTT_5)
    packets = decoder.feed(data[4:])
    publish = packets[0]
    assert isinstance(publish, Publish)
    props = dict(publish.properties)
    if delay:
        props["will_delay_interval"] = delay
    return Will(publish.topic, publish.payload, publish.qos, publish.retain, props)
