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

from tests.support.cluster import ClientFactory, ClusterFactory
from tests.support.zeroloss import broker_ready, persistent_stream, report, restart_under_stream, tally

MESSAGES = 3000
WINDOW = 50
RATE_PER_S = 100.0  # 30 s of stream: it spans the three restarts
STREAM_S = 120.0
DRAIN_S = 30.0
READY_S = 60.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rolling_restart_one_broker_at_a_time_loses_no_acknowledged_message(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    cluster = cluster_factory(3)  # default limits
    flow = persistent_stream(
        cluster, client_factory, "roll", messages=MESSAGES, window=WINDOW, rate_per_s=RATE_PER_S
    )
    stream = flow.stream  # publisher on broker 0, persistent subscriber on broker 1
    started = time.monotonic()
    stream.start()
    try:
        for index in (2, 1, 0):  # the StatefulSet's order: highest ordinal first
            stream.wait_acked(len(stream.acked_ids()) + MESSAGES // 20, STREAM_S)
            assert stream.sent < MESSAGES, "the stream ended before every broker restarted"
            assert all(broker_ready(cluster, i) for i in range(3)), (
                "a broker was not ready before the next stop"
            )
            restart_under_stream(cluster, index, flow, ready_s=READY_S, move_publisher_to=2)
        stream.wait_done(STREAM_S)
    finally:
        stream.stop()
    result = tally("rolling restart: subscriber on broker 1", flow.inbox, stream.acked_ids(), DRAIN_S)
    report(result, f"rolling restart: stream of {stream.sent} took {time.monotonic() - started:.1f} s")
    assert len(stream.acked_ids()) == MESSAGES
    assert not result.lost, f"PUBACKed messages lost over the rolling restart: {result}"
