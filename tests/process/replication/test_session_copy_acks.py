"""A persistent session's SUBACK and UNSUBACK wait for the session's copy on N brokers, in real
broker processes (docs/cluster.md, Replicas; docs/observability.md): 2 brokers on loopback
(tools/launcher.py), ``cluster.replicas = 2``, every other setting at its default (the failure
detector's 6 s included), a real paho-mqtt client. A = the subscriber's broker, B its holder.

1. a persistent subscriber on A subscribes ``keep/#`` and ``drop/#``: each SUBACK waited for B's
   copy (``skipmq_cluster_replication_session_copy_waits_total`` on A), none left without it;
2. B is stopped (SIGSTOP: silent, not reported down within ``cluster.failure_timeout_ms``) and the
   client subscribes ``late/#``: the SUBACK comes after ``cluster.subscribe_wait_ms`` (3 s) and is
   counted, scraped from A's /metrics as
   ``skipmq_cluster_replication_session_acks_uncopied_total{reason="timed_out"}``; B resumes and
   gets the state;
3. the client unsubscribes ``drop/#`` and A is killed (kill -9) and its data directory deleted
   right after the UNSUBACK; the client reconnects to B: ``session present``; A rejoins empty, and
   of a message published on each of the three topics the client gets ``keep`` and ``late`` and
   not ``drop`` (an UNSUBACK that left before the copy gave it back a subscription it had removed).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from broker.config.schema import ClusterConfig
from tests.process.cluster.conftest import READY_TIMEOUT_S
from tests.support.cluster import (
    LIVE_CLUSTERS,
    ClusterClient,
    close_tracked,
    metric_total,
    unique_id,
    wait_until,
)
from tests.support.zeroloss import report
from tools.launcher import LocalCluster

WAITS = "skipmq_cluster_replication_session_copy_waits_total"
UNCOPIED = "skipmq_cluster_replication_session_acks_uncopied_total"
UNDER_REPLICATED = "skipmq_cluster_replication_under_replicated_sessions"
SUBSCRIBE_WAIT_S = ClusterConfig().subscribe_wait_ms / 1000.0  # the default

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _client(cluster: LocalCluster, index: int, **kwargs: object) -> ClusterClient:
    broker = cluster.brokers[index]
    return ClusterClient(broker.mqtt_port, host=broker.host, **kwargs)  # type: ignore[arg-type]


def test_suback_and_unsuback_wait_for_the_sessions_copy_and_the_metric_counts_those_that_did_not(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(2, settings={"cluster.replicas": "2"}, data_root=str(tmp_path))
    LIVE_CLUSTERS.append(cluster)
    made: list[ClusterClient] = []
    try:
        cluster.start()
        cluster.wait_ready(READY_TIMEOUT_S)
        a, b = sorted(range(2), key=lambda i: cluster.brokers[i].peer_id)
        prefix = unique_id("acks")
        keep, drop, late = f"{prefix}/keep", f"{prefix}/drop", f"{prefix}/late"
        sub = _client(cluster, a, client_id=unique_id("acks-sub"), clean=False, session_expiry_s=600)
        made.append(sub)
        sub.subscribe(f"{keep}/#", 1)
        sub.subscribe(f"{drop}/#", 1)
        text = cluster.metrics_text(a)
        assert metric_total(text, WAITS) >= 2, "the SUBACKs did not wait for the session's copy"
        assert metric_total(text, UNCOPIED) == 0, text

        # 2. a holder that answers nothing: the SUBACK after subscribe_wait_ms, counted
        cluster.freeze_broker(b)
        try:
            started = time.monotonic()
            sub.subscribe(f"{late}/#", 1)
            took = time.monotonic() - started
        finally:
            cluster.thaw_broker(b)
        report(f"SUBACK with the holder stopped: {took:.2f} s")
        assert took >= SUBSCRIBE_WAIT_S - 0.1, f"the SUBACK did not wait for the copy ({took:.2f} s)"
        text = cluster.metrics_text(a)
        assert metric_total(text, UNCOPIED, reason="timed_out") == 1, text
        assert metric_total(text, UNCOPIED) == 1, text
        wait_until(
            lambda: metric_total(cluster.metrics_text(a), UNDER_REPLICATED) == 0,
            30,
            interval_s=0.2,
            what="the holder has the session again",
        )

        # 3. the UNSUBACK, then at once the home's disk loss
        sub.unsubscribe(f"{drop}/#")
        cluster.kill_broker(a)
        data_dir = cluster.brokers[a].data_dir
        shutil.rmtree(data_dir)
        os.makedirs(data_dir)
        sub.disconnected.wait(10)
        sub.connect(cluster.brokers[b].mqtt_port, host=cluster.brokers[b].host)
        assert sub.session_present, "the session was not present on the holder"
        cluster.restart_broker(a)  # empty (with one broker live a PUBACK waits for a second copy)
        pub = _client(cluster, b, client_id=unique_id("acks-pub"))
        made.append(pub)
        for topic in (drop, keep, late):  # in this order: drop/x would come first
            pub.publish(f"{topic}/x", topic.encode(), 1)
        got = [message.topic for message in sub.wait_messages(2, 15)]
        sub.assert_no_message(1.0)
        report(f"after the UNSUBACK and the disk loss, on the holder: {got}")
        assert got == [f"{keep}/x", f"{late}/x"], got
    finally:
        close_tracked(cluster, made)
