"""Side-by-side benchmark of two git revisions of SkipMQ in ONE run (run by hand; not part of CI).

This machine is noisy, so a "before/after" figure is only worth something when both revisions
are measured in the same run, interleaved: round 1 runs the benchmark of revision A then of
revision B, round 2 runs B then A, and so on. Each revision runs from its own git worktree (its
own ``bench/`` script and its own broker code: the benchmarks start brokers with
``PYTHONPATH=<their repository root>``), all with this checkout's virtualenv. Every benchmark
writes a results JSON; numeric leaves are flattened to paths (``scenarios.qos0_1to1.rate``)
and the report gives, per path, the median over rounds of each revision and the ratio B/A.

    .venv/bin/python bench/compare_revisions.py --help
    .venv/bin/python bench/compare_revisions.py --before 2e4340a --after HEAD --rounds 3 \\
        --bench "bench/broker_bench.py --brokers skipmq --quick --no-idle --json {json} --png {png}" \\
        --keys 'rate|cpu|p50'

``{json}`` and ``{png}`` in the command are replaced with per-run paths in a temporary directory.
The report (markdown) goes to stdout and, with ``--out``, to a file; the raw rounds to
``--raw-json``.

``--quick`` is the side-by-side check for a change to the publish path (under 3 minutes on 2
cores): THIS checkout's ``bench/broker_bench.py`` drives the broker of each revision
(``--broker-root``: the same load client for both, so an old revision needs no benchmark of its
own) through QoS 0 1->1, QoS 1 1->1 and QoS 0 1->100 for 2 s each and the paced latency runs, 3
interleaved rounds; ``--callgrind`` adds ``bench/publish_cost.py`` per revision (instructions per
delivery in lock step, repeatable on a shared machine; about a minute per revision):

    .venv/bin/python bench/compare_revisions.py --quick --before main --after HEAD
    .venv/bin/python bench/compare_revisions.py --quick --callgrind --before main
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def flatten(value: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON value by dotted path (list items by index, or by a "name" field)."""
    out: dict[str, float] = {}
    if isinstance(value, bool):
        return out
    if isinstance(value, int | float):
        out[prefix or "value"] = float(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            label = str(index)
            if isinstance(item, dict):
                for name_key in ("name", "scenario", "label", "config"):
                    if isinstance(item.get(name_key), str | int):
                        label = str(item[name_key])
                        break
            out.update(flatten(item, f"{prefix}[{label}]"))
    return out


def add_worktree(rev: str, where: Path) -> Path:
    path = where / re.sub(r"[^A-Za-z0-9_.-]", "_", rev)
    subprocess.run(
        ["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", "--force", str(path), rev],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return path


def remove_worktree(path: Path) -> None:
    subprocess.run(
        ["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(path)],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


QUICK_SCENARIOS = "'qos0 1->1,qos1 1->1,qos0 1->100'"
QUICK_BENCH = (
    f"bench/broker_bench.py --brokers skipmq --broker-root {{root}} --scenarios {QUICK_SCENARIOS} "
    "--noise-subscriptions 0 --no-idle --duration 2 --quick --json {json} --png {png}"
)
QUICK_KEYS = "msgs_per_s|cpu_us|p50_ms|p99_ms"
CALLGRIND_BENCH = (
    "bench/publish_cost.py --broker-root {root} --scenarios 'qos0 1->1,qos1 1->1,qos0 1->100' --json {json}"
)


def run_once(
    worktree: Path, command: str, scratch: Path, tag: str, timeout_s: float, *, script_here: bool = False
) -> dict[str, float]:
    """Run the benchmark for one revision; ``script_here``: this checkout's script, with the
    revision's tree passed in as ``{root}``."""
    json_path = scratch / f"{tag}.json"
    png_path = scratch / f"{tag}.png"
    argv = shlex.split(command.format(json=json_path, png=png_path, root=worktree))
    if argv and argv[0].endswith(".py"):
        argv = [sys.executable, str((REPO_ROOT if script_here else worktree) / argv[0]), *argv[1:]]
    env = dict(os.environ, PYTHONPATH=str(worktree))
    log_path = scratch / f"{tag}.log"
    with log_path.open("w") as log:
        proc = subprocess.run(
            argv, cwd=worktree, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
        )
    if proc.returncode != 0 or not json_path.exists():
        tail = log_path.read_text().splitlines()[-20:]
        raise RuntimeError(f"{tag}: exit {proc.returncode}\n" + "\n".join(tail))
    return flatten(json.loads(json_path.read_text()))


def report(revs: list[str], rounds: dict[str, list[dict[str, float]]], keys: str | None) -> str:
    pattern = re.compile(keys) if keys else None
    first, second = revs
    paths = sorted(set.intersection(*(set(r) for rev in revs for r in rounds[rev])))
    lines = [
        f"| metric | {first} (median of {len(rounds[first])}) | {second} (median of {len(rounds[second])}) "
        f"| {second}/{first} |",
        "|---|---|---|---|",
    ]
    for path in paths:
        if pattern is not None and not pattern.search(path):
            continue
        a = statistics.median(r[path] for r in rounds[first])
        b = statistics.median(r[path] for r in rounds[second])
        constant = all(r[path] == a for rev in revs for r in rounds[rev])
        if constant and pattern is None:
            continue  # settings and counts that are the same everywhere say nothing
        ratio = f"{b / a:.3f}" if a else "-"
        lines.append(f"| {path} | {a:.4g} | {b:.4g} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run one benchmark against two git revisions, interleaved, and compare medians.",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--before", required=True, help="revision A (e.g. a commit id)")
    parser.add_argument("--after", default="HEAD", help="revision B (default HEAD)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument(
        "--bench",
        default=None,
        help="the benchmark command, run from each worktree; must write JSON to {json}",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the publish-path check in under 3 minutes (see below); --bench/--keys/--rounds preset",
    )
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="with --quick: also instructions per delivery (bench/publish_cost.py) once per revision",
    )
    parser.add_argument(
        "--keys",
        default=None,
        help="regex: report only metric paths matching it (default: every path whose value varies)",
    )
    parser.add_argument(
        "--realtime",
        action="store_true",
        help="with --quick: the paced latency runs as SCHED_FIFO (broker_bench.py --latency-realtime; "
        "root), so that a shared machine's other jobs do not decide the p99",
    )
    parser.add_argument(
        "--script-here",
        action="store_true",
        help="run the --bench script from THIS checkout for both revisions (with --broker-root {root} "
        "in the command, the same load client drives both brokers; --quick does this)",
    )
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per benchmark run (default 1800)")
    parser.add_argument("--out", default=None, help="also write the markdown report here")
    parser.add_argument("--raw-json", default=None, help="write every round's flattened results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.bench = args.bench or QUICK_BENCH + (" --latency-realtime" if args.realtime else "")
        args.keys = args.keys or QUICK_KEYS
    elif args.bench is None:
        parser.error("--bench is required (or --quick)")
    script_here = args.quick or args.script_here

    with tempfile.TemporaryDirectory(prefix="skipmq-compare-") as tmp:
        scratch = Path(tmp)
        revs = [args.before, args.after]
        trees = {rev: add_worktree(rev, scratch) for rev in revs}
        rounds: dict[str, list[dict[str, float]]] = {rev: [] for rev in revs}
        started = time.monotonic()
        try:
            for index in range(args.rounds):
                order = revs if index % 2 == 0 else list(reversed(revs))
                for rev in order:
                    load = os.getloadavg()[0]
                    print(f"round {index + 1}/{args.rounds}: {rev} (load {load:.2f}) ...", file=sys.stderr)
                    tag = f"r{index}-{re.sub(r'[^A-Za-z0-9]', '_', rev)}"
                    rounds[rev].append(
                        run_once(
                            trees[rev], args.bench, scratch, tag, args.timeout_s, script_here=script_here
                        )
                    )
            if args.quick and args.callgrind:
                for rev in revs:
                    print(f"callgrind: {rev} ...", file=sys.stderr)
                    counts = run_once(
                        trees[rev],
                        CALLGRIND_BENCH,
                        scratch,
                        "cg-" + re.sub(r"[^A-Za-z0-9]", "_", rev),
                        args.timeout_s,
                        script_here=True,
                    )
                    for rev_round in rounds[rev]:
                        rev_round.update(
                            {key: value for key, value in counts.items() if "per_delivery" in key}
                        )
        finally:
            for tree in trees.values():
                remove_worktree(tree)
        elapsed = time.monotonic() - started
    keys = args.keys + "|instructions_per_delivery" if args.quick and args.callgrind else args.keys
    text = report(revs, rounds, keys)
    header = (
        f"`{args.bench}`: {args.rounds} interleaved rounds, {elapsed / 60:.1f} min, "
        f"{os.cpu_count()} CPUs, load average now {os.getloadavg()[0]:.2f}\n\n"
    )
    print(header + text)
    if args.out:
        Path(args.out).write_text(header + text + "\n")
    if args.raw_json:
        Path(args.raw_json).write_text(json.dumps(rounds, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
