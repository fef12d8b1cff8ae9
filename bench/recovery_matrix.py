"""The recovery matrix: every fault x QoS {1, 2} under a fast stream, real processes, default limits.

Each cell starts a fresh 3-broker cluster (real ``python -m broker`` processes, mutual TLS between
them as the launcher sets up, no limit raised) with a persistent paho-mqtt publisher on broker A
and a persistent subscriber on broker B (MQTT 5, clean start 0, session expiry 600 s; mosquitto_sub,
or paho in a process of its own where the session moves: --subscriber),
streams ``--messages`` or more ids at ``--rate`` per second with ``--window`` unacknowledged at
most, and injects one fault halfway (tests/support/recovery_cells.py says exactly how):

  none        the control: no fault (does the subscriber keep up with the live stream here?)
  kill-sub    kill -9 of B (the subscriber's broker), restarted after --down-s on its data
  kill-pub    kill -9 of A (the publisher's broker); QoS 1: the publisher goes on at C at once,
              QoS 2: it comes back to A after the restart (its session holds the packet ids)
  kill-third  kill -9 of C (neither's broker), restarted after --down-s
  move        the subscriber disconnects and connects to C --down-s later (session present)
  netsplit    network namespaces (tools/netns.py, root needed): A, C | B for --split-s, heal

Counted per cell: acknowledged (PUBACK / PUBCOMP received), lost (acknowledged, never received
after --drain-s), duplicates, the acknowledged rate outside the fault window, the publisher's
most unacknowledged publishes seen, the QoS 1 duplicate bound (what may be in flight at the
fault), what the brokers dropped by queue policy (``skipmq_messages_dropped_total``, queue full,
read from each broker before it is killed and at the end: a subscriber slower than the live
stream drops so on one broker too; the ``none`` control shows whether the subscriber keeps up on
this machine at all) and, in the table's ``beyond`` column, what was lost beyond those drops.
A cell passes with 0 lost and, QoS 2, 0 duplicates, QoS 1, duplicates <= the bound, with at least
--messages acknowledged at --min-rate or more outside the fault (the rate is measured from the first
publish to the last acknowledgement, the fault's seconds and what was acknowledged in them left
out): a cell that ran slower than the issue's 2,000 msg/s does not show the guarantee at that rate
and fails, saying so. ``--subscriber`` takes a comma list: each cell runs with each client
(``mosquitto,paho-process``: both clients written outside the project).

Progress lines go to stderr; a table to stdout at the end; the JSON summary (machine, load,
parameters, cells) to --out. Exit status 1 when a cell fails.

    .venv/bin/python -m bench.recovery_matrix --out docs/recovery_matrix_2000.json
    .venv/bin/python -m bench.recovery_matrix --faults kill-sub,move --qos 2 --messages 20000

``--fast-detection`` (on by default) uses the cluster tests' failure detection
(``cluster.ping_interval_ms`` 500, ``cluster.failure_timeout_ms`` 2000, tests/process/cluster/
conftest.py FAST_SETTINGS) so that a kill is noticed in 2 s; ``--no-fast-detection`` runs the
defaults. Neither is a delivery limit.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from tests.process.cluster.conftest import FAST_SETTINGS
from tests.support.recovery_cells import (
    FAULTS,
    SUBSCRIBERS,
    CellParams,
    CellResult,
    run_cell,
    subscriber_kind,
)
from tools.netns import unavailable_reason


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.recovery_matrix",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Cells and counting: tests/support/recovery_cells.py. Figures: docs/cluster.md.",
    )
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma list of {', '.join(FAULTS)} (default all); a+b chains two faults under one stream",
    )
    parser.add_argument("--qos", default="1,2", help="comma list of QoS levels (default 1,2)")
    parser.add_argument(
        "--messages", type=int, default=5_000, help="at least this many ids per cell (default 5000)"
    )
    parser.add_argument("--rate", type=float, default=2_000.0, help="publishes per second (default 2000)")
    parser.add_argument(
        "--min-rate", type=float, default=2_000.0,
        help="a cell fails when its acknowledged rate outside the fault is below this"
        " (default 2000; 0: no check)",
    )  # fmt: skip
    parser.add_argument(
        "--window", type=int, default=100, help="unacknowledged publishes at most (default 100)"
    )
    parser.add_argument("--down-s", type=float, default=3.0, help="a killed broker / moving session away (3)")
    parser.add_argument("--split-s", type=float, default=30.0, help="netsplit length in seconds (default 30)")
    parser.add_argument(
        "--drain-s", type=float, default=60.0, help="bound on the last messages arriving (60)"
    )
    parser.add_argument(
        "--fast-detection", action=argparse.BooleanOptionalAction, default=True,
        help="the cluster tests' failure detection (500 ms pings, 2 s timeout); default on",
    )  # fmt: skip
    parser.add_argument(
        "--subscriber", default="mosquitto",
        help="comma list, each cell runs with each; mosquitto: mosquitto_sub (drains 2,000 QoS 2"
        " msg/s on 2 cores; a move cell takes paho-process, as mosquitto_sub cannot change broker);"
        " paho-process: paho in a process of its own; paho: a paho client in the bench's process"
        " beside the publisher; auto: paho-process at"
        " QoS 2 (libmosquitto 2.0.11 mishandles a QoS 2 PUBLISH sent again after a kill of its broker),"
        " mosquitto at QoS 1. Default mosquitto: paho-process did not keep up with the QoS 2 control"
        " at load 20-23 (docs/notes/recovery.md, 2026-11-29 qos2out)",
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the whole matrix (interleaved)")
    parser.add_argument("--out", default="", help="write the JSON summary here")
    parser.add_argument(
        "--keep", default="", help="keep each cell's data and broker logs under this directory"
    )
    return parser


def machine() -> dict[str, Any]:
    lscpu = ""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        pass
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if "Model name" in line), "")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip() or os.environ.get("BENCH_COMMIT", "")  # (a git archive copy has no .git;
    # not SKIPMQ_*: the broker refuses an environment variable of that prefix that is no key)
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version(), "commit": commit}


def table(cells: list[CellResult]) -> str:
    head = (
        f"{'fault':<11} {'QoS':>3} {'acked':>7} {'lost':>5} {'beyond':>6} {'dups':>5} {'bound':>5}"
        f" {'max unacked':>11}"
        f" {'msg/s':>6} {'fault s':>7} {'dropped':>7} {'load':>5} {'subscriber':>12}  result"
    )
    rows = [head, "-" * len(head)]
    for c in cells:
        verdict = "pass" if c.passed else f"FAIL: {'; '.join(c.shortfalls)}"
        rows.append(
            f"{c.fault:<11} {c.qos:>3} {c.acknowledged:>7} {c.lost:>5} {c.lost_beyond_policy:>6}"
            f" {c.duplicates:>5}"
            f" {c.duplicate_bound if c.qos == 1 else 0:>5} {c.max_unacknowledged:>11}"
            f" {c.rate_outside_fault_per_s:>6.0f} {c.fault_s:>7.1f} {c.dropped_by_policy:>7}"
            f" {c.load_after:>5.1f} {c.subscriber:>12}  {verdict}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    for fault in faults:
        if any(step not in FAULTS for step in fault.split("+")):
            raise SystemExit(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    qos_levels = [int(q) for q in args.qos.split(",") if q.strip()]
    subscribers = [s.strip() for s in args.subscriber.split(",") if s.strip()]
    for wanted in subscribers:
        if wanted not in SUBSCRIBERS:
            raise SystemExit(f"unknown subscriber {wanted!r}; one of {', '.join(SUBSCRIBERS)}")
    if (
        any("netsplit" in fault.split("+") for fault in faults)
        and (reason := unavailable_reason()) is not None
    ):
        raise SystemExit(f"netsplit needs network namespaces: {reason} (leave it out with --faults)")
    params = CellParams(
        messages=args.messages, rate_per_s=args.rate, window=args.window, down_s=args.down_s,
        split_s=args.split_s, drain_s=args.drain_s,
        settings=dict(FAST_SETTINGS) if args.fast_detection else {}, subscriber=subscribers[0],
        min_messages=args.messages, min_rate_per_s=args.min_rate,
    )  # fmt: skip

    def progress(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    cells: list[CellResult] = []
    started = time.time()
    host = machine()  # (the commit the run starts on)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="skipmq-recovery-matrix-"))
    plan: list[tuple[str, int, str]] = []
    for _ in range(args.repeat):
        for fault in faults:
            for qos in qos_levels:
                kinds = {subscriber_kind(wanted, fault.split("+"), qos): wanted for wanted in subscribers}
                plan.extend((fault, qos, wanted) for wanted in kinds.values())  # one cell per client
    for number, (fault, qos, wanted) in enumerate(plan, 1):
        progress(f"cell {number}/{len(plan)}: {fault}, QoS {qos}, {wanted} (load {os.getloadavg()[0]:.1f})")
        cell_params = dataclasses.replace(params, subscriber=wanted)
        try:
            cell_dir = root / f"{number:02d}-{fault}-q{qos}-{wanted}"
            result = run_cell(fault, qos, cell_params, cell_dir, progress)
        except Exception as exc:  # a cell that could not run is reported, the others still run
            result = CellResult(
                fault=fault, qos=qos, acknowledged=0, lost=0, duplicates=0, duplicated_ids=0, most_copies=0,
                duplicate_bound=0, max_unacknowledged=0, rate_outside_fault_per_s=0.0, rate_overall_per_s=0.0,
                fault_s=0.0, stream_s=0.0, session_present=False, dropped_by_policy=0, load_before=0.0,
                load_after=os.getloadavg()[0], lost_sample=[], error=f"{type(exc).__name__}: {exc}",
                subscriber=wanted,
            )  # fmt: skip
        cells.append(result)
        progress(
            f"cell {number}/{len(plan)}: {fault} QoS {qos}: acked {result.acknowledged}, lost {result.lost},"
            f" duplicates {result.duplicates}, {result.rate_outside_fault_per_s:.0f} msg/s,"
            + (
                f" lost ids {min(result.lost_sample)}-{result.lost_max} (ids sent at the fault:"
                f" {result.sent_at_fault}), dropped by policy {result.dropped_by_policy},"
                if result.lost
                else ""
            )
            + f" {'pass' if result.passed else 'FAIL: ' + '; '.join(result.shortfalls)}"
        )
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    print(table(cells))
    summary = {
        "command": "python -m bench.recovery_matrix " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "machine": host,
        "parameters": {**vars(args), "settings": params.settings},
        "cells": [c.as_dict() for c in cells],
        "all_passed": all(c.passed for c in cells),
    }
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
        progress(f"summary: {args.out}")
    return 0 if summary["all_passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
