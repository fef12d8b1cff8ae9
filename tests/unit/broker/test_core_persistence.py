"""Broker core: durability (group commit, kill -9 and restart), seed 001 §4.1, MQTT §4.1 session state.

The broker runs as a real subprocess through the CLI (``python -m broker``) so it can be killed
with SIGKILL; clients are raw sockets using the project's codec.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.adapters.server import ThreadedBroker
from broker.mqtt.codec import encode, encode_publish
from broker.mqtt.packets import Connect, Pingreq, Pingresp, Puback, Publish, Will
from tests.support.core import MQTT_5, RawClient, start_broker
from tools.start_wait import start_timeout_s

__all__ = ["start_broker"]
Start = Callable[..., ThreadedBroker]
REPO_ROOT = Path(__file__).resolve().parents[3]


class BrokerProcess:
    """``python -m broker`` as a child process; ports come from its event="listening" log line."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.lines: list[str] = []
        self.listening = threading.Event()
        self.ports: dict[str, int] = {}
        command = [sys.executable, "-m", "broker", "--port", "0", "--http-port", "0", "--bind", "127.0.0.1"]
        command += ["--data-dir", str(data_dir), "--log-format", "json", "--set", "sys.interval_s=0", *extra]
        self.proc = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        threading.Thread(target=self._read, daemon=True).start()
        waited_s = start_timeout_s()  # readiness, bounded by the machine's load (tools/start_wait.py)
        if not self.listening.wait(waited_s):
            self.kill()
            raise AssertionError(f"broker did not start within {waited_s} s:\n" + "\n".join(self.lines[-20:]))

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == "listening":
                self.ports = {k: v for k, v in record.items() if k in ("tcp", "tls", "websocket", "http")}
                self.listening.set()

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in list(self.lines):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == name:
                found.append(record)
        return found

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(10)


@pytest.fixture
def processes() -> Iterator[list[BrokerProcess]]:
    started: list[BrokerProcess] = []
    yield started
    for process in started:
        process.kill()


def test_acknowledged_qos1_messages_survive_kill9(tmp_path: Path, processes: list[BrokerProcess]) -> None:
    data_dir = tmp_path / "data"
    first = BrokerProcess(data_dir)
    processes.append(first)
    port = first.ports["tcp"]
    sub = RawClient(port)
    sub.connect("durable-sub", clean=False)
    sub.subscribe("dur/t", 1)
    sub.disconnect()
    pub = RawClient(port)
    pub.connect("durable-pub")
    count = 200
    for index in range(count):
        pub.publish("dur/t", index.to_bytes(4, "big"), qos=1, packet_id=index + 1)
    acked: set[int] = set()
    while len(acked) < count:
        acked.add(pub.expect(Puback).packet_id)
    pub.publish_acked("dur/retained", b"kept", 1, packet_id=1, retain=True)
    first.kill()  # SIGKILL: no shutdown code runs
    second = BrokerProcess(data_dir)
    processes.append(second)
    back = RawClient(second.ports["tcp"])
    assert back.connect("durable-sub", clean=False).session_present is True
    received: list[int] = []
    while len(received) < count:
        message = back.expect_publish()
        received.append(int.from_bytes(message.payload, "big"))
        back.ack(message)
    assert received == list(range(count))
    fresh = RawClient(second.ports["tcp"])
    fresh.connect("fresh")
    fresh.subscribe("dur/retained", 0)
    retained = fresh.expect_publish()
    assert (retained.payload, retained.retain) == (b"kept", True)


def test_inflight_message_redelivered_after_kill9(tmp_path: Path, processes: list[BrokerProcess]) -> None:
    data_dir = tmp_path / "data"
    first = BrokerProcess(data_dir)
    processes.append(first)
    port = first.ports["tcp"]
    sub = RawClient(port, MQTT_5)
    sub.connect("inflight-sub", clean=False, properties={"session_expiry_interval": 3600})
    sub.subscribe("inf/t", 2)
    pub = RawClient(port)
    pub.connect("inflight-pub")
    pub.publish_acked("inf/t", b"unacked", 2)
    original = sub.expect(Publish)
    time.sleep(0.3)  # the in-flight state is committed with the next loop iteration
    first.kill()
    sub.close()
    second = BrokerProcess(data_dir)
    processes.append(second)
    back = RawClient(second.ports["tcp"], MQTT_5)
    assert back.connect(
        "inflight-sub", clean=False, properties={"session_expiry_interval": 3600}
    ).session_present
    again = back.expect(Publish)
    assert (again.payload, again.dup, again.packet_id, again.qos) == (b"unacked", True, original.packet_id, 2)
    back.ack(again)


def test_sigterm_disconnects_v5_with_0x8b_fires_will_and_exits_0(
    tmp_path: Path, processes: list[BrokerProcess]
) -> None:
    process = BrokerProcess(tmp_path / "data")
    processes.append(process)
    port = process.ports["tcp"]
    v5 = RawClient(port, MQTT_5)
    v5.connect("term5")
    v3 = RawClient(port)
    v3.connect("term3")
    started = time.monotonic()
    assert process.terminate() == 0
    assert time.monotonic() - started < 5
    packets = v5.read_until_closed()
    assert packets and packets[-1].reason_code == 0x8B  # type: ignore[union-attr]
    assert v3.read_until_closed() == []
    assert process.events("stopped")


def test_cli_help_and_bad_config_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    shown = subprocess.run(
        [sys.executable, "-m", "broker", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert shown.returncode == 0
    for flag in (
        "--port",
        "--tls-port",
        "--ws-port",
        "--http-port",
        "--data-dir",
        "--set",
        "--no-allow-anonymous",
    ):
        assert flag in shown.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "broker", "--set", "limits.maximum_qos=7", "--data-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert bad.returncode == 2
    assert "limits.maximum_qos" in bad.stderr and bad.stdout == ""
    unknown = subprocess.run(
        [sys.executable, "-m", "broker", "--set", "limits.max_queued_mesages=5"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert unknown.returncode == 2 and "max_queued_messages" in unknown.stderr
    passwd_file = tmp_path / "pw"
    made = subprocess.run(
        [sys.executable, "-m", "broker", "passwd", "-c", "-b", "pw1", str(passwd_file), "bob"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert made.returncode == 0, made.stderr
    assert passwd_file.read_text().startswith("bob:")


def test_listening_line_names_real_ports_and_stdout_is_empty(
    tmp_path: Path, processes: list[BrokerProcess]
) -> None:
    process = BrokerProcess(tmp_path / "data")
    processes.append(process)
    assert process.ports["tcp"] > 0 and process.ports["http"] > 0
    client = RawClient(process.ports["tcp"])
    assert client.connect("ping").reason_code == 0
    client.disconnect()
    assert process.terminate() == 0
    assert process.proc.stdout is not None and process.proc.stdout.read() == ""


def test_group_commit_batches_many_acks_into_few_commits(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port)
    sub.connect("gc-sub", clean=False)
    sub.subscribe("gc/t", 1)
    sub.disconnect()
    # COMMITs are counted by the store's commit histogram (the loop's and the commit thread's)
    commits_before = broker.call(lambda: sum(broker.broker.stats.store_commit_seconds.counts))
    pub = RawClient(port)
    pub.connect("gc-pub")
    count = 300
    payload = b"".join(
        encode_publish("gc/t", b"m", 1, False, False, index + 1, None, 4) for index in range(count)
    )
    pub.send_bytes(payload)
    acks = [pub.expect(Puback) for _ in range(count)]
    assert [ack.packet_id for ack in acks] == list(range(1, count + 1))  # in order (MQTT-4.6.0-2)
    commits = broker.call(lambda: sum(broker.broker.stats.store_commit_seconds.counts)) - commits_before
    assert 1 <= commits < count / 3, commits
    assert broker.call(lambda: broker.broker.store.queue_depth("gc-sub")) == count


def test_will_of_connected_persistent_client_fires_after_broker_crash(
    tmp_path: Path, processes: list[BrokerProcess]
) -> None:
    data_dir = tmp_path / "data"
    first = BrokerProcess(data_dir)
    processes.append(first)
    port = first.ports["tcp"]
    watcher = RawClient(port)
    watcher.connect("crash-watcher", clean=False)
    watcher.subscribe("crash/#", 1)
    watcher.disconnect()
    device = RawClient(port, MQTT_5)
    device.connect(
        "crash-device",
        clean=False,
        properties={"session_expiry_interval": 600},
        will=Will("crash/device", b"lost", qos=1),
    )
    polite = RawClient(port, MQTT_5)
    polite.connect(
        "crash-polite", properties={"session_expiry_interval": 600}, will=Will("crash/polite", b"no")
    )
    polite.disconnect()  # normal DISCONNECT deletes its will
    time.sleep(0.3)
    first.kill()
    device.close()
    second = BrokerProcess(data_dir)
    processes.append(second)
    back = RawClient(second.ports["tcp"])
    assert back.connect("crash-watcher", clean=False).session_present is True
    message = back.expect_publish()
    assert (message.topic, message.payload) == ("crash/device", b"lost")
    back.ack(message)
    back.expect_nothing(0.5)


def test_sighup_reloads_password_file(tmp_path: Path, processes: list[BrokerProcess]) -> None:
    from broker.auth.users import PasswordFile

    password_path = tmp_path / "passwd"
    passwords = PasswordFile()
    passwords.set("alice", "a-secret")
    passwords.save(str(password_path))
    process = BrokerProcess(tmp_path / "data", "--no-allow-anonymous", "--password-file", str(password_path))
    processes.append(process)
    port = process.ports["tcp"]
    assert RawClient(port).connect("a", username="alice", password=b"a-secret").reason_code == 0
    refused = RawClient(port)
    refused.send(Connect(client_id="b", username="bob", password=b"b-secret"))
    assert refused.read_until_closed()[0].reason_code == 0x86  # type: ignore[union-attr]
    passwords.set("bob", "b-secret")
    passwords.save(str(password_path))
    process.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while not process.events("auth_reloaded") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert RawClient(port).connect("b", username="bob", password=b"b-secret").reason_code == 0


def test_a_subscribers_puback_rides_with_the_next_publishs_commit(
    start_broker: Start, tmp_path: Path
) -> None:
    """A COMMIT that carries only a subscriber's PUBACK (the delivered message's row deleted) and
    that nothing waits for is put off (``Durability.lazy_commit_s``) and joins the next publish's
    commit: one COMMIT per message on a 1 -> 1 persistent stream, not two; it still reaches the
    disk within the delay when no publish follows. The publisher's PUBACK still waits for the
    commit of its message (``test_acknowledged_qos1_messages_survive_kill9``)."""
    import sqlite3

    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port)
    sub.connect("lz-sub", clean=False)
    sub.subscribe("lz/t", 1)
    pub = RawClient(port)
    pub.connect("lz-pub")

    def commits() -> int:
        return int(broker.call(lambda: sum(broker.broker.stats.store_commit_seconds.counts)))

    count = 40
    pub.send(Publish("lz/t", b"m", qos=1, packet_id=1))
    pub.expect(Puback)
    before = commits()
    for index in range(1, count + 1):
        delivery = sub.expect_publish()
        assert delivery.payload == b"m"
        sub.send_bytes(encode(Puback(delivery.packet_id), 4) + encode(Pingreq(), 4))  # one segment
        sub.expect(Pingresp)  # the broker has handled the PUBACK, in an iteration of its own
        pub.send(Publish("lz/t", b"m", qos=1, packet_id=index % 60000 + 2))
        pub.expect(Puback)
    per_message = (commits() - before) / count
    assert per_message < 1.5, per_message  # two per message when every PUBACK commits on its own
    last = sub.expect_publish()
    sub.send(Puback(last.packet_id))
    db = sqlite3.connect(str(tmp_path / "data" / "skipmq.db"))
    try:
        deadline = time.monotonic() + 5
        while db.execute("SELECT COUNT(*) FROM queue WHERE client_id = 'lz-sub'").fetchone()[0]:
            assert time.monotonic() < deadline, "the lone PUBACK's deletion was never committed"
            time.sleep(0.01)
    finally:
        db.close()
