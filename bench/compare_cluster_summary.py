"""Summarize a ``compare_revisions.py --raw-json`` file of ``cluster_bench.py`` runs (by hand).

``compare_revisions.py`` flattens each run's JSON by path, and ``cluster_bench.py``'s records
(``main[i]``) carry no name, so its own report is per record index. This groups the records of
every run by configuration (``brokers``: 0 = standalone, clustering off) and measurement (latency,
QoS 0, QoS 1 throughput), pools all measurements of a revision (outer rounds x the benchmark's own
rounds) and prints, per metric, the median of each revision, its min-max and the ratio B/A.

    .venv/bin/python bench/compare_cluster_summary.py RAW.json [--before A --after B] [--labels A,B]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

LABELS = {0: "standalone", 1: "1-broker cluster"}
METRICS = {
    "latency": [("all.p50_ms", "p50 ms (all subscribers)"), ("all.p99_ms", "p99 ms (all subscribers)"),
                ("remote.p50_ms", "p50 ms (other brokers)"), ("remote.p99_ms", "p99 ms (other brokers)"),
                ("broker_cpu_us_per_publish", "paced: broker CPU us per message published")],
    "qos0": [("delivered_per_s", "QoS 0 delivered/s"),
             ("broker_cpu_us_per_msg", "QoS 0 broker CPU us/delivery"),
             ("broker_cpu_pct", "QoS 0 broker CPU % of one core")],
    "qos1": [("delivered_per_s", "QoS 1 delivered/s"),
             ("broker_cpu_us_per_msg", "QoS 1 broker CPU us/delivery"),
             ("broker_cpu_pct", "QoS 1 broker CPU % of one core"),
             ("puback_p50_ms", "QoS 1 PUBACK p50 ms"), ("puback_p99_ms", "QoS 1 PUBACK p99 ms")],
}  # fmt: skip
RECORD = re.compile(r"^main\[(\d+)\]\.(.+)$")


def records(run: dict[str, float]) -> list[dict[str, float]]:
    by_index: dict[int, dict[str, float]] = defaultdict(dict)
    for path, value in run.items():
        match = RECORD.match(path)
        if match:
            by_index[int(match.group(1))][match.group(2)] = value
    return [by_index[i] for i in sorted(by_index)]


def kind_of(record: dict[str, float]) -> str:
    if "all.p50_ms" in record:
        return "latency"
    return "qos0" if record.get("qos") == 0 else "qos1"


def pooled(runs: list[dict[str, float]]) -> dict[tuple[int, str, str], list[float]]:
    out: dict[tuple[int, str, str], list[float]] = defaultdict(list)
    for run in runs:
        for record in records(run):
            kind = kind_of(record)
            for key, _label in METRICS[kind]:
                if key in record:
                    out[(int(record["brokers"]), kind, key)].append(record[key])
            out[(int(record["brokers"]), "load", "1min")].append(record.get("loadavg[0]", float("nan")))
    return out


def fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("raw_json")
    parser.add_argument("--before", default=None, help="revision A as named in the file (default: first)")
    parser.add_argument("--after", default=None, help="revision B as named in the file (default: second)")
    parser.add_argument(
        "--labels", default=None, help="column names for A,B (e.g. f97ec9a,49349c7 when B was HEAD)"
    )
    args = parser.parse_args()
    raw: dict[str, list[dict[str, float]]] = json.loads(Path(args.raw_json).read_text())
    names = list(raw)
    first = args.before or names[0]
    second = args.after or names[1]
    a, b = pooled(raw[first]), pooled(raw[second])
    if args.labels:
        first, second = args.labels.split(",")
    counts = {len(v) for p in (a, b) for k, v in p.items() if k[1] != "load"}
    print(f"n = {'/'.join(str(c) for c in sorted(counts))} measurements per revision and row\n")
    print(f"| setup | metric | {first}: median (min-max) | {second}: median (min-max) | {second}/{first} |")
    print("|---|---|---:|---:|---:|")
    for brokers in sorted({k[0] for k in a}):
        label = LABELS.get(brokers, f"{brokers} brokers")
        for kind, metrics in METRICS.items():
            for key, text in metrics:
                va, vb = a.get((brokers, kind, key)), b.get((brokers, kind, key))
                if not va or not vb:
                    continue
                ma, mb = statistics.median(va), statistics.median(vb)
                print(
                    f"| {label} | {text} | {fmt(ma)} ({fmt(min(va))}-{fmt(max(va))})"
                    f" | {fmt(mb)} ({fmt(min(vb))}-{fmt(max(vb))}) | {mb / ma:.2f} |"
                )
    loads = [x for p in (a, b) for (k, kind, _), v in p.items() if kind == "load" for x in v]
    if loads:
        print(
            f"\n1-minute load average at the start of each measurement: {min(loads):.2f}-{max(loads):.2f}"
            f" (median {statistics.median(loads):.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
