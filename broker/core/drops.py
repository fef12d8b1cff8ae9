"""Dropped messages are never silent: a counter per reason and a rate-limited log line per client.

Every message the broker drops instead of delivering it to a subscription goes through
:meth:`DropReporter.dropped`: it counts the drop in ``BrokerStats.messages_dropped[reason]``
(``skipmq_messages_dropped_total{reason=...}``, ``$SYS/broker/messages/dropped/<reason>``) and
hands it to :class:`DropLogLimiter`, which decides when to log: the first drop of a client logs
a WARNING ``messages_dropped`` line at once; further drops of that client within
``logging.dropped_messages_interval_s`` are only counted, and a timer logs their total (per reason)
when the interval is over. So a client whose queue overflows steadily gets one line per
interval, and every drop is in some line.

The limiter is pure (it is given ``now``); the reporter takes the time from the Scheduler port.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.core.ports import Scheduler
    from broker.core.stats import BrokerStats

LogEvent = Callable[..., None]

# Drop reasons (``reason`` label values) of messages matched to a subscription but not delivered.
QUEUE_FULL_OLDEST = "queue_full_oldest"  # drop_oldest: the oldest queued message was evicted
QUEUE_FULL_NEW = "queue_full_new"  # drop_new: the new message was refused
EXPIRED = "expired"  # the message expiry interval ran out while the message waited
PACKET_TOO_LARGE = "packet_too_large"  # larger than the client's Maximum Packet Size
SLOW_CONSUMER = "slow_consumer"  # QoS 0 to a client whose write buffer is above the high water
ACL_DENIED = "acl_denied"  # the ACL does not let the subscriber receive the topic
QOS0_OFFLINE = "qos0_offline"  # QoS 0 to a disconnected persistent session (never queued)
MEMORY_HIGH_WATER = "memory_high_water"  # an incoming QoS 0 PUBLISH above limits.memory_high_water_bytes
SESSION_ENDED = "session_ended"  # still queued / in flight when the session ended (expired, clean)


@dataclass(slots=True)
class DropReport:
    """What one log line says: a client's drops (per reason) since its previous line."""

    client_id: str
    dropped_by_reason: dict[str, int]

    @property
    def dropped(self) -> int:
        return sum(self.dropped_by_reason.values())


@dataclass(slots=True)
class _ClientDrops:
    next_line_at: float
    pending: dict[str, int] = field(default_factory=dict)


class DropLogLimiter:
    """At most one report per client per ``interval_s`` (pure: every call is given ``now``).

    ``record`` counts a drop and returns a report when the client may be logged now (its first
    drop, or its previous line is ``interval_s`` old); ``due`` is the timer's question at or after
    ``next_line_at``: the report of what was counted meanwhile, if anything. A client with nothing
    counted for a whole interval is forgotten (its next drop is logged at once again).
    """

    __slots__ = ("_clients", "interval_s")

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._clients: dict[str, _ClientDrops] = {}

    def record(self, client_id: str, reason: str, count: int, now: float) -> DropReport | None:
        state = self._clients.get(client_id)
        if state is None:
            self._clients[client_id] = _ClientDrops(now + self.interval_s)
            return DropReport(client_id, {reason: count})
        pending = state.pending
        pending[reason] = pending.get(reason, 0) + count
        if now >= state.next_line_at:
            return self._take(client_id, state, now)
        return None

    def due(self, client_id: str, now: float) -> DropReport | None:
        state = self._clients.get(client_id)
        if state is None or now < state.next_line_at:
            return None
        if not state.pending:
            del self._clients[client_id]
            return None
        return self._take(client_id, state, now)

    def take_all(self) -> list[DropReport]:
        """Every client's drops not reported yet (at shutdown), and forget all clients."""
        reports = [
            DropReport(client_id, state.pending)
            for client_id, state in self._clients.items()
            if state.pending
        ]
        self._clients.clear()
        return reports

    def next_line_at(self, client_id: str) -> float | None:
        """When ``due`` should be asked next for this client (None: not tracked)."""
        state = self._clients.get(client_id)
        return None if state is None else state.next_line_at

    def _take(self, client_id: str, state: _ClientDrops, now: float) -> DropReport:
        report = DropReport(client_id, state.pending)
        state.pending = {}
        state.next_line_at = now + self.interval_s
        return report


class DropReporter:
    """Counts each dropped message by reason and logs per client through a :class:`DropLogLimiter`."""

    __slots__ = ("_limiter", "_log_event", "_queue_limit", "_scheduler", "_timers", "stats")

    def __init__(
        self,
        stats: BrokerStats,
        scheduler: Scheduler,
        log_event: LogEvent,
        *,
        interval_s: float,
        queue_limit: int,
    ) -> None:
        self.stats = stats
        self._scheduler = scheduler
        self._log_event = log_event
        self._queue_limit = queue_limit
        self._limiter = DropLogLimiter(interval_s)
        self._timers: dict[str, Any] = {}  # client id -> timer handle of its next ``due`` check

    def dropped(self, client_id: str, reason: str, count: int = 1) -> None:
        """``count`` messages for ``client_id``'s subscriptions were dropped for ``reason``."""
        if count <= 0:
            return
        self.stats.count_drop(reason, count)
        report = self._limiter.record(client_id, reason, count, self._scheduler.time())
        if report is not None:
            self._log(report)
        if client_id not in self._timers:
            self._schedule(client_id)

    def close(self) -> None:
        """The broker stops: log what is still unreported and stop the timers."""
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for report in self._limiter.take_all():
            self._log(report)

    def _schedule(self, client_id: str) -> None:
        next_line_at = self._limiter.next_line_at(client_id)
        if next_line_at is None:
            return
        delay_s = max(0.0, next_line_at - self._scheduler.time())
        self._timers[client_id] = self._scheduler.call_later(delay_s, self._check, client_id)

    def _check(self, client_id: str) -> None:
        self._timers.pop(client_id, None)
        report = self._limiter.due(client_id, self._scheduler.time())
        if report is not None:
            self._log(report)
        self._schedule(client_id)

    def _log(self, report: DropReport) -> None:
        reasons = report.dropped_by_reason
        self._log_event(
            logging.WARNING,
            "messages_dropped",
            client_id=report.client_id,
            reason=",".join(sorted(reasons)),
            dropped=report.dropped,
            dropped_by_reason=dict(reasons),
            queue_limit=self._queue_limit,
            interval_s=self._limiter.interval_s,
        )
