"""Graceful removal with real processes (docs/operations.md, "Scaling down without loss"): brokers
are removed one at a time under a QoS 1 stream, each with ``skipmq drain`` (the Helm chart's
``preStop``) and then SIGTERM; with ``cluster.replicas = 2`` nothing PUBACKed is lost and every
persistent session is kept - the connected ones (their clients reconnect to another broker when
the drain disconnects them) and the stored ones (their clients come back after the broker is gone).

SKIPMQ_ZL_REPL_DRAIN_BROKERS brokers (5 by default: 5 -> 3; 3 gives 3 -> 2), loopback
(tools/launcher.py), real paho-mqtt clients, the default limits (``FAST_SETTINGS``: the cluster
suite's faster keep-alive). Steps:

1. on every broker to be removed, a connected persistent QoS 1 subscriber of the stream's topic
   and a stored one (it subscribed, then disconnected) of a sparse topic; a publisher on a broker
   that stays sends a QoS 1 stream (SKIPMQ_ZL_REPL_DRAIN_RATE msg/s) and a sparse one (at most
   ``SPARSE`` ids in all: fewer than ``limits.max_queued_messages``, 1,000 by default, so that no
   stored session drops by its queue limit while its client is away);
2. for each broker to remove, one at a time: ``python -m broker drain --url http://127.0.0.1:<its
   http port>`` must exit 0 (drained); its connected subscriber was disconnected (0x8B) and
   reconnects to a broker that stays (``session present`` required); then SIGTERM;
3. the stream ends (SKIPMQ_ZL_REPL_DRAIN_MESSAGES ids PUBACKed), the stored subscribers reconnect to
   a broker that stays (``session present`` required); every PUBACKed id must reach every
   subscriber (bounded wait).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.process.cluster.conftest import FAST_SETTINGS, READY_TIMEOUT_S
from tests.support.cluster import (
    LIVE_CLUSTERS,
    ClusterClient,
    close_tracked,
    metric_total,
    probe_route,
    unique_id,
    wait_until,
)
from tests.support.zeroloss import IdStream, Inbox, env_float, env_int, report, tally
from tools.launcher import LocalCluster

BROKERS = env_int("SKIPMQ_ZL_REPL_DRAIN_BROKERS", 5)
MESSAGES = env_int("SKIPMQ_ZL_REPL_DRAIN_MESSAGES", 3_000)
RATE_PER_S = env_float("SKIPMQ_ZL_REPL_DRAIN_RATE", 300.0)
DRAIN_S = env_float("SKIPMQ_ZL_DRAIN_S", 30.0)
DRAIN_TIMEOUT_S = 45.0  # the chart's drain.timeoutSeconds default
SPARSE = 500  # ids of the sparse topic (below the default queue limit of 1,000)
SPARSE_RATE_PER_S = 25.0
WINDOW = 100
STREAM_S = 120.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _client(cluster: LocalCluster, index: int, **kwargs: object) -> ClusterClient:
    broker = cluster.brokers[index]
    return ClusterClient(broker.mqtt_port, host=broker.host, **kwargs)  # type: ignore[arg-type]


def _drain(cluster: LocalCluster, index: int) -> subprocess.Popen[str]:
    """``skipmq drain`` against broker ``index``, as the chart's preStop runs it (not waited for)."""
    url = f"http://{cluster.brokers[index].host}:{cluster.brokers[index].http_port}"
    command = [sys.executable, "-m", "broker", "drain", "--url", url, "--timeout-s", str(DRAIN_TIMEOUT_S)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_brokers_removed_one_at_a_time_with_a_drain_lose_nothing_and_keep_every_session(
    tmp_path: Path,
) -> None:
    removals = max(1, BROKERS - 3)
    settings = {**FAST_SETTINGS, "cluster.replicas": "2"}
    cluster = LocalCluster(BROKERS, settings=settings, data_root=str(tmp_path))
    LIVE_CLUSTERS.append(cluster)
    made: list[ClusterClient] = []
    try:
        cluster.start()
        cluster.wait_ready(READY_TIMEOUT_S)
        victims = list(range(BROKERS - removals, BROKERS))
        staying = [i for i in range(BROKERS) if i not in victims]
        topic = f"{unique_id('drain')}/stream"
        sparse_topic = f"{unique_id('drain')}/sparse"
        connected: dict[int, ClusterClient] = {}
        stored: dict[int, str] = {}
        for victim in victims:
            sub = _client(
                cluster, victim, client_id=unique_id("drain-live"), clean=False, session_expiry_s=600
            )
            made.append(sub)
            sub.subscribe(topic, 1)
            connected[victim] = sub
            sleeper_id = unique_id("drain-stored")
            sleeper = _client(cluster, victim, client_id=sleeper_id, clean=False, session_expiry_s=600)
            sleeper.subscribe(sparse_topic, 1)
            probe_route(cluster, staying[0], sleeper, sparse_topic)
            probe_route(cluster, staying[0], sub, topic)
            sleeper.close()
            stored[victim] = sleeper_id
        pub = _client(cluster, staying[0], client_id=unique_id("drain-pub"), max_inflight=WINDOW)
        made.append(pub)
        stream = IdStream(pub, topic, qos=1, limit=MESSAGES, window=WINDOW, rate_per_s=RATE_PER_S)
        stream.start()
        sparse_pub = _client(cluster, staying[-1], client_id=unique_id("drain-pub"), max_inflight=WINDOW)
        made.append(sparse_pub)
        sparse = IdStream(
            sparse_pub, sparse_topic, qos=1, limit=SPARSE, window=WINDOW, rate_per_s=SPARSE_RATE_PER_S
        )
        sparse.start()
        drained_s: list[float] = []
        try:
            for number, victim in enumerate(victims):
                stream.wait_acked((number + 1) * MESSAGES // (removals + 2), STREAM_S)
                started = time.monotonic()
                drain = _drain(cluster, victim)
                sub = connected[victim]
                # the client reconnects at once (as a client with automatic reconnect does, through
                # the Service to a broker that stays) while the drain goes on
                assert sub.disconnected.wait(20), "the drain did not disconnect the broker's client"
                target = staying[number % len(staying)]
                sub.connect(cluster.brokers[target].mqtt_port, host=cluster.brokers[target].host)
                assert sub.session_present, f"the session of broker {victim}'s client was not kept"
                output, _ = drain.communicate(timeout=DRAIN_TIMEOUT_S + 20)
                drained_s.append(time.monotonic() - started)
                took = f"{drained_s[-1]:.2f} s"
                report(f"drain of broker {victim}: exit {drain.returncode} in {took}: {output.strip()}")
                assert drain.returncode == 0, output
                assert cluster.stop_broker(victim) == 0
            stream.wait_done(STREAM_S)
            sparse.wait_done(STREAM_S)
        finally:
            stream.stop()
            sparse.stop()
        acked = stream.acked_ids()
        sparse_acked = sparse.acked_ids()
        inboxes = {f"connected subscriber of broker {v}": Inbox([connected[v]]) for v in victims}
        for number, victim in enumerate(victims):
            sleeper = _client(
                cluster,
                staying[(number + 1) % len(staying)],
                client_id=stored[victim],
                clean=False,
                session_expiry_s=600,
            )
            made.append(sleeper)
            assert sleeper.session_present, f"the stored session of broker {victim} was not kept"
            inboxes[f"stored subscriber of broker {victim}"] = Inbox([sleeper])
        lost = 0
        for name, inbox in inboxes.items():
            result = tally(name, inbox, sparse_acked if name.startswith("stored") else acked, DRAIN_S)
            report(result)
            lost += len(result.lost)
        report(
            f"{BROKERS} -> {BROKERS - removals} brokers: {len(acked)} + {len(sparse_acked)} PUBACKed,"
            f" lost {lost};"
            " drains took " + ", ".join(f"{s:.2f} s" for s in drained_s)
        )
        assert lost == 0
        assert len(acked) >= MESSAGES
        adopted = sum(
            metric_total(cluster.metrics_text(i), "skipmq_cluster_replication_adopted_sessions")
            for i in staying
        )
        report(f"sessions adopted by the brokers that stayed: {adopted:g}")
        wait_until(
            lambda: all(
                metric_total(cluster.metrics_text(i), "skipmq_cluster_replication_under_replicated_sessions")
                == 0
                for i in staying
            ),
            30,
            interval_s=0.5,
            what="every session on 2 brokers again",
        )
    finally:
        close_tracked(cluster, made)
