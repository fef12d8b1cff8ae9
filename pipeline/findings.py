"""The findings of whole windows: what ``pipeline.compute``'s windowed aggregation emits, turned into
the output tables (pure pandas, no Spark, no I/O).

Spark does the streaming part - event-time windows, watermarks, state, checkpoints - and emits
per micro-batch whole windows as (window, broker, class) cells: a few rows per broker and class.
The cross-broker findings of those windows are computed here on the driver, in one Spark action per
micro-batch (each further Spark job costs about a second on a busy 2-core machine):

- ``class_windows``: per (window, class) over all brokers - publishes, deliveries, forwards,
  received, wasted, their rates, wasted ratio, hop p50/p99 from the summed hop histograms, the
  largest subscriber-broker count and L, and when the count crossed L;
- ``hot_classes``: the top k classes of each window by publishes;
- ``broker_load``: per (window, broker) - publishes, deliveries, load = (publishes + deliveries)/s,
  queue depth;
- ``imbalance``: per window - max, mean and max/mean of the brokers' load, the busiest broker;
- ``l_crossings``: classes whose subscriber-broker count crossed L (one hop <-> multi-hop), when;
- ``outliers``: brokers whose load or queue depth is above OUTLIER_FACTOR x the window's median
  (and above a floor, so an idle cluster reports none);
- ``latency_outliers`` (from /metrics): brokers whose mean latency over the window - publish
  confirmations (``skipmq_cluster_publish_confirm_seconds``: from a publish until every subscriber
  broker stored it) or store commits (``skipmq_store_commit_seconds``) - is above OUTLIER_FACTOR x
  the median of the window's brokers (and above OUTLIER_MIN_LATENCY_S);
- ``broker_metrics`` (from /metrics): per (window, broker, series) first/last/min/max/mean, and
  for counters the rate over the window (a counter that went down - a restarted broker - counts
  from 0 again).
"""

from __future__ import annotations

import json

import pandas as pd

from pipeline.records import COUNTERS, HOP_BOUNDS, HOP_COLUMNS

OUTLIER_FACTOR = 2.0
OUTLIER_MIN_LOAD = 5.0  # messages/s
OUTLIER_MIN_QUEUE = 100.0  # queued messages
OUTLIER_MIN_LATENCY_S = 0.005  # a mean latency under this is never an outlier
LATENCY_FAMILIES = {  # outlier metric -> histogram family on /metrics (its _sum and _count are kept)
    "publish_confirm_s": "skipmq_cluster_publish_confirm_seconds",
    "store_commit_s": "skipmq_store_commit_seconds",
}
HOPS = [f"hops_{index}" for index in range(HOP_COLUMNS)]
WINDOW_KEYS = ["date", "window", "window_start", "window_end", "window_s"]


def with_window_columns(cells: pd.DataFrame) -> pd.DataFrame:
    """window_start/window_end (UTC), window_s and the partition columns date and window."""
    cells = cells.copy()
    cells["window_start"] = pd.to_datetime(cells["window_start"], utc=True)
    cells["window_end"] = pd.to_datetime(cells["window_end"], utc=True)
    cells["window_s"] = (cells["window_end"] - cells["window_start"]).dt.total_seconds()
    cells["date"] = cells["window_start"].dt.strftime("%Y-%m-%d")
    cells["window"] = cells["window_start"].dt.strftime("%Y%m%dT%H%M%S")
    return cells


def hop_percentile(row: pd.Series, quantile: float) -> float | None:
    total = float(sum(row[column] for column in HOPS))
    if total <= 0:
        return None
    running = 0.0
    for column, bound in zip(HOPS, HOP_BOUNDS, strict=True):
        running += float(row[column])
        if running >= quantile * total:
            return float(bound)
    return float(HOP_BOUNDS[-1])


def class_windows(cells: pd.DataFrame) -> pd.DataFrame:
    sums = {name: "sum" for name in (*COUNTERS, *HOPS)}
    grouped = (
        cells.groupby([*WINDOW_KEYS, "class"], as_index=False)
        .agg(
            **{name: (name, how) for name, how in sums.items()},
            subscriber_brokers=("subscriber_brokers", "max"),
            table_size=("table_size", "max"),
            crossed_up_at=("crossed_up_at", "min"),
            crossed_down_at=("crossed_down_at", "min"),
            brokers_reporting=("broker", "nunique"),
        )
        .sort_values(["window_start", "class"], ignore_index=True)
    )
    grouped["publish_rate"] = grouped["publishes"] / grouped["window_s"]
    grouped["delivery_rate"] = grouped["deliveries"] / grouped["window_s"]
    received = grouped["received"].where(grouped["received"] > 0)
    grouped["wasted_ratio"] = grouped["wasted"] / received
    for name, quantile in (("hop_p50", 0.5), ("hop_p99", 0.99)):
        values = [hop_percentile(row, quantile) for _, row in grouped.iterrows()]
        grouped[name] = pd.Series(values, index=grouped.index, dtype="float64")  # NaN: nothing received
    grouped["wasted_ratio"] = grouped["wasted_ratio"].astype("float64")
    for name in ("crossed_up_at", "crossed_down_at"):
        grouped[name] = pd.to_datetime(grouped[name], utc=True)
    grouped["over_table_size"] = grouped["subscriber_brokers"] > grouped["table_size"]
    return grouped


def hot_classes(classes: pd.DataFrame, top_k: int) -> pd.DataFrame:
    active = classes[classes["publishes"] > 0].sort_values(
        ["window_start", "publishes", "deliveries", "class"], ascending=[True, False, False, True]
    )
    active = active.assign(rank=active.groupby("window_start").cumcount() + 1)
    columns = [*WINDOW_KEYS, "rank", "class", "publishes", "publish_rate", "deliveries", "delivery_rate"]
    return active[active["rank"] <= top_k][columns].reset_index(drop=True)


def l_crossings(classes: pd.DataFrame) -> pd.DataFrame:
    parts = []
    for column, direction in (("crossed_up_at", "multi_hop"), ("crossed_down_at", "one_hop")):
        rows = classes[classes[column].notna()]
        parts.append(
            rows.assign(direction=direction, crossed_at=rows[column])[
                [*WINDOW_KEYS, "class", "direction", "crossed_at", "subscriber_brokers", "table_size"]
            ]
        )
    return pd.concat(parts, ignore_index=True)


def observed_s(load: pd.DataFrame, starts: dict[str, list[float]] | None) -> pd.Series:
    """Seconds of each (window, broker) the snapshots cover: the whole window, unless the
    broker's snapshots start within it (the job first heard of the broker, or the broker started:
    ``starts``, Unix seconds per broker) - then from that start to the window's end."""
    covered = load["window_s"].astype("float64").copy()
    if not starts:
        return covered
    for index, row in load.iterrows():
        begin, end = row["window_start"].timestamp(), row["window_end"].timestamp()
        inside = [at for at in starts.get(str(row["broker"]), ()) if begin < at < end]
        if inside:
            covered.at[index] = max(end - max(inside), 0.001)
    return covered


def broker_load(cells: pd.DataFrame, starts: dict[str, list[float]] | None = None) -> pd.DataFrame:
    """Per (window, broker); ``partial``: the snapshots cover only part of the window (see
    ``observed_s``), whose load is then the rate over the covered part - not a dip."""
    load = cells.groupby([*WINDOW_KEYS, "broker"], as_index=False).agg(
        publishes=("publishes", "sum"),
        deliveries=("deliveries", "sum"),
        forwards=("forwards", "sum"),
        wasted=("wasted", "sum"),
        queued_messages=("queued_messages", "max"),
    )
    load["observed_s"] = observed_s(load, starts)
    load["partial"] = load["observed_s"] < load["window_s"] - 0.001
    load["load"] = (load["publishes"] + load["deliveries"]) / load["observed_s"]
    return load.sort_values(["window_start", "broker"], ignore_index=True)


def imbalance(load: pd.DataFrame) -> pd.DataFrame:
    rows = []
    if "partial" not in load:
        load = load.assign(partial=False)
    for keys, group in load.groupby(WINDOW_KEYS):
        mean = float(group["load"].mean())
        busiest = group.sort_values(["load", "broker"], ascending=[False, True]).iloc[0]
        rows.append(
            {
                **dict(zip(WINDOW_KEYS, keys, strict=True)),
                "brokers": len(group),
                "max_load": float(busiest["load"]),
                "mean_load": mean,
                "imbalance": float(busiest["load"]) / mean if mean > 0 else None,
                "busiest_broker": busiest["broker"],
                "partial": bool(group["partial"].any()),
            }
        )
    columns = [*WINDOW_KEYS, "brokers", "max_load", "mean_load", "imbalance", "busiest_broker", "partial"]
    frame = pd.DataFrame(rows, columns=columns)
    frame["imbalance"] = frame["imbalance"].astype("float64")  # NaN: an idle window
    return frame


def outliers(load: pd.DataFrame) -> pd.DataFrame:
    """Brokers above OUTLIER_FACTOR x the window's median, among the brokers whose window the
    snapshots fully cover (a partly observed window names no outlier)."""
    rows = []
    if "partial" in load:
        load = load[~load["partial"]]
    for keys, group in load.groupby(WINDOW_KEYS):
        for metric, floor in (("load", OUTLIER_MIN_LOAD), ("queued_messages", OUTLIER_MIN_QUEUE)):
            median = float(group[metric].median())
            for _, row in group.iterrows():
                value = float(row[metric])
                if value >= floor and value > OUTLIER_FACTOR * median:
                    rows.append(
                        {
                            **dict(zip(WINDOW_KEYS, keys, strict=True)),
                            "broker": row["broker"],
                            "metric": metric,
                            "value": value,
                            "median": median,
                        }
                    )
    return pd.DataFrame(rows, columns=[*WINDOW_KEYS, "broker", "metric", "value", "median"])


def _mean_in_window(group: pd.DataFrame, family: str) -> float | None:
    """Mean of a histogram's observations within one window of one broker: the sum's increase
    over the count's (None without observations, or when a restart reset the histogram)."""
    sums = group[group["name"] == family + "_sum"]
    counts = group[group["name"] == family + "_count"]
    if sums.empty or counts.empty:
        return None
    added = float(sums["last"].sum() - sums["first"].sum())
    observed = float(counts["last"].sum() - counts["first"].sum())
    if observed <= 0 or added < 0:
        return None
    return added / observed


BROKER_INFO = "skipmq_pipeline_broker_info"  # pipeline.sources.http_metrics: label broker = cluster address


def broker_names(metrics: pd.DataFrame) -> dict[str, str]:
    """Scraped instance (HTTP host:port) -> the broker's cluster address, the name the snapshot
    tables use (from the scraper's ``skipmq_pipeline_broker_info``); unclustered brokers have none."""
    names: dict[str, str] = {}
    for _, row in metrics[metrics["name"] == BROKER_INFO].iterrows():
        try:
            broker = json.loads(row["labels"]).get("broker")
        except (TypeError, ValueError):
            continue
        if broker:
            names[str(row["instance"])] = str(broker)
    return names


def latency_outliers(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per window: brokers whose mean latency is above OUTLIER_FACTOR x the brokers' median.
    ``broker`` is the cluster address (as in ``outliers``) when known, else the instance."""
    columns = [*WINDOW_KEYS, "broker", "instance", "metric", "value", "median"]
    names = broker_names(metrics)
    rows = []
    for keys, window in metrics.groupby(WINDOW_KEYS):
        for metric, family in LATENCY_FAMILIES.items():
            means = {}
            for instance, group in window.groupby("instance"):
                mean = _mean_in_window(group, family)
                if mean is not None:
                    means[str(instance)] = mean
            if len(means) < 2:
                continue
            median = float(pd.Series(list(means.values())).median())
            for broker, value in sorted(means.items()):
                if value >= OUTLIER_MIN_LATENCY_S and value > OUTLIER_FACTOR * median:
                    rows.append(
                        {
                            **dict(zip(WINDOW_KEYS, keys, strict=True)),
                            "broker": names.get(broker, broker),
                            "instance": broker,
                            "metric": metric,
                            "value": value,
                            "median": median,
                        }
                    )
    return pd.DataFrame(rows, columns=columns)


def snapshot_tables(
    cells: pd.DataFrame, top_k: int, starts: dict[str, list[float]] | None = None
) -> dict[str, pd.DataFrame]:
    """Every output table of whole windows of (window, broker, class) cells; ``starts``: per
    broker, when its snapshots start covering time (``observed_s``)."""
    cells = with_window_columns(cells)
    classes = class_windows(cells)
    load = broker_load(cells, starts)
    partial = load[load["partial"]][["window_start", "broker"]]
    partly = cells.merge(partial, on=["window_start", "broker"])[["window_start", "class"]].drop_duplicates()
    classes["partial"] = classes.set_index(["window_start", "class"]).index.isin(
        partly.set_index(["window_start", "class"]).index
    )
    return {
        "class_windows": classes,
        "hot_classes": hot_classes(classes, top_k),
        "broker_load": load,
        "imbalance": imbalance(load),
        "l_crossings": l_crossings(classes),
        "outliers": outliers(load),
    }


def broker_metrics(cells: pd.DataFrame) -> pd.DataFrame:
    cells = with_window_columns(cells)
    is_counter = cells["name"].str.endswith("_total")
    increase = cells["last"].where(cells["last"] >= cells["first"], cells["last"]) - cells["first"].where(
        cells["last"] >= cells["first"], 0.0
    )
    cells["rate"] = (increase / cells["window_s"]).where(is_counter)
    columns = [*WINDOW_KEYS, "instance", "node_id", "name", "labels", "first", "last", "min", "max", "mean"]
    return cells[[*columns, "rate", "samples"]]
