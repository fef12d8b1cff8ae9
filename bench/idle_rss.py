#!/usr/bin/env python3
"""The idle single broker's own RSS and start-up time, for one or more trees side by side (run by
hand; not part of CI).

Each round starts ``python -m broker`` of every tree in turn (interleaved, the order alternating
per round: this machine is noisy) on its embedded defaults (a data dir and free ports given; no
cluster, no federation, no admin API, no pull gateway; the HTTP endpoint on, as by default) and
measures: seconds from spawn until the MQTT port accepts a connection and until ``/readyz``
answers 200, then VmRSS once the broker has been idle ``--settle-s`` seconds (no client
connected). Every tree runs with THIS checkout's interpreter and ``PYTHONPATH=<tree>``, as
bench/broker_bench.py's ``--broker-root`` does. ``--imports`` adds, per tree, the RSS after each
big import of the server (a fresh interpreter importing them in order), to show what the idle
broker's RSS is made of.

    git archive main | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    .venv/bin/python bench/idle_rss.py --tree before=/tmp/before --tree after=. --rounds 7 --imports
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools.ports import free_ports  # noqa: E402

# what the server imports, in the order it first needs it (each line: what it brings in)
IMPORTS = (
    "asyncio",
    "uvloop",
    "sqlite3",
    "broker.config",
    "broker.mqtt.codec",
    "prometheus_client",
    "broker.metrics",
    "broker.core.broker",
    "aiohttp.web",
    "broker.adapters.http",
    "broker.adapters.server",
    "broker.certs",
    "broker.adapters.http_pull",
    "overlay.node",
    "cryptography.x509",
    "grpc",
    "broker.adapters.transport",
)

IMPORTS_CHILD = """
import importlib, json, sys
def rss():
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0])
out = [["python", rss(), len(sys.modules)]]
for name in sys.argv[1:]:
    importlib.import_module(name)
    out.append([name, rss(), len(sys.modules)])
print(json.dumps(out))
"""


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _accepts(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait(check: Any, process: subprocess.Popen[bytes], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if process.poll() is not None:
            raise RuntimeError(f"the broker exited ({process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {timeout_s} s")
        time.sleep(0.002)


def one_run(tree: Path, settle_s: float) -> dict[str, float]:
    mqtt, http = free_ports(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPMQ_")}
    env["PYTHONPATH"] = str(tree)
    with tempfile.TemporaryDirectory(prefix="skipmq-idle-rss-") as data:
        command = [
            sys.executable, "-m", "broker", "--bind", "127.0.0.1", "--port", str(mqtt),
            "--http-port", str(http), "--data-dir", data,
        ]  # fmt: skip
        start = time.perf_counter()
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tree
        )
        try:
            _wait(lambda: _accepts(mqtt), process, "MQTT port")
            listening = time.perf_counter() - start
            _wait(lambda: _ready(http), process, "/readyz 200")
            ready = time.perf_counter() - start
            time.sleep(settle_s)
            rss = rss_kib(process.pid)
        finally:
            process.terminate()
            process.wait(timeout=30)
    return {"listening_s": listening, "ready_s": ready, "rss_mib": rss / 1024}


def import_steps(tree: Path) -> list[list[Any]]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    names = []
    for name in IMPORTS:  # a module this tree does not have is skipped
        probe = [
            sys.executable,
            "-c",
            f"import importlib.util as u; print(u.find_spec({name!r}) is not None)",
        ]
        if subprocess.run(probe, env=env, cwd=tree, capture_output=True, text=True).stdout.strip() == "True":
            names.append(name)
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS_CHILD, *names],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    steps: list[list[Any]] = json.loads(out.stdout)
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tree", action="append", default=[], metavar="NAME=PATH",
        help="a source tree to start (repeatable; default: this checkout as 'this')",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument(
        "--settle-s", type=float, default=1.0, help="idle seconds before reading RSS (default 1)"
    )
    parser.add_argument("--imports", action="store_true", help="also the RSS after each big import, per tree")
    parser.add_argument("--json", help="write the samples and medians here")
    args = parser.parse_args(argv)
    trees: dict[str, Path] = {}
    for spec in args.tree or [f"this={REPO_ROOT}"]:
        name, _, path = spec.partition("=")
        trees[name] = Path(path).resolve()
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    load: list[float] = []
    for round_index in range(args.rounds):
        order = list(trees) if round_index % 2 == 0 else list(reversed(trees))
        for name in order:
            samples[name].append(one_run(trees[name], args.settle_s))
        load.append(os.getloadavg()[0])
        print(
            f"round {round_index + 1}/{args.rounds} done (load {load[-1]:.2f})", file=sys.stderr, flush=True
        )
    medians = {
        name: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        for name, runs in samples.items()
    }
    print(
        f"machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}; load average (1 min) during the rounds {min(load):.2f}-{max(load):.2f}"
    )
    print(f"{'tree':<12} {'RSS MiB':>8} {'listening s':>12} {'/readyz s':>10}   (medians of {args.rounds})")
    for name, fig in medians.items():
        print(f"{name:<12} {fig['rss_mib']:8.1f} {fig['listening_s']:12.3f} {fig['ready_s']:10.3f}")
    first = next(iter(medians))
    for name in list(medians)[1:]:
        ratios = {key: medians[name][key] / medians[first][key] for key in medians[first]}
        print(f"{name}/{first}: " + ", ".join(f"{key} x{value:.2f}" for key, value in ratios.items()))
    steps: dict[str, list[list[Any]]] = {}
    if args.imports:
        for name, tree in trees.items():
            steps[name] = import_steps(tree)
            print(f"\n{name}: RSS after each import (fresh interpreter, cumulative)")
            previous = steps[name][0][1]
            for module, kib, count in steps[name]:
                added = (kib - previous) / 1024
                print(f"  {module:<28} {kib / 1024:6.1f} MiB  (+{added:4.1f}, {count} modules)")
                previous = kib
    if args.json:
        Path(args.json).write_text(
            json.dumps({"samples": samples, "medians": medians, "load": load, "imports": steps}, indent=2)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
