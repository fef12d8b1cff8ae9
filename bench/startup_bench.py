#!/usr/bin/env python3
"""Start-up time of the broker, and what pydantic-settings would cost (docs/operations.md).

Measured side by side in one run, each in fresh processes, ``--runs`` times (median, p90):

* ``single``: ``skipmq`` on its defaults (a data dir and ports given) from spawn until its MQTT
  port accepts a TCP connection and until ``/readyz`` answers 200;
* ``cluster``: ``--size`` brokers with mutual TLS spawned together with one seed list
  (tools/launcher, as the chart's pods start) until every ``/readyz`` answers 200;
* ``config``: a fresh interpreter importing the configuration loader and loading the defaults
  plus a TOML file and two SKIPMQ_* variables: the hand-written ``broker.config`` beside a
  pydantic-settings model of the same keys (generated from ``broker.config.KEYS``; TOML, env
  and init sources; skipped if pydantic-settings is not installed), and ``python -c pass``.

    .venv/bin/python bench/startup_bench.py --runs 10 [--size 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tools.launcher import LocalCluster, free_ports  # noqa: E402

SKIPMQ = str(Path(sys.executable).with_name("skipmq"))
TIMEOUT_S = 60.0

TOML = '[listeners.tcp]\nport = 1884\n[limits]\nmax_queued_messages = 500\n[logging]\nlevel = "warning"\n'
ENV = {"SKIPMQ_HTTP_PORT": "9191", "SKIPMQ_CLUSTER_TABLE_SIZE": "40"}

HAND_WRITTEN = """
from broker.config import load_config
c = load_config({path!r}, env={env!r})
assert c.listeners.tcp.port == 1884 and c.http.port == 9191 and c.cluster.table_size == 40
"""

# The same keys as a pydantic-settings model: nested BaseModels per section generated from
# broker.config.KEYS (type, default, bounds, choices), sources init > env > TOML > defaults.
# Env names need a nested delimiter other than "_" (keys contain "_"): SKIPMQ_HTTP__PORT.
PYDANTIC = """
from typing import Literal
from pydantic import ConfigDict, Field, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict, TomlConfigSettingsSource
from broker.config import KEYS

def build():
    tree = {{}}
    for name, spec in KEYS.items():
        node = tree
        *sections, leaf = name.split(".")
        for s in sections:
            node = node.setdefault(s, {{}})
        kind = Literal[spec.choices] if spec.choices else spec.kind
        node[leaf] = (kind, Field(spec.default, ge=spec.min_value, le=spec.max_value))
    def model(name, node):
        fields = {{}}
        for key, value in node.items():
            if isinstance(value, dict):
                sub = model(name + "_" + key, value)
                fields[key] = (sub, Field(default_factory=sub))
            else:
                fields[key] = value
        return create_model(name, __config__=ConfigDict(extra="forbid"), **fields)
    fields = {{}}
    for key, value in tree.items():
        if isinstance(value, dict):
            sub = model("S_" + key, value)
            fields[key] = (sub, Field(default_factory=sub))
        else:
            fields[key] = value

    class Base(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="SKIPMQ_", env_nested_delimiter="__", extra="forbid",
                                          toml_file={path!r})
        @classmethod
        def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                       file_secret_settings):
            return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))
    return create_model("Settings", __base__=Base, **fields)

import os
os.environ.update({{k.replace("SKIPMQ_HTTP_PORT", "SKIPMQ_HTTP__PORT").replace(
    "SKIPMQ_CLUSTER_TABLE_SIZE", "SKIPMQ_CLUSTER__TABLE_SIZE"): v for k, v in {env!r}.items()}})
c = build()()
assert c.listeners.tcp.port == 1884 and c.http.port == 9191 and c.cluster.table_size == 40, c
"""


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {"median_s": statistics.median(ordered), "p90_s": p90, "min_s": ordered[0], "runs": len(ordered)}


def http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1.0) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def wait_for(check: Callable[[], bool], what: str, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the broker exited with {process.returncode}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.005)
    raise RuntimeError(f"{what}: not within {TIMEOUT_S} s")


def tcp_accepts(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True


def single_run() -> tuple[float, float]:
    mqtt, http = free_ports(2)
    with tempfile.TemporaryDirectory(prefix="skipmq-startup-") as data:
        start = time.perf_counter()
        process = subprocess.Popen(
            [SKIPMQ, "--data-dir", data, "--port", str(mqtt), "--http-port", str(http)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if not k.startswith("SKIPMQ_")},
        )
        try:
            wait_for(lambda: tcp_accepts(mqtt), "MQTT port", process)
            listening = time.perf_counter() - start
            wait_for(lambda: http_status(http, "/readyz") == 200, "/readyz", process)
            ready = time.perf_counter() - start
        finally:
            process.terminate()
            process.wait(timeout=30)
    return listening, ready


def cluster_run(size: int) -> float:
    with tempfile.TemporaryDirectory(prefix="skipmq-startup-cluster-") as root:
        cluster = LocalCluster(size, data_root=root)
        try:
            start = time.perf_counter()
            cluster.start_together()
            for broker in cluster.brokers:
                ready = lambda b=broker: http_status(b.http_port, "/readyz") == 200  # noqa: E731
                wait_for(ready, f"broker {broker.index}")
            return time.perf_counter() - start
        finally:
            cluster.close()


def config_run(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--size", type=int, default=3, help="brokers in the clustered start (default 3)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "skipmq.toml")
        Path(path).write_text(TOML)
        codes = {"python -c pass": "pass", "broker.config": HAND_WRITTEN.format(path=path, env=ENV)}
        try:
            import pydantic_settings  # noqa: F401

            codes["import pydantic_settings only"] = "import pydantic_settings"
            codes["pydantic-settings model of KEYS"] = textwrap.dedent(PYDANTIC.format(path=path, env=ENV))
        except ImportError:
            print("pydantic-settings not installed: its column is skipped", file=sys.stderr)
        samples: dict[str, list[float]] = {name: [] for name in codes}
        samples.update({"single: MQTT port accepts": [], "single: /readyz 200": []})
        samples[f"cluster of {args.size} with mTLS: every /readyz 200"] = []
        for run in range(args.runs):
            for name, code in codes.items():  # interleaved: the machine's noise hits all alike
                samples[name].append(config_run(code))
            listening, ready = single_run()
            samples["single: MQTT port accepts"].append(listening)
            samples["single: /readyz 200"].append(ready)
            samples[f"cluster of {args.size} with mTLS: every /readyz 200"].append(cluster_run(args.size))
            print(f"run {run + 1}/{args.runs} done", file=sys.stderr, flush=True)

    figures = {name: percentiles(values) for name, values in samples.items()}
    width = max(len(name) for name in figures)
    print(f"{'measure':<{width}}  median s   p90 s    min s")
    for name, fig in figures.items():
        print(f"{name:<{width}}  {fig['median_s']:8.3f} {fig['p90_s']:8.3f} {fig['min_s']:8.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": figures, "cpus": os.cpu_count()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
