"""Client listeners: MQTT over TCP and TLS (asyncio protocols) and over WebSocket.

Each accepted socket gets a core ``ClientConnection`` (``BrokerApi.new_client``) and this module
only moves bytes: ``data_received`` -> ``ClientConnection.receive``, ``connection_lost`` ->
``ClientConnection.lost``; the connection writes back through the asyncio transport. MQTT over
WebSocket (RFC 6455, subprotocol "mqtt", MQTT 5 §6 / 3.1.1 §6) uses the ``websockets`` library and
:class:`WebSocketTransport`, which gives the connection the same transport interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from broker.core.admission import Refusal, peer_name
from broker.mqtt.packets import ReasonCode

if TYPE_CHECKING:
    from broker.config import WebSocketListenerConfig
    from broker.core.broker import Broker
    from broker.core.client import ClientConnection

log = logging.getLogger("skipmq.listeners")


def certificate_common_name(cert: Any) -> str | None:
    """The CN of a peer certificate as returned by ``SSLObject.getpeercert()``."""
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


# listeners.tls.identity_field -> the ``subjectAltName`` type name in ``getpeercert()``
_SAN_TYPES = {"san_dns": "DNS", "san_email": "email", "san_uri": "URI"}


def certificate_identity(cert: Any, identity_field: str) -> str | None:
    """The user name a verified client certificate stands for (``listeners.tls.identity_field``):
    its subject CN, or its first subject alternative name of one type; None when it has none."""
    if identity_field == "cn":
        return certificate_common_name(cert)
    san_type = _SAN_TYPES[identity_field]
    for kind, value in (cert or {}).get("subjectAltName", ()):
        if kind == san_type:
            return str(value)
    return None


def certificate_refusal(cert: Any, identity: str | None, identity_field: str) -> Refusal | None:
    """Why a client presenting ``cert`` is refused at its CONNECT (0x87), or None: a verified
    certificate without the configured identity, or with one that is no valid user name, must
    not fall back to the CONNECT's own user name."""
    if not cert:
        return None  # no certificate: the password file decides, as on TCP
    if not identity:
        return Refusal(ReasonCode.NOT_AUTHORIZED, f"client certificate has no {identity_field} identity")
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in identity) or len(identity.encode()) > 65535:
        return Refusal(ReasonCode.NOT_AUTHORIZED, "client certificate identity is not a valid user name")
    return None


class MqttProtocol(asyncio.Protocol):
    """One TCP or TLS client socket."""

    __slots__ = ("broker", "client", "listener")

    def __init__(self, broker: Broker, listener: str = "tcp") -> None:
        self.broker = broker
        self.listener = listener
        self.client: ClientConnection | None = None

    def connection_made(self, transport: Any) -> None:
        broker = self.broker
        cert_username = None
        refusal = None
        if self.listener == "tls" and broker.tls_identity_as_username:
            identity_field = broker.config.listeners.tls.identity_field
            cert = transport.get_extra_info("peercert")
            cert_username = certificate_identity(cert, identity_field)
            refusal = certificate_refusal(cert, cert_username, identity_field)
            if refusal is not None:
                cert_username = None
        self.client = client = broker.new_client(
            transport,
            self.listener,
            # TCP: asked of the transport when needed (ClientBase.peer: uvloop and asyncio keep
            # the address after the close); TLS: kept (its transport forgets it at the close)
            peer=None if self.listener == "tcp" else peer_name(transport.get_extra_info("peername")),
            cert_username=cert_username,
        )
        if client is not None and refusal is not None and client.refusal is None:
            client.refusal = refusal

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is not None:
            client.receive(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.client is not None:
            self.client.lost()


class WebSocketTransport:
    """Adapts a ``websockets`` server connection to the client transport interface.

    Writes are buffered and sent as binary frames by one writer task per WebSocket connection
    (WebSocket clients are not the high-fan-out path; TCP is).
    """

    __slots__ = ("_buffer", "_buffered_bytes", "_closing", "_wakeup", "_ws")

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._buffer: list[bytes] = []
        self._buffered_bytes = 0
        self._wakeup = asyncio.Event()
        self._closing = False

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        self._buffer.append(data)
        self._buffered_bytes += len(data)
        self._wakeup.set()

    def close(self) -> None:
        self._closing = True
        self._wakeup.set()

    def is_closing(self) -> bool:
        return self._closing

    def get_write_buffer_size(self) -> int:
        return self._buffered_bytes

    async def writer(self) -> None:
        """Send buffered output until closed; then flush and close the WebSocket."""
        ws = self._ws
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                if self._buffer:
                    chunk = b"".join(self._buffer)
                    self._buffer.clear()
                    self._buffered_bytes = 0
                    await ws.send(chunk)
                if self._closing:
                    break
        except Exception:  # the peer went away; the reader side reports the loss
            pass
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(), timeout=2.0)


async def serve_websocket(broker: Broker, ws_config: WebSocketListenerConfig) -> Any:
    """Start the WebSocket listener; returns the ``websockets`` server."""
    from websockets.asyncio.server import serve
    from websockets.http11 import Response
    from websockets.typing import Subprotocol

    path = ws_config.path

    def check_request(connection: Any, request: Any) -> Response | None:
        if request.path.split("?", 1)[0] != path:
            return connection.respond(404, f"no WebSocket endpoint at {request.path}; use {path}\n")
        return None

    async def handler(ws: Any) -> None:
        if ws.subprotocol != "mqtt":
            await ws.close(1002, 'the WebSocket subprotocol "mqtt" is required')
            return
        transport = WebSocketTransport(ws)
        client = broker.new_client(transport, "websocket", peer=peer_name(ws.remote_address))
        if client is None:
            return
        writer = asyncio.create_task(transport.writer())
        try:
            async for frame in ws:
                if isinstance(frame, str):
                    broker.log_event(
                        logging.WARNING,
                        "protocol_error",
                        client_id=client.client_id,
                        peer=client.peer,
                        reason_code=0x81,
                        statement="MQTT-6.0.0-1",
                        message="text WebSocket frame",
                    )
                    break
                client.receive(frame)
                if transport.is_closing():
                    break
        except Exception:  # connection reset etc.: handled as an abnormal close below
            pass
        finally:
            transport.close()
            client.lost()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer, timeout=3.0)

    return await serve(
        handler,
        ws_config.host,
        ws_config.port,
        subprotocols=[Subprotocol("mqtt")],
        process_request=check_request,
        max_size=broker.max_packet_size + 8,
        compression=None,
    )
