"""The pipeline's pure parts: snapshot and /metrics records, the spool, the findings of whole windows,
the command line and its clear refusal without Java (no Spark started here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from broker.cluster.class_stats import ClassCounters, SnapshotBuilder
from pipeline import findings
from pipeline.records import BadSnapshot, metric_records, snapshot_records
from pipeline.spool import Spool
from tests.support.core import start_broker

__all__ = ["start_broker"]  # the fixture

ROOT = Path(__file__).resolve().parents[3]


def test_snapshot_records_flatten_what_the_broker_builds() -> None:
    counters = ClassCounters()
    counters.published("=a")
    counters.received("=a", 2, delivered=True)
    snapshot = SnapshotBuilder("b:1", counters, 2).build(5.0, lambda cls: 3, extra={"queued_messages": 7})
    (record,) = snapshot_records(json.dumps(snapshot))
    assert record["class"] == "=a" and record["publishes_delta"] == 1 and record["hops_1"] == 1
    assert (record["subscriber_brokers"], record["table_size"], record["queued_messages"]) == (3, 2, 7)


@pytest.mark.parametrize(
    "payload", [b"not json", b"{}", b'{"broker":"b","ts":1,"seq":1,"table_size":2,"classes":[{}]}']
)
def test_a_bad_snapshot_is_refused_by_name(payload: bytes) -> None:
    with pytest.raises(BadSnapshot, match="not a SkipMQ class snapshot"):
        snapshot_records(payload)


def test_metric_records_parse_prometheus_text() -> None:
    text = '# TYPE skipmq_messages_received counter\nskipmq_messages_received_total{qos="1"} 5.0\n'
    (record,) = metric_records(text, "h:1", "n", 1.0)
    assert (record["name"], json.loads(record["labels"]), record["value"]) == (
        "skipmq_messages_received_total",
        {"qos": "1"},
        5.0,
    )


def test_spool_offsets_replay_exactly_across_instances(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.jsonl")
    assert spool.append([{"n": n} for n in range(5)]) == 5
    again = Spool(tmp_path / "s.jsonl")  # another process after a restart
    assert [r["n"] for r in again.read(1, 4)] == [1, 2, 3]
    spool.append([{"n": 5}])
    assert [r["n"] for r in again.read(4, 6)] == [4, 5]  # sees lines appended by the other


def _cells() -> pd.DataFrame:
    rows = []
    start = pd.Timestamp("2026-01-01T00:00:00Z")
    for broker, cls, pubs, delivs, hops, subs, before in (
        ("b0", "=hot", 100, 0, [0] * 9, 1, 1),
        ("b1", "=warm", 10, 0, [0] * 9, 3, 3),
        ("b2", "=warm", 0, 10, [6, 4, 0, 0, 0, 0, 0, 0, 0], 3, 2),
        ("b0", "=wide", 0, 0, [0] * 9, 3, 2),
    ):
        row = {
            "window_start": start,
            "window_end": start + pd.Timedelta(seconds=10),
            "broker": broker,
            "class": cls,
            "publishes": pubs,
            "forwards": pubs,
            "received": delivs,
            "deliveries": delivs,
            "wasted": 0,
            "hop_sum": 0,
            "subscriber_brokers": subs,
            "table_size": 2,
            "queued_messages": 0,
            "crossed_up_at": start + pd.Timedelta(seconds=3) if before <= 2 < subs else pd.NaT,
            "crossed_down_at": pd.NaT,
            "snapshots": 10,
        }
        row.update({f"hops_{index}": value for index, value in enumerate(hops)})
        rows.append(row)
    return pd.DataFrame(rows)


def test_findings_of_a_window() -> None:
    tables = findings.snapshot_tables(_cells(), top_k=1)
    hot = tables["hot_classes"]
    assert list(hot["class"]) == ["=hot"] and float(hot["publish_rate"].iloc[0]) == 10.0
    imbalance = tables["imbalance"].iloc[0]
    # loads 10, 1 and 1 msgs/s: max / mean = 10 / 4
    assert imbalance["busiest_broker"] == "b0" and imbalance["imbalance"] == pytest.approx(2.5)
    warm = tables["class_windows"].set_index("class").loc["=warm"]
    assert (warm["hop_p50"], warm["hop_p99"], warm["wasted_ratio"]) == (1.0, 2.0, 0.0)
    crossings = tables["l_crossings"]
    assert sorted(crossings["class"]) == ["=warm", "=wide"] and set(crossings["direction"]) == {"multi_hop"}
    outliers = tables["outliers"]
    assert list(outliers["broker"]) == ["b0"] and list(outliers["metric"]) == ["load"]


def test_help_explains_and_a_missing_java_is_named(tmp_path: Path) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "pipeline", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0 and "--master" in shown.stdout and "local[2]" in shown.stdout
    env = {key: value for key, value in os.environ.items() if key != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)  # no java on it
    refused = subprocess.run(
        [sys.executable, "-m", "pipeline", "--duration-s", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert refused.returncode == 3 and "no Java found" in refused.stderr and "JAVA_HOME" in refused.stderr


def _latency_cells(means_s: dict[str, float], count: int = 100) -> pd.DataFrame:
    """/metrics cells of one 10 s window: each broker's publish-confirm histogram _sum and _count
    grew by count observations of the given mean, its store commits by 50 of 1 ms."""
    rows = []
    for instance, mean in means_s.items():
        for family, added, observed in (
            ("skipmq_cluster_publish_confirm_seconds", mean * count, count),
            ("skipmq_store_commit_seconds", 0.001 * 50, 50),
        ):
            for suffix, grew in (("_sum", added), ("_count", observed)):
                first = 1000.0
                rows.append(
                    {
                        "window_start": "2026-11-25T10:00:00Z",
                        "window_end": "2026-11-25T10:00:10Z",
                        "instance": instance,
                        "node_id": instance,
                        "name": family + suffix,
                        "labels": "{}",
                        "first": first,
                        "last": first + grew,
                        "min": first,
                        "max": first + grew,
                        "mean": first + grew / 2,
                        "samples": 5,
                    }
                )
    return pd.DataFrame(rows)


def test_a_broker_with_slow_publish_confirmations_is_a_latency_outlier() -> None:
    table = findings.broker_metrics(_latency_cells({"a:1": 0.004, "b:1": 0.005, "c:1": 0.060}))
    slow = findings.latency_outliers(table)
    assert slow[["broker", "metric"]].values.tolist() == [["c:1", "publish_confirm_s"]]
    (row,) = slow.to_dict("records")
    assert row["value"] == pytest.approx(0.060) and row["median"] == pytest.approx(0.005)


def test_latency_outliers_name_brokers_by_cluster_address_as_the_snapshot_tables_do() -> None:
    cells = _latency_cells({"a:1": 0.004, "b:1": 0.005, "c:1": 0.060})
    info = cells[cells["name"] == "skipmq_store_commit_seconds_count"].copy()
    info["name"] = findings.BROKER_INFO
    info["labels"] = [json.dumps({"broker": f"10.0.0.{n}:7883"}) for n in range(len(info))]
    slow = findings.latency_outliers(findings.broker_metrics(pd.concat([cells, info], ignore_index=True)))
    assert slow[["broker", "instance"]].values.tolist() == [["10.0.0.2:7883", "c:1"]]


def test_no_latency_outlier_among_even_or_fast_brokers_or_after_a_restart() -> None:
    even = findings.broker_metrics(_latency_cells({"a:1": 0.020, "b:1": 0.025, "c:1": 0.030}))
    assert findings.latency_outliers(even).empty
    fast = findings.broker_metrics(_latency_cells({"a:1": 0.0005, "b:1": 0.0005, "c:1": 0.004}))
    assert findings.latency_outliers(fast).empty  # 8x the median, but under 5 ms
    restarted = _latency_cells({"a:1": 0.004, "b:1": 0.005, "c:1": 0.060})
    mask = (restarted["instance"] == "c:1") & restarted["name"].str.startswith("skipmq_cluster")
    restarted.loc[mask, "last"] = 3.0  # the histogram started again from zero in this window
    assert findings.latency_outliers(findings.broker_metrics(restarted)).empty


def test_a_broker_that_comes_up_after_the_batch_still_gets_the_latest_finding(start_broker: Any) -> None:
    """The findings publisher publishes only to connected brokers; one that was not connected at
    the batch (down, or still connecting) gets each table's latest finding when it connects."""
    from pipeline.sinks import ANALYTICS_PREFIX, FindingsPublisher
    from tests.support.core import RawClient
    from tools.ports import free_ports

    (port,) = free_ports(1)
    publisher = FindingsPublisher([("127.0.0.1", port)], client_id="findings-late")
    try:
        publisher.publish("hot_classes", {"batch": 1, "rows": [{"class": "=old"}]})
        publisher.publish("hot_classes", {"batch": 2, "rows": [{"class": "=new"}]})
        start_broker(listeners__tcp__port=port)
        watcher = RawClient(port)
        watcher.connect("findings-watcher")
        deadline = time.monotonic() + 20  # the publisher retries its connection every 1-5 s
        packet_id = 0
        while True:  # subscribing again sends the retained message again, once there is one
            packet_id += 1
            watcher.subscribe(f"{ANALYTICS_PREFIX}/hot_classes", 0, packet_id=packet_id)
            try:
                packet = watcher.expect_publish(1.0)
                break
            except TimeoutError:
                assert time.monotonic() < deadline, "no retained finding after the broker came up"
        assert json.loads(packet.payload)["batch"] == 2  # live, or retained: the latest one
        late = RawClient(port)
        late.connect("findings-late-watcher")
        late.subscribe(f"{ANALYTICS_PREFIX}/hot_classes", 0)
        retained = late.expect_publish(5.0)
        assert retained.retain and json.loads(retained.payload)["batch"] == 2
    finally:
        publisher.close()


# pyspark cannot be imported in the child: a meta-path finder refuses it, as in an environment
# without the [spark] extra
_NO_PYSPARK = """
import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Blocker())
sys.argv = ["skipmq-pipeline", *sys.argv[1:]]
from pipeline.cli import main
raise SystemExit(main())
"""


def test_without_the_spark_extra_help_works_and_a_run_names_what_to_install() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _NO_PYSPARK, *args], cwd=ROOT, capture_output=True, text=True, timeout=60
        )

    shown = run("--help")
    assert shown.returncode == 0, shown.stderr
    assert "--metrics-host" in shown.stdout and "Traceback" not in shown.stderr
    refused = run("--duration-s", "1")
    assert refused.returncode == 3, refused.stderr
    assert "pip install -e '.[spark]'" in refused.stderr and "Traceback" not in refused.stderr


def test_the_driver_metrics_listen_on_loopback_by_default() -> None:
    from pipeline.cli import parser
    from pipeline.job import JobConfig

    assert parser().parse_args([]).metrics_host == "127.0.0.1"
    assert JobConfig(out="x").metrics_host == "127.0.0.1"


def _metric_cells(windows: int, samples: list[int]) -> pd.DataFrame:
    """broker_metrics cells of one unclustered broker: ``windows`` 10 s windows, received and sent
    counters growing 50/s, with ``samples`` scrapes in each window."""
    rows = []
    for index in range(windows):
        start = pd.Timestamp("2026-11-25T10:00:00Z") + pd.Timedelta(seconds=10 * index)
        for name in ("skipmq_messages_received_total", "skipmq_messages_sent_total"):
            span = 10.0 * samples[index] / 10
            first = 1000.0 + 500 * index
            rows.append(
                {
                    "window_start": start,
                    "window_end": start + pd.Timedelta(seconds=10),
                    "instance": "127.0.0.1:9090",
                    "node_id": "quick",
                    "name": name,
                    "labels": '{"qos":"0"}',
                    "first": first,
                    "last": first + 50 * span,
                    "min": first,
                    "max": first + 50 * span,
                    "mean": first,
                    "samples": samples[index],
                }
            )
    return findings.broker_metrics(pd.DataFrame(rows))


def test_the_report_of_an_unclustered_broker_has_no_class_windows_and_is_no_error(tmp_path: Path) -> None:
    """The README's quick-start broker publishes no class snapshots: the report is written from
    /metrics alone (before: exit 1, "has the job written a window yet?"); the first, partly
    scraped window is not charted as a dip."""
    from pipeline.report import build_report, message_rates
    from pipeline.sinks import write_parquet

    table = _metric_cells(4, [3, 10, 10, 10])
    write_parquet(table, str(tmp_path), "broker_metrics")
    report = build_report(tmp_path, tmp_path / "report")
    text = report.read_text()
    assert "No per-class snapshots" in text and "message_rates.png" in text
    png = (tmp_path / "report" / "message_rates.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    rates = message_rates(table)
    assert len(rates) == 3  # the first window (3 of 10 scrapes) left out
    with pytest.raises(SystemExit, match="no window written"):
        build_report(tmp_path / "empty", tmp_path / "empty-report")


def test_the_report_leaves_out_classes_nobody_publishes(tmp_path: Path) -> None:
    from pipeline.report import build_report
    from pipeline.sinks import write_parquet

    tables = findings.snapshot_tables(_cells(), top_k=3)  # "=wide": subscribed, never published
    for name, frame in tables.items():
        write_parquet(frame, str(tmp_path), name)
    text = build_report(tmp_path, tmp_path / "report", top=5).read_text()
    hottest = text.split("## Hottest classes")[1].split("##")[0]
    assert "=hot" in hottest and "=warm" in hottest and "=wide" not in hottest


def test_a_partly_observed_window_is_no_dip_and_names_no_outlier() -> None:
    """The job heard of brokers b1 and b2 8 s into a 10 s window (their first snapshots cover
    from there): their 20 publishes are 10/s over what was observed, like b0's 100 over the whole
    window - not a dip, and b0 is no outlier (before: loads 10, 2, 2 named b0 one)."""
    start = pd.Timestamp("2026-01-01T00:00:00Z")
    rows = []
    for broker, publishes in (("b0", 100), ("b1", 20), ("b2", 20)):
        row = {name: 0 for name in ("forwards", "received", "deliveries", "wasted", "hop_sum")}
        row.update({f"hops_{index}": 0 for index in range(9)})
        row.update(
            window_start=start, window_end=start + pd.Timedelta(seconds=10), broker=broker, **{"class": "=c"},
            publishes=publishes, subscriber_brokers=1, table_size=2, queued_messages=0,
            crossed_up_at=pd.NaT, crossed_down_at=pd.NaT, snapshots=5,
        )  # fmt: skip
        rows.append(row)
    cells = pd.DataFrame(rows)
    assert list(findings.snapshot_tables(cells, top_k=1)["outliers"]["broker"]) == ["b0"]  # unknown starts
    late = start.timestamp() + 8
    tables = findings.snapshot_tables(cells, top_k=1, starts={"b1": [late], "b2": [late], "b0": [0.0]})
    assert tables["outliers"].empty
    load = tables["broker_load"].set_index("broker")
    assert list(load["partial"]) == [False, True, True]
    assert list(load["load"]) == pytest.approx([10.0, 10.0, 10.0])
    assert bool(tables["class_windows"]["partial"].iloc[0]) and bool(tables["imbalance"]["partial"].iloc[0])
