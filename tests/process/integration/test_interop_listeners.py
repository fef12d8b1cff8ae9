"""Interop: the TLS listener (server certificate, required client certificate, identity as user
name) and the WebSocket listener (subprotocol "mqtt", paho transport="websockets").

Certificates are generated per module with the `openssl` CLI: a self-signed CA, a server
certificate for 127.0.0.1/localhost and a client certificate with CN "tls-device".
Follows MQTT 3.1.1 §4.2 / MQTT 5 §4.2 (network connections: TLS, WebSocket §6).
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.interop_broker import BrokerOptions, BrokerProcess
from tests.support.interop_clients import PahoClient, unique_id

PahoFactory = Callable[..., PahoClient]


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"openssl {' '.join(args)} failed: {result.stderr}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=SkipMQ Test CA", cwd=d)  # fmt: skip
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.crt", "-days", "2", "-extfile", "server.ext", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr",
             "-subj", "/CN=tls-device", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", "client.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "client.crt", "-days", "2", cwd=d)  # fmt: skip
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key")


def _client_context(pki: Pki, with_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(pki.ca))
    if with_cert:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context


def test_tls_server_certificate(
    pki: Pki, broker_factory: Callable[[BrokerOptions], BrokerProcess], paho_factory: PahoFactory
) -> None:
    target = broker_factory(
        BrokerOptions(tls=True, tls_certfile=str(pki.server_cert), tls_keyfile=str(pki.server_key))
    )
    topic = unique_id("tls")
    tcp_sub = paho_factory(target, version=5)
    tcp_sub.subscribe(topic, 1)
    tls_client = paho_factory(
        target, port=target.tls_port, version=5, tls_context=_client_context(pki, False)
    )
    tls_client.subscribe(topic, 1)
    tls_client.publish(topic, b"over-tls", 1)
    assert tcp_sub.wait_message().payload == b"over-tls"
    assert tls_client.wait_message().payload == b"over-tls"
    # a client that does not trust the CA fails the handshake
    with pytest.raises(ssl.SSLError):
        paho_factory(target, port=target.tls_port, tls_context=ssl.create_default_context())


def test_tls_client_certificate_required_and_identity_as_username(
    pki: Pki, broker_factory: Callable[[BrokerOptions], BrokerProcess], paho_factory: PahoFactory
) -> None:
    target = broker_factory(
        BrokerOptions(
            tls=True,
            tls_certfile=str(pki.server_cert),
            tls_keyfile=str(pki.server_key),
            tls_cafile=str(pki.ca),
            tls_require_client_cert=True,
            tls_use_identity_as_username=True,
            allow_anonymous=False,
        )
    )
    # with the client certificate: accepted although anonymous access is off (CN is the user name)
    device = paho_factory(target, port=target.tls_port, version=5, tls_context=_client_context(pki, True))
    topic = unique_id("mtls")
    device.subscribe(topic, 1)
    device.publish(topic, b"mutual", 1)
    assert device.wait_message().payload == b"mutual"
    # without one: the handshake (or the first read after it, TLS 1.3) fails, no CONNACK
    with pytest.raises((ssl.SSLError, OSError, TimeoutError, AssertionError)):
        paho_factory(target, port=target.tls_port, version=5, tls_context=_client_context(pki, False))
    # plain TCP still requires credentials: anonymous refused
    refused = paho_factory(target, version=5, expect_success=False)
    assert refused.connack_reason is not None and refused.connack_reason.is_failure


@pytest.mark.parametrize("version", [4, 5])
def test_websocket_listener(
    broker_factory: Callable[[BrokerOptions], BrokerProcess], paho_factory: PahoFactory, version: int
) -> None:
    target = broker_factory(BrokerOptions(websocket=True))
    topic = unique_id("ws")
    ws_sub = paho_factory(target, port=target.ws_port, version=version, transport="websockets")
    ws_sub.subscribe(topic, 2)
    tcp = paho_factory(target, version=version)
    tcp.subscribe(topic, 2)
    tcp.publish(topic, b"tcp->ws", 2)
    got = ws_sub.wait_message()
    assert (got.payload, got.qos) == (b"tcp->ws", 2)
    big = bytes(range(256)) * 300  # 76.8 kB: spans several WebSocket frames/reads
    ws_sub.publish(topic, big, 1)
    assert tcp.wait_message().payload == b"tcp->ws"
    assert tcp.wait_message().payload == big
    assert ws_sub.wait_message().payload == big
