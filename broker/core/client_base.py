"""The base of :class:`~broker.core.client.ClientConnection`: its state, output and close.

One link of the chain of bases that makes up ``ClientConnection`` (``broker.core.client``; the
overlay's ``OverlayNode`` is split the same way): the connection's slots and ``__init__``, the end
of the stream and the keep-alive / CONNECT-timeout check, writing (per-iteration output, acks held
for the group commit), server-side close and disconnect, protocol and internal errors (MQTT 3.1.1 /
5.0 §4.13, §3.14). Every method is a direct method of ``ClientConnection`` (no call layer added).
Also :class:`BrokerForClients`, the protocol of what a connection uses of its broker (so that no
module of the connection names ``broker.core.broker``, which imports them: ``broker.core`` is a
tree).
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Any, Protocol

from broker.core.admission import Refusal, TokenBucket, address_of, transport_peer_name
from broker.core.session import Message, Session, SessionSnapshot, SubOptions
from broker.mqtt import codec
from broker.mqtt.packets import (
    MQTT_5,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MQTTProtocolError,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    ReasonCode,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from broker.mqtt.protocol import (
    STATE_CLOSED,
    STATE_CONNECTED,
    STATE_CONNECTING,
    TIMEOUT_CONNECT,
    AckOrder,
    ServerProtocol,
)

if TYPE_CHECKING:
    from broker.config import LimitsConfig
    from broker.core.durability import Durability
    from broker.core.memory_guard import MemoryGuard
    from broker.core.outbound import Outbound
    from broker.core.ports import AclPort, ClientPort, ClientTransport, ClusterPort, Scheduler
    from broker.core.routing import Router
    from broker.core.sessions import SessionRegistry
    from broker.core.stats import BrokerStats

log = logging.getLogger("skipmq.connection")

PINGRESP_BYTES = b"\xd0\x00"


_pack_ack4 = struct.Struct(">BBH").pack


def _ack4(first_byte: int, packet_id: int) -> bytes:
    return _pack_ack4(first_byte, 2, packet_id)


class BrokerForClients(Protocol):
    """What a :class:`ClientConnection` uses of its broker (``broker.core.broker.Broker``).

    A protocol next to its user rather than the ``Broker`` class, so that this module does not
    name ``broker.core.broker`` (which imports it): the import graph of ``broker.core``, type
    references included, has no cycle (tests/architecture/test_layout.py).
    """

    @property
    def node_id(self) -> str: ...

    @property
    def limits(self) -> LimitsConfig: ...

    @property
    def max_packet_size(self) -> int: ...

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def cluster(self) -> ClusterPort: ...

    @property
    def acl(self) -> AclPort | None: ...

    @property
    def stats(self) -> BrokerStats: ...

    @property
    def memory(self) -> MemoryGuard: ...

    @property
    def durability(self) -> Durability: ...

    @property
    def outbound(self) -> Outbound: ...

    @property
    def registry(self) -> SessionRegistry: ...

    @property
    def router(self) -> Router: ...

    @property
    def shutting_down(self) -> bool: ...

    def log_event(self, level: int, event: str, **fields: Any) -> None: ...

    def connection_gone(self, conn: ClientBase) -> None: ...

    def at_connection_limit(self, client_id: str | None = None) -> bool: ...

    def pause_producer(self, conn: ClientBase) -> None: ...

    def authenticate(self, username: str | None, password: bytes | None, *, tls_identity: bool) -> int: ...

    def authentication_is_slow(self, username: str | None, *, tls_identity: bool) -> bool: ...

    def assign_client_id(self) -> str: ...

    def connection_closed(self, conn: ClientPort, session: Session, *, fire_will: bool) -> None: ...

    def subscribe(
        self, session: Session, packet: Subscribe
    ) -> tuple[list[int], list[tuple[SubOptions, Message]]]: ...

    def unsubscribe(self, session: Session, topic_filters: list[str]) -> list[int]: ...

    def owned_by_other(self, client_id: str, username: str | None) -> bool: ...

    def import_session(self, snapshot: SessionSnapshot) -> None: ...

    def commit_now(self) -> bool: ...

    def after_batch(self) -> None: ...


class ClientBase:
    """State, output and close of ``ClientConnection`` (broker.core.client)."""

    __slots__ = (
        "_now",
        "acks",
        "auth_pending",
        "broker",
        "cert_username",
        "client_id",
        "close_reason",
        "deferred",
        "fire_will",
        "listener",
        "out",
        "peer_or_none",
        "protocol",
        "publish_bucket",
        "refusal",
        "session",
        "transport",
        "username",
    )

    def __init__(
        self,
        broker: BrokerForClients,
        transport: ClientTransport,
        listener: str = "tcp",
        *,
        peer: str | None = "",
        cert_username: str | None = None,
    ) -> None:
        self.broker = broker
        self.transport = transport
        self.listener = listener
        # None: the transport's own address, formatted when asked (``peer``)
        self.peer_or_none = peer
        self.cert_username = cert_username
        self._now = broker.scheduler.time
        self.protocol = ServerProtocol(
            max_packet_size=broker.max_packet_size,
            topic_alias_maximum=broker.limits.topic_alias_maximum,
            now=self._now(),
            max_connect_packet_size=broker.limits.max_connect_packet_bytes,
        )
        rate = broker.limits.max_publish_rate
        self.publish_bucket = TokenBucket(rate, 2.0 * rate, self._now()) if rate else None
        # set by the broker when this socket is over a per-IP limit: refused at its CONNECT
        self.refusal: Refusal | None = None
        # the client's QoS>0 PUBLISHes' acknowledgements in order: made by its first one (48 B
        # less per idle connection; a subscriber that never publishes QoS>0 has none)
        self.acks: AckOrder | None = None
        self.session: Session | None = None
        self.client_id = ""
        self.username: str | None = None
        self.close_reason = ""  # why a connected client's connection ended (client_disconnected log)
        self.fire_will = True
        self.deferred: list[bytes] | None = None
        self.out: list[bytes] | None = None
        # packets that arrived behind CONNECT while its password check or session claim runs
        self.auth_pending: list[Packet] | None = None

    @property
    def state(self) -> int:
        return self.protocol.state

    @property
    def peer(self) -> str:
        """The client's ``host:port`` (logs, admin API); asked of the transport when it was not
        given, so that an idle connection keeps no string of its own (64 B)."""
        peer = self.peer_or_none
        return transport_peer_name(self.transport) if peer is None else peer

    @property
    def address(self) -> str:
        """The client's IP address (per-address admission limits); derived from ``peer`` when
        asked, so that a connection does not keep a second string (58 B per idle connection)."""
        return address_of(self.peer)

    if TYPE_CHECKING:  # defined by ClientConnection (it dispatches through its handler table)

        def dispatch(self, packets: list[Packet], decode_error: MQTTProtocolError | None) -> None: ...

    # ------------------------------------------------------------------ driven by the adapter
    def lost(self) -> None:
        """The transport closed (by the peer, a network error, or after our own close)."""
        if self.protocol.state != STATE_CLOSED:
            self.close_reason = self.close_reason or "connection lost"
            self._closed(fire_will=self.fire_will)
        self.broker.connection_gone(self)

    def check_timeouts(self, now: float, connect_timeout_s: float) -> None:
        reason = self.protocol.timed_out(now, connect_timeout_s)
        if reason is None:
            return
        if reason == TIMEOUT_CONNECT:
            self.broker.log_event(logging.INFO, reason, peer=self.peer)
            self.close(fire_will=False)
        else:
            self.broker.log_event(logging.INFO, reason, client_id=self.client_id, peer=self.peer)
            self.disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, "keep alive timeout", fire_will=True)

    # ------------------------------------------------------------------ output
    def write(self, data: bytes) -> None:
        """Queue output; the broker flushes every dirty connection once per loop iteration.

        Coalescing the packets of one iteration into one ``transport.write`` saves a send()
        system call per message on the fan-out path.
        """
        if self.protocol.state == STATE_CLOSED:
            return
        out = self.out
        if out is None:
            self.out = [data]
            self.broker.outbound.mark_dirty(self)
        else:
            out.append(data)
        self.broker.stats.bytes_sent += len(data)

    def flush(self) -> None:
        out = self.out
        if out is None:
            return
        self.out = None
        transport = self.transport
        if not transport.is_closing():
            transport.write(out[0] if len(out) == 1 else b"".join(out))

    def send_packet(self, packet: Packet) -> None:
        """Send a control packet (within the client's Maximum Packet Size, or not at all)."""
        protocol = self.protocol
        data = protocol.encode(packet)
        name = _NAMES[type(packet)]
        if not protocol.fits(data):
            self.broker.log_event(
                logging.WARNING,
                "packet_too_large_for_client",
                client_id=self.client_id,
                peer=self.peer,
                packet_type=name,
                size_bytes=len(data),
            )
            return
        sent = self.broker.stats.packets_sent
        sent[name] = sent.get(name, 0) + 1
        self.write(data)

    def send_ack(self, data: bytes) -> None:
        """Send an acknowledgement, after the pending group commit if the store has uncommitted work."""
        broker = self.broker
        sent = broker.stats.packets_sent
        name = _FIRST_BYTE_NAMES[data[0] >> 4]
        sent[name] += 1
        deferred = self.deferred
        if deferred is not None:
            # behind the held ones; with a commit in flight in the background, this one may need
            # the next commit (its write is not in the one in flight)
            deferred.append(data)
            broker.durability.defer_until_commit(self)
        elif broker.durability.pending():
            self.deferred = [data]
            broker.durability.defer_until_commit(self)
        else:
            self.write(data)

    def deferred_count(self) -> int:
        deferred = self.deferred
        return len(deferred) if deferred is not None else 0

    def flush_deferred(self, count: int | None = None) -> None:
        deferred = self.deferred
        if deferred is not None and count is not None and count < len(deferred):
            # a background commit covered the first ``count``; the rest wait for the next one
            self.deferred = deferred[count:]
            if self.acks is not None:
                self.acks.qos1_unacked = sum(1 for ack in self.deferred if ack[0] >> 4 == _PUBACK)
            if count:
                self.write(b"".join(deferred[:count]))
            return
        self.deferred = None
        if deferred:
            if self.acks is not None:
                self.acks.qos1_unacked = 0
            self.write(b"".join(deferred))

    def drop_deferred(self) -> None:
        self.deferred = None
        self.close()

    def disconnect(
        self, reason_code: int, reason_string: str | None = None, *, fire_will: bool = True
    ) -> None:
        """Server-initiated close: v5 DISCONNECT with the reason code, then close the connection."""
        protocol = self.protocol
        if protocol.state == STATE_CLOSED:
            return
        self.close_reason = self.close_reason or reason_string or f"reason code 0x{int(reason_code):02X}"
        if self.deferred is not None:
            # held acks may only leave after the commit that made their messages durable: commit
            # now (on failure the broker closes this connection without sending them)
            self.broker.commit_now()
            if protocol.state == STATE_CLOSED:
                return
        if protocol.protocol_level == MQTT_5 and protocol.state == STATE_CONNECTED:
            props: dict[str, Any] = {"reason_string": reason_string} if reason_string else {}
            self.send_packet(Disconnect(reason_code=reason_code, properties=props))
        self.close(fire_will=fire_will)

    def close(self, *, fire_will: bool = True) -> None:
        if self.protocol.state == STATE_CLOSED:
            return
        self.flush()
        self._closed(fire_will=fire_will, transport=self.transport)
        self.broker.connection_gone(self)  # at once: the connection limit counts live sockets

    def _closed(self, *, fire_will: bool, transport: ClientTransport | None = None) -> None:
        """Enter the closed state (closing ``transport`` then), detach from the session."""
        protocol = self.protocol
        was_connected = protocol.state == STATE_CONNECTED
        protocol.closed()
        if transport is not None:
            transport.close()
        if was_connected:
            self.broker.log_event(
                logging.INFO,
                "client_disconnected",
                client_id=self.client_id,
                username=self.username,
                peer=self.peer,
                listener=self.listener,
                reason=self.close_reason or "closed by the server",
                will=fire_will,
            )
        if was_connected and self.session is not None:
            self.broker.connection_closed(self, self.session, fire_will=fire_will)

    def protocol_error(self, err: MQTTProtocolError, packet_type: str | None = None) -> None:
        broker = self.broker
        if packet_type is None:
            packet_type = "CONNECT" if err.during_connect else _packet_type_name(err)
        broker.stats.packet_errors[packet_type] = broker.stats.packet_errors.get(packet_type, 0) + 1
        broker.log_event(
            logging.WARNING,
            "protocol_error",
            client_id=self.client_id,
            peer=self.peer,
            reason_code=err.reason_code,
            statement=err.statement,
            message=str(err),
        )
        if self.protocol.state == STATE_CONNECTING:
            data = codec.connack_for_error(err, self.protocol.decoder.protocol_level)
            if data:
                self.write(data)
            self.close()
            return
        self.disconnect(err.reason_code, str(err)[:200])

    def _internal_error(self, exc: BaseException, what: str) -> None:
        broker = self.broker
        if broker.durability.is_store_error(exc):
            broker.durability.store_failed(exc)
        log.error(what, exc_info=exc)
        broker.log_event(
            logging.ERROR, "internal_error", client_id=self.client_id, peer=self.peer, message=repr(exc)
        )
        self.disconnect(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR, "internal error")
        broker.after_batch()


_FIRST_BYTE: dict[type, int] = {Puback: 0x40, Pubrec: 0x50, Pubcomp: 0x70}
_NAMES: dict[type, str] = {
    cls: cls.__name__.upper()
    for cls in (
        Connect,
        Connack,
        Publish,
        Puback,
        Pubrec,
        Pubrel,
        Pubcomp,
        Subscribe,
        Suback,
        Unsubscribe,
        Unsuback,
        Pingreq,
        Disconnect,
        Auth,
    )
}
_NAMES[Pingresp] = "PINGRESP"
_FIRST_BYTE_NAMES = {int(t): t.name for t in PacketType}
_PUBACK = int(PacketType.PUBACK)


def _packet_type_name(err: MQTTProtocolError) -> str:
    name = getattr(err, "packet_type", None)
    if isinstance(name, str) and name:
        return name
    if isinstance(name, int):
        try:
            return PacketType(name).name
        except ValueError:
            return "UNKNOWN"
    text = str(err).upper()  # the codec names the packet in its messages ("PUBLISH topic ...")
    for packet_type in PacketType:
        if packet_type.name in text:
            return packet_type.name
    return "UNKNOWN"
