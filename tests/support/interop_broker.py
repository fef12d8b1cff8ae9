"""Start a REAL broker process for the black-box interop suite (SkipMQ or Debian's mosquitto).

The target is chosen by SKIPMQ_TEST_TARGET ("skipmq", the default, or "mosquitto"). SkipMQ is
started through its CLI (`python -m broker --port P --http-port H --data-dir D --log-format json
--config FILE`), mosquitto with a generated configuration file. Ports are picked free by the
test (bind to port 0, read, close) so parallel runs never collide. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.ports import free_port
from tools.start_wait import not_ready_error, start_timeout_s

TARGET = os.environ.get("SKIPMQ_TEST_TARGET", "skipmq").strip().lower()
if TARGET not in ("skipmq", "mosquitto"):
    raise RuntimeError(f"SKIPMQ_TEST_TARGET must be 'skipmq' or 'mosquitto', not {TARGET!r}")
IS_SKIPMQ = TARGET == "skipmq"
IS_MOSQUITTO = TARGET == "mosquitto"
MOSQUITTO_BIN = "/usr/sbin/mosquitto"
REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0  # on an idle machine; scaled by the load (tools/start_wait.py)
STOP_TIMEOUT_S = 5.0

# Every live broker, so a failing test's report can show the brokers' stderr tails.
LIVE_BROKERS: list[BrokerProcess] = []


@dataclass
class BrokerOptions:
    """What a test needs from the broker; translated to SkipMQ TOML or a mosquitto.conf."""

    tls: bool = False
    tls_certfile: str = ""
    tls_keyfile: str = ""
    tls_cafile: str = ""
    tls_require_client_cert: bool = False
    tls_use_identity_as_username: bool = False
    websocket: bool = False
    allow_anonymous: bool = True
    password_file: str = ""
    acl_file: str = ""
    max_packet_size_bytes: int | None = None
    max_keepalive_s: int | None = None
    receive_maximum: int | None = None
    # extra SkipMQ config: {"section.sub": {"key": value}}
    skipmq_extra: dict[str, dict[str, Any]] = field(default_factory=dict)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def skipmq_toml(opts: BrokerOptions, tls_port: int, ws_port: int) -> str:
    sections: dict[str, dict[str, Any]] = {
        "auth": {"allow_anonymous": opts.allow_anonymous},
    }
    if opts.password_file:
        sections["auth"]["password_file"] = opts.password_file
    if opts.acl_file:
        sections["auth"]["acl_file"] = opts.acl_file
    limits: dict[str, Any] = {}
    if opts.max_packet_size_bytes is not None:
        limits["max_packet_size_bytes"] = opts.max_packet_size_bytes
    if opts.max_keepalive_s is not None:
        limits["max_keepalive_s"] = opts.max_keepalive_s
    if opts.receive_maximum is not None:
        limits["receive_maximum"] = opts.receive_maximum
    if limits:
        sections["limits"] = limits
    if opts.tls:
        sections["listeners.tls"] = {
            "enabled": True,
            "host": HOST,
            "port": tls_port,
            "certfile": opts.tls_certfile,
            "keyfile": opts.tls_keyfile,
            "cafile": opts.tls_cafile,
            "require_client_cert": opts.tls_require_client_cert,
            "use_identity_as_username": opts.tls_use_identity_as_username,
        }
    if opts.websocket:
        sections["listeners.websocket"] = {"enabled": True, "host": HOST, "port": ws_port, "path": "/mqtt"}
    for name, values in opts.skipmq_extra.items():
        sections.setdefault(name, {}).update(values)
    lines: list[str] = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


def mosquitto_conf(opts: BrokerOptions, port: int, tls_port: int, ws_port: int, data_dir: Path) -> str:
    lines = [
        "per_listener_settings false",
        "user root",
        f"allow_anonymous {'true' if opts.allow_anonymous else 'false'}",
        "persistence true",
        f"persistence_location {data_dir}/",
        "log_dest stderr",
        "log_type all",
        f"listener {port} {HOST}",
    ]
    if opts.max_packet_size_bytes is not None:
        lines.append(f"max_packet_size {opts.max_packet_size_bytes}")
    if opts.max_keepalive_s is not None:
        lines.append(f"max_keepalive {opts.max_keepalive_s}")
    if opts.tls:
        lines += [
            f"listener {tls_port} {HOST}",
            f"certfile {opts.tls_certfile}",
            f"keyfile {opts.tls_keyfile}",
        ]
        if opts.tls_cafile:
            lines.append(f"cafile {opts.tls_cafile}")
        if opts.tls_require_client_cert:
            lines.append("require_certificate true")
        if opts.tls_use_identity_as_username:
            lines.append("use_identity_as_username true")
    if opts.websocket:
        lines += [f"listener {ws_port} {HOST}", "protocol websockets"]
    return "\n".join(lines) + "\n"


def wait_port(port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode} before port {port} opened")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} did not accept connections within {timeout_s} s")


class BrokerProcess:
    """One broker subprocess with its ports, data directory and stderr log file."""

    def __init__(self, workdir: Path, opts: BrokerOptions | None = None) -> None:
        self.workdir = workdir
        self.opts = opts or BrokerOptions()
        self.host = HOST
        self.port = free_port()
        self.http_port = free_port()
        self.tls_port = free_port()
        self.ws_port = free_port()
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.stderr_path = workdir / "broker.stderr"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    # ---- lifecycle -------------------------------------------------------------------------
    def command(self) -> list[str]:
        if IS_MOSQUITTO:
            conf = self.workdir / "mosquitto.conf"
            conf.write_text(mosquitto_conf(self.opts, self.port, self.tls_port, self.ws_port, self.data_dir))
            return [MOSQUITTO_BIN, "-c", str(conf)]
        conf = self.workdir / "skipmq.toml"
        conf.write_text(skipmq_toml(self.opts, self.tls_port, self.ws_port))
        return [
            sys.executable, "-m", "broker",
            "--config", str(conf),
            "--bind", HOST,
            "--port", str(self.port),
            "--http-port", str(self.http_port),
            "--data-dir", str(self.data_dir),
            "--log-format", "json",
            "--log-level", "info",
        ]  # fmt: skip

    def start(self) -> BrokerProcess:
        """Start and wait (bounded) for the ports; if a picked port got taken meanwhile, pick again."""
        for attempt in range(3):
            try:
                return self._start_once()
            except RuntimeError as exc:
                if attempt == 2 or "in use" not in str(exc).lower():
                    raise
                self.port, self.http_port = free_port(), free_port()
                self.tls_port, self.ws_port = free_port(), free_port()
        raise AssertionError("unreachable")

    def _start_once(self) -> BrokerProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        self.starts += 1
        with open(self.stderr_path, "ab") as err:
            err.write(f"---- start #{self.starts}: {' '.join(self.command())}\n".encode())
            err.flush()
            self.proc = subprocess.Popen(
                self.command(), cwd=self.workdir, stdout=err, stderr=err, stdin=subprocess.DEVNULL, env=env
            )
        if self not in LIVE_BROKERS:
            LIVE_BROKERS.append(self)
        bound_s = start_timeout_s(START_TIMEOUT_S)
        started = time.monotonic()
        try:
            wait_port(self.port, bound_s, self.proc)
            if self.opts.tls:
                wait_port(self.tls_port, bound_s, self.proc)
            if self.opts.websocket:
                wait_port(self.ws_port, bound_s, self.proc)
            if IS_SKIPMQ:
                wait_port(self.http_port, bound_s, self.proc)
        except (TimeoutError, RuntimeError) as exc:
            self.kill()
            message = not_ready_error(TARGET, time.monotonic() - started, str(exc), self.stderr_path)
            raise RuntimeError(message) from exc
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "broker not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then SIGKILL after timeout_s; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout_s)
        return self.proc.returncode

    def kill(self) -> None:
        """kill -9 (no chance to flush anything)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> BrokerProcess:
        self.terminate()
        return self.start()

    def close(self) -> None:
        self.terminate()
        if self in LIVE_BROKERS:
            LIVE_BROKERS.remove(self)

    # ---- logs ------------------------------------------------------------------------------
    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stderr_tail(self, lines: int = 40) -> str:
        return "\n".join(self.stderr_text().splitlines()[-lines:])

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far (SkipMQ's --log-format json)."""
        records = []
        for line in self.stderr_text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    records.append(json.loads(line))
        return records

    def wait_log(self, predicate: Any, timeout_s: float = 5.0) -> dict[str, Any]:
        """Wait (bounded) for a JSON log record satisfying predicate(record)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for record in self.log_records():
                if predicate(record):
                    return record
            time.sleep(0.05)
        raise TimeoutError(f"no matching log record within {timeout_s} s; tail:\n{self.stderr_tail()}")
