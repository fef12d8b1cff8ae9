"""The streaming job: sources -> windows with watermarks -> findings -> sinks (docs/pipeline.md).

``start_job`` starts up to two streaming queries on a session and returns a ``Job`` handle:
``snapshots`` (MQTT source, class- and broker-level tables) and ``metrics`` (HTTP source,
``broker_metrics`` and queue-depth outliers). Each has its own checkpoint under
``<out>/_checkpoints/``; starting again with the same ``out`` resumes from it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import compute, findings
from pipeline.sinks import FindingsPublisher, rows_as_json, write_parquet

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
    discover: bool = True
    peer_http_port: str | None = None
    scrape_interval_s: float = 10.0


@dataclass
class Job:
    queries: list[StreamingQuery]
    publisher: FindingsPublisher | None
    batches: dict[str, int] = field(default_factory=dict)  # query -> batches written

    def stop(self) -> None:
        for query in self.queries:
            query.stop()
        if self.publisher is not None:
            self.publisher.close()

    def failed(self) -> str | None:
        for query in self.queries:
            error = query.exception()
            if error is not None:
                return f"{query.name}: {error}"
        return None


def _snapshot_batch(
    config: JobConfig, publisher: FindingsPublisher | None, job_batches: dict[str, int]
) -> Callable[..., None]:
    def handle(cells: DataFrame, batch_id: int) -> None:
        frame: pd.DataFrame = cells.toPandas()  # whole windows: a few rows per broker and class
        if frame.empty:
            return
        tables = findings.snapshot_tables(frame, config.top_k)
        for name, table in tables.items():
            write_parquet(table, config.out, name)
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
    config: JobConfig, publisher: FindingsPublisher | None, job_batches: dict[str, int]
) -> Callable[..., None]:
    def handle(cells: DataFrame, batch_id: int) -> None:
        frame: pd.DataFrame = cells.toPandas()
        if frame.empty:
            return
        table = findings.broker_metrics(frame)
        write_parquet(table, config.out, "broker_metrics")
        slow = findings.latency_outliers(table)
        write_parquet(slow, config.out, "latency_outliers")
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
    publisher = FindingsPublisher(config.mqtt) if config.mqtt and config.mqtt_findings else None
    if config.mqtt:
        stream = (
            spark.readStream.format("skipmq_snapshots")
            .option("brokers", ",".join(f"{host}:{port}" for host, port in config.mqtt))
            .option("spool", str(checkpoints / "spool" / "snapshots.jsonl"))
            .option("client_id", config.client_id)
            .load()
        )
        cells = compute.snapshot_cells(stream, config.window, config.watermark)
        queries.append(
            cells.writeStream.queryName("snapshots")
            .outputMode("append")
            .option("checkpointLocation", str(checkpoints / "snapshots"))
            .trigger(processingTime=config.trigger)
            .foreachBatch(_snapshot_batch(config, publisher, batches))
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
            .foreachBatch(_metrics_batch(config, publisher, batches))
            .start()
        )
    if not queries:
        raise ValueError("nothing to read: give --mqtt and/or --http")
    return Job(queries, publisher, batches)


def read_table(spark: SparkSession, out: str, table: str) -> Any:
    """A table the job wrote (a batch DataFrame), or None when it has no rows yet."""
    path = Path(out) / table
    if not path.exists() or not any(path.glob("date=*")):
        return None
    return spark.read.parquet(str(path))
