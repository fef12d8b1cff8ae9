"""``skipmq-pipeline`` / ``python -m pipeline``: run the streaming job against a live cluster."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.records import parse_brokers

DESCRIPTION = """\
SkipMQ's data pipeline: a Spark Structured Streaming job over a live SkipMQ cluster.

Reads the per-class snapshots every broker publishes on $SYS/skipmq/<broker-id>/classes (MQTT,
--mqtt: one address per broker, $SYS is per broker) and every broker's /metrics (HTTP, --http:
brokers are also found through /cluster), computes over event-time windows with watermarks (rates,
hot classes, per-broker load and imbalance, hop percentiles, wasted forwards, classes crossing the
routing-table size L, outlier brokers) and writes Parquet tables under --out (partitioned by date
and window, checkpointed: run it again with the same --out and it resumes), optionally the console,
and retained findings on $SYS/skipmq/analytics/<table>. docs/pipeline.md has the tables' schemas.

With --metrics-port the driver serves its own Prometheus metrics on http://<host>:<port>/metrics
(skipmq_pipeline_*: batches per query, rows written per table, the newest window written and how
late, whether each query runs), read by the "SkipMQ Spark pipeline" Grafana dashboard
(docs/observability.md).

Needs Java 17+ (JAVA_HOME or java on PATH) and the skipmq[spark] extra. Under spark-submit, give
--master "" to keep the master spark-submit sets (docs/pipeline.md "On a Spark cluster").
"""

EPILOG = """\
examples:
  skipmq-pipeline --mqtt 127.0.0.1:1883 --http http://127.0.0.1:9090 --duration-s 300
  skipmq-pipeline --mqtt b1:1883,b2:1883,b3:1883 --http http://b1:9090 --window "5 minutes" --out /data/skipmq
  skipmq-pipeline --mqtt 127.0.0.1:1883 --http http://127.0.0.1:9090 --metrics-port 9464
  python -m pipeline.report --out pipeline-out     # charts and a Markdown summary of the tables
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="skipmq-pipeline",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--master", default="local[2]", help='Spark master (default local[2]; "" = as spark-submit set it)'
    )
    p.add_argument(
        "--mqtt",
        default="127.0.0.1:1883",
        help="host:port of every broker for snapshots and findings ('' = off)",
    )
    p.add_argument(
        "--http", default="http://127.0.0.1:9090", help="comma-separated /metrics base URLs ('' = off)"
    )
    p.add_argument(
        "--no-discover",
        action="store_true",
        help="scrape only the --http URLs, not the brokers /cluster lists",
    )
    p.add_argument(
        "--peer-http-port",
        default=None,
        help="HTTP port of brokers found through /cluster (default: the seed's)",
    )
    p.add_argument(
        "--scrape-interval-s", type=float, default=10.0, help="seconds between /metrics scrapes (default 10)"
    )
    p.add_argument(
        "--out",
        default="pipeline-out",
        help="output directory: Parquet tables and _checkpoints (default pipeline-out)",
    )
    p.add_argument("--window", default="1 minute", help='event-time window length (default "1 minute")')
    p.add_argument(
        "--watermark", default="30 seconds", help='how late a snapshot may arrive (default "30 seconds")'
    )
    p.add_argument("--trigger", default="10 seconds", help='micro-batch interval (default "10 seconds")')
    p.add_argument("--top-k", type=int, default=3, help="hot classes kept per window (default 3)")
    p.add_argument("--console", action="store_true", help="also print each batch's hot classes and imbalance")
    p.add_argument(
        "--no-mqtt-findings", action="store_true", help="do not publish findings on $SYS/skipmq/analytics"
    )
    p.add_argument(
        "--client-id", default="skipmq-pipeline", help="MQTT client id prefix (persistent sessions)"
    )
    p.add_argument(
        "--mqtt-username",
        default=os.environ.get("SKIPMQ_PIPELINE_MQTT_USERNAME", ""),
        help="MQTT user name for snapshots and findings (default $SKIPMQ_PIPELINE_MQTT_USERNAME, else "
        "anonymous); the password is read from $SKIPMQ_PIPELINE_MQTT_PASSWORD, never the command line. "
        "With an ACL, grant it 'topic write $SYS/skipmq/analytics/#' (docs/security.md)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve the job's Prometheus metrics (skipmq_pipeline_*) on this port (default 0: off)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the --metrics-port server binds (default 127.0.0.1: this machine only; "
        "0.0.0.0 lets a Prometheus elsewhere scrape it)",
    )
    p.add_argument(
        "--duration-s", type=float, default=0, help="stop after this many seconds (default 0: until Ctrl-C)"
    )
    return p


NO_SNAPSHOTS_WARN_S = 30.0  # three of the brokers' default 10 s snapshot intervals


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


_PROGRESS: Any = None  # where the JSON progress lines go (_progress_stream)


def _progress_stream() -> Any:
    """stderr; under spark-submit, the JVM's stderr: Spark's PythonRunner merges the driver's
    Python stderr into its own stdout, and its pipe closes when the JVM exits (SIGTERM to
    spark-submit), so the lines go to the file the JVM's fd 2 is (Linux /proc), held open."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # set by spark-submit's PythonRunner, not by us
        try:
            return open(f"/proc/{os.getppid()}/fd/2", "a", buffering=1)  # held; "a": never truncate it
        except OSError:
            pass
    return sys.stderr


def _log(event: str, **fields: Any) -> None:
    line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields})
    with contextlib.suppress(OSError, ValueError):  # a closed stream must not turn a stop into a trace
        print(line, file=_PROGRESS or sys.stderr, flush=True)


def _jvm_stopping(spark: Any) -> bool:
    """Whether the Spark JVM is gone or shutting down (spark-submit got SIGTERM: its shutdown
    hooks stop the SparkContext), asked over Py4J; True when it cannot be asked."""
    try:
        context = spark.sparkContext
        hooks = context._jvm.org.apache.spark.util.ShutdownHookManager
        return bool(hooks.inShutdown()) or bool(context._jsc.sc().isStopped())
    except Exception:
        return True


def main(argv: list[str] | None = None) -> int:
    global _PROGRESS
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    _PROGRESS = _progress_stream()
    from pipeline.session import MissingRuntime, build_session, check_pyspark

    try:
        check_pyspark()  # before anything imports it: say what to install, not a traceback
    except MissingRuntime as exc:
        print(str(exc), file=sys.stderr)
        return 3
    from pipeline.job import JobConfig, start_job

    try:
        mqtt = parse_brokers(args.mqtt) if args.mqtt else []
    except ValueError as exc:
        print(f"skipmq-pipeline: --mqtt: {exc}", file=sys.stderr)
        return 2
    http = [url.strip() for url in args.http.split(",") if url.strip()]
    if not 0 <= args.metrics_port <= 65535:
        print(f"skipmq-pipeline: --metrics-port: {args.metrics_port} is not 0-65535", file=sys.stderr)
        return 2
    config = JobConfig(
        out=args.out,
        mqtt=mqtt,
        http=http,
        window=args.window,
        watermark=args.watermark,
        trigger=args.trigger,
        top_k=args.top_k,
        console=args.console,
        mqtt_findings=not args.no_mqtt_findings,
        client_id=args.client_id,
        mqtt_username=args.mqtt_username,
        mqtt_password=os.environ.get("SKIPMQ_PIPELINE_MQTT_PASSWORD", ""),
        discover=not args.no_discover,
        peer_http_port=args.peer_http_port,
        scrape_interval_s=args.scrape_interval_s,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))  # also while starting
    try:
        spark = build_session(args.master or None)
    except MissingRuntime as exc:
        print(str(exc), file=sys.stderr)
        return 3
    _log("pipeline_starting", out=args.out, master=spark.sparkContext.master)
    try:
        job = start_job(spark, config)
    except ValueError as exc:
        print(f"skipmq-pipeline: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not (stopping["now"] or _jvm_stopping(spark)):
            raise
        # SIGTERM to spark-submit while the queries start: the JVM's shutdown hook stopped the
        # SparkContext under start(), whose Py4JJavaError carries a Java stack trace - a normal
        # stop, said in one line (the exception's first line), not a trace
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        _log(
            "pipeline_stopped",
            batches={},
            reason="stopped while starting",
            note=f"{type(exc).__name__}: {first}",
        )
        return 0
    _log(
        "pipeline_started",
        out=args.out,
        mqtt=args.mqtt,
        http=http,
        window=args.window,
        metrics_port=args.metrics_port,
    )
    reason = "duration" if args.duration_s > 0 else "stopped"
    deadline = time.monotonic() + args.duration_s if args.duration_s > 0 else None
    last_report = 0.0
    # no snapshot spooled NO_SNAPSHOTS_WARN_S after the start: say so once (an unclustered
    # broker, like the quick start's, publishes none; class tables then stay empty)
    spool = Path(args.out) / "_checkpoints" / "spool" / "snapshots.jsonl"
    spooled_at_start, started, warned = _size(spool), time.monotonic(), not mqtt
    try:
        while not stopping["now"] and (deadline is None or time.monotonic() < deadline):
            if not warned and time.monotonic() - started >= NO_SNAPSHOTS_WARN_S:
                warned = True
                if _size(spool) == spooled_at_start:
                    _log(
                        "pipeline_no_snapshots",
                        level="warning",
                        mqtt=args.mqtt,
                        seconds=NO_SNAPSHOTS_WARN_S,
                        detail="no class snapshot arrived: unclustered brokers publish none (they need "
                        "cluster.enabled and cluster.class_snapshot_interval_s > 0); class_windows, "
                        "hot_classes, broker_load, imbalance, l_crossings and outliers stay empty, "
                        "broker_metrics (--http) is written",
                    )
            try:
                error = job.failed()
            except Exception as exc:  # Py4J: the JVM is gone (spark-submit got SIGTERM)
                reason = f"the Spark JVM went away ({type(exc).__name__})"
                break
            if error is not None:
                reason = "failed"
                _log("pipeline_failed", error=error)
                return 1
            if time.monotonic() - last_report >= 30:
                last_report = time.monotonic()
                _log("pipeline_progress", batches=dict(job.batches))
            time.sleep(0.5)
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        if stopping["now"]:
            reason = "SIGTERM"
        # a stop racing the JVM's own exit (a signal to the process group, spark-submit's
        # SIGTERM) makes Py4J log its connection errors with a trace: the stop is normal
        logging.getLogger("py4j").setLevel(logging.CRITICAL)
        problem = job.stop()
        extra = {"note": problem} if problem else {}
        _log("pipeline_stopped", batches=dict(job.batches), reason=reason, **extra)
    return 0
