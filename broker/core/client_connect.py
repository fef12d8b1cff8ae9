"""CONNECT of :class:`~broker.core.client.ClientConnection` (MQTT 3.1.1 / 5.0 §3.1, §3.2, §4.1).

One link of the chain of bases of ``ClientConnection`` (see ``broker.core.client_base``): CONNECT
checks, authentication (a password check runs off the core's thread), the cluster's session claim
(the CONNACK waits for a session that moves here), attaching the session and replaying what it
holds, and refusals with the right CONNACK reason code.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.core.client_base import ClientBase
from broker.core.ports import Completion
from broker.core.session import SessionSnapshot
from broker.mqtt.packets import (
    MQTT_5,
    Connack,
    Connect,
    ReasonCode,
)
from broker.mqtt.protocol import STATE_CLOSED

log = logging.getLogger("skipmq.connection")


class ClientConnect(ClientBase):
    """CONNECT of ``ClientConnection``."""

    __slots__ = ()

    # ------------------------------------------------------------------ CONNECT
    def handle_connect(self, packet: Connect) -> None:
        broker = self.broker
        is_v5 = packet.protocol_level == MQTT_5
        props = packet.properties
        self.protocol.connect_received(packet.protocol_level, props)
        if self.refusal is not None:
            self.refuse(self.refusal.reason_code, self.refusal.reason, client_id=packet.client_id)
            return
        if broker.memory.above:
            broker.memory.refused_connects += 1
            self.refuse(
                ReasonCode.SERVER_BUSY,
                "memory above limits.memory_high_water_bytes",
                client_id=packet.client_id,
            )
            return
        if is_v5 and props.get("authentication_method") is not None:
            self.refuse(ReasonCode.BAD_AUTHENTICATION_METHOD, "enhanced authentication is not supported")
            return
        client_id = packet.client_id
        assigned = False
        if not client_id:
            if not is_v5 and not packet.clean_start:
                self.refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "empty client id needs clean session")
                return
            client_id = broker.assign_client_id()
            assigned = True
        if len(client_id.encode()) > broker.limits.max_client_id_length:
            self.refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "client id too long")
            return
        username = packet.username
        if self.cert_username is not None:
            username = self.cert_username
        tls_identity = self.cert_username is not None
        if broker.authentication_is_slow(username, tls_identity=tls_identity):
            self.auth_pending = []
            check = broker.scheduler.run_blocking(
                lambda: broker.authenticate(username, packet.password, tls_identity=False)
            )
            check.add_done_callback(
                lambda done: self._authenticated(done, packet, client_id, assigned, username)
            )
            return
        code = broker.authenticate(username, packet.password, tls_identity=tls_identity)
        self._finish_connect(packet, client_id, assigned, username, code)

    def _authenticated(
        self, done: Completion[int], packet: Connect, client_id: str, assigned: bool, username: str | None
    ) -> None:
        """Back on the core's thread after the password check: connect, then replay the packets
        that arrived meanwhile, in order."""
        pending = self.auth_pending or []
        self.auth_pending = None
        if self.protocol.state == STATE_CLOSED:
            return
        exc = done.exception()
        if exc is not None:
            log.error("password check failed", exc_info=exc)
            self.broker.log_event(
                logging.ERROR, "internal_error", client_id=client_id, peer=self.peer, message=repr(exc)
            )
            code = int(ReasonCode.UNSPECIFIED_ERROR)
        else:
            code = done.result()
        try:
            self._finish_connect(packet, client_id, assigned, username, code)
        except Exception as err:
            self._internal_error(err, "internal error while finishing CONNECT")
            return
        self.dispatch(pending, None)

    def _finish_connect(
        self, packet: Connect, client_id: str, assigned: bool, username: str | None, code: int
    ) -> None:
        broker = self.broker
        is_v5 = packet.protocol_level == MQTT_5
        if code != ReasonCode.SUCCESS:
            self.refuse(code, "not authorized", client_id=client_id, username=username, event="auth_failed")
            return
        if broker.shutting_down:
            self.refuse(ReasonCode.SERVER_UNAVAILABLE, "server shutting down")
            return
        if broker.at_connection_limit(client_id):
            self.refuse(ReasonCode.SERVER_BUSY, "too many connections")
            return
        if broker.owned_by_other(client_id, username):
            self._refuse_not_owner(client_id, username)
            return
        will = packet.will
        if will is not None:
            if will.retain and not broker.limits.retain_available:
                self.refuse(ReasonCode.RETAIN_NOT_SUPPORTED, "retain not available")
                return
            if will.qos > broker.limits.maximum_qos:
                self.refuse(ReasonCode.QOS_NOT_SUPPORTED, "will QoS above maximum QoS")
                return
        self.client_id = client_id
        self.username = username
        keep_alive = packet.keep_alive_s
        server_keep_alive: int | None = None
        max_keepalive = broker.limits.max_keepalive_s
        if is_v5 and max_keepalive and (keep_alive == 0 or keep_alive > max_keepalive):
            keep_alive = max_keepalive
            server_keep_alive = max_keepalive
        claim = broker.cluster.before_attach(client_id, packet.clean_start, username)
        if claim is not None:  # another broker may hold this client: wait for its hand-over
            self.auth_pending = []
            claim.add_done_callback(
                lambda done: self._claimed(done, packet, client_id, assigned, keep_alive, server_keep_alive)
            )
            return
        self._attach(packet, client_id, assigned, keep_alive, server_keep_alive)

    def _claimed(
        self,
        done: Completion[SessionSnapshot | None],
        packet: Connect,
        client_id: str,
        assigned: bool,
        keep_alive: int,
        server_keep_alive: int | None,
    ) -> None:
        """The cluster answered the session claim: import a handed-over session, attach, then
        replay the packets that arrived meanwhile."""
        broker = self.broker
        refused = isinstance(done.exception(), PermissionError)
        snapshot = None if done.exception() is not None else done.result()
        if refused and self.protocol.state != STATE_CLOSED:
            self.auth_pending = None
            self._refuse_not_owner(client_id, self.username)
            return
        if self.protocol.state == STATE_CLOSED:
            self.auth_pending = None
            if snapshot is not None:
                # the other broker already ended its copy: keep the session here as a stored one
                # (its queued messages were acknowledged to their publishers)
                try:
                    broker.import_session(snapshot)
                except Exception:
                    log.exception("cannot keep a session handed over to a closed connection")
            return
        ready: Completion[bool] | None = None
        try:
            if snapshot is not None:
                broker.import_session(snapshot)
                # the CONNACK promises the moved subscriptions: once their classes are reachable
                ready = broker.cluster.subscriptions_ready(
                    [(sub.match_filter, sub.share_group) for sub in snapshot.subscriptions]
                )
        except Exception as exc:
            self.auth_pending = None
            self._internal_error(exc, "internal error while importing a handed-over session")
            return
        if ready is not None:  # packets keep collecting in auth_pending meanwhile
            ready.add_done_callback(
                lambda _done: self._attach_and_replay(
                    packet, client_id, assigned, keep_alive, server_keep_alive
                )
            )
            return
        self._attach_and_replay(packet, client_id, assigned, keep_alive, server_keep_alive)

    def _attach_and_replay(
        self, packet: Connect, client_id: str, assigned: bool, keep_alive: int, server_keep_alive: int | None
    ) -> None:
        pending = self.auth_pending or []
        self.auth_pending = None
        if self.protocol.state == STATE_CLOSED:
            return
        if self.broker.owned_by_other(client_id, self.username):  # a session handed over for another user
            self._refuse_not_owner(client_id, self.username)
            return
        try:
            self._attach(packet, client_id, assigned, keep_alive, server_keep_alive)
        except Exception as exc:
            self._internal_error(exc, "internal error while attaching a handed-over session")
            return
        self.dispatch(pending, None)

    def _attach(
        self, packet: Connect, client_id: str, assigned: bool, keep_alive: int, server_keep_alive: int | None
    ) -> None:
        broker = self.broker
        is_v5 = packet.protocol_level == MQTT_5
        props = packet.properties
        session, session_present, expiry_s, expiry_capped = broker.registry.attach(self, packet, client_id)
        self.session = session
        self.protocol.connected(keep_alive)
        connack_props: dict[str, Any] = {}
        if is_v5:
            limits = broker.limits
            connack_props["receive_maximum"] = limits.receive_maximum
            connack_props["topic_alias_maximum"] = limits.topic_alias_maximum
            connack_props["maximum_packet_size"] = broker.max_packet_size
            if not limits.retain_available:
                connack_props["retain_available"] = 0
            if limits.maximum_qos < 2:
                connack_props["maximum_qos"] = limits.maximum_qos
            if assigned:
                connack_props["assigned_client_identifier"] = client_id
            if server_keep_alive is not None:
                connack_props["server_keep_alive"] = server_keep_alive
            if expiry_capped:
                connack_props["session_expiry_interval"] = expiry_s
            if props.get("request_response_information"):
                connack_props["response_information"] = f"response/{client_id}"
        self.send_packet(Connack(session_present=session_present, reason_code=0, properties=connack_props))
        broker.log_event(
            logging.INFO,
            "client_connected",
            client_id=client_id,
            username=self.username,
            peer=self.peer,
            listener=self.listener,
            protocol_level=packet.protocol_level,
            clean_start=packet.clean_start,
            keep_alive_s=keep_alive,
            session_present=session_present,
        )
        broker.router.withhold_unreadable(session)
        if session.inflight or session.queue:
            broker.outbound.resume(session)
        else:  # nothing to re-send or send (resume would find no entry and an empty queue)
            session.unsent = None
        # only now: what the cluster delivers at once (a moved session's catch-up from the send
        # log) follows the CONNACK (MQTT-3.2.0-1) and the session's re-sent in-flight messages
        # (order per publisher). Told inside ``registry.attach``, 18 PUBLISHes went out before
        # both (seed 361 of the finite-clients sweep, tests/sim/cluster/test_failing_seeds_sim.py)
        broker.cluster.on_client_connected(client_id, session_present)

    def _refuse_not_owner(self, client_id: str, username: str | None) -> None:
        """The client id's session belongs to another user (here or on another broker of the
        cluster): refused with 0x87 Not authorized (3.1.1: return code 5); the session stays
        untouched for its owner (docs/security.md)."""
        self.refuse(
            ReasonCode.NOT_AUTHORIZED,
            "client id in use by another user",
            client_id=client_id,
            username=username,
            event="session_owner_mismatch",
        )

    def refuse(
        self,
        reason_code: int,
        reason_string: str,
        *,
        client_id: str | None = None,
        username: str | None = None,
        event: str = "connect_refused",
    ) -> None:
        """CONNACK with a failure code (mapped to a 3.1.1 return code by the codec), then close.
        Logged as ``event`` (``auth_failed`` for a bad username/password, at WARNING)."""
        props: dict[str, Any] = {}
        if self.protocol.protocol_level == MQTT_5:
            props["reason_string"] = reason_string
        self.send_packet(Connack(session_present=False, reason_code=int(reason_code), properties=props))
        self.broker.log_event(
            logging.WARNING if event in ("auth_failed", "session_owner_mismatch") else logging.INFO,
            event,
            client_id=client_id if client_id is not None else self.client_id,
            username=username,
            peer=self.peer,
            listener=self.listener,
            reason_code=int(reason_code),
            reason=reason_string,
        )
        self.close(fire_will=False)
