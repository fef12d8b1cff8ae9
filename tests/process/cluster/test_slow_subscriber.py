"""A slow subscriber beside a fast one, across a catch-up (docs/cluster.md "Flow control"), with real
processes and the default limits.

Real ``python -m broker`` processes (tools/launcher.py, 3 brokers: A = 0, B = 1, C = 2), real
paho-mqtt clients, nothing configured but the faster failure detection of the suite. On B, two
persistent QoS 1 subscribers of the same topic (same topic class): ``fast`` drains as fast as paho
does, ``slow`` at a quarter of the publish rate (its ``on_message`` sleeps; paho acknowledges after
it returns). A publisher on A streams RATE_PER_S QoS 1 ids; about one second in, B is killed
(-9) and restarted on its data directory while the stream goes on, so that B's streams from A
catch up (the backlog kept in A's send log while B was down) - paced by B's sessions.

What is checked:

* the fast subscriber gets every PUBACKed id (no head-of-line blocking: on the code before, the
  slow session held the whole class's catch-up - until a 10 s stall, then the backlog came
  unpaced - and the fast one lost 3,080 of 8,000, the stream taking 43.9 s instead of 14.6 s);
* the slow one's missing ids equal B's ``skipmq_messages_dropped_total{reason="queue_full_oldest"}``
  (every drop is B's, after its restart: the test kills B before the slow queue could overflow,
  and checks that), and the ``messages_dropped`` lines B logged for it add up to the same number;
* B logged that it set the slow session aside (``cluster_catch_up_session_set_aside``) and counted
  it (``skipmq_cluster_catch_up_sessions_set_aside_total``).

Sizes (environment variables, for bigger runs by hand): SKIPMQ_SLOW_RATE (600) publishes per
second, SKIPMQ_SLOW_MESSAGES (8000). Measured (2026-11-28, 2 shared cores): see
docs/notes/recovery.md.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from tests.support.cluster import (
    ClientFactory,
    ClusterClient,
    ClusterFactory,
    probe_route,
    unique_id,
    wait_until,
)
from tests.support.zeroloss import IdStream, Inbox, env_float, env_int, report, tally
from tools.launcher import LAUNCHER_MARK, LocalCluster

A, B = 0, 1
RATE_PER_S = env_float("SKIPMQ_SLOW_RATE", 600.0)
MESSAGES = env_int("SKIPMQ_SLOW_MESSAGES", 8_000)
WINDOW = 100
STREAM_S = 90.0
DRAIN_S = 30.0
SESSION_EXPIRY_S = 600


class SlowClient(ClusterClient):
    """A paho subscriber that takes ``1 / drain_per_s`` seconds over each message (in paho's network
    thread: nothing else is read meanwhile, and the PUBACK goes after it)."""

    drain_per_s = 1.0

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        time.sleep(1.0 / self.drain_per_s)
        super()._on_message(client, userdata, msg)


def queue_full_oldest(cluster: LocalCluster, index: int) -> int:
    match = re.search(
        r'^skipmq_messages_dropped_total\{reason="queue_full_oldest"\} ([0-9.e+]+)$',
        cluster.metrics_text(index),
        re.MULTILINE,
    )
    return int(float(match.group(1))) if match else 0


def metric(cluster: LocalCluster, index: int, name: str) -> int:
    match = re.search(rf"^{name} ([0-9.e+]+)$", cluster.metrics_text(index), re.MULTILINE)
    return int(float(match.group(1))) if match else 0


def log_events(text: str, event: str, client_id: str) -> list[dict[str, Any]]:
    """The JSON log lines ``event`` about ``client_id`` (``messages_dropped``), or the text lines
    that name both (the cluster's own lines are ``key=value`` messages)."""
    found: list[dict[str, Any]] = []
    for line in text.splitlines():
        if event not in line or client_id not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = {"raw": line}
        found.append(record)
    return found


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_slow_subscriber_does_not_hold_back_a_fast_one_across_a_catch_up(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    cluster = cluster_factory(3)
    topic = f"{unique_id('slowfast')}/stream"
    port_b, host_b = cluster.brokers[B].mqtt_port, cluster.brokers[B].host
    fast = client_factory(
        cluster, B, client_id=unique_id("fast"), clean=False, session_expiry_s=SESSION_EXPIRY_S
    )
    SlowClient.drain_per_s = RATE_PER_S / 4
    slow = SlowClient(
        port_b, host=host_b, client_id=unique_id("slow"), clean=False, session_expiry_s=SESSION_EXPIRY_S
    )
    pub = client_factory(
        cluster,
        A,
        client_id=unique_id("pub"),
        clean=False,
        session_expiry_s=SESSION_EXPIRY_S,
        max_inflight=WINDOW,
    )
    try:
        for sub in (fast, slow):
            sub.subscribe(topic, 1)
            probe_route(cluster, A, sub, topic)
        fast_inbox, slow_inbox = Inbox([fast]), Inbox([slow])
        stream = IdStream(pub, topic, limit=MESSAGES, window=WINDOW, rate_per_s=RATE_PER_S)
        started = time.monotonic()
        stream.start()
        try:
            # kill B about a second in: the slow queue (1,000) cannot have overflowed yet
            stream.wait_acked(int(RATE_PER_S), STREAM_S)
            cluster.kill_broker(B)
            fast.wait_disconnected(10)
            slow.wait_disconnected(10)
            stream.wait_acked(len(stream.acked_ids()) + int(RATE_PER_S), STREAM_S)  # B down >= 1 s
            cluster.restart_broker(B)
            before_restart = cluster.brokers[B].log_text().rpartition(LAUNCHER_MARK)[0]
            assert not log_events(before_restart, "messages_dropped", slow.client_id), (
                "the slow subscriber dropped before the kill: the drops could not all be counted"
            )
            for sub in (slow, fast):  # the slow one first: it holds the catch-up from its start
                sub.connect()
                assert sub.session_present, f"the restarted broker lost {sub.client_id}'s session"
            stream.wait_done(STREAM_S)
        finally:
            stream.stop()
        acked = stream.acked_ids()
        fast_result = tally("slow beside fast: the fast subscriber on B", fast_inbox, acked, DRAIN_S)
        report(f"slow beside fast: stream of {stream.sent} took {time.monotonic() - started:.1f} s")
        assert not fast_result.lost, f"the fast subscriber lost PUBACKed messages: {fast_result}"

        # the slow one: what it misses once its queue has drained is what B dropped for it
        def settled() -> bool:
            return len(slow_inbox.missing(acked)) == queue_full_oldest(cluster, B)

        try:
            wait_until(settled, DRAIN_S, interval_s=0.5, what="the slow subscriber's queue drained")
        except TimeoutError:
            pass  # asserted below, with the figures
        missing = len(slow_inbox.missing(acked))
        dropped = queue_full_oldest(cluster, B)
        report(f"slow beside fast: slow got {len(acked) - missing} of {len(acked)}, B dropped {dropped}")
        assert missing > 0, "a subscriber at a quarter of the publish rate must overflow its queue"
        assert missing == dropped, f"the slow subscriber missed {missing}, B counted {dropped} drops"

        # ... and logged: one messages_dropped line per interval, the sum of them is every drop
        def logged() -> int:
            text = cluster.brokers[B].log_text().rpartition(LAUNCHER_MARK)[2]
            return sum(int(r.get("dropped", 0)) for r in log_events(text, "messages_dropped", slow.client_id))

        wait_until(lambda: logged() >= dropped, 15.0, interval_s=0.5, what="every drop logged")
        assert logged() == dropped
        after_restart = cluster.brokers[B].log_text().rpartition(LAUNCHER_MARK)[2]
        assert log_events(after_restart, "cluster_catch_up_session_set_aside", slow.client_id)
        assert not log_events(after_restart, "cluster_catch_up_session_set_aside", fast.client_id)
        assert metric(cluster, B, "skipmq_cluster_catch_up_sessions_set_aside_total") >= 1
    finally:
        slow.close()
