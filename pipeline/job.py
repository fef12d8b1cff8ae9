"""The streaming job: sources -> windows with watermarks -> findings -> sinks (docs/pipeline.md).

``start_job`` starts up to two streaming queries on a session and returns a ``Job`` handle:
``snapshots`` (MQTT source, class- and broker-level tables) and ``metrics`` (HTTP source,
``broker_metrics`` and queue-depth outliers). Each has its own checkpoint under
``<out>/_checkpoints/``; starting again with the same ``out`` resumes from it. With
``metrics_port`` the driver serves the job's own Prometheus metrics (pipeline.metrics), counted in
the foreachBatch handlers below.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import compute, findings
from pipeline.metrics import PipelineMetrics
from pipeline.sinks import FindingsPublisher, rows_as_json, write_parquet
from pipeline.spool import Spool

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("skipmq.pipeline")

SNAPSHOT_TABLES = ("class_windows", "hot_classes", "broker_load", "imbalance", "l_crossings", "outliers")
METRIC_TABLES = ("broker_metrics", "latency_outliers")


@dataclass
class JobConfig:
    out: str
    mqtt: list[tuple[str, int]] = field(default_factory=list)  # brokers for snapshots and findings
    http: list[str] = field(default_factory=list)  # /metrics base URLs (seeds for /cluster)
    window: str = "1 minute"
    watermark: str = "30 seconds"
    trigger: str = "10 seconds"
    top_k: int = 3
    console: bool = False
    mqtt_findings: bool = True
    client_id: str = "skipmq-pipeline"
    mqtt_username: str = ""  # MQTT user for snapshots and findings ("" = anonymous)
    mqtt_password: str = ""
    discover: bool = True
    peer_http_port: str | None = None
    scrape_interval_s: float = 10.0
    metrics_port: int = 0  # the driver's /metrics (pipeline.metrics); 0 = off
    metrics_host: str = "127.0.0.1"


@dataclass
class Job:
    queries: list[StreamingQuery]
    publisher: FindingsPublisher | None
    batches: dict[str, int] = field(default_factory=dict)  # query -> batches written
    metrics: PipelineMetrics = field(default_factory=PipelineMetrics)
    metrics_server: Any = None  # prometheus_client's HTTP server while --metrics-port is set

    def stop(self) -> str | None:
        """Stop the queries, the findings publisher and the metrics server; what went wrong
        stopping a query (the JVM already gone), else None: the rest is stopped regardless."""
        problem = None
        for query in self.queries:
            try:
                query.stop()
            except Exception as exc:  # Py4J: the JVM exited first (its checkpoints are consistent)
                problem = f"{type(exc).__name__}: the Spark JVM had stopped"
        if self.publisher is not None:
            self.publisher.close()
        _stop_server(self.metrics_server)
        self.metrics_server = None
        return problem

    def failed(self) -> str | None:
        for query in self.queries:
            error = query.exception()
            if error is not None:
                return f"{query.name}: {error}"
        return None


class CoverageStarts:
    """Per broker, the times from which its snapshots cover time: the first snapshot the job
    ever spooled from it covers from ``ts - interval_s``, and a broker's first snapshot after it
    started (``interval_s`` 0) from its ``ts``. A window with such a start inside is only partly
    observed for that broker (findings.observed_s). Read incrementally from the spool."""

    def __init__(self, spool_path: Path) -> None:
        self._path = spool_path
        self._spool: Spool | None = None
        self._line = 0
        self.starts: dict[str, list[float]] = {}

    def update(self) -> dict[str, list[float]]:
        if self._spool is None:
            if not self._path.exists():
                return self.starts
            self._spool = Spool(self._path)
        end = self._spool.count()
        for record in self._spool.read(self._line, end):
            broker, ts, interval = str(record["broker"]), float(record["ts"]), float(record["interval_s"])
            known = self.starts.get(broker)
            start = ts if interval <= 0 else ts - interval
            if known is None:
                self.starts[broker] = [start]
            elif interval <= 0 and start not in known:
                known.append(start)
        self._line = end
        return self.starts


def _snapshot_batch(
    config: JobConfig,
    publisher: FindingsPublisher | None,
    job_batches: dict[str, int],
    metrics: PipelineMetrics,
) -> Callable[..., None]:
    coverage = CoverageStarts(Path(config.out) / "_checkpoints" / "spool" / "snapshots.jsonl")

    def handle(cells: DataFrame, batch_id: int) -> None:
        frame: pd.DataFrame = cells.toPandas()  # whole windows: a few rows per broker and class
        if frame.empty:
            return
        tables = findings.snapshot_tables(frame, config.top_k, coverage.update())
        for name, table in tables.items():
            write_parquet(table, config.out, name)
        metrics.batch_written("snapshots", tables, time.time())
        if config.console:
            for name in ("hot_classes", "imbalance", "l_crossings", "outliers"):
                if not tables[name].empty:
                    print(f"--- {name} (batch {batch_id})")
                    print(tables[name].drop(columns=["date", "window"]).to_string(index=False), flush=True)
        if publisher is not None:
            for name in ("hot_classes", "imbalance", "l_crossings", "outliers"):
                if not tables[name].empty:  # the retained message keeps the latest finding
                    publisher.publish(name, {"batch": batch_id, "rows": rows_as_json(tables[name])})
        job_batches["snapshots"] = job_batches.get("snapshots", 0) + 1

    return handle


def _metrics_batch(
    config: JobConfig,
    publisher: FindingsPublisher | None,
    job_batches: dict[str, int],
    metrics: PipelineMetrics,
) -> Callable[..., None]:
    def handle(cells: DataFrame, batch_id: int) -> None:
        frame: pd.DataFrame = cells.toPandas()
        if frame.empty:
            return
        table = findings.broker_metrics(frame)
        write_parquet(table, config.out, "broker_metrics")
        slow = findings.latency_outliers(table)
        write_parquet(slow, config.out, "latency_outliers")
        metrics.batch_written("metrics", {"broker_metrics": table, "latency_outliers": slow}, time.time())
        if not slow.empty:
            if config.console:
                print(f"--- latency_outliers (batch {batch_id})")
                print(slow.drop(columns=["date", "window"]).to_string(index=False), flush=True)
            if publisher is not None:
                publisher.publish("latency_outliers", {"batch": batch_id, "rows": rows_as_json(slow)})
        if config.console:
            up = table[table["name"] == "up"][["window_start", "instance", "min", "max"]]
            print(f"--- broker_metrics up (batch {batch_id})")
            print(up.to_string(index=False), flush=True)
        job_batches["metrics"] = job_batches.get("metrics", 0) + 1

    return handle


def start_job(spark: SparkSession, config: JobConfig) -> Job:
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoints = out / "_checkpoints"
    queries: list[StreamingQuery] = []
    batches: dict[str, int] = {}
    metrics = PipelineMetrics()
    server = _serve_metrics(config, metrics)
    publisher = None
    if config.mqtt and config.mqtt_findings:
        publisher = FindingsPublisher(
            config.mqtt, username=config.mqtt_username, password=config.mqtt_password
        )
    if config.mqtt:
        reader = (
            spark.readStream.format("skipmq_snapshots")
            .option("brokers", ",".join(f"{host}:{port}" for host, port in config.mqtt))
            .option("spool", str(checkpoints / "spool" / "snapshots.jsonl"))
            .option("client_id", config.client_id)
        )
        if config.mqtt_username:
            reader = reader.option("username", config.mqtt_username).option("password", config.mqtt_password)
        stream = reader.load()
        cells = compute.snapshot_cells(stream, config.window, config.watermark)
        queries.append(
            cells.writeStream.queryName("snapshots")
            .outputMode("append")
            .option("checkpointLocation", str(checkpoints / "snapshots"))
            .trigger(processingTime=config.trigger)
            .foreachBatch(_snapshot_batch(config, publisher, batches, metrics))
            .start()
        )
    if config.http:
        reader = (
            spark.readStream.format("skipmq_metrics")
            .option("urls", ",".join(config.http))
            .option("spool", str(checkpoints / "spool" / "metrics.jsonl"))
            .option("discover", str(config.discover).lower())
            .option("scrape_interval_s", str(config.scrape_interval_s))
        )
        if config.peer_http_port:
            reader = reader.option("peer_http_port", config.peer_http_port)
        cells = compute.metric_cells(reader.load(), config.window, config.watermark)
        queries.append(
            cells.writeStream.queryName("metrics")
            .outputMode("append")
            .option("checkpointLocation", str(checkpoints / "metrics"))
            .trigger(processingTime=config.trigger)
            .foreachBatch(_metrics_batch(config, publisher, batches, metrics))
            .start()
        )
    if not queries:
        _stop_server(server)
        raise ValueError("nothing to read: give --mqtt and/or --http")
    job = Job(queries, publisher, batches, metrics, server)
    for query in queries:
        metrics.watch_query(query.name, functools.partial(_query_runs, query))
    return job


def _serve_metrics(config: JobConfig, metrics: PipelineMetrics) -> Any:
    """prometheus_client's HTTP server for --metrics-port (None when 0), bound before any query runs."""
    if not config.metrics_port:
        return None
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(
            config.metrics_port, config.metrics_host, registry=metrics.registry
        )
    except OSError as exc:
        raise ValueError(f"--metrics-port {config.metrics_port}: {exc}") from exc
    log.info("metrics on http://%s:%d/metrics", config.metrics_host, config.metrics_port)
    return server


def _stop_server(server: Any) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()


def _query_runs(query: StreamingQuery) -> bool:
    try:
        return bool(query.isActive) and query.exception() is None
    except Exception:  # the session is gone: the query does not run
        return False


def read_table(spark: SparkSession, out: str, table: str) -> Any:
    """A table the job wrote (a batch DataFrame), or None when it has no rows yet."""
    path = Path(out) / table
    if not path.exists() or not any(path.glob("date=*")):
        return None
    return spark.read.parquet(str(path))
