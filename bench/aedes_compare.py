"""SkipMQ's cluster beside an off-the-shelf MQTT cluster: Aedes nodes sharing one redis-server
(mqemitter-redis + aedes-persistence-redis), measured in the same run (issue #11; by hand).

What it measures, for each system, with the same clients (bench/cluster_bench.py's raw-socket
MQTT 3.1.1 client; QoS 1 subscriptions), the publisher on node 0:

* **CPU per forwarded message** (3 nodes, subscribers on nodes 1 and 2 only, so every delivery
  crossed brokers): the broker processes' utime + stime (/proc) during a closed-loop run divided
  by the deliveries; for Aedes with and without the redis-server's own CPU (the hub is part of
  that cluster's cost).
* **Growth with the cluster size** (3 → 5 → 9 nodes, one subscriber on every node): CPU per
  published message, beside a full-mesh broadcast model computed from the 3-node figure
  (a broker that sends every message to each of its N-1 peers costs in proportion to N-1:
  ``model(N) = cpu_per_publish(3) x (N-1) / 2``).
* **Latency** at ``--rate`` msg/s (paced QoS 0): p50/p99 of deliveries on other nodes, beside the
  same system's single node (SkipMQ with clustering off; one in-memory Aedes node), and the ratio.

Set-up (the script starts and stops everything itself): Debian ``redis-server`` (``apt-get install
redis-server``) and the npm packages in bench/aedes (``npm ci --prefix bench/aedes``; run once,
the script does it when node_modules is missing). SkipMQ brokers run as
``tools.launcher.start_cluster`` makes them (cluster mTLS on, as a user gets by default;
``--insecure`` adds a plaintext-links SkipMQ row).

    .venv/bin/python bench/aedes_compare.py --help
    .venv/bin/python bench/aedes_compare.py --quick              # ~2 min smoke run
    .venv/bin/python bench/aedes_compare.py --json out.json      # full run (~10 min)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for path in (str(REPO_ROOT), str(BENCH_DIR)):
    if path not in sys.path:
        sys.path.insert(0, path)

import cluster_bench as cb  # noqa: E402

from tools.ports import free_ports  # noqa: E402

AEDES_DIR = BENCH_DIR / "aedes"
START_TIMEOUT_S = 20.0


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- the Aedes cluster ---------------------------------------------------------------------------
def ensure_aedes_installed() -> None:
    if shutil.which("node") is None:
        raise SystemExit("aedes_compare: node (Node.js >= 20) is not on PATH")
    if shutil.which("redis-server") is None:
        raise SystemExit("aedes_compare: redis-server is missing (apt-get install redis-server)")
    if not (AEDES_DIR / "node_modules" / "aedes").is_dir():
        log("installing aedes, mqemitter-redis, aedes-persistence-redis (npm, bench/aedes)")
        command = "ci" if (AEDES_DIR / "package-lock.json").exists() else "install"
        subprocess.run(["npm", command, "--no-audit", "--no-fund"], cwd=AEDES_DIR, check=True)


def _wait_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    import socket

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection((cb.HOST, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not listening on {port} within {START_TIMEOUT_S} s") from None
            time.sleep(0.05)


class AedesCluster:
    """n Aedes nodes on one redis-server (n = 1 and ``shared=False``: one in-memory node)."""

    def __init__(self, nodes: int, *, shared: bool = True) -> None:
        self.workdir = tempfile.mkdtemp(prefix="skipmq-bench-aedes-")
        self.processes: list[subprocess.Popen[bytes]] = []
        self.redis: subprocess.Popen[bytes] | None = None
        self.mqtt_ports = free_ports(nodes)
        try:
            redis_port = 0
            if shared:
                (redis_port,) = free_ports(1)
                self.redis = self._spawn(
                    ["redis-server", "--port", str(redis_port), "--bind", cb.HOST, "--save", "",
                     "--appendonly", "no", "--dir", self.workdir],
                    "redis.log",
                )  # fmt: skip
                _wait_port(redis_port, self.redis, "redis-server")
            for port in self.mqtt_ports:
                args = ["node", str(AEDES_DIR / "node.mjs"), str(port)]
                args += [str(redis_port)] if shared else []
                process = self._spawn(args, f"aedes-{port}.log")
                self.processes.append(process)
            for port, process in zip(self.mqtt_ports, self.processes, strict=True):
                _wait_port(port, process, f"aedes node on {port}")
        except BaseException:
            self.close()
            raise

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        with open(os.path.join(self.workdir, log_name), "ab") as out:
            return subprocess.Popen(
                args, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip

    @property
    def broker_pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    @property
    def hub_pids(self) -> list[int]:
        return [self.redis.pid] if self.redis is not None else []

    def close(self) -> None:
        for process in [*self.processes, *([self.redis] if self.redis else [])]:
            if process.poll() is None:
                process.terminate()
        for process in [*self.processes, *([self.redis] if self.redis else [])]:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


# ---- set-ups -------------------------------------------------------------------------------------
async def skipmq_setup(nodes: int, insecure: bool) -> cb.Setup:
    settings = {"cluster.insecure": "true"} if insecure else {}
    return await cb.start_setup(nodes, settings)


def aedes_setup(cluster: AedesCluster, label: str) -> cb.Setup:
    return cb.Setup(
        len(cluster.mqtt_ports), label, list(cluster.mqtt_ports), [], cluster.broker_pids + cluster.hub_pids
    )


async def with_clients(setup: cb.Setup, subscriber_nodes: list[int]) -> None:
    await cb.connect_publisher(setup)
    for node in subscriber_nodes:
        await cb.add_subscriber(setup, node)
    await cb.warm_up(setup)


async def measure(
    system: str, nodes: int, subscriber_nodes: list[int], args: argparse.Namespace, *, insecure: bool = False
) -> dict[str, Any]:
    """One system at one size: closed-loop QoS 0 and QoS 1 CPU per delivery, then paced latency."""
    aedes: AedesCluster | None = None
    if system == "skipmq":
        setup = await skipmq_setup(nodes, insecure) if nodes > 1 else await cb.start_setup(cb.STANDALONE, {})
    else:
        aedes = await asyncio.to_thread(AedesCluster, nodes, shared=nodes > 1)
        setup = aedes_setup(aedes, f"aedes {nodes}")
    hub_pids = aedes.hub_pids if aedes is not None else []
    try:
        await with_clients(setup, subscriber_nodes)
        row: dict[str, Any] = {
            "system": system + (" (insecure links)" if insecure else ""),
            "nodes": nodes,
            "subscriber_nodes": subscriber_nodes,
            "load_before": os.getloadavg()[0],
        }
        for qos in (0, 1):
            hub_before = sum(cb.process_cpu_s(pid) for pid in hub_pids)
            result = await cb.measure_throughput(setup, qos, args.duration_s, args.publish_window)
            hub_s = sum(cb.process_cpu_s(pid) for pid in hub_pids) - hub_before
            delivered = result["delivered_per_s"] * args.duration_s
            cpu_all_us = result["broker_cpu_us_per_msg"]
            row[f"qos{qos}"] = {
                "delivered_per_s": result["delivered_per_s"],
                "published_per_s": result["published_per_s"],
                "cpu_us_per_delivery": cpu_all_us,  # brokers (+ redis for Aedes: it is in the pids)
                "hub_cpu_us_per_delivery": (hub_s * 1e6 / delivered) if delivered else None,
                "cpu_us_per_publish": (
                    cpu_all_us * result["delivered_per_s"] / result["published_per_s"]
                    if cpu_all_us and result["published_per_s"]
                    else None
                ),
                "lost": result["lost"],
                "stalls": result["stalls"],
            }
        latency = await cb.measure_latency(setup, args.rate, args.latency_s)
        row["latency"] = {
            "remote": latency["remote"],
            "local": latency["local"],
            "lost": latency["lost"],
        }
        row["load_after"] = os.getloadavg()[0]
        return row
    finally:
        setup.close()
        if aedes is not None:
            aedes.close()


# ---- the run -------------------------------------------------------------------------------------
async def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    systems = ["skipmq", "aedes"]
    plan: list[tuple[str, int, list[int], bool]] = []
    for round_index in range(args.rounds):
        order = systems if round_index % 2 == 0 else systems[::-1]
        for system in order:  # single-node references: latency and CPU per delivery
            plan.append((system, 1, [0], False))
        for system in order:  # forwarded only: subscribers on nodes 1 and 2
            plan.append((system, 3, [1, 2], False))
        if args.insecure:
            plan.append(("skipmq", 3, [1, 2], True))
        for nodes in args.nodes:  # growth: a subscriber on every node
            for system in order:
                plan.append((system, nodes, list(range(nodes)), False))
    for index, (system, nodes, subs, insecure) in enumerate(plan, 1):
        load = os.getloadavg()[0]
        log(f"[{index}/{len(plan)}] {system}{' insecure' if insecure else ''}, {nodes} node(s), "
            f"subscribers on {subs} [load {load:.1f}]")  # fmt: skip
        row = await measure(system, nodes, subs, args, insecure=insecure)
        row["kind"] = "single" if nodes == 1 else ("forwarded" if 0 not in subs else "growth")
        row["loadavg_1min"] = round(load, 2)  # at the start of this measurement (a shared machine)
        rows.append(row)
        q0, q1 = row["qos0"], row["qos1"]
        log(
            f"    QoS 0 {q0['delivered_per_s']:,.0f}/s {q0['cpu_us_per_delivery'] or 0:.1f} us/delivery; "
            f"QoS 1 {q1['delivered_per_s']:,.0f}/s {q1['cpu_us_per_delivery'] or 0:.1f} us/delivery; "
            f"latency p50 remote {_ms(row['latency']['remote'])} local {_ms(row['latency']['local'])}"
        )
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "node": subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
        },
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "rows": rows,
    }


def _ms(summary: dict[str, float] | None) -> str:
    return "-" if not summary else f"{summary['p50_ms']:.2f} ms"


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def summarize(results: dict[str, Any]) -> str:
    """Markdown: medians over rounds of each (system, kind, nodes)."""
    rows = results["rows"]
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["system"], row["kind"], row["nodes"]), []).append(row)

    def med(key: tuple[str, str, int], *path: str) -> float | None:
        values = []
        for row in groups.get(key, []):
            value: Any = row
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            values.append(value)
        return _median(values)

    def fmt(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    lines = [
        "| system | nodes | subscribers on | QoS 0 deliveries/s | QoS 0 CPU µs/delivery | "
        "QoS 1 deliveries/s | QoS 1 CPU µs/delivery | of which redis (QoS 0 / 1) | p50 / p99 ms |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key in sorted(groups, key=lambda k: (k[1] != "single", k[1] != "forwarded", k[2], k[0])):
        system, kind, nodes = key
        where = {"single": "node 0", "forwarded": "nodes 1, 2", "growth": "every node"}[kind]
        latency = "remote" if kind != "single" else "local"
        cells = [
            system,
            str(nodes),
            where,
            fmt(med(key, "qos0", "delivered_per_s"), 0),
            fmt(med(key, "qos0", "cpu_us_per_delivery")),
            fmt(med(key, "qos1", "delivered_per_s"), 0),
            fmt(med(key, "qos1", "cpu_us_per_delivery")),
            f"{fmt(med(key, 'qos0', 'hub_cpu_us_per_delivery'))} / "
            f"{fmt(med(key, 'qos1', 'hub_cpu_us_per_delivery'))}",
            f"{fmt(med(key, 'latency', latency, 'p50_ms'), 2)} / "
            f"{fmt(med(key, 'latency', latency, 'p99_ms'), 2)}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Cross-broker latency over the same system's single node (p50, p99):", ""]
    for system in ("skipmq", "aedes"):
        single = (system, "single", 1)
        forwarded = (system, "forwarded", 3)
        p50 = med(forwarded, "latency", "remote", "p50_ms")
        p99 = med(forwarded, "latency", "remote", "p99_ms")
        base50 = med(single, "latency", "local", "p50_ms")
        base99 = med(single, "latency", "local", "p99_ms")
        if None not in (p50, p99, base50, base99):
            assert p50 is not None and p99 is not None and base50 and base99
            lines.append(f"- {system}: p50 {p50 / base50:.2f}x, p99 {p99 / base99:.2f}x")
    lines += ["", "CPU per published message as the cluster grows (QoS 0, a subscriber on every node), "
              "beside the full-mesh model from the 3-node figure:", "",
              "| nodes | SkipMQ µs/publish | Aedes µs/publish | full-mesh model (SkipMQ 3-node x (N-1)/2) |",
              "|---:|---:|---:|---:|"]  # fmt: skip
    base = med(("skipmq", "growth", 3), "qos0", "cpu_us_per_publish")
    for nodes in sorted({k[2] for k in groups if k[1] == "growth"}):
        model = None if base is None else base * (nodes - 1) / 2
        lines.append(
            f"| {nodes} | {fmt(med(('skipmq', 'growth', nodes), 'qos0', 'cpu_us_per_publish'))} | "
            f"{fmt(med(('aedes', 'growth', nodes), 'qos0', 'cpu_us_per_publish'))} | {fmt(model)} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Prints a Markdown summary (medians over rounds); --json keeps every measurement.",
    )
    parser.add_argument("--nodes", default="3,5,9", help="cluster sizes of the growth run (default 3,5,9)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, system order alternating (default 2)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="closed-loop run per QoS (default 5)")
    parser.add_argument("--rate", type=float, default=1000.0, help="paced latency run, msg/s (default 1000)")
    parser.add_argument("--latency-s", type=float, default=5.0, help="paced latency run length (default 5)")
    parser.add_argument("--publish-window", type=int, default=100, help="QoS 1 unacknowledged (default 100)")
    parser.add_argument("--insecure", action="store_true", help="also SkipMQ with cluster.insecure (3 nodes)")
    parser.add_argument("--quick", action="store_true", help="1 round, 3 nodes, 2 s runs")
    parser.add_argument("--json", help="write every measurement to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.nodes = [int(n) for n in str(args.nodes).split(",") if n.strip()]
    if args.quick:
        args.rounds, args.nodes, args.duration_s, args.latency_s = 1, [3], 2.0, 2.0
    ensure_aedes_installed()
    results = asyncio.run(run(args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(summarize(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
