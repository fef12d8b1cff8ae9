"""End-to-end lag of the pipeline job: from a metric change at a broker to its window in Parquet
(issue #13, by hand).

Runs the job as ``skipmq-pipeline`` does (local[2] by default) against running brokers that publish
per-class snapshots (``cluster.class_snapshot_interval_s`` > 0), and ``--changes`` times: a new class
(topic ``lagbench-<run>-<k>/a``) suddenly starts being published at ``--rate``/s on the first broker
(t_change = its first publish), and the bench polls ``<out>/class_windows`` until a row of that class
with publishes > 0 appears (t_seen: the Parquet file is on disk). Lag = t_seen - t_change. Changes
are spaced ``--gap-s`` apart (random phase within the window, seeded) so they fall at different
points of their windows. Prints one JSON line per change and a summary (p50, max, the lower bound
the settings imply).

    .venv/bin/skipmq --port 28001 --http-port 28002 --cluster-port 28003 \\
        --set cluster.class_snapshot_interval_s=1 &
    .venv/bin/python bench/pipeline_lag_bench.py --mqtt 127.0.0.1:28001 --changes 6
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
import pandas as pd
import pyarrow.parquet as pq

from pipeline.job import JobConfig, start_job
from pipeline.session import build_session


def _seconds(text: str) -> float:
    amount, unit = text.split()
    return float(amount) * {"second": 1, "seconds": 1, "minute": 60, "minutes": 60}[unit]


class Seen:
    """Polls ``<out>/class_windows`` for new Parquet files; remembers when a class first had publishes."""

    def __init__(self, out: Path) -> None:
        self.root = out / "class_windows"
        self.files: set[Path] = set()
        # class name -> (time first seen with publishes > 0, end of that row's window, epoch s)
        self.first: dict[str, tuple[float, float]] = {}

    def poll(self) -> None:
        if not self.root.exists():
            return
        for path in self.root.glob("date=*/window=*/*.parquet"):
            if path in self.files:
                continue
            now = time.time()
            try:
                table = pq.read_table(path, columns=["class", "publishes", "window_end"]).to_pandas()
            except Exception:  # a file being written: read it next time
                continue
            self.files.add(path)
            rows = table[table["publishes"] > 0]
            for cls, end in zip(rows["class"], pd.to_datetime(rows["window_end"], utc=True), strict=True):
                self.first.setdefault(str(cls), (now, end.timestamp()))

    def found(self, marker: str) -> tuple[float, float] | None:
        times = [seen for cls, seen in self.first.items() if marker in cls]
        return min(times) if times else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mqtt", required=True, help="HOST:PORT[,HOST:PORT...]; changes go to the first")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--changes", type=int, default=6)
    parser.add_argument("--rate", type=float, default=20.0, help="publishes/s of a changed class")
    parser.add_argument("--window", default="5 seconds")
    parser.add_argument("--watermark", default="2 seconds")
    parser.add_argument("--trigger", default="1 second")
    parser.add_argument(
        "--snapshot-interval-s", type=float, default=1.0, help="the brokers' setting (for the bound)"
    )
    parser.add_argument("--gap-s", type=float, default=0.0, help="between changes (default 3 windows)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per change")
    args = parser.parse_args()
    brokers = [(h, int(p)) for h, p in (b.rsplit(":", 1) for b in args.mqtt.split(","))]
    window_s, watermark_s, trigger_s = _seconds(args.window), _seconds(args.watermark), _seconds(args.trigger)
    gap_s = args.gap_s or 3 * window_s
    rng = random.Random(args.seed)
    out = Path(tempfile.mkdtemp(prefix="pipeline-lag-"))
    run = uuid.uuid4().hex[:6]
    spark = build_session(args.master, app_name="skipmq-pipeline-lag-bench")
    job = start_job(
        spark,
        JobConfig(
            out=str(out),
            mqtt=brokers,
            window=args.window,
            watermark=args.watermark,
            trigger=args.trigger,
            mqtt_findings=False,
            client_id=f"lagbench-{run}",
        ),
    )
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"lagbench-pub-{run}")
    client.connect(*brokers[0])
    client.loop_start()
    stop = threading.Event()
    seen = Seen(out)
    lags: list[float] = []
    batch_s: list[float] = []
    try:
        deadline = time.monotonic() + 180
        while any(q.lastProgress is None for q in job.queries) and time.monotonic() < deadline:
            time.sleep(0.5)
        print(json.dumps({"event": "job_running", "out": str(out)}), flush=True)
        for k in range(args.changes):
            # a random phase within the window, so the changes sample the whole window
            phase = rng.uniform(0, window_s)
            time.sleep(max(0.0, (time.time() // window_s + 1) * window_s + phase - time.time()))
            marker = f"lagbench-{run}-{k}"
            t_change = time.time()

            def publish(
                topic: str = f"{marker}/a", start: float = t_change, until: float = t_change + gap_s
            ) -> None:
                n = 0
                while not stop.is_set() and time.time() < until:
                    time.sleep(max(0.0, start + n / args.rate - time.time()))
                    client.publish(topic, b"x" * 32, 0)
                    n += 1

            threading.Thread(target=publish, daemon=True).start()
            found = None
            limit = time.monotonic() + args.timeout_s
            while found is None and time.monotonic() < limit:
                seen.poll()
                found = seen.found(marker)
                if found is None:
                    time.sleep(0.1)
            failure = job.failed()
            if failure:
                raise SystemExit(f"the job failed: {failure}")
            window_end = (t_change // window_s + 1) * window_s
            lag = None if found is None else round(found[0] - t_change, 2)
            # a change early in a window can first show in the window before: a snapshot's deltas
            # are spread evenly over its interval (ts - interval_s, ts], which may start there
            row_end = window_end if found is None else found[1]
            print(
                json.dumps(
                    {
                        "change": k,
                        "lag_s": lag,
                        "into_window_s": round(t_change - window_end + window_s, 2),
                        "first_in_window_ending_s": round(row_end - window_end, 2),
                        "bound_s": round(max(0.0, row_end - t_change) + watermark_s, 2),
                        "after_window_end_s": None if found is None else round(found[0] - row_end, 2),
                    }
                ),
                flush=True,
            )
            if lag is not None:
                lags.append(lag)
        for query in job.queries:
            progress = [p for p in query.recentProgress if p["numInputRows"]]
            batch_s += [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    finally:
        stop.set()
        client.loop_stop()
        client.disconnect()
        job.stop()
        spark.stop()
        shutil.rmtree(out, ignore_errors=True)
    # the window containing the change is emitted once a snapshot stamped at or after its end + the
    # watermark has been read (up to one snapshot interval and one trigger later) and the watermark it
    # moved is applied, in the next micro-batch (Spark applies a new watermark one batch later): the
    # lag is at least (window end - change) + watermark, on average window/2 + watermark + snapshot/2
    # + trigger/2 + one more trigger, plus the two batches' run time
    bound_min = watermark_s
    bound_mean = window_s / 2 + watermark_s + args.snapshot_interval_s / 2 + trigger_s * 1.5
    print(
        json.dumps(
            {
                "changes": args.changes,
                "measured": len(lags),
                "lag_p50_s": round(statistics.median(lags), 2) if lags else None,
                "lag_max_s": max(lags) if lags else None,
                "lag_min_s": min(lags) if lags else None,
                "design_lower_bound_s": {
                    "min": bound_min,
                    "mean": round(bound_mean, 2),
                    "max": window_s + watermark_s + args.snapshot_interval_s + 2 * trigger_s,
                },
                "batch_time_s_median": round(statistics.median(batch_s), 2) if batch_s else None,
                "window": args.window,
                "watermark": args.watermark,
                "trigger": args.trigger,
                "master": args.master,
                "cpus": os.cpu_count(),
                "load_avg_1m": os.getloadavg()[0],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
