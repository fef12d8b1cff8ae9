"""The committed generated code (broker/transport/_pb) matches protos/skipmq/v1.

Runs ``scripts/gen_protos.py --check`` (regenerates into a temp dir and diffs).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_generated_code_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_protos.py"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"gen_protos --check failed:\n{result.stdout}\n{result.stderr}"
    assert "up to date" in result.stdout


def test_generated_package_imports_and_names_the_peerlink_service() -> None:
    from broker.adapters.transport._pb.skipmq.v1 import cluster_pb2, cluster_pb2_grpc

    service = cluster_pb2.DESCRIPTOR.services_by_name["PeerLink"]
    method = service.methods_by_name["Open"]
    assert method.client_streaming and method.server_streaming
    assert method.input_type.full_name == method.output_type.full_name == "skipmq.v1.Frame"
    assert cluster_pb2.DESCRIPTOR.package == "skipmq.v1"
    assert hasattr(cluster_pb2_grpc, "PeerLinkStub")
