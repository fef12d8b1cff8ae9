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
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.support.cluster import ClusterClient, numbers, wait_until


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
