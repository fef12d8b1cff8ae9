"""The Grafana dashboards are generated and only query metrics the broker really exports."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from broker.adapters.cluster_runtime import ClusterRuntime
from broker.config import load_config
from broker.metrics import BrokerStats, make_registry, render
from simulation.world import ProcessScheduler, World

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "dashboards"))
import generate  # noqa: E402

PROMQL_WORDS = {
    "sum",
    "by",
    "rate",
    "max",
    "min",
    "avg",
    "irate",
    "increase",
    "label_values",
    "on",
    "without",
    "histogram_quantile",
    "ceil",
    "le",
}


def exported_sample_names() -> set[str]:
    registry = make_registry(BrokerStats())
    registry.register(
        ClusterRuntime(load_config(None, env={}), ProcessScheduler(World(0))).collector()
    )  # not started: zero values
    body, _content_type = render(registry)
    names: set[str] = set()
    for family in text_string_to_metric_families(body.decode()):
        names.update(sample.name for sample in family.samples)
    return names


def queried_metric_names(dashboard: dict) -> set[str]:
    names: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r"\{[^}]*\}", "", target["expr"])  # drop label matchers
            expr = re.sub(r"\[[^\]]*\]", "", expr)  # drop range selectors
            expr = re.sub(r"\([^()]*\)\s*\(", "(", expr)  # drop "by (labels)" groupings
            for word in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
                if word not in PROMQL_WORDS:
                    names.add(word)
    return names


def test_committed_dashboards_match_the_generator() -> None:
    for name in generate.DASHBOARDS:
        committed = (ROOT / "dashboards" / name).read_text()
        assert committed == generate.render(name), f"run: python dashboards/generate.py ({name} is stale)"


def test_every_queried_metric_is_exported() -> None:
    exported = exported_sample_names()
    for name in generate.DASHBOARDS:
        dashboard = json.loads((ROOT / "dashboards" / name).read_text())
        queried = queried_metric_names(dashboard)
        assert queried, "the parser found no metric names: the test would pass vacuously"
        missing = queried - exported
        assert not missing, f"{name} queries metrics the broker does not export: {sorted(missing)}"


def test_panel_ids_unique_and_layout_fits_grid() -> None:
    for name in generate.DASHBOARDS:
        dashboard = json.loads((ROOT / "dashboards" / name).read_text())
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(ids) == len(set(ids))
        for panel in dashboard["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24


def test_every_exported_metric_family_is_documented() -> None:
    """docs/configuration.md § Metrics lists every family /metrics serves (broker and cluster)."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    registry = make_registry(BrokerStats())
    registry.register(ClusterRuntime(load_config(None, env={}), ProcessScheduler(World(0))).collector())
    body, _content_type = render(registry)
    families = [f.name for f in text_string_to_metric_families(body.decode()) if f.name.startswith("skipmq_")]
    assert families, "no families parsed: the test would pass vacuously"
    missing = [name for name in families if f"`{name}" not in text]
    assert not missing, f"metrics missing from docs/configuration.md: {missing}"
