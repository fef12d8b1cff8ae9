"""The figures of docs/overlay-reproduction.md, "The baselines" and "Why the reduction at ≥ 160 differs".

Reads the committed outputs under docs/figures/baselines (and the earlier sweep's
docs/figures/paper_sweep_runs.csv) and writes

* ``sgtbps_vs_model.png``: the SG-TBPS baseline's average and maximum path per subscriber count
  (the earlier sweep, which averaged over the subscribers reached; the fixed baseline over 10
  seeds, mean ± sd), the idealised model on each run's own membership vectors and over i.i.d.
  vectors (overlay/sim/sfb_model.py);
* ``scribe_spread.png``: max / avg of each Scribe set-up per subscriber count, with the paper's
  1.5-2.5 band;
* ``eexp_reductions.png``: the L=60 reduction against SG-TBPS per reading of the EEXP rules, with
  the paper's 63-77 % (<= 80) and 22-47 % (>= 160) bands.

Usage: ``python bench/baselines_figures.py [--dir docs/figures/baselines]``
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _axis(ax: Any, counts: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts)
    ax.set_xticklabels([str(c) for c in counts], rotation=45)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("number of subscribers")
    ax.grid(True, alpha=0.3)


def _by_count(rows: list[dict[str, str]], field: str) -> dict[int, list[float]]:
    grouped: dict[int, list[float]] = defaultdict(list)
    for row in rows:
        grouped[int(row["subscribers"])].append(float(row[field]))
    return dict(sorted(grouped.items()))


def sgtbps_figure(directory: Path, old_runs: Path) -> Path:
    runs = [
        r for r in read_csv(directory / "sgtbps_n10000" / "paper_sweep_runs.csv") if r["system"] == "sgtbps"
    ]
    model = read_csv(directory / "sfb_model.csv")
    old = [r for r in read_csv(old_runs) if r["system"] == "sgtbps"] if old_runs.exists() else []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, field, model_field, title in (
        (axes[0], "avg_hops", "model_avg_hops", "average path"),
        (axes[1], "max_hops", "model_max_hops", "maximum path"),
    ):
        counts = sorted({int(r["subscribers"]) for r in runs})
        iid = {int(r["subscribers"]): r for r in model}
        xs = [c for c in counts if c in iid]
        mean = [float(iid[c][field]) for c in xs]
        sd = [float(iid[c][f"{field}_sd"]) for c in xs]
        ax.fill_between(
            xs,
            [m - s for m, s in zip(mean, sd, strict=True)],
            [m + s for m, s in zip(mean, sd, strict=True)],
            color="0.85",
            label="idealised model, i.i.d. vectors (± sd of one run)",
        )
        ax.plot(xs, mean, "k-", linewidth=1)
        for values, style, label in (
            (_by_count(runs, field), "o-", "SG-TBPS, fixed (10 seeds, mean ± sd)"),
            (_by_count(runs, model_field), "s--", "idealised model on each run's vectors (10 seeds)"),
        ):
            cs = list(values)
            ys = [fmean(v) for v in values.values()]
            es = [stdev(v) if len(v) > 1 else 0.0 for v in values.values()]
            ax.errorbar(cs, ys, yerr=es, fmt=style, capsize=3, label=label)
        if old:
            values = _by_count(old, field)
            ax.plot(
                list(values),
                [fmean(v) for v in values.values()],
                "x:",
                color="tab:red",
                label="earlier sweep (3 seeds; averaged over the subscribers reached)",
            )
        _axis(ax, counts)
        ax.set_ylabel(f"{title} [hops]")
        ax.set_ylim(bottom=0)
        ax.set_title(f"SG-TBPS {title}, N = 10,000")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path = directory / "sgtbps_vs_model.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scribe_figure(directory: Path) -> Path:
    rows = read_csv(directory / "scribe_summary.csv")
    fig, ax = plt.subplots(figsize=(8, 4.8))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    counts = sorted({int(r["subscribers"]) for r in rows})
    ax.axhspan(1.5, 2.5, color="tab:green", alpha=0.12, label="paper: 1.5-2.5x")
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        ax.plot(
            [int(r["subscribers"]) for r in mine],
            [float(r["max_over_avg"]) for r in mine],
            ".-",
            label=variant,
        )
    _axis(ax, counts)
    ax.set_ylabel("Scribe: max / avg path")
    ax.set_title("Scribe set-ups, N = 10,000, 3 seeds (ratio of the seed means)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = directory / "scribe_spread.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def eexp_figure(directory: Path) -> Path:
    rows = [
        r for r in read_csv(directory / "eexp_summary.csv") if r["table_size"] == "60" and r["reduction_pct"]
    ]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    counts = sorted({int(r["subscribers"]) for r in rows})
    ax.fill_between([10, 80], 63, 77, color="tab:green", alpha=0.15, label="paper, <= 80: 63-77 %")
    ax.fill_between([160, max(counts)], 22, 47, color="tab:blue", alpha=0.15, label="paper, >= 160: 22-47 %")
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        ys = [float(r["reduction_pct"]) for r in mine]
        es = [float(r["reduction_pct_sd"] or 0) for r in mine]
        ax.errorbar([int(r["subscribers"]) for r in mine], ys, yerr=es, fmt=".-", capsize=2, label=variant)
    _axis(ax, counts)
    ax.set_ylabel("L=60 average path: reduction vs SG-TBPS [%]")
    ax.set_title("Readings of the EEXP rules, N = 2,000, 3 seeds (mean ± sd of the per-seed reduction)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = directory / "eexp_reductions.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dir", default="docs/figures/baselines")
    parser.add_argument("--old-runs", default="docs/figures/paper_sweep_runs.csv")
    args = parser.parse_args()
    directory = Path(args.dir)
    written = []
    if (directory / "sgtbps_n10000" / "paper_sweep_runs.csv").exists() and (
        directory / "sfb_model.csv"
    ).exists():
        written.append(sgtbps_figure(directory, Path(args.old_runs)))
    if (directory / "scribe_summary.csv").exists():
        written.append(scribe_figure(directory))
    if (directory / "eexp_summary.csv").exists():
        written.append(eexp_figure(directory))
    print("wrote", ", ".join(str(p) for p in written) or "nothing (no inputs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
