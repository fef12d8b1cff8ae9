"""The local-cluster launcher (tools/launcher.py): ports, processes, stop/kill/restart.

Real broker processes started with clustering flags; the first test also checks the GET /cluster
contract of docs/cluster.md (peer id "127.0.0.1:<cluster_port>", joined, connected peers).
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest

from tests.support.cluster import ClusterClient, unique_id, wait_until
from tools.launcher import LocalCluster, main, parse_settings, start_cluster


def test_brokers_start_with_distinct_ports_join_through_the_earlier_ones_and_say_so_on_cluster(
    tmp_path: Path,
) -> None:
    """One 3-broker cluster for the launcher's ports, processes and logs, then the GET /cluster
    contract (the two were a cluster each)."""
    cluster = start_cluster(3, data_root=str(tmp_path))
    try:
        ports = [p for b in cluster.brokers for p in (b.mqtt_port, b.http_port, b.cluster_port)]
        assert len(set(ports)) == 9, ports
        for index, broker in enumerate(cluster.brokers):
            assert broker.alive()
            assert broker.index == index
            assert broker.peer_id == f"127.0.0.1:{broker.cluster_port}"
            health = cluster.healthz(index)
            assert health["status"] == "ok"
            assert health["node_id"] == broker.node_id
            assert Path(broker.data_dir).is_dir()
            assert Path(broker.log_path).parent == tmp_path
            earlier = [b.peer_id for b in cluster.brokers[:index]]
            assert broker.joined_through == earlier
            first_line = broker.log_text().splitlines()[0]
            assert f"--cluster-port {broker.cluster_port}" in first_line
            assert ("--join" in first_line) == (index > 0)
            # the broker's own "listening" log record names the ports we gave it
            listening = [r for r in broker.log_records() if r.get("event") == "listening"]
            assert listening and listening[0]["tcp"] == broker.mqtt_port
            assert listening[0]["http"] == broker.http_port
        # GET /cluster (docs/cluster.md): peer id "127.0.0.1:<cluster_port>", joined, connected peers
        cluster.wait_ready(30)
        peer_ids = {b.peer_id for b in cluster.brokers}
        for index, broker in enumerate(cluster.brokers):
            state = cluster.cluster_state(index)
            assert state["peer_id"] == broker.peer_id
            assert state["joined"] is True
            # every broker ends up linked to at least one other (bounded wait: links form async)
            others = peer_ids - {broker.peer_id}

            def linked(i: int = index, others: set[str] = others) -> bool:
                return bool(set(cluster.cluster_state(i)["connected_peers"]) & others)

            wait_until(linked, 10, what=f"broker {index} connected to another broker")
            state = cluster.cluster_state(index)
            assert set(state["connected_peers"]) <= others
    finally:
        cluster.close()
    assert all(not b.alive() for b in cluster.brokers)
    assert (tmp_path / "broker-0.log").exists(), "a given data root (with the logs) is kept"


def test_stop_kill_and_restart_keep_ports_and_data(tmp_path: Path) -> None:
    cluster = start_cluster(2, data_root=str(tmp_path))
    client: ClusterClient | None = None
    try:
        broker = cluster.brokers[1]
        ports_before = (broker.mqtt_port, broker.http_port, broker.cluster_port)
        client_id = unique_id("restart")
        client = ClusterClient(broker.mqtt_port, client_id=client_id, clean=False, session_expiry_s=300)
        client.subscribe("launcher/restart", 1)
        client.disconnect()

        assert cluster.stop_broker(1) == 0, "SIGTERM must stop a broker gracefully with status 0"
        assert not broker.alive()
        cluster.restart_broker(1)
        assert broker.alive() and broker.starts == 2
        assert (broker.mqtt_port, broker.http_port, broker.cluster_port) == ports_before
        client.connect()
        assert client.session_present, "the restarted broker must reuse its data directory"
        client.disconnect()

        cluster.kill_broker(0)
        assert cluster.brokers[0].process is not None
        assert cluster.brokers[0].process.returncode == -signal.SIGKILL
        assert cluster.live_indexes() == [1]
        cluster.restart_broker(0)
        assert cluster.healthz(0)["status"] == "ok"
        assert cluster.live_indexes() == [0, 1]
    finally:
        if client is not None:
            client.close()
        cluster.close()
    assert cluster.live_indexes() == []


def test_owned_data_root_is_removed_and_close_is_idempotent() -> None:
    cluster = LocalCluster(1)
    root = Path(cluster.data_root)
    cluster.start()
    assert root.is_dir() and cluster.brokers[0].alive()
    cluster.close()
    cluster.close()
    assert not root.exists()
    assert not cluster.brokers[0].alive()


def test_bad_input_is_rejected_with_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="at least 1 broker"):
        LocalCluster(0)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_settings(["cluster.table_size"])
    assert main(["--brokers", "0"]) == 2
    assert "--brokers must be at least 1" in capsys.readouterr().err
    assert main(["--set", "novalue"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_a_broker_that_cannot_start_is_reported_with_its_log(tmp_path: Path) -> None:
    cluster = LocalCluster(1, data_root=str(tmp_path), settings={"cluster.table_size": "1"})
    with pytest.raises(RuntimeError, match=r"exited with status 2[\s\S]*table_size"):
        cluster.start()
    assert cluster.live_indexes() == []


def test_a_port_taken_after_it_was_picked_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other programs may grab a picked port before the broker binds it: the launcher retries."""
    import tools.launcher as launcher

    real_free_ports = launcher.free_ports
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = int(squatter.getsockname()[1])
        calls: list[list[int]] = []

        def first_pick_is_taken(count: int, host: str = "127.0.0.1") -> list[int]:
            ports = real_free_ports(count, host)
            if not calls:
                ports[0] = taken  # the MQTT port of the first attempt
            calls.append(ports)
            return ports

        monkeypatch.setattr(launcher, "free_ports", first_pick_is_taken)
        messages: list[str] = []
        cluster = LocalCluster(1, data_root=str(tmp_path), progress=messages.append)
        try:
            cluster.start()
            broker = cluster.brokers[0]
            assert broker.alive() and broker.mqtt_port != taken
            assert len(calls) == 2
            assert any("retrying with new ports" in m for m in messages)
            assert "address already in use" in broker.log_text()
            assert cluster.healthz(0)["status"] == "ok"
        finally:
            cluster.close()
