"""Broker core: listeners (TLS, WebSocket), HTTP /metrics and /healthz, $SYS, and the cluster hooks.

MQTT 5 §4.8 transport (TLS), §6 (WebSocket); Prometheus text format; hooks of broker/hooks.py.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.typing import Subprotocol

from broker.adapters.server import ThreadedBroker
from broker.core.broker import Broker
from broker.core.session import Message
from broker.mqtt.packets import Disconnect, ReasonCode, Unsuback, Unsubscribe
from tests.support.core import MQTT_5, PahoClient, RawClient, start_broker, wait_for

__all__ = ["start_broker"]
Start = Callable[..., ThreadedBroker]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate with CN=device-7."""
    directory = tmp_path_factory.mktemp("certs")
    paths = {
        name: str(directory / name)
        for name in ("ca.key", "ca.pem", "server.key", "server.pem", "client.key", "client.pem", "ext.cnf")
    }
    Path(paths["ext.cnf"]).write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        paths["ca.key"],
        "-out",
        paths["ca.pem"],
        "-days",
        "2",
        "-subj",
        "/CN=SkipMQ Test CA",
    )
    for role, subject in (("server", "/CN=localhost"), ("client", "/CN=device-7")):
        csr = str(directory / f"{role}.csr")
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            paths[f"{role}.key"],
            "-out",
            csr,
            "-subj",
            subject,
        )
        extra = ["-extfile", paths["ext.cnf"]] if role == "server" else []
        _openssl(
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            paths["ca.pem"],
            "-CAkey",
            paths["ca.key"],
            "-CAcreateserial",
            "-out",
            paths[f"{role}.pem"],
            "-days",
            "2",
            *extra,
        )
    return paths


def _tls_socket(port: int, certificates: dict[str, str], *, client_cert: bool) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=certificates["ca.pem"])
    if client_cert:
        context.load_cert_chain(certificates["client.pem"], certificates["client.key"])
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def test_tls_listener_with_client_certificate_identity(
    start_broker: Start, certificates: dict[str, str]
) -> None:
    broker = start_broker(
        listeners__tls__enabled=True,
        listeners__tls__port=0,
        listeners__tls__host="127.0.0.1",
        listeners__tls__certfile=certificates["server.pem"],
        listeners__tls__keyfile=certificates["server.key"],
        listeners__tls__cafile=certificates["ca.pem"],
        listeners__tls__require_client_cert=True,
        listeners__tls__use_identity_as_username=True,
    )
    tls_port = broker.ports["tls"]
    client = RawClient(broker.ports["tcp"])
    client.sock.close()
    client.sock = _tls_socket(tls_port, certificates, client_cert=True)
    assert client.connect("tls-client").reason_code == 0
    client.subscribe("tls/t", 1)
    client.publish_acked("tls/t", b"secure", 1)
    assert client.expect_publish().payload == b"secure"
    assert broker.call(lambda: broker.broker.sessions["tls-client"].username) == "device-7"
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        anonymous = _tls_socket(tls_port, certificates, client_cert=False)
        anonymous.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
        if not anonymous.recv(4):
            raise ConnectionError("closed")


def test_websocket_listener_with_paho(start_broker: Start) -> None:
    broker = start_broker(
        listeners__websocket__enabled=True,
        listeners__websocket__port=0,
        listeners__websocket__host="127.0.0.1",
    )
    ws_port = broker.ports["websocket"]
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    received: list[bytes] = []
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id="ws-client", transport="websockets", protocol=mqtt.MQTTv5
    )
    client.ws_set_options(path="/mqtt")
    client.on_message = lambda _c, _u, message: received.append(bytes(message.payload))
    client.connect("127.0.0.1", ws_port)
    client.loop_start()
    try:
        wait_for(client.is_connected, 5, "websocket connect")
        client.subscribe("ws/#", 1)
        time.sleep(0.3)
        tcp = RawClient(broker.ports["tcp"])
        tcp.connect("ws-tcp-pub")
        tcp.publish_acked("ws/t", b"x" * 70_000, 1)  # spans several frames / reads
        tcp.publish("ws/t", b"small")
        wait_for(lambda: len(received) == 2, 5, "websocket messages")
        assert received == [b"x" * 70_000, b"small"]
        info = client.publish("ws/t", b"from-ws", 1)
        info.wait_for_publish(5)
        wait_for(lambda: len(received) == 3, 5, "own message")
    finally:
        client.disconnect()
        client.loop_stop()


def test_websocket_requires_mqtt_subprotocol(start_broker: Start) -> None:
    broker = start_broker(
        listeners__websocket__enabled=True,
        listeners__websocket__port=0,
        listeners__websocket__host="127.0.0.1",
    )
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = f"ws://127.0.0.1:{broker.ports['websocket']}/mqtt"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, open_timeout=5)
    assert refused.value.response.status_code == 400
    with pytest.raises(InvalidStatus) as wrong_path:
        connect(f"ws://127.0.0.1:{broker.ports['websocket']}/other", subprotocols=[Subprotocol("mqtt")])
    assert wrong_path.value.response.status_code == 404
    with connect(url, subprotocols=[Subprotocol("mqtt")], open_timeout=5) as ws:
        assert ws.subprotocol == "mqtt"
        ws.send(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
        assert ws.recv(timeout=5) == b"\x20\x02\x00\x00"  # CONNACK accepted


def _http(port: int, path: str, method: str = "GET") -> tuple[int, str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read().decode()


def test_http_metrics_and_healthz(start_broker: Start) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    broker = start_broker()
    http_port = broker.ports["http"]
    sub = RawClient(broker.ports["tcp"])
    sub.connect("metrics-sub")
    sub.subscribe("m/t", 1)
    for index in range(5):
        sub.publish_acked("m/t", b"x", 1, packet_id=index + 1)
        sub.ack(sub.expect_publish())
    status, content_type, body = _http(http_port, "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert samples[("skipmq_messages_received_total", (("qos", "1"),))] == 5
    assert samples[("skipmq_messages_sent_total", (("qos", "1"),))] == 5
    assert samples[("skipmq_connections", ())] == 1
    assert samples[("skipmq_subscriptions", ())] == 1
    status, content_type, body = _http(http_port, "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    assert _http(http_port, "/nope")[0] == 404
    assert _http(http_port, "/metrics", "POST")[0] == 405

    def begin_shutdown() -> None:
        broker.server.stopping = True

    broker.call(begin_shutdown)
    status, _type, body = _http(http_port, "/healthz")
    assert status == 503 and json.loads(body)["status"] == "shutting_down"


def test_readyz_single_broker_ready_once_listening(start_broker: Start) -> None:
    broker = start_broker()
    status, content_type, body = _http(broker.ports["http"], "/readyz")
    assert (status, json.loads(body)["status"]) == (200, "ready") and content_type == "application/json"

    def begin_shutdown() -> None:
        broker.server.stopping = True

    broker.call(begin_shutdown)
    status, _type, body = _http(broker.ports["http"], "/readyz")
    assert status == 503 and json.loads(body) == {
        "status": "not_ready",
        "reason": "shutting_down",
        "node_id": json.loads(body)["node_id"],
    }


def test_readyz_clustered_broker_ready_only_when_joined(start_broker: Start, tmp_path: Path) -> None:
    """Liveness and readiness differ while a broker has not joined: /healthz 200, /readyz 503."""
    from tools.ports import free_ports

    own, other = free_ports(2)
    # not a seed (its list lacks itself) and its only contact is down: it waits to join, not ready
    waiting = start_broker(
        tmp_path / "waiting", cluster__enabled=True, cluster__port=own, cluster__join=f"127.0.0.1:{other}"
    )
    time.sleep(1.5)  # more than the formation rounds of a seed
    assert _http(waiting.ports["http"], "/healthz")[0] == 200
    status, _type, body = _http(waiting.ports["http"], "/readyz")
    assert status == 503 and json.loads(body)["reason"] == "joining_cluster"
    # a seed whose list holds only itself founds the cluster at once: ready
    alone = start_broker(
        tmp_path / "alone", cluster__enabled=True, cluster__port=other, cluster__join=f"127.0.0.1:{other}"
    )
    wait_for(lambda: _http(alone.ports["http"], "/readyz")[0] == 200, 10.0, "the seed ready")
    assert json.loads(_http(alone.ports["http"], "/cluster")[2])["joined"] is True
    # its contact is up now: the waiting broker joins through it and becomes ready
    wait_for(lambda: _http(waiting.ports["http"], "/readyz")[0] == 200, 15.0, "the joiner ready")


def test_sys_topics_published(start_broker: Start) -> None:
    broker = start_broker(sys__interval_s=1)
    client = RawClient(broker.ports["tcp"])
    client.connect("sys-watch")
    client.subscribe("$SYS/broker/#", 0)
    topics: dict[str, bytes] = {}
    deadline = time.monotonic() + 5
    while topics.get("$SYS/broker/clients/connected") != b"1" and time.monotonic() < deadline:
        message = client.expect_publish()
        topics[message.topic] = message.payload
    for name in (
        "version",
        "uptime",
        "clients/connected",
        "messages/received",
        "messages/sent",
        "subscriptions/count",
        "retained messages/count",
        "load/bytes/received",
        "load/bytes/sent",
    ):
        assert f"$SYS/broker/{name}" in topics
    assert topics["$SYS/broker/clients/connected"] == b"1"
    assert topics["$SYS/broker/version"].startswith(b"skipmq")


class RecordingCluster:
    """A real ClusterPort implementation that records what the broker reports."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        self.events.append(("subscribe", client_id, topic_filter, share_group, qos))

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        self.events.append(("unsubscribe", client_id, topic_filter, share_group))

    def on_publish(self, message: Message, from_client_id: str | None) -> None:
        self.events.append(("publish", message.topic, message.payload, from_client_id))

    def before_attach(self, client_id: str, clean_start: bool, username: str | None = None) -> None:
        self.events.append(("before_attach", client_id, clean_start))

    def owns_share_group(self, group: str, topic_filter: str) -> bool:
        return True

    def subscriptions_ready(
        self, topic_filters: list[tuple[str, str | None]], client_id: str | None = None
    ) -> None:
        return None  # always reachable: the SUBACK is not held

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        self.events.append(("connected", client_id, session_present))

    def on_client_disconnected(self, client_id: str) -> None:
        self.events.append(("disconnected", client_id))


def test_cluster_port_and_remote_delivery(tmp_path: Path) -> None:
    from tests.support.core import make_config

    hooks = RecordingCluster()
    threaded = ThreadedBroker(make_config(tmp_path / "d"), cluster=hooks)
    threaded.start()
    try:
        port = threaded.ports["tcp"]
        client = RawClient(port)
        client.connect("hooked")
        client.subscribe("$share/g/h/#", 1)
        client.subscribe("h/t", 1, packet_id=2)
        client.publish("h/t", b"local")
        local = client.expect_publish()
        client.expect_publish()
        assert local.payload == b"local"
        broker: Broker = threaded.broker
        remote = Message("h/t", b"remote", qos=1, retain=True, origin="node-b", publisher_id="elsewhere")
        assert threaded.call(broker.deliver_remote, remote) is True  # the subscription and the group
        first, second = client.expect_publish(), client.expect_publish()
        assert {first.payload, second.payload} == {b"remote"}
        assert first.retain is False  # retain flag cleared on normal forwarding
        client.ack(first)
        client.ack(second)
        # retained state travels separately (cluster retained sync): delivery does not store it
        assert threaded.call(lambda: broker.retained.get("h/t") is None)
        only_group = Message("h/x", b"group", qos=1, origin="node-b", publisher_id="elsewhere")
        assert threaded.call(broker.deliver_remote, only_group, lambda flt: flt == "h/t") is False
        client.expect_nothing()  # the accept filter kept it from the shared group's h/#
        client.send(Unsubscribe(3, ["h/t"]))
        client.take(Unsuback)
        client.close()
        wait_for(lambda: ("disconnected", "hooked") in hooks.events, 5, "disconnect hook")
        assert ("connected", "hooked", False) in hooks.events
        assert ("subscribe", "hooked", "h/#", "g", 1) in hooks.events
        assert ("subscribe", "hooked", "h/t", None, 1) in hooks.events
        assert ("unsubscribe", "hooked", "h/t", None) in hooks.events
        publishes = [event for event in hooks.events if event[0] == "publish"]
        assert publishes == [("publish", "h/t", b"local", "hooked")]  # remote messages are not re-forwarded
    finally:
        threaded.stop()


def test_export_import_and_kick(start_broker: Start) -> None:
    source = start_broker()
    target = start_broker()
    port = source.ports["tcp"]
    client = RawClient(port, MQTT_5)
    client.connect("mover", clean=False, properties={"session_expiry_interval": 300})
    client.subscribe("mv/t", 1)
    assert source.call(source.broker.kick, "mover", ReasonCode.ADMINISTRATIVE_ACTION) is True
    packets = client.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.ADMINISTRATIVE_ACTION
    pub = RawClient(port)
    pub.connect("mv-pub")
    pub.publish_acked("mv/t", b"while-away", 1)
    snapshot = source.call(source.broker.export_session, "mover")
    assert snapshot is not None and len(snapshot.pending) == 1
    assert source.call(source.broker.export_session, "nobody") is None
    target.call(target.broker.import_session, snapshot)
    moved = RawClient(target.ports["tcp"], MQTT_5)
    assert moved.connect("mover", clean=False, properties={"session_expiry_interval": 300}).session_present
    assert moved.expect_publish().payload == b"while-away"
    other = RawClient(target.ports["tcp"])
    other.connect("mv-pub2")
    other.publish("mv/t", b"on-target")
    assert moved.expect_publish().payload == b"on-target"


def test_paho_clients_over_tcp_keep_working_after_malformed_neighbour(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    good = PahoClient(port, "good-paho", v5=True).start()
    good.subscribe("n/#", 0)
    bad = socket.create_connection(("127.0.0.1", port), timeout=5)
    bad.sendall(b"\x10\xff\xff\xff\xff\x7f")  # remaining length longer than 4 bytes
    assert bad.recv(10) == b""
    good.publish("n/t", b"fine", 0)
    assert good.get().payload == b"fine"
    good.stop()


def test_http_listener_serves_https_when_given_a_certificate(
    start_broker: Start, certificates: dict[str, str]
) -> None:
    """http.certfile/keyfile turn the HTTP listener into HTTPS, like the MQTT TLS listener."""
    broker = start_broker(http__certfile=certificates["server.pem"], http__keyfile=certificates["server.key"])
    port = broker.ports["http"]
    context = ssl.create_default_context(cafile=certificates["ca.pem"])
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=5, context=context) as response:
        assert response.status == 200 and json.loads(response.read())["status"] == "ok"
    with pytest.raises(OSError):  # plain HTTP on the HTTPS port gets no HTTP answer
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read()
