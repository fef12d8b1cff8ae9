"""The server side of one MQTT connection as a pure state machine (sans-I/O, in the style of h11).

Bytes and ``now`` in, packets and bytes out; no sockets, clocks or broker state. It owns what is
per connection in MQTT 3.1.1 / 5.0:

* the decoder (``broker.mqtt.codec.Decoder``: CONNECT first, one CONNECT, the grammar of the
  negotiated protocol level, Maximum Packet Size, §2-§3 validation) and the connection state
  (connecting -> connected -> closed);
* keep alive: a connected client silent for 1.5 x its keep alive is timed out (MQTT-3.1.2-24),
  a socket that sends no CONNECT within the CONNECT timeout too;
* inbound topic aliases (MQTT 5 §3.3.2.3.4: MQTT-3.3.2-9, MQTT-3.3.4-1);
* control packets towards the client within its Maximum Packet Size (MQTT-3.1.2-24: reason
  string and user properties are left out first, MQTT-3.14.2-3 and friends);
* :class:`AckOrder`: acknowledgements of the client's QoS>0 PUBLISHes leave in PUBLISH order
  (MQTT-4.6.0-2, -3) even when some wait (for the cluster), and the count of unacknowledged QoS>0
  PUBLISHes that MQTT 5 flow control limits to the server's Receive Maximum (§4.9, MQTT-3.3.4-9).

``broker.core.client.ClientConnection`` drives it and applies the packets to the broker core.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any, Protocol

from broker.mqtt import codec
from broker.mqtt.packets import MQTTProtocolError, Packet, Publish, ReasonCode

MAX_PACKET_SIZE = 268_435_455  # the protocol maximum (Remaining Length limit + header)

STATE_CONNECTING = 0
STATE_CONNECTED = 1
STATE_CLOSED = 2

TIMEOUT_CONNECT = "connect_timeout"
TIMEOUT_KEEPALIVE = "keepalive_timeout"


class Waiting(Protocol):
    """Something an acknowledgement may wait for (a ``broker.core.ports.Completion``)."""

    def done(self) -> bool: ...


class ServerProtocol:
    """One connection's protocol state (see the module docstring)."""

    __slots__ = (
        "decoder",
        "in_aliases",
        "keep_alive_s",
        "last_rx",
        "max_out_packet_size",
        "max_packet_size",
        "opened_at",
        "protocol_level",
        "state",
        "topic_alias_maximum",
    )

    def __init__(
        self,
        *,
        max_packet_size: int,
        topic_alias_maximum: int,
        now: float,
        max_connect_packet_size: int | None = None,
    ) -> None:
        # until a CONNECT succeeded, packets are capped lower (an unauthenticated socket cannot
        # make the broker buffer a large packet); ``connected`` lifts the cap to max_packet_size
        self.max_packet_size = max_packet_size
        before_connect = max_packet_size if max_connect_packet_size is None else max_connect_packet_size
        self.decoder = codec.Decoder(role="server", max_packet_size=min(max_packet_size, before_connect))
        self.state = STATE_CONNECTING
        self.protocol_level = 4
        self.keep_alive_s = 0
        self.last_rx = now
        self.opened_at = now
        self.in_aliases: dict[int, str] | None = None
        self.topic_alias_maximum = topic_alias_maximum
        self.max_out_packet_size = MAX_PACKET_SIZE  # the client's Maximum Packet Size (v5 CONNECT)

    # ------------------------------------------------------------------ input
    def receive(self, data: bytes, now: float) -> tuple[list[Packet], MQTTProtocolError | None]:
        """Decode ``data``; the packets before a malformed one come back with its error."""
        self.last_rx = now
        try:
            return self.decoder.feed(data), None
        except MQTTProtocolError as err:
            return err.packets_before_error, err  # act on the good packets before the bad one

    def connect_received(self, protocol_level: int, properties: dict[str, Any]) -> None:
        """A CONNECT arrived: its protocol level and the client's Maximum Packet Size apply."""
        self.protocol_level = protocol_level
        self.max_out_packet_size = int(properties.get("maximum_packet_size", MAX_PACKET_SIZE))

    def connected(self, keep_alive_s: int) -> None:
        self.state = STATE_CONNECTED
        self.decoder.max_packet_size = self.max_packet_size
        self.keep_alive_s = keep_alive_s

    def closed(self) -> None:
        self.state = STATE_CLOSED

    def timed_out(self, now: float, connect_timeout_s: float) -> str | None:
        """Why this connection must be closed at ``now`` (TIMEOUT_*), or None."""
        if self.state == STATE_CONNECTING:
            return TIMEOUT_CONNECT if now - self.opened_at > connect_timeout_s else None
        if (
            self.state == STATE_CONNECTED
            and self.keep_alive_s
            and now - self.last_rx > 1.5 * self.keep_alive_s
        ):
            return TIMEOUT_KEEPALIVE
        return None

    def resolve_topic(self, packet: Publish) -> tuple[str, dict[str, Any]]:
        """The topic and properties of an inbound PUBLISH with its topic alias applied (and the
        alias property removed); raises MQTTProtocolError for a bad alias."""
        props = packet.properties
        topic = packet.topic
        alias = props.get("topic_alias") if props else None
        if alias is None:
            return topic, props
        if alias > self.topic_alias_maximum:
            raise MQTTProtocolError(
                f"topic alias {alias} above topic_alias_maximum",
                ReasonCode.TOPIC_ALIAS_INVALID,
                "MQTT-3.3.2-9",
            )
        aliases = self.in_aliases
        if aliases is None:
            aliases = self.in_aliases = {}
        if topic:
            aliases[alias] = topic
        else:
            known = aliases.get(alias)
            if known is None:
                raise MQTTProtocolError(
                    f"unknown topic alias {alias}", ReasonCode.TOPIC_ALIAS_INVALID, "MQTT-3.3.4-1"
                )
            topic = known
        return topic, {k: v for k, v in props.items() if k != "topic_alias"}

    # ------------------------------------------------------------------ output
    def encode(self, packet: Packet) -> bytes:
        """A control packet's bytes for this client; above its Maximum Packet Size (MQTT-3.1.2-24)
        the reason string and user properties are left out. The caller drops a packet that is
        still too large (:meth:`fits`)."""
        data = codec.encode(packet, self.protocol_level)
        if len(data) > self.max_out_packet_size:
            properties = getattr(packet, "properties", None)
            if properties:
                slim = {k: v for k, v in properties.items() if k not in ("reason_string", "user_property")}
                slim_packet: Any = dataclasses.replace(packet, properties=slim)  # type: ignore[arg-type]
                data = codec.encode(slim_packet, self.protocol_level)
        return data

    def fits(self, data: bytes) -> bool:
        return len(data) <= self.max_out_packet_size


class AckOrder:
    """The acknowledgements (PUBACK/PUBREC) of one client's QoS>0 PUBLISHes, in PUBLISH order.

    An acknowledgement may have to wait (``wait.done()`` False: the cluster has not confirmed the
    message yet); every later one waits behind it. ``qos1_unacked`` counts QoS 1 acknowledgements
    released but not yet on the wire (they wait for the group commit); together with the held QoS 1
    ones and the QoS 2 ids awaiting PUBREL it is what MQTT 5 flow control counts (§4.9).
    """

    __slots__ = ("held", "qos1_unacked")

    def __init__(self) -> None:
        self.held: deque[tuple[Waiting | None, int, bytes]] | None = None
        self.qos1_unacked = 0

    def unacknowledged(self, incoming_qos2: int) -> int:
        """QoS>0 PUBLISHes of the client not yet acknowledged (``incoming_qos2`` held QoS 2 ids)."""
        held = self.held
        held_qos1 = sum(1 for _wait, qos, _ack in held if qos == 1) if held else 0
        return incoming_qos2 + self.qos1_unacked + held_qos1

    def push(self, qos: int, ack: bytes, wait: Waiting | None) -> bool:
        """Add an acknowledgement; True if it may leave now (nothing held before it, no wait)."""
        held = self.held
        if wait is None and not held:
            return True
        if held is None:
            held = self.held = deque()
        held.append((wait, qos, ack))
        return False

    def release(self) -> list[tuple[int, bytes]]:
        """The held acknowledgements that may leave now, in order: (QoS, ack bytes)."""
        held = self.held
        ready: list[tuple[int, bytes]] = []
        while held and (held[0][0] is None or held[0][0].done()):
            _wait, qos, ack = held.popleft()
            ready.append((qos, ack))
        return ready
