"""The Spark job's own Prometheus metrics, served by the driver (``skipmq-pipeline --metrics-port``).

Counted in the foreachBatch handlers of pipeline/job.py, in the driver: batches per query, rows
written per table, the newest window end written per table and how late it was written (write
time minus the window's end: the watermark, the trigger and the batch's own time), and whether
each streaming query runs. Nothing is counted on the brokers. The "SkipMQ Spark pipeline"
dashboard (dashboards/generate.py, docs/observability.md) reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    import pandas as pd

# seconds from a window's end to its rows written: at least the watermark plus a trigger interval
LAG_BUCKETS_S = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


def _version() -> str:
    try:
        return version("skipmq")
    except PackageNotFoundError:
        return "unknown"


class PipelineMetrics:
    """One job's metrics in their own registry (a restarted job starts a new one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        info = Gauge(
            "skipmq_pipeline_info",
            "Always 1: the pipeline driver is up, with its SkipMQ version",
            ["version"],
            registry=self.registry,
        )
        info.labels(_version()).set(1)
        self.batches = Counter(
            "skipmq_pipeline_batches",
            "Micro-batches with rows handled by each streaming query (snapshots, metrics)",
            ["query"],
            registry=self.registry,
        )
        self.rows = Counter(
            "skipmq_pipeline_rows_written",
            "Rows written to each output table (Parquet)",
            ["table"],
            registry=self.registry,
        )
        self.last_window_end = Gauge(
            "skipmq_pipeline_last_window_end_timestamp_seconds",
            "End (Unix time) of the newest event-time window written to each table",
            ["table"],
            registry=self.registry,
        )
        self.window_lag = Histogram(
            "skipmq_pipeline_window_lag_seconds",
            "Seconds from a window's end to its rows written, per query",
            ["query"],
            buckets=LAG_BUCKETS_S,
            registry=self.registry,
        )
        self.query_up = Gauge(
            "skipmq_pipeline_query_up",
            "1 while the streaming query runs, 0 once it failed or stopped",
            ["query"],
            registry=self.registry,
        )

    def watch_query(self, name: str, running: Callable[[], bool]) -> None:
        """``skipmq_pipeline_query_up{query=name}`` reads ``running()`` at every scrape."""
        self.query_up.labels(name).set_function(lambda: 1.0 if running() else 0.0)

    def batch_written(self, query: str, tables: Mapping[str, pd.DataFrame], now_s: float) -> None:
        """Count one micro-batch of ``query`` that wrote ``tables`` at ``now_s`` (Unix time)."""
        self.batches.labels(query).inc()
        newest: float | None = None
        for table, frame in tables.items():
            self.rows.labels(table).inc(len(frame))
            if frame.empty or "window_end" not in frame:
                continue
            end = _timestamp_s(frame["window_end"].max())
            self.last_window_end.labels(table).set(end)
            newest = end if newest is None else max(newest, end)
        if newest is not None:
            self.window_lag.labels(query).observe(max(0.0, now_s - newest))


def _timestamp_s(value: Any) -> float:
    return float(value.timestamp())
