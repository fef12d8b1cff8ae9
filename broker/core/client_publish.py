"""PUBLISH and the QoS flows of :class:`~broker.core.client.ClientConnection` (MQTT 5.0 §3.3-§3.7, §4.3).

One link of the chain of bases of ``ClientConnection`` (see ``broker.core.client_base``): a
client's PUBLISH (limits, ACL, expiry, routing, acknowledgements held in order for the store and
the cluster), PUBREL, and the acknowledgements of the messages the broker sends (PUBACK, PUBREC,
PUBCOMP).
"""

from __future__ import annotations

import logging

from broker.core.client_base import _FIRST_BYTE, _ack4
from broker.core.client_connect import ClientConnect
from broker.core.drops import MEMORY_HIGH_WATER
from broker.core.ports import Completion
from broker.core.reserved import is_broker_only_topic
from broker.core.session import STATE_PUBREL_SENT, Message, Session
from broker.mqtt import codec
from broker.mqtt.packets import (
    MQTT_5,
    MQTTProtocolError,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
)
from broker.mqtt.protocol import STATE_CLOSED, AckOrder


class ClientPublish(ClientConnect):
    """PUBLISH, PUBREL and the QoS acknowledgements of ``ClientConnection``."""

    __slots__ = ()

    # ------------------------------------------------------------------ PUBLISH (client -> server)
    def handle_publish(self, packet: Publish) -> None:
        broker = self.broker
        session = self.session
        assert session is not None
        bucket = self.publish_bucket
        if bucket is not None and not bucket.take(self._now()):
            broker.log_event(
                logging.WARNING,
                "publish_rate_exceeded",
                client_id=self.client_id,
                peer=self.peer,
                reason_code=int(ReasonCode.MESSAGE_RATE_TOO_HIGH),
                limit_per_s=broker.limits.max_publish_rate,
            )
            self.disconnect(ReasonCode.MESSAGE_RATE_TOO_HIGH, "message rate too high")
            return
        qos = packet.qos
        stats = broker.stats
        stats.messages_received[qos] += 1
        if broker.memory.above:
            if not qos:  # docs/security.md "Memory high-water mark"
                broker.memory.dropped_qos0 += 1
                stats.count_drop(MEMORY_HIGH_WATER)
                return
            broker.pause_producer(self)  # this PUBLISH is handled as usual; no more are read
        protocol = self.protocol
        if packet.properties:
            topic, props = protocol.resolve_topic(packet)
        else:
            topic, props = packet.topic, packet.properties
        limits = broker.limits
        if packet.retain and not limits.retain_available:
            raise MQTTProtocolError(
                "retain is not available", ReasonCode.RETAIN_NOT_SUPPORTED, "MQTT-3.3.1-11"
            )
        if qos > limits.maximum_qos:
            raise MQTTProtocolError("QoS above maximum QoS", ReasonCode.QOS_NOT_SUPPORTED, "MQTT-3.2.2-11")
        packet_id = packet.packet_id or 0
        if qos == 2 and packet_id in session.incoming_qos2:
            # a re-sent PUBLISH whose PUBREL has not arrived: acknowledge, do not deliver again
            # (behind any ack still held for the cluster: acks leave in PUBLISH order)
            self._send_ordered_ack(2, _ack4(0x50, packet_id), None)
            return
        if (
            qos
            and protocol.protocol_level == MQTT_5
            and (
                self.acks.unacknowledged(len(session.incoming_qos2))
                if self.acks is not None
                else len(session.incoming_qos2)
            )
            >= limits.receive_maximum
        ):
            # v5 flow control (§4.9): unacknowledged QoS 1 (acks waiting for the group commit or
            # the cluster) and QoS 2 (waiting for PUBREL) publishes beyond our receive maximum
            raise MQTTProtocolError(
                "more unacknowledged QoS>0 publishes than receive maximum",
                ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                "MQTT-3.3.4-9",
            )
        acl = broker.router.acl  # (``broker.acl`` is a property over it)
        denied = acl is not None and not acl.can_publish(self.client_id, self.username, topic)
        # $skipmq/, $SYS/: the brokers' own (broker.core.reserved); the prefix test first, so that
        # an ordinary topic costs no call
        if denied or (topic.startswith("$") and is_broker_only_topic(topic)):
            stats.count_drop("acl_denied")
            if qos == 0:
                return
            code = ReasonCode.NOT_AUTHORIZED if protocol.protocol_level == MQTT_5 else 0
            if qos == 1:
                self._send_ordered_ack(1, self._ack_bytes(Puback, packet_id, code), None)
            else:
                if code == 0:
                    self._remember_qos2(session, packet_id)
                self._send_ordered_ack(2, self._ack_bytes(Pubrec, packet_id, code), None)
            return
        expiry_at = None
        if props:
            expiry_s = props.get("message_expiry_interval")
            if expiry_s is not None:
                expiry_at = broker.scheduler.wall_time() + expiry_s
        message = Message(
            topic, packet.payload, qos, packet.retain, props, expiry_at, broker.node_id, self.client_id
        )
        result = broker.router.publish(message, self.client_id)
        if qos == 0:
            return
        wait = result.wait
        code = 0
        if not result.matched and wait is None and protocol.protocol_level == MQTT_5:
            code = ReasonCode.NO_MATCHING_SUBSCRIBERS
        if qos == 1:
            ack = self._ack_bytes(Puback, packet_id, code)
        else:
            self._remember_qos2(session, packet_id)
            ack = self._ack_bytes(Pubrec, packet_id, code)
        self._send_ordered_ack(qos, ack, wait)
        if wait is not None:
            # held until the cluster confirmed storage at the subscribers' brokers
            wait.add_done_callback(self._release_held_acks)

    def _send_ordered_ack(self, qos: int, ack: bytes, wait: Completion[bool] | None) -> None:
        """Send an ack now, or behind the acks still held for the cluster (PUBLISH order)."""
        acks = self.acks
        if acks is None:
            acks = self.acks = AckOrder()
        if not acks.push(qos, ack, wait):
            return
        if qos == 1:
            acks.qos1_unacked += 1
        self.send_ack(ack)
        if self.deferred is None:
            acks.qos1_unacked = 0

    def _release_held_acks(self, _done: object = None) -> None:
        if self.protocol.state == STATE_CLOSED:
            return
        acks = self.acks
        if acks is None:
            return
        ready = acks.release()
        if not ready:
            return
        for qos, ack in ready:
            if qos == 1:
                acks.qos1_unacked += 1  # until the group commit lets it leave (receive maximum)
            self.send_ack(ack)
        if self.deferred is None:
            acks.qos1_unacked = 0
        self.broker.after_batch()

    def _remember_qos2(self, session: Session, packet_id: int) -> None:
        session.incoming_qos2_to_fill().add(packet_id)
        self.broker.durability.add_incoming_qos2(session, packet_id)

    def _ack_bytes(
        self, cls: type[Puback] | type[Pubrec] | type[Pubcomp], packet_id: int, code: int
    ) -> bytes:
        if code == 0:
            return _ack4(_FIRST_BYTE[cls], packet_id)
        return codec.encode(cls(packet_id=packet_id, reason_code=code), self.protocol.protocol_level)

    def handle_pubrel(self, packet: Pubrel) -> None:
        session = self.session
        assert session is not None
        packet_id = packet.packet_id
        if packet_id in session.incoming_qos2:
            session.incoming_qos2_to_fill().discard(packet_id)
            self.broker.durability.remove_incoming_qos2(session, packet_id)
            self.send_ack(_ack4(0x70, packet_id))
        else:
            # Not held: the flow for this id is already complete. A client sends PUBREL only after
            # our PUBREC, which leaves only after the commit that stores the id; the id is removed
            # by the commit of its first PUBREL, so this PUBREL is a resend whose PUBCOMP was lost
            # (a kill -9 after that commit, a dropped connection). The message was released once
            # and is not delivered again; the answer is success (as mosquitto's), not 0x92 (MQTT 5
            # §3.7.2.1 allows it), which paho and others report as a failed publish.
            self.broker.log_event(
                logging.DEBUG,
                "pubrel_unknown_packet_id",
                client_id=self.client_id,
                peer=self.peer,
                packet_id=packet_id,
            )
            self.send_ack(_ack4(0x70, packet_id))

    # ------------------------------------------------------------------ acks (server -> client flow)
    def handle_puback(self, packet: Puback) -> None:
        session = self.session
        assert session is not None
        entry = session.inflight.get(packet.packet_id)
        if entry is not None and entry.qos == 1:  # a PUBACK for a QoS 2 message is ignored
            del session.inflight[packet.packet_id]
            self.broker.outbound.complete(session, entry)

    def handle_pubrec(self, packet: Pubrec) -> None:
        session = self.session
        assert session is not None
        packet_id = packet.packet_id
        entry = session.inflight.get(packet_id)
        if entry is None or entry.qos != 2:
            if self.protocol.protocol_level == MQTT_5:
                self.send_packet(
                    Pubrel(packet_id=packet_id, reason_code=ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)
                )
            return
        if packet.reason_code >= 0x80:
            del session.inflight[packet_id]
            self.broker.outbound.complete(session, entry)
            return
        if entry.state != STATE_PUBREL_SENT:
            entry.state = STATE_PUBREL_SENT
            self.broker.outbound.state_changed(session, entry)
        # after the commit that records "PUBREL sent" (MQTT-4.3.3: no PUBLISH again once PUBREL
        # left): the client delivers at PUBREL, and a crash before that commit would restart
        # with "PUBLISH sent" and send the PUBLISH again - a second delivery
        self.send_ack(_ack4(0x62, packet_id))

    def handle_pubcomp(self, packet: Pubcomp) -> None:
        session = self.session
        assert session is not None
        entry = session.inflight.get(packet.packet_id)
        if entry is not None and entry.qos == 2 and entry.state == STATE_PUBREL_SENT:
            del session.inflight[packet.packet_id]
            self.broker.outbound.complete(session, entry)
