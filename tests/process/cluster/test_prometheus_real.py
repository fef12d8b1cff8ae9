"""A real Prometheus scrapes a real 3-broker cluster under traffic; every dashboard panel's and
every rule's expression goes through its HTTP API (issue #14).

Debian's ``prometheus`` (scripts/setup.sh installs it) runs on a free loopback port with its data
in a temporary directory, scraping the brokers' /metrics every second and evaluating
deploy/prometheus/skipmq.rules.yml every second. A subscriber on brokers 1 and 2 and a QoS 1
publisher on broker 0 make traffic on one topic: both subscriber brokers are in the publisher's
routing table (L = 60), so every forwarded delivery takes one hop. Then:

* every expression of the five dashboards ($job and $instance set to "all") and every rule's
  expression is answered with status "success"; the dashboard targets that must have data on such a
  cluster (``Target.data``) return a number; the Spark pipeline dashboard's (``Target.data`` False:
  no Spark job runs here) return nothing, as they read only the job driver's ``skipmq_pipeline_*``;
* the hop panel reads 1 (p50 and p99), where histogram_quantile alone would read 0.5;
* no alert's expression returns anything (a healthy cluster), every rule evaluates without error
  (``/api/v1/rules``), and every recording rule has produced a series.

Bounded: the cluster starts in ~5 s, Prometheus needs ~10 s of scrapes; the whole test < 60 s.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cluster import ClientFactory, ClusterFactory, Streamer, probe_route, unique_id, wait_until
from tools.ports import free_ports

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "skipmq.rules.yml"
sys.path.insert(0, str(ROOT / "dashboards"))
import generate  # noqa: E402

JOB = "skipmq"
pytestmark = pytest.mark.timeout(120)


class Prometheus:
    """A Prometheus server process on 127.0.0.1:<port>, data in ``root``."""

    def __init__(self, root: Path, targets: list[str]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail(
                "prometheus not found: Debian's prometheus package (bash scripts/setup.sh installs it)"
            )
        (self.port,) = free_ports(1)
        shutil.copy(RULES, root / "skipmq.rules.yml")
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": ["skipmq.rules.yml"],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}],
        }
        (root / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (root / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
        self.log_path = root / "prometheus.log"

    def get(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = self.get("/api/v1/query", query=expr)
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.log.close()


@pytest.fixture
def prometheus_root(tmp_path: Path) -> Path:
    root = tmp_path / "prometheus"
    root.mkdir()
    return root


def numbers(result: list[dict[str, Any]]) -> list[float]:
    return [float(sample["value"][1]) for sample in result if not math.isnan(float(sample["value"][1]))]


def instant(expr: str) -> str:
    """A dashboard expression as Grafana sends it with $job and $instance set to All (.*)."""
    return expr.replace("$job", ".*").replace("$instance", ".*")


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


@pytest.fixture
def prometheus(
    cluster_factory: ClusterFactory, prometheus_root: Path, client_factory: ClientFactory
) -> Iterator[Any]:
    cluster = cluster_factory(3)
    topic = f"obs/{unique_id('t')}"
    subscribers = [client_factory(cluster, index) for index in (1, 2)]
    for subscriber in subscribers:
        subscriber.subscribe(topic, qos=1)
    for subscriber in subscribers:
        probe_route(cluster, 0, subscriber, topic)
    publisher = client_factory(cluster, 0)
    streamer = Streamer(publisher, topic, interval_s=0.02)  # ~50 QoS 1 messages a second
    streamer.start()
    server = Prometheus(prometheus_root, [f"127.0.0.1:{broker.http_port}" for broker in cluster.brokers])
    try:
        wait_until(server.ready, 15.0, what="Prometheus ready")
        yield server, subscribers
    finally:
        streamer.stop()
        server.stop()


def test_every_panel_and_rule_expression_against_a_real_prometheus(prometheus: Any) -> None:
    server, subscribers = prometheus
    # every broker scraped, and enough samples of the traffic for rate() and the histograms
    wait_until(
        lambda: len(numbers(server.query(f'up{{job="{JOB}"}} == 1'))) == 3, 15.0, what="3 brokers scraped"
    )
    wait_until(
        lambda: (
            numbers(server.query("sum(rate(skipmq_cluster_received_total[1m]))")) != [0.0]
            and numbers(server.query("sum(rate(skipmq_cluster_received_total[1m]))"))
        ),
        15.0,
        what="forwarded traffic seen by rate()",
    )
    wait_until(
        lambda: numbers(server.query("sum(rate(skipmq_cluster_publish_confirm_seconds_count[1m])) > 0")),
        15.0,
        what="sampled publish confirmations",
    )
    assert subscribers[0].messages.qsize() > 0 and subscribers[1].messages.qsize() > 0

    empty: list[str] = []
    spark_answered: list[str] = []
    checked = 0
    for name in generate.DASHBOARDS:
        dashboard = json.loads((ROOT / "dashboards" / name).read_text())
        specs = {spec.title: spec for spec in generate.DASHBOARDS[name][3]}
        for panel in dashboard["panels"]:
            for target, spec in zip(panel["targets"], specs[panel["title"]].targets, strict=True):
                assert target["expr"] == spec.expr
                result = server.query(instant(target["expr"]))  # asserts status "success"
                checked += 1
                if spec.data and not numbers(result):
                    empty.append(f"{name} / {panel['title']}: {target['expr']}")
                if name == "skipmq-spark-pipeline.json":
                    assert not spec.data, "no Spark job runs here: its panels cannot have data"
                    if result:
                        spark_answered.append(f"{panel['title']}: {target['expr']} -> {result}")
    assert checked > 60
    assert not spark_answered, "Spark pipeline panels answered from the brokers:\n" + "\n".join(
        spark_answered
    )
    assert not empty, "panels without data on a cluster under traffic:\n" + "\n".join(empty)

    # the hop panel on one-hop traffic: 1, not the 0.5 histogram_quantile alone gives
    overlay = json.loads((ROOT / "dashboards" / "skipmq-overlay.json").read_text())
    (hops,) = [p for p in overlay["panels"] if p["title"].startswith("Overlay hops per delivery")]
    for target in hops["targets"]:
        assert numbers(server.query(instant(target["expr"]))) == [1.0], target["expr"]
    raw = "histogram_quantile(0.5, sum by (le) (rate(skipmq_cluster_delivery_hops_bucket[5m])))"
    assert numbers(server.query(raw)) == [0.5]
    # the overlay's own figures, as the panels read them: the publisher's class is one-hop
    assert numbers(server.query('sum(skipmq_overlay_published_classes{delivery="one_hop"})')) == [1.0]
    assert numbers(server.query('sum(rate(skipmq_overlay_messages_sent_total{kind="PUB"}[1m]))'))[0] > 0
    assert numbers(server.query("max(skipmq_cluster_peer_suspected)")) == [0.0]

    # every rule: its expression answers; alerts are quiet on a healthy cluster
    for rule in rules():
        result = server.query(rule["expr"])
        if "alert" in rule:
            assert not result, f"{rule['alert']} would fire on a healthy cluster: {result}"
    # Prometheus' own evaluation of the rule file: no errors, every recording rule recorded
    records = [rule["record"] for rule in rules() if "record" in rule]
    wait_until(
        lambda: all(server.query(record) for record in records), 10.0, what="every recording rule recorded"
    )
    groups = server.get("/api/v1/rules")["data"]["groups"]
    evaluated = [rule for group in groups for rule in group["rules"]]
    assert len(evaluated) == len(rules())
    bad = [(rule["name"], rule.get("lastError")) for rule in evaluated if rule["health"] != "ok"]
    assert not bad, bad
