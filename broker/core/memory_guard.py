"""The memory high-water mark (issue #12; docs/security.md "Memory high-water mark").

Implements ``limits.memory_high_water_bytes`` / ``limits.memory_low_water_bytes``: the adapter
reads the process's resident memory (RSS) every ``limits.memory_check_interval_ms`` and hands it
to :meth:`MemoryGuard.observe`. Above the high-water mark the broker is under memory pressure
until RSS falls below the low-water mark (hysteresis, so it does not flap at the boundary).
While under pressure (broker/core/client.py, broker/core/broker.py): new CONNECTs are refused
with 0x89 Server busy, incoming QoS 0 PUBLISHes are dropped (counted as ``memory_high_water``),
and a client that publishes QoS 1/2 has its PUBLISH accepted and acknowledged as usual but is
then no longer read from until the pressure ends. A WARNING line when the mark is crossed, one
every ``log_interval_s`` while it lasts (with what was refused and dropped meanwhile), and an
INFO line at recovery. Not from a seed paper: the resource limit every exposed broker needs
(mosquitto ``memory_limit``, EMQX's ``sysmon`` memory watermarks).

Pure: ``now`` and the measured bytes are passed in; no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

CROSSED_HIGH = "crossed_high"
STILL_HIGH = "still_high"
RECOVERED = "recovered"

_DEFAULT_LOW_RATIO = 0.8


@dataclass(slots=True)
class MemoryGuard:
    """Hysteresis between a high- and a low-water mark, with a rate-limited "still high" report."""

    high_bytes: int
    low_bytes: int = 0
    log_interval_s: float = 10.0
    above: bool = False
    used_bytes: int = 0
    refused_connects: int = 0  # since the last report
    dropped_qos0: int = 0
    paused_producers: int = 0
    _next_report_at: float = 0.0

    def __post_init__(self) -> None:
        if self.high_bytes and not self.low_bytes:
            self.low_bytes = int(self.high_bytes * _DEFAULT_LOW_RATIO)

    @property
    def enabled(self) -> bool:
        return self.high_bytes > 0

    def observe(self, used_bytes: int, now: float) -> str | None:
        """A measurement; returns CROSSED_HIGH, RECOVERED, STILL_HIGH (a report is due) or None."""
        self.used_bytes = used_bytes
        if not self.enabled:
            return None
        if not self.above:
            if used_bytes > self.high_bytes:
                self.above = True
                self._next_report_at = now + self.log_interval_s
                return CROSSED_HIGH
            return None
        if used_bytes < self.low_bytes:
            self.above = False
            return RECOVERED
        if now >= self._next_report_at:
            self._next_report_at = now + self.log_interval_s
            return STILL_HIGH
        return None

    def take_counts(self) -> dict[str, int]:
        """What was refused and dropped since the previous report (then reset)."""
        counts = {
            "refused_connects": self.refused_connects,
            "dropped_qos0": self.dropped_qos0,
            "paused_producers": self.paused_producers,
        }
        self.refused_connects = self.dropped_qos0 = self.paused_producers = 0
        return counts
