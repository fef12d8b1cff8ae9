"""Real MQTT clients for the interop suite, each wrapped with bounded waits.

- PahoClient: paho-mqtt 2.x (CallbackAPIVersion.VERSION2) speaking MQTT 3.1.1 or 5, TCP, TLS or
  WebSocket; received messages land in a queue; connect/subscribe/publish wait for their acks.
- amqtt (asyncio MQTTClient, MQTT 3.1.1): run_amqtt() drives a coroutine with a timeout.
- mosquitto_sub / mosquitto_pub subprocesses (-V mqttv311 / mqttv5): MosquittoSub waits for its
  SUBACK (debug output) before the test publishes, and parses messages printed with -F.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import ssl
import subprocess
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

WAIT_S = 5.0
_ids = itertools.count(1)
T = TypeVar("T")


def unique_id(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{int(time.time() * 1000) % 100000}"


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    properties: dict[str, Any] = field(default_factory=dict)


def _props_to_dict(props: Properties | None) -> dict[str, Any]:
    if props is None:
        return {}
    out: dict[str, Any] = {}
    for name in dir(props):
        if name[0].isupper() and name not in ("Types",) and hasattr(props, name):
            value = getattr(props, name)
            if not callable(value):
                out[name] = value
    return out


class PahoClient:
    """A connected paho client whose every operation waits for its acknowledgement (bounded)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str | None = None,
        version: int = 4,
        clean: bool = True,
        keepalive_s: int = 30,
        transport: str = "tcp",
        tls_context: ssl.SSLContext | None = None,
        username: str | None = None,
        password: str | None = None,
        will: tuple[str, bytes, int, bool] | None = None,
        will_props: Properties | None = None,
        connect_props: Properties | None = None,
        connect: bool = True,
        expect_success: bool = True,
    ) -> None:
        self.client_id = client_id if client_id is not None else unique_id("paho")
        self.version = version
        protocol = paho.MQTTv5 if version == 5 else paho.MQTTv311
        kwargs: dict[str, Any] = {}
        if version != 5:
            kwargs["clean_session"] = clean
        self.client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=protocol,
            transport=transport,  # type: ignore[arg-type]
            reconnect_on_failure=False,
            **kwargs,
        )
        if transport == "websockets":
            self.client.ws_set_options(path="/mqtt")
        if tls_context is not None:
            self.client.tls_set_context(tls_context)
        if username is not None:
            self.client.username_pw_set(username, password)
        if will is not None:
            self.client.will_set(will[0], will[1], will[2], will[3], properties=will_props)
        self.messages: queue.Queue[Received] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connack_flags: Any = None
        self.connack_reason: Any = None
        self.connack_props: Properties | None = None
        self.disconnect_reason: Any = None
        self.disconnect_props: Properties | None = None
        self._acks: dict[int, threading.Event] = {}
        self._suback: dict[int, list[Any]] = {}
        self._lock = threading.Lock()
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_unsubscribe = self._on_unsubscribe
        self.host, self.port, self.keepalive_s, self.clean = host, port, keepalive_s, clean
        self.connect_props = connect_props
        if connect:
            self.connect(expect_success=expect_success)

    # callbacks (paho's network thread)
    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connack_flags, self.connack_reason, self.connack_props = flags, reason, props
        self.connected.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.disconnect_reason, self.disconnect_props = reason, props
        self.disconnected.set()

    def _on_message(self, client: Any, userdata: Any, msg: paho.MQTTMessage) -> None:
        self.messages.put(
            Received(
                msg.topic,
                bytes(msg.payload),
                msg.qos,
                bool(msg.retain),
                bool(msg.dup),
                _props_to_dict(msg.properties),
            )
        )

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        with self._lock:
            self._suback[mid] = list(reasons)
            self._acks.setdefault(mid, threading.Event()).set()

    def _on_unsubscribe(self, client: Any, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        with self._lock:
            self._suback[mid] = list(reasons)
            self._acks.setdefault(mid, threading.Event()).set()

    # operations
    def connect(self, *, expect_success: bool = True) -> None:
        kwargs: dict[str, Any] = {}
        if self.version == 5:
            kwargs["clean_start"] = self.clean
            kwargs["properties"] = self.connect_props
        self.connected.clear()
        self.disconnected.clear()
        self.client.connect(self.host, self.port, keepalive=self.keepalive_s, **kwargs)
        self.client.loop_start()
        if not self.connected.wait(WAIT_S) and not self.disconnected.is_set():
            raise TimeoutError(f"{self.client_id}: no CONNACK within {WAIT_S} s")
        if expect_success:
            assert self.connack_reason is not None and not self.connack_reason.is_failure, (
                f"{self.client_id}: CONNACK refused: {self.connack_reason}"
            )

    @property
    def session_present(self) -> bool:
        return bool(self.connack_flags.session_present)

    def _wait_ack(self, mid: int, what: str) -> list[Any]:
        with self._lock:
            event = self._acks.setdefault(mid, threading.Event())
        if not event.wait(WAIT_S):
            raise TimeoutError(f"{self.client_id}: no {what} for mid {mid} within {WAIT_S} s")
        return self._suback.get(mid, [])

    def subscribe(self, topic: Any, qos: Any = 0, properties: Properties | None = None) -> list[Any]:
        """Subscribe and wait for SUBACK; returns the reason codes (paho ReasonCode objects).

        qos may be a paho SubscribeOptions (MQTT 5 subscription options).
        """
        if isinstance(qos, SubscribeOptions):
            rc, mid = self.client.subscribe(topic, options=qos, properties=properties)
        else:
            rc, mid = self.client.subscribe(topic, qos, properties=properties)
        assert rc == paho.MQTT_ERR_SUCCESS, f"subscribe failed locally: {rc}"
        assert mid is not None
        return self._wait_ack(mid, "SUBACK")

    def unsubscribe(self, topic: str) -> list[Any]:
        rc, mid = self.client.unsubscribe(topic)
        assert rc == paho.MQTT_ERR_SUCCESS, f"unsubscribe failed locally: {rc}"
        assert mid is not None
        return self._wait_ack(mid, "UNSUBACK")

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> None:
        """Publish and (QoS>0) wait for the broker's PUBACK/PUBCOMP."""
        info = self.client.publish(topic, payload, qos, retain, properties=properties)
        info.wait_for_publish(WAIT_S)
        assert info.is_published(), f"{self.client_id}: publish of {topic} not acknowledged in {WAIT_S} s"

    def wait_message(self, timeout_s: float = WAIT_S) -> Received:
        try:
            return self.messages.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"{self.client_id}: no message within {timeout_s} s") from None

    def wait_messages(self, count: int, timeout_s: float = WAIT_S) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        out: list[Received] = []
        while len(out) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self.client_id}: got {len(out)} of {count} messages in {timeout_s} s")
            out.append(self.wait_message(remaining))
        return out

    def assert_no_message(self, within_s: float = 0.5) -> None:
        try:
            msg = self.messages.get(timeout=within_s)
        except queue.Empty:
            return
        raise AssertionError(f"{self.client_id}: unexpected message {msg}")

    def wait_disconnected(self, timeout_s: float = WAIT_S) -> Any:
        if not self.disconnected.wait(timeout_s):
            raise TimeoutError(f"{self.client_id}: still connected after {timeout_s} s")
        return self.disconnect_reason

    def disconnect(self, reason_code: int = 0) -> None:
        if self.version == 5 and reason_code:
            from paho.mqtt.reasoncodes import ReasonCode

            self.client.disconnect(reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=reason_code))
        else:
            self.client.disconnect()
        self.disconnected.wait(WAIT_S)
        self.client.loop_stop()

    def drop(self) -> None:
        """Abnormal close: tear the socket down without DISCONNECT."""
        sock = self.client.socket()
        self.client.loop_stop()
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def close(self) -> None:
        try:
            if self.client.is_connected():
                self.client.disconnect()
        finally:
            self.client.loop_stop()


def v5_props(packet_type: int, **values: Any) -> Properties:
    props = Properties(packet_type)
    for key, value in values.items():
        setattr(props, key, value)
    return props


# ---- amqtt ----------------------------------------------------------------------------------
def run_amqtt(coro: Coroutine[Any, Any, T], timeout_s: float = 15.0) -> T:
    """Run an amqtt coroutine to completion with a bound."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout_s)

    return asyncio.run(bounded())


# ---- mosquitto_sub / mosquitto_pub ------------------------------------------------------------
def mosquitto_version_flag(version: int) -> str:
    return "mqttv5" if version == 5 else "mqttv311"


def mosquitto_pub(
    host: str,
    port: int,
    topic: str,
    payload: str,
    *,
    qos: int = 0,
    retain: bool = False,
    version: int = 4,
    extra: list[str] | None = None,
) -> None:
    cmd = [
        "mosquitto_pub", "-h", host, "-p", str(port), "-t", topic, "-m", payload, "-q", str(qos),
        "-V", mosquitto_version_flag(version), "-i", unique_id("mpub"),
    ]  # fmt: skip
    if retain:
        cmd.append("-r")
    cmd += extra or []
    result = subprocess.run(cmd, capture_output=True, timeout=WAIT_S * 2, check=False)
    assert result.returncode == 0, f"mosquitto_pub failed ({result.returncode}): {result.stderr.decode()}"


@dataclass
class SubMessage:
    topic: str
    qos: int
    retain: bool
    payload: str


class MosquittoSub:
    """mosquitto_sub in the background; start() returns once its SUBACK arrived."""

    SEP = "\x1f"

    def __init__(
        self,
        host: str,
        port: int,
        topic: str,
        *,
        qos: int = 0,
        version: int = 4,
        extra: list[str] | None = None,
    ) -> None:
        fmt = self.SEP.join(["MSG", "%t", "%q", "%r", "%p"])
        self.cmd = [
            "stdbuf", "-oL", "mosquitto_sub", "-h", host, "-p", str(port), "-t", topic, "-q", str(qos), "-d",
            "-V", mosquitto_version_flag(version), "-F", fmt, "-i", unique_id("msub"),
        ]  # fmt: skip
        self.cmd += extra or []
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader: threading.Thread | None = None

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("")  # EOF marker

    def start(self) -> MosquittoSub:
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if "received SUBACK" in line:
                return self
            if line == "":
                break
        self.stop()
        raise TimeoutError(f"mosquitto_sub did not get its SUBACK: {self.cmd}")

    def wait_message(self, timeout_s: float = WAIT_S) -> SubMessage:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("mosquitto_sub: no message in time")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                raise TimeoutError("mosquitto_sub: no message in time") from None
            if line.startswith("MSG" + self.SEP):
                _, topic, qos, retain, payload = line.split(self.SEP, 4)
                return SubMessage(topic, int(qos), retain == "1", payload)
            if line == "":
                raise AssertionError("mosquitto_sub exited before the message arrived")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=WAIT_S)

    def __enter__(self) -> MosquittoSub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
