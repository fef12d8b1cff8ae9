"""What the brokers cost when nothing is published: the fixed part of a paced run's CPU per message.

`bench/cluster_bench.py`'s paced runs divide every broker's CPU during the run by the messages
published; at 100 msg/s that includes what the brokers spend with nothing to forward (the
overlay's pings and maintenance, the cluster's ticks, link keepalives, the metrics and store
timers). This bench starts the same configurations as cluster_bench (the same set-up code: one
publisher on broker 0, subscribers round-robin, warmed up until every subscriber got a probe) and
measures each broker's CPU and context switches per second while nobody publishes, configurations
interleaved in each round. At a paced rate of R msg/s a configuration's idle CPU per second adds
``idle / R`` to its CPU per message.

    .venv/bin/python bench/link_idle_bench.py --brokers 1,3 --rounds 3 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cluster_bench as cb

from tools.proc_stats import context_switches


async def run(args: argparse.Namespace) -> dict[str, Any]:
    configs = ([cb.STANDALONE] if not args.no_standalone else []) + args.brokers
    setups: list[cb.Setup] = []
    rows: dict[str, list[dict[str, Any]]] = {}
    try:
        for brokers in configs:
            setup = await cb.start_setup(brokers, {})
            setups.append(setup)
            await cb.connect_publisher(setup)
            count = max(1, abs(brokers))
            for j in range(args.subscribers):
                await cb.add_subscriber(setup, j % count)
            await cb.warm_up(setup)
            cb.log(f"{setup.label}: warmed up")
        await asyncio.sleep(args.settle_s)  # past the probes' own work
        for round_index in range(args.rounds):
            order = setups[round_index % len(setups) :] + setups[: round_index % len(setups)]
            for setup in order:
                load = os.getloadavg()[0]
                cpu_before = [cb.process_cpu_s(pid) for pid in setup.pids]
                switches_before = [context_switches(pid) for pid in setup.pids]
                start = time.monotonic()
                await asyncio.sleep(args.seconds)
                elapsed = time.monotonic() - start
                cpu_ms = [
                    (cb.process_cpu_s(pid) - before) * 1e3 / elapsed
                    for pid, before in zip(setup.pids, cpu_before, strict=True)
                ]
                switches = [
                    (context_switches(pid) - before) / elapsed
                    for pid, before in zip(setup.pids, switches_before, strict=True)
                ]
                row = {
                    "round": round_index,
                    "load": round(load, 2),
                    "cpu_ms_per_s": cpu_ms,
                    "switches_per_s": switches,
                }
                rows.setdefault(setup.label, []).append(row)
                cb.log(
                    f"round {round_index + 1}/{args.rounds} {setup.label:11s}: idle CPU"
                    f" {sum(cpu_ms):.1f} ms/s ({'/'.join(f'{x:.1f}' for x in cpu_ms)}),"
                    f" {sum(switches):.0f} context switches/s [load {load:.1f}]"
                )
    finally:
        for setup in setups:
            setup.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--brokers", type=cb._int_list, default=[1, 3], help="cluster sizes (default 1,3)")
    parser.add_argument("--no-standalone", action="store_true", help="skip the clustering-off broker")
    parser.add_argument("--subscribers", type=int, default=10, help="subscribers, round-robin (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--seconds", type=float, default=10.0, help="idle seconds measured (default 10)")
    parser.add_argument("--settle-s", type=float, default=3.0, help="wait after the warm-up (default 3)")
    parser.add_argument("--json", help="write every round here")
    args = parser.parse_args(argv)
    try:
        import uvloop

        rows = uvloop.run(run(args))
    except ImportError:
        rows = asyncio.run(run(args))
    print(
        "\n| configuration, nothing published | broker CPU (ms per s), median"
        " | per broker | context switches per s |"
    )
    print("|---|---:|---:|---:|")
    for label, runs in rows.items():
        total = statistics.median(sum(r["cpu_ms_per_s"]) for r in runs)
        each = [
            statistics.median(r["cpu_ms_per_s"][i] for r in runs) for i in range(len(runs[0]["cpu_ms_per_s"]))
        ]
        switches = statistics.median(sum(r["switches_per_s"]) for r in runs)
        print(f"| {label} | {total:.1f} | {' / '.join(f'{x:.1f}' for x in each)} | {switches:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
