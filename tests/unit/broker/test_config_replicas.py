"""``cluster.replicas``: default 1 (no replication), validated, and refused by a broker process above
1 where it cannot be honoured - without a cluster, or without this broker's own copy on disk
(docs/cluster.md, Replicas)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import ConfigError, load_config, validate_cluster_links
from tests.unit.broker.test_core_persistence import REPO_ROOT


def test_replicas_defaults_to_one_and_is_checked_against_its_range() -> None:
    assert load_config(env={}).cluster.replicas == 1
    assert load_config(env={"SKIPMQ_CLUSTER_REPLICAS": "2"}).cluster.replicas == 2
    for bad in (0, 8):
        with pytest.raises(ConfigError, match=r"cluster\.replicas: must be an integer in 1\.\.7"):
            load_config(env={}, overrides={"cluster.replicas": bad})
    with pytest.raises(ConfigError, match=r"cluster\.replicas"):
        load_config(env={"SKIPMQ_CLUSTER_REPLICAS": "two"})


def test_a_broker_process_refuses_replicas_it_cannot_honour_naming_the_key(tmp_path: Path) -> None:
    clustered = {"cluster.enabled": True, "cluster.insecure": True}
    validate_cluster_links(load_config(env={}, overrides={**clustered, "cluster.replicas": 2}))  # starts
    validate_cluster_links(load_config(env={}, overrides={"cluster.insecure": True}))  # 1 starts
    with pytest.raises(ConfigError, match=r"cluster\.replicas: 2 copies need a cluster"):
        validate_cluster_links(load_config(env={}, overrides={"cluster.replicas": 2}))
    for store in ({"store.persistence": False}, {"store.path": ":memory:"}):
        config = load_config(env={}, overrides={**clustered, **store, "cluster.replicas": 3})
        with pytest.raises(ConfigError, match=r"cluster\.replicas: 3 copies need this broker.s own copy"):
            validate_cluster_links(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKIPMQ_")}
    args = ["--port", "0", "--http-port", "0", "--data-dir", str(tmp_path), "--set", "cluster.replicas=2"]
    failed = subprocess.run(
        [sys.executable, "-m", "broker", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr[-2000:]
    assert "configuration error: cluster.replicas: 2 copies need a cluster" in failed.stderr
