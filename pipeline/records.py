"""Rows of the pipeline's sources: snapshot JSON and Prometheus text turned into flat records.

Pure functions (no Spark): a snapshot of ``$SYS/skipmq/<broker-id>/classes``
(``broker.cluster.class_stats``) becomes one record per class; a ``/metrics`` page becomes one
record per sample. The Spark schemas below list the same fields in the same order.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

HOP_COLUMNS = 9  # the snapshot's hop histogram: bounds 1,2,3,4,6,8,12,16 and +Inf
HOP_BOUNDS = (
    1,
    2,
    3,
    4,
    6,
    8,
    12,
    16,
    32,
)  # +Inf read as 32 hops for percentiles (never reached in practice)
COUNTERS = ("publishes", "forwards", "received", "deliveries", "wasted", "hop_sum")

SNAPSHOT_FIELDS: list[tuple[str, str]] = [
    ("broker", "string"),
    ("ts", "double"),
    ("seq", "long"),
    ("interval_s", "double"),
    ("table_size", "int"),
    ("class", "string"),
    *[(f"{name}_delta", "long") for name in COUNTERS],
    *[(f"hops_{index}", "long") for index in range(HOP_COLUMNS)],
    ("subscriber_brokers", "int"),
    ("subscriber_brokers_before", "int"),
    ("queued_messages", "long"),
    ("connections", "long"),
]
SNAPSHOT_SCHEMA = ", ".join(f"`{name}` {kind}" for name, kind in SNAPSHOT_FIELDS)

METRIC_FIELDS: list[tuple[str, str]] = [
    ("instance", "string"),
    ("node_id", "string"),
    ("ts", "double"),
    ("name", "string"),
    ("labels", "string"),
    ("value", "double"),
]
METRIC_SCHEMA = ", ".join(f"`{name}` {kind}" for name, kind in METRIC_FIELDS)


def parse_brokers(text: str) -> list[tuple[str, int]]:
    brokers = []
    for entry in (item.strip() for item in text.split(",")):
        if not entry:
            continue
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"brokers: {entry!r} is not host:port")
        brokers.append((host.strip("[]"), int(port)))
    if not brokers:
        raise ValueError("brokers: give at least one host:port")
    return brokers


class BadSnapshot(ValueError):
    pass


def snapshot_records(payload: bytes | str) -> list[dict[str, Any]]:
    """One record per class of a snapshot; ``BadSnapshot`` names what is wrong with it."""
    try:
        snapshot = json.loads(payload)
        classes = snapshot["classes"]
        base = {
            "broker": str(snapshot["broker"]),
            "ts": float(snapshot["ts"]),
            "seq": int(snapshot["seq"]),
            "interval_s": float(snapshot.get("interval_s", 0.0)),
            "table_size": int(snapshot["table_size"]),
            "queued_messages": int(snapshot.get("queued_messages", 0)),
            "connections": int(snapshot.get("connections", 0)),
        }
        records = []
        for entry in classes:
            record = dict(base)
            record["class"] = str(entry["class"])
            for name in COUNTERS:
                record[f"{name}_delta"] = int(entry[f"{name}_delta"])
            hops = [int(value) for value in entry["hops_delta"]]
            if len(hops) != HOP_COLUMNS:
                raise BadSnapshot(f"hops_delta has {len(hops)} buckets, expected {HOP_COLUMNS}")
            for index, value in enumerate(hops):
                record[f"hops_{index}"] = value
            record["subscriber_brokers"] = int(entry["subscriber_brokers"])
            record["subscriber_brokers_before"] = int(entry["subscriber_brokers_before"])
            records.append(record)
        return records
    except BadSnapshot:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise BadSnapshot(f"not a SkipMQ class snapshot: {exc!r}") from exc


def as_row(record: dict[str, Any], fields: list[tuple[str, str]]) -> tuple[Any, ...]:
    return tuple(record.get(name) for name, _ in fields)


def metric_records(text: str, instance: str, node_id: str, ts: float) -> list[dict[str, Any]]:
    """One record per sample of a Prometheus text page (``skipmq_*`` and process metrics)."""
    records = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            records.append(
                {
                    "instance": instance,
                    "node_id": node_id,
                    "ts": ts,
                    "name": sample.name,
                    "labels": json.dumps(dict(sorted(sample.labels.items())), separators=(",", ":")),
                    "value": float(sample.value),
                }
            )
    return records


def hop_percentile(buckets: list[int], quantile: float) -> float | None:
    """The hop count at ``quantile`` of a bucketed histogram (upper bound of the bucket the rank falls
    in; hops are integers, so for bounds 1..4 this is exact); None for an empty histogram."""
    total = sum(buckets)
    if total <= 0:
        return None
    rank = quantile * total
    running = 0
    for bound, count in zip(HOP_BOUNDS, buckets, strict=True):
        running += count
        if running >= rank:
            return float(bound)
    return float(HOP_BOUNDS[-1])
