"""Brokers started together form ONE cluster (issue 17; overlay.formation, docs/cluster.md).

N real broker processes are spawned at the same instant, each with the same seed list that
includes itself (what a StatefulSet with ``podManagementPolicy: Parallel`` and ``--join`` = a
headless service gives). Checked: every broker's ``/readyz`` answers 503 (reason
``joining_cluster``) before it has joined and 200 after, and ``/cluster`` agrees; then paho
clients on every broker receive 20 rounds of 20 QoS 1 messages published on a different
broker each round - one cluster, not several (a broker in a cluster of its own misses them).
Before formation the brokers waited for each other forever (0 of 3 rounds formed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.process.cluster.conftest import FAST_SETTINGS
from tests.support.cluster import LIVE_CLUSTERS, ClusterClient, probe_route, unique_id
from tools.launcher import LocalCluster, http_get

FORM_TIMEOUT_S = 25.0
ROUNDS = 20
PER_ROUND = 20


def poll_until_ready(cluster: LocalCluster) -> dict[int, list[tuple[int, str, bool | None]]]:
    """Poll every broker's /readyz (and /cluster) from spawn until all are ready; per broker the
    sequence of (status, reason, /cluster joined) seen, deduplicated."""
    seen: dict[int, list[tuple[int, str, bool | None]]] = {b.index: [] for b in cluster.brokers}
    deadline = time.monotonic() + FORM_TIMEOUT_S
    while time.monotonic() < deadline:
        for broker in cluster.brokers:
            assert broker.alive(), f"broker {broker.index} exited:\n{broker.log_tail()}"
            history = seen[broker.index]
            if history and history[-1][0] == 200:
                continue
            try:
                status, body = http_get(broker.http_port, "/readyz", timeout_s=1.0)
                _, state = http_get(broker.http_port, "/cluster", timeout_s=1.0)
            except OSError:
                continue  # not listening yet
            reason = json.loads(body).get("reason", "") if status in (200, 503) else body.decode()[:80]
            joined = json.loads(state).get("joined")
            entry = (status, reason, joined)
            if not history or history[-1] != entry:
                history.append(entry)
        if all(h and h[-1][0] == 200 for h in seen.values()):
            return seen
        time.sleep(0.02)
    pytest.fail(f"not every broker ready within {FORM_TIMEOUT_S} s: {seen}")


@pytest.mark.parametrize("size", [3, 5])
def test_brokers_started_together_form_one_cluster(tmp_path: Path, size: int) -> None:
    cluster = LocalCluster(size, settings=dict(FAST_SETTINGS), data_root=str(tmp_path))
    LIVE_CLUSTERS.append(cluster)
    clients: list[ClusterClient] = []
    try:
        cluster.start_together()
        seen = poll_until_ready(cluster)
        for index, history in seen.items():
            status, reason, joined = history[0]
            assert (status, reason, joined) == (503, "joining_cluster", False), (index, history)
            assert history[-1][0] == 200 and history[-1][2] is True, (index, history)
            for status, _, joined in history:  # never ready before joined (/cluster is read just after)
                assert status != 200 or joined is True, (index, history)

        topic = f"{unique_id('form')}/all"
        subscribers = []
        for broker in cluster.brokers:
            sub = ClusterClient(broker.mqtt_port, client_id=unique_id(f"sub{broker.index}"), host=broker.host)
            clients.append(sub)
            assert sub.subscribe(topic, 1) == [1]
            subscribers.append(sub)
        for broker in cluster.brokers:  # every subscription reachable from every broker
            probe_route(cluster, broker.index, subscribers, topic, timeout_s=15.0)
            for sub in subscribers:
                probe_route(cluster, broker.index, sub, topic, timeout_s=15.0)
        publishers = []
        for broker in cluster.brokers:
            pub = ClusterClient(broker.mqtt_port, client_id=unique_id(f"pub{broker.index}"), host=broker.host)
            clients.append(pub)
            publishers.append(pub)
        for round_no in range(ROUNDS):
            pub = publishers[round_no % size]
            payloads = [f"r{round_no}-{n}".encode() for n in range(PER_ROUND)]
            for payload in payloads:
                pub.publish_nowait(topic, payload, 1)
            for sub in subscribers:
                got = [m.payload for m in sub.wait_messages(PER_ROUND, timeout_s=10.0)]
                assert got == payloads, f"round {round_no}: {sub.client_id} got {got[:3]}..."
        for sub in subscribers:
            sub.assert_no_message(0.3)
    finally:
        for client in clients:
            client.close()
        cluster.close()
        if cluster in LIVE_CLUSTERS:
            LIVE_CLUSTERS.remove(cluster)
