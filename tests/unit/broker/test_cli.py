"""The ``skipmq`` command line (issue 17): --version, unknown SKIPMQ_* variables, start-up errors
as one line without a traceback, and structured client connect/disconnect/auth-failure log lines.

Real ``python -m broker`` processes; each assertion fails on the code before the change (no
--version: usage error; a misspelled variable silently ignored; a Python traceback; no
connect/disconnect lines)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker import __version__
from broker.mqtt.packets import Disconnect
from tests.support.core import RawClient
from tests.unit.broker.test_core_persistence import REPO_ROOT, BrokerProcess

ENV = {k: v for k, v in os.environ.items() if not k.startswith("SKIPMQ_")}


def skipmq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**ENV, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
    )


def plain_lines(stderr: str) -> list[str]:
    """stderr lines that are not JSON log records."""
    out = []
    for line in stderr.splitlines():
        try:
            json.loads(line)
        except ValueError:
            out.append(line)
    return out


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_version() -> None:
    shown = skipmq("--version")
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert shown.returncode == 0
    assert shown.stdout == f"skipmq {__version__}\n" and __version__ == pyproject["project"]["version"]


def test_misspelled_environment_variable_is_refused_with_the_closest_name(tmp_path: Path) -> None:
    refused = skipmq("--data-dir", str(tmp_path), env={"SKIPMQ_LISTENERS_TCP_PROT": "1884"})
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "SKIPMQ_LISTENERS_TCP_PROT" in refused.stderr and "'SKIPMQ_LISTENERS_TCP_PORT'" in refused.stderr


def test_kubernetes_service_link_variable_is_logged_not_refused(tmp_path: Path) -> None:
    old = os.environ.get("SKIPMQ_SERVICE_HOST")
    os.environ["SKIPMQ_SERVICE_HOST"] = "10.0.0.1"  # BrokerProcess inherits this environment
    try:
        process = BrokerProcess(tmp_path)
    finally:
        if old is None:
            del os.environ["SKIPMQ_SERVICE_HOST"]
        else:
            os.environ["SKIPMQ_SERVICE_HOST"] = old
    try:
        warnings = process.events("config_warning")
        assert any("SKIPMQ_SERVICE_HOST" in w["message"] for w in warnings), warnings
    finally:
        assert process.terminate() == 0


@pytest.mark.parametrize("listener", ["--port", "--http-port", "--cluster-port"])
def test_port_in_use_is_one_line_and_exit_1(tmp_path: Path, busy_port: int, listener: str) -> None:
    args = {"--port": "0", "--http-port": "0", "--cluster-port": None}
    args[listener] = str(busy_port)
    argv = [item for flag, value in args.items() if value is not None for item in (flag, value)]
    argv += ["--set", "cluster.insecure=true"]  # (the cluster's TLS files are another test's)
    failed = skipmq(*argv, "--bind", "127.0.0.1", "--data-dir", str(tmp_path), "--log-format", "json")
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr[-2000:]
    assert plain_lines(failed.stderr) == [
        f"skipmq: cannot start: cannot listen on 127.0.0.1:{busy_port}"
        f" ({ {'--port': 'MQTT', '--http-port': 'HTTP', '--cluster-port': 'cluster'}[listener] }):"
        " address already in use"
    ]


def test_unusable_data_dir_is_one_line_and_exit_1(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    failed = skipmq("--port", "0", "--http-port", "0", "--data-dir", str(blocker / "data"))
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr[-2000:]
    assert plain_lines(failed.stderr) == [
        f"skipmq: cannot start: cannot open the store in data directory {str(blocker / 'data')!r}:"
        " not a directory"
    ]


def test_bad_certificate_is_one_line_and_exit_1(tmp_path: Path) -> None:
    bogus = tmp_path / "cert.pem"
    bogus.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    failed = skipmq(
        *("--port", "0", "--http-port", "0", "--tls-port", "0", "--data-dir", str(tmp_path / "d")),
        *("--set", f"listeners.tls.certfile={bogus}", "--set", f"listeners.tls.keyfile={bogus}"),
    )
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr[-2000:]
    [line] = plain_lines(failed.stderr)  # (a missing file is a configuration error, exit 2)
    assert line.startswith(f"skipmq: cannot start: listeners.tls: cannot load certfile {str(bogus)!r}")


def test_connect_disconnect_and_auth_failure_are_logged(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    assert skipmq("passwd", "-c", "-b", "right", str(passwd), "alice").returncode == 0
    process = BrokerProcess(tmp_path / "data", "--password-file", str(passwd), "--no-allow-anonymous")
    try:
        port = process.ports["tcp"]
        good = RawClient(port)
        host, client_port = good.sock.getsockname()[:2]
        good_peer = f"{host}:{client_port}"
        assert good.connect("dev-1", username="alice", password=b"right").reason_code == 0
        good.send(Disconnect(reason_code=0))
        good.read_until_closed()
        bad = RawClient(port)
        assert bad.connect("dev-2", username="alice", password=b"wrong").reason_code != 0
        deadline = time.monotonic() + 5
        while not (process.events("auth_failed") and process.events("client_disconnected")):
            assert time.monotonic() < deadline, process.lines[-10:]
            time.sleep(0.05)
        connected = process.events("client_connected")
        assert len(connected) == 1 and connected[0]["client_id"] == "dev-1"
        assert connected[0]["username"] == "alice" and connected[0]["peer"].startswith("127.0.0.1:")
        gone = process.events("client_disconnected")
        assert [(g["client_id"], g["username"], g["reason"]) for g in gone] == [
            ("dev-1", "alice", "client disconnected")
        ]
        # the peer is asked of the transport when logged: still the client's own after the close
        assert connected[0]["peer"] == gone[0]["peer"] == good_peer
        failed = process.events("auth_failed")
        assert len(failed) == 1 and failed[0]["level"] == "warning"
        assert (failed[0]["client_id"], failed[0]["username"]) == ("dev-2", "alice")
        assert failed[0]["peer"].startswith("127.0.0.1:") and failed[0]["reason"] == "not authorized"
    finally:
        assert process.terminate() == 0


def test_a_clustered_broker_without_its_tls_files_refuses_to_start_naming_the_key(tmp_path: Path) -> None:
    failed = skipmq("--port", "0", "--http-port", "0", "--cluster-port", "0", "--data-dir", str(tmp_path))
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr[-2000:]
    assert "configuration error: cluster.tls_ca_file:" in failed.stderr
    assert "cluster.insecure" in failed.stderr
