"""Subscribers in processes of their own, for streams faster than an in-process client drains.

Why: the recovery matrix's subscriber shared the test process (and its GIL) with the paho
publisher, the id stream's thread and the counting; at QoS 2 it drained slower than 2,000 msg/s
on this 2-core machine (the no-fault control dropped 1,898 of 10,778 by queue policy,
2026-11-28). Side by side (the QoS 2 control, load 11-13): mosquitto_sub 0 dropped of 12,222 at
1,933 msg/s, paho in a process of its own 3,573 of 11,945, paho in the test's process 4,157 of
9,642 (docs/notes/recovery.md). Two handles, each offering what tests/support/recovery_cells.py
uses of ``ClusterClient`` (``subscribe``, ``connect``, ``wait_disconnected``, ``session_present``,
``messages`` / ``probes`` queues of ``Received`` for ``Inbox`` and ``probe_route``, ``close``):

* ``MosquittoSubscriber``: Debian's mosquitto_sub, the fast one. It cannot change broker: a
  mosquitto_sub restarted against another broker loses what it holds between PUBREC and PUBREL
  (it delivers a QoS 2 message at PUBREL, and its SIGTERM handler drops messages that arrive
  after the signal), so it cannot stand for a persistent client across a session move.
* ``ProcessSubscriber``: paho in a child process (``python -m tests.support.subscriber_process``),
  which can disconnect and connect to another broker. The child runs one paho client (MQTT 5,
  clean start 0, the session expiry given) and takes commands on stdin, one a line:
  ``connect HOST PORT``, ``subscribe QOS TOPIC``, ``disconnect``, ``quit``. It writes one line per
  event to stdout, flushed: ``C <session_present> <reason>`` (CONNACK), ``S <codes>`` (SUBACK),
  ``D <reason>`` (disconnected), ``M <qos> <dup> <topic> <payload>`` (a message; topics without
  spaces). paho hands a QoS 2 message to ``on_message`` at PUBREL and sends PUBCOMP after it
  returns, so every message the broker saw completed was written first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from typing import IO, Any

from tests.support.cluster import HOST, PROBE_PREFIX, WAIT_S, Received

# ---------------------------------------------------------------------------------------- child


def _child(argv: list[str] | None = None) -> int:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    parser = argparse.ArgumentParser(prog="python -m tests.support.subscriber_process")
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--session-expiry-s", type=int, default=600)
    args = parser.parse_args(argv)
    out = sys.stdout.buffer
    lock = threading.Lock()

    def say(line: bytes) -> None:
        with lock:
            out.write(line + b"\n")
            out.flush()

    client = paho.Client(
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id=args.client_id,
        protocol=paho.MQTTv5,
        reconnect_on_failure=False,
    )

    def on_connect(_c: Any, _u: Any, flags: Any, reason: Any, _p: Any) -> None:
        say(b"C %d %d" % (int(bool(flags.session_present)), int(getattr(reason, "value", reason))))

    def on_subscribe(_c: Any, _u: Any, _mid: int, reasons: Any, _p: Any) -> None:
        say(b"S " + b",".join(str(int(getattr(r, "value", r))).encode() for r in reasons))

    def on_disconnect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        say(b"D %d" % int(getattr(reason, "value", 0) or 0))

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        say(b"M %d %d %s " % (msg.qos, int(bool(msg.dup)), msg.topic.encode()) + bytes(msg.payload))

    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_disconnect = on_disconnect
    client.on_message = on_message
    for raw in sys.stdin:
        words = raw.split()
        if not words:
            continue
        if words[0] == "connect":
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = args.session_expiry_s
            client.loop_stop()
            client.connect(words[1], int(words[2]), keepalive=30, clean_start=False, properties=props)
            client.loop_start()
        elif words[0] == "subscribe":
            client.subscribe(words[2], int(words[1]))
        elif words[0] == "disconnect":
            client.disconnect()
        elif words[0] == "quit":
            break
    client.disconnect()
    client.loop_stop()
    return 0


# --------------------------------------------------------------------------------------- parent


class ProcessSubscriber:
    """The parent's handle on a child subscriber process (see the module docstring)."""

    def __init__(self, port: int, *, client_id: str, host: str = HOST, session_expiry_s: int = 600) -> None:
        self.client_id = client_id
        self.port = port
        self.host = host
        self.messages: queue.Queue[Received] = queue.Queue()
        self.probes: queue.Queue[Received] = queue.Queue()
        self._events: queue.Queue[bytes] = queue.Queue()
        self._connack: tuple[bool, int] | None = None
        self.disconnected = threading.Event()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.subscriber_process", "--client-id", client_id,
             "--session-expiry-s", str(session_expiry_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        self.connect()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            line = line.rstrip(b"\n")
            if line.startswith(b"M "):
                _, qos, dup, topic, payload = line.split(b" ", 4)
                received = Received(topic.decode(), payload, int(qos), False, dup == b"1")
                (self.probes if payload.startswith(PROBE_PREFIX) else self.messages).put(received)
            elif line.startswith(b"D"):
                self.disconnected.set()
                self._events.put(line)
            else:
                self._events.put(line)
        self.disconnected.set()
        self._events.put(b"EOF")

    def _command(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def _expect(self, prefix: bytes, what: str) -> bytes:
        while True:
            try:
                line = self._events.get(timeout=WAIT_S)
            except queue.Empty:
                raise TimeoutError(f"{self.client_id}: no {what} within {WAIT_S} s") from None
            if line == b"EOF":
                raise RuntimeError(f"{self.client_id}: the subscriber process exited ({self.proc.poll()})")
            if line.startswith(prefix):
                return line

    def connect(self, port: int | None = None, *, host: str | None = None) -> None:
        if port is not None:
            self.port = port
        if host is not None:
            self.host = host
        self.disconnected.clear()
        self._command(f"connect {self.host} {self.port}")
        _, present, reason = self._expect(b"C ", "CONNACK").split()
        assert int(reason) == 0, f"{self.client_id}: CONNACK refused: {int(reason)}"
        self._connack = (present == b"1", int(reason))

    @property
    def session_present(self) -> bool:
        return self._connack is not None and self._connack[0]

    def subscribe(self, topic: str, qos: int = 1) -> list[int]:
        self._command(f"subscribe {qos} {topic}")
        codes = self._expect(b"S ", "SUBACK").split(b" ", 1)[1]
        return [int(c) for c in codes.split(b",")]

    def wait_disconnected(self, timeout_s: float = WAIT_S) -> None:
        if not self.disconnected.wait(timeout_s):
            raise TimeoutError(f"{self.client_id}: still connected after {timeout_s} s")

    def disconnect(self) -> None:
        self._command("disconnect")
        self.wait_disconnected()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._command("quit")
                self.proc.wait(timeout=WAIT_S)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=WAIT_S)


if __name__ == "__main__":
    raise SystemExit(_child())


class MosquittoSubscriber:
    """mosquitto_sub (Debian's, in C) as a persistent subscriber on broker ``index`` of ``cluster``.

    ``mosquitto_sub -V mqttv5 -c -x EXPIRY -q QOS -t TOPIC -F 'M %q %t %p'``: it subscribes on
    every CONNACK and reconnects by itself (1 s apart) when its broker goes away, keeping its
    QoS 2 state (messages between PUBREC and PUBREL) across reconnects, as a device does. It
    prints no CONNACK, so ``connect()`` waits for the broker's ``client_connected`` log line
    for this client id (a new one since the last) and reads ``session_present`` from it. It
    cannot change broker (see the module docstring): a session move needs ProcessSubscriber.
    """

    def __init__(
        self, cluster: Any, index: int, *, client_id: str, topic: str, qos: int, session_expiry_s: int = 600
    ) -> None:
        broker = cluster.brokers[index]
        self.broker = broker
        self.client_id = client_id
        self.port = broker.mqtt_port
        self.messages: queue.Queue[Received] = queue.Queue()
        self.probes: queue.Queue[Received] = queue.Queue()
        self._topic, self._qos = topic, qos
        self._seen_connects = 0
        self._present = False
        self.proc = subprocess.Popen(
            ["stdbuf", "-oL", "mosquitto_sub", "-V", "mqttv5", "-c", "-x", str(session_expiry_s),
             "-i", client_id, "-h", broker.host, "-p", str(broker.mqtt_port), "-q", str(qos), "-t", topic,
             "-F", "M %q %t %p"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        self.connect()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            if line.startswith(b"M "):
                _, qos, topic, payload = line.rstrip(b"\n").split(b" ", 3)
                received = Received(topic.decode(), payload, int(qos), False, False)
                (self.probes if payload.startswith(PROBE_PREFIX) else self.messages).put(received)

    def _connects(self) -> list[dict[str, Any]]:
        needle = f'"client_id": "{self.client_id}"'
        out = []
        for line in self.broker.log_text().splitlines():
            if '"client_connected"' in line and needle in line:
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def connect(self, port: int | None = None, *, host: str | None = None) -> None:
        """Wait (bounded) until mosquitto_sub has connected again (by itself) to its broker."""
        if port is not None and port != self.port:
            raise ValueError("mosquitto_sub cannot move to another broker; use ProcessSubscriber")
        deadline = time.monotonic() + WAIT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto_sub {self.client_id} exited ({self.proc.returncode})")
            connects = self._connects()
            if len(connects) > self._seen_connects:
                self._seen_connects = len(connects)
                self._present = bool(connects[-1].get("session_present"))
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"mosquitto_sub {self.client_id}: not connected within {WAIT_S} s")
            time.sleep(0.05)

    @property
    def session_present(self) -> bool:
        return self._present

    def subscribe(self, topic: str, qos: int = 1) -> list[int]:
        """mosquitto_sub subscribed itself at start (and does again on every CONNACK)."""
        assert (topic, qos) == (self._topic, self._qos), "mosquitto_sub subscribes only at start"
        return [qos]

    def wait_disconnected(self, timeout_s: float = WAIT_S) -> None:
        """Its broker was killed: it reconnects by itself; nothing to wait for."""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=WAIT_S)
