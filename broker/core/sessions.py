"""Sessions: the life cycle of every client id's session (MQTT 3.1.1 §3.1.2.4 / §4.1, MQTT 5 §4.1).

Attach on CONNECT (take over a connected client id with 0x8E, MQTT-3.1.4-3; clean start or
resume; session expiry capped by ``limits.max_session_expiry_s``), detach when the connection
ends (will now or after its v5 delay, §3.1.2.5, and expiry timer), end (will, subscriptions,
queue and stored state go; share-group messages go to another member, §4.8.2), restore from the
store at start, and move between brokers (export / import / hand over, for the cluster).
Persistence goes through ``broker.core.durability``; timers through the scheduler port.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.core.drops import SESSION_ENDED
from broker.core.durability import decode_will, message_from
from broker.core.session import (
    STATE_PUBREL_SENT,
    STATE_QUEUED,
    OutEntry,
    Session,
    SessionSnapshot,
    SubOptions,
)
from broker.mqtt.packets import MQTT_5, Connect, ReasonCode, Will
from broker.mqtt.topics import TopicError, parse_shared

if TYPE_CHECKING:
    from broker.config import LimitsConfig
    from broker.core.durability import Durability
    from broker.core.outbound import Outbound
    from broker.core.ports import ClientPort, ClusterPort, Scheduler, StorePort
    from broker.core.routing import Router
    from broker.core.stats import BrokerStats
    from broker.core.subscriptions import Subscriptions

NEVER_EXPIRES = 0xFFFFFFFF
LogEvent = Callable[..., None]


class SessionRegistry:
    """Every session of this broker by client id, connected or not."""

    __slots__ = (
        "_cluster",
        "_durability",
        "_limits",
        "_log_event",
        "_outbound",
        "_router",
        "_scheduler",
        "_subscriptions",
        "connect_timeout_s",
        "connected_count",
        "sessions",
        "shutting_down",
        "stats",
    )

    def __init__(
        self,
        *,
        sessions: dict[str, Session],
        limits: LimitsConfig,
        durability: Durability,
        subscriptions: Subscriptions,
        outbound: Outbound,
        router: Router,
        cluster: ClusterPort,
        scheduler: Scheduler,
        stats: BrokerStats,
        log_event: LogEvent,
        connect_timeout_s: float,
    ) -> None:
        self.sessions = sessions
        self._limits = limits
        self._durability = durability
        self._subscriptions = subscriptions
        self._outbound = outbound
        self._router = router
        self._cluster = cluster
        self._scheduler = scheduler
        self.stats = stats
        self._log_event = log_event
        self.connect_timeout_s = connect_timeout_s
        self.connected_count = 0
        self.shutting_down = False

    def get(self, client_id: str) -> Session | None:
        return self.sessions.get(client_id)

    # ================================================================== attach / detach
    def expiry_for(self, packet: Connect) -> tuple[int, bool]:
        """(session expiry interval of this CONNECT, whether the broker's cap lowered it)."""
        if packet.protocol_level == MQTT_5:
            expiry = int(packet.properties.get("session_expiry_interval", 0))
        else:
            expiry = 0 if packet.clean_start else NEVER_EXPIRES
        cap = self._limits.max_session_expiry_s
        if cap and expiry > cap:
            return cap, packet.protocol_level == MQTT_5
        return expiry, False

    def attach(self, conn: ClientPort, packet: Connect, client_id: str) -> tuple[Session, bool, int, bool]:
        """Bind ``conn`` to the session of ``client_id`` (taking over a connected one).

        Returns (session, session_present, session expiry, whether the expiry was capped).
        """
        sessions = self.sessions
        existing = sessions.get(client_id)
        if existing is not None and existing.connection is not None:
            old = existing.connection
            self._log_event(logging.INFO, "session_taken_over", client_id=client_id, peer=old.peer)
            old.disconnect(ReasonCode.SESSION_TAKEN_OVER, "session taken over", fire_will=True)
            existing = sessions.get(client_id)
        expiry, capped = self.expiry_for(packet)
        if existing is not None and packet.clean_start:
            self.end(existing)
            existing = None
        durability = self._durability
        if existing is not None:
            session = existing
            present = True
            if session.expiry_handle is not None:
                session.expiry_handle.cancel()
                session.expiry_handle = None
            if session.will_handle is not None:  # reconnected within the will delay: no will
                session.will_handle.cancel()
                session.will_handle = None
            if session.will is not None and session.will_fire_at is not None:
                durability.set_will(session, None)
            session.will_fire_at = None
        else:
            session = Session(client_id, packet.protocol_level, conn.username)
            sessions[client_id] = session
            present = False
        session.protocol_level = packet.protocol_level
        session.username = conn.username
        session.expiry_interval_s = expiry
        session.will = packet.will
        props = packet.properties
        session.client_receive_maximum = int(props.get("receive_maximum", 65535))
        session.client_max_packet_size = int(props.get("maximum_packet_size", 268_435_455))
        session.client_topic_alias_maximum = int(props.get("topic_alias_maximum", 0))
        session.out_aliases = None
        session.connection = conn
        session.disconnected_at = None
        session.present_at_connect = present
        durability.make_persistent(session, expiry > 0)
        if session.persistent and (packet.will is not None or present):
            # stored while connected too, so a will survives a broker crash (fired on restart)
            durability.set_will(session, packet.will)
        self.connected_count += 1
        stats = self.stats
        stats.connections_current = self.connected_count
        stats.connections_total += 1
        # (the cluster hears of it once the CONNACK and the re-sends are out: ``ClientConnect._attach``)
        return session, present, expiry, capped

    def set_expiry(self, session: Session, expiry_s: int) -> None:
        """A v5 DISCONNECT changed the session expiry interval (MQTT-3.14.2-2 checked by the caller)."""
        cap = self._limits.max_session_expiry_s
        if cap and expiry_s > cap:
            expiry_s = cap
        session.expiry_interval_s = expiry_s
        if self._durability.store is not None:
            self._durability.make_persistent(session, expiry_s > 0)

    def detach(self, conn: ClientPort, session: Session, *, fire_will: bool) -> None:
        """The network connection of a connected client ended (any reason)."""
        if session.connection is not conn:
            return
        session.connection = None
        self.connected_count -= 1
        self.stats.connections_current = self.connected_count
        client_id = session.client_id
        self._cluster.on_client_disconnected(client_id)
        durability = self._durability
        if not fire_will:
            if session.will is not None:
                durability.set_will(session, None)
            session.will = None
        if session.expiry_interval_s == 0 or session.ended:
            self.end(session)
            return
        now = self._scheduler.wall_time()
        session.disconnected_at = now
        durability.save_session(session)
        will = session.will
        if will is not None:
            delay = self._will_delay_s(session, will)
            if delay <= 0 or (self.shutting_down and not session.persistent):
                session.will = None
                durability.set_will(session, None)
                self._router.publish_will(session, will)
            else:
                session.will_fire_at = now + delay
                session.will_handle = self._scheduler.call_later(delay, self._fire_delayed_will, session)
                durability.set_will(session, will, session.will_fire_at)
        if session.expiry_interval_s != NEVER_EXPIRES:
            session.expiry_handle = self._scheduler.call_later(
                session.expiry_interval_s, self._expire, session
            )

    @staticmethod
    def _will_delay_s(session: Session, will: Will) -> int:
        """The will delay interval (MQTT 5 §3.1.3.2.2; 0 for MQTT 3.1.1), at most the session expiry."""
        delay = int(will.properties.get("will_delay_interval", 0)) if session.protocol_level == MQTT_5 else 0
        if session.expiry_interval_s != NEVER_EXPIRES:
            delay = min(delay, session.expiry_interval_s)
        return delay

    def _fire_delayed_will(self, session: Session) -> None:
        session.will_handle = None
        will = session.will
        session.will = None
        session.will_fire_at = None
        if will is not None:
            self._durability.set_will(session, None)
            self._router.publish_will(session, will)
        self._durability.after_batch()

    def _expire(self, session: Session) -> None:
        session.expiry_handle = None
        if session.connection is None and not session.ended:
            self._log_event(logging.INFO, "session_expired", client_id=session.client_id)
            self.end(session)
            self._durability.after_batch()

    def end(self, session: Session) -> None:
        """The session ends: publish a pending will, drop subscriptions, queue and stored state."""
        if session.ended:
            return
        session.ended = True
        session.cancel_timers()
        will = session.will
        session.will = None
        if will is not None:
            self._router.publish_will(session, will)
        self._subscriptions.remove_all(session)
        client_id = session.client_id
        if self.sessions.get(client_id) is session:
            del self.sessions[client_id]
        self._durability.delete_session(session)
        shared = self._router.shared_leftovers(session)
        # what the client will never get (a QoS 2 message whose PUBREC came has reached it; the
        # share-group leftovers go to another member)
        lost = sum(1 for entry in session.pending_entries() if entry.state != STATE_PUBREL_SENT)
        self._outbound.drops.dropped(client_id, SESSION_ENDED, lost - len(shared))
        session.clear_inflight()
        session.set_queue([])
        session.unsent = None
        if shared:
            self._router.redistribute_shared(shared)

    def kick(self, client_id: str, reason_code: int = ReasonCode.ADMINISTRATIVE_ACTION) -> bool:
        """Disconnect a connected client (v5: DISCONNECT with ``reason_code``). Its will is published."""
        session = self.sessions.get(client_id)
        if session is None or session.connection is None:
            return False
        session.connection.disconnect(reason_code, "disconnected by the server", fire_will=True)
        return True

    # ================================================================== moving between brokers
    def export(self, client_id: str) -> SessionSnapshot | None:
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
            for e in session.pending_entries()
        ]
        return SessionSnapshot(
            client_id=client_id,
            protocol_level=session.protocol_level,
            expiry_interval_s=session.expiry_interval_s,
            username=session.username,
            subscriptions=[opts.copy() for opts in session.subscriptions.values()],
            pending=pending,
            incoming_qos2=set(session.incoming_qos2),
            next_packet_id=session.next_packet_id,
            will=session.will,
            will_fire_at=session.will_fire_at,
            disconnected_at=None if session.connection is not None else session.disconnected_at,
        )

    def import_(self, snapshot: SessionSnapshot, *, adopted: bool = False) -> Session:
        """Install a (disconnected) session handed over by another broker, replacing any local one.

        ``adopted``: a replica holder adopts the copy of a session whose broker is gone (no client
        is reconnecting with it): its will is kept and published after its delay, and its expiry
        runs from when the client left, as after a restart of the session's own broker
        (``_schedule_restored``). Otherwise the session moves with its reconnecting client: the
        will goes (MQTT-3.1.3-9) and the expiry waits for the client."""
        existing = self.sessions.get(snapshot.client_id)
        leftover: list[OutEntry] = []
        if existing is not None:
            if existing.connection is not None:
                existing.connection.disconnect(
                    ReasonCode.SESSION_TAKEN_OVER, "session moved", fire_will=False
                )
            existing = self.sessions.get(snapshot.client_id)
            if existing is not None:
                # what was queued here for the client (a session it got here while the one it
                # brings was out of reach) is kept: it follows the imported session's messages
                leftover = existing.pending_entries()
                existing.will = None
                existing.clear_inflight()
                existing.set_queue([])
                existing.unsent = None
                self.end(existing)
        session = Session(snapshot.client_id, snapshot.protocol_level, snapshot.username)
        session.expiry_interval_s = snapshot.expiry_interval_s
        session.next_packet_id = snapshot.next_packet_id
        now = self._scheduler.wall_time()
        session.disconnected_at = now
        if adopted:
            session.disconnected_at = snapshot.disconnected_at or now
            session.will = snapshot.will
            session.will_fire_at = snapshot.will_fire_at if snapshot.will is not None else None
        self.sessions[snapshot.client_id] = session
        self._subscriptions.add_all(session, snapshot.subscriptions)
        for entry in snapshot.pending:
            if entry.packet_id is not None and entry.state != STATE_QUEUED:
                session.inflight_to_fill()[entry.packet_id] = entry
            else:
                entry.packet_id = None
                session.queue_to_fill().append(entry)
        session.set_incoming_qos2(snapshot.incoming_qos2)
        self._durability.make_persistent(session, snapshot.expiry_interval_s > 0)
        if leftover:
            self.adopt_entries(session, leftover)
        if adopted and session.expiry_interval_s > 0:
            if session.will is not None:
                # connected when its broker was lost: the delay runs from now
                if session.will_fire_at is None:
                    session.will_fire_at = now + self._will_delay_s(session, session.will)
                self._durability.set_will(session, session.will, session.will_fire_at)
            self._schedule_restored(session, now)
            return session
        if session.expiry_interval_s == 0:  # give the moving client the CONNECT timeout to arrive
            session.expiry_handle = self._scheduler.call_later(self.connect_timeout_s, self._expire, session)
        elif session.expiry_interval_s != NEVER_EXPIRES:
            session.expiry_handle = self._scheduler.call_later(
                session.expiry_interval_s, self._expire, session
            )
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
            self._log_event(logging.INFO, "session_taken_over", client_id=client_id, remote=True)
            session.connection.disconnect(ReasonCode.SESSION_TAKEN_OVER, "session taken over", fire_will=True)
            session = self.sessions.get(client_id)
            if session is None:  # it had no persistent state
                return True, None
        snapshot = self.export(client_id) if transfer else None
        session.will = None
        session.clear_inflight()
        session.set_queue([])
        session.unsent = None
        self.end(session)
        return True, snapshot

    def adopt_entries(self, session: Session, entries: list[OutEntry]) -> None:
        """Queue messages of a session handed over too late (after its client reconnected here).

        A QoS 2 message whose PUBREC already came (PUBREL sent) reached the client: it is not
        queued again (that would deliver it twice, MQTT-4.3.3); everything else is re-sent."""
        entries = [e for e in entries if not (e.qos == 2 and e.state == STATE_PUBREL_SENT)]
        # the other session's messages are the cluster's backlog, not this client's falling behind:
        # the merge may take the queue past its limit, drained before the limit applies again
        self._outbound.allow_merged(session, len(entries))
        for entry in entries:
            self._outbound.enqueue(
                session,
                OutEntry(entry.message, entry.qos, entry.retain, list(entry.subscription_identifiers)),
            )

    # ================================================================== restart
    def restore(self, store: StorePort) -> list[tuple[str, bytes]]:
        """Rebuild the persistent sessions from the store; returns the wills of sessions that had
        already ended (client id, encoded will) for the caller to publish."""
        now = self._scheduler.wall_time()
        wills = {client_id: (data, fire_at) for client_id, data, fire_at in store.load_wills()}
        for record in store.load_sessions():
            session = Session(record.client_id, record.protocol_level, record.username)
            session.expiry_interval_s = record.expiry_interval_s
            session.persistent = True
            session.disconnected_at = record.disconnected_at or now
            session.set_incoming_qos2(record.incoming_qos2)
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
                self._subscriptions.add(session, opts)
            for queued in store.load_queue(record.client_id):
                entry = OutEntry(
                    message_from(queued.message),
                    queued.message.qos,
                    queued.message.retain,
                    list(queued.subscription_identifiers),
                    queued.seq,
                    queued.packet_id,
                    queued.state,
                )
                if queued.packet_id is not None and queued.state != STATE_QUEUED:
                    session.inflight_to_fill()[queued.packet_id] = entry
                    session.next_packet_id = queued.packet_id % 65535 + 1
                else:
                    entry.packet_id = None
                    entry.state = STATE_QUEUED
                    session.queue_to_fill().append(entry)
            will_row = wills.pop(record.client_id, None)
            if will_row is not None:
                session.will = decode_will(will_row[0])
                session.will_fire_at = will_row[1]
            self._schedule_restored(session, now)
        return [(client_id, data) for client_id, (data, _fire_at) in wills.items()]

    def _schedule_restored(self, session: Session, now: float) -> None:
        if session.will is not None:
            fire_at = session.will_fire_at
            if fire_at is None:  # the client was connected when the broker stopped: its connection is gone
                delay = int(session.will.properties.get("will_delay_interval", 0))
                if session.expiry_interval_s != NEVER_EXPIRES:
                    delay = min(delay, session.expiry_interval_s)
                fire_at = session.will_fire_at = now + delay
            session.will_handle = self._scheduler.call_later(
                max(0.0, fire_at - now), self._fire_delayed_will, session
            )
        if session.expiry_interval_s != NEVER_EXPIRES:
            remaining = (session.disconnected_at or now) + session.expiry_interval_s - now
            session.expiry_handle = self._scheduler.call_later(max(0.0, remaining), self._expire, session)

    def cancel_timers(self) -> None:
        for session in self.sessions.values():
            session.cancel_timers()

    def counts(self) -> dict[str, Any]:
        sessions = self.sessions.values()
        return {
            "sessions": len(self.sessions),
            "queued": sum(len(s.queue) for s in sessions),
            "inflight": sum(len(s.inflight) for s in self.sessions.values()),
        }
