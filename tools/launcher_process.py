"""One broker process of a local cluster (tools.launcher): where it runs (``BrokerPlacement``),
its ports, data directory, command line, log file and JSON log records (``BrokerProcess``),
the errors the launcher raises, and the small HTTP GET its bounded waits poll with.
``tools.launcher`` re-exports every name.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
HTTP_TIMEOUT_S = 3.0


class ClusterError(RuntimeError):
    """A broker of the local cluster did not start, join, answer or stop as expected."""


class RuntimeMissingError(ClusterError):
    """The broker answers 404 on GET /cluster: it was built without the cluster runtime."""


def http_get(port: int, path: str, timeout_s: float = HTTP_TIMEOUT_S, host: str = HOST) -> tuple[int, bytes]:
    """GET http://<host>:<port><path> (host 127.0.0.1 unless given); returns (status, body).
    Connection errors raise OSError."""
    url = f"http://{host}:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


@dataclass(frozen=True)
class BrokerPlacement:
    """Where a broker of a :class:`LocalCluster` runs (default: a plain process on 127.0.0.1).

    command_prefix: prepended to the broker's command line (e.g. ``ip netns exec NS``; it must
    exec the broker, so that the process the launcher signals is the broker itself).
    host: the address its MQTT and HTTP listeners bind, which clients and the launcher use.
    cluster_host: the address its cluster gRPC listener binds and advertises (its peer id)."""

    command_prefix: tuple[str, ...] = ()
    host: str = HOST
    cluster_host: str = HOST


Placement = Callable[[int], BrokerPlacement]  # broker index -> placement


@dataclass
class BrokerProcess:
    """One broker of a :class:`LocalCluster`: its ports, data directory, log file and process."""

    index: int
    node_id: str
    mqtt_port: int
    http_port: int
    cluster_port: int
    data_dir: str
    process: subprocess.Popen[bytes] | None = None
    log_path: str = ""
    starts: int = 0
    joined_through: list[str] = field(default_factory=list)
    placement: BrokerPlacement = field(default_factory=BrokerPlacement)
    ws_port: int | None = None  # MQTT over WebSocket (path /mqtt) when set

    @property
    def peer_id(self) -> str:
        """The overlay peer id other brokers know this one by."""
        return f"{self.placement.cluster_host}:{self.cluster_port}"

    @property
    def host(self) -> str:
        """The address of its MQTT (and HTTP) listener."""
        return self.placement.host

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(
        self, python: str, join: Iterable[str], settings: dict[str, str], *, seed: bool = False
    ) -> list[str]:
        """The command line that starts this broker (joining through ``join`` peer ids; ``seed``:
        the list keeps this broker itself, as a seed that may found the cluster)."""
        where = self.placement
        cmd = [
            *where.command_prefix,
            python, "-m", "broker",
            "--bind", where.host,
            "--port", str(self.mqtt_port),
            "--http-port", str(self.http_port),
            "--cluster-host", where.cluster_host,
            "--cluster-port", str(self.cluster_port),
            "--advertise-host", where.cluster_host,
            "--data-dir", self.data_dir,
            "--node-id", self.node_id,
            "--log-format", "json",
        ]  # fmt: skip
        if self.ws_port is not None:
            cmd += ["--ws-port", str(self.ws_port), "--set", f"listeners.websocket.host={where.host}"]
        join_list = [peer for peer in join if seed or peer != self.peer_id]
        if join_list:
            cmd += ["--join", ",".join(join_list)]
        if where.host != HOST:
            cmd += ["--set", f"http.host={where.host}"]
        for key, value in settings.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def log_text(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except (FileNotFoundError, IsADirectoryError):
            return ""

    def log_tail(self, lines: int = 40, exclude: tuple[str, ...] = ()) -> str:
        """The last ``lines`` log lines, leaving out lines containing any ``exclude`` text
        (a note says how many were left out)."""
        all_lines = self.log_text().splitlines()
        kept = [line for line in all_lines if not any(text in line for text in exclude)]
        tail = kept[-lines:]
        omitted = len(all_lines) - len(kept)
        if omitted:
            tail.append(f"({omitted} lines containing {list(exclude)} left out)")
        return "\n".join(tail)

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log lines (``--log-format json``) written so far."""
        records: list[dict[str, Any]] = []
        for line in self.log_text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    record = json.loads(line)
                    if isinstance(record, dict):
                        records.append(record)
        return records

    def as_row(self) -> dict[str, Any]:
        return {
            "broker": self.index,
            "node_id": self.node_id,
            "mqtt_port": self.mqtt_port,
            "http_port": self.http_port,
            "cluster_port": self.cluster_port,
            "ws_port": self.ws_port,
            "peer_id": self.peer_id,
            "pid": self.pid,
            "data_dir": self.data_dir,
            "log": self.log_path,
        }
