"""Shared helpers for the broker-core tests (tests/broker/test_core_*.py).

Starts a real broker (``broker.server.ThreadedBroker``: real listeners on ephemeral ports, real
SQLite store in a temporary directory) and provides a raw-socket MQTT client built on the codec
(for cases paho cannot express) plus small paho-mqtt 2.x helpers. Every wait is bounded.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

REPO_ROOT = Path(__file__).resolve().parents[2]
from broker.adapters.server import ThreadedBroker  # noqa: E402
from broker.config import load_config  # noqa: E402
from broker.mqtt import codec  # noqa: E402
from broker.mqtt.packets import (  # noqa: E402
    MQTT_3_1_1,
    MQTT_5,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Will,
)

WAIT_S = 5.0


def make_config(data_dir: Path, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "listeners.tcp.port": 0,
        "listeners.tcp.host": "127.0.0.1",
        "http.port": 0,
        "data_dir": str(data_dir),
        "sys.interval_s": 0,
        "uvloop": False,
        # in-process clustered brokers test other things than the links' security (the mutual-TLS
        # tests, tests/process/cluster/test_cluster_security.py, set cluster.tls_* themselves)
        "cluster.insecure": True,
    }
    values.update(overrides)
    return load_config(None, env={}, overrides=values)


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., ThreadedBroker]]:
    """``start_broker(**dotted_overrides)`` -> a running ThreadedBroker, stopped at teardown."""
    started: list[ThreadedBroker] = []

    def _start(data_dir: Path | None = None, **overrides: Any) -> ThreadedBroker:
        config = make_config(
            data_dir or tmp_path / "data", **{k.replace("__", "."): v for k, v in overrides.items()}
        )
        threaded = ThreadedBroker(config)
        threaded.start()
        started.append(threaded)
        return threaded

    yield _start
    for threaded in started:
        threaded.stop()


class RawClient:
    """A blocking MQTT client on a plain socket, using the project's codec (client role)."""

    def __init__(self, port: int, protocol_level: int = MQTT_3_1_1, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=WAIT_S)
        self.protocol_level = protocol_level
        self.decoder = codec.Decoder(role="client", protocol_level=protocol_level)
        self.pending: list[Packet] = []
        self.closed = False

    def send(self, packet: Packet) -> None:
        self.sock.sendall(codec.encode(packet, self.protocol_level))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(
        self,
        client_id: str,
        *,
        clean: bool = True,
        keep_alive_s: int = 60,
        will: Will | None = None,
        properties: dict[str, Any] | None = None,
        username: str | None = None,
        password: bytes | None = None,
    ) -> Connack:
        self.send(
            Connect(
                client_id=client_id,
                protocol_level=self.protocol_level,
                protocol_name="MQTT",
                clean_start=clean,
                keep_alive_s=keep_alive_s,
                will=will,
                properties=properties or {},
                username=username,
                password=password,
            )
        )
        connack = self.expect(Connack)
        return connack

    def recv(self, timeout_s: float = WAIT_S) -> Packet:
        deadline = time.monotonic() + timeout_s
        while not self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no packet from the broker")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError("no packet from the broker") from None
            except ConnectionError:
                data = b""
            if not data:
                self.closed = True
                raise ConnectionError("the broker closed the connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def expect(self, cls: type, timeout_s: float = WAIT_S) -> Any:
        packet = self.recv(timeout_s)
        assert isinstance(packet, cls), f"expected {cls.__name__}, got {packet!r}"
        return packet

    def take(self, cls: type, timeout_s: float = WAIT_S) -> Any:
        """The next packet of type ``cls``; other packets received meanwhile stay queued in order."""
        for index, packet in enumerate(self.pending):
            if isinstance(packet, cls):
                return self.pending.pop(index)
        skipped: list[Packet] = []
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                packet = self.recv(max(0.01, deadline - time.monotonic()))
                if isinstance(packet, cls):
                    return packet
                skipped.append(packet)
        finally:
            self.pending[:0] = skipped

    def expect_nothing(self, wait_s: float = 0.3) -> None:
        try:
            packet = self.recv(wait_s)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected packet {packet!r}")

    def read_until_closed(self, timeout_s: float = WAIT_S) -> list[Packet]:
        """All packets until the broker closes the connection (fails if it does not in time)."""
        packets: list[Packet] = []
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                packets.append(self.recv(max(0.01, deadline - time.monotonic())))
            except ConnectionError:
                return packets
            except TimeoutError:
                raise AssertionError(f"connection not closed within {timeout_s} s; got {packets!r}") from None

    def subscribe(self, topic_filter: str, qos: int = 0, packet_id: int = 1, **options: Any) -> Suback:
        properties = options.pop("properties", {})
        self.send(Subscribe(packet_id, [Subscription(topic_filter, qos, **options)], properties))
        suback = self.expect(Suback)
        assert suback.packet_id == packet_id
        return suback

    def publish(
        self, topic: str, payload: bytes, qos: int = 0, packet_id: int | None = None, **kw: Any
    ) -> None:
        if qos and packet_id is None:
            packet_id = 1
        self.send(Publish(topic, payload, qos=qos, packet_id=packet_id, **kw))

    def publish_acked(self, topic: str, payload: bytes, qos: int, packet_id: int = 1, **kw: Any) -> Packet:
        """Publish at QoS 1/2 and complete the handshake; returns the PUBACK or PUBCOMP."""
        self.publish(topic, payload, qos, packet_id, **kw)
        if qos == 1:
            return self.take(Puback)
        pubrec = self.take(Pubrec)
        assert pubrec.packet_id == packet_id
        self.send(Pubrel(packet_id))
        return self.take(Pubcomp)

    def expect_publish(self, timeout_s: float = WAIT_S) -> Publish:
        packet: Publish = self.take(Publish, timeout_s)
        return packet

    def ack(self, publish: Publish) -> None:
        """Acknowledge a received PUBLISH completely (QoS 1 PUBACK, QoS 2 PUBREC/PUBREL/PUBCOMP)."""
        assert publish.packet_id is not None
        if publish.qos == 1:
            self.send(Puback(publish.packet_id))
        elif publish.qos == 2:
            self.send(Pubrec(publish.packet_id))
            self.take(Pubrel)
            self.send(Pubcomp(publish.packet_id))

    def disconnect(self, reason_code: int = 0, properties: dict[str, Any] | None = None) -> None:
        self.send(Disconnect(reason_code, properties or {}))
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class PahoClient:
    """A paho-mqtt 2.x client running its network loop in a thread, with bounded waits."""

    def __init__(self, port: int, client_id: str, *, v5: bool = False, **kwargs: Any) -> None:
        protocol = mqtt.MQTTv5 if v5 else mqtt.MQTTv311
        clean = kwargs.pop("clean_session", None)
        if v5:
            self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
        else:
            self.client = mqtt.Client(
                CallbackAPIVersion.VERSION2,
                client_id=client_id,
                protocol=protocol,
                clean_session=True if clean is None else clean,
            )
        self.port = port
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connack: tuple[Any, Any] | None = None
        self.disconnect_reason: Any = None
        self.client.on_message = lambda _c, _u, msg: self.messages.put(msg)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect

    def _on_connect(self, _c: Any, _u: Any, flags: Any, reason: Any, properties: Any) -> None:
        self.connack = (flags, reason)
        self.connected.set()

    def _on_disconnect(self, _c: Any, _u: Any, _flags: Any, reason: Any, _properties: Any) -> None:
        self.disconnect_reason = reason
        self.disconnected.set()

    def start(self, **connect_kwargs: Any) -> PahoClient:
        self.client.connect("127.0.0.1", self.port, **connect_kwargs)
        self.client.loop_start()
        assert self.connected.wait(WAIT_S), "paho client did not connect"
        return self

    def subscribe(self, topic_filter: str, qos: int = 0, **kwargs: Any) -> None:
        done = threading.Event()
        self.client.on_subscribe = lambda *_args: done.set()
        self.client.subscribe(topic_filter, qos, **kwargs)
        assert done.wait(WAIT_S), "no SUBACK"

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False, **kwargs: Any) -> None:
        info = self.client.publish(topic, payload, qos, retain, **kwargs)
        info.wait_for_publish(WAIT_S)
        assert info.is_published()

    def get(self, timeout_s: float = WAIT_S) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout_s)

    def get_nothing(self, wait_s: float = 0.3) -> None:
        try:
            message = self.messages.get(timeout=wait_s)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message on {message.topic}: {message.payload!r}")

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def wait_for(predicate: Callable[[], bool], timeout_s: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def wait_store_idle(threaded: ThreadedBroker) -> None:
    """Wait (bounded) until the broker's store has no COMMIT in flight on the commit thread, no
    uncommitted work and no lazy commit waiting: a test that swaps the store's connection for a
    failing or gated one does it then, so that an earlier step's commit running late (a loaded
    machine) does not take what the test meant for its own."""

    def idle() -> bool:
        store = threaded.broker.store
        assert store is not None
        lazy_waiting = threaded.broker.durability._lazy_handle is not None
        return not getattr(store, "_bg_running", False) and not store.pending and not lazy_waiting

    wait_for(lambda: bool(threaded.call(idle)), what="the store idle")


__all__ = [
    "MQTT_3_1_1",
    "MQTT_5",
    "PahoClient",
    "RawClient",
    "make_config",
    "start_broker",
    "wait_for",
    "wait_store_idle",
]


def test_raw_client_round_trip(start_broker: Callable[..., ThreadedBroker]) -> None:
    """The helpers themselves work: a raw client publishes to itself through the broker."""
    broker = start_broker()
    client = RawClient(broker.ports["tcp"])
    assert client.connect("helper-self-test").reason_code == 0
    client.subscribe("self/test", 1)
    client.publish_acked("self/test", b"x", 1)
    received = client.expect_publish()
    assert (received.topic, received.payload, received.qos) == ("self/test", b"x", 1)
    client.ack(received)
    client.disconnect()
