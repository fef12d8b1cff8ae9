"""``skipmq cluster`` end to end: start the launcher as a process, use the brokers it prints with
mosquitto_sub/mosquitto_pub on two different brokers, stop it with SIGINT/SIGTERM (exit 0)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import MosquittoSub, mosquitto_pub, unique_id, wait_until
from tools.launcher import REPO_ROOT

START_S = 90.0


class LauncherProcess:
    """`python -m broker cluster ...` with its stdout lines in a queue (read by a thread)."""

    def __init__(self, args: list[str]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "cluster", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.stdout: queue.Queue[str] = queue.Queue()
        self.stderr_lines: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.stdout.put), daemon=True).start()
        threading.Thread(
            target=self._pump, args=(self.proc.stderr, self.stderr_lines.append), daemon=True
        ).start()

    @staticmethod
    def _pump(stream: Any, sink: Any) -> None:
        for line in stream:
            sink(line.rstrip("\n"))

    def next_line(self, timeout_s: float) -> str:
        try:
            return self.stdout.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(
                f"launcher printed nothing in {timeout_s} s; stderr:\n" + "\n".join(self.stderr_lines[-30:])
            ) from None

    def wait_for_stderr(self, text: str, timeout_s: float) -> str:
        """The first stderr line containing ``text``, waiting up to ``timeout_s`` for the reader thread."""
        try:
            return str(
                wait_until(
                    lambda: next((line for line in list(self.stderr_lines) if text in line), None),
                    timeout_s,
                    what=f"launcher stderr line {text!r}",
                )
            )
        except TimeoutError:
            raise AssertionError(
                f"no stderr line {text!r} in {timeout_s} s; stderr:\n" + "\n".join(self.stderr_lines[-30:])
            ) from None

    def stop(self, sig: int, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"launcher ignored signal {sig} for {timeout_s} s") from None


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_cluster_command_json_then_pub_sub_across_brokers_then_sigint() -> None:
    launcher = LauncherProcess(["--brokers", "3", "--json", "--set", "cluster.failure_timeout_ms=3000"])
    sub: MosquittoSub | None = None
    try:
        info = json.loads(launcher.next_line(START_S))
        brokers = info["brokers"]
        assert [b["broker"] for b in brokers] == [0, 1, 2]
        assert info["joined"] is True, "the brokers must have joined the overlay"
        assert len({b["mqtt_port"] for b in brokers}) == 3
        assert all(b["peer_id"] == f"127.0.0.1:{b['cluster_port']}" for b in brokers)
        # stderr is read by its own thread: the launcher wrote this line before the JSON on stdout,
        # but our reader of stderr may not have taken it yet - wait for it (bounded)
        launcher.wait_for_stderr("broker 3/3 joined", 10.0)
        assert str(brokers[0]["mqtt_port"]) in info["example"]["subscribe"]
        assert str(brokers[1]["mqtt_port"]) in info["example"]["publish"]

        topic = f"{unique_id('cli')}/hello"
        sub = MosquittoSub(brokers[0]["mqtt_port"], topic, qos=1).start()
        # publish from broker 1 until the subscription on broker 0 is routed (bounded)
        deadline = time.monotonic() + 20
        received = ""
        attempt = 0
        while not received:
            assert time.monotonic() < deadline, "mosquitto_sub on broker 0 got nothing from broker 1 in 20 s"
            attempt += 1
            mosquitto_pub(brokers[1]["mqtt_port"], topic, f"hello-{attempt}", qos=1)
            try:
                received = sub.messages_until(lambda t, p: t == topic and p.startswith("hello-"), 0.3)
            except TimeoutError:
                pass
        assert received.startswith("hello-")
    finally:
        if sub is not None:
            sub.stop()
        status = launcher.stop(signal.SIGINT)
    assert status == 0, "\n".join(launcher.stderr_lines[-30:])
    data_dir = Path(info["data_dir"])
    wait_until(lambda: all(pid_gone(b["pid"]) for b in brokers), 10, what="every broker process gone")
    assert not data_dir.exists(), "a temporary data directory is removed unless --keep-data"


@pytest.mark.slow
def test_cluster_command_table_and_sigterm(tmp_path: Path) -> None:
    launcher = LauncherProcess(["--brokers", "2", "--data-dir", str(tmp_path), "--table-size", "4"])
    try:
        header = launcher.next_line(START_S)
        assert header.split() == [
            "broker",
            "node",
            "id",
            "MQTT",
            "port",
            "HTTP",
            "port",
            "cluster",
            "port",
            "pid",
        ]
        rows = [launcher.next_line(5).split() for _ in range(2)]
        assert [row[0] for row in rows] == ["0", "1"]
        example = launcher.next_line(5)
        assert "mosquitto_sub" in example and "mosquitto_pub" in example
        assert f"-p {rows[0][2]}" in example and f"-p {rows[1][2]}" in example
        first_log = (tmp_path / "broker-1.log").read_text().splitlines()[0]
        assert "cluster.table_size=4" in first_log
    finally:
        status = launcher.stop(signal.SIGTERM)
    assert status == 0, "\n".join(launcher.stderr_lines[-30:])
    assert (tmp_path / "broker-0.log").exists(), "a given --data-dir is kept"
    assert all(pid_gone(int(row[5])) for row in rows)


def test_cluster_command_ws_port_serves_websocket_on_every_broker() -> None:
    """--ws-port 0: a free WebSocket port per broker, listed in --json; a WebSocket client on
    broker 0 gets what a TCP client publishes on broker 1."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    launcher = LauncherProcess(["--brokers", "2", "--ws-port", "0", "--json"])
    ws_client: Any = None
    try:
        brokers = json.loads(launcher.next_line(START_S))["brokers"]
        ws_ports = [b["ws_port"] for b in brokers]
        assert all(isinstance(p, int) and p > 0 for p in ws_ports) and len(set(ws_ports)) == 2
        topic = f"{unique_id('ws')}/hello"
        got: queue.Queue[bytes] = queue.Queue()
        subscribed = threading.Event()
        ws_client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            transport="websockets",
            client_id=unique_id("ws"),
        )
        ws_client.ws_set_options(path="/mqtt")
        ws_client.on_message = lambda _c, _u, msg: got.put(msg.payload)
        ws_client.on_subscribe = lambda *_args: subscribed.set()
        ws_client.on_connect = lambda client, *_args: client.subscribe(topic, 1)
        ws_client.connect("127.0.0.1", ws_ports[0])
        ws_client.loop_start()
        assert subscribed.wait(10), "no SUBACK over WebSocket from broker 0"
        deadline = time.monotonic() + 20
        payload = b""
        while not payload.startswith(b"hi-"):
            assert time.monotonic() < deadline, "the WebSocket client on broker 0 got nothing from broker 1"
            mosquitto_pub(brokers[1]["mqtt_port"], topic, f"hi-{time.monotonic()}", qos=1)
            try:
                payload = got.get(timeout=0.3)
            except queue.Empty:
                pass
    finally:
        if ws_client is not None:
            ws_client.loop_stop()
            ws_client.disconnect()
        status = launcher.stop(signal.SIGINT)
    assert status == 0, "\n".join(launcher.stderr_lines[-30:])
