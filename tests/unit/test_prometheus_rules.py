"""The Prometheus rules (deploy/prometheus/skipmq.rules.yml) pass promtool and their unit tests.

``promtool check rules`` validates the file; ``promtool test rules`` runs
tests/unit/prometheus/skipmq.rules.test.yml, where every alert fires and does not fire and the
recording rules are checked by value. The tests here also check that file covers every alert both
ways, that every alert carries summary, description, runbook_url and severity, that the rules only
use metrics the broker exports, and that the cluster dashboard's hop panel reads whole hops (its
own expressions, run through promtool).

promtool comes from Debian's ``prometheus`` package (scripts/setup.sh installs it). Without it
these tests fail rather than skip, like the mosquitto interop tests: CI must run them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_dashboards import exported_sample_names

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "skipmq.rules.yml"
RULE_TESTS = ROOT / "tests" / "unit" / "prometheus" / "skipmq.rules.test.yml"

# PromQL functions, keywords and operators the rules use (everything else word-like is a metric)
PROMQL_WORDS = {
    "sum",
    "count",
    "max",
    "min",
    "avg",
    "rate",
    "irate",
    "increase",
    "deriv",
    "max_over_time",
    "min_over_time",
    "histogram_quantile",
    "ceil",
    "and",
    "or",
    "unless",
    "bool",
    "time",
}


@pytest.fixture(scope="module")
def promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail(
            "promtool not found: it comes from Debian's prometheus package"
            " (`apt-get install -y prometheus` as root; bash scripts/setup.sh does it)"
        )
    return tool


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def test_promtool_check_rules(promtool: str) -> None:
    result = run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_rule_unit_tests(promtool: str) -> None:
    result = run(promtool, "test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    names = [alert["alert"] for alert in alerts()]
    assert names, "no alerts parsed: the test would pass vacuously"
    for name in names:
        firing = [case for case in cases if case["alertname"] == name and case.get("exp_alerts")]
        quiet = [case for case in cases if case["alertname"] == name and not case.get("exp_alerts")]
        assert firing, f"{name}: no promtool case where it fires"
        assert quiet, f"{name}: no promtool case where it does not fire"
    unknown = {case["alertname"] for case in cases} - set(names)
    assert not unknown, f"promtool cases for alerts the rules do not define: {unknown}"


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    docs = (ROOT / "docs" / "observability.md").read_text()
    for alert in alerts():
        name = alert["alert"]
        assert alert.get("labels", {}).get("severity") in ("critical", "warning"), name
        annotations = alert.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            assert annotations.get(key), f"{name}: no {key}"
        anchor = f"docs/observability.md#{name.lower()}"
        assert annotations["runbook_url"] == anchor, name
        assert f"### {name}" in docs, f"docs/observability.md has no section for {name}"


def metric_names(expr: str) -> set[str]:
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    words = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
    return {word for word in words if word not in PROMQL_WORDS}


def test_rules_only_use_exported_metrics() -> None:
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    available = exported_sample_names() | recorded | {"up"}  # up: Prometheus' own, per target
    used: set[str] = set()
    for rule in rules():
        used |= metric_names(rule["expr"])
    assert "skipmq_cluster_peers_connected" in used, "the parser missed names: the test would be vacuous"
    missing = used - available
    assert not missing, f"the rules use metrics the broker does not export: {sorted(missing)}"


def test_dashboard_hop_panel_reads_whole_hops(promtool: str, tmp_path: Path) -> None:
    """The overlay dashboard's own p50/p99 hop expressions ($job and $instance set to All), on
    traffic that all took one hop, read 1 (histogram_quantile alone reads 0.5: checked too, so this
    test can tell the two apart); on a 95 % / 5 % mix of 2 and 5 hops they read 2 and 5 (one bucket
    per hop count: 5 is not rounded up to a wider bucket's bound)."""
    dashboard = json.loads((ROOT / "dashboards" / "skipmq-overlay.json").read_text())
    (panel,) = [p for p in dashboard["panels"] if p["title"].startswith("Overlay hops per delivery")]
    exprs = [target["expr"].replace("$job", ".*").replace("$instance", ".*") for target in panel["targets"]]
    assert len(exprs) == 2
    buckets = [str(k) for k in range(1, 17)] + ["+Inf"]

    def series(instance: str, counts: dict[int, int]) -> list[dict[str, str]]:
        out = []
        for le in buckets:
            per_minute = sum(n for hops, n in counts.items() if le == "+Inf" or hops <= int(le))
            labels = f'job="skipmq", instance="{instance}", le="{le}"'
            out.append(
                {"series": f"skipmq_cluster_delivery_hops_bucket{{{labels}}}", "values": f"0+{per_minute}x10"}
            )
        return out

    raw = "histogram_quantile(0.5, sum by (le) (rate(skipmq_cluster_delivery_hops_bucket[5m])))"
    one_hop = [
        {"expr": expr, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 1}]} for expr in exprs
    ] + [{"expr": raw, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 0.5}]}]
    mixed = [
        {"expr": expr, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": value}]}
        for expr, value in zip(exprs, (2, 5), strict=True)
    ]
    spec = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series("b1", {1: 10}) + series("b2", {1: 10}),
                "promql_expr_test": one_hop,
            },
            {"interval": "1m", "input_series": series("b1", {2: 95, 5: 5}), "promql_expr_test": mixed},
        ],
    }
    path = tmp_path / "hops.test.yml"
    path.write_text(yaml.safe_dump(spec))
    result = run(promtool, "test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
