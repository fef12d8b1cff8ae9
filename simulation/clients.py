"""Simulated MQTT clients that speak real MQTT 3.1.1 bytes to simulated brokers.

A :class:`SimSocket` is both ends of one client connection: to the broker it is the
``broker.core.ports.ClientTransport`` its ``ClientConnection`` writes to (like an asyncio transport),
to the client it carries bytes with a small delay. Packets are encoded and decoded with the
project's own codec (``broker.mqtt.codec``: ``encode`` and a client-role ``Decoder``), so the broker
parses exactly the bytes a network client would send.

:class:`SimClient` records what a test oracle needs (``simulation.checkers.History``): every QoS 1
message it published and whether a PUBACK came back (acknowledged = the broker owns it now),
every SUBACK with its virtual time, every message received (and PUBACKed). Publishers number
their messages; payload ``"<publisher>:<connection epoch>:<seq>"``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.mqtt import codec
from broker.mqtt.packets import (
    MQTT_3_1_1,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    Will,
)
from simulation.checkers import Acked, History, Received

if TYPE_CHECKING:
    from broker.core.client import ClientConnection
    from simulation.process import SimBroker
    from simulation.world import World

CLIENT_LATENCY_S = 0.0005


class SimSocket:
    """One TCP connection between a :class:`SimClient` and a :class:`SimBroker`."""

    def __init__(self, world: World, client: SimClient, broker: SimBroker) -> None:
        self.world = world
        self.client = client
        self.broker = broker
        self.name = f"sim:{client.client_id}"
        self.open = True
        self.conn: ClientConnection | None = None

    # ------------------------------------------------------------------ ClientTransport (broker side)
    def write(self, data: bytes) -> None:
        if self.open:
            self.world.after(CLIENT_LATENCY_S, self._to_client, data)

    def close(self) -> None:
        """The broker closes the connection (the client learns it after the latency)."""
        if not self.open:
            return
        self.open = False
        self.broker.sockets.pop(self, None)
        if self.conn is not None:
            self.broker.scheduler.call_soon(self.conn.lost)
        self.world.after(CLIENT_LATENCY_S, self.client.connection_lost, self)

    def is_closing(self) -> bool:
        return not self.open

    def get_write_buffer_size(self) -> int:
        return 0

    # ------------------------------------------------------------------ the client side
    def send(self, data: bytes) -> None:
        if self.open:
            self.world.after(CLIENT_LATENCY_S, self._to_broker, data)

    def client_close(self) -> None:
        """The client closes the connection."""
        if not self.open:
            return
        self.open = False
        self.broker.sockets.pop(self, None)
        conn = self.conn
        if conn is not None:
            self.world.after(CLIENT_LATENCY_S, self.broker.scheduler._guarded, conn.lost, ())

    def reset(self) -> None:
        """The broker process died: the client sees a reset, the broker side is gone."""
        if self.open:
            self.open = False
            self.world.after(CLIENT_LATENCY_S, self.client.connection_lost, self)

    def _to_broker(self, data: bytes) -> None:
        if self.open and self.conn is not None and self.broker.alive:
            self.conn.receive(data)

    def _to_client(self, data: bytes) -> None:
        if self.open:
            self.client.bytes_received(self, data)


class SimClient:
    """An MQTT 3.1.1 client: connects, subscribes, publishes QoS 1, acknowledges what it gets."""

    def __init__(
        self,
        world: World,
        history: History,
        client_id: str,
        *,
        clean_start: bool = True,
        drain_per_s: float | None = None,
    ) -> None:
        self.world = world
        # a client that takes ``drain_per_s`` messages per second: each received PUBLISH is handed
        # to the application (recorded) and acknowledged when the ones before it are done (None:
        # at once); a real device drains at a finite rate, so the broker's session queue matters
        self.drain_per_s = drain_per_s
        self._busy_until = 0.0
        self.history = history
        self.client_id = client_id
        self.clean_start = clean_start
        self.socket: SimSocket | None = None
        self.connected = False
        self.epoch = 0
        self._decoder: codec.Decoder | None = None
        self._next_packet_id = 0
        self._in_flight: dict[int, Acked] = {}  # packet id -> the publish waiting for its PUBACK
        self._subscribe_filters: dict[int, str] = {}
        self.on_connack: Callable[[SimClient, bool], None] | None = None
        self.on_suback: Callable[[SimClient, str], None] | None = None
        self.on_lost: Callable[[SimClient], None] | None = None
        self.on_message: Callable[[SimClient, Received], None] | None = None
        self._seq = 0
        self._connack_seen = False  # on the current connection
        self.will: Will | None = None  # sent with every CONNECT (MQTT 3.1.1: no delay)

    # ------------------------------------------------------------------ actions
    def connect(self, broker: SimBroker) -> bool:
        """Open a connection to ``broker`` and send CONNECT; False if the broker is down."""
        if self.socket is not None:
            self.disconnect()
        socket = SimSocket(self.world, self, broker)
        conn = broker.accept(socket)
        if conn is None:
            return False
        socket.conn = conn
        self.socket = socket
        self.epoch += 1
        self._decoder = codec.Decoder(role="client", protocol_level=MQTT_3_1_1)
        self._connack_seen = False
        self._in_flight.clear()
        self.history.trace("connect", self.client_id, broker.peer_id, self.epoch)
        self._send(
            Connect(client_id=self.client_id, clean_start=self.clean_start, keep_alive_s=60, will=self.will)
        )
        return True

    def disconnect(self) -> None:
        socket = self.socket
        if socket is None:
            return
        if self.connected:
            self._send(Disconnect())
        self.world.after(CLIENT_LATENCY_S, socket.client_close)
        self._gone()

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        packet_id = self._packet_id()
        self._subscribe_filters[packet_id] = topic_filter
        self._send(Subscribe(packet_id, [Subscription(topic_filter, qos)]))

    def publish(self, topic: str, retain: bool = False) -> None:
        """Publish the next numbered QoS 1 message on ``topic`` (if connected)."""
        if not self.connected:
            return
        self._seq += 1
        packet_id = self._packet_id()
        payload = f"{self.client_id}:{self.epoch}:{self._seq}".encode()
        record = Acked(
            self.client_id, self.epoch, self._seq, topic, self.world.now, step=self.history.next_step()
        )
        self._in_flight[packet_id] = record
        self.history.published.append(record)
        self.history.trace("publish", self.client_id, topic, self._seq)
        self._send(Publish(topic, payload, qos=1, retain=retain, packet_id=packet_id))

    # ------------------------------------------------------------------ socket events
    def bytes_received(self, socket: SimSocket, data: bytes) -> None:
        if socket is not self.socket or self._decoder is None:
            return
        for packet in self._decoder.feed(data):
            self._handle(packet)

    def connection_lost(self, socket: SimSocket) -> None:
        if socket is not self.socket:
            return
        self.history.trace("lost", self.client_id, self.epoch)
        self._gone()
        if self.on_lost is not None:
            self.on_lost(self)

    # ------------------------------------------------------------------ internals
    def _handle(self, packet: Packet) -> None:
        history = self.history
        if not self._connack_seen and not isinstance(packet, Connack):
            # MQTT-3.2.0-1: the server's first packet on a connection is CONNACK (a real client
            # closes the connection; this one records it and goes on, so the run shows the rest)
            name = type(packet).__name__.upper()
            history.protocol_errors.append((self.world.now, f"{self.client_id} got {name} before CONNACK"))
            self._connack_seen = True  # (reported once per connection)
        if isinstance(packet, Connack):
            self._connack_seen = True
            self.connected = packet.reason_code == 0
            history.trace("connack", self.client_id, packet.session_present)
            if self.connected and not packet.session_present:
                history.new_session(self.client_id, self.world.now)
            if self.on_connack is not None:
                self.on_connack(self, packet.session_present)
        elif isinstance(packet, Puback):
            record = self._in_flight.pop(packet.packet_id, None)
            if record is not None:
                record.acked_at = self.world.now
                history.acked.append(record)
                history.trace("puback", self.client_id, record.seq)
        elif isinstance(packet, Suback):
            topic_filter = self._subscribe_filters.pop(packet.packet_id, "")
            if all(code < 0x80 for code in packet.reason_codes):
                history.subscribed(self.client_id, topic_filter, self.world.now)
                history.trace("suback", self.client_id, topic_filter)
                if self.on_suback is not None:
                    self.on_suback(self, topic_filter)
        elif isinstance(packet, Publish):
            socket, epoch = self.socket, self.epoch
            if self.drain_per_s is None:
                self._process(socket, epoch, packet)
                return
            # processed in arrival order, one every 1 / drain_per_s seconds
            self._busy_until = max(self.world.now, self._busy_until) + 1.0 / self.drain_per_s
            self.world.at(self._busy_until, self._process, socket, epoch, packet)

    def _process(self, socket: SimSocket | None, epoch: int, packet: Publish) -> None:
        """The application takes one received PUBLISH (recorded); it is acknowledged (QoS > 0) if
        the connection it came on is still open (else the broker sends it again: a duplicate)."""
        history = self.history
        publisher, publisher_epoch, seq = packet.payload.decode().split(":")
        received = Received(
            self.client_id,
            packet.topic,
            publisher,
            int(publisher_epoch),
            int(seq),
            self.world.now,
            epoch,
            step=history.next_step(),
        )
        history.received.append(received)
        history.trace("receive", self.client_id, publisher, int(seq))
        if packet.qos and packet.packet_id is not None and socket is not None and socket is self.socket:
            self._send(Puback(packet.packet_id))
        if self.on_message is not None:
            self.on_message(self, received)

    def _send(self, packet: Packet) -> None:
        if self.socket is not None:
            self.socket.send(codec.encode(packet, MQTT_3_1_1))

    def _packet_id(self) -> int:
        self._next_packet_id = self._next_packet_id % 65535 + 1
        return self._next_packet_id

    def _gone(self) -> None:
        self.socket = None
        self.connected = False
        self._decoder = None
        self._in_flight.clear()  # not acknowledged: the broker never owned them
