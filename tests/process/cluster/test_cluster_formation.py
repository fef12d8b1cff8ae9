"""Brokers started together form ONE cluster (issue 17; overlay.formation, docs/cluster.md).

N real broker processes are spawned at the same instant, each with the same seed list that
includes itself (what a StatefulSet with ``podManagementPolicy: Parallel`` and ``--join`` = a
headless service gives). Checked: every broker's ``/readyz`` answers 503 (reason
``joining_cluster``) before it has joined and 200 after, and ``/cluster`` agrees; then paho
clients on every broker receive 20 rounds of 20 QoS 1 messages published on a different
broker each round - one cluster, not several (a broker in a cluster of its own misses them).
Before formation the brokers waited for each other forever (0 of 3 rounds formed). And brokers
rejoin when their peers restart (kill -9 and graceful, some or all of them at once).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.process.cluster.conftest import FAST_SETTINGS
from tests.support.cluster import LIVE_CLUSTERS, ClusterClient, probe_route, unique_id
from tools.launcher import LocalCluster, http_get
from tools.start_wait import start_timeout_s

FORM_TIMEOUT_S = 25.0
ROUNDS = 20
PER_ROUND = 20
JOINING = (503, "joining_cluster", False)  # /readyz status and reason, /cluster "joined"


def poll_until_ready(
    cluster: LocalCluster, *, release: Callable[[], None] | None = None
) -> dict[int, list[tuple[int, str, bool | None]]]:
    """Poll every broker's /readyz (and /cluster) from spawn until all are ready; per broker the
    sequence of (status, reason, /cluster joined) seen, deduplicated. ``release``: called once
    every broker was seen joining (503 ``joining_cluster``, not joined), to let them form."""
    seen: dict[int, list[tuple[int, str, bool | None]]] = {b.index: [] for b in cluster.brokers}
    deadline = time.monotonic() + start_timeout_s(FORM_TIMEOUT_S)
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
        if release is not None and all(JOINING in h for h in seen.values()):
            release()
            release = None
        if all(h and h[-1][0] == 200 for h in seen.values()):
            return seen
        time.sleep(0.02)
    pytest.fail(f"not every broker ready within {FORM_TIMEOUT_S} s: {seen}")


def deliver_rounds(cluster: LocalCluster, clients: list[ClusterClient], rounds: int) -> None:
    """A subscriber on every live broker; ``rounds`` rounds of PER_ROUND QoS 1 messages, each
    round from a publisher on the next broker; every subscriber gets every round, in order."""
    live = [broker for broker in cluster.brokers if broker.alive()]
    topic = f"{unique_id('form')}/all"
    subscribers = []
    for broker in live:
        sub = ClusterClient(broker.mqtt_port, client_id=unique_id(f"sub{broker.index}"), host=broker.host)
        clients.append(sub)
        assert sub.subscribe(topic, 1) == [1]
        subscribers.append(sub)
    for broker in live:  # every subscription reachable from every broker
        for sub in subscribers:
            probe_route(cluster, broker.index, sub, topic, timeout_s=15.0)
    publishers = []
    for broker in live:
        pub = ClusterClient(broker.mqtt_port, client_id=unique_id(f"pub{broker.index}"), host=broker.host)
        clients.append(pub)
        publishers.append(pub)
    for round_no in range(rounds):
        pub = publishers[round_no % len(publishers)]
        payloads = [f"r{round_no}-{n}".encode() for n in range(PER_ROUND)]
        for payload in payloads:
            pub.publish_nowait(topic, payload, 1)
        for sub in subscribers:
            got = [m.payload for m in sub.wait_messages(PER_ROUND, timeout_s=10.0)]
            assert got == payloads, f"round {round_no}: {sub.client_id} got {got[:3]}..."
    for sub in subscribers:
        sub.assert_no_message(0.3)


@pytest.fixture
def together(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """together(n, hold=False): n brokers spawned at once with one seed list (``hold``: their
    formation held until ``cluster.release_formation()``); closed after the test."""
    made: list[LocalCluster] = []

    def make(size: int, hold: bool = False) -> LocalCluster:
        cluster = LocalCluster(size, settings=dict(FAST_SETTINGS), data_root=str(tmp_path / f"c{len(made)}"))
        made.append(cluster)
        LIVE_CLUSTERS.append(cluster)
        cluster.start_together(hold_formation=hold)
        return cluster

    yield make
    for cluster in made:
        cluster.close()
        if cluster in LIVE_CLUSTERS:
            LIVE_CLUSTERS.remove(cluster)


@pytest.fixture
def clients() -> Iterator[list[ClusterClient]]:
    made: list[ClusterClient] = []
    yield made
    for client in made:
        client.close()


@pytest.mark.parametrize("size", [3, 5])
def test_brokers_started_together_form_one_cluster(
    together: Callable[..., LocalCluster], clients: list[ClusterClient], size: int
) -> None:
    # The formation is held (tools/launcher.py: a lower, never-joining peer in the seed list) until
    # every broker was seen joining, so a loaded machine cannot let one join before the first poll.
    cluster = together(size, hold=True)
    seen = poll_until_ready(cluster, release=cluster.release_formation)
    for index, history in seen.items():
        assert history[0] == JOINING, (index, history)
        assert history[-1][0] == 200 and history[-1][2] is True, (index, history)
        for status, _, joined in history:  # never ready before joined (/cluster is read just after)
            assert status != 200 or joined is True, (index, history)
    deliver_rounds(cluster, clients, ROUNDS)


def test_brokers_rejoin_after_their_peers_restart(
    together: Callable[..., LocalCluster], clients: list[ClusterClient]
) -> None:
    """kill -9 of a broker's two peers, which come back together (same addresses and data);
    then of that broker while they run; then a graceful restart of all three at once."""
    cluster = together(3)
    poll_until_ready(cluster)
    for killed in ([1, 2], [0]):
        for index in killed:
            cluster.kill_broker(index)
        cluster.respawn_together(killed)
        poll_until_ready(cluster)
        deliver_rounds(cluster, clients, 5)
    for client in clients:
        client.close()
    for index in range(3):
        cluster.stop_broker(index)
    cluster.respawn_together(range(3))
    poll_until_ready(cluster)
    deliver_rounds(cluster, clients, 5)
