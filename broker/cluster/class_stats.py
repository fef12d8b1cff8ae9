"""Per-topic-class figures and the snapshots a broker publishes of them (pure core; issue #13).

The cluster routes on topic classes (``broker.cluster.classes``; SIONet's vocabulary-concept
routing, seed 000) over SG-TBPS with Flexible Routing Tables (seed 003). Whether a class is served
in one hop or several depends on how many brokers subscribe it compared with the routing-table size
L (seed 003 §3.3: a publisher whose table holds every subscriber broker of a class reaches each of
them directly). Operators want these figures per class over time; ``/metrics`` carries them only
summed over classes. ``ClassCounters`` keeps them per class with one dict look-up and a few integer
additions per message (the hot path stays as cheap as the existing ``ClusterStats``), and
``SnapshotBuilder`` turns them, on the adapter's timer, into the JSON document
``$SYS/skipmq/<broker-id>/classes`` carries (docs/pipeline.md "Snapshots"): cumulative totals and
the deltas since the previous snapshot, so a consumer sums deltas over a window without keeping
state, and a broker restart (totals back at 0) loses nothing but the unpublished last interval.

No I/O: ``now`` comes in, a dict goes out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from broker.cluster.stats import HOP_BUCKETS

SNAPSHOT_VERSION = 1
PUBLISHES, FORWARDS, RECEIVED, DELIVERIES, WASTED, HOP_SUM = range(6)
_FIRST_HOP = 6  # then one counter per HOP_BUCKETS bound and one for +Inf
_WIDTH = _FIRST_HOP + len(HOP_BUCKETS) + 1
COUNTER_NAMES = ("publishes", "forwards", "received", "deliveries", "wasted", "hop_sum")


class ClassCounters:
    """Plain-int counters per class, updated on the event-loop thread."""

    def __init__(self) -> None:
        self.by_class: dict[str, list[int]] = {}

    def _row(self, cls: str) -> list[int]:
        row = self.by_class.get(cls)
        if row is None:
            row = self.by_class[cls] = [0] * _WIDTH
        return row

    def published(self, cls: str) -> None:
        """A local client published a message whose exact class is ``cls``."""
        self._row(cls)[PUBLISHES] += 1

    def forwarded(self, cls: str) -> None:
        """This broker published a message into the overlay on ``cls``."""
        self._row(cls)[FORWARDS] += 1

    def received(self, cls: str, hops: int, delivered: bool) -> None:
        """A forwarded message of ``cls`` reached this broker after ``hops`` overlay hops;
        ``delivered``: some local subscriber took it (else it was a wasted forward)."""
        row = self._row(cls)
        row[RECEIVED] += 1
        row[DELIVERIES if delivered else WASTED] += 1
        row[HOP_SUM] += hops
        for index, bound in enumerate(HOP_BUCKETS):
            if hops <= bound:
                row[_FIRST_HOP + index] += 1
                return
        row[-1] += 1


def hop_bucket_bounds() -> list[str]:
    """The upper bounds of the hop histogram, as the snapshot names them (``"+Inf"`` last)."""
    return [str(bound) for bound in HOP_BUCKETS] + ["+Inf"]


class SnapshotBuilder:
    """Builds successive snapshots of one broker's ``ClassCounters``: totals, deltas since the
    previous snapshot, and each class's subscriber-broker count with the count at the previous
    snapshot (so a consumer sees a crossing of L in one row)."""

    def __init__(self, broker_id: str, counters: ClassCounters, table_size: int) -> None:
        self.broker_id = broker_id
        self.counters = counters
        self.table_size = table_size
        self.seq = 0
        self._last: dict[str, list[int]] = {}
        self._last_subscribers: dict[str, int] = {}
        self._last_at: float | None = None

    def build(
        self,
        now_s: float,
        subscriber_brokers: Callable[[str], int],
        known_classes: Iterable[str] = (),
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The snapshot at wall time ``now_s``; ``subscriber_brokers(cls)``: how many brokers
        (this one included) subscribe ``cls`` as this broker knows it; ``known_classes``: classes
        to report even without traffic (subscribed here or elsewhere)."""
        self.seq += 1
        interval_s = 0.0 if self._last_at is None else max(0.0, now_s - self._last_at)
        self._last_at = now_s
        classes: list[dict[str, Any]] = []
        names = set(self.counters.by_class) | set(known_classes)
        for cls in sorted(names):
            row = self.counters.by_class.get(cls) or [0] * _WIDTH
            last = self._last.get(cls) or [0] * _WIDTH
            self._last[cls] = list(row)
            subscribers = subscriber_brokers(cls)
            previous = self._last_subscribers.get(cls, 0)
            self._last_subscribers[cls] = subscribers
            entry: dict[str, Any] = {"class": cls}
            for index, name in enumerate(COUNTER_NAMES):
                entry[name] = row[index]
                entry[f"{name}_delta"] = row[index] - last[index]
            entry["hops"] = row[_FIRST_HOP:]
            hops_now, hops_before = row[_FIRST_HOP:], last[_FIRST_HOP:]
            entry["hops_delta"] = [now - before for now, before in zip(hops_now, hops_before, strict=True)]
            entry["subscriber_brokers"] = subscribers
            entry["subscriber_brokers_before"] = previous
            classes.append(entry)
        snapshot: dict[str, Any] = {
            "version": SNAPSHOT_VERSION,
            "broker": self.broker_id,
            "seq": self.seq,
            "ts": round(now_s, 3),
            "interval_s": round(interval_s, 3),
            "table_size": self.table_size,
            "hop_bounds": hop_bucket_bounds(),
            "classes": classes,
        }
        if extra:
            snapshot.update(extra)
        return snapshot
