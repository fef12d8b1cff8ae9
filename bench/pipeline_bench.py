"""How many snapshot rows per second the pipeline job sustains in local[2] (issue #13, by hand).

Fills the MQTT source's spool with synthetic per-class snapshot rows (``--brokers`` x ``--classes``
rows per second of event time, ``--seconds`` of it) and runs the job as ``skipmq-pipeline`` does
(Spark's windowed aggregation, the findings, the Parquet sink) until every window is written. The
source's MQTT clients point at a closed port, so the reader starts after its 15 s settle wait.
Prints the rows processed per second of micro-batch time (Spark's own progress figures), per core.

    .venv/bin/python bench/pipeline_bench.py --classes 200 --seconds 120
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from pipeline.job import JobConfig, start_job
from pipeline.records import COUNTERS, HOP_COLUMNS
from pipeline.session import build_session


def fill_spool(path: Path, brokers: int, classes: int, seconds: int, start_s: float) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = 0
    with path.open("w") as handle:
        for second in range(seconds):
            for broker in range(brokers):
                for cls in range(classes):
                    record = {
                        "broker": f"b{broker}",
                        "ts": start_s + second + broker * 0.1,
                        "seq": second + 1,
                        "interval_s": 1.0,
                        "table_size": 60,
                        "class": f"=c{cls}",
                        "subscriber_brokers": 1 + (cls % 3),
                        "subscriber_brokers_before": 1 + (cls % 3),
                        "queued_messages": 0,
                        "connections": 10,
                    }
                    for name in COUNTERS:
                        record[f"{name}_delta"] = (cls % 7) + broker
                    for index in range(HOP_COLUMNS):
                        record[f"hops_{index}"] = 1 if index == 0 else 0
                    handle.write(json.dumps(record) + "\n")
                    rows += 1
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--classes", type=int, default=200)
    parser.add_argument("--seconds", type=int, default=120, help="seconds of event time")
    parser.add_argument("--window", default="10 seconds")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="pipeline-bench-"))
    start_s = time.time() - args.seconds - 60
    rows = fill_spool(
        out / "_checkpoints" / "spool" / "snapshots.jsonl", args.brokers, args.classes, args.seconds, start_s
    )
    spark = build_session("local[2]", app_name="skipmq-pipeline-bench")
    config = JobConfig(
        out=str(out),
        mqtt=[("127.0.0.1", 1)],
        window=args.window,
        watermark="5 seconds",
        trigger="1 second",
        mqtt_findings=False,
    )
    job = start_job(spark, config)
    query = job.queries[0]
    deadline = time.monotonic() + 900
    processed = 0
    while time.monotonic() < deadline:
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        processed = sum(p["numInputRows"] for p in progress)
        if processed >= rows and not query.status["isDataAvailable"] and (out / "class_windows").exists():
            break
        time.sleep(2)
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    busy_s = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000.0
    job.stop()
    spark.stop()
    cores = 2
    print(
        json.dumps(
            {
                "rows": rows,
                "processed": processed,
                "batches_with_input": len(progress),
                "batch_time_s": round(busy_s, 2),
                "rows_per_s": round(processed / busy_s, 1) if busy_s else None,
                "rows_per_s_per_core": round(processed / busy_s / cores, 1) if busy_s else None,
                "cpus": os.cpu_count(),
                "load_avg_1m": os.getloadavg()[0],
            }
        )
    )
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
