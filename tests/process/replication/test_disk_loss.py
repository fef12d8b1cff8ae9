"""A broker lost with its disk, then another (docs/cluster.md, Replicas): with
``cluster.replicas = 2`` the publisher's broker is killed with kill -9 and its data directory
deleted mid-stream, it rejoins empty, the cluster is back to 2 copies, then the subscriber's
broker is lost the same way mid-stream and the subscriber reconnects to another broker: 0
PUBACKed (QoS 1) / PUBCOMPed (QoS 2) messages lost, ``session present`` with its subscription,
and the cluster back to 2 copies once the second wiped broker rejoins empty (the gauges
``skipmq_cluster_replication_under_replicated`` and ``..._under_replicated_sessions`` 0 on every
broker, each rejoined broker holding its share again: ``..._held_sessions``).

SKIPMQ_ZL_REPL_DISK_BROKERS brokers (3 by default; the 5-broker run is by hand, docs/testing.md),
loopback (tools/launcher.py), real paho-mqtt clients, the default limits (``FAST_SETTINGS``: the
cluster suite's faster keep-alive only shortens the wait for a link to be reported down).
Brokers sorted by peer id (each one's replica holder is the next on the ring): A = the first (the
publisher's; A is the subscriber's broker's holder), S = the last (the subscriber's), X = the one
before S (S holds X's copies). Steps:

1. a persistent subscriber (QoS ``qos``) on S; a persistent publisher on A sends a stream at
   ``qos`` (SKIPMQ_ZL_REPL_DISK_RATE msg/s, ``WINDOW`` in flight);
2. after a fifth of the ids are acknowledged: kill -9 of A and ``rm -rf`` of its data directory; the
   publisher goes on from X (a new persistent session, ids continue); A restarts empty (same
   peer id);
3. 2 copies again: A holds S's session (``held_sessions`` >= 1 on A) and S has no session short of
   its copies - the next loss is a single fault again;
4. at half of the ids: kill -9 of S and ``rm -rf`` of its data directory; the subscriber
   reconnects (clean start 0) to A - the rejoined broker, S's holder: ``session present``
   required; S restarts empty;
5. every acknowledged id (SKIPMQ_ZL_REPL_DISK_MESSAGES in all) must reach the subscriber, at most a
   tenth of them twice (at QoS 1 and 2: exactly once across a disk loss is not kept, the
   duplicates of each loss are reported and bounded: of A's loss by the entries taken over, of
   S's by the window in flight plus the session copy's lag, ``S_LOSS_DUPLICATES``); then 2 copies
   of everything again, S holding X's publisher session.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
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

BROKERS = env_int("SKIPMQ_ZL_REPL_DISK_BROKERS", 3)  # 5 by hand (docs/testing.md)
MESSAGES = env_int("SKIPMQ_ZL_REPL_DISK_MESSAGES", 5_000)  # acknowledged ids in all
RATE_PER_S = env_float("SKIPMQ_ZL_REPL_DISK_RATE", 500.0)
DRAIN_S = env_float("SKIPMQ_ZL_DRAIN_S", 30.0)
WINDOW = 100
STREAM_S = 120.0
DROPPED = "skipmq_messages_dropped_total"
SENT = "skipmq_messages_sent_total"  # PUBLISH packets sent to clients
COPIES_S = 30.0  # a rejoined broker gets its share: the next flush of each session it holds
# a session copy's positions lag its broker by up to ~0.15 s (engine_replication.RELEASE_EVERY_S
# + engine_replication_sessions.SESSION_FLUSH_S; twice that on a loaded machine), and what was in
# flight to the client is sent again: the duplicates the subscriber's broker's loss may cause
S_LOSS_DUPLICATES = WINDOW + int(RATE_PER_S * 0.3)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _client(cluster: LocalCluster, index: int, **kwargs: object) -> ClusterClient:
    broker = cluster.brokers[index]
    return ClusterClient(broker.mqtt_port, host=broker.host, **kwargs)  # type: ignore[arg-type]


def _metric(cluster: LocalCluster, index: int, name: str) -> float:
    return metric_total(cluster.metrics_text(index), name)


def _wipe(cluster: LocalCluster, index: int) -> None:
    """kill -9 and ``rm -rf`` of the data directory (an empty one is made for the restart)."""
    cluster.kill_broker(index)
    data_dir = cluster.brokers[index].data_dir
    shutil.rmtree(data_dir)
    os.makedirs(data_dir)


def _two_copies(cluster: LocalCluster, holder: int) -> bool:
    """No broker waits for copies, and ``holder`` (a rejoined broker) holds its share again."""
    return _metric(cluster, holder, "skipmq_cluster_replication_held_sessions") >= 1 and all(
        _metric(cluster, i, "skipmq_cluster_replication_under_replicated_sessions") == 0
        and _metric(cluster, i, "skipmq_cluster_replication_under_replicated") == 0
        for i in cluster.live_indexes()
    )


@pytest.mark.parametrize("qos", [1, 2])
def test_publishers_then_subscribers_broker_lost_with_its_disk_loses_nothing_and_keeps_the_session(
    tmp_path: Path, qos: int
) -> None:
    settings = {**FAST_SETTINGS, "cluster.replicas": "2"}
    cluster = LocalCluster(BROKERS, settings=settings, data_root=str(tmp_path))
    LIVE_CLUSTERS.append(cluster)
    made: list[ClusterClient] = []
    try:
        cluster.start()
        cluster.wait_ready(READY_TIMEOUT_S)
        order = sorted(range(BROKERS), key=lambda i: cluster.brokers[i].peer_id)
        a, x, s = order[0], order[-2], order[-1]  # A holds S's copies, S holds X's
        topic = f"{unique_id('disk')}/stream"
        sub_id = unique_id("disk-sub")
        sub = _client(cluster, s, client_id=sub_id, clean=False, session_expiry_s=600, max_inflight=WINDOW)
        made.append(sub)
        sub.subscribe(topic, qos)
        probe_route(cluster, a, sub, topic)
        probe_route(cluster, x, sub, topic)
        inbox = Inbox([sub])
        pub = _client(
            cluster,
            a,
            client_id=unique_id("disk-pub"),
            clean=False,
            session_expiry_s=600,
            max_inflight=WINDOW,
        )
        made.append(pub)
        first = IdStream(pub, topic, qos=qos, limit=10**9, window=WINDOW, rate_per_s=RATE_PER_S)
        first.start()
        try:
            first.wait_acked(MESSAGES // 5, STREAM_S)
            _wipe(cluster, a)
        finally:
            first.stop()
        on_a = len(first.acked_ids())
        pub2 = _client(
            cluster,
            x,
            client_id=unique_id("disk-pub"),
            clean=False,
            session_expiry_s=600,
            max_inflight=WINDOW,
        )
        made.append(pub2)
        second = IdStream(pub2, topic, qos=qos, limit=10**9, window=WINDOW, rate_per_s=RATE_PER_S)
        second.sent = first.sent  # ids go on where the first publisher stopped
        second.limit = second.sent + max(0, MESSAGES - on_a)
        try:
            cluster.restart_broker(a)  # empty: a new incarnation that restored nothing
            wait_until(
                lambda: _two_copies(cluster, a), COPIES_S, interval_s=0.2, what="2 copies after A rejoined"
            )
            second.start()  # the publisher goes on from X
            report(
                f"QoS {qos}: broker {a} (the publisher's) wiped after {on_a} acks, rejoined, 2 copies again"
            )
            second.wait_acked(MESSAGES // 2 - on_a, STREAM_S)
            inbox.poll()
            doubled_before = sum(count - 1 for count in inbox.counts.values() if count > 1)
            report(f"QoS {qos}: duplicates before S is wiped (A's loss): {doubled_before}")
            _wipe(cluster, s)
            killed_at = on_a + len(second.acked_ids())
            sub.disconnected.wait(10)
            started = time.monotonic()
            sub.connect(cluster.brokers[a].mqtt_port, host=cluster.brokers[a].host)
            reconnect_s = time.monotonic() - started
            present = sub.session_present
            report(
                f"QoS {qos}: broker {s} (the subscriber's) wiped after {killed_at} acks; session present"
                f" {present} on broker {a} ({reconnect_s:.2f} s)"
            )
            assert present, "the subscriber's session was not present on another broker"
            moved_at, sent_at_move = time.monotonic(), _metric(cluster, a, SENT)
            acked_at_move = len(second.acked_ids())
            cluster.restart_broker(s)
            second.wait_done(STREAM_S)
            # the subscriber's drain against the stream after the move: a subscriber slower than
            # the stream falls behind by the queue policy (``queue_full_oldest``), as on one broker
            seconds = time.monotonic() - moved_at
            drained = (_metric(cluster, a, SENT) - sent_at_move) / seconds
            streamed = (len(second.acked_ids()) - acked_at_move) / seconds
            report(
                f"QoS {qos}: after the move, {seconds:.1f} s: broker {a} sent {drained:.0f} msg/s to its"
                f" clients, the stream {streamed:.0f} msg/s acknowledged; load {os.getloadavg()[0]:.1f}"
            )
        finally:
            second.stop()
        acked = first.acked_ids() | second.acked_ids()
        result = tally(
            f"QoS {qos}, {BROKERS} brokers: the subscriber moved from {s} to {a}", inbox, acked, DRAIN_S
        )
        report(result)
        dropped = {
            i: metric_total(cluster.metrics_text(i), DROPPED, reason="queue_full_oldest")
            for i in cluster.live_indexes()
        }
        report(f"QoS {qos}: queue_full_oldest by live broker {dropped} (the wiped S's own are gone with it)")
        if result.lost:  # lost, or still queued for a subscriber slower than DRAIN_S allowed?
            depths = {i: _metric(cluster, i, "skipmq_session_queue_depth_max") for i in order}
            late = len(result.lost - inbox.wait_for(result.lost, 10.0))
            report(f"QoS {qos}: longest queue by broker {depths}; {late} of the missing came 10 s later")
        doubled = sorted(n for n, count in result.counts.items() if count > 1)
        by_500 = Counter(n // 500 * 500 for n in doubled)
        report(f"QoS {qos}: ids received more than once, by 500: {sorted(by_500.items())}")
        assert not result.lost, str(result)
        assert len(acked) >= MESSAGES
        # a duplicate of the publisher's broker's loss: an entry its holder publishes again that the
        # subscriber's broker had already received (released to the holder up to ~0.1-0.2 s late)
        of_s = result.duplicates - doubled_before
        report(f"QoS {qos}: duplicates of A's loss {doubled_before}, of S's loss {of_s}")
        # exactly once across a disk loss is not kept yet (docs/cluster.md, Replicas): the holders
        # learn what they may drop, and a session's copy its positions, ~0.1-0.2 s late; what
        # arrives twice is bounded by that. Before those fixes: 2,000-2,600 of 5,000 at QoS 1 and 2
        # (a send log's 10 s minimum retention published again, a stale session copy adopted)
        assert result.duplicates <= MESSAGES // 10, f"more duplicates than the lag explains: {result}"
        wait_until(
            lambda: _two_copies(cluster, s), COPIES_S, interval_s=0.5, what="2 copies after S rejoined"
        )
        taken = sum(_metric(cluster, i, "skipmq_cluster_replication_taken_over_entries") for i in order)
        adopted = sum(_metric(cluster, i, "skipmq_cluster_replication_adopted_sessions") for i in order)
        report(f"QoS {qos}: entries taken over {taken:g}, sessions adopted {adopted:g}; 2 copies again")
        assert adopted >= 1
        # what is promised (docs/cluster.md, the guarantees table), at QoS 2 too: of the publisher's
        # broker's loss, only entries its holder published again arrive twice; of the subscriber's
        # broker's loss, only what it delivered within the copy's lag before the loss plus the
        # window in flight (a copy taken from a former holder, 1,540 messages old: 2,660 and 3,366)
        assert doubled_before <= taken, f"{doubled_before} duplicates of A's loss, {taken:g} taken over"
        assert of_s <= S_LOSS_DUPLICATES, f"{of_s} duplicates of S's loss (at most {S_LOSS_DUPLICATES})"
    finally:
        close_tracked(cluster, made)
