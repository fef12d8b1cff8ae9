"""The Spark job's own metrics (pipeline.metrics): what one foreachBatch counts, and the
documentation of every family. The driver serving them runs in tests/pipeline/test_pipeline_job.py."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.cli import parser
from pipeline.job import JobConfig, _serve_metrics, _stop_server
from pipeline.metrics import PipelineMetrics
from tools.ports import free_ports

ROOT = Path(__file__).resolve().parents[3]


def samples(metrics: PipelineMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def windows(*ends_s: float) -> pd.DataFrame:
    return pd.DataFrame({"window_end": pd.to_datetime(list(ends_s), unit="s", utc=True)})


def test_a_batch_counts_rows_per_table_the_newest_window_and_its_lag() -> None:
    metrics = PipelineMetrics()
    metrics.batch_written(
        "snapshots", {"class_windows": windows(100, 160, 130), "hot_classes": windows()}, 175.0
    )
    metrics.batch_written("snapshots", {"class_windows": windows(220), "hot_classes": windows(220)}, 229.0)
    got = samples(metrics)
    assert got[("skipmq_pipeline_batches_total", (("query", "snapshots"),))] == 2
    assert got[("skipmq_pipeline_rows_written_total", (("table", "class_windows"),))] == 4
    assert got[("skipmq_pipeline_rows_written_total", (("table", "hot_classes"),))] == 1
    assert got[("skipmq_pipeline_last_window_end_timestamp_seconds", (("table", "class_windows"),))] == 220
    lag = "skipmq_pipeline_window_lag_seconds"
    assert got[(f"{lag}_count", (("query", "snapshots"),))] == 2
    assert got[(f"{lag}_sum", (("query", "snapshots"),))] == pytest.approx(15 + 9)  # 175-160, 229-220
    assert got[(f"{lag}_bucket", (("le", "10.0"), ("query", "snapshots")))] == 1


def test_a_batch_with_no_windows_counts_the_batch_but_no_lag() -> None:
    metrics = PipelineMetrics()
    metrics.batch_written("metrics", {"latency_outliers": windows()}, 50.0)
    got = samples(metrics)
    assert got[("skipmq_pipeline_batches_total", (("query", "metrics"),))] == 1
    assert got[("skipmq_pipeline_rows_written_total", (("table", "latency_outliers"),))] == 0
    assert ("skipmq_pipeline_window_lag_seconds_count", (("query", "metrics"),)) not in got


def test_query_up_reads_the_query_at_every_scrape() -> None:
    metrics = PipelineMetrics()
    state = {"running": True}
    metrics.watch_query("snapshots", lambda: state["running"])
    assert samples(metrics)[("skipmq_pipeline_query_up", (("query", "snapshots"),))] == 1
    state["running"] = False  # the query failed or stopped
    assert samples(metrics)[("skipmq_pipeline_query_up", (("query", "snapshots"),))] == 0


def test_every_family_is_documented_and_the_option_too() -> None:
    observability = (ROOT / "docs" / "observability.md").read_text()
    families = [
        f.name for f in text_string_to_metric_families(generate_latest(PipelineMetrics().registry).decode())
    ]
    assert len(families) == 6, families
    missing = [name for name in families if f"`{name}" not in observability]
    assert not missing, f"docs/observability.md does not describe {missing}"
    assert "--metrics-port" in (ROOT / "docs" / "pipeline.md").read_text()
    assert "--metrics-port" in parser().format_help()
    assert parser().parse_args([]).metrics_port == 0  # off unless asked for


def test_the_driver_serves_the_registry_and_a_taken_port_is_refused_by_name(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    metrics = PipelineMetrics()
    metrics.batch_written("metrics", {"broker_metrics": windows(10, 20)}, 25.0)
    config = JobConfig(out=str(tmp_path), metrics_port=port, metrics_host="127.0.0.1")
    server = _serve_metrics(config, metrics)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
        assert 'skipmq_pipeline_rows_written_total{table="broker_metrics"} 2.0' in body
        with pytest.raises(ValueError, match=f"--metrics-port {port}"):  # the port is taken now
            _serve_metrics(config, PipelineMetrics())
    finally:
        _stop_server(server)
    with pytest.raises(OSError):  # stopped: nothing listens any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert _serve_metrics(JobConfig(out=str(tmp_path)), metrics) is None  # port 0: off
