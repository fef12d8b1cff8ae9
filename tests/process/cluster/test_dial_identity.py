"""A cluster broker reached under another broker's peer id is refused by the dialer
(docs/security.md "Who answers a dial"; the federation's equivalent is
tests/process/federation/test_federation_tls.py::test_a_broker_reached_under_another_name_is_refused_by_the_dialer).

Broker Y is a certified member of a real cluster (tools.launcher: the cluster CA, one certificate
per broker, mutual TLS, default limits). Two more brokers, certified by the same CA for their own
peer ids, are told to join through peer id X = ``127.0.0.1:<port>``, a TCP port forward to Y's
cluster port - as a NAT, a Service port or a stale address would route it: the broker that answers
is a real member, but not the one dialed. Each dialer, on its link runtime:

* refuses it - ``grpcio``: the answer's Hello names Y, not X (``wrong_peer_id``); ``h2``: Y's TLS
  certificate names Y, not X (``certificate``, checked before any Hello);
* counts it in ``skipmq_cluster_link_dial_refused_total{reason}`` (for this reason at every dial) and logs
  the structured event ``cluster_link_refused`` (``side`` ``dialer``, ``peer`` X, ``code``
  ``DIAL_<REASON>``, a reason naming Y);
* never links to X: no broker ever reports X among its connected peers, no dialer joins. The h2
  dialer (the default runtime) never shows itself to Y (its TLS handshake is aborted before its
  Hello): it never links at all and no message crosses between it and Y either way. The grpcio
  dialer's Hello names it, so Y learns its real id and may dial it back under Y's own id (each
  side checks the other's certificate and Hello): a link between two members, never one to X.

Planted bugs seen to fail it: the Hello's peer-id comparison off in
``broker/adapters/transport/link.py`` (grpcio then refuses with ``wrong_proof``); the certificate
check off in ``h2_runtime.py`` (h2 then refuses with ``wrong_peer_id``); both plus the challenge's
verdict off (the grpcio dialer joins through Y, which it lists as X).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.adapters.transport.tls import issue_broker_cert
from tests.support.cluster import ClientFactory, ClusterFactory, metric_total, unique_id, wait_until
from tests.support.port_forward import PortForward
from tools.launcher import REPO_ROOT, BrokerProcess, LocalCluster, http_get
from tools.ports import free_ports
from tools.start_wait import start_timeout_s

pytestmark = pytest.mark.slow

HOST = "127.0.0.1"
WAIT_S = 20.0  # a broker's start and its first dial on a loaded machine
REASONS = {"grpcio": "wrong_peer_id", "h2": "certificate"}


def _start_dialer(cluster: LocalCluster, runtime: str, join: str) -> BrokerProcess:
    """A broker certified by ``cluster``'s CA for its own peer id, on link runtime ``runtime``,
    joining through ``join`` only; added to ``cluster.brokers`` (so the cluster's close stops it
    and a failure report shows its log)."""
    index = len(cluster.brokers)
    mqtt_port, http_port, cluster_port = free_ports(3)
    data_dir = Path(cluster.data_root) / f"broker-{index}"
    data_dir.mkdir(parents=True)
    broker = BrokerProcess(
        index=index,
        node_id=f"dialer-{runtime}",
        mqtt_port=mqtt_port,
        http_port=http_port,
        cluster_port=cluster_port,
        data_dir=str(data_dir),
        log_path=str(data_dir / "broker.log"),
    )
    certs = Path(cluster.data_root) / "certs"
    cert, key = issue_broker_cert(certs, broker.peer_id, name=f"dialer-{runtime}-{cluster_port}")
    settings = {
        **cluster.settings,
        "cluster.tls_ca_file": str(certs / "ca.pem"),
        "cluster.tls_cert_file": str(cert),
        "cluster.tls_key_file": str(key),
        "cluster.link_runtime": runtime,
    }
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    with open(broker.log_path, "ab") as log:
        broker.process = subprocess.Popen(
            broker.command(sys.executable, [join], settings, seed=True),
            cwd=data_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    cluster.brokers.append(broker)
    return broker


def _healthy(broker: BrokerProcess) -> bool:
    assert broker.alive(), broker.log_tail()
    return http_get(broker.http_port, "/healthz", timeout_s=1.0)[0] == 200


def _refusals(broker: BrokerProcess) -> list[dict[str, Any]]:
    return [
        record
        for record in broker.log_records()
        if record.get("event") == "cluster_link_refused" and record.get("side") == "dialer"
    ]


def test_a_broker_reached_under_another_peer_id_is_refused_by_the_dialer(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    cluster = cluster_factory(1)
    member = cluster.brokers[0]
    forward = PortForward(member.cluster_port)
    dialed = f"{HOST}:{forward.port}"
    seen: dict[int, set[str]] = {}  # broker index -> every connected peer it ever reported

    def peers(index: int) -> list[str]:
        state = cluster.cluster_state(index)
        seen.setdefault(index, set()).update(state["connected_peers"])
        assert not state["joined"] or index == member.index, state  # never joined through X
        return list(state["connected_peers"])

    try:
        dialers = {runtime: _start_dialer(cluster, runtime, dialed) for runtime in REASONS}
        for broker in dialers.values():
            wait_until(lambda b=broker: _healthy(b), start_timeout_s(30.0), what=f"{broker.node_id} healthy")
        for runtime, broker in dialers.items():
            reason = REASONS[runtime]

            def refused(b: BrokerProcess = broker, r: str = reason) -> bool:
                for index in (member.index, *(d.index for d in dialers.values())):
                    peers(index)
                text = cluster.metrics_text(b.index)
                return metric_total(text, "skipmq_cluster_link_dial_refused_total", reason=r) >= 1

            wait_until(refused, WAIT_S, what=f"{broker.node_id} refusing the broker behind {dialed}")
            refusal = _refusals(broker)[-1]
            assert refusal["peer"] == dialed and refusal["code"] == f"DIAL_{reason.upper()}", refusal
            assert member.peer_id in str(refusal["reason"]), refusal  # names what answered instead
            others = {r["code"] for r in _refusals(broker)} - {f"DIAL_{reason.upper()}"}
            assert not others, others  # refused for this reason only, at every dial
        assert forward.connections >= 2  # the refusals were real dials through the forward
        h2 = dialers["h2"]
        topic = unique_id("wrong-peer") + "/t"
        listeners = {b.index: client_factory(cluster, b.index) for b in (member, *dialers.values())}
        for client in listeners.values():
            client.subscribe(topic, qos=1)
        for index, publisher in listeners.items():
            publisher.publish(topic, f"from {index}".encode(), qos=1)
        for index, client in listeners.items():
            own = client.wait_message()  # each broker serves its own clients
            assert own.payload == f"from {index}".encode(), own
        # the default runtime's dialer never showed itself to the member: nothing crosses either way
        assert listeners[h2.index].drain(settle_s=1.0) == []
        crossed = [m.payload for m in listeners[member.index].drain(settle_s=0.2)]
        assert f"from {h2.index}".encode() not in crossed, crossed
        for index in (member.index, *(d.index for d in dialers.values())):
            peers(index)
        # never linked under the dialed id X; the h2 dialer never linked at all; the member never
        # saw it. (The grpcio dialer's Hello names it, so the member may dial it back under the
        # member's own id, checked both ways: a link between two members, not a link to X.)
        assert all(dialed not in ids for ids in seen.values()), seen
        assert seen[h2.index] == set(), seen
        assert h2.peer_id not in seen[member.index], seen
        assert seen[dialers["grpcio"].index] <= {member.peer_id}, seen
    finally:
        forward.close()
