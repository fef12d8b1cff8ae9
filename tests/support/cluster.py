"""Clients and bounded waits for the multi-process cluster suite (issue #4 "SkipMQ cluster").

- ClusterClient: a paho-mqtt 2.x client (MQTT 3.1.1 or 5) connected to one broker of a
  LocalCluster. Received messages land in a queue; probe messages (payload starting with
  PROBE_PREFIX) land in a separate queue so late probes never disturb a test's counting.
  Every QoS>0 publish is recorded: `acked_payloads` holds the payloads whose PUBACK/PUBCOMP
  arrived with a success code (paho's on_publish), which is what "acknowledged" means in
  the kill -9 and join/leave tests.
- wait_until(predicate, timeout_s): poll with a bound; never sleep-and-hope.
- probe_route(cluster, pub_index, sub_client, topic): publish probes from a broker until the
  subscriber sees one, i.e. until the subscription has reached that broker through the overlay.
- mosquitto_pub / MosquittoSub: the Debian mosquitto command-line clients.
- metric helpers that parse a broker's /metrics text.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client.parser import text_string_to_metric_families

from tools.launcher import LocalCluster

WAIT_S = 10.0
PROBE_PREFIX = b"__probe__"
HOST = "127.0.0.1"
_ids = itertools.count(1)

# ---- type aliases of the conftest fixtures ----
ClusterFactory = Callable[..., LocalCluster]  # make(n, settings=None) -> ready cluster
ClientFactory = Callable[..., "ClusterClient"]  # make(cluster, i, **ClusterClient kwargs)

# Every cluster a fixture started and has not closed: failing tests get their log tails.
LIVE_CLUSTERS: list[LocalCluster] = []


def unique_id(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{int(time.time() * 1000) % 1_000_000}"


def wait_until(
    predicate: Callable[[], Any], timeout_s: float, *, interval_s: float = 0.05, what: str = "condition"
) -> Any:
    """Poll predicate() until it returns a truthy value (returned) or timeout_s passes (TimeoutError)."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # a probe that raised counts as "not yet"
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise TimeoutError(f"{what} not reached within {timeout_s} s{detail}")
        time.sleep(interval_s)


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    properties: dict[str, Any] = field(default_factory=dict)


class ClusterClient:
    """A paho client connected to one broker; operations wait (bounded) for their acks."""

    def __init__(
        self,
        port: int,
        *,
        client_id: str | None = None,
        version: int = 5,
        clean: bool = True,
        session_expiry_s: int | None = None,
        keepalive_s: int = 30,
        will: tuple[str, bytes, int, bool] | None = None,
        max_inflight: int = 20,
        connect: bool = True,
        host: str = HOST,
    ) -> None:
        self.host = host  # the broker's client address (127.0.0.1 unless it runs in a netns)
        self.client_id = client_id if client_id is not None else unique_id("c")
        self.version = version
        self.port = port
        self.clean = clean
        self.keepalive_s = keepalive_s
        self.session_expiry_s = session_expiry_s
        kwargs: dict[str, Any] = {}
        if version != 5:
            kwargs["clean_session"] = clean
        self.client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=paho.MQTTv5 if version == 5 else paho.MQTTv311,
            reconnect_on_failure=False,
            **kwargs,
        )
        self.client.max_inflight_messages_set(max_inflight)
        self.client.max_queued_messages_set(0)
        if will is not None:
            self.client.will_set(will[0], will[1], will[2], will[3])
        self.messages: queue.Queue[Received] = queue.Queue()
        self.probes: queue.Queue[Received] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connack_flags: Any = None
        self.connack_reason: Any = None
        self.disconnect_reason: Any = None
        self._lock = threading.Lock()
        self._sub_acks: dict[int, threading.Event] = {}
        self._sub_reasons: dict[int, list[Any]] = {}
        self.pending: dict[int, bytes] = {}  # mid -> payload of QoS>0 publishes not acked yet
        self.acked_payloads: list[bytes] = []  # in PUBACK/PUBCOMP order
        self.failed_payloads: list[bytes] = []  # acked with a failure reason code (v5)
        self._early_acks: dict[int, bool] = {}  # mid -> failed, for acks seen before the mid was recorded
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_unsubscribe = self._on_subscribe
        self.client.on_publish = self._on_publish
        if connect:
            self.connect()

    # ---- paho callbacks (network thread)
    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connack_flags, self.connack_reason = flags, reason
        self.connected.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.disconnect_reason = reason
        self.disconnected.set()

    def _on_message(self, client: Any, userdata: Any, msg: paho.MQTTMessage) -> None:
        received = Received(msg.topic, bytes(msg.payload), msg.qos, bool(msg.retain), bool(msg.dup))
        if msg.properties is not None and hasattr(msg.properties, "UserProperty"):
            received.properties["UserProperty"] = msg.properties.UserProperty
        if received.payload.startswith(PROBE_PREFIX):
            self.probes.put(received)
        else:
            self.messages.put(received)

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        with self._lock:
            self._sub_reasons[mid] = list(reasons)
            self._sub_acks.setdefault(mid, threading.Event()).set()

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        failed = reason is not None and bool(getattr(reason, "is_failure", False))
        with self._lock:
            payload = self.pending.pop(mid, None)
            if payload is None:  # acked before publish_nowait recorded the mid (or QoS 0)
                self._early_acks[mid] = failed
                return
            (self.failed_payloads if failed else self.acked_payloads).append(payload)

    # ---- operations
    def connect(
        self, port: int | None = None, *, expect_success: bool = True, host: str | None = None
    ) -> None:
        """(Re)connect, to ``port`` (and ``host``) if given (another broker of the cluster)."""
        if port is not None:
            self.port = port
        if host is not None:
            self.host = host
        kwargs: dict[str, Any] = {}
        if self.version == 5:
            kwargs["clean_start"] = self.clean
            if self.session_expiry_s is not None:
                props = Properties(PacketTypes.CONNECT)
                props.SessionExpiryInterval = self.session_expiry_s
                kwargs["properties"] = props
        self.client.loop_stop()  # a previous network thread may still be winding down
        self.connected.clear()
        self.disconnected.clear()
        self.client.connect(self.host, self.port, keepalive=self.keepalive_s, **kwargs)
        self.client.loop_start()
        if not self.connected.wait(WAIT_S):
            raise TimeoutError(f"{self.client_id}: no CONNACK from port {self.port} within {WAIT_S} s")
        if expect_success:
            assert self.connack_reason is not None and not self.connack_reason.is_failure, (
                f"{self.client_id}: CONNACK refused: {self.connack_reason}"
            )

    @property
    def session_present(self) -> bool:
        return bool(self.connack_flags.session_present)

    def subscribe(self, topic: str, qos: int = 1) -> list[int]:
        """Subscribe, wait for SUBACK; returns the granted QoS / reason code values."""
        rc, mid = self.client.subscribe(topic, qos)
        assert rc == paho.MQTT_ERR_SUCCESS and mid is not None, f"subscribe failed locally: {rc}"
        with self._lock:
            event = self._sub_acks.setdefault(mid, threading.Event())
        if not event.wait(WAIT_S):
            raise TimeoutError(f"{self.client_id}: no SUBACK for {topic} within {WAIT_S} s")
        return [int(getattr(r, "value", r)) for r in self._sub_reasons.get(mid, [])]

    def unsubscribe(self, topic: str) -> None:
        rc, mid = self.client.unsubscribe(topic)
        assert rc == paho.MQTT_ERR_SUCCESS and mid is not None, f"unsubscribe failed locally: {rc}"
        with self._lock:
            event = self._sub_acks.setdefault(mid, threading.Event())
        if not event.wait(WAIT_S):
            raise TimeoutError(f"{self.client_id}: no UNSUBACK for {topic} within {WAIT_S} s")

    def publish_nowait(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> Any:
        """Publish without waiting; QoS>0 payloads are tracked in ``pending`` until acked."""
        # Not under self._lock: paho runs callbacks under its own mutex (lock-order inversion).
        info = self.client.publish(topic, payload, qos, retain)
        # NO_CONN: paho keeps a QoS>0 message and sends it after the next connect
        if qos > 0 and info.rc in (paho.MQTT_ERR_SUCCESS, paho.MQTT_ERR_NO_CONN):
            with self._lock:
                if info.mid in self._early_acks:
                    failed = self._early_acks.pop(info.mid)
                    (self.failed_payloads if failed else self.acked_payloads).append(payload)
                else:
                    self.pending[info.mid] = payload
        else:
            with self._lock:
                self._early_acks.pop(info.mid, None)
        return info

    def publish(
        self, topic: str, payload: bytes, qos: int = 1, retain: bool = False, timeout_s: float = WAIT_S
    ) -> None:
        """Publish and (QoS>0) wait for the PUBACK/PUBCOMP."""
        info = self.publish_nowait(topic, payload, qos, retain)
        assert info.rc == paho.MQTT_ERR_SUCCESS, f"{self.client_id}: publish refused locally: {info.rc}"
        if qos > 0:
            info.wait_for_publish(timeout_s)
            assert info.is_published(), f"{self.client_id}: {topic} not acknowledged within {timeout_s} s"

    def acked_snapshot(self) -> list[bytes]:
        """The payloads acknowledged so far (a copy, safe against the network thread)."""
        with self._lock:
            return list(self.acked_payloads)

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
            try:
                out.append(self.messages.get(timeout=remaining))
            except queue.Empty:
                continue
        return out

    def drain(self, settle_s: float = 0.3, max_s: float | None = None) -> list[Received]:
        """Everything that arrives until nothing came for settle_s, or max_s passed (a live stream
        never leaves a gap of settle_s: what comes after max_s stays queued for the next call)."""
        out: list[Received] = []
        deadline = None if max_s is None else time.monotonic() + max_s
        while deadline is None or time.monotonic() < deadline:
            try:
                out.append(self.messages.get(timeout=settle_s))
            except queue.Empty:
                return out
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

    def disconnect(self) -> None:
        self.client.disconnect()
        self.disconnected.wait(WAIT_S)
        self.client.loop_stop()

    def drop(self) -> None:
        """Abnormal close: the socket goes away without DISCONNECT (the will fires)."""
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


def probe_route(
    cluster: LocalCluster,
    pub_broker: int,
    sub_client: ClusterClient | Iterable[ClusterClient],
    topic: str,
    timeout_s: float = 20.0,
    interval_s: float = 0.1,
) -> float:
    """Publish QoS 0 probes on ``topic`` at broker pub_broker until a subscriber receives one.

    sub_client may be several clients (members of a shared group): any of them counts.
    Returns the seconds it took. Probes carry PROBE_PREFIX and a token of this call, so the
    subscribers' ``messages`` queues never see them and earlier probes never count."""
    subs = [sub_client] if isinstance(sub_client, ClusterClient) else list(sub_client)
    token = PROBE_PREFIX + unique_id("p").encode() + b":"
    started = time.monotonic()
    broker = cluster.brokers[pub_broker]
    publisher = ClusterClient(broker.mqtt_port, client_id=unique_id("probe"), version=5, host=broker.host)
    try:
        sent = 0
        while True:
            sent += 1
            publisher.publish(topic, token + str(sent).encode(), qos=0)
            wait_end = time.monotonic() + interval_s
            while True:
                got_probe = False
                for sub in subs:
                    try:
                        probe = sub.probes.get_nowait()
                    except queue.Empty:
                        continue
                    got_probe = True
                    if probe.payload.startswith(token) and probe.topic == topic:
                        return time.monotonic() - started
                if time.monotonic() >= wait_end:
                    break
                if not got_probe:
                    time.sleep(0.01)
            if time.monotonic() - started > timeout_s:
                names = ", ".join(f"{s.client_id} (port {s.port})" for s in subs)
                raise TimeoutError(
                    f"subscription of {names} not reached from broker {pub_broker} on {topic!r}"
                    f" within {timeout_s} s ({sent} probes)"
                )
    finally:
        publisher.close()


def close_tracked(cluster: LocalCluster, clients: Iterable[ClusterClient]) -> None:
    """A test's teardown of a cluster it started itself: its clients (errors ignored), the cluster,
    and its entry in LIVE_CLUSTERS (failure reports stop showing its logs)."""
    for client in clients:
        with contextlib.suppress(Exception):
            client.close()
    cluster.close()
    if cluster in LIVE_CLUSTERS:
        LIVE_CLUSTERS.remove(cluster)


def wait_peer_gone(cluster: LocalCluster, index: int, peer_id: str, timeout_s: float) -> None:
    """Wait (bounded) until broker index's GET /cluster no longer lists peer_id as connected."""

    def gone() -> bool:
        return peer_id not in cluster.cluster_state(index)["connected_peers"]

    wait_until(gone, timeout_s, interval_s=0.1, what=f"broker {index} dropped peer {peer_id}")


# ---- metrics ---------------------------------------------------------------------------------
def metric_samples(text: str, sample_name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called sample_name (e.g. "skipmq_cluster_delivery_hops_bucket") in /metrics text."""
    out: list[tuple[dict[str, str], float]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == sample_name:
                out.append((dict(sample.labels), float(sample.value)))
    return out


def metric_total(text: str, sample_name: str, **labels: str) -> float:
    """Sum of the samples called sample_name whose labels include ``labels``."""
    return sum(
        value
        for sample_labels, value in metric_samples(text, sample_name)
        if all(sample_labels.get(k) == v for k, v in labels.items())
    )


def histogram_count_above(text: str, name: str, threshold: float) -> float:
    """Observations of histogram ``name`` greater than threshold (from its cumulative buckets)."""
    buckets = metric_samples(text, f"{name}_bucket")
    total = metric_total(text, f"{name}_count")
    at_most = 0.0
    for labels, value in buckets:
        upper = labels.get("le", "+Inf")
        if upper != "+Inf" and float(upper) <= threshold:
            at_most = max(at_most, value)
    return total - at_most


# ---- mosquitto command-line clients ------------------------------------------------------------
def mosquitto_pub(port: int, topic: str, payload: str, *, qos: int = 1, version: int = 4) -> None:
    cmd = [
        "mosquitto_pub", "-h", HOST, "-p", str(port), "-t", topic, "-m", payload, "-q", str(qos),
        "-V", "mqttv5" if version == 5 else "mqttv311", "-i", unique_id("mpub"),
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, timeout=WAIT_S, check=False)
    assert result.returncode == 0, f"mosquitto_pub failed ({result.returncode}): {result.stderr.decode()}"


class MosquittoSub:
    """mosquitto_sub in the background; start() returns once its SUBACK arrived.

    Lines it prints with ``-F`` (topic, payload) are parsed; probe payloads are skipped."""

    SEP = "\x1f"

    def __init__(self, port: int, topic: str, *, qos: int = 1, version: int = 4) -> None:
        self.cmd = [
            "stdbuf", "-oL", "mosquitto_sub", "-h", HOST, "-p", str(port), "-t", topic, "-q", str(qos), "-d",
            "-V", "mqttv5" if version == 5 else "mqttv311", "-F", self.SEP.join(["MSG", "%t", "%p"]),
            "-i", unique_id("msub"),
        ]  # fmt: skip
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str] = queue.Queue()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("")  # EOF

    def start(self) -> MosquittoSub:
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL
        )
        threading.Thread(target=self._read, daemon=True).start()
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
        raise TimeoutError(f"mosquitto_sub got no SUBACK: {self.cmd}")

    def messages_until(self, predicate: Callable[[str, str], bool], timeout_s: float = WAIT_S) -> str:
        """Wait for a printed message (topic, payload) satisfying predicate; returns its payload."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("mosquitto_sub: no matching message in time")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line == "":
                raise AssertionError("mosquitto_sub exited before the message arrived")
            if line.startswith("MSG" + self.SEP):
                _, topic, payload = line.split(self.SEP, 2)
                if predicate(topic, payload):
                    return payload

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=WAIT_S)


def numbers(payloads: Iterable[bytes], prefix: bytes = b"") -> list[int]:
    """Payloads like b"<prefix>17" to ints (payloads without the prefix are skipped)."""
    out = []
    for payload in payloads:
        if payload.startswith(prefix):
            out.append(int(payload[len(prefix) :]))
    return out


class Streamer(threading.Thread):
    """Publishes b"<prefix><n>" for n = 0, 1, ... at QoS 1 until stop(); pauses while disconnected.

    ``sent`` counts what was handed to paho; acknowledgements land in the client's
    ``acked_payloads`` (PUBACK received), which is what the tests compare against."""

    def __init__(
        self, client: ClusterClient, topic: str, prefix: bytes = b"n", interval_s: float = 0.01
    ) -> None:
        super().__init__(daemon=True, name=f"streamer-{topic}")
        self.client = client
        self.topic = topic
        self.prefix = prefix
        self.interval_s = interval_s
        self.sent = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            if self.client.client.is_connected():
                self.client.publish_nowait(self.topic, self.prefix + str(self.sent).encode(), 1)
                self.sent += 1
            self._stop_event.wait(self.interval_s)

    def acked_numbers(self) -> list[int]:
        return numbers(self.client.acked_snapshot(), self.prefix)

    def wait_acked(self, count: int, timeout_s: float = 30.0) -> None:
        """Wait (bounded) until ``count`` of the stream's messages are acknowledged in total."""
        wait_until(
            lambda: len(self.acked_numbers()) >= count, timeout_s, what=f"{count} acknowledged publishes"
        )

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop_event.set()
        self.join(timeout_s)


def first_occurrences(values: Iterable[int]) -> list[int]:
    seen: set[int] = set()
    out = []
    for value in values:
        if value not in seen:
            seen.add(value)
            out.append(value)
    return out


def is_strictly_increasing(values: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


def publish_until_acks_are_fast(
    publisher: ClusterClient,
    topic: str,
    prefix: bytes,
    *,
    fast_s: float,
    settle_s: float,
    ack_timeout_s: float,
    consecutive: int = 5,
) -> list[bytes]:
    """Publish numbered QoS 1 messages (prefix + n) one at a time until ``consecutive`` PUBACKs
    in a row each took less than fast_s; fail if that has not happened settle_s after the start.

    For "after a membership change settles, PUBACKs no longer wait for brokers that are gone":
    a delay while the change propagates is allowed, a lasting one is not. Returns the payloads
    published (all acknowledged)."""
    started = time.monotonic()
    history: list[float] = []
    payloads: list[bytes] = []
    streak = 0
    while streak < consecutive:
        if time.monotonic() - started > settle_s:
            raise AssertionError(
                f"PUBACKs still slow {settle_s} s after the change (fast means < {fast_s} s);"
                f" latencies so far: {history}"
            )
        payload = prefix + str(len(payloads)).encode()
        sent_at = time.monotonic()
        publisher.publish(topic, payload, 1, timeout_s=ack_timeout_s)
        latency_s = time.monotonic() - sent_at
        history.append(round(latency_s, 3))
        payloads.append(payload)
        streak = streak + 1 if latency_s < fast_s else 0
    return payloads


def send_log_rows(cluster: LocalCluster, index: int, cls: str) -> int:
    """Rows of broker ``index``'s durable send log for topic class ``cls`` (read-only, from its
    SQLite file while it runs: WAL lets a second reader in)."""
    path = os.path.join(cluster.brokers[index].data_dir, "skipmq.db")
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)) as db:
        row = db.execute("SELECT count(*) FROM cluster_send_log WHERE stream = ?", (cls,)).fetchone()
    return int(row[0])
