"""Counting helpers of the zero-loss suites (tests/process/cluster/test_zero_loss.py, test_netsplit.py).

The promise checked (issue #10): every message whose PUBACK (QoS 1) / PUBCOMP (QoS 2) the
publisher received, published after the subscriber's SUBACK, reaches the subscriber; QoS 1 may
arrive more than once (counted and reported), QoS 2 exactly once.

- IdStream: a thread publishing ``<prefix><n>`` for n = 0, 1, ... as fast as a window of
  unacknowledged messages allows, up to ``limit`` (raised by the test while it runs), pausing
  while its client is disconnected. The client (ClusterClient) records the PUBACKed payloads.
- Inbox: the ids one or more subscriber clients received, with their copy counts.
- Tally: acknowledged vs received for one subscriber: lost ids, duplicates; str() for reports.
- env_int / env_float: counts and times a run by hand can raise (``SKIPMQ_ZL_*``).
- PersistentStream / persistent_stream: a QoS 1 stream from a persistent publisher on one broker
  to a persistent subscriber on another, routed before it starts; restart_under_stream restarts
  one broker of it as the chart does (graceful stop, start on the same data, ready again), the
  clients following (test_rolling_upgrade.py, test_ca_rotation.py).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tests.support.cluster import ClientFactory, ClusterClient, numbers, probe_route, unique_id, wait_until
from tools.launcher import LocalCluster, http_get


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    return float(value) if value else default


class IdStream(threading.Thread):
    """Publish ``prefix + str(n)`` at ``qos`` for n = 0 .. limit-1, at most ``window``
    unacknowledged at a time (and at most ``rate_per_s`` per second when given)."""

    def __init__(
        self,
        client: ClusterClient,
        topic: str,
        *,
        prefix: bytes = b"z",
        qos: int = 1,
        limit: int = 0,
        window: int = 100,
        rate_per_s: float | None = None,
    ) -> None:
        super().__init__(daemon=True, name=f"idstream-{topic}")
        self.client = client
        self.topic = topic
        self.prefix = prefix
        self.qos = qos
        self.limit = limit
        self.window = window
        self.rate_per_s = rate_per_s
        self.sent = 0  # ids handed to paho (0 .. sent-1)
        self._stop_event = threading.Event()

    def run(self) -> None:
        # a token bucket: ``rate_per_s``, bursts of at most ``window`` (a pause - the publisher's
        # broker down - is not made up for by publishing faster than the rate afterwards)
        tokens, last = 0.0, time.monotonic()
        while not self._stop_event.is_set():
            paced = False
            if self.rate_per_s is not None:
                now = time.monotonic()
                tokens = min(float(self.window), tokens + (now - last) * self.rate_per_s)
                last = now
                paced = tokens < 1.0
            if (
                self.sent >= self.limit
                or paced
                or len(self.client.pending) >= self.window
                or not self.client.client.is_connected()
            ):
                self._stop_event.wait(0.002)
                continue
            self.client.publish_nowait(self.topic, self.prefix + str(self.sent).encode(), self.qos)
            self.sent += 1
            tokens -= 1.0

    def acked_ids(self) -> set[int]:
        return set(numbers(self.client.acked_snapshot(), self.prefix))

    def wait_acked(self, count: int, timeout_s: float) -> None:
        """Wait (bounded) until ``count`` ids are acknowledged in total."""
        wait_until(lambda: len(self.acked_ids()) >= count, timeout_s, what=f"{count} acknowledged publishes")

    def wait_done(self, timeout_s: float) -> None:
        """Wait (bounded) until every id below ``limit`` was handed to paho and acknowledged."""
        wait_until(
            lambda: self.sent >= self.limit and not self.client.pending,
            timeout_s,
            interval_s=0.05,
            what=f"all {self.limit} publishes of {self.topic} acknowledged (sent {self.sent},"
            f" pending {len(self.client.pending)})",
        )

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop_event.set()
        self.join(timeout_s)

    def finish(self, timeout_s: float) -> None:
        """Publish no further id and wait (bounded) until every id handed to paho is acknowledged
        (a stream whose ``limit`` is only a ceiling, ended by the test)."""
        self.stop()
        wait_until(
            lambda: not self.client.pending,
            timeout_s,
            interval_s=0.05,
            what=f"the {self.sent} publishes of {self.topic} acknowledged"
            f" (pending {len(self.client.pending)})",
        )


@dataclass
class Inbox:
    """Counts the ids (payload ``prefix + n``) received by a set of subscriber clients."""

    clients: list[ClusterClient]
    prefix: bytes = b"z"
    counts: Counter[int] = field(default_factory=Counter)
    qos_seen: Counter[int] = field(default_factory=Counter)

    def poll(self) -> None:
        for client in self.clients:
            while True:
                try:
                    msg = client.messages.get_nowait()
                except queue.Empty:
                    break
                if msg.payload.startswith(self.prefix):
                    tail = msg.payload[len(self.prefix) :]
                    if tail.isdigit():
                        self.counts[int(tail)] += 1
                        self.qos_seen[msg.qos] += 1

    def missing(self, wanted: Iterable[int]) -> set[int]:
        self.poll()
        return {n for n in wanted if n not in self.counts}

    def wait_for(self, wanted: Iterable[int], timeout_s: float) -> set[int]:
        """Poll until every id of ``wanted`` arrived or timeout_s passed; returns the missing ids."""
        wanted = set(wanted)
        deadline = time.monotonic() + timeout_s
        while True:
            missing = self.missing(wanted)
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(0.05)

    def settle(self, quiet_s: float = 0.5, max_s: float = 5.0) -> None:
        """Keep counting until nothing arrived for quiet_s (at most max_s): late duplicates."""
        deadline = time.monotonic() + max_s
        last_total, last_change = sum(self.counts.values()), time.monotonic()
        while time.monotonic() < min(deadline, last_change + quiet_s):
            time.sleep(0.05)
            self.poll()
            total = sum(self.counts.values())
            if total != last_total:
                last_total, last_change = total, time.monotonic()


@dataclass
class Tally:
    """Acknowledged vs received for one subscriber (or one group)."""

    name: str
    acked: set[int]
    lost: set[int]
    counts: Counter[int]

    @property
    def duplicates(self) -> int:
        """Extra copies of ids that arrived more than once."""
        return sum(c - 1 for c in self.counts.values() if c > 1)

    @property
    def duplicated_ids(self) -> int:
        return sum(1 for c in self.counts.values() if c > 1)

    def __str__(self) -> str:
        lost = sorted(self.lost)
        shown = f" e.g. {lost[:15]}" if lost else ""
        return (
            f"{self.name}: acknowledged {len(self.acked)}, received {len(self.acked) - len(lost)} of them"
            f" ({len(self.counts)} distinct ids in all),"
            f" lost {len(lost)}{shown}; duplicates {self.duplicates} (on {self.duplicated_ids} ids)"
        )


def tally(name: str, inbox: Inbox, acked: set[int], drain_s: float) -> Tally:
    """Wait (bounded by drain_s) for every acknowledged id, count late duplicates, report."""
    lost = inbox.wait_for(acked, drain_s)
    inbox.settle()
    lost = inbox.missing(acked)
    return Tally(name, set(acked), lost, Counter(inbox.counts))


def report(*lines: object) -> None:
    """Print a measurement line (shown with pytest -s, and in the report of a failing test)."""
    print("[zero-loss]", *lines, flush=True)


@dataclass
class PersistentStream:
    """``stream`` publishes from ``pub`` (persistent) on ``topic`` to ``sub`` (persistent, QoS 1);
    ``inbox`` counts what ``sub`` receives. Not started."""

    topic: str
    pub: ClusterClient
    sub: ClusterClient
    inbox: Inbox
    stream: IdStream
    pub_broker: int
    sub_broker: int


def persistent_stream(
    cluster: LocalCluster,
    client_factory: ClientFactory,
    name: str,
    *,
    messages: int,
    window: int,
    rate_per_s: float,
    pub_broker: int = 0,
    sub_broker: int = 1,
) -> PersistentStream:
    """Subscribe a persistent session on ``sub_broker``, wait for the route from ``pub_broker``, and
    make the publisher (persistent, ``window`` in flight) and its stream of ``messages`` ids."""
    topic = f"{unique_id(name)}/stream"
    sub = client_factory(
        cluster, sub_broker, client_id=unique_id(f"{name}-sub"), clean=False, session_expiry_s=600
    )
    assert sub.subscribe(topic, 1) == [1]
    probe_route(cluster, pub_broker, sub, topic)
    pub = client_factory(
        cluster,
        pub_broker,
        client_id=unique_id(f"{name}-pub"),
        clean=False,
        session_expiry_s=600,
        max_inflight=window,
    )
    stream = IdStream(pub, topic, limit=messages, window=window, rate_per_s=rate_per_s)
    return PersistentStream(topic, pub, sub, Inbox([sub]), stream, pub_broker, sub_broker)


def broker_ready(cluster: LocalCluster, index: int) -> bool:
    """Broker ``index`` answers ``/readyz`` 200 (what the chart's readiness probe asks)."""
    broker = cluster.brokers[index]
    try:
        status, _ = http_get(broker.http_port, "/readyz", timeout_s=1.0, host=broker.host)
    except OSError:
        return False
    return status == 200


def restart_under_stream(
    cluster: LocalCluster,
    index: int,
    flow: PersistentStream,
    *,
    ready_s: float,
    move_publisher_to: int,
    until_ready: Callable[[], object] | None = None,
) -> None:
    """Stop broker ``index`` gracefully and start it on the same data directory, as a StatefulSet
    rolls a pod: the publisher, if it was there, reconnects to ``move_publisher_to`` (paho re-sends
    what was not acknowledged); the subscriber, if it was there, comes back once the broker is
    ready (and ``until_ready`` returned) and must find its session."""
    status = cluster.stop_broker(index)
    assert status == 0, f"broker {index} did not stop gracefully: {status}"
    if index == flow.pub_broker:
        flow.pub.wait_disconnected(10)
        flow.pub.connect(cluster.brokers[move_publisher_to].mqtt_port)
    if index == flow.sub_broker:
        flow.sub.wait_disconnected(10)
    cluster.restart_broker(index)
    wait_until(lambda: broker_ready(cluster, index), ready_s, what=f"broker {index} ready again")
    if until_ready is not None:
        until_ready()
    if index == flow.sub_broker:
        flow.sub.connect()
        assert flow.sub.session_present, f"broker {index} lost the persistent session over its restart"
