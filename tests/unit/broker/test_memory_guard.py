"""MemoryGuard: hysteresis between the high- and low-water marks, rate-limited reports
(broker/core/memory_guard.py; the process test is tests/process/integration/test_memory_high_water.py)."""

from __future__ import annotations

from broker.core.memory_guard import CROSSED_HIGH, RECOVERED, STILL_HIGH, MemoryGuard


def test_off_when_no_high_water_mark() -> None:
    guard = MemoryGuard(0)
    assert not guard.enabled
    assert guard.observe(10**12, 0.0) is None and not guard.above


def test_hysteresis_and_rate_limited_reports() -> None:
    guard = MemoryGuard(1000, log_interval_s=10.0)
    assert guard.low_bytes == 800  # default: 80% of the high-water mark
    assert guard.observe(1000, 0.0) is None  # at the mark is not above it
    assert guard.observe(1001, 1.0) == CROSSED_HIGH and guard.above
    assert guard.observe(900, 2.0) is None and guard.above  # between the marks: still under pressure
    assert guard.observe(1500, 5.0) is None  # the next report is due 10 s after the crossing
    guard.refused_connects += 2
    guard.dropped_qos0 += 3
    assert guard.observe(1500, 11.0) == STILL_HIGH
    assert guard.take_counts() == {"refused_connects": 2, "dropped_qos0": 3, "paused_producers": 0}
    assert guard.take_counts()["refused_connects"] == 0
    assert guard.observe(800, 12.0) is None  # at the low-water mark is not below it
    assert guard.observe(799, 13.0) == RECOVERED and not guard.above
    assert guard.observe(900, 14.0) is None


def test_explicit_low_water_mark() -> None:
    guard = MemoryGuard(1000, 500)
    guard.observe(2000, 0.0)
    assert guard.observe(600, 1.0) is None
    assert guard.observe(499, 2.0) == RECOVERED
