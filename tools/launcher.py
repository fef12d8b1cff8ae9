"""``skipmq cluster``: start N SkipMQ brokers on loopback as one cluster (issue #4 "SkipMQ cluster").

Each broker is a real ``python -m broker`` process with its own MQTT, HTTP and cluster (gRPC)
port, data directory and log file. Ports are picked free up front (bind port 0, read, close)
and passed explicitly, so the peer id of broker i ("127.0.0.1:<cluster_port>", see
docs/cluster.md) is known before it starts. Broker 0 founds the overlay (seed 003 §3.5.2: the
first node is alone); broker i > 0 joins through every broker already running (``--join``), one
after the other, each waiting until its ``GET /cluster`` says ``"joined": true`` (a broker built
without the cluster runtime answers 404 there: then start() only waits for ``/healthz`` and
wait_ready() raises RuntimeMissingError). A port taken between picking and binding is replaced
(new ports, up to 3 attempts); every wait is bounded and a failure names the broker and shows
its log tail.

Programmatic API (used by tests/cluster and the benchmark)::

    cluster = start_cluster(3, settings={"cluster.table_size": "2"})
    cluster.wait_ready()            # every broker's overlay anchor is linked
    cluster.brokers[1].mqtt_port    # connect clients here
    cluster.kill_broker(0); cluster.restart_broker(0); cluster.add_broker(); cluster.close()
    cluster.stop_broker(1)          # SIGTERM, returns the exit status
    cluster.freeze_broker(2)        # SIGSTOP: a silent failure (thaw_broker = SIGCONT)

Placement (optional, for tests that cut the network between brokers, tools/netns.py): each
broker can run under a command prefix (``ip netns exec NS``), listen for clients and HTTP on
its own address and talk cluster gRPC on another one (its peer id is then
``<cluster_host>:<cluster_port>``). Without ``placement`` every broker runs on 127.0.0.1::

    LocalCluster(3, placement=lambda i: BrokerPlacement(
        ("ip", "netns", "exec", f"ns{i}"), host=f"10.0.1.{i + 1}", cluster_host=f"10.0.0.{i + 1}"))

Command line: ``skipmq cluster --brokers N [...]`` starts the brokers, prints a table (or one
JSON line with --json) and example mosquitto_sub/mosquitto_pub commands, and runs until
SIGINT/SIGTERM, then stops every broker gracefully (SIGTERM = overlay leave) and exits 0.

Size: the programmatic LocalCluster API (start, wait, kill, freeze, restart, add, close) with
its bounded waits, and the ``skipmq cluster`` command line, which stays here because
``broker.__main__`` imports it from this module (the one import from tools that pyproject's
import-linter contract allows). One broker process's record, command line and log reading are
in tools/launcher_process.py (re-exported here).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from broker.config import parse_override
from tools.launcher_process import (
    HOST,
    BrokerPlacement,
    BrokerProcess,
    ClusterError,
    Placement,
    RuntimeMissingError,
    http_get,
)
from tools.ports import free_ports
from tools.start_wait import load_factor, start_timeout_s

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SETTINGS: dict[str, str] = {"sys.interval_s": "0"}
START_TIMEOUT_S = 20.0
JOIN_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.05
PORT_ATTEMPTS = 3
LAUNCHER_MARK = "---- launcher: start #"  # first line the launcher writes to a log at each start
PORT_IN_USE_TEXTS = ("address already in use", "Failed to bind to address", "cannot bind")

ProgressCallback = Callable[[str], None]


# Every LocalCluster not closed yet: closed at interpreter exit so no broker outlives its owner.
_OPEN_CLUSTERS: list[LocalCluster] = []


def _close_open_clusters() -> None:
    for cluster in list(_OPEN_CLUSTERS):
        with contextlib.suppress(Exception):
            cluster.close(timeout_s=5.0)


_EXIT_HOOK: list[bool] = []


def _track(cluster: LocalCluster) -> None:
    """Remember an open cluster; the first one registers the clean-up at interpreter exit (so
    importing this module has no side effect)."""
    if not _EXIT_HOOK:
        atexit.register(_close_open_clusters)
        _EXIT_HOOK.append(True)
    if cluster not in _OPEN_CLUSTERS:
        _OPEN_CLUSTERS.append(cluster)


class LocalCluster:
    """N broker processes on loopback forming one SkipMQ cluster."""

    def __init__(
        self,
        n: int,
        *,
        settings: dict[str, str] | None = None,
        data_root: str | None = None,
        python: str = sys.executable,
        log_dir: str | None = None,
        keep_data: bool | None = None,
        progress: ProgressCallback | None = None,
        node_id_prefix: str = "node",
        placement: Placement | None = None,
        ws_port: int | None = None,
    ) -> None:
        if n < 1:
            raise ValueError(f"a cluster needs at least 1 broker, not {n}")
        self.initial_size = n
        self.settings: dict[str, str] = {
            **DEFAULT_SETTINGS,
            **{k: str(v) for k, v in (settings or {}).items()},
        }
        for key in self.settings:
            if not key or "=" in key or key.strip() != key:
                raise ValueError(f"bad configuration key {key!r} in settings")
        self._own_data_root = data_root is None
        self.data_root = data_root or tempfile.mkdtemp(prefix="skipmq-cluster-")
        Path(self.data_root).mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir or self.data_root
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        self.keep_data = (not self._own_data_root) if keep_data is None else keep_data
        self.python = python
        self.progress = progress
        self.node_id_prefix = node_id_prefix
        self.placement = placement
        self.ws_port = ws_port  # None: no WebSocket listeners; 0: a free port each; N: N + index
        self.brokers: list[BrokerProcess] = []
        self.runtime_present: bool | None = None  # unknown until a broker answered GET /cluster
        self.formation_holder: BrokerProcess | None = None  # start_together(hold_formation=True)
        self._closed = False
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ building blocks
    def _say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    def _new_broker(self, *, holder: bool = False) -> BrokerProcess:
        index = len(self.brokers)
        name = "formation-holder" if holder else f"broker-{index}"
        mqtt_port, http_port, cluster_port, ws_free = free_ports(4)
        data_dir = os.path.join(self.data_root, name)
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        broker = BrokerProcess(
            index=index,
            node_id=f"{self.node_id_prefix}-{'hold' if holder else index}",
            mqtt_port=mqtt_port,
            http_port=http_port,
            cluster_port=cluster_port,
            data_dir=data_dir,
            log_path=os.path.join(self.log_dir, f"{name}.log"),
            placement=BrokerPlacement() if self.placement is None else self.placement(index),
            ws_port=None if self.ws_port is None else (self.ws_port + index if self.ws_port else ws_free),
        )
        if not holder:
            self.brokers.append(broker)
        return broker

    def _start_formation_holder(self, brokers: list[BrokerProcess]) -> BrokerProcess:
        """A broker that holds the formation of ``brokers`` (``start_together(hold_formation=
        True)``): not a seed itself (it never founds), it has the lowest peer id of all, and it
        answers the seeds' formation probes "not joined"; so no seed is ever the lowest
        reachable one and none founds (overlay.formation) until ``release_formation``."""
        holder = self._new_broker(holder=True)
        lowest = min(brokers, key=lambda broker: broker.peer_id)
        if lowest.peer_id < holder.peer_id:  # the lowest cluster port goes to the holder
            holder.cluster_port, lowest.cluster_port = lowest.cluster_port, holder.cluster_port
        if any(broker.peer_id <= holder.peer_id for broker in brokers):
            raise ClusterError("the formation holder needs the lowest peer id (one cluster host)")
        self.formation_holder = holder
        self._spawn(holder, [broker.peer_id for broker in brokers])  # not in its list: no seed
        self._wait_healthy(holder, start_timeout_s(START_TIMEOUT_S))  # its cluster port is open
        return holder

    def release_formation(self) -> None:
        """Kill the formation holder (``start_together(hold_formation=True)``): the lowest
        reachable seed founds the cluster and the others join it, as when a seed crashes
        during formation. Returns without waiting (``wait_ready``)."""
        holder = self.formation_holder
        if holder is None or holder.process is None:
            raise ClusterError("no formation holder: start_together(hold_formation=True) starts one")
        holder.process.kill()
        holder.process.wait(timeout=STOP_TIMEOUT_S)

    def _tls_settings(self, broker: BrokerProcess) -> dict[str, str]:
        """Mutual TLS between the brokers (docs/security.md): a cluster CA in <data root>/certs,
        made on first use, and a certificate for each peer id a broker starts with. None when the
        settings ask for plaintext links (cluster.insecure) or name certificate files."""
        settings = self.settings
        if settings.get("cluster.insecure", "false").lower() in ("true", "1", "yes"):
            return {}
        if "cluster.tls_cert_file" in settings:
            return {}
        from broker.adapters.transport.tls import issue_broker_cert, make_ca

        ca_dir = Path(self.data_root) / "certs"
        if not (ca_dir / "ca.pem").exists():
            make_ca(ca_dir, name="SkipMQ local cluster CA")
        stem = f"broker-{broker.index}-{broker.cluster_port}"
        cert, key = ca_dir / f"{stem}.pem", ca_dir / f"{stem}.key"
        if not cert.exists():
            cert, key = issue_broker_cert(ca_dir, broker.peer_id, name=stem)
        return {
            "cluster.tls_ca_file": str(ca_dir / "ca.pem"),
            "cluster.tls_cert_file": str(cert),
            "cluster.tls_key_file": str(key),
        }

    def _running_peers(self, excluding: BrokerProcess) -> list[str]:
        return [b.peer_id for b in self.brokers if b is not excluding and b.alive()]

    def _spawn(self, broker: BrokerProcess, seeds: list[str] | None = None) -> None:
        join = self._running_peers(broker) if seeds is None else seeds
        broker.joined_through = join
        settings = {**self.settings, **self._tls_settings(broker)}
        cmd = broker.command(self.python, join, settings, seed=seeds is not None)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        broker.starts += 1
        with open(broker.log_path, "ab") as log:
            log.write(f"{LAUNCHER_MARK}{broker.starts}: {' '.join(cmd)}\n".encode())
            log.flush()
            # Own session: a terminal's Ctrl-C reaches the launcher only, which then stops the
            # brokers in order (graceful overlay leave) instead of all at once.
            broker.process = subprocess.Popen(
                cmd,
                cwd=broker.data_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def _wait_healthy(self, broker: BrokerProcess, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last_error = "no answer"
        while time.monotonic() < deadline:
            process = broker.process
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                raise ClusterError(
                    f"broker {broker.index} ({broker.node_id}) exited with status {code} while starting;"
                    f" log tail:\n{broker.log_tail()}"
                )
            try:
                status, body = http_get(broker.http_port, "/healthz", timeout_s=1.0, host=broker.host)
                if status == 200:
                    return
                last_error = f"/healthz answered {status}: {body[:200]!r}"
            except OSError as exc:
                last_error = str(exc)
            time.sleep(POLL_INTERVAL_S)
        raise ClusterError(
            f"broker {broker.index} ({broker.node_id}) not healthy within {timeout_s} s ({last_error};"
            f" load {load_factor():.1f} per CPU); log tail:\n{broker.log_tail()}"
        )

    def _wait_joined(self, broker: BrokerProcess, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last_state: dict[str, Any] | str = "no answer"
        while time.monotonic() < deadline:
            if not broker.alive():
                raise ClusterError(
                    f"broker {broker.index} ({broker.node_id}) exited while joining;"
                    f" log tail:\n{broker.log_tail()}"
                )
            try:
                state = self.cluster_state(broker.index)
                if state.get("joined"):
                    return
                last_state = state
            except RuntimeMissingError:
                raise
            except (OSError, ClusterError) as exc:
                last_state = str(exc)
            time.sleep(POLL_INTERVAL_S)
        raise ClusterError(
            f"broker {broker.index} ({broker.node_id}) did not join within {timeout_s} s"
            f" (load {load_factor():.1f} per CPU);"
            f" last /cluster: {last_state}; log tail:\n{broker.log_tail()}"
        )

    def _start_broker(self, broker: BrokerProcess, timeout_s: float, *, fresh_ports: bool = False) -> None:
        """Spawn, wait for /healthz, and (when the cluster runtime is there) for joined; both
        bounds grow with the machine's load (tools/start_wait.py: ``timeout_s`` on an idle machine).

        fresh_ports: the broker's ports were only picked, never used; if one of them was taken
        meanwhile (another program bound it), pick new ones and try again (3 attempts)."""
        timeout_s = start_timeout_s(timeout_s)
        for attempt in range(PORT_ATTEMPTS):
            self._spawn(broker)
            try:
                self._wait_healthy(broker, timeout_s)
                break
            except ClusterError:
                this_start = broker.log_text().rpartition(LAUNCHER_MARK)[2]
                in_use = any(text in this_start for text in PORT_IN_USE_TEXTS)
                if not (fresh_ports and in_use and attempt + 1 < PORT_ATTEMPTS) or broker.alive():
                    raise
                broker.mqtt_port, broker.http_port, broker.cluster_port, ws_free = free_ports(4)
                if self.ws_port == 0:
                    broker.ws_port = ws_free
                self._say(f"broker {broker.index}: a port was taken, retrying with new ports")
        if self.runtime_present is False:
            return
        try:
            self._wait_joined(broker, start_timeout_s(JOIN_TIMEOUT_S))
            self.runtime_present = True
        except RuntimeMissingError:
            self.runtime_present = False

    # ------------------------------------------------------------------ public API
    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the brokers one after the other; broker i joins through brokers 0..i-1.

        Each broker must answer /healthz within timeout_s and, when it has the cluster runtime,
        report ``joined`` before the next one starts. On failure every broker is stopped.
        """
        with self._lock:
            if self.brokers:
                raise ClusterError("start() was already called; use add_broker() to grow the cluster")
            _track(self)
            try:
                for position in range(self.initial_size):
                    broker = self._new_broker()
                    self._start_broker(broker, timeout_s, fresh_ports=True)
                    verb = "joined" if self.runtime_present else "started"
                    self._say(
                        f"broker {position + 1}/{self.initial_size} {verb}: {broker.node_id}"
                        f" mqtt={broker.mqtt_port} http={broker.http_port} cluster={broker.cluster_port}"
                    )
            except BaseException:
                self.close()
                raise

    def start_together(self, *, hold_formation: bool = False) -> None:
        """Spawn every broker at once, each with the same seed list: all of them, itself included
        (a StatefulSet whose --join is a headless service). Returns without waiting: the brokers
        form the cluster among themselves (overlay.formation); ``wait_ready`` waits for it.

        hold_formation: first start a formation holder (``_start_formation_holder``), listed
        among the seeds, so that the brokers stay joining - observably, for as long as the caller
        wants - until ``release_formation``."""
        with self._lock:
            if self.brokers:
                raise ClusterError("start_together() needs a cluster that was not started")
            _track(self)
            try:
                brokers = [self._new_broker() for _ in range(self.initial_size)]
                seeds = [broker.peer_id for broker in brokers]
                if hold_formation:
                    seeds.append(self._start_formation_holder(brokers).peer_id)
                for broker in brokers:
                    self._spawn(broker, seeds)
            except BaseException:
                self.close()
                raise

    def wait_ready(self, timeout_s: float = 30) -> None:
        """Wait (bounded) until every live broker's GET /cluster says ``"joined": true``."""
        deadline = time.monotonic() + timeout_s
        for broker in self.brokers:
            if not broker.alive():
                continue
            remaining = max(0.1, deadline - time.monotonic())
            self._wait_joined(broker, remaining)
        self.runtime_present = True

    def add_broker(self, timeout_s: float = START_TIMEOUT_S) -> BrokerProcess:
        """Start one more broker that joins through every running one; returns it once joined."""
        with self._lock:
            broker = self._new_broker()
            self._start_broker(broker, timeout_s, fresh_ports=True)
            self._say(f"broker {broker.index + 1} added: {broker.node_id}")
            return broker

    def stop_broker(self, i: int, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM broker i (graceful overlay leave) and wait; returns its exit status.

        After timeout_s the broker is killed (the status is then -SIGKILL) so nothing hangs.
        """
        broker = self.brokers[i]
        process = broker.process
        if process is None:
            raise ClusterError(f"broker {i} was never started")
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.send_signal(signal.SIGCONT)  # a frozen broker must see its SIGTERM
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)
        return int(process.returncode)

    def kill_broker(self, i: int) -> None:
        """kill -9 broker i: no leave, no flush; neighbours must detect the failure."""
        process = self.brokers[i].process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)

    def freeze_broker(self, i: int) -> None:
        """SIGSTOP broker i: its sockets stay open but it answers nothing (a silent failure that
        only the overlay's liveness probes can detect, cluster.failure_timeout_ms)."""
        process = self.brokers[i].process
        if process is None or process.poll() is not None:
            raise ClusterError(f"broker {i} is not running")
        process.send_signal(signal.SIGSTOP)

    def thaw_broker(self, i: int) -> None:
        """SIGCONT broker i after freeze_broker."""
        process = self.brokers[i].process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)

    def respawn_together(self, indexes: Iterable[int]) -> None:
        """Start the (stopped) brokers ``indexes`` again at once, same ports, node ids and data,
        each with the seed list of ``start_together`` (every broker, itself included); returns
        without waiting (``wait_ready``)."""
        with self._lock:
            seeds = [broker.peer_id for broker in self.brokers]
            chosen = [self.brokers[i] for i in indexes]
            for broker in chosen:
                if broker.alive():
                    raise ClusterError(f"broker {broker.index} is still running")
            for broker in chosen:
                self._spawn(broker, seeds)

    def restart_broker(self, i: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start broker i again with the same ports, node id and data directory (stopping it first
        if it still runs); it joins through the brokers running now."""
        with self._lock:
            broker = self.brokers[i]
            if broker.alive():
                self.stop_broker(i)
            self._start_broker(broker, timeout_s)
            self._say(f"broker {i} restarted: {broker.node_id}")

    def cluster_state(self, i: int) -> dict[str, Any]:
        """GET /cluster of broker i as a dict (see docs/cluster.md)."""
        broker = self.brokers[i]
        status, body = http_get(broker.http_port, "/cluster", host=broker.host)
        if status == 404:
            raise RuntimeMissingError(
                f"broker {i} ({broker.node_id}) answers 404 on GET /cluster: no cluster runtime"
            )
        if status != 200:
            raise ClusterError(f"broker {i} GET /cluster answered {status}: {body[:300]!r}")
        try:
            state = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ClusterError(f"broker {i} GET /cluster is not JSON: {body[:300]!r}") from exc
        if not isinstance(state, dict):
            raise ClusterError(f"broker {i} GET /cluster is not a JSON object: {state!r}")
        return state

    def metrics_text(self, i: int) -> str:
        """GET /metrics of broker i (Prometheus text format)."""
        broker = self.brokers[i]
        status, body = http_get(broker.http_port, "/metrics", host=broker.host)
        if status != 200:
            raise ClusterError(f"broker {i} GET /metrics answered {status}: {body[:300]!r}")
        return body.decode("utf-8", errors="replace")

    def healthz(self, i: int) -> dict[str, Any]:
        """GET /healthz of broker i (status code must be 200 or 503)."""
        broker = self.brokers[i]
        status, body = http_get(broker.http_port, "/healthz", host=broker.host)
        if status not in (200, 503):
            raise ClusterError(f"broker {i} GET /healthz answered {status}: {body[:300]!r}")
        result = json.loads(body)
        return result if isinstance(result, dict) else {"body": result}

    def live_indexes(self) -> list[int]:
        return [b.index for b in self.brokers if b.alive()]

    def logs_tail(self, lines: int = 40, exclude: tuple[str, ...] = ()) -> str:
        """The log tail of every broker (see BrokerProcess.log_tail), for failure reports."""
        parts = []
        for broker in self.brokers:
            state = (
                "running"
                if broker.alive()
                else f"exited {broker.process.returncode if broker.process else '-'}"
            )
            parts.append(f"---- broker {broker.index} {broker.node_id} ({state}) {broker.log_path}")
            parts.append(broker.log_tail(lines, exclude))
        return "\n".join(parts)

    def close(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every broker at once, wait (bounded), SIGKILL the rest; remove a temporary
        data root unless keep_data."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            everyone = [*self.brokers, *([self.formation_holder] if self.formation_holder else [])]
            running = [b.process for b in everyone if b.process is not None and b.process.poll() is None]
            for process in running:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
                    process.send_signal(signal.SIGCONT)  # a frozen broker must see its SIGTERM
            deadline = time.monotonic() + timeout_s
            for process in running:
                try:
                    process.wait(timeout=max(0.05, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=STOP_TIMEOUT_S)
            if self in _OPEN_CLUSTERS:
                _OPEN_CLUSTERS.remove(self)
            if self._own_data_root and not self.keep_data:
                shutil.rmtree(self.data_root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_cluster(
    n: int,
    *,
    settings: dict[str, str] | None = None,
    data_root: str | None = None,
    python: str = sys.executable,
    log_dir: str | None = None,
    keep_data: bool | None = None,
    progress: ProgressCallback | None = None,
    timeout_s: float = START_TIMEOUT_S,
    placement: Placement | None = None,
) -> LocalCluster:
    """Start an n-broker cluster on loopback and return it (every broker healthy and, when the
    cluster runtime is present, joined). The caller must close() it."""
    cluster = LocalCluster(
        n, settings=settings, data_root=data_root, python=python, log_dir=log_dir, keep_data=keep_data,
        progress=progress, placement=placement,
    )  # fmt: skip
    cluster.start(timeout_s=timeout_s)
    return cluster


# ---------------------------------------------------------------------- command line
CLI_DESCRIPTION = """\
Start N SkipMQ brokers on this machine (127.0.0.1) as one cluster, for trying SkipMQ out
and for tests. Every broker gets free MQTT, HTTP (/metrics, /healthz, /cluster) and cluster
(gRPC) ports, its own data directory and a JSON log file. Broker 0 founds the overlay; each
further broker joins through the ones already running. When all have joined, a table of the
brokers is printed (one JSON line with --json) with example mosquitto_sub/mosquitto_pub
commands against two different brokers. Ctrl-C (SIGINT) or SIGTERM stops every broker
gracefully (each leaves the overlay) and exits 0.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skipmq cluster",
        description=CLI_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--brokers", type=int, default=3, metavar="N", help="number of brokers (default 3)")
    parser.add_argument(
        "--table-size", type=int, metavar="L", help="routing-table size per virtual node [cluster.table_size]"
    )
    parser.add_argument(
        "--class-levels",
        type=int,
        metavar="K",
        help="topic levels forming a topic class [cluster.class_levels]",
    )
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="root directory for the brokers' data and logs (default: a new temporary directory)",
    )
    parser.add_argument(
        "--keep-data",
        action="store_true",
        help="keep the data directory on exit (a --data-dir given is always kept)",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="configuration key for every broker, e.g. --set cluster.failure_timeout_ms=2000 (repeatable)",
    )
    parser.add_argument(
        "--ws-port",
        type=int,
        metavar="N",
        help="MQTT over WebSocket (path /mqtt) on every broker: broker i on port N+i, 0 = a free port each",
    )
    parser.add_argument("--json", action="store_true", help="print the broker table as one JSON line")
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=START_TIMEOUT_S,
        metavar="S",
        help=f"seconds each broker has to become healthy (default {START_TIMEOUT_S:g})",
    )
    return parser


def parse_settings(pairs: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings to a dict; a missing ``=`` or empty key is a ValueError naming it."""
    settings: dict[str, str] = {}
    for text in pairs:
        # the brokers' own parser: an unknown key or a bad value is refused before any starts
        key, _value = parse_override(text)
        settings[key] = text.partition("=")[2]
    return settings


def format_table(brokers: list[BrokerProcess]) -> str:
    websocket = any(b.ws_port is not None for b in brokers)
    headers: tuple[str, ...] = ("broker", "node id", "MQTT port", "HTTP port", "cluster port", "pid")
    rows: list[tuple[str, ...]] = [
        (str(b.index), b.node_id, str(b.mqtt_port), str(b.http_port), str(b.cluster_port), str(b.pid))
        for b in brokers
    ]
    if websocket:  # the WebSocket column only when the listeners are on (before pid)
        headers = (*headers[:5], "WS port", headers[5])
        rows = [(*row[:5], str(b.ws_port), row[5]) for row, b in zip(rows, brokers, strict=True)]
    widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(widths[c]) for c, h in enumerate(headers))]
    lines += ["  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)) for row in rows]
    return "\n".join(lines)


def example_commands(brokers: list[BrokerProcess]) -> tuple[str, str]:
    sub_broker = brokers[0]
    pub_broker = brokers[1] if len(brokers) > 1 else brokers[0]
    sub = f"mosquitto_sub -h {HOST} -p {sub_broker.mqtt_port} -t 'demo/#' -v"
    pub = (
        f"mosquitto_pub -h {HOST} -p {pub_broker.mqtt_port} -t demo/hello"
        f" -m 'hello from broker {pub_broker.index}'"
    )
    return sub, pub


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.brokers < 1:
        print(f"skipmq cluster: --brokers must be at least 1, not {args.brokers}", file=sys.stderr)
        return 2
    if args.ws_port is not None and not 0 <= args.ws_port <= 65535 - args.brokers + 1:
        print(
            f"skipmq cluster: --ws-port must leave room for {args.brokers} ports, not {args.ws_port}",
            file=sys.stderr,
        )
        return 2
    try:
        settings = parse_settings(args.settings)
    except ValueError as exc:
        print(f"skipmq cluster: {exc}", file=sys.stderr)
        return 2
    if args.table_size is not None:
        settings["cluster.table_size"] = str(args.table_size)
    if args.class_levels is not None:
        settings["cluster.class_levels"] = str(args.class_levels)

    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def progress(text: str) -> None:
        print(f"skipmq cluster: {text}", file=sys.stderr, flush=True)

    data_root = args.data_dir
    cluster = LocalCluster(
        args.brokers,
        settings=settings,
        data_root=data_root,
        keep_data=True if data_root else args.keep_data,
        progress=progress,
        ws_port=args.ws_port,
    )
    try:
        try:
            cluster.start(timeout_s=args.start_timeout)
        except (ClusterError, OSError) as exc:
            print(f"skipmq cluster: could not start the cluster: {exc}", file=sys.stderr)
            return 1
        if stop.is_set():
            return 0
        if cluster.runtime_present is False:
            progress("warning: the brokers have no cluster runtime (GET /cluster is 404); they run unlinked")
        sub, pub = example_commands(cluster.brokers)
        if args.json:
            line = {
                "brokers": [b.as_row() for b in cluster.brokers],
                "data_dir": cluster.data_root,
                "settings": cluster.settings,
                "joined": bool(cluster.runtime_present),
                "example": {"subscribe": sub, "publish": pub},
            }
            print(json.dumps(line), flush=True)
        else:
            print(format_table(cluster.brokers))
            print(f"try: {sub}    and in another terminal: {pub}")
            print(f"data and logs: {cluster.data_root}; Ctrl-C stops the cluster", flush=True)
        reported_dead: set[int] = set()
        while not stop.wait(0.5):
            for broker in cluster.brokers:
                if broker.index not in reported_dead and not broker.alive():
                    reported_dead.add(broker.index)
                    code = broker.process.returncode if broker.process else None
                    progress(f"broker {broker.index} ({broker.node_id}) exited with status {code}")
        progress(f"signal {received[0] if received else '?'}: stopping {len(cluster.brokers)} brokers")
        return 0
    finally:
        cluster.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
