"""Outbound: messages towards clients - QoS 0 writes, QoS 1/2 queues and in-flight windows.

MQTT 3.1.1 / 5.0 §4.3 (QoS 1/2 delivery), §4.4 (re-delivery with DUP=1 and the original packet
id on a resumed session), §4.9 (flow control: at most ``min(max_inflight_messages, the client's
Receive Maximum)`` unacknowledged PUBLISHes), §3.3.2.3.3 (message expiry), §3.3.2.3.4 (topic
aliases towards the client) and the client's Maximum Packet Size (MQTT-3.1.2-24, dropped and
counted as ``packet_too_large``). Every message dropped instead of being delivered goes through
``drops`` (:class:`broker.core.drops.DropReporter`: a counter per reason, a rate-limited warning
per client).

A new QoS 2 PUBLISH to a persistent session leaves only after the commit that records its packet
id (``Durability.write_after_commit``, as the PUBREL after the one that records "PUBREL sent"):
after a ``kill -9`` the restarted broker sends it again under the same id (DUP=1), never as a new
message a receiver would deliver twice (MQTT-4.3.3). QoS 1 deliveries do not wait (a second copy
is within at-least-once) unless the connection already holds output, which they then follow, so
that the session's deliveries keep their order; re-sends, already durable, do not wait.

QoS 0 output of one event-loop iteration is coalesced per connection: the fan-out path appends
the encoded PUBLISH to ``conn.out`` and :meth:`Outbound.flush_writes` hands each dirty
connection's output to its transport once (one send() for many messages). A subscriber whose
transport buffer is above ``limits.max_output_buffer_bytes`` gets no QoS 0 messages (counted as
``slow_consumer``), nor does a disconnected session (``qos0_offline``); QoS>0 messages wait in its
bounded queue instead (``limits.max_queued_messages``; when it is full ``limits.queue_overflow``
evicts the oldest queued one, ``queue_full_oldest``, or refuses the new one, ``queue_full_new``).

The cluster's own backlog in a session - a merged session's queue, a catch-up the cluster paced
into it or let in unpaced (docs/cluster.md "Flow control of catch-up") - is counted apart from
that limit: ``session.overdraft`` messages may wait beyond it (``allow_merged``,
``allow_backlog``), at most ``BACKLOG_ALLOWANCE_LIMITS`` queue limits. The allowance lasts while
the cluster still has backlog on its way (``backlog_held``) and then until the queue has drained
below it, and follows the queue down from there (``pump``): the subscriber is then no further
behind the live stream than its own lag, to which the limit alone applies - drop-oldest beyond it,
counted as today.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

from broker.core.drops import (
    EXPIRED,
    PACKET_TOO_LARGE,
    QOS0_OFFLINE,
    QUEUE_FULL_NEW,
    QUEUE_FULL_OLDEST,
    SLOW_CONSUMER,
)
from broker.core.session import STATE_PUBLISH_SENT, STATE_PUBREL_SENT, Message, OutEntry, Session
from broker.mqtt import codec
from broker.mqtt.packets import MQTT_5

if TYPE_CHECKING:
    from broker.config import LimitsConfig
    from broker.core.drops import DropReporter
    from broker.core.durability import Durability
    from broker.core.ports import ClientPort, Scheduler
    from broker.core.stats import BrokerStats


BACKLOG_ALLOWANCE_LIMITS = 4  # the cluster's backlog makes a queue at most this many limits longer


class Outbound:
    """Per-session outgoing queues and in-flight windows, and the per-iteration write coalescing."""

    __slots__ = (
        "_backlog_held",
        "_dirty",
        "_drop_oldest",
        "_durability",
        "_flush_scheduled",
        "_max_queued",
        "_output_cap",
        "_scheduler",
        "_window_cap",
        "drops",
        "stats",
    )

    def __init__(
        self,
        limits: LimitsConfig,
        durability: Durability,
        stats: BrokerStats,
        scheduler: Scheduler,
        drops: DropReporter,
    ) -> None:
        self._window_cap: int = limits.max_inflight_messages
        self._max_queued: int = limits.max_queued_messages
        self._drop_oldest: bool = limits.queue_overflow == "drop_oldest"
        self._output_cap: int = limits.max_output_buffer_bytes
        self._durability = durability
        self.stats = stats
        self.drops = drops
        self._scheduler = scheduler
        self._dirty: list[ClientPort] = []
        self._flush_scheduled = False
        # client ids whose allowance stands whatever their queue (``allow_backlog(held=True)``):
        # the cluster has backlog on its way to them (an unpaced catch-up); at most one per session
        # with an allowance, until ``release_backlog``
        self._backlog_held: set[str] = set()

    # ================================================================== write coalescing
    def mark_dirty(self, conn: ClientPort) -> None:
        """``conn`` has queued output: flush it (with all others) at the end of this loop iteration."""
        self._dirty.append(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._scheduler.call_soon(self.flush_writes)

    def flush_writes(self) -> None:
        self._flush_scheduled = False
        dirty = self._dirty
        self._dirty = []
        for conn in dirty:
            conn.flush()

    # ================================================================== QoS 0
    def send_qos0(
        self,
        session: Session,
        message: Message,
        retain: bool,
        sub_ids: list[int],
        cache: dict[Any, bytes],
    ) -> int:
        """Write a QoS 0 PUBLISH to a connected session now; the encoding is shared through
        ``cache`` by every subscriber with the same (protocol family, retain) form."""
        conn = session.connection
        if conn is None:  # QoS 0 is not queued for a disconnected session (MQTT-3.1.2-5 permits it)
            self.drops.dropped(session.client_id, QOS0_OFFLINE)
            return 0
        if conn.transport.get_write_buffer_size() > self._output_cap:
            self.drops.dropped(session.client_id, SLOW_CONSUMER)
            return 0
        if session.protocol_level != MQTT_5:
            key: Any = retain
        elif not sub_ids and message.expiry_at is None and not session.client_topic_alias_maximum:
            key = (5, retain)
        else:
            key = None
        data = cache.get(key) if key is not None else None
        if data is None:
            data = self.encode_for(session, message, 0, retain, False, None, sub_ids)
            if data is None:
                return 0
            if key is not None:
                cache[key] = data
        elif session.protocol_level == MQTT_5 and len(data) > session.client_max_packet_size:
            self.drops.dropped(session.client_id, PACKET_TOO_LARGE)
            return 0
        out = conn.out  # inlined ClientConnection.write
        if out is None:
            conn.out = [data]
            self.mark_dirty(conn)
        else:
            out.append(data)
        stats = self.stats
        stats.bytes_sent += len(data)
        stats.messages_sent[0] += 1
        return 1

    def encode_for(
        self,
        session: Session,
        message: Message,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        sub_ids: list[int],
    ) -> bytes | None:
        """The PUBLISH for this session; None if the message expired or is too large for it."""
        if session.protocol_level != MQTT_5:
            # MQTT-3.3.2-5 applies to every subscriber: an expired message is deleted for 3.1.1 too
            if message.expiry_at is not None and message.expiry_at <= self._scheduler.wall_time():
                self.drops.dropped(session.client_id, EXPIRED)
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
                remaining = math.ceil(message.expiry_at - self._scheduler.wall_time())
                if remaining <= 0:
                    self.drops.dropped(session.client_id, EXPIRED)
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
            self.drops.dropped(session.client_id, PACKET_TOO_LARGE)
            return None
        return data

    # ================================================================== QoS 1/2
    def window(self, session: Session) -> int:
        cap = self._window_cap
        return cap if cap < session.client_receive_maximum else session.client_receive_maximum

    def enqueue(self, session: Session, entry: OutEntry) -> int:
        """Queue a QoS>0 message for ``session`` (sent at once when its window has room);
        1 if accepted, 0 if the full queue refused it (``queue_overflow = "drop_new"``)."""
        queue = session.queue
        conn = session.connection
        direct = conn is not None and not queue and len(session.inflight) < self.window(session)
        if not direct and len(queue) >= self._max_queued:
            if session.overdraft and len(queue) < self._max_queued + session.overdraft:
                pass  # room a merged session's backlog made (``allow_merged``), until drained
            elif not self._drop_oldest:
                self.drops.dropped(session.client_id, QUEUE_FULL_NEW)
                return 0
            else:
                self.drops.dropped(session.client_id, QUEUE_FULL_OLDEST)
                self._durability.ack(session, session.queue_to_fill().popleft())
        if session.persistent:  # only persistent sessions are stored (Durability checks it too)
            self._durability.enqueue(session, entry)
        if direct:
            self._send_entry(session, entry)
        else:
            session.queue_to_fill().append(entry)
        return 1

    def allow_merged(self, session: Session, count: int) -> None:
        """``count`` messages of another session of the same client are about to be queued into
        ``session`` (a late session merged by the cluster, ``SessionRegistry.adopt_entries``): the
        queue may exceed its limit by what they bring, so the merge itself drops nothing; once the
        queue has drained below that allowance, the allowance follows it down (``pump``;
        docs/cluster.md)."""
        excess = len(session.queue) + count - self._max_queued
        if excess > session.overdraft:
            session.overdraft = excess

    def allow_backlog(self, session: Session, backlog: int, *, held: bool = False) -> None:
        """``backlog`` messages of what ``session``'s queue holds, and of what is still to enter it,
        are the cluster's backlog (a catch-up paced into the queue, or about to enter it unpaced):
        they do not count against the queue limit, which applies to what the subscriber falls
        behind beyond them. At most ``BACKLOG_ALLOWANCE_LIMITS`` queue limits (the memory bound: a
        session's queue holds at most that many limits plus one). ``held``: some of it is still
        on its way - the allowance stands until ``release_backlog``, then follows the queue down
        once it has drained below it (``pump``)."""
        allowance = min(backlog, self._max_queued * BACKLOG_ALLOWANCE_LIMITS)
        if allowance > session.overdraft:
            session.overdraft = allowance
        if held and session.overdraft:
            self._backlog_held.add(session.client_id)

    def release_backlog(self, session: Session) -> None:
        """The backlog ``allow_backlog(held=True)`` announced for ``session`` is in its queue (the
        catch-up is live again, or paced again): its allowance follows the queue down from here."""
        self._backlog_held.discard(session.client_id)
        self._follow_queue_down(session)

    def _follow_queue_down(self, session: Session) -> None:
        """The allowance lasts until the queue has drained below it, then follows it down: the
        subscriber has taken that much of the backlog, and what it falls behind from here is its
        own lag (the limit alone applies to it once the allowance is 0)."""
        depth = len(session.queue)
        if depth < session.overdraft and session.client_id not in self._backlog_held:
            session.overdraft = depth

    def _send_entry(self, session: Session, entry: OutEntry) -> bool:
        conn = session.connection
        assert conn is not None
        packet_id = session.allocate_packet_id()
        data = self.encode_for(
            session, entry.message, entry.qos, entry.retain, False, packet_id, entry.subscription_identifiers
        )
        if data is None:
            self._durability.ack(session, entry)
            return False
        entry.packet_id = packet_id
        entry.state = STATE_PUBLISH_SENT
        session.inflight[packet_id] = entry
        if entry.seq is not None:
            self._durability.set_inflight(session, entry)
            if entry.qos == 2 or conn.deferred is not None:
                # MQTT-4.3.3 / 4.4.0-1: once out, this message goes again only under this packet id;
                # a crash before its commit would restart without it and send it under another one,
                # which a receiver holding this id (PUBREC sent) takes for a new message. A QoS 1
                # message queues behind whatever the connection holds, so that it does not overtake
                # a held QoS 2 message of the same session (delivery order, MQTT-4.6.0)
                self._durability.write_after_commit(conn, data)
                self.stats.messages_sent[entry.qos] += 1
                return True
        conn.write(data)
        self.stats.messages_sent[entry.qos] += 1
        return True

    def _resend(self, session: Session, entry: OutEntry) -> bool:
        """Re-send an unacknowledged PUBLISH with DUP=1 and its original packet id (MQTT-4.4.0-1);
        False if it can no longer be sent (expired / too large: completed as if acknowledged)."""
        packet_id = entry.packet_id
        assert packet_id is not None and session.connection is not None
        data = self.encode_for(
            session, entry.message, entry.qos, entry.retain, True, packet_id, entry.subscription_identifiers
        )
        if data is None:
            del session.inflight[packet_id]
            self._durability.ack(session, entry)
            return False
        session.connection.write(data)
        self.stats.messages_sent[entry.qos] += 1
        return True

    def pump(self, session: Session) -> None:
        window = self.window(session)
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
        if not queue:
            return
        assert isinstance(queue, deque)
        while queue and session.connection is not None and len(session.inflight) < window:
            self._send_entry(session, queue.popleft())
        if session.overdraft and len(queue) < session.overdraft:
            self._follow_queue_down(session)  # the cluster's backlog drained below its allowance

    def resume(self, session: Session) -> None:
        """After CONNACK: re-send unacknowledged messages (DUP=1 / PUBREL), then queued ones.

        PUBRELs are always re-sent, and first: each lets the client complete a QoS 2 message (its
        PUBCOMP) before any PUBLISH arrives, so that a client counting its Receive Maximum by what
        it holds (libmosquitto counts a re-sent PUBLISH of a packet id it already holds once more,
        docs/cluster.md "Known limits") has its slots back. MQTT-4.6.0-1 orders PUBLISHes among
        themselves and PUBRELs among themselves, each kept here. Unacknowledged PUBLISHes go only
        as far as this connection's window allows (the client's Receive Maximum may be smaller
        now, MQTT-3.3.4-9), the rest wait in ``session.unsent`` and go out, in order, as
        acknowledgements arrive.
        """
        conn = session.connection
        if conn is None:
            return
        session.unsent = None
        window = self.window(session)
        on_wire = 0
        entries = list(session.inflight.items())
        for packet_id, entry in entries:
            if entry.state == STATE_PUBREL_SENT:
                conn.write(bytes((0x62, 2, packet_id >> 8, packet_id & 0xFF)))
                on_wire += 1
        for _, entry in entries:
            if entry.state == STATE_PUBREL_SENT:
                continue
            if on_wire >= window:
                if session.unsent is None:
                    session.unsent = deque()
                session.unsent.append(entry)
            elif self._resend(session, entry):
                on_wire += 1
        self.pump(session)

    def complete(self, session: Session, entry: OutEntry) -> None:
        """PUBACK / PUBCOMP received (or PUBREC with a failure code): forget it and send more."""
        self._durability.ack(session, entry)
        unsent = session.unsent
        if unsent:  # drop it if it was acknowledged before it was re-sent on this connection
            session.unsent = unsent = deque(e for e in unsent if e is not entry)
        if session.queue or unsent:
            self.pump(session)

    def state_changed(self, session: Session, entry: OutEntry) -> None:
        """An in-flight QoS 2 entry moved on (PUBREC received, PUBREL sent)."""
        self._durability.set_inflight(session, entry)
