"""The README's optional third quick-start line, run as written against the broker the first line
starts (``.venv/bin/skipmq`` on its embedded defaults: MQTT 1883, HTTP 9090, unclustered).

The fixed ports of the quick start cannot be used on a shared machine, so both run in a network
namespace of their own (only its loopback, where 1883 and 9090 are free; the Spark driver must
bind loopback there too). The line is the README's with a shorter ``--duration-s``; once the job
wrote its first window, ``skipmq-pipeline`` gets SIGTERM (a normal stop: it must log
``pipeline_stopped``, exit 0 without a Py4J trace), and the ``&&`` runs the report, which must
succeed without class snapshots (an unclustered broker publishes none). The job runs as a
process of its own, as the README runs it, so it cannot share the session of the other pipeline
tests (tests/pipeline/conftest.py): its JVM start is this test's cost.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.timeout(480)

README_LINE_RE = re.compile(r"^\.venv/bin/skipmq-pipeline --duration-s 300 .*$", re.MULTILINE)
FIRST_WINDOW_S = 240.0  # 1-minute windows, 30 s watermark, 10 s trigger, a JVM start on a busy machine


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"skipmq-qs-{os.getpid()}"
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and ip netns (the quick start's fixed ports in a namespace of their own)")
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=10)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False, timeout=10)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _in(namespace: str, *command: str, cwd: Path) -> subprocess.Popen[bytes]:
    command = ["ip", "netns", "exec", namespace, *command]
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_readme_pipeline_line_runs_as_written_against_the_quick_start_broker(
    namespace: str, tmp_path: Path
) -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    match = README_LINE_RE.search(readme)
    assert match is not None, "the README's pipeline line changed: update this test"
    line = match.group(0).replace("--duration-s 300", f"--duration-s {FIRST_WINDOW_S + 60:.0f}")
    (tmp_path / ".venv").symlink_to(REPO_ROOT / ".venv")  # a checkout's relative paths, here
    broker = _in(namespace, ".venv/bin/skipmq", cwd=tmp_path)
    job: subprocess.Popen[bytes] | None = None
    try:
        probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9090/healthz', timeout=1)"
        deadline = time.monotonic() + 30
        check = ["ip", "netns", "exec", namespace, sys.executable, "-c", probe]
        while subprocess.run(check, capture_output=True, check=False).returncode:
            assert broker.poll() is None and time.monotonic() < deadline, broker.communicate()
            time.sleep(0.5)
        job = _in(namespace, "bash", "-c", line, cwd=tmp_path)
        windows = tmp_path / "pipeline-out" / "broker_metrics"
        deadline = time.monotonic() + FIRST_WINDOW_S
        while not any(windows.glob("date=*/window=*/*.parquet")):
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "no broker_metrics window within the wait"
            time.sleep(1)
        pipelines = _children(job.pid)
        assert len(pipelines) == 1, pipelines
        os.kill(pipelines[0], signal.SIGTERM)  # a normal stop; then `&&` runs the report
        out, err = job.communicate(timeout=120)
        stdout, stderr = out.decode(), err.decode()
        assert job.returncode == 0, stderr[-4000:]
        assert '"event": "pipeline_stopped"' in stderr
        assert '"event": "pipeline_no_snapshots"' in stderr  # the job says why class tables stay empty
        assert "Traceback" not in stderr and "Py4J" not in stderr, stderr[-4000:]
        report = tmp_path / "pipeline-out" / "report" / "report.md"
        assert "No per-class snapshots" in report.read_text()
        assert (report.parent / "message_rates.png").read_bytes().startswith(b"\x89PNG")
        assert "pipeline.report: wrote" in stderr, stdout
    finally:
        if job is not None and job.poll() is None:
            for pid in _children(job.pid):
                os.kill(pid, signal.SIGKILL)
            job.kill()
            job.communicate()
        broker.send_signal(signal.SIGTERM)
        try:
            broker.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.communicate()
