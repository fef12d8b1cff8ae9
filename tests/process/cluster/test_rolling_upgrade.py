"""A rolling upgrade loses nothing acknowledged (docs/operations.md § Upgrade; issue 17).

What the chart's StatefulSet does on ``helm upgrade``: one broker at a time, from the highest
ordinal down, a graceful stop (SIGTERM: leave the overlay, disconnect clients, commit), a start
on the same data directory, and the next one only when this one answers ``/readyz`` 200. Real
processes (tools/launcher) and paho clients, under a QoS 1 stream from a publisher on broker 0 to
a persistent subscriber on broker 1: the publisher moves to broker 2 while broker 0 restarts
(its Service would send it to any ready broker); the subscriber comes back to broker 1 after
its restart (its session is stored there). Checked: every PUBACKed id is received, the
subscriber's session is present after its broker's restart, and each broker was ready again
before the next one stopped.
"""

from __future__ import annotations

import time

import pytest

from tests.support.cluster import ClientFactory, ClusterFactory, probe_route, unique_id, wait_until
from tests.support.zeroloss import IdStream, Inbox, report, tally
from tools.launcher import LocalCluster, http_get

MESSAGES = 3000
WINDOW = 50
RATE_PER_S = 100.0  # 30 s of stream: it spans the three restarts
STREAM_S = 120.0
DRAIN_S = 30.0
READY_S = 60.0


def ready(cluster: LocalCluster, index: int) -> bool:
    broker = cluster.brokers[index]
    try:
        status, _ = http_get(broker.http_port, "/readyz", timeout_s=1.0, host=broker.host)
    except OSError:
        return False
    return status == 200


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rolling_restart_one_broker_at_a_time_loses_no_acknowledged_message(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    cluster = cluster_factory(3)  # default limits
    topic = f"{unique_id('roll')}/stream"
    sub = client_factory(cluster, 1, client_id=unique_id("roll-sub"), clean=False, session_expiry_s=600)
    assert sub.subscribe(topic, 1) == [1]
    probe_route(cluster, 0, sub, topic)
    pub = client_factory(
        cluster, 0, client_id=unique_id("roll-pub"), clean=False, session_expiry_s=600, max_inflight=WINDOW
    )
    inbox = Inbox([sub])
    stream = IdStream(pub, topic, limit=MESSAGES, window=WINDOW, rate_per_s=RATE_PER_S)
    started = time.monotonic()
    stream.start()
    try:
        for index in (2, 1, 0):  # the StatefulSet's order: highest ordinal first
            stream.wait_acked(len(stream.acked_ids()) + MESSAGES // 20, STREAM_S)
            assert stream.sent < MESSAGES, "the stream ended before every broker restarted"
            assert all(ready(cluster, i) for i in range(3)), "a broker was not ready before the next stop"
            status = cluster.stop_broker(index)
            assert status == 0, f"broker {index} did not stop gracefully: {status}"
            if index == 0:
                pub.wait_disconnected(10)
                pub.connect(cluster.brokers[2].mqtt_port)  # paho re-sends what was not acknowledged
            if index == 1:
                sub.wait_disconnected(10)
            cluster.restart_broker(index)
            wait_until(lambda i=index: ready(cluster, i), READY_S, what=f"broker {index} ready again")
            if index == 1:
                sub.connect()
                assert sub.session_present, "broker 1 lost the persistent session over its restart"
        stream.wait_done(STREAM_S)
    finally:
        stream.stop()
    result = tally("rolling restart: subscriber on broker 1", inbox, stream.acked_ids(), DRAIN_S)
    report(result, f"rolling restart: stream of {stream.sent} took {time.monotonic() - started:.1f} s")
    assert len(stream.acked_ids()) == MESSAGES
    assert not result.lost, f"PUBACKed messages lost over the rolling restart: {result}"
