"""The links' metric families on a broker's /metrics (broker/adapters/cluster_runtime.py): the
refusals a transport counted are served as ``skipmq_cluster_link_refused_total{code}`` beside the
cluster's own families."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from broker.adapters.cluster_runtime import ClusterRuntime
from broker.config import load_config
from broker.metrics import BrokerStats, make_registry, render
from simulation.world import ProcessScheduler, World


def _samples(runtime: ClusterRuntime) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = make_registry(BrokerStats())
    registry.register(runtime.collector())
    body, _content_type = render(registry)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def test_link_refusals_are_served_per_status_code_beside_the_cluster_families() -> None:
    runtime = ClusterRuntime(load_config(None, env={}), ProcessScheduler(World(0)))
    before = _samples(runtime)  # not started: the family is there, without series
    assert not [key for key in before if key[0] == "skipmq_cluster_link_refused_total"]
    assert ("skipmq_cluster_peers_connected", ()) in before
    runtime.transport = SimpleNamespace(refusals={"PERMISSION_DENIED": 2, "INVALID_ARGUMENT": 1})
    after = _samples(runtime)
    assert after[("skipmq_cluster_link_refused_total", (("code", "PERMISSION_DENIED"),))] == 2
    assert after[("skipmq_cluster_link_refused_total", (("code", "INVALID_ARGUMENT"),))] == 1
