"""The cluster's backlog is counted apart from a session's queue limit (``Outbound.allow_backlog``,
docs/cluster.md "Flow control of catch-up: the queue limit in a cluster").

``Outbound`` on the real ``Durability`` (no store: a clean session), ``DropReporter`` and
``BrokerStats``, with a hand-driven scheduler and a connection that records what is written; the
client acknowledges what it was sent when the test says so (its drain). Default limits: a queue of
1,000, a window of 20.

* What the queue holds of the cluster's backlog plus what is still on its way (``held``) may wait
  beyond the limit; the allowance stands, however far the queue drains, until the backlog is in
  (``release_backlog``) - the allowance of a merged session (``allow_merged``) ended the moment
  the queue was below its limit, before a catch-up's backlog had even arrived, and that backlog was
  then dropped (test_disk_loss.py with 5 brokers, docs/notes/replication.md).
* Then it follows the queue down once the queue has drained below it: the subscriber is no
  further behind than its own lag, to which the limit alone applies - drop-oldest beyond it,
  counted as ``queue_full_oldest``, as on one broker.
* The allowance is at most ``BACKLOG_ALLOWANCE_LIMITS`` queue limits (the memory bound).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.config import load_config
from broker.core.drops import DropReporter
from broker.core.durability import Durability
from broker.core.messages import Message, OutEntry
from broker.core.outbound import BACKLOG_ALLOWANCE_LIMITS, Outbound
from broker.core.session import Session
from broker.core.stats import BrokerStats
from broker.mqtt.packets import MQTT_5

LIMIT = 1000
WINDOW = 20


class _Scheduler:
    """The calls ``Outbound`` and ``DropReporter`` make; ``call_soon`` runs at ``run_soon``."""

    def __init__(self) -> None:
        self.soon: list[tuple[Callable[..., object], tuple[Any, ...]]] = []

    def time(self) -> float:
        return 1000.0

    def wall_time(self) -> float:
        return 1_800_000_000.0

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        self.soon.append((callback, args))

    def call_later(self, delay_s: float, callback: Callable[..., object], *args: Any) -> None:
        return None


class _Transport:
    def get_write_buffer_size(self) -> int:
        return 0


class _Connection:
    """What the client was sent (PUBLISHes), in order."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.deferred = None
        self.out = None
        self.transport = _Transport()

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def flush(self) -> None:
        return None


def _outbound() -> tuple[Outbound, BrokerStats]:
    config = load_config(env={})
    assert config.limits.max_queued_messages == LIMIT and config.limits.max_inflight_messages == WINDOW
    assert config.limits.queue_overflow == "drop_oldest"
    scheduler = _Scheduler()
    stats = BrokerStats()
    durability = Durability(None, scheduler, sessions={}, retained=None, log_event=lambda *a, **k: None)  # type: ignore[arg-type]
    drops = DropReporter(stats, scheduler, lambda *a, **k: None, interval_s=10, queue_limit=LIMIT)  # type: ignore[arg-type]
    return Outbound(config.limits, durability, stats, scheduler, drops), stats  # type: ignore[arg-type]


def _session(client_id: str = "sub") -> Session:
    session = Session(client_id, MQTT_5, None)
    session.connection = _Connection()  # type: ignore[assignment]
    return session


def _entry(n: int) -> OutEntry:
    return OutEntry(Message("t", str(n).encode(), 1), 1, False, [])


def _drain(outbound: Outbound, session: Session, count: int) -> None:
    """The client acknowledges ``count`` messages, oldest first (each frees a window slot)."""
    for _ in range(count):
        packet_id = next(iter(session.inflight))
        entry = session.inflight.pop(packet_id)
        outbound.complete(session, entry)


def test_a_stalled_catch_ups_backlog_waits_beyond_the_limit_until_in_then_the_lag_has_the_limit() -> None:
    outbound, stats = _outbound()
    session = _session()
    sent = 0
    for n in range(WINDOW + 500):  # the paced catch-up: the window, then half the limit queued
        outbound.enqueue(session, _entry(n))
    sent = WINDOW + 500
    assert len(session.queue) == 500
    # the stall sets the lone session aside: 1,500 more of the catch-up are on their way
    outbound.allow_backlog(session, 500 + 1500, held=True)
    assert session.overdraft == 2000
    _drain(outbound, session, 450)  # the client drains before the backlog arrives ...
    assert len(session.queue) == 50 and session.overdraft == 2000  # ... the allowance stands
    for n in range(sent, sent + 1500):  # the backlog enters unpaced
        outbound.enqueue(session, _entry(n))
    sent += 1500
    assert len(session.queue) == 1550 and stats.messages_dropped["queue_full_oldest"] == 0
    outbound.release_backlog(session)  # the catch-up is live again: the backlog is in
    assert session.overdraft == 1550  # the backlog the queue holds (the client took 450 of it)
    _drain(outbound, session, 1000)
    assert len(session.queue) == 550 and session.overdraft == 550  # follows the queue down
    # the client is slower than the live stream from here: its own lag may reach the limit
    # beyond what is left of the backlog, then drop-oldest applies, counted
    for n in range(sent, sent + 1000):
        outbound.enqueue(session, _entry(n))
    sent += 1000
    assert len(session.queue) == 1550 and stats.messages_dropped["queue_full_oldest"] == 0
    for n in range(sent, sent + 300):
        outbound.enqueue(session, _entry(n))
    assert len(session.queue) == 1550 and stats.messages_dropped["queue_full_oldest"] == 300
    # the client catches up: below its allowance the allowance follows, at 0 the limit alone applies
    _drain(outbound, session, 1550 + WINDOW)
    assert not session.queue and session.overdraft == 0
    for n in range(LIMIT + WINDOW + 5):
        outbound.enqueue(session, _entry(n))
    assert len(session.queue) == LIMIT and stats.messages_dropped["queue_full_oldest"] == 305


def test_a_catch_up_that_turned_live_leaves_its_paced_backlog_outside_the_limit() -> None:
    outbound, stats = _outbound()
    session = _session()
    for n in range(WINDOW + 500):
        outbound.enqueue(session, _entry(n))
    outbound.allow_backlog(session, 500)  # live again: the 500 the pacing left queued are backlog
    assert session.overdraft == 500
    for n in range(1000):  # the client's own lag: up to the limit beyond them, nothing dropped
        outbound.enqueue(session, _entry(n))
    assert len(session.queue) == 1500 and stats.messages_dropped["queue_full_oldest"] == 0
    outbound.enqueue(session, _entry(0))
    assert stats.messages_dropped["queue_full_oldest"] == 1


def test_the_allowance_is_bounded_and_the_old_merge_rule_still_ends_below_the_limit() -> None:
    outbound, _stats = _outbound()
    session = _session()
    outbound.allow_backlog(session, 10**9, held=True)
    assert session.overdraft == BACKLOG_ALLOWANCE_LIMITS * LIMIT
    merged = _session("merged")
    for n in range(WINDOW + 900):
        outbound.enqueue(merged, _entry(n))
    outbound.allow_merged(merged, 600)  # a merged session's queue: the excess over the limit
    assert merged.overdraft == 500
    _drain(outbound, merged, 600)
    assert len(merged.queue) == 300 and merged.overdraft == 300
