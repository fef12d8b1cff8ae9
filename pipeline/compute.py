"""The streaming computations: event-time windows with watermarks over the sources' rows (issue #13).

One stateful aggregation per source, keyed by (window, broker, class) or (window, instance, metric
series), in append mode: a window is emitted once, when the watermark passes its end, and all the
keys of a window leave the state in the same micro-batch. So each micro-batch that reaches
``foreachBatch`` holds whole windows, and the findings across brokers and classes
(``pipeline.findings``) are computed over it.
"""

from __future__ import annotations

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


def snapshot_cells(stream: DataFrame, window: str, watermark: str) -> DataFrame:
    """Per (window, broker, class): the summed deltas, hop buckets, subscriber counts, crossings."""
    events = _events(stream, watermark)  # the source drops snapshots delivered twice
    subs, before, size = F.col("subscriber_brokers"), F.col("subscriber_brokers_before"), F.col("table_size")
    aggs: list[Column] = [F.sum(f"{name}_delta").alias(name) for name in COUNTERS]
    aggs += [F.sum(f"hops_{index}").alias(f"hops_{index}") for index in range(HOP_COLUMNS)]
    aggs += [
        F.max(subs).alias("subscriber_brokers"),
        F.max(size).alias("table_size"),
        F.max("queued_messages").alias("queued_messages"),
        F.min(F.when((subs > size) & (before <= size), F.col("event_time"))).alias("crossed_up_at"),
        F.min(F.when((subs <= size) & (before > size), F.col("event_time"))).alias("crossed_down_at"),
        F.count(F.lit(1)).alias("snapshots"),
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
