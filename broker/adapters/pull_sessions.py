"""Pull sessions: a device's HTTP requests drive an ordinary MQTT session of the core (seed 001 §4).

A pull session is a persistent MQTT session in all but transport. Each client id that makes
requests gets a :class:`PullLink`: a core ``ClientConnection`` (``BrokerApi.new_client``, listener
"http") whose transport is :class:`PullTransport`, fed MQTT 5 packets the gateway encodes (CONNECT
with the device's credentials, SUBSCRIBE, PUBLISH, PUBACK/PUBREC/PUBCOMP, DISCONNECT) and whose
output the gateway decodes. So the session's durable queue, retained messages, password file and
ACL, session expiry and takeover are the MQTT ones: a CONNECT from a device over MQTT with the
same client id takes the session over from the link (and a request takes it back), and in a
cluster the CONNECT of a link at a broker that is not the session's home moves the session here
through the cluster's takeover (``broker.cluster.takeover``), queued messages included.

A link stays attached for ``pull.lease_s`` after its last request (messages flow into its
:class:`broker.core.pull.PullBuffer`), then sends DISCONNECT (normal: no will) and the session
waits, disconnected, like any MQTT session. The sequence number of a message is its number in
the session's durable queue (``OutEntry.seq``, the store's per-session sequence); without a store
the link numbers them itself, and the epoch says which numbering a number belongs to.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import logging
import secrets
from typing import TYPE_CHECKING, Any

from broker.core.pull import PUBACK, PullBuffer, PulledMessage
from broker.mqtt import codec
from broker.mqtt.packets import (
    MQTT_5,
    Connack,
    Connect,
    Disconnect,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
)

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.core.broker import Broker
    from broker.core.client import ClientConnection

log = logging.getLogger("skipmq.pull")

RECEIVE_MAXIMUM = 64  # in flight towards a link: a response's 16 and the next ones ready
CORE_REPLY_TIMEOUT_S = 15.0  # CONNACK (password check, a session moving here), SUBACK, PUBACK


class PullError(Exception):
    """A request the session refused: ``status`` and ``detail`` for the problem document."""

    def __init__(self, status: int, detail: str, limit: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.limit = limit


class PullTransport:
    """The core connection's transport: decodes what the core writes and hands it to the link."""

    def __init__(self, link: PullLink) -> None:
        self._link = link
        self._decoder = codec.Decoder(role="client", protocol_level=MQTT_5)
        self._closing = False

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        for packet in self._decoder.feed(data):
            self._link.from_core(packet)

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._link.core_closed()

    def is_closing(self) -> bool:
        return self._closing

    def get_write_buffer_size(self) -> int:
        return 0


class PullLink:
    """One client id's attachment: the core connection, the pull buffer and waiting requests."""

    def __init__(
        self, gateway: PullGateway, client_id: str, username: str | None, password: str | None
    ) -> None:
        self.gateway = gateway
        self.client_id = client_id
        self.username = username
        self._password_digest = _digest(password)
        self.buffer = PullBuffer()
        self.transport = PullTransport(self)
        self.conn: ClientConnection | None = None
        self.closed = False
        self.session_present = False
        self.disconnect_reason: int | None = None  # the core's DISCONNECT reason code, if any
        self.ended_by_close = False  # POST /v1/sessions/close ended the session
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._connack: asyncio.Future[Connack] = loop.create_future()
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._packet_ids = itertools.cycle(range(1, 65536))
        self._arrival = asyncio.Event()
        self._lease: asyncio.TimerHandle | None = None
        self.busy = 0  # requests in progress (the lease does not end under them)
        self._numbers: dict[int, int] = {}  # packet id -> number (no store: the link numbers)
        self._next_number = 1
        self.epoch = (
            gateway.node_id if gateway.numbered_by_store else f"{gateway.node_id}/{secrets.token_hex(4)}"
        )

    def same_credentials(self, username: str | None, password: str | None) -> bool:
        return self.username == username and hmac.compare_digest(self._password_digest, _digest(password))

    # ---------------------------------------------------------------- towards the core
    def send(self, packet: Any) -> None:
        conn = self.conn
        if conn is not None and not self.closed:
            conn.receive(codec.encode(packet, MQTT_5))

    async def connect(self, *, clean_start: bool, expiry_s: int, password: str | None) -> None:
        broker = self.gateway.broker
        conn = broker.new_client(self.transport, "http", peer=f"http:{self.client_id}")
        if conn is None:
            raise PullError(503, "the broker refuses more connections (limits.max_connections)")
        self.conn = conn
        self.send(
            Connect(
                client_id=self.client_id,
                protocol_level=MQTT_5,
                clean_start=clean_start,
                keep_alive_s=0,
                username=self.username,
                password=password.encode() if password is not None else None,
                properties={"session_expiry_interval": expiry_s, "receive_maximum": RECEIVE_MAXIMUM},
            )
        )
        connack = await self._await(self._connack, "CONNACK")
        if connack.reason_code != 0:
            self.closed = True
            code = connack.reason_code
            if code in (0x86, 0x8C):
                raise PullError(401, "bad user name or password (the broker's password file)")
            if code == 0x87 and self.username is None:
                raise PullError(401, "credentials required: anonymous clients are not allowed (HTTP Basic)")
            if code in (0x87, 0x85):
                raise PullError(403, f"not authorized to connect as client id {self.client_id!r}")
            raise PullError(503, f"the broker refused the session (MQTT reason code 0x{code:02X})")
        self.session_present = connack.session_present

    async def _await(self, future: asyncio.Future[Any], what: str) -> Any:
        try:
            return await asyncio.wait_for(asyncio.shield(future), CORE_REPLY_TIMEOUT_S)
        except TimeoutError:
            raise PullError(
                503, f"the broker did not answer ({what}) within {CORE_REPLY_TIMEOUT_S:.0f} s"
            ) from None

    def _reply_future(self) -> tuple[int, asyncio.Future[Any]]:
        for packet_id in self._packet_ids:
            if packet_id not in self._replies:
                future: asyncio.Future[Any] = self._loop.create_future()
                self._replies[packet_id] = future
                return packet_id, future
        raise PullError(503, "too many requests in flight")  # pragma: no cover

    async def subscribe(self, subscriptions: list[tuple[str, int]]) -> list[int]:
        packet_id, future = self._reply_future()
        self.send(
            Subscribe(packet_id=packet_id, subscriptions=[Subscription(f, q) for f, q in subscriptions])
        )
        suback: Suback = await self._await(future, "SUBACK")
        return list(suback.reason_codes)

    async def publish(self, publish: Publish) -> int:
        """Publish for the device; the reason code of the PUBACK/PUBREC (sent after the commit)."""
        if publish.qos == 0:
            self.send(publish)
            return 0
        packet_id, future = self._reply_future()
        publish.packet_id = packet_id
        self.send(publish)
        ack = await self._await(future, "PUBACK" if publish.qos == 1 else "PUBREC")
        if publish.qos == 2:
            self.send(Pubrel(packet_id=packet_id))  # its PUBCOMP is forgotten
        return int(ack.reason_code)

    def acknowledge(self, seqs: tuple[int, ...]) -> None:
        """The device received these numbers: complete them in the core (deletes them)."""
        for kind, packet_id in self.buffer.acknowledge(seqs):
            if kind == PUBACK:
                self._numbers.pop(packet_id, None)
                self.send(Puback(packet_id))
            else:
                self.send(Pubrec(packet_id))

    def disconnect(self, expiry_s: int | None = None) -> None:
        """End the attachment (normal DISCONNECT: no will); ``expiry_s`` = 0 ends the session."""
        props = {"session_expiry_interval": expiry_s} if expiry_s is not None else {}
        self.send(Disconnect(reason_code=0, properties=props))
        self.core_closed()

    # ---------------------------------------------------------------- from the core
    def from_core(self, packet: Any) -> None:
        if isinstance(packet, Publish):
            self._delivered(packet)
        elif isinstance(packet, Pubrel):
            for _kind, packet_id in self.buffer.released(packet.packet_id):
                self._numbers.pop(packet_id, None)
                self._loop.call_soon(self.send, Pubcomp(packet_id))
        elif isinstance(packet, Connack):
            if not self._connack.done():
                self._connack.set_result(packet)
        elif isinstance(packet, (Puback, Pubrec, Suback, Unsuback)):
            future = self._replies.pop(packet.packet_id, None)
            if future is not None and not future.done():
                future.set_result(packet)
        elif isinstance(packet, Pubcomp):
            pass
        elif isinstance(packet, Disconnect):
            self.disconnect_reason = packet.reason_code
            log.info(
                "pull session %s: disconnected by the broker (reason 0x%02X)",
                self.client_id,
                packet.reason_code,
            )

    def _delivered(self, packet: Publish) -> None:
        seq: int | None = None
        if packet.qos:
            assert packet.packet_id is not None
            seq = self._number(packet.packet_id)
            if seq is None:
                return  # no longer in flight (the session moved on): it is not ours to serve
        self.buffer.delivered(
            PulledMessage(
                seq,
                packet.packet_id,
                packet.topic,
                packet.payload,
                packet.qos,
                packet.retain,
                dict(packet.properties),
            )
        )
        self._arrival.set()

    def _number(self, packet_id: int) -> int | None:
        session = self.gateway.broker.sessions.get(self.client_id)
        entry = session.inflight.get(packet_id) if session is not None else None
        if entry is None:
            return None
        if entry.seq is not None and self.gateway.numbered_by_store:
            return entry.seq
        number = self._numbers.get(packet_id)
        if number is None:
            number = self._numbers[packet_id] = self._next_number
            self._next_number += 1
        return number

    def core_closed(self) -> None:
        """The core closed the connection (takeover, shutdown, our DISCONNECT)."""
        if self.closed:
            return
        self.closed = True
        self.buffer.clear()
        self._arrival.set()
        if self._lease is not None:
            self._lease.cancel()
        for future in self._replies.values():
            if not future.done():
                future.set_exception(self.closed_error())
        if not self._connack.done():
            self._connack.set_exception(PullError(503, "the broker closed the session's connection"))
        self._replies.clear()
        self.gateway.forget(self)
        conn = self.conn
        if conn is not None:
            self._loop.call_soon(conn.lost)

    def closed_error(self) -> PullError:
        """Why requests on this closed link fail."""
        reason = self.disconnect_reason
        if self.ended_by_close:
            return PullError(
                410,
                "the session was ended by POST /v1/sessions/close while this request waited: its "
                "queue and subscriptions are gone; open a new one with /v1/sessions/open",
            )
        if reason == 0x8E:
            return PullError(409, "the session was taken over by another connection")
        if reason == 0x8B:
            return PullError(503, "the broker is shutting down")
        return PullError(503, "the broker closed the session's connection; retry the request")

    # ---------------------------------------------------------------- waiting
    async def wait_for_messages(self, timeout_s: float) -> None:
        if len(self.buffer) or self.closed or timeout_s <= 0:
            return
        self._arrival.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrival.wait(), timeout_s)

    def renew_lease(self, lease_s: float) -> None:
        if self._lease is not None:
            self._lease.cancel()
        if not self.closed:
            self._lease = self._loop.call_later(lease_s, self._lease_ended)

    def _lease_ended(self) -> None:
        self._lease = None
        if self.busy:
            self.renew_lease(self.gateway.lease_s)
            return
        self.disconnect()


def _digest(password: str | None) -> bytes:
    return hashlib.sha256(b"\x00" if password is None else b"\x01" + password.encode()).digest()


class PullGateway:
    """Every pull link of this broker, by client id."""

    def __init__(self, broker: Broker, config: BrokerConfig) -> None:
        self.broker = broker
        self.node_id = broker.node_id
        self.numbered_by_store = broker.store is not None
        self.lease_s = float(config.pull.lease_s)
        self.default_expiry_s = config.pull.session_expiry_s
        self.links: dict[str, PullLink] = {}
        self._attaching: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # lock, requests using it

    def forget(self, link: PullLink) -> None:
        if self.links.get(link.client_id) is link:
            del self.links[link.client_id]

    async def attach(
        self,
        client_id: str,
        username: str | None,
        password: str | None,
        *,
        clean_start: bool = False,
        expiry_s: int | None = None,
    ) -> PullLink:
        """The link of ``client_id`` for a request with these credentials: the attached one when
        they match (and no clean start is asked), else a new CONNECT (checked by the broker)."""
        entry = self._attaching.get(client_id)
        if entry is None:
            entry = self._attaching[client_id] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                return await self._attach_locked(client_id, username, password, clean_start, expiry_s)
        finally:
            users[0] -= 1
            if not users[0]:
                del self._attaching[client_id]  # bounded: a lock per client id being attached

    async def _attach_locked(
        self,
        client_id: str,
        username: str | None,
        password: str | None,
        clean_start: bool,
        expiry_s: int | None,
    ) -> PullLink:
        link = self.links.get(client_id)
        if (
            link is not None
            and not link.closed
            and not clean_start
            and link.same_credentials(username, password)
        ):
            link.session_present = True
            return link
        new = PullLink(self, client_id, username, password)
        session = self.broker.sessions.get(client_id)
        if expiry_s is None:
            expiry_s = (
                session.expiry_interval_s
                if session is not None and session.expiry_interval_s
                else self.default_expiry_s
            )
        try:
            await new.connect(clean_start=clean_start, expiry_s=expiry_s, password=password)
        except PullError:
            if not new.closed:
                new.core_closed()
            raise
        self.links[client_id] = new
        new.renew_lease(self.lease_s)
        return new

    def commit(self) -> None:
        """Make what the acknowledgements changed durable, and let the core hand out what they
        made room for, before a response leaves (a number is only sent once committed)."""
        broker = self.broker
        broker.outbound.flush_writes()
        if broker.store_pending() and not broker.commit_now():
            raise PullError(503, "the store could not commit; retry the request")
        broker.outbound.flush_writes()

    def close_all(self) -> None:
        for link in list(self.links.values()):
            link.core_closed()
