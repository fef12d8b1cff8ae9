"""Fixtures for the multi-process cluster suite: real SkipMQ brokers joined over gRPC, real clients.

- ``cluster3``, ``cluster2``: a module-scoped 3- or 2-broker cluster (tests sharing it use unique
  topics/client ids).
- ``cluster_factory(n, settings=...)``: a cluster for one test, closed after it.
- ``client_factory(cluster, i, **ClusterClient kwargs)``: a paho client connected to broker i.
- A failing test's report gets the log tail of every broker of every live cluster.
Helpers (wait_until, probe_route, ...) live in cluster_support.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import LIVE_CLUSTERS, ClientFactory, ClusterClient, ClusterFactory
from tools.launcher import LocalCluster, start_cluster

READY_TIMEOUT_S = 30.0
# Left out of failure reports (repeated reconnect attempts would push everything else out).
NOISY_LOG_LINES = ("dial to ",)
# Faster failure detection than the defaults, so kill -9 tests stay short.
FAST_SETTINGS: dict[str, str] = {
    "cluster.ping_interval_ms": "500",
    "cluster.failure_timeout_ms": "2000",
}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for number, cluster in enumerate(LIVE_CLUSTERS):
            tails = cluster.logs_tail(40, exclude=NOISY_LOG_LINES)
            report.sections.append((f"cluster {number} broker log tails", tails))


def _close(cluster: LocalCluster) -> None:
    cluster.close()
    if cluster in LIVE_CLUSTERS:
        LIVE_CLUSTERS.remove(cluster)


def _module_cluster(tmp_path_factory: pytest.TempPathFactory, n: int) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp(f"cluster{n}")
    started: list[LocalCluster] = []
    try:
        cluster = start_cluster(n, settings=dict(FAST_SETTINGS), data_root=str(root))
        started.append(cluster)
        LIVE_CLUSTERS.append(cluster)
        cluster.wait_ready(READY_TIMEOUT_S)
        yield cluster
    finally:
        for cluster in started:
            _close(cluster)


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from _module_cluster(tmp_path_factory, 3)


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from _module_cluster(tmp_path_factory, 2)


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[ClusterFactory]:
    """make(n, settings=None) -> a started, ready cluster closed after the test."""
    started: list[LocalCluster] = []

    def make(n: int, settings: dict[str, str] | None = None) -> LocalCluster:
        root = tmp_path / f"cluster{len(started)}"
        merged = {**FAST_SETTINGS, **(settings or {})}
        cluster = start_cluster(n, settings=merged, data_root=str(root))
        started.append(cluster)
        LIVE_CLUSTERS.append(cluster)
        cluster.wait_ready(READY_TIMEOUT_S)
        return cluster

    yield make
    for cluster in started:
        _close(cluster)


@pytest.fixture
def client_factory() -> Iterator[ClientFactory]:
    """make(cluster, i, **ClusterClient kwargs) -> a client connected to broker i, closed at teardown."""
    made: list[ClusterClient] = []

    def make(cluster: LocalCluster, index: int, **kwargs: Any) -> ClusterClient:
        broker = cluster.brokers[index]
        kwargs.setdefault("host", broker.host)
        client = ClusterClient(broker.mqtt_port, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        try:
            client.close()
        except Exception:
            pass
