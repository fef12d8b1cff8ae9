"""The image as one pod of helm/skipmq (replicaCount 1): it serves, stops and restarts as promised.

One container lifecycle, run for real with podman (chart_pods.py says how the rendered pod is
realised): the broker runs as uid 10001 on a read-only root filesystem, writing only to the
chart's volumes; answers the chart's probes, its own HEALTHCHECK and a paho MQTT client; runs the
backup command of docs/operations.md (``python -c``, SQLite's online backup); a QoS 1
message queued for an offline persistent session before the pod is deleted (preStop hook, SIGTERM)
is there after the restart, and the stop took less than terminationGracePeriodSeconds and ended
with exit code 0 (SIGTERM handled, not SIGKILL); finally the container is killed (SIGKILL) in the
middle of a QoS 1 stream and restarted on its volume: every PUBACKed message reaches the session.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import sqlite3
import threading
import time

import pytest

from tests.process.image.chart_pods import ChartPod, podman
from tests.process.image.conftest import PodFactory
from tests.support.cluster import ClusterClient, unique_id, wait_until
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.image

READY_TIMEOUT_S = 60.0
SERVER_SHUTTING_DOWN = 0x8B  # MQTT 5 DISCONNECT reason code on SIGTERM (docs/operations.md)


def check_runs_as_the_chart_says(pod: ChartPod) -> None:
    status = pod.exec("cat", "/proc/1/status").stdout
    uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
    gid_line = next(line for line in status.splitlines() if line.startswith("Gid:"))
    assert uid_line.split()[1:] == ["10001"] * 4, uid_line  # the broker is PID 1, uid 10001
    assert gid_line.split()[1:] == ["10001"] * 4, gid_line
    assert "skipmq" in pod.exec("cat", "/proc/1/cmdline").stdout
    for path in ("/opt/skipmq/x", "/etc/skipmq/x", "/x"):
        write = pod.exec("touch", path)
        assert write.returncode != 0 and "Read-only file system" in write.stderr, (path, write)
    # the store is on the data volume, written by the broker's uid
    database = pod.volume_dir("data") / "skipmq.db"
    assert database.exists() and database.stat().st_uid == 10001, list(pod.volume_dir("data").iterdir())
    capabilities = next(line for line in status.splitlines() if line.startswith("CapEff:"))
    assert int(capabilities.split()[1], 16) == 0, capabilities  # drop: [ALL]


def check_holds_only_what_runs_the_broker(pod: ChartPod) -> None:
    """docs/operations.md "Image": no package manager, perl, pip or PySpark; dpkg's status still
    lists what is there (scanners read it) and no longer lists what docker/slim-root.sh purged."""
    tools = pod.exec("sh", "-c", "for t in apt-get apt perl pip pip3 gcc strip; do command -v $t; done")
    assert tools.stdout.strip() == "", tools.stdout
    found = pod.exec(
        "python",
        "-c",
        "import importlib.util as u; print([m for m in ('pyspark', 'pip', 'setuptools', 'ensurepip',"
        " 'lib2to3', 'distutils', 'tkinter', 'idlelib') if u.find_spec(m)])",
    )
    assert found.stdout.strip() == "[]", (found.stdout, found.stderr)
    status = pod.exec("dpkg-query", "-W", "-f=${Package} ${Status}\\n")
    installed = {line.split()[0] for line in status.stdout.splitlines() if line.endswith(" installed")}
    assert {"libc6", "libssl3", "libstdc++6", "dpkg"} <= installed, sorted(installed)
    assert not installed & {"apt", "perl-base", "debconf", "login", "passwd"}, sorted(installed)


def check_probes_and_healthcheck(pod: ChartPod) -> None:
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = pod.broker_spec[probe]["httpGet"]
        status, body = pod.http(get["path"])
        assert status == 200, (probe, get, body)
    # the image's HEALTHCHECK (docker format keeps it), run by podman inside the container
    healthcheck = json.loads(
        podman("inspect", "--format", "{{json .Config.Healthcheck}}", pod.container).stdout
    )
    assert any("/healthz" in part for part in healthcheck["Test"]), healthcheck
    assert podman("healthcheck", "run", pod.container, check=False).returncode == 0
    health = podman("inspect", "--format", "{{.State.Health.Status}}", pod.container).stdout.strip()
    assert health == "healthy", health


def check_backup_command_of_the_docs(pod: ChartPod) -> None:
    """docs/operations.md § Back up's ``kubectl exec ... python -c`` program, run in the container."""
    section = (REPO_ROOT / "docs" / "operations.md").read_text().split("### Back up", 1)[1]
    match = re.search(r'-- python -c ("[^"\n]+")', section.split("\n### ", 1)[0])
    assert match, "docs/operations.md § Back up has no `python -c` backup command"
    (code,) = shlex.split(match.group(1))
    done = pod.exec("python", "-c", code)
    assert done.returncode == 0, done.stderr
    backup = pod.volume_dir("data") / "backup.db"
    with contextlib.closing(sqlite3.connect(backup)) as copy:
        assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert copy.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0
    assert pod.exec("rm", "/var/lib/skipmq/backup.db").returncode == 0
    left = sorted(path.name for path in pod.volume_dir("data").iterdir())
    assert not [name for name in left if name.startswith("backup")], left


def test_one_pod_serves_stops_on_sigterm_and_survives_sigkill(chart_pods: PodFactory) -> None:
    (pod,) = chart_pods({"replicaCount": 1}, 1)
    assert not pod.spec.get("initContainers")  # one replica: no cluster, no certificate
    pod.create()
    pod.start()
    pod.wait_ready(READY_TIMEOUT_S)
    check_runs_as_the_chart_says(pod)
    check_holds_only_what_runs_the_broker(pod)
    check_probes_and_healthcheck(pod)
    check_backup_command_of_the_docs(pod)

    mqtt = pod.port("mqtt")
    topic = f"{unique_id('image')}/t"
    sub = ClusterClient(mqtt, host=pod.ip, client_id=unique_id("sub"), clean=False, session_expiry_s=3600)
    pub = ClusterClient(mqtt, host=pod.ip)
    assert sub.subscribe(topic, 1) == [1]
    pub.publish(topic, b"live", 1)
    assert sub.wait_message().payload == b"live"
    sub.disconnect()  # offline; the session and its subscription stay

    # Deleted as the kubelet deletes it: preStop (sleep), SIGTERM, SIGKILL at the grace period.
    pub.publish(topic, b"queued-before-sigterm", 1)  # PUBACKed: committed to the volume
    elapsed_s, exit_code = pod.terminate()
    assert exit_code == 0, pod.logs()[-3000:]  # the broker handled SIGTERM; SIGKILL gives 137
    assert elapsed_s < pod.grace_period_s, elapsed_s
    assert getattr(pub.wait_disconnected(), "value", None) == SERVER_SHUTTING_DOWN
    assert '"stopped"' in pod.logs()
    pub.close()

    pod.start()  # a new container on the same volumes (and pod IP)
    pod.wait_ready(READY_TIMEOUT_S)
    sub.connect()
    assert sub.session_present
    assert sub.wait_message().payload == b"queued-before-sigterm"
    sub.disconnect()

    # SIGKILL in the middle of a QoS 1 stream: one message every 2 ms from another thread, at
    # most 900 (under limits.max_queued_messages, 1000 in the chart, so that drop_oldest never
    # applies); the kill comes after 150 PUBACKs.
    pub = ClusterClient(mqtt, host=pod.ip)
    total = 900
    stop = threading.Event()

    def stream() -> None:
        for number in range(total):
            if stop.is_set() or pub.disconnected.is_set():
                return
            pub.publish_nowait(topic, f"m{number}".encode(), 1)
            time.sleep(0.002)

    publisher = threading.Thread(target=stream, daemon=True)
    publisher.start()
    wait_until(lambda: len(pub.acked_snapshot()) >= 150, timeout_s=30, what="150 PUBACKs")
    assert pod.kill() == 137
    pub.wait_disconnected()
    stop.set()
    publisher.join(timeout=10)
    acked = set(pub.acked_snapshot())
    pub.close()
    assert 150 <= len(acked) < total, len(acked)  # killed in the middle of the stream

    pod.start()
    pod.wait_ready(READY_TIMEOUT_S)
    sub.connect()
    assert sub.session_present
    received: set[bytes] = set()

    def all_acked_received() -> bool:
        received.update(message.payload for message in sub.drain(settle_s=0.2))
        return acked <= received

    try:
        wait_until(all_acked_received, timeout_s=30, what="every PUBACKed message after SIGKILL")
    except TimeoutError:
        missing = sorted(acked - received)
        raise AssertionError(f"{len(missing)} PUBACKed messages lost after SIGKILL: {missing[:10]}") from None
    finally:
        sub.close()
    assert os.stat(pod.volume_dir("data") / "skipmq.db").st_uid == 10001
