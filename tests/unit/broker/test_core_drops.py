"""Dropped messages are never silent: counter per reason, rate-limited warning per client, $SYS.

The limiter and the reporter are tested on their own with a hand-driven clock; the drop paths
through a real broker (tests/support/core.py), each checked for its exact count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.core.drops import DropLogLimiter, DropReport, DropReporter
from broker.core.stats import BrokerStats
from broker.logs import record_fields
from tests.support.core import MQTT_5, RawClient, ThreadedBroker, start_broker, wait_for

__all__ = ["start_broker"]

Start = Callable[..., ThreadedBroker]


# ============================================================ the pure limiter
def test_limiter_reports_the_first_drop_at_once_then_sums_until_the_interval_is_over() -> None:
    limiter = DropLogLimiter(interval_s=10)
    assert limiter.record("c1", "queue_full_oldest", 1, now=100.0) == DropReport(
        "c1", {"queue_full_oldest": 1}
    )
    for step in range(5):
        assert limiter.record("c1", "queue_full_oldest", 1, now=101.0 + step) is None
    assert limiter.record("c1", "expired", 2, now=109.9) is None
    assert limiter.due("c1", now=109.99) is None
    report = limiter.due("c1", now=110.0)
    assert report == DropReport("c1", {"queue_full_oldest": 5, "expired": 2})
    assert report.dropped == 7
    assert limiter.next_line_at("c1") == 120.0


def test_limiter_is_per_client() -> None:
    limiter = DropLogLimiter(interval_s=10)
    assert limiter.record("a", "queue_full_new", 1, now=0.0) is not None
    assert limiter.record("b", "queue_full_new", 1, now=1.0) is not None
    assert limiter.record("a", "queue_full_new", 1, now=2.0) is None


def test_limiter_reports_on_record_when_the_interval_is_over_and_forgets_idle_clients() -> None:
    limiter = DropLogLimiter(interval_s=10)
    limiter.record("c1", "slow_consumer", 1, now=0.0)
    limiter.record("c1", "slow_consumer", 1, now=5.0)
    assert limiter.record("c1", "slow_consumer", 1, now=10.0) == DropReport("c1", {"slow_consumer": 2})
    assert limiter.due("c1", now=20.0) is None  # nothing new for a whole interval: forgotten
    assert limiter.next_line_at("c1") is None
    assert limiter.record("c1", "slow_consumer", 1, now=21.0) == DropReport("c1", {"slow_consumer": 1})


def test_limiter_take_all_returns_only_unreported_drops() -> None:
    limiter = DropLogLimiter(interval_s=10)
    limiter.record("a", "expired", 1, now=0.0)
    limiter.record("a", "expired", 3, now=1.0)
    limiter.record("b", "expired", 1, now=1.0)
    assert limiter.take_all() == [DropReport("a", {"expired": 3})]
    assert limiter.next_line_at("a") is None


# ============================================================ the reporter, on a hand-driven clock
class _Handle:
    def __init__(
        self, clock: ManualScheduler, when: float, callback: Callable[..., object], args: Any
    ) -> None:
        self.when, self.callback, self.args, self.cancelled = when, callback, args, False
        clock.timers.append(self)

    def cancel(self) -> None:
        self.cancelled = True


class ManualScheduler:
    """Just the Scheduler calls the reporter makes; ``advance`` runs the timers that are due."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.timers: list[_Handle] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay_s: float, callback: Callable[..., object], *args: Any) -> _Handle:
        return _Handle(self, self.now + delay_s, callback, args)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while due := [t for t in self.timers if not t.cancelled and t.when <= self.now]:
            for timer in due:
                self.timers.remove(timer)
                timer.callback(*timer.args)


def test_reporter_counts_every_drop_and_logs_once_per_interval_with_the_sum() -> None:
    scheduler = ManualScheduler()
    stats = BrokerStats()
    lines: list[dict[str, Any]] = []
    reporter = DropReporter(
        stats,
        scheduler,  # type: ignore[arg-type]
        lambda level, event, **fields: lines.append({"level": level, "event": event, **fields}),
        interval_s=10,
        queue_limit=1000,
    )
    for _ in range(1913):
        reporter.dropped("offline-sub", "queue_full_oldest")
        scheduler.advance(0.001)
    assert stats.messages_dropped["queue_full_oldest"] == 1913
    assert len(lines) == 1
    assert lines[0] == {
        "level": logging.WARNING,
        "event": "messages_dropped",
        "client_id": "offline-sub",
        "reason": "queue_full_oldest",
        "dropped": 1,
        "dropped_by_reason": {"queue_full_oldest": 1},
        "queue_limit": 1000,
        "interval_s": 10,
    }
    scheduler.advance(10)  # the interval since the first line is over: the rest in one line
    assert len(lines) == 2 and lines[1]["dropped"] == 1912
    scheduler.advance(60)  # nothing more: no more lines, the client is forgotten
    assert len(lines) == 2 and not [t for t in scheduler.timers if not t.cancelled]
    reporter.dropped("offline-sub", "expired", 3)
    assert lines[2]["dropped_by_reason"] == {"expired": 3}


def test_reporter_close_logs_what_was_not_reported_yet() -> None:
    scheduler = ManualScheduler()
    lines: list[dict[str, Any]] = []
    reporter = DropReporter(
        BrokerStats(),
        scheduler,  # type: ignore[arg-type]
        lambda level, event, **fields: lines.append(fields),
        interval_s=10,
        queue_limit=5,
    )
    reporter.dropped("c", "queue_full_new", 1)
    reporter.dropped("c", "queue_full_new", 4)
    reporter.close()
    assert [line["dropped"] for line in lines] == [1, 4]
    assert not [t for t in scheduler.timers if not t.cancelled]


# ============================================================ drop paths through a real broker
def dropped(threaded: ThreadedBroker) -> dict[str, int]:
    return dict(threaded.call(lambda: dict(threaded.broker.stats.messages_dropped)))


def drop_lines(caplog: pytest.LogCaptureFixture, client_id: str) -> list[dict[str, Any]]:
    return [
        fields
        for record in caplog.records
        if (fields := record_fields(record)).get("event") == "messages_dropped"
        and fields.get("client_id") == client_id
    ]


def offline_subscriber(port: int, client_id: str, topic_filter: str, qos: int = 1) -> None:
    sub = RawClient(port, MQTT_5)
    sub.connect(client_id, clean=False, properties={"session_expiry_interval": 300})
    sub.subscribe(topic_filter, qos)
    sub.disconnect()


def publish_many(port: int, topic: str, count: int, qos: int = 1) -> None:
    pub = RawClient(port, MQTT_5)
    pub.connect(f"pub-{topic.replace('/', '-')}")
    for index in range(count):
        if qos:
            pub.publish_acked(topic, str(index).encode(), qos, packet_id=index + 1)
        else:
            pub.publish(topic, str(index).encode())
    pub.disconnect()


def test_offline_overflow_drop_oldest_counts_logs_and_publishes_sys(
    start_broker: Start, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="skipmq.broker")
    threaded = start_broker(
        limits__max_queued_messages=3,
        limits__queue_overflow="drop_oldest",
        logging__dropped_messages_interval_s=1,
        sys__interval_s=1,
    )
    port = threaded.ports["tcp"]
    offline_subscriber(port, "overflow-sub", "ov/t")
    before = dropped(threaded)
    started = time.monotonic()
    publish_many(port, "ov/t", 10)
    after = dropped(threaded)
    assert after["queue_full_oldest"] - before["queue_full_oldest"] == 7
    assert after["queue_full_new"] == before["queue_full_new"]
    # within the interval: one line, naming the client, for the first drop
    lines = drop_lines(caplog, "overflow-sub")
    assert time.monotonic() - started < 1, "the publishes took longer than the interval"
    assert len(lines) == 1
    assert lines[0]["reason"] == "queue_full_oldest"
    assert (lines[0]["dropped"], lines[0]["queue_limit"]) == (1, 3)
    # after the interval: the next line with the other six
    wait_for(lambda: len(drop_lines(caplog, "overflow-sub")) == 2, 5, "the second messages_dropped line")
    assert drop_lines(caplog, "overflow-sub")[1]["dropped_by_reason"] == {"queue_full_oldest": 6}
    # $SYS: the total and the per-reason value
    watcher = RawClient(port)
    watcher.connect("sys-watcher")
    watcher.subscribe("$SYS/broker/messages/dropped/#", 0)  # "#" matches the parent level too
    expected = {
        "$SYS/broker/messages/dropped/queue_full_oldest": str(after["queue_full_oldest"]).encode(),
        "$SYS/broker/messages/dropped": str(sum(after.values())).encode(),
    }
    seen: dict[str, bytes] = {}
    deadline = time.monotonic() + 5
    while any(seen.get(topic) != value for topic, value in expected.items()):
        assert time.monotonic() < deadline, f"$SYS never showed {expected}, saw {seen}"
        message = watcher.expect_publish()
        seen[message.topic] = message.payload
    # and the subscriber gets the newest three, as drop_oldest promises
    back = RawClient(port, MQTT_5)
    back.connect("overflow-sub", clean=False, properties={"session_expiry_interval": 300})
    payloads = []
    for _ in range(3):
        message = back.expect_publish()
        payloads.append(message.payload)
        back.ack(message)
    assert payloads == [b"7", b"8", b"9"]


def test_offline_overflow_drop_new_counts_queue_full_new(
    start_broker: Start, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="skipmq.broker")
    threaded = start_broker(limits__max_queued_messages=2, limits__queue_overflow="drop_new")
    port = threaded.ports["tcp"]
    offline_subscriber(port, "refuse-sub", "rf/t")
    before = dropped(threaded)
    publish_many(port, "rf/t", 6)
    after = dropped(threaded)
    assert after["queue_full_new"] - before["queue_full_new"] == 4
    assert after["queue_full_oldest"] == before["queue_full_oldest"]
    (line,) = drop_lines(caplog, "refuse-sub")  # the default interval (10 s) is not over
    assert (line["reason"], line["queue_limit"]) == ("queue_full_new", 2)


def test_qos0_for_an_offline_session_is_counted(
    start_broker: Start, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="skipmq.broker")
    threaded = start_broker()
    port = threaded.ports["tcp"]
    offline_subscriber(port, "zero-sub", "q0/t", qos=0)
    before = dropped(threaded)
    publish_many(port, "q0/t", 5, qos=0)
    wait_for(lambda: dropped(threaded)["qos0_offline"] - before["qos0_offline"] == 5, 5, "5 qos0_offline")
    assert dropped(threaded)["no_subscribers"] == before["no_subscribers"]
    assert drop_lines(caplog, "zero-sub")[0]["reason"] == "qos0_offline"


def test_messages_queued_when_the_session_expires_are_counted(start_broker: Start) -> None:
    threaded = start_broker()
    port = threaded.ports["tcp"]
    sub = RawClient(port, MQTT_5)
    sub.connect("expiring-sub", clean=False, properties={"session_expiry_interval": 1})
    sub.subscribe("se/t", 1)
    sub.disconnect()
    before = dropped(threaded)
    publish_many(port, "se/t", 4)
    wait_for(lambda: dropped(threaded)["session_ended"] - before["session_ended"] == 4, 5, "4 session_ended")


def test_messages_discarded_by_a_clean_start_are_counted(start_broker: Start) -> None:
    threaded = start_broker()
    port = threaded.ports["tcp"]
    offline_subscriber(port, "restart-sub", "cs/t")
    publish_many(port, "cs/t", 3)
    before = dropped(threaded)
    fresh = RawClient(port, MQTT_5)
    assert fresh.connect("restart-sub", clean=True).session_present is False
    assert dropped(threaded)["session_ended"] - before["session_ended"] == 3


def test_acl_denied_at_receive_is_counted_for_live_and_retained_messages(
    start_broker: Start, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="skipmq.broker")
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite acl/#\npattern deny acl/%c-secret\n")
    threaded = start_broker(auth__acl_file=str(acl))
    port = threaded.ports["tcp"]
    pub = RawClient(port, MQTT_5)
    pub.connect("acl-pub")
    pub.publish_acked("acl/reader-secret", b"kept", 1, packet_id=1, retain=True)
    before = dropped(threaded)
    reader = RawClient(port, MQTT_5)
    reader.connect("reader")
    reader.subscribe("acl/#", 1)  # the retained one is withheld
    pub.publish_acked("acl/reader-secret", b"live", 1, packet_id=2)
    pub.publish_acked("acl/open", b"open", 1, packet_id=3)
    assert reader.expect_publish().payload == b"open"
    assert dropped(threaded)["acl_denied"] - before["acl_denied"] == 2
    assert drop_lines(caplog, "reader")[0]["reason"] == "acl_denied"
