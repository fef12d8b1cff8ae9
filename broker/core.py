"""The broker core: session registry, routing, QoS state, retained, wills, shared subscriptions, $SYS.

Follows MQTT 3.1.1 (OASIS 2014) and MQTT 5.0 (OASIS 2019): §3.1.2.4/§4.1 sessions, §3.3 PUBLISH
routing and QoS (§4.3), §4.4 redelivery, §3.1.2.5/§3.1.3.2 wills (v5 will delay), §3.8 SUBSCRIBE
options, §3.3.1.3 retained messages, §4.8.2 shared subscriptions, §3.3.2.3.4 topic aliases,
§3.3.2.3.3 message expiry. Durability follows seed 001 §4.1: queued messages carry per-session
sequence numbers and are deleted from the store only when acknowledged; publishers are
acknowledged only after the group commit that made their message durable.

The hot path is ``publish -> _route -> _deliver_to``: one trie lookup (cached per topic), one
encoded PUBLISH per distinct (protocol family, retain) reused for every QoS 0 subscriber, plain
int counters, no per-message tasks, logging or prometheus calls. A subscriber whose transport
write buffer is above ``SLOW_CONSUMER_HIGH_WATER_BYTES`` does not receive QoS 0 messages (counted
as ``messages_dropped["slow_consumer"]``); QoS>0 messages wait in its bounded queue instead.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from broker import __version__
from broker.hooks import ClusterHooks, NullHooks
from broker.mqtt import codec
from broker.mqtt.packets import MQTT_5, MQTTProtocolError, Publish, ReasonCode, Subscribe, Will
from broker.mqtt.retained import RetainedIndex
from broker.mqtt.session import (
    STATE_PUBLISH_SENT,
    STATE_PUBREL_SENT,
    STATE_QUEUED,
    Message,
    OutEntry,
    Session,
    SessionSnapshot,
    SubOptions,
)
from broker.mqtt.topics import SubscriptionTrie, TopicError, parse_shared, validate_topic_filter
from broker.store import StoredMessage, StoredSubscription

log = logging.getLogger("skipmq.broker")

SLOW_CONSUMER_HIGH_WATER_BYTES = 4 * 1024 * 1024
SWEEP_INTERVAL_S = 0.5
NEVER_EXPIRES = 0xFFFFFFFF
_NO_IDS: list[int] = []


def _log_event(level: int, event: str, **fields: Any) -> None:
    try:
        from broker.logs import log_event
    except ImportError:  # pragma: no cover - logs.py is always present in a full checkout
        log.log(level, "%s %s", event, fields)
        return
    log_event(log, level, event, **fields)


class Broker:
    """An MQTT broker node. Create it inside a running event loop, then ``start()``."""

    def __init__(
        self,
        config: Any,
        *,
        hooks: ClusterHooks | None = None,
        store: Any = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        from broker.auth import Acl, Authenticator
        from broker.metrics import BrokerStats

        self.config = config
        self.limits = config.limits
        self.loop = loop or asyncio.get_event_loop()
        self.hooks: ClusterHooks = hooks if hooks is not None else NullHooks()
        self.node_id: str = config.node_id or _default_node_id()
        self.stats = BrokerStats()
        self.stats.uptime_started_at = time.time()
        self.max_packet_size: int = self.limits.max_packet_size_bytes
        auth = config.auth
        self.authenticator = Authenticator(
            allow_anonymous=auth.allow_anonymous, password_file=auth.password_file or None
        )
        self.acl: Any = Acl.load(auth.acl_file) if auth.acl_file else None
        tls = config.listeners.tls
        self.tls_identity_as_username: bool = bool(tls.enabled and tls.use_identity_as_username)
        self.store = store
        self.sessions: dict[str, Session] = {}
        self.trie: SubscriptionTrie[str, SubOptions] = SubscriptionTrie()
        self.shared_trie: SubscriptionTrie[tuple[str, str], SubOptions] = SubscriptionTrie()
        self.retained: RetainedIndex[Message] = RetainedIndex()
        self.connections: set[Any] = set()
        self.connected_count = 0
        self.shutting_down = False
        self._share_rr: dict[tuple[str, str], int] = {}
        self._commit_scheduled = False
        self._commit_waiters: list[Any] = []
        self.route_matched = False  # whether the last _route found a matching subscription
        self.cluster_wait: Any = None  # what the cluster hook returned for the last publish
        self._store_resync_needed = False  # a commit failed: rewrite the store from memory first
        self._commit_failed_last = False
        self._dirty: list[Any] = []
        self._flush_scheduled = False
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._sys_handle: asyncio.TimerHandle | None = None
        self._client_counter = 0
        self.connect_timeout_s: float = float(getattr(self.limits, "connect_timeout_s", 10.0))
        self._window_cap: int = self.limits.max_inflight_messages
        self._max_queued: int = self.limits.max_queued_messages
        self._drop_oldest: bool = self.limits.queue_overflow == "drop_oldest"

    # ================================================================== lifecycle
    def start(self) -> None:
        """Load persisted state and start the keep-alive sweep and $SYS timers."""
        if self.store is not None:
            self._load_state()
        self._sweep_handle = self.loop.call_later(SWEEP_INTERVAL_S, self._sweep)
        interval = self.config.sys.interval_s
        if interval > 0:
            self._sys_handle = self.loop.call_later(0, self._publish_sys)

    def disconnect_all(self) -> None:
        """First step of a graceful stop: refuse new CONNECTs, disconnect every client (v5 0x8B),
        publishing their wills (a cluster forwards them before it leaves)."""
        self.shutting_down = True
        for conn in list(self.connections):
            conn.disconnect(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down", fire_will=True)

    async def shutdown(self) -> None:
        """Graceful stop: v5 clients get DISCONNECT 0x8B, everyone is closed, the store committed.

        A server-initiated close is not a client DISCONNECT, so wills are published (MQTT-3.1.2-8,
        v5 §3.1.2.5); wills with a delay on a continuing session are persisted and fire later.
        """
        self.disconnect_all()
        for handle in (self._sweep_handle, self._sys_handle):
            if handle is not None:
                handle.cancel()
        for session in self.sessions.values():
            session.cancel_timers()
        await asyncio.sleep(0.05)  # let transports flush the DISCONNECTs
        if self.store is not None:
            self._flush_commit()
            self.store.close()
            self.store = None

    def reload_auth(self) -> bool:
        """Re-read the password file and the ACL file (SIGHUP); on an error keep the old ones."""
        from broker.auth import Acl

        auth = self.config.auth
        try:
            acl = Acl.load(auth.acl_file) if auth.acl_file else None
            self.authenticator.reload()
        except Exception as exc:
            self.log_event(logging.ERROR, "auth_reload_failed", message=str(exc))
            return False
        self.acl = acl
        self.log_event(logging.INFO, "auth_reloaded")
        return True

    def log_event(self, level: int, event: str, **fields: Any) -> None:
        _log_event(level, event, **fields)

    # ================================================================== connections
    def connection_opened(self, conn: Any) -> bool:
        """Register a new network connection; False (and closed) when too many sockets are still
        waiting for their CONNECT: limits.max_connections lets as many again wait as it allows."""
        limit = self.limits.max_connections
        if limit and len(self.connections) - self.connected_count >= limit:
            return False  # no log line per socket: this is what a connection flood looks like
        self.connections.add(conn)
        return True

    def connection_gone(self, conn: Any) -> None:
        self.connections.discard(conn)

    def at_connection_limit(self, client_id: str | None = None) -> bool:
        """True when a new connection must be refused; a takeover of a connected client id replaces
        a connection instead of adding one, so it is always allowed (MQTT-3.1.4-3)."""
        limit = self.limits.max_connections
        if not limit or self.connected_count < limit:
            return False
        session = self.sessions.get(client_id) if client_id else None
        return session is None or session.connection is None

    def authenticate(self, username: str | None, password: bytes | None, *, tls_identity: bool) -> int:
        if tls_identity:
            return ReasonCode.SUCCESS
        return int(self.authenticator.authenticate(username, password))

    def authentication_is_slow(self, username: str | None, *, tls_identity: bool) -> bool:
        """A password check hashes with scrypt (~40 ms): the connection runs it off the loop."""
        return not tls_identity and self.authenticator.needs_password_check(username)

    def assign_client_id(self) -> str:
        self._client_counter += 1
        return f"skipmq-{uuid.uuid4().hex[:12]}-{self._client_counter}"

    def _session_expiry_for(self, packet: Any) -> tuple[int, bool]:
        if packet.protocol_level == MQTT_5:
            expiry = int(packet.properties.get("session_expiry_interval", 0))
        else:
            expiry = 0 if packet.clean_start else NEVER_EXPIRES
        cap = self.limits.max_session_expiry_s
        if cap and expiry > cap:
            return cap, packet.protocol_level == MQTT_5
        return expiry, False

    def attach_session(self, conn: Any, packet: Any, client_id: str) -> tuple[Session, bool, int, bool]:
        """Bind ``conn`` to the session of ``client_id`` (taking over a connected one).

        Returns (session, session_present, session expiry, whether the expiry was capped).
        """
        existing = self.sessions.get(client_id)
        if existing is not None and existing.connection is not None:
            old = existing.connection
            self.log_event(logging.INFO, "session_taken_over", client_id=client_id, peer=old.peer)
            old.disconnect(ReasonCode.SESSION_TAKEN_OVER, "session taken over", fire_will=True)
            existing = self.sessions.get(client_id)
        expiry, capped = self._session_expiry_for(packet)
        if existing is not None and packet.clean_start:
            self._end_session(existing)
            existing = None
        store = self.store
        if existing is not None:
            session = existing
            present = True
            if session.expiry_handle is not None:
                session.expiry_handle.cancel()
                session.expiry_handle = None
            if session.will_handle is not None:  # reconnected within the will delay: no will
                session.will_handle.cancel()
                session.will_handle = None
            if session.will is not None and session.will_fire_at is not None and store is not None:
                store.set_will(client_id, None, None)
            session.will_fire_at = None
        else:
            session = Session(client_id, packet.protocol_level, conn.username)
            self.sessions[client_id] = session
            present = False
        was_persistent = session.persistent
        session.protocol_level = packet.protocol_level
        session.username = conn.username
        session.expiry_interval_s = expiry
        session.persistent = expiry > 0 and store is not None
        session.will = packet.will
        props = packet.properties
        session.client_receive_maximum = int(props.get("receive_maximum", 65535))
        session.client_max_packet_size = int(props.get("maximum_packet_size", 268_435_455))
        session.client_topic_alias_maximum = int(props.get("topic_alias_maximum", 0))
        session.out_aliases = None
        session.connection = conn
        session.disconnected_at = None
        if store is not None:
            if session.persistent:
                store.upsert_session(
                    client_id,
                    protocol_level=session.protocol_level,
                    expiry_interval_s=expiry,
                    username=session.username,
                    disconnected_at=None,
                )
                if not was_persistent:
                    self._persist_session_contents(session)
                if packet.will is not None or present:
                    # stored while connected too, so a will survives a broker crash (fired on restart)
                    will_bytes = _encode_will(packet.will) if packet.will is not None else None
                    store.set_will(client_id, will_bytes, None)
            elif was_persistent:
                store.delete_session(client_id)
                for entry in self._pending_entries(session):
                    entry.seq = None
        self.connected_count += 1
        self.stats.connections_current = self.connected_count
        self.stats.connections_total += 1
        self.hooks.on_client_connected(client_id, present)
        return session, present, expiry, capped

    def _persist_session_contents(self, session: Session) -> None:
        store = self.store
        assert store is not None
        for opts in session.subscriptions.values():
            store.add_subscription(session.client_id, _stored_subscription(opts))
        for entry in self._pending_entries(session):
            entry.seq = store.enqueue(
                session.client_id, _stored(entry.message), entry.subscription_identifiers
            )
            if entry.packet_id is not None:
                store.set_inflight(session.client_id, entry.seq, entry.packet_id, entry.state)
        for packet_id in session.incoming_qos2:
            store.add_incoming_qos2(session.client_id, packet_id)

    @staticmethod
    def _pending_entries(session: Session) -> list[OutEntry]:
        return [*session.inflight.values(), *session.queue]

    def session_resumed(self, session: Session) -> None:
        """After CONNACK: re-send unacknowledged messages (DUP=1 / PUBREL), then queued ones.

        PUBRELs are always re-sent; unacknowledged PUBLISHes only as far as this connection's
        window allows (the client's Receive Maximum may be smaller now, MQTT-3.3.4-9), the rest
        wait in ``session.unsent`` and go out, in order, as acknowledgements arrive.
        """
        conn = session.connection
        if conn is None:
            return
        session.unsent = None
        window = self._window(session)
        on_wire = 0
        for packet_id, entry in list(session.inflight.items()):
            if entry.state == STATE_PUBREL_SENT:
                conn.write(bytes((0x62, 2, packet_id >> 8, packet_id & 0xFF)))
                on_wire += 1
            elif on_wire >= window:
                if session.unsent is None:
                    session.unsent = deque()
                session.unsent.append(entry)
            elif self._resend(session, entry):
                on_wire += 1
        self._pump(session)

    def _resend(self, session: Session, entry: OutEntry) -> bool:
        """Re-send an unacknowledged PUBLISH with DUP=1 and its original packet id (MQTT-4.4.0-1);
        False if it can no longer be sent (expired / too large: completed as if acknowledged)."""
        packet_id = entry.packet_id
        assert packet_id is not None and session.connection is not None
        data = self._encode_for(
            session, entry.message, entry.qos, entry.retain, True, packet_id, entry.subscription_identifiers
        )
        if data is None:
            del session.inflight[packet_id]
            self._complete(session, entry)
            return False
        session.connection.write(data)
        self.stats.messages_sent[entry.qos] += 1
        return True

    def set_session_expiry(self, session: Session, expiry_s: int) -> None:
        cap = self.limits.max_session_expiry_s
        if cap and expiry_s > cap:
            expiry_s = cap
        session.expiry_interval_s = expiry_s
        store = self.store
        if store is None:
            return
        persistent = expiry_s > 0
        if persistent:
            store.upsert_session(
                session.client_id,
                protocol_level=session.protocol_level,
                expiry_interval_s=expiry_s,
                username=session.username,
                disconnected_at=None,
            )
            if not session.persistent:
                session.persistent = True
                self._persist_session_contents(session)
        elif session.persistent:
            store.delete_session(session.client_id)
            session.persistent = False

    def connection_closed(self, conn: Any, *, fire_will: bool) -> None:
        """The network connection of a connected client ended (any reason)."""
        session = conn.session
        if session is None or session.connection is not conn:
            return
        session.connection = None
        self.connected_count -= 1
        self.stats.connections_current = self.connected_count
        client_id = session.client_id
        self.hooks.on_client_disconnected(client_id)
        store = self.store
        if not fire_will:
            if session.will is not None and session.persistent and store is not None:
                store.set_will(client_id, None, None)
            session.will = None
        if session.expiry_interval_s == 0 or session.ended:
            self._end_session(session)
            self.after_batch()
            return
        now = time.time()
        session.disconnected_at = now
        if session.persistent and store is not None:
            store.upsert_session(
                client_id,
                protocol_level=session.protocol_level,
                expiry_interval_s=session.expiry_interval_s,
                username=session.username,
                disconnected_at=now,
            )
        will = session.will
        if will is not None:
            delay = (
                int(will.properties.get("will_delay_interval", 0)) if session.protocol_level == MQTT_5 else 0
            )
            if session.expiry_interval_s != NEVER_EXPIRES:
                delay = min(delay, session.expiry_interval_s)
            if delay <= 0 or (self.shutting_down and not session.persistent):
                session.will = None
                if session.persistent and store is not None:
                    store.set_will(client_id, None, None)
                self._publish_will(session, will)
            else:
                session.will_fire_at = now + delay
                session.will_handle = self.loop.call_later(delay, self._fire_delayed_will, session)
                if session.persistent and store is not None:
                    store.set_will(client_id, _encode_will(will), session.will_fire_at)
        if session.expiry_interval_s != NEVER_EXPIRES:
            session.expiry_handle = self.loop.call_later(
                session.expiry_interval_s, self._expire_session, session
            )
        self.after_batch()

    def _fire_delayed_will(self, session: Session) -> None:
        session.will_handle = None
        will = session.will
        session.will = None
        session.will_fire_at = None
        if will is not None:
            if self.store is not None and session.persistent:
                self.store.set_will(session.client_id, None, None)
            self._publish_will(session, will)
        self.after_batch()

    def _expire_session(self, session: Session) -> None:
        session.expiry_handle = None
        if session.connection is None and not session.ended:
            self.log_event(logging.INFO, "session_expired", client_id=session.client_id)
            self._end_session(session)
            self.after_batch()

    def _end_session(self, session: Session) -> None:
        """The session ends: publish a pending will, drop subscriptions, queue and stored state."""
        if session.ended:
            return
        session.ended = True
        session.cancel_timers()
        will = session.will
        session.will = None
        if will is not None:
            self._publish_will(session, will)
        client_id = session.client_id
        for opts in session.subscriptions.values():
            if opts.share_group is not None:
                self.shared_trie.remove(opts.match_filter, (opts.share_group, client_id))
            else:
                self.trie.remove(opts.match_filter, client_id)
            self.hooks.on_unsubscribe(client_id, opts.match_filter, opts.share_group)
        session.subscriptions.clear()
        if self.sessions.get(client_id) is session:
            del self.sessions[client_id]
        if self.store is not None and session.persistent:
            self.store.delete_session(client_id)
            self.store.set_will(client_id, None, None)
        # QoS 1 in flight and anything still queued go to another member; a QoS 2 message whose
        # delivery started MUST NOT be sent to any other member (MQTT-4.8.2-5)
        shared = [
            entry
            for entry in self._pending_entries(session)
            if entry.share_key is not None and (entry.qos == 1 or entry.state == STATE_QUEUED)
        ]
        session.inflight.clear()
        session.queue.clear()
        session.unsent = None
        if shared:
            self._redistribute_shared(shared)

    def _publish_will(self, session: Session, will: Will) -> None:
        acl = self.acl
        if acl is not None and not acl.can_publish(session.client_id, session.username, will.topic):
            self._count_drop("acl_denied")
            return
        props = {k: v for k, v in will.properties.items() if k != "will_delay_interval"}
        expiry_s = props.get("message_expiry_interval")
        expiry_at = time.time() + expiry_s if expiry_s is not None else None
        message = Message(
            will.topic, will.payload, will.qos, will.retain, props, expiry_at, self.node_id, session.client_id
        )
        self.stats.messages_received[will.qos] += 1
        self.publish(message, session.client_id)

    def kick(self, client_id: str, reason_code: int = ReasonCode.ADMINISTRATIVE_ACTION) -> bool:
        """Disconnect a connected client (v5: DISCONNECT with ``reason_code``). Its will is published."""
        session = self.sessions.get(client_id)
        if session is None or session.connection is None:
            return False
        session.connection.disconnect(reason_code, "disconnected by the server", fire_will=True)
        return True

    # ================================================================== output coalescing
    def mark_dirty(self, conn: Any) -> None:
        """``conn`` has queued output: flush it (with all others) at the end of this loop iteration."""
        self._dirty.append(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush_writes)

    def flush_writes(self) -> None:
        self._flush_scheduled = False
        dirty = self._dirty
        self._dirty = []
        for conn in dirty:
            conn.flush()

    # ================================================================== group commit
    def store_pending(self) -> bool:
        store = self.store
        return store is not None and store.pending

    def defer_until_commit(self, conn: Any) -> None:
        self._commit_waiters.append(conn)
        self.after_batch()

    def after_batch(self) -> None:
        """Schedule the group commit for the end of this loop iteration if the store has work."""
        if (
            not self._commit_scheduled
            and self.store is not None
            and (self.store.pending or self._commit_waiters)
        ):
            self._commit_scheduled = True
            self.loop.call_soon(self._flush_commit)

    def commit_now(self) -> bool:
        """Run the group commit at once; False if it failed (its waiters were closed)."""
        self._flush_commit()
        return not self._commit_failed_last

    def store_failed(self, exc: BaseException) -> None:
        """A store call raised while handling a packet: SQLite may have rolled back the whole open
        transaction (SQLITE_FULL, SQLITE_IOERR), so the store is rewritten from memory before the
        next commit, and acks held for that commit wait for it."""
        self.log_event(logging.ERROR, "store_error", message=str(exc))
        self._store_resync_needed = True
        self._resync_now()
        self.after_batch()

    def _resync_now(self) -> None:
        """Rewrite the store from memory now, so the sequence numbers memory holds are valid again
        for the next store calls (set_inflight, ack); on failure it is retried before the commit."""
        try:
            self._resync_store()
            self._store_resync_needed = False
        except Exception as exc:
            self.log_event(logging.ERROR, "store_resync_failed", message=str(exc))

    def _flush_commit(self) -> None:
        """The group commit: make the open transaction durable, then release the held acks.

        If the commit fails (SQLite rolls the transaction back) the store is rewritten from memory,
        which still holds every routed message, and committed once more; only if that fails too are
        the waiting connections closed without their acks (their clients re-send).
        """
        self._commit_scheduled = False
        waiters = self._commit_waiters
        self._commit_waiters = []
        if self.store is not None and not (self._try_commit() or self._try_commit()):
            for conn in waiters:
                conn.deferred = None
                conn.close()
            self.after_batch()
            return
        for conn in waiters:
            conn.flush_deferred()

    def _try_commit(self) -> bool:
        store = self.store
        assert store is not None
        try:
            if self._store_resync_needed:
                self._resync_store()
                self._store_resync_needed = False
            store.commit()
        except Exception as exc:
            self._commit_failed_last = True
            self._store_resync_needed = True  # memory is the truth: rewrite it before committing
            self.log_event(logging.ERROR, "store_commit_failed", message=str(exc))
            self._resync_now()
            return False
        self._commit_failed_last = False
        return True

    def _resync_store(self) -> None:
        """Rewrite the durable state from memory after a failed (rolled back) commit.

        The rolled-back transaction took queued messages, in-flight states, incoming QoS 2 ids,
        subscriptions, wills and retained changes with it while memory kept them (and their
        sequence numbers). The next commit must make the store match memory again, otherwise an
        acknowledgement sent later (say, a PUBREC for a re-sent QoS 2 PUBLISH that memory knows)
        could cover a message that is not on disk. Idempotent, so a failed attempt is retried.
        """
        store = self.store
        assert store is not None
        for record in store.load_sessions():
            session = self.sessions.get(record.client_id)
            if session is None or not session.persistent:
                store.delete_session(record.client_id)
        for session in self.sessions.values():
            if not session.persistent:
                continue
            client_id = session.client_id
            store.delete_session(client_id)
            store.upsert_session(
                client_id,
                protocol_level=session.protocol_level,
                expiry_interval_s=session.expiry_interval_s,
                username=session.username,
                disconnected_at=None if session.connection is not None else session.disconnected_at,
            )
            self._persist_session_contents(session)
            if session.will is not None:
                store.set_will(client_id, _encode_will(session.will), session.will_fire_at)
        for stored_message in store.load_retained():
            if stored_message.topic not in self.retained:
                store.delete_retained(stored_message.topic)
        for topic in list(self.retained.topics()):
            message = self.retained.get(topic)
            if message is not None and not topic.startswith("$SYS"):
                store.set_retained(topic, _stored(message))

    def store_add_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        if self.store is not None:
            self.store.add_incoming_qos2(client_id, packet_id)

    def store_remove_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        if self.store is not None:
            self.store.remove_incoming_qos2(client_id, packet_id)

    # ================================================================== publish / routing
    def publish(self, message: Message, from_client_id: str | None) -> int:
        """Accept a message from a local client (or will / $SYS): retain, route, tell the cluster."""
        if message.retain:
            self._retain(message)
        delivered = self._route(message, from_client_id)
        # a cluster runtime may return a future: the publisher's PUBACK/PUBREC waits for it
        self.cluster_wait = self.hooks.on_publish(message, from_client_id)
        return delivered

    def deliver_remote(
        self,
        message: Message,
        origin_node: str,
        *,
        accept_filter: Callable[[str], bool] | None = None,
        store_retained: bool = True,
    ) -> int:
        """Deliver a message accepted by another broker to local subscribers (no re-forwarding).

        ``accept_filter(match_filter)`` restricts delivery to the subscriptions whose filter it
        accepts (the cluster delivers a message received on one topic class to that class's
        subscriptions only); ``store_retained`` False leaves the retained store to the caller.
        """
        if not message.origin:
            message.origin = origin_node
        if message.retain and store_retained:
            self._retain(message)
        return self._route(message, message.publisher_id, accept_filter)

    def set_retained(self, message: Message) -> None:
        """Store (or, with an empty payload, delete) a retained message without routing it."""
        self._retain(message)

    def _retain(self, message: Message) -> None:
        topic = message.topic
        persist = self.store is not None and not topic.startswith("$SYS")
        if not message.payload:
            if self.retained.delete(topic) and persist:
                self.store.delete_retained(topic)
        else:
            self.retained.set(topic, message)
            if persist:
                self.store.set_retained(topic, _stored(message))

    def _route(
        self, message: Message, publisher: str | None, accept_filter: Callable[[str], bool] | None = None
    ) -> int:
        """Deliver to every matching subscription; sets ``route_matched`` (some subscriber matched,
        even if its copy was then dropped: queue full, ACL, too large, expired, slow consumer)."""
        matches = self.trie.match(message.topic)
        if accept_filter is not None and matches:
            matches = [match for match in matches if accept_filter(match[0])]
        delivered = 0
        matched = False
        cache: dict[Any, bytes] = {}
        if matches:
            if len(matches) == 1:
                _flt, client_id, opts = matches[0]
                if not (opts.no_local and client_id == publisher):
                    matched = True
                    sid = opts.subscription_identifier
                    delivered = self._deliver_to(
                        client_id,
                        message,
                        opts.qos,
                        opts.retain_as_published,
                        [sid] if sid else _NO_IDS,
                        cache,
                    )
            else:
                per_client: dict[str, list[Any]] = {}
                for _flt, client_id, opts in matches:
                    if opts.no_local and client_id == publisher:
                        continue
                    sid = opts.subscription_identifier
                    current = per_client.get(client_id)
                    if current is None:
                        per_client[client_id] = [opts.qos, [sid] if sid else [], opts.retain_as_published]
                    else:
                        if opts.qos > current[0]:
                            current[0] = opts.qos
                        if sid:
                            current[1].append(sid)
                        current[2] = current[2] or opts.retain_as_published
                matched = bool(per_client)
                for client_id, (qos, sids, rap) in per_client.items():
                    delivered += self._deliver_to(client_id, message, qos, rap, sids, cache)
        if len(self.shared_trie):
            shared_delivered = self._route_shared(message, cache, accept_filter)
            if shared_delivered >= 0:
                matched = True
                delivered += shared_delivered
        self.route_matched = matched
        if not matched and not message.topic.startswith("$SYS/"):
            self._count_drop("no_subscribers")
        return delivered

    def _route_shared(
        self, message: Message, cache: dict[Any, bytes], accept_filter: Callable[[str], bool] | None = None
    ) -> int:
        """One delivery per matching share group; -1 when no shared subscription matched.

        In a cluster only the broker the runtime names for a group delivers its copy
        (``hooks.owns_share_group``), so each group gets one delivery cluster-wide."""
        groups: dict[tuple[str, str], list[tuple[str, SubOptions]]] = {}
        for flt, (group, client_id), opts in self.shared_trie.match(message.topic):
            if accept_filter is not None and not accept_filter(flt):
                continue
            groups.setdefault((group, flt), []).append((client_id, opts))
        if not groups:
            return -1
        delivered = 0
        owns = self.hooks.owns_share_group
        for key, members in groups.items():
            if owns(key[0], key[1]):
                delivered += self._deliver_to_group(key, members, message, cache)
        return delivered

    def _deliver_to_group(
        self,
        key: tuple[str, str],
        members: list[tuple[str, SubOptions]],
        message: Message,
        cache: dict[Any, bytes],
    ) -> int:
        """Deliver to one member of share group ``key`` = (group, filter): round robin over the
        connected members; if all are offline, QoS>0 is queued for one persistent member."""
        sessions = self.sessions
        members.sort(key=lambda member: member[0])
        count = len(members)
        start = self._share_rr.get(key, 0) % count
        chosen: tuple[str, SubOptions] | None = None
        for step in range(count):
            index = (start + step) % count
            session = sessions.get(members[index][0])
            if session is not None and session.connection is not None:
                chosen = members[index]
                self._share_rr[key] = index + 1
                break
        if chosen is None and message.qos > 0:
            # every member offline: queue for one persistent member (round robin)
            for step in range(count):
                index = (start + step) % count
                session = sessions.get(members[index][0])
                if session is not None and session.expiry_interval_s > 0:
                    chosen = members[index]
                    self._share_rr[key] = index + 1
                    break
        if chosen is None:  # no member connected (QoS 0) / none connected or persistent (QoS>0)
            self._count_drop("no_subscribers")
            return 0
        client_id, opts = chosen
        sid = opts.subscription_identifier
        return self._deliver_to(
            client_id, message, opts.qos, opts.retain_as_published, [sid] if sid else _NO_IDS, cache, key
        )

    def _redistribute_shared(self, entries: list[OutEntry]) -> None:
        """Messages a leaving member of a share group had not completed go to another member of
        the group (MQTT 5 §4.8.2: "the Server SHOULD send the Application Message to another
        Client that is subscribed to the same Shared Subscription")."""
        for entry in entries:
            key = entry.share_key
            assert key is not None
            message = entry.message
            members = [
                (client_id, opts)
                for flt, (group, client_id), opts in self.shared_trie.match(message.topic)
                if group == key[0] and flt == key[1]
            ]
            if members:
                self._deliver_to_group(key, members, message, {})
            else:
                self._count_drop("no_subscribers")

    def _deliver_to(
        self,
        client_id: str,
        message: Message,
        sub_qos: int,
        retain_as_published: bool,
        sub_ids: list[int],
        cache: dict[Any, bytes],
        share_key: tuple[str, str] | None = None,
    ) -> int:
        session = self.sessions.get(client_id)
        if session is None:
            return 0
        acl = self.acl
        if acl is not None and not acl.can_receive(client_id, session.username, message.topic):
            self._count_drop("acl_denied")
            return 0
        qos = message.qos if message.qos < sub_qos else sub_qos
        retain = message.retain and retain_as_published
        if qos:
            return self._enqueue(session, OutEntry(message, qos, retain, sub_ids, share_key=share_key))
        conn = session.connection
        if conn is None:
            return 0
        if conn.transport.get_write_buffer_size() > SLOW_CONSUMER_HIGH_WATER_BYTES:
            self._count_drop("slow_consumer")
            return 0
        if session.protocol_level != MQTT_5:
            key: Any = retain
        elif not sub_ids and message.expiry_at is None and not session.client_topic_alias_maximum:
            key = (5, retain)
        else:
            key = None
        data = cache.get(key) if key is not None else None
        if data is None:
            data = self._encode_for(session, message, 0, retain, False, None, sub_ids)
            if data is None:
                return 0
            if key is not None:
                cache[key] = data
        elif session.protocol_level == MQTT_5 and len(data) > session.client_max_packet_size:
            self._count_drop("packet_too_large")
            return 0
        out = conn.out  # inlined MQTTConnection.write
        if out is None:
            conn.out = [data]
            self.mark_dirty(conn)
        else:
            out.append(data)
        stats = self.stats
        stats.bytes_sent += len(data)
        stats.messages_sent[0] += 1
        return 1

    def _encode_for(
        self,
        session: Session,
        message: Message,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        sub_ids: list[int],
    ) -> bytes | None:
        """Encode the PUBLISH for this session; None if the message expired or is too large for it."""
        if session.protocol_level != MQTT_5:
            # MQTT-3.3.2-5 applies to every subscriber: an expired message is deleted for 3.1.1 too
            if message.expiry_at is not None and message.expiry_at <= time.time():
                self._count_drop("expired")
                return None
            return codec.encode_publish(message.topic, message.payload, qos, retain, dup, packet_id, None, 4)
        props = message.properties
        topic = message.topic
        new_alias: int | None = None
        if sub_ids or message.expiry_at is not None or session.client_topic_alias_maximum:
            props = dict(props)
            if sub_ids:
                props["subscription_identifier"] = list(sub_ids)
            if message.expiry_at is not None:
                remaining = math.ceil(message.expiry_at - time.time())
                if remaining <= 0:
                    self._count_drop("expired")
                    return None
                props["message_expiry_interval"] = remaining
            alias_max = session.client_topic_alias_maximum
            if alias_max:
                aliases = session.out_aliases
                if aliases is None:
                    aliases = session.out_aliases = {}
                alias = aliases.get(topic)
                if alias is not None:
                    props["topic_alias"] = alias
                    topic = ""
                elif len(aliases) < alias_max:
                    new_alias = len(aliases) + 1
                    aliases[topic] = new_alias
                    props["topic_alias"] = new_alias
        data = codec.encode_publish(
            topic, message.payload, qos, retain, dup, packet_id, props or None, MQTT_5
        )
        if len(data) > session.client_max_packet_size:
            if new_alias is not None and session.out_aliases is not None:
                del session.out_aliases[message.topic]
            self._count_drop("packet_too_large")
            return None
        return data

    def _count_drop(self, reason: str) -> None:
        dropped = self.stats.messages_dropped
        dropped[reason] = dropped.get(reason, 0) + 1

    # ================================================================== outgoing QoS 1/2
    def _window(self, session: Session) -> int:
        cap = self._window_cap
        return cap if cap < session.client_receive_maximum else session.client_receive_maximum

    def _enqueue(self, session: Session, entry: OutEntry) -> int:
        store = self.store
        queue = session.queue
        conn = session.connection
        direct = conn is not None and not queue and len(session.inflight) < self._window(session)
        if not direct and len(queue) >= self._max_queued:
            self._count_drop("queue_full")
            if not self._drop_oldest:
                return 0
            oldest = queue.popleft()
            if oldest.seq is not None and store is not None and session.persistent:
                store.ack(session.client_id, oldest.seq)
        if session.persistent and store is not None:
            entry.seq = store.enqueue(
                session.client_id, _stored(entry.message), entry.subscription_identifiers
            )
        if direct:
            self._send_entry(session, entry)
        else:
            queue.append(entry)
        return 1

    def _send_entry(self, session: Session, entry: OutEntry) -> bool:
        conn = session.connection
        packet_id = session.allocate_packet_id()
        data = self._encode_for(
            session, entry.message, entry.qos, entry.retain, False, packet_id, entry.subscription_identifiers
        )
        if data is None:
            self._complete(session, entry)
            return False
        entry.packet_id = packet_id
        entry.state = STATE_PUBLISH_SENT
        session.inflight[packet_id] = entry
        if entry.seq is not None and self.store is not None and session.persistent:
            self.store.set_inflight(session.client_id, entry.seq, packet_id, STATE_PUBLISH_SENT)
        conn.write(data)
        self.stats.messages_sent[entry.qos] += 1
        return True

    def _pump(self, session: Session) -> None:
        window = self._window(session)
        unsent = session.unsent
        if unsent is not None:  # re-sends waiting since the reconnect go first (original order)
            inflight = session.inflight
            while unsent and session.connection is not None and len(inflight) - len(unsent) < window:
                entry = unsent.popleft()
                if entry.packet_id is not None and inflight.get(entry.packet_id) is entry:
                    self._resend(session, entry)
            if unsent:
                return
            session.unsent = None
        queue = session.queue
        while queue and session.connection is not None and len(session.inflight) < window:
            self._send_entry(session, queue.popleft())

    def _complete(self, session: Session, entry: OutEntry) -> None:
        if entry.seq is not None and self.store is not None and session.persistent:
            self.store.ack(session.client_id, entry.seq)

    def outgoing_complete(self, session: Session, entry: OutEntry) -> None:
        """PUBACK / PUBCOMP received (or PUBREC with a failure code): forget it and send more."""
        self._complete(session, entry)
        unsent = session.unsent
        if unsent:  # drop it if it was acknowledged before it was re-sent on this connection
            session.unsent = unsent = deque(e for e in unsent if e is not entry)
        if session.queue or unsent:
            self._pump(session)

    def outgoing_state(self, session: Session, entry: OutEntry) -> None:
        if entry.seq is not None and self.store is not None and session.persistent:
            self.store.set_inflight(session.client_id, entry.seq, entry.packet_id, entry.state)

    # ================================================================== subscriptions
    def subscribe(
        self, session: Session, packet: Subscribe
    ) -> tuple[list[int], list[tuple[SubOptions, Message]]]:
        """Apply a SUBSCRIBE; returns the SUBACK codes and the retained messages to send after it."""
        is_v5 = session.protocol_level == MQTT_5
        sub_id = packet.properties.get("subscription_identifier")
        codes: list[int] = []
        retained: list[tuple[SubOptions, Message]] = []
        client_id = session.client_id
        acl = self.acl
        for sub in packet.subscriptions:
            full_filter = sub.topic_filter
            try:
                group, match_filter = parse_shared(full_filter)
                validate_topic_filter(match_filter)
            except TopicError:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID if is_v5 else 0x80)
                continue
            if group is not None and sub.no_local and is_v5:
                raise MQTTProtocolError(
                    "no local set on a shared subscription", ReasonCode.PROTOCOL_ERROR, "MQTT-3.8.3-4"
                )
            if acl is not None and not acl.can_subscribe(client_id, session.username, match_filter):
                codes.append(ReasonCode.NOT_AUTHORIZED if is_v5 else 0x80)
                continue
            granted = min(sub.qos, self.limits.maximum_qos)
            opts = SubOptions(
                full_filter,
                granted,
                sub.no_local,
                sub.retain_as_published,
                sub.retain_handling,
                sub_id,
                group,
                match_filter,
            )
            existed = full_filter in session.subscriptions
            session.subscriptions[full_filter] = opts
            if group is not None:
                self.shared_trie.add(match_filter, (group, client_id), opts)
            else:
                self.trie.add(match_filter, client_id, opts)
            if session.persistent and self.store is not None:
                self.store.add_subscription(client_id, _stored_subscription(opts))
            self.hooks.on_subscribe(client_id, match_filter, group, granted)
            if group is None and (sub.retain_handling == 0 or (sub.retain_handling == 1 and not existed)):
                for _topic, message in self.retained.match(match_filter):
                    retained.append((opts, message))
            codes.append(granted)
        self.stats.subscriptions = len(self.trie) + len(self.shared_trie)
        return codes, retained

    def send_retained(self, session: Session, retained: list[tuple[SubOptions, Message]]) -> None:
        """Send retained messages to one new subscription (retain flag set, MQTT-3.3.1-8)."""
        now = time.time()
        for opts, message in retained:
            if message.expiry_at is not None and message.expiry_at <= now:
                self.retained.delete(message.topic)
                if self.store is not None:
                    self.store.delete_retained(message.topic)
                continue
            acl = self.acl
            if acl is not None and not acl.can_receive(session.client_id, session.username, message.topic):
                continue
            sid = opts.subscription_identifier
            sub_ids = [sid] if sid else _NO_IDS
            qos = min(message.qos, opts.qos)
            if qos:
                self._enqueue(session, OutEntry(message, qos, True, sub_ids))
            elif session.connection is not None:
                data = self._encode_for(session, message, 0, True, False, None, sub_ids)
                if data is not None:
                    session.connection.write(data)
                    self.stats.messages_sent[0] += 1

    def unsubscribe(self, session: Session, topic_filters: list[str]) -> list[int]:
        codes: list[int] = []
        client_id = session.client_id
        for full_filter in topic_filters:
            opts = session.subscriptions.pop(full_filter, None)
            if opts is None:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
                continue
            if opts.share_group is not None:
                self.shared_trie.remove(opts.match_filter, (opts.share_group, client_id))
            else:
                self.trie.remove(opts.match_filter, client_id)
            if session.persistent and self.store is not None:
                self.store.remove_subscription(client_id, full_filter)
            self.hooks.on_unsubscribe(client_id, opts.match_filter, opts.share_group)
            codes.append(ReasonCode.SUCCESS)
        self.stats.subscriptions = len(self.trie) + len(self.shared_trie)
        return codes

    # ================================================================== cluster: session transfer
    def export_session(self, client_id: str) -> SessionSnapshot | None:
        session = self.sessions.get(client_id)
        if session is None:
            return None
        pending = [
            OutEntry(
                e.message,
                e.qos,
                e.retain,
                list(e.subscription_identifiers),
                None,
                e.packet_id,
                e.state,
                e.share_key,
            )
            for e in self._pending_entries(session)
        ]
        return SessionSnapshot(
            client_id=client_id,
            protocol_level=session.protocol_level,
            expiry_interval_s=session.expiry_interval_s,
            username=session.username,
            subscriptions=[
                SubOptions(**{f: getattr(o, f) for f in SubOptions.__slots__})
                for o in session.subscriptions.values()
            ],
            pending=pending,
            incoming_qos2=set(session.incoming_qos2),
            next_packet_id=session.next_packet_id,
        )

    def import_session(self, snapshot: SessionSnapshot) -> Session:
        """Install a (disconnected) session handed over by another broker, replacing any local one."""
        existing = self.sessions.get(snapshot.client_id)
        if existing is not None:
            if existing.connection is not None:
                existing.connection.disconnect(
                    ReasonCode.SESSION_TAKEN_OVER, "session moved", fire_will=False
                )
            existing = self.sessions.get(snapshot.client_id)
            if existing is not None:
                existing.will = None
                self._end_session(existing)
        session = Session(snapshot.client_id, snapshot.protocol_level, snapshot.username)
        session.expiry_interval_s = snapshot.expiry_interval_s
        session.persistent = snapshot.expiry_interval_s > 0 and self.store is not None
        session.next_packet_id = snapshot.next_packet_id
        session.disconnected_at = time.time()
        self.sessions[snapshot.client_id] = session
        for opts in snapshot.subscriptions:
            session.subscriptions[opts.topic_filter] = opts
            if opts.share_group is not None:
                self.shared_trie.add(opts.match_filter, (opts.share_group, session.client_id), opts)
            else:
                self.trie.add(opts.match_filter, session.client_id, opts)
            self.hooks.on_subscribe(session.client_id, opts.match_filter, opts.share_group, opts.qos)
        for entry in snapshot.pending:
            if entry.packet_id is not None and entry.state != STATE_QUEUED:
                session.inflight[entry.packet_id] = entry
            else:
                entry.packet_id = None
                session.queue.append(entry)
        session.incoming_qos2 = set(snapshot.incoming_qos2)
        if session.persistent and self.store is not None:
            self.store.upsert_session(
                session.client_id,
                protocol_level=session.protocol_level,
                expiry_interval_s=session.expiry_interval_s,
                username=session.username,
                disconnected_at=session.disconnected_at,
            )
            self._persist_session_contents(session)
        if session.expiry_interval_s == 0:  # give the moving client the CONNECT timeout to arrive
            session.expiry_handle = self.loop.call_later(
                self.connect_timeout_s, self._expire_session, session
            )
        elif session.expiry_interval_s != NEVER_EXPIRES:
            session.expiry_handle = self.loop.call_later(
                session.expiry_interval_s, self._expire_session, session
            )
        self.stats.subscriptions = len(self.trie) + len(self.shared_trie)
        self.after_batch()
        return session

    def hand_over(self, client_id: str, *, transfer: bool) -> tuple[bool, SessionSnapshot | None]:
        """Another broker of the cluster got a CONNECT for ``client_id``: disconnect it here
        (v5 reason 0x8E, its will published as on a local takeover) and end the local session.

        Returns (whether this broker had the client, its snapshot when ``transfer`` and the
        session was not empty). Queued messages go with the snapshot, not to other share-group
        members, and a delayed will does not fire here (the session lives on elsewhere).
        """
        session = self.sessions.get(client_id)
        if session is None:
            return False, None
        if session.connection is not None:
            self.log_event(logging.INFO, "session_taken_over", client_id=client_id, remote=True)
            session.connection.disconnect(ReasonCode.SESSION_TAKEN_OVER, "session taken over", fire_will=True)
            session = self.sessions.get(client_id)
            if session is None:  # it had no persistent state
                return True, None
        snapshot = self.export_session(client_id) if transfer else None
        session.will = None
        session.inflight.clear()
        session.queue.clear()
        session.unsent = None
        self._end_session(session)
        self.after_batch()
        return True, snapshot

    def adopt_entries(self, session: Session, entries: list[OutEntry]) -> None:
        """Queue messages of a session handed over too late (after its client reconnected here).

        A QoS 2 message whose PUBREC already came (PUBREL sent) reached the client: it is not
        queued again (that would deliver it twice, MQTT-4.3.3); everything else is re-sent."""
        for entry in entries:
            if entry.qos == 2 and entry.state == STATE_PUBREL_SENT:
                continue
            self._enqueue(
                session,
                OutEntry(entry.message, entry.qos, entry.retain, list(entry.subscription_identifiers)),
            )
        self.after_batch()

    # ================================================================== restart
    def _load_state(self) -> None:
        store = self.store
        assert store is not None
        for stored_message in store.load_retained():
            message = _message(stored_message)
            self.retained.set(message.topic, message)
        now = time.time()
        wills = {client_id: (data, fire_at) for client_id, data, fire_at in store.load_wills()}
        for record in store.load_sessions():
            session = Session(record.client_id, record.protocol_level, record.username)
            session.expiry_interval_s = record.expiry_interval_s
            session.persistent = True
            session.disconnected_at = record.disconnected_at or now
            session.incoming_qos2 = set(record.incoming_qos2)
            self.sessions[record.client_id] = session
            for sub in record.subscriptions:
                try:
                    group, match_filter = parse_shared(sub.topic_filter)
                except TopicError:
                    continue
                opts = SubOptions(
                    sub.topic_filter,
                    sub.qos,
                    sub.no_local,
                    sub.retain_as_published,
                    sub.retain_handling,
                    sub.subscription_identifier,
                    group,
                    match_filter,
                )
                session.subscriptions[sub.topic_filter] = opts
                if group is not None:
                    self.shared_trie.add(match_filter, (group, record.client_id), opts)
                else:
                    self.trie.add(match_filter, record.client_id, opts)
                self.hooks.on_subscribe(record.client_id, match_filter, group, sub.qos)
            for queued in store.load_queue(record.client_id):
                entry = OutEntry(
                    _message(queued.message),
                    queued.message.qos,
                    queued.message.retain,
                    list(queued.subscription_identifiers),
                    queued.seq,
                    queued.packet_id,
                    queued.state,
                )
                if queued.packet_id is not None and queued.state != STATE_QUEUED:
                    session.inflight[queued.packet_id] = entry
                    session.next_packet_id = queued.packet_id % 65535 + 1
                else:
                    entry.packet_id = None
                    entry.state = STATE_QUEUED
                    session.queue.append(entry)
            will_row = wills.pop(record.client_id, None)
            if will_row is not None:
                session.will = _decode_will(will_row[0])
                session.will_fire_at = will_row[1]
            self._schedule_restored(session, now)
        for client_id, (data, _fire_at) in wills.items():  # wills of sessions that already ended
            orphan = Session(client_id, MQTT_5, None)
            self._publish_will(orphan, _decode_will(data))
            store.set_will(client_id, None, None)
        self.stats.subscriptions = len(self.trie) + len(self.shared_trie)
        self.stats.sessions = len(self.sessions)
        self.after_batch()

    def _schedule_restored(self, session: Session, now: float) -> None:
        if session.will is not None:
            fire_at = session.will_fire_at
            if fire_at is None:  # the client was connected when the broker stopped: its connection is gone
                delay = int(session.will.properties.get("will_delay_interval", 0))
                if session.expiry_interval_s != NEVER_EXPIRES:
                    delay = min(delay, session.expiry_interval_s)
                fire_at = session.will_fire_at = now + delay
            session.will_handle = self.loop.call_later(
                max(0.0, fire_at - now), self._fire_delayed_will, session
            )
        if session.expiry_interval_s != NEVER_EXPIRES:
            remaining = (session.disconnected_at or now) + session.expiry_interval_s - now
            session.expiry_handle = self.loop.call_later(max(0.0, remaining), self._expire_session, session)

    # ================================================================== timers: keep alive, $SYS
    def _sweep(self) -> None:
        """Shared timer: CONNECT timeout and keep alive (1.5 x keep alive, MQTT-3.1.2-24)."""
        self._sweep_handle = self.loop.call_later(SWEEP_INTERVAL_S, self._sweep)
        now = time.monotonic()
        for conn in list(self.connections):
            if conn.state == 0:
                if now - conn.connected_at > self.connect_timeout_s:
                    self.log_event(logging.INFO, "connect_timeout", peer=conn.peer)
                    conn.close(fire_will=False)
            elif conn.state == 1 and conn.keep_alive_s and now - conn.last_rx > 1.5 * conn.keep_alive_s:
                self.log_event(logging.INFO, "keepalive_timeout", client_id=conn.client_id, peer=conn.peer)
                conn.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep alive timeout", fire_will=True)
        self.after_batch()

    def refresh_stats(self) -> None:
        """Recompute the gauges that are not maintained on the hot path (called at scrape time)."""
        stats = self.stats
        stats.sessions = len(self.sessions)
        stats.subscriptions = len(self.trie) + len(self.shared_trie)
        stats.retained_messages = len(self.retained)
        stats.queued_messages = sum(len(s.queue) for s in self.sessions.values())
        stats.inflight_messages = sum(len(s.inflight) for s in self.sessions.values())
        stats.connections_current = self.connected_count
        stats.packets_sent["PUBLISH"] = sum(stats.messages_sent)

    def _publish_sys(self) -> None:
        interval = self.config.sys.interval_s
        self._sys_handle = self.loop.call_later(interval, self._publish_sys)
        self.refresh_stats()
        stats = self.stats
        values = {
            "$SYS/broker/version": f"skipmq {__version__}",
            "$SYS/broker/uptime": f"{int(time.time() - stats.uptime_started_at)} seconds",
            "$SYS/broker/clients/connected": str(self.connected_count),
            "$SYS/broker/messages/received": str(sum(stats.messages_received)),
            "$SYS/broker/messages/sent": str(sum(stats.messages_sent)),
            "$SYS/broker/subscriptions/count": str(stats.subscriptions),
            "$SYS/broker/retained messages/count": str(stats.retained_messages),
            "$SYS/broker/load/bytes/received": str(stats.bytes_received),
            "$SYS/broker/load/bytes/sent": str(stats.bytes_sent),
        }
        for topic, value in values.items():  # local only: every node has its own $SYS tree
            message = Message(topic, value.encode(), 0, True, {}, None, self.node_id, None)
            self._retain(message)
            self._route(message, None)


# ====================================================================== helpers
def _default_node_id() -> str:
    import socket

    return socket.gethostname() or "skipmq"


def _stored(message: Message) -> StoredMessage:
    return StoredMessage(
        message.topic,
        message.payload,
        message.qos,
        message.retain,
        message.properties,
        message.expiry_at,
        message.origin,
    )


def _message(stored: Any) -> Message:
    return Message(
        stored.topic,
        stored.payload,
        stored.qos,
        stored.retain,
        dict(stored.properties or {}),
        stored.expiry_at,
        stored.origin,
        None,
    )


def _stored_subscription(opts: SubOptions) -> StoredSubscription:
    return StoredSubscription(
        opts.topic_filter,
        opts.qos,
        opts.no_local,
        opts.retain_as_published,
        opts.retain_handling,
        opts.subscription_identifier,
    )


def _encode_will(will: Will) -> bytes:
    """Wills are stored as an MQTT 5 PUBLISH (lossless for payload and properties) plus its delay."""
    props = {k: v for k, v in will.properties.items() if k != "will_delay_interval"}
    delay = int(will.properties.get("will_delay_interval", 0))
    body = codec.encode_publish(
        will.topic, will.payload, will.qos, will.retain, False, 1 if will.qos else None, props or None, MQTT_5
    )
    return delay.to_bytes(4, "big") + body


def _decode_will(data: bytes) -> Will:
    delay = int.from_bytes(data[:4], "big")
    decoder = codec.Decoder(role="client", protocol_level=MQTT_5)
    packets = decoder.feed(data[4:])
    publish = packets[0]
    assert isinstance(publish, Publish)
    props = dict(publish.properties)
    if delay:
        props["will_delay_interval"] = delay
    return Will(publish.topic, publish.payload, publish.qos, publish.retain, props)


__all__ = ["Broker", "Message", "SessionSnapshot"]
