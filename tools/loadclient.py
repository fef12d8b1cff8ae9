"""The benchmarks' MQTT 3.1.1 load client: one asyncio connection with its set-up and tear-down.

Both benchmarks (bench/broker_bench.py, bench/cluster_bench.py) drive brokers with raw-socket
clients so that client-side parsing stays cheap on a 2-core machine (paho would be the
bottleneck). :class:`LoadClient` is everything they share: TCP_NODELAY, the receive buffer,
CONNACK and SUBACK futures, DISCONNECT on close, and the count of unacknowledged QoS 1 publishes;
:func:`open_client` and :func:`subscribe` do the handshakes (packets from ``tools.mqtt_raw``).

What each benchmark counts is its own ``data_received`` loop in a subclass - tuned for what it
measures (fixed-size PUBLISH streams counted with C-level slicing in the broker benchmark, tagged
payloads with latencies and probes in the cluster benchmark). Those loops run once per received
packet at up to a million packets a second, so they are not routed through per-packet hooks here.
Subclasses report set-up packets with :meth:`LoadClient.connack_received` and
:meth:`LoadClient.suback_received`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import TypeVar

from tools import mqtt_raw

HOST = "127.0.0.1"
DISCONNECT = mqtt_raw.disconnect_packet()

C = TypeVar("C", bound="LoadClient")


class LoadClient(asyncio.Protocol):
    """One MQTT connection of a load generator (subclass it and implement ``data_received``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        loop = asyncio.get_running_loop()
        self.connack: asyncio.Future[int] = loop.create_future()
        self.subacks: dict[int, asyncio.Future[bytes]] = {}
        self.closed: asyncio.Future[None] = loop.create_future()
        self.unacked = 0  # QoS 1 publishes without their PUBACK yet

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transport is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        waiting: list[asyncio.Future[int] | asyncio.Future[bytes]] = [self.connack, *self.subacks.values()]
        for fut in waiting:
            if not fut.done():
                fut.set_exception(ConnectionError(f"{self.name}: connection closed by the broker"))
                fut.exception()  # an awaiter still gets it; nobody awaiting is not an error

    # ------------------------------------------------------------------ for the subclasses' loops
    def connack_received(self, return_code: int) -> None:
        if not self.connack.done():
            self.connack.set_result(return_code)

    def suback_received(self, packet_id: int, body: bytes) -> None:
        fut = self.subacks.pop(packet_id, None)
        if fut is not None and not fut.done():
            fut.set_result(body)

    # ------------------------------------------------------------------ helpers
    def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError(f"{self.name}: not connected")
        self.transport.write(data)

    def close(self) -> None:
        """DISCONNECT (MQTT 3.1.1 §3.14) and close the socket."""
        if self.transport is not None and not self.transport.is_closing():
            with contextlib.suppress(Exception):
                self.transport.write(DISCONNECT)
            self.transport.close()


async def open_client(
    factory: Callable[[], C],
    port: int,
    client_id: str,
    *,
    keepalive_s: int = 0,
    timeout_s: float = 20.0,
    host: str = HOST,
) -> C:
    """Connect, send CONNECT (clean session) and wait for a successful CONNACK."""
    loop = asyncio.get_running_loop()
    _transport, client = await asyncio.wait_for(loop.create_connection(factory, host, port), timeout_s)
    client.write(mqtt_raw.connect_packet(client_id, keepalive_s=keepalive_s))
    code = await asyncio.wait_for(client.connack, timeout_s)
    if code != 0:
        raise ConnectionError(f"{client_id}: CONNACK return code {code} from port {port}")
    return client


async def subscribe(
    client: LoadClient, filters: list[str], qos: int, *, packet_id: int = 1, timeout_s: float = 30.0
) -> list[int]:
    """SUBSCRIBE to ``filters`` and wait for the SUBACK; its granted QoS per filter (0x80 = refused
    raises ConnectionError)."""
    fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    client.subacks[packet_id] = fut
    client.write(mqtt_raw.subscribe_packet(packet_id, [(f, qos) for f in filters]))
    body = await asyncio.wait_for(fut, timeout_s)
    granted = list(body[2:])
    if any(code not in (0, 1, 2) for code in granted):
        raise ConnectionError(f"{client.name}: SUBACK refused {filters[:3]}: {granted[:3]}")
    return granted
