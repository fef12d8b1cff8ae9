"""A plain ``skipmq`` (embedded defaults: no cluster, no federation, no admin API, no pull
gateway) does not load what only those features use: grpc and protobuf (the inter-broker
transport), cryptography (the cluster's TLS identity checks), the overlay, the admin console.
Each of them costs the idle broker RSS (docs/benchmarks.md, the idle broker); they load where the
feature starts. The broker runs as users start it (``python -m broker``) and ``-X importtime``
lists every module it imported until its MQTT port accepted a connection.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.paths import REPO_ROOT
from tools.ports import free_ports

# top-level packages or modules that a single broker on defaults must not import
FEATURE_ONLY = (
    "grpc",
    "grpc_health",
    "google.protobuf",
    "cryptography",
    "overlay",
    "broker.adapters.transport",
    "broker.adapters.cluster_runtime",
    "broker.adapters.federation",
    "broker.adapters.admin.api",
    "broker.cluster.overlay_figures",
)


def imported_modules(importtime_stderr: str) -> set[str]:
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                names.add(name)
    return names


def test_plain_broker_does_not_import_cluster_federation_or_admin_modules(tmp_path: Path) -> None:
    mqtt_port, http_port = free_ports(2)
    command = [
        sys.executable, "-X", "importtime", "-m", "broker", "--bind", "127.0.0.1",
        "--port", str(mqtt_port), "--http-port", str(http_port), "--data-dir", str(tmp_path / "data"),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    with (tmp_path / "stderr").open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 30.0
        while True:
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", mqtt_port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the broker did not listen within 30 s"
                time.sleep(0.05)
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) == 0
    modules = imported_modules((tmp_path / "stderr").read_text())
    assert "broker.adapters.server" in modules and "aiohttp" in modules  # the listing is complete
    loaded = sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in FEATURE_ONLY))
    assert loaded == []
