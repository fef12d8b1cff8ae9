"""docs/operations.md § Back up, run as written: an online backup of a running broker restores.

The backup command of the docs (SQLite's online backup through Python's ``sqlite3``, the image
has no ``sqlite3`` binary) is read from docs/operations.md and run, with the pod's data path
replaced by the test broker's, while the broker serves. The copy is then put into a fresh data
directory as ``skipmq.db`` (no -wal/-shm, as the docs say) and a new broker started on it.
Checked with paho clients: the retained message and the persistent session with its queued
QoS 1 messages come back; what was published after the backup does not (it is a point in time).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import ClusterClient, unique_id, wait_until
from tests.support.paths import REPO_ROOT
from tools.launcher import http_get
from tools.ports import free_port

SKIPMQ = str(Path(sys.executable).with_name("skipmq"))
POD_DATA = "/var/lib/skipmq"


def documented_backup_code() -> str:
    """The ``python -c "..."`` program of docs/operations.md § Back up."""
    text = (REPO_ROOT / "docs" / "operations.md").read_text()
    section = text.split("### Back up", 1)[1].split("\n### ", 1)[0]
    match = re.search(r'-- python -c ("[^"\n]+")', section)
    assert match, "docs/operations.md § Back up has no `python -c` backup command"
    (code,) = shlex.split(match.group(1))
    return code


class Broker:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port, self.http_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPMQ_")}
        self.log = (data_dir.parent / f"{data_dir.name}.log").open("wb")
        command = [SKIPMQ, "--data-dir", str(data_dir), "--port", str(self.port)]
        self.process = subprocess.Popen(
            [*command, "--http-port", str(self.http_port)],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_until(self._ready, 30.0, what="broker ready")

    def _ready(self) -> bool:
        assert self.process.poll() is None, "the broker exited"
        try:
            return http_get(self.http_port, "/readyz", timeout_s=1.0)[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.log.close()


@pytest.fixture
def brokers() -> Iterator[list[Broker]]:
    made: list[Broker] = []
    yield made
    for broker in made:
        broker.stop()


def test_online_backup_restores_retained_and_queued_messages(tmp_path: Path, brokers: list[Broker]) -> None:
    live_dir = tmp_path / "live"
    live_dir.mkdir()
    live = Broker(live_dir)
    brokers.append(live)
    topic, retained_topic = f"{unique_id('bk')}/q", f"{unique_id('bk')}/r"
    sub_id = unique_id("bk-sub")

    sub = ClusterClient(live.port, client_id=sub_id, clean=False, session_expiry_s=3600)
    assert sub.subscribe(topic, 1) == [1]
    sub.close()
    pub = ClusterClient(live.port)
    pub.publish(retained_topic, b"kept", 1, retain=True)
    for n in range(5):
        pub.publish(topic, f"before-{n}".encode(), 1)

    code = documented_backup_code()
    assert POD_DATA in code
    done = subprocess.run(
        [sys.executable, "-c", code.replace(POD_DATA, str(live_dir))], capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    pub.publish(topic, b"after-backup", 1)
    pub.close()

    restored_dir = tmp_path / "restored"
    restored_dir.mkdir()
    (live_dir / "backup.db").rename(restored_dir / "skipmq.db")
    restored = Broker(restored_dir)
    brokers.append(restored)

    sub = ClusterClient(restored.port, client_id=sub_id, clean=False, session_expiry_s=3600)
    try:
        assert sub.session_present, "the restored store has no persistent session"
        got = [m.payload for m in sub.wait_messages(5, timeout_s=10.0)]
        assert got == [f"before-{n}".encode() for n in range(5)]
        sub.assert_no_message(0.5)  # "after-backup" was published after the copy
    finally:
        sub.close()
    reader = ClusterClient(restored.port)
    try:
        assert reader.subscribe(retained_topic, 1) == [1]
        assert [m.payload for m in reader.wait_messages(1, timeout_s=10.0)] == [b"kept"]
    finally:
        reader.close()
