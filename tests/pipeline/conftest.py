"""Fixtures of the pipeline tests: ONE Spark session (local[2]) for every pipeline test, and a
3-broker SkipMQ cluster publishing per-class snapshots every second with L = 2.

Spark's start costs 10-30 s on a 2-core machine: every test here shares the session-scoped
``spark`` fixture. A missing Java or PySpark fails with what to install (pipeline.session).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.support.cluster import LIVE_CLUSTERS
from tools.launcher import LocalCluster, start_cluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CLUSTER_SETTINGS = {
    "cluster.class_snapshot_interval_s": "1",
    "cluster.table_size": "2",  # L = 2: a class subscribed on all 3 brokers is over L
    "cluster.ping_interval_ms": "500",
    "cluster.failure_timeout_ms": "2000",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pipeline.session import build_session

    session = build_session("local[2]", app_name="skipmq-pipeline-tests")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("pipeline-cluster")
    cluster = start_cluster(3, settings=dict(CLUSTER_SETTINGS), data_root=str(root))
    LIVE_CLUSTERS.append(cluster)
    try:
        cluster.wait_ready(30)
        yield cluster
    finally:
        cluster.close()
        LIVE_CLUSTERS.remove(cluster)
