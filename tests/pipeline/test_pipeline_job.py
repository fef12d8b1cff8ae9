"""The pipeline against a real 3-broker cluster under generated traffic (issue #13 "Done means").

One scenario (module fixture ``run``), then one test per finding. Real brokers (tools.launcher), real
paho clients, real Spark (local[2], the session shared by every pipeline test), the job as
``skipmq-pipeline`` runs it (pipeline.job.start_job), reading its Parquet output:

- t0: the job starts; a hot class is published on broker 0 at HOT_RATE/s (subscribed there), a warm
  class on broker 1 at WARM_RATE/s (subscribed on broker 2, so it is forwarded with hops), a wide
  class is subscribed on broker 0 only;
- t0 + WIDE_AT_S: brokers 1 and 2 subscribe the wide class: 3 subscriber brokers > L = 2;
- t0 + STOP_AT_S: the job stops; t0 + RESTART_AT_S: it starts again from its checkpoint;
- once the restarted job runs (at least t0 + KILL_AT_S): broker 2 is killed (kill -9), and
  restarted KILL_FOR_S later;
- AFTER_S after that the traffic stops; once the windows after it are written, the job stops.

The schedule waits for the job's queries to run (their first micro-batch done) where it matters, so a
busy machine makes it longer, not flaky.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.job import Job, JobConfig, start_job
from tests.support.cluster import ClusterClient, probe_route, unique_id, wait_until
from tools.launcher import LocalCluster
from tools.ports import free_ports

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# the scenario runs in the first test's setup: Spark's start and the scenario (about 1.5 min on an idle
# 2-core machine, more on a busy one) exceed the suite's 120 s default
pytestmark = pytest.mark.timeout(480)

WINDOW_S = 5
HOT_RATE = 40.0
WARM_RATE = 8.0
WIDE_AT_S = 8.0
STOP_AT_S = 14.0
RESTART_AT_S = 19.0
KILL_AT_S = 27.0
KILL_FOR_S = 5.0
AFTER_S = 8.0


@dataclass
class Run:
    out: Path
    t0: float = 0.0
    t_end: float = 0.0
    wide_at: float = 0.0
    killed_at: float = 0.0
    restarted_at: float = 0.0
    sent: dict[str, list[float]] = field(default_factory=dict)  # class -> publish times
    classes: dict[str, str] = field(default_factory=dict)  # role -> class name
    peers: list[str] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the jobs' query failures
    metrics_text: str = ""  # the restarted job's /metrics (--metrics-port) once its windows are written

    def table(self, name: str) -> pd.DataFrame:
        path = self.out / name
        if not path.exists() or not any(path.glob("date=*")):
            return pd.DataFrame()
        frame = pd.read_parquet(path)
        for column in ("window_start", "window_end"):
            if column in frame:
                frame[column] = pd.to_datetime(frame[column], utc=True)
        return frame

    @property
    def end_s(self) -> float:
        return self.t_end - self.t0

    def interior(self, frame: pd.DataFrame, start_s: float, end_s: float) -> pd.DataFrame:
        """Rows of windows lying within [t0 + start_s, t0 + end_s]."""
        low = pd.Timestamp(self.t0 + start_s, unit="s", tz="UTC")
        high = pd.Timestamp(self.t0 + end_s, unit="s", tz="UTC")
        return frame[(frame["window_start"] >= low) & (frame["window_end"] <= high)]


def sent_in(times: list[float], row: Any) -> int:
    start, end = row["window_start"].timestamp(), row["window_end"].timestamp()
    return sum(1 for at in times if start <= at < end)


class Publisher(threading.Thread):
    """Publishes QoS 0 on ``topic`` at ``rate``/s on an absolute schedule until ``stop`` is set."""

    def __init__(self, client: ClusterClient, topic: str, rate: float, times: list[float]) -> None:
        super().__init__(daemon=True)
        self.client, self.topic, self.rate, self.times = client, topic, rate, times
        self.stop = threading.Event()

    def run(self) -> None:
        start = time.time()
        n = 0
        while not self.stop.is_set():
            due = start + n / self.rate
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            self.times.append(time.time())
            self.client.client.publish(self.topic, b"x" * 32, 0)
            n += 1


def _running(job: Job) -> bool:
    """Every query of the job finished a micro-batch (a query that failed fails the wait at once)."""
    failure = job.failed()
    if failure is not None:
        raise AssertionError(f"a query of the job failed: {failure}")
    return all(query.lastProgress is not None for query in job.queries)


def _spooled_brokers(out: Path) -> set[str]:
    spool = out / "_checkpoints" / "spool" / "snapshots.jsonl"
    if not spool.exists():
        return set()
    return {json.loads(line)["broker"] for line in spool.read_text().splitlines()[-200:] if line}


@pytest.fixture(scope="module")
def run(
    spark: SparkSession, cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Run]:
    brokers = cluster.brokers
    result = Run(out=tmp_path_factory.mktemp("pipeline-out"))
    result.peers = [broker.peer_id for broker in brokers]
    result.instances = [f"127.0.0.1:{broker.http_port}" for broker in brokers]
    config = JobConfig(
        out=str(result.out),
        mqtt=[("127.0.0.1", broker.mqtt_port) for broker in brokers],
        http=[f"http://127.0.0.1:{broker.http_port}" for broker in brokers],
        window=f"{WINDOW_S} seconds",
        watermark="2 seconds",
        trigger="1 second",
        top_k=2,
        scrape_interval_s=1.0,
        client_id=unique_id("pipeline"),
        metrics_port=free_ports(1)[0],
        metrics_host="127.0.0.1",
    )
    prefix = unique_id("p")
    hot, warm, wide = f"{prefix}hot", f"{prefix}warm", f"{prefix}wide"
    result.classes = {"hot": f"={hot}", "warm": f"={warm}", "wide": f"={wide}"}
    clients: list[ClusterClient] = []

    def client(index: int) -> ClusterClient:
        made = ClusterClient(brokers[index].mqtt_port)
        clients.append(made)
        return made

    client(0).subscribe(f"{hot}/#", 0)
    warm_sub = client(2)
    warm_sub.subscribe(f"{warm}/#", 0)
    probe_route(cluster, 1, warm_sub, f"{warm}/a")
    client(0).subscribe(f"{wide}/#", 0)
    job = start_job(spark, config)
    publishers: list[Publisher] = []
    try:
        # every broker's snapshots reach the job before the counted traffic starts
        wait_until(
            lambda: len(_spooled_brokers(result.out)) == 3, 120, what="snapshots of all 3 brokers spooled"
        )
        wait_until(lambda: _running(job), 120, interval_s=0.5, what="the job's queries running")
        result.t0 = time.time()
        for role, index, topic, rate in (
            ("hot", 0, f"{hot}/a", HOT_RATE),
            ("warm", 1, f"{warm}/a", WARM_RATE),
        ):
            times = result.sent.setdefault(result.classes[role], [])
            publishers.append(Publisher(client(index), topic, rate, times))
        for publisher in publishers:
            publisher.start()

        def at(offset_s: float) -> None:
            time.sleep(max(0.0, result.t0 + offset_s - time.time()))
            if job.failed():
                result.errors.append(str(job.failed()))

        at(WIDE_AT_S)
        result.wide_at = time.time()
        client(1).subscribe(f"{wide}/#", 0)
        client(2).subscribe(f"{wide}/#", 0)
        at(STOP_AT_S)
        job.stop()
        at(RESTART_AT_S)
        job = start_job(spark, config)
        restarted = job
        wait_until(
            lambda: _running(restarted), 120, interval_s=0.5, what="the restarted job's queries running"
        )
        at(KILL_AT_S)
        result.killed_at = time.time()
        cluster.kill_broker(2)
        time.sleep(KILL_FOR_S)
        cluster.restart_broker(2)
        result.restarted_at = time.time()
        at(result.restarted_at - result.t0 + AFTER_S)
        for publisher in publishers:
            publisher.stop.set()
            publisher.join(5)
        result.t_end = time.time()
        after_end = pd.Timestamp(result.t_end + 1, unit="s", tz="UTC")

        def written_past_end() -> bool:
            for table in ("class_windows", "broker_metrics"):
                windows = result.table(table)
                if windows.empty or not (windows["window_start"] >= after_end).any():
                    return False
            return True

        wait_until(written_past_end, 90, interval_s=0.5, what="the windows after the traffic written")
        url = f"http://127.0.0.1:{config.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            result.metrics_text = response.read().decode()
        if job.failed():
            result.errors.append(str(job.failed()))
        for query in job.queries:  # shown with a failure: how fast the micro-batches went
            print(
                query.name,
                [
                    (p["batchId"], p["numInputRows"], p["durationMs"].get("triggerExecution"))
                    for p in query.recentProgress
                ],
            )
        yield result
    finally:
        for publisher in publishers:
            publisher.stop.set()
        job.stop()
        for made in clients:
            try:
                made.close()
            except Exception:
                pass


def test_the_driver_serves_its_batches_rows_and_windows_on_metrics(run: Run) -> None:
    """--metrics-port: the restarted job's /metrics counts what it wrote (pipeline.metrics)."""
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(run.metrics_text)
        for sample in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), float("nan"))

    for query in ("snapshots", "metrics"):
        assert value("skipmq_pipeline_batches_total", query=query) >= 1, (query, run.metrics_text)
        assert value("skipmq_pipeline_query_up", query=query) == 1.0, query
        assert value("skipmq_pipeline_window_lag_seconds_count", query=query) >= 1, query
    written = {table: len(run.table(table)) for table in ("class_windows", "broker_metrics")}
    for table, rows in written.items():
        counted = value("skipmq_pipeline_rows_written_total", table=table)
        # counted by the restarted job only (its own registry): at least the windows after the traffic
        assert counted >= 1, (table, counted, rows)
        end = value("skipmq_pipeline_last_window_end_timestamp_seconds", table=table)
        assert run.t_end < end < time.time() + 60, (table, end, run.t_end)


def test_the_job_finds_the_hot_class(run: Run) -> None:
    hot = run.interior(run.table("hot_classes"), 1, run.end_s - 1)
    first = hot[hot["rank"] == 1]
    assert len(first) >= 4, f"too few whole windows: {first}"
    assert set(first["class"]) == {run.classes["hot"]}, first[["window_start", "class", "publishes"]]


def test_publish_rates_are_within_10_percent_of_what_was_published(run: Run) -> None:
    windows = run.table("class_windows")
    for role in ("hot", "warm"):
        cls = run.classes[role]
        rows = run.interior(windows[windows["class"] == cls], 1, run.end_s - 1)
        assert len(rows) >= 4
        for _, row in rows.iterrows():
            expected = sent_in(run.sent[cls], row) / WINDOW_S
            assert abs(row["publish_rate"] - expected) <= 0.1 * expected, (
                role,
                row["window_start"],
                expected,
            )
    # and not one publish of the hot class lost or counted twice, across the job's restart
    hot = windows[windows["class"] == run.classes["hot"]]
    assert round(hot["publishes"].sum(), 6) == len(run.sent[run.classes["hot"]])


def test_the_imbalance_the_traffic_created(run: Run) -> None:
    """Broker 0 takes HOT_RATE publishes/s, broker 1 WARM_RATE publishes/s, broker 2 delivers the
    warm class: the load is max/mean = HOT / ((HOT + 2 WARM) / 3), before the kill."""
    imbalance = run.interior(run.table("imbalance"), 1, run.killed_at - run.t0)
    assert len(imbalance) >= 3
    for _, row in imbalance.iterrows():
        hot = sent_in(run.sent[run.classes["hot"]], row)
        warm = sent_in(run.sent[run.classes["warm"]], row)
        expected = hot / ((hot + 2 * warm) / 3)
        assert abs(row["imbalance"] - expected) <= 0.1 * expected, (
            row["window_start"],
            row["imbalance"],
            expected,
        )
        assert row["busiest_broker"] == run.peers[0]
    outliers = run.interior(run.table("outliers"), 1, run.killed_at - run.t0)
    assert set(outliers[outliers["metric"] == "load"]["broker"]) == {run.peers[0]}


def test_the_class_pushed_over_l_is_found_with_its_time(run: Run) -> None:
    crossings = run.table("l_crossings")
    wide = crossings[(crossings["class"] == run.classes["wide"]) & (crossings["direction"] == "multi_hop")]
    assert len(wide) >= 1, crossings
    crossed_at = pd.to_datetime(wide["crossed_at"], utc=True).min().timestamp()
    assert run.wide_at - 0.5 <= crossed_at <= run.wide_at + 5, (crossed_at, run.wide_at)
    assert int(wide["subscriber_brokers"].max()) == 3 and int(wide["table_size"].max()) == 2
    # no other class of the test crossed L
    others = crossings[crossings["class"].isin([run.classes["hot"], run.classes["warm"]])]
    assert others.empty


def test_hops_and_wasted_forwards_of_the_forwarded_class(run: Run) -> None:
    windows = run.table("class_windows")
    warm = run.interior(windows[windows["class"] == run.classes["warm"]], 1, run.killed_at - run.t0)
    assert len(warm) >= 3
    assert (warm["received"] > 0).all() and (warm["wasted_ratio"] == 0).all()
    assert (warm["hop_p50"] >= 1).all() and (warm["hop_p99"] >= warm["hop_p50"]).all()


def test_restart_from_the_checkpoint_neither_duplicates_nor_loses_a_window(run: Run) -> None:
    windows = run.table("class_windows")
    assert not windows.duplicated(["window_start", "class"]).any()
    hot = windows[windows["class"] == run.classes["hot"]].sort_values("window_start")
    starts = [ts.timestamp() for ts in hot["window_start"]]
    steps = {round(later - earlier) for earlier, later in itertools.pairwise(starts)}
    assert steps == {WINDOW_S}, f"gaps in the windows across the restart: {starts}"
    # the windows during which the job was stopped are there
    stopped = run.interior(hot, STOP_AT_S, RESTART_AT_S + WINDOW_S)
    assert len(stopped) >= 1
    # and so are the snapshots the other brokers published meanwhile: broker 2 delivered every
    # warm message broker 1 published, window after window, until it was killed
    warm = run.interior(windows[windows["class"] == run.classes["warm"]], 1, run.killed_at - run.t0)
    published, delivered = float(warm["publishes"].sum()), float(warm["deliveries"].sum())
    assert abs(delivered - published) <= 0.05 * published, (published, delivered)


def test_a_broker_killed_and_restarted_does_not_stop_the_job(run: Run) -> None:
    assert run.errors == []
    load = run.table("broker_load")
    back = pd.Timestamp(run.restarted_at, unit="s", tz="UTC")
    assert run.peers[2] in set(load[load["window_start"] >= back]["broker"]), (
        "broker 2's snapshots after its restart"
    )
    metrics = run.table("broker_metrics")
    up = metrics[(metrics["name"] == "up") & (metrics["instance"] == run.instances[2])]
    assert (up["min"] == 0).any(), "the HTTP source saw broker 2 down"
    assert (up[up["window_start"] >= back]["max"] == 1).any(), "... and up again"


def test_findings_are_published_retained_on_sys_analytics(run: Run, cluster: LocalCluster) -> None:
    watcher = ClusterClient(cluster.brokers[1].mqtt_port)
    try:
        watcher.subscribe("$SYS/skipmq/analytics/hot_classes", 0)
        message = watcher.wait_messages(1)[0]
        assert message.retain
        rows = json.loads(message.payload)["rows"]
        # the latest batch's finding: the top classes of the windows that batch updated (which
        # windows depends on the batches' timing: after broker 0's kill only the warm class is
        # published), each row as the job wrote it to the hot_classes table
        assert rows, message.payload
        table = run.table("hot_classes")
        written = {(r["class"], int(r["rank"]), int(r["publishes"])) for r in table.to_dict("records")}
        for row in rows:
            assert (row["class"], int(row["rank"]), int(row["publishes"])) in written, row
        assert {row["class"] for row in rows} & {run.classes["hot"], run.classes["warm"]}
    finally:
        watcher.close()


def test_the_report_draws_the_job_tables(run: Run, tmp_path: Path) -> None:
    from pipeline.report import build_report

    report = build_report(run.out, tmp_path / "report", top=3)
    text = report.read_text()
    assert run.classes["hot"] in text and run.classes["wide"] in text
    for chart in ("publish_rates.png", "broker_load.png", "hops_wasted.png", "l_crossings.png"):
        data = (tmp_path / "report" / chart).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
