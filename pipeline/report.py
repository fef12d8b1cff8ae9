"""``python -m pipeline.report``: PNG charts and a Markdown summary of the pipeline's Parquet tables.

Reads the tables ``skipmq-pipeline`` wrote under ``--out`` (pandas over pyarrow: no Spark needed)
and writes ``<report dir>/report.md`` with charts beside it: publish rate of the hottest classes,
per-broker load with the imbalance, hop p50/p99 and wasted-forward ratio per class, the
subscriber-broker count of the classes that crossed L against L (all from the class snapshots of
clustered brokers), and every broker's message rates from its ``/metrics`` (``broker_metrics``,
any broker: the only section for an unclustered one, which publishes no class snapshots).

Classes nobody published in the report's windows (a wildcard subscription's class, ``*0:``) are
left out of the publish-rate chart and table; windows a broker's scrapes only partly covered (the
job started or came back within them) are left out of the message-rate chart.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def load(out: Path, table: str) -> pd.DataFrame:
    path = out / table
    if not path.exists() or not any(path.glob("date=*")):
        return pd.DataFrame()
    frame = pd.read_parquet(path)
    for column in ("window_start", "window_end", "crossed_at"):
        if column in frame:
            frame[column] = pd.to_datetime(frame[column], utc=True)
    return frame.sort_values("window_start") if "window_start" in frame else frame


def _plot_rates(classes: pd.DataFrame, path: Path, top: int) -> None:
    import matplotlib.pyplot as plt

    totals = classes.groupby("class")["publishes"].sum().sort_values(ascending=False)
    totals = totals[totals > 0]  # a class nobody publishes (a wildcard filter's) is no line at 0/s
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for cls in totals.index[:top]:
        rows = classes[classes["class"] == cls]
        ax.plot(rows["window_start"], rows["publish_rate"], marker="o", markersize=3, label=cls)
    ax.set_title(f"Publish rate of the {min(top, len(totals))} hottest classes")
    ax.set_xlabel("window start (UTC)")
    ax.set_ylabel("publishes / s")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_load(load: pd.DataFrame, imbalance: pd.DataFrame, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for broker, rows in load.groupby("broker"):
        top.plot(rows["window_start"], rows["load"], marker="o", markersize=3, label=str(broker))
    top.set_ylabel("load (publishes + deliveries) / s")
    top.set_title("Per-broker load and imbalance (max / mean)")
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    if not imbalance.empty:
        bottom.plot(
            imbalance["window_start"], imbalance["imbalance"], color="tab:red", marker="o", markersize=3
        )
    bottom.axhline(1.0, color="grey", linewidth=0.8)
    bottom.set_ylabel("max / mean")
    bottom.set_xlabel("window start (UTC)")
    bottom.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_hops(classes: pd.DataFrame, path: Path, top: int) -> None:
    import matplotlib.pyplot as plt

    forwarded = classes[classes["received"] > 0]
    summary = (
        forwarded.groupby("class")
        .agg(
            received=("received", "sum"),
            wasted=("wasted", "sum"),
            p50=("hop_p50", "median"),
            p99=("hop_p99", "max"),
        )
        .sort_values("received", ascending=False)
        .head(top)
    )
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    positions = range(len(summary))
    left.bar([p - 0.2 for p in positions], summary["p50"], width=0.4, label="p50")
    left.bar([p + 0.2 for p in positions], summary["p99"], width=0.4, label="p99")
    left.set_xticks(list(positions), summary.index, rotation=30, ha="right", fontsize=8)
    left.set_ylabel("overlay hops")
    left.set_title("Hop count per class")
    left.legend()
    ratio = summary["wasted"] / summary["received"]
    right.bar(list(positions), ratio, color="tab:orange")
    right.set_xticks(list(positions), summary.index, rotation=30, ha="right", fontsize=8)
    right.set_ylim(0, max(1.0, float(ratio.max()) if len(ratio) else 1.0))
    right.set_title("Wasted-forward ratio per class")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_crossings(classes: pd.DataFrame, crossings: pd.DataFrame, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(dict.fromkeys(crossings["class"])) if not crossings.empty else []
    for cls in names[:6]:
        rows = classes[classes["class"] == cls]
        ax.step(rows["window_start"], rows["subscriber_brokers"], where="post", label=cls)
        for at in crossings[crossings["class"] == cls]["crossed_at"]:
            ax.axvline(at, color="grey", linestyle=":", linewidth=0.8)
    if not classes.empty:
        ax.plot(classes["window_start"], classes["table_size"], color="black", linestyle="--", label="L")
    ax.set_title("Subscriber brokers of the classes that crossed L (dotted: when)")
    ax.set_ylabel("subscriber brokers")
    ax.set_xlabel("window start (UTC)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


MESSAGE_SERIES = {"received": "skipmq_messages_received_total", "sent": "skipmq_messages_sent_total"}
PARTIAL_SAMPLES = 0.8  # a window with fewer samples than this share of the instance's median


def message_rates(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per (window, instance): messages received and sent per second (summed over QoS), from
    ``broker_metrics``; windows the scrapes only partly covered (fewer samples than
    PARTIAL_SAMPLES x the instance's median: the job started or came back within them) dropped."""
    columns = ["window_start", "instance", "received", "sent"]
    if metrics.empty:
        return pd.DataFrame(columns=columns)
    rows = metrics[metrics["name"].isin(MESSAGE_SERIES.values())]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    median = rows.groupby("instance")["samples"].transform("median")
    rows = rows[rows["samples"] >= PARTIAL_SAMPLES * median]
    table = rows.pivot_table(index=["window_start", "instance"], columns="name", values="rate", aggfunc="sum")
    table = table.rename(columns={series: name for name, series in MESSAGE_SERIES.items()}).reset_index()
    for name in ("received", "sent"):
        if name not in table:
            table[name] = 0.0
    return table[columns].sort_values(["window_start", "instance"], ignore_index=True)


def _plot_messages(rates: pd.DataFrame, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for instance, rows in rates.groupby("instance"):
        ax.plot(rows["window_start"], rows["received"], marker="o", markersize=3, label=f"{instance} in")
        label = f"{instance} out"
        ax.plot(rows["window_start"], rows["sent"], marker="x", markersize=3, linestyle="--", label=label)
    ax.set_title("Messages per second, per broker (from /metrics)")
    ax.set_xlabel("window start (UTC)")
    ax.set_ylabel("messages / s")
    if not rates.empty:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(frame: pd.DataFrame, columns: list[str], limit: int = 10) -> str:
    if frame.empty:
        return "(none)\n"
    rows = frame[columns].head(limit)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for _, row in rows.iterrows():
        cells = [f"{value:.2f}" if isinstance(value, float) else str(value) for value in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def build_report(out: Path, report_dir: Path, top: int = 5) -> Path:
    """Write the charts and report.md; returns the Markdown file."""
    import matplotlib

    matplotlib.use("Agg")
    report_dir.mkdir(parents=True, exist_ok=True)
    classes = load(out, "class_windows")
    metrics = load(out, "broker_metrics")
    if classes.empty and metrics.empty:
        raise SystemExit(
            f"pipeline.report: no window written under {out} yet: a window is written once the "
            "watermark passes its end (skipmq-pipeline --window, default 1 minute, + --watermark, "
            "default 30 s); run the job longer"
        )
    rates = message_rates(metrics)
    _plot_messages(rates, report_dir / "message_rates.png")
    brokers_section = [
        "## Brokers (from /metrics)",
        "",
        f"Brokers scraped: {rates['instance'].nunique() if not rates.empty else 0}. Messages received"
        " and sent per second per window (windows the scrapes only partly covered left out).",
        "",
        "![message rates](message_rates.png)",
        "",
    ]
    if classes.empty:
        text = [
            "# SkipMQ pipeline report",
            "",
            "No per-class snapshots: the brokers read are not clustered, or publish none"
            " (`cluster.class_snapshot_interval_s`); class, load, hop and L tables need a cluster"
            " (docs/pipeline.md). Broker-wide figures from /metrics follow.",
            "",
            *brokers_section,
        ]
        path = report_dir / "report.md"
        path.write_text("\n".join(text))
        return path
    load_table = load(out, "broker_load")
    imbalance = load(out, "imbalance")
    crossings = load(out, "l_crossings")
    outliers = load(out, "outliers")
    slow = load(out, "latency_outliers")  # from /metrics: absent when the job read no --http
    full = classes[~classes["partial"]] if "partial" in classes else classes  # no dip for a partial window
    _plot_rates(full, report_dir / "publish_rates.png", top)
    if "partial" in imbalance:
        imbalance = imbalance[~imbalance["partial"]]
    _plot_load(load_table, imbalance, report_dir / "broker_load.png")
    _plot_hops(classes, report_dir / "hops_wasted.png", top)
    _plot_crossings(classes, crossings, report_dir / "l_crossings.png")
    totals = (
        classes.groupby("class")
        .agg(
            publishes=("publishes", "sum"),
            peak_rate=("publish_rate", "max"),
            deliveries=("deliveries", "sum"),
        )
        .sort_values("publishes", ascending=False)
        .reset_index()
    )
    totals = totals[totals["publishes"] > 0]  # classes nobody published (wildcard subscriptions)
    first, last = classes["window_start"].min(), classes["window_end"].max()
    brokers = load_table["broker"].nunique() if not load_table.empty else 0
    text = [
        "# SkipMQ pipeline report",
        "",
        f"Windows from {first} to {last} ({classes['window_start'].nunique()} windows,"
        f" {classes['class'].nunique()} classes, {brokers} brokers).",
        "",
        "## Hottest classes",
        "",
        _table(totals, ["class", "publishes", "peak_rate", "deliveries"], top),
        "![publish rates](publish_rates.png)",
        "",
        "## Load and imbalance",
        "",
        f"Largest imbalance (max / mean load): {imbalance['imbalance'].max():.2f}"
        if not imbalance.empty
        else "",
        "",
        _table(
            imbalance.sort_values("imbalance", ascending=False),
            ["window_start", "imbalance", "busiest_broker"],
            5,
        )
        if not imbalance.empty
        else "(none)\n",
        "![broker load](broker_load.png)",
        "",
        "## Outlier brokers",
        "",
        _table(outliers, ["window_start", "broker", "metric", "value", "median"]),
        "Latency (from /metrics, mean over the window, seconds):",
        "",
        _table(slow, ["window_start", "broker", "metric", "value", "median"]),
        "## Routes: hops and wasted forwards",
        "",
        "![hops and wasted forwards](hops_wasted.png)",
        "",
        "## Classes that crossed L (one hop <-> multi-hop)",
        "",
        _table(crossings, ["class", "direction", "crossed_at", "subscriber_brokers", "table_size"]),
        "![crossings of L](l_crossings.png)",
        "",
        *brokers_section,
    ]
    path = report_dir / "report.md"
    path.write_text("\n".join(text))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.report",
        description="Charts (PNG) and a Markdown summary of the Parquet tables skipmq-pipeline wrote.",
    )
    parser.add_argument(
        "--out", default="pipeline-out", help="the pipeline's output directory (default pipeline-out)"
    )
    parser.add_argument(
        "--report-dir", default=None, help="where to write report.md and the PNGs (default <out>/report)"
    )
    parser.add_argument("--top", type=int, default=5, help="classes shown in the charts (default 5)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    path = build_report(out, Path(args.report_dir) if args.report_dir else out / "report", args.top)
    print(f"pipeline.report: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
