"""The streaming computations: event-time windows with watermarks over the sources' rows (issue #13).

One stateful aggregation per source, keyed by (window, broker, class) or (window, instance, metric
series), in append mode: a window is emitted once, when the watermark passes its end, and all the
keys of a window leave the state in the same micro-batch. So each micro-batch that reaches
``foreachBatch`` holds whole windows, and the findings across brokers and classes
(``pipeline.findings``) are computed over it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pyspark.sql import Column
from pyspark.sql import functions as F

from pipeline.records import COUNTERS, HOP_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def _events(stream: DataFrame, watermark: str) -> DataFrame:
    return stream.withColumn("event_time", F.timestamp_seconds(F.col("ts"))).withWatermark(
        "event_time", watermark
    )


def parse_duration_s(text: str) -> float:
    """Seconds of a Spark interval string such as "5 seconds", "1 minute", "2 hours" or "30s"."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if match is None:
        raise ValueError(f"not a duration: {text!r} (e.g. '30 seconds', '1 minute')")
    number, unit = float(match.group(1)), match.group(2)
    for names, scale in (
        (("", "s", "sec", "secs", "second", "seconds"), 1.0),
        (("m", "min", "mins", "minute", "minutes"), 60.0),
        (("h", "hour", "hours"), 3600.0),
        (("d", "day", "days"), 86400.0),
    ):
        if unit in names:
            return number * scale
    raise ValueError(f"not a duration: {text!r} (unit {unit!r})")


def spread_over_windows(stream: DataFrame, window_s: float) -> DataFrame:
    """A snapshot's deltas cover (ts - interval_s, ts]; when that interval straddles a window
    boundary (the windows are aligned to the epoch, as Spark's), the row becomes two, each with the
    ``weight`` of its share of the interval, at ``at`` (ts, or just before the boundary). So a
    window's sums are what happened in it, not a whole snapshot interval too many or too few when
    the brokers' snapshot timers drift across a boundary (assumes interval_s <= the window)."""
    ts, interval = F.col("ts"), F.col("interval_s")
    boundary = F.floor(ts / F.lit(window_s)) * F.lit(window_s)
    straddles = (interval > 0) & (ts - interval < boundary)
    current = F.when(straddles, (ts - boundary) / interval).otherwise(F.lit(1.0))
    parts = F.when(
        straddles,
        F.array(
            F.struct(ts.alias("at"), current.alias("weight"), F.lit(True).alias("own")),
            F.struct(
                (boundary - F.lit(0.001)).alias("at"),
                (F.lit(1.0) - current).alias("weight"),
                F.lit(False).alias("own"),
            ),
        ),
    ).otherwise(F.array(F.struct(ts.alias("at"), F.lit(1.0).alias("weight"), F.lit(True).alias("own"))))
    return (
        stream.withColumn("part", F.explode(parts))
        .withColumn("event_time", F.timestamp_seconds(F.col("part.at")))
        .withColumn("weight", F.col("part.weight"))
        .withColumn("own", F.col("part.own"))
        .drop("part")
    )


def snapshot_cells(stream: DataFrame, window: str, watermark: str) -> DataFrame:
    """Per (window, broker, class): the summed deltas (spread over the windows their interval
    covers), hop buckets, subscriber counts, crossings of L."""
    events = spread_over_windows(stream, parse_duration_s(window)).withWatermark("event_time", watermark)
    subs, before, size = F.col("subscriber_brokers"), F.col("subscriber_brokers_before"), F.col("table_size")
    own_time = F.when(F.col("own"), F.col("event_time"))
    weight = F.col("weight")
    aggs: list[Column] = [F.sum(F.col(f"{name}_delta") * weight).alias(name) for name in COUNTERS]
    aggs += [F.sum(F.col(f"hops_{index}") * weight).alias(f"hops_{index}") for index in range(HOP_COLUMNS)]
    aggs += [
        F.max(subs).alias("subscriber_brokers"),
        F.max(size).alias("table_size"),
        F.max("queued_messages").alias("queued_messages"),
        F.min(F.when((subs > size) & (before <= size), own_time)).alias("crossed_up_at"),
        F.min(F.when((subs <= size) & (before > size), own_time)).alias("crossed_down_at"),
        F.count(own_time).alias("snapshots"),
    ]
    cells = events.groupBy(F.window("event_time", window), "broker", "class").agg(*aggs)
    return _flat_window(cells)


def metric_cells(stream: DataFrame, window: str, watermark: str) -> DataFrame:
    """Per (window, instance, metric series): first, last, min, max and mean of the samples."""
    events = _events(stream, watermark)
    cells = events.groupBy(F.window("event_time", window), "instance", "name", "labels").agg(
        F.max_by("value", "event_time").alias("last"),
        F.min_by("value", "event_time").alias("first"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
        F.avg("value").alias("mean"),
        F.max("node_id").alias("node_id"),
        F.count(F.lit(1)).alias("samples"),
    )
    return _flat_window(cells)


def _flat_window(cells: DataFrame) -> DataFrame:
    return (
        cells.withColumn("window_start", F.col("window.start"))
        .withColumn("window_end", F.col("window.end"))
        .drop("window")
    )
