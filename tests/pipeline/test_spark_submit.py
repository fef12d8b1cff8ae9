"""The job under spark-submit (docs/pipeline.md "On a Spark cluster"), as an operator runs it:
the JSON progress lines on spark-submit's stderr (Spark's PythonRunner merges the Python
driver's stderr into its stdout), SIGTERM to spark-submit ends the driver with
``pipeline_stopped`` and no Py4J, Python or Java trace - once the queries run, and while they
start (SIGTERM at ``pipeline_starting``: the JVM's shutdown hook stops the SparkContext under
``start()``) - and in local mode the driver binds loopback.

spark-submit starts a JVM of its own (the shared session of tests/pipeline/conftest.py cannot
serve it): this test's cost is that start, not a window (it stops before one).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT
from tools.ports import free_ports

pytestmark = pytest.mark.timeout(300)
JAVA_FRAME = re.compile(r"^\s+at [\w$.<>]+\(|^Caused by: |^Exception in thread ")


@pytest.mark.parametrize(
    ("signal_at", "after_s"),
    [("pipeline_started", 2.0), ("pipeline_starting", 0.0)],
    ids=["running", "starting"],
)
def test_spark_submit_progress_on_stderr_and_a_clean_sigterm(
    tmp_path: Path, signal_at: str, after_s: float
) -> None:
    mqtt, http = free_ports(2)
    venv = REPO_ROOT / ".venv" / "bin"
    command = [str(venv / "skipmq"), "--port", str(mqtt), "--http-port", str(http)]
    command += ["--data-dir", str(tmp_path)]
    broker = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out, err = tmp_path / "submit.out", tmp_path / "submit.err"
    env = {**os.environ, "PYSPARK_PYTHON": str(venv / "python")}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        submit = subprocess.Popen(
            [str(venv / "spark-submit"), "--master", "local[2]", str(REPO_ROOT / "pipeline" / "__main__.py"),
             "--master", "", "--mqtt", "", "--http", f"http://127.0.0.1:{http}", "--duration-s", "200",
             "--out", str(tmp_path / "out")],
            stdout=stdout, stderr=stderr, env=env, cwd=tmp_path,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while f'"event": "{signal_at}"' not in err.read_text(errors="replace"):
            assert submit.poll() is None, err.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.05)
        time.sleep(after_s)
        submit.send_signal(signal.SIGTERM)  # spark-submit's JVM (spark-class execs java)
        submit.wait(60)
        deadline = time.monotonic() + 30
        while '"event": "pipeline_stopped"' not in err.read_text(errors="replace"):
            assert time.monotonic() < deadline, err.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
        stdout_text, stderr_text = out.read_text(errors="replace"), err.read_text(errors="replace")
        assert '"event"' not in stdout_text, stdout_text[-2000:]  # progress lines are on stderr only
        assert '"reason": "' in stderr_text.split('"event": "pipeline_stopped"')[1]
        # no Python traceback and no py4j logger noise (a stop racing the JVM's exit); the stop's own
        # line may name the exception that told the driver the JVM was gone (e.g. Py4JNetworkError)
        lines = (stderr_text + stdout_text).splitlines()
        noise = [line for line in lines if '"pipeline_stopped"' not in line]
        assert not [line for line in noise if "Traceback" in line or "py4j" in line.lower()], noise[-40:]
        assert not [line for line in noise if JAVA_FRAME.search(line)], noise[-40:]  # no Java trace
        assert "BlockManagerId(driver, 127.0.0.1," in stderr_text  # local mode: the driver on loopback
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.wait()
        broker.send_signal(signal.SIGTERM)
        broker.wait(20)
