"""SIGTERM alone drains a broker with ``cluster.replicas`` > 1 (docs/operations.md, "Scaling down
without loss"): no ``skipmq drain``, no ``POST /drain`` - the signal a process manager or the
kubelet sends. The broker disconnects its clients (MQTT 5: 0x8B), hands its stored sessions and
its send log to the brokers that keep copies, logs ``drain_started`` and ``drained``, then stops
with exit status 0, within ``cluster.drain_on_stop_s`` (30 s by default).

3 brokers (tools/launcher.py, loopback), real paho-mqtt clients, the default limits
(``FAST_SETTINGS``: the cluster suite's faster keep-alive). The victim V (not the publisher's
broker) has a connected persistent QoS 1 subscriber of the stream's topic and a stored one (it
subscribed, then disconnected) of a sparse topic; a publisher on another broker sends a QoS 1
stream and a sparse one. Mid-stream V gets SIGTERM: its connected subscriber reconnects to a
broker that stays (``session present`` required), V exits 0 having logged ``drained``, the stored
subscriber comes back on a broker that stays (``session present``), every PUBACKed id reaches both
subscribers, and the brokers that stay have everything on 2 copies again. Without the drain on
SIGTERM (``cluster.drain_on_stop_s = 0``) V logs no ``drained``: the test fails there.
"""

from __future__ import annotations

import signal
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

MESSAGES = env_int("SKIPMQ_ZL_REPL_SIGTERM_MESSAGES", 2_000)
RATE_PER_S = env_float("SKIPMQ_ZL_REPL_SIGTERM_RATE", 300.0)
DRAIN_S = env_float("SKIPMQ_ZL_DRAIN_S", 30.0)
SPARSE = 300  # ids of the sparse topic (below the default queue limit of 1,000)
SPARSE_RATE_PER_S = 25.0
WINDOW = 100
STREAM_S = 120.0
EXIT_S = 30.0 + 15.0  # cluster.drain_on_stop_s (30 s by default), and the stop after it

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _client(cluster: LocalCluster, index: int, **kwargs: object) -> ClusterClient:
    broker = cluster.brokers[index]
    return ClusterClient(broker.mqtt_port, host=broker.host, **kwargs)  # type: ignore[arg-type]


def test_sigterm_alone_drains_a_replicated_broker_and_loses_nothing(tmp_path: Path) -> None:
    settings = {**FAST_SETTINGS, "cluster.replicas": "2"}
    cluster = LocalCluster(3, settings=settings, data_root=str(tmp_path))
    LIVE_CLUSTERS.append(cluster)
    made: list[ClusterClient] = []
    try:
        cluster.start()
        cluster.wait_ready(READY_TIMEOUT_S)
        victim, publisher_at, other = 2, 0, 1
        topic = f"{unique_id('sigterm')}/stream"
        sparse_topic = f"{unique_id('sigterm')}/sparse"
        sub = _client(cluster, victim, client_id=unique_id("sigterm-live"), clean=False, session_expiry_s=600)
        made.append(sub)
        sub.subscribe(topic, 1)
        probe_route(cluster, publisher_at, sub, topic)
        sleeper_id = unique_id("sigterm-stored")
        sleeper = _client(cluster, victim, client_id=sleeper_id, clean=False, session_expiry_s=600)
        sleeper.subscribe(sparse_topic, 1)
        probe_route(cluster, publisher_at, sleeper, sparse_topic)
        sleeper.close()
        pub = _client(cluster, publisher_at, client_id=unique_id("sigterm-pub"), max_inflight=WINDOW)
        made.append(pub)
        stream = IdStream(pub, topic, qos=1, limit=MESSAGES, window=WINDOW, rate_per_s=RATE_PER_S)
        sparse_pub = _client(cluster, publisher_at, client_id=unique_id("sigterm-pub"), max_inflight=WINDOW)
        made.append(sparse_pub)
        sparse = IdStream(
            sparse_pub, sparse_topic, qos=1, limit=SPARSE, window=WINDOW, rate_per_s=SPARSE_RATE_PER_S
        )
        stream.start()
        sparse.start()
        process = cluster.brokers[victim].process
        assert process is not None
        try:
            stream.wait_acked(MESSAGES // 3, STREAM_S)
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)  # the signal alone: no skipmq drain, no POST /drain
            assert sub.disconnected.wait(20), "SIGTERM did not disconnect the broker's client"
            report(f"SIGTERM: the client was disconnected (reason {sub.disconnect_reason})")
            sub.connect(cluster.brokers[other].mqtt_port, host=cluster.brokers[other].host)
            assert sub.session_present, "the connected client's session was not kept"
            status = process.wait(timeout=EXIT_S)
            exit_s = time.monotonic() - started
            stream.wait_done(STREAM_S)
            sparse.wait_done(STREAM_S)
        finally:
            stream.stop()
            sparse.stop()
        events = [record.get("event") for record in cluster.brokers[victim].log_records()]
        report(
            f"SIGTERM of broker {victim}: exit {status} after {exit_s:.2f} s; drain events "
            f"{[e for e in events if str(e).startswith('drain')]}"
        )
        assert status == 0
        assert "drain_started" in events and "drained" in events, "SIGTERM did not drain the broker"
        sleeper = _client(cluster, other, client_id=sleeper_id, clean=False, session_expiry_s=600)
        made.append(sleeper)
        assert sleeper.session_present, "the stored session of the SIGTERMed broker was not kept"
        lost = 0
        for name, inbox, acked in (
            ("connected subscriber", Inbox([sub]), stream.acked_ids()),
            ("stored subscriber", Inbox([sleeper]), sparse.acked_ids()),
        ):
            result = tally(f"SIGTERM drain: {name}", inbox, acked, DRAIN_S)
            report(result)
            lost += len(result.lost)
        assert lost == 0
        assert len(stream.acked_ids()) >= MESSAGES
        wait_until(
            lambda: all(
                metric_total(cluster.metrics_text(i), "skipmq_cluster_replication_under_replicated_sessions")
                == 0
                and metric_total(cluster.metrics_text(i), "skipmq_cluster_replication_under_replicated") == 0
                for i in (publisher_at, other)
            ),
            30,
            interval_s=0.5,
            what="everything on 2 brokers again",
        )
    finally:
        close_tracked(cluster, made)
