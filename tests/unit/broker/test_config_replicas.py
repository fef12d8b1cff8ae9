"""``cluster.replicas``: default 1 (no replication), validated, and refused by a broker process above
1 while replication runs in the whole-cluster simulation only (docs/notes/replication.md)."""

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


def test_a_broker_process_refuses_more_than_one_replica_naming_the_key(tmp_path: Path) -> None:
    config = load_config(env={}, overrides={"cluster.replicas": 2, "cluster.insecure": True})
    with pytest.raises(ConfigError, match=r"cluster\.replicas: 2 is not supported by a broker process"):
        validate_cluster_links(config)
    validate_cluster_links(load_config(env={}, overrides={"cluster.insecure": True}))  # 1 starts
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
    assert "configuration error: cluster.replicas: 2 is not supported" in failed.stderr
