"""Issue #18's variant tables: Scribe set-ups and EEXP rule readings, each over several seeds.

Runs ``overlay.sim.experiment.run_series`` through ``paper_sweep.run_sweep`` (one worker process
per run, so time and peak RSS are per run) for every named variant and writes

* ``<out>/raw/<family>_<variant>_<system>_L<L>_seed<S>.json``: each run's samples (a run already
  there is not run again, so an interrupted table resumes);
* ``<out>/<family>_runs.csv``: one row per (variant, system, L, seed, subscriber count);
* ``<out>/<family>_summary.md`` and ``<out>/<family>_summary.csv``: the table the docs cite.

Families::

    python bench/baseline_variants.py scribe --nodes 10000 --seeds 3 --out docs/figures/baselines
    python bench/baseline_variants.py eexp --nodes 2000 --seeds 3 --out docs/figures/baselines

``scribe``: max/avg per set-up (Scribe at every subscriber count). ``eexp``: for each reading of
the seed's EEXP rules, the proposed system at L=120 (subscribers 10..160: where strict single hop
ends) and at L=60 (10..1280 at N=2,000), and the SG-TBPS baseline once (it sends no EEXP); the
reduction of the L=60 average against SG-TBPS, per seed (paired) and as mean ± sd, at <= 80 and
>= 160 subscribers. ``--only a,b`` runs some variants. docs/overlay-reproduction.md, "Issue #18,
2026-11-27: the baselines".
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import paper_sweep

from overlay.sim.experiment import ExperimentConfig, PathSample

Options = tuple[tuple[str, Any], ...]
FAILURES: dict[str, list[str]] = {}  # variant -> failed runs (their SimulationError, with the seed)

SCRIBE_VARIANTS: dict[str, tuple[str, Options]] = {
    "default": ("the baseline so far: join state = every contact, leaf set 8+8, route to the root", ()),
    "leaf4": ("leaf set 4+4 (Overlay Weaver's default)", (("leaf_half", 4),)),
    "rows": ("Pastry's row-wise join state", (("join_state", "rows"),)),
    "rows_static": (
        "row-wise join, no table learning from later traffic",
        (("join_state", "rows"), ("learn_from_traffic", False)),
    ),
    "rows_silent": (
        "row-wise join only: no announcement, no learning from traffic",
        (("join_state", "rows"), ("learn_from_traffic", False), ("announce", False)),
    ),
    "seen": (
        "tables of the nodes seen in messages: the join route's nodes, leaf sets, subscribers",
        (("join_state", "self"), ("announce", False)),
    ),
    "cache_root": ("the publisher caches the root (1 hop to it)", (("cache_root", True),)),
    "tree": (
        "Overlay Weaver Mcast: publisher on the tree, flooding along tree edges",
        (("publish_mode", "tree"),),
    ),
    "tree_ow": (
        "tree flooding + row-wise join + leaf set 4+4 (Overlay Weaver's set-up)",
        (("publish_mode", "tree"), ("join_state", "rows"), ("leaf_half", 4)),
    ),
    "tree_static": (
        "tree flooding + row-wise join, no later table learning, leaf set 4+4",
        (("publish_mode", "tree"), ("join_state", "rows"), ("learn_from_traffic", False), ("leaf_half", 4)),
    ),
    "tree_seen": (
        "tree flooding + tables of nodes seen in messages, leaf set 4+4",
        (("publish_mode", "tree"), ("join_state", "self"), ("announce", False), ("leaf_half", 4)),
    ),
    "cap10": (
        "Scribe's bottleneck remover, at most 10 children per node (no proximity)",
        (("max_children", 10),),
    ),
    "tree_cap10": (
        "tree flooding + at most 10 children per node",
        (("publish_mode", "tree"), ("max_children", 10)),
    ),
}

EEXP_VARIANTS: dict[str, tuple[str, Options]] = {
    "ours": ("SkipMQ's defaults: sub_deficit, supplied, whole, publish EEXP <= 1 per 10 s", ()),
    "seed": (
        "the seed's wording: below_l, every, whole, EEXP with every publish",
        (
            ("eexp_trigger", "below_l"),
            ("eexp_decrement", "every"),
            ("eexp_split", "whole"),
            ("eexp_publish_min_interval_s", 0.0),
        ),
    ),
    "below_l": ("ours but the seed's trigger (EEXP only while |E| < L)", (("eexp_trigger", "below_l"),)),
    "every": ("ours but the seed's decrement (every receiver spends one)", (("eexp_decrement", "every"),)),
    "seed_sub_deficit": (
        "the seed's wording but sub_deficit (every, whole, every publish)",
        (("eexp_decrement", "every"), ("eexp_publish_min_interval_s", 0.0)),
    ),
    "even": (
        "ours but the count divided among delegates (the default before 2026-11-25)",
        (("eexp_split", "even"),),
    ),
    "seed_even": (
        "the seed's trigger and decrement, count divided, every publish",
        (
            ("eexp_trigger", "below_l"),
            ("eexp_decrement", "every"),
            ("eexp_split", "even"),
            ("eexp_publish_min_interval_s", 0.0),
        ),
    ),
}


def _raw_path(out: Path, family: str, variant: str, system: str, size: int | None, seed: int) -> Path:
    return out / "raw" / f"{family}_{variant}_{system}_L{size or 0}_seed{seed}.json"


def run_variant(
    out: Path,
    family: str,
    variant: str,
    system: str,
    size: int | None,
    seeds: Sequence[int],
    cfg: ExperimentConfig,
) -> list[dict[str, Any]]:
    """Run (or load) every seed of one (variant, system, L); return the sample rows."""
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        path = _raw_path(out, family, variant, system, size, seed)
        if not path.exists():
            record: dict[str, Any]
            try:
                samples, info = paper_sweep.run_sweep([(system, size, seed)], cfg, 1)
            except SystemExit as exc:  # the run failed (with its seed): recorded, the table goes on
                record = {"family": family, "variant": variant, "error": str(exc).strip(), "samples": []}
                print(f"{family} {variant} {system} L={size} seed {seed}: {record['error']}", file=sys.stderr)
            else:
                timing = info["timings"][0]
                record = {
                    "family": family,
                    "variant": variant,
                    "nodes": cfg.nodes,
                    "overlay_options": [list(item) for item in cfg.overlay_options],
                    "sgtbps_overlay_options": [list(item) for item in cfg.sgtbps_overlay_options],
                    "scribe_options": [list(item) for item in cfg.scribe_options],
                    "core_digest": paper_sweep.core_digest(),
                    "wall_s": timing["wall_s"],
                    "peak_rss_mib": timing["worker_peak_rss_mib"],
                    "samples": [asdict(sample) for sample in samples],
                }
                print(
                    f"{family} {variant} {system} L={size} seed {seed}: {timing['wall_s']:.0f} s, "
                    f"{timing['worker_peak_rss_mib']:.0f} MiB",
                    file=sys.stderr,
                )
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record))
        record = json.loads(path.read_text())
        if "error" in record:
            FAILURES.setdefault(variant, []).append(f"seed {seed}: {record['error']}")
            continue
        for item in record["samples"]:
            sample = PathSample(**{**item, "messages_by_kind": tuple(map(tuple, item["messages_by_kind"]))})
            rows.append(
                {
                    "variant": variant,
                    "wall_s": record["wall_s"],
                    "rss": record["peak_rss_mib"],
                    **asdict(sample),
                }
            )
    return rows


RUN_FIELDS = (
    "variant",
    "system",
    "table_size",
    "seed",
    "subscribers",
    "avg_hops",
    "max_hops",
    "delivered",
    "route_hops",
    "level0_wrong",
    "model_avg_hops",
    "model_max_hops",
    "wall_s",
    "rss",
)


def write_runs(out: Path, family: str, rows: list[dict[str, Any]]) -> None:
    with open(out / f"{family}_runs.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(RUN_FIELDS)
        for row in rows:
            writer.writerow([f"{row[f]:.4f}" if isinstance(row[f], float) else row[f] for f in RUN_FIELDS])


def _mean_sd(values: Sequence[float]) -> str:
    if len(values) > 1:
        return f"{fmean(values):.2f}±{stdev(values):.2f}"
    return f"{fmean(values):.2f}"


def scribe_summary(out: Path, rows: list[dict[str, Any]], variants: Sequence[str]) -> str:
    lines = [
        "| set-up | avg hops (10 / 80 / 640 / 5120) | max/avg per count, min-max over counts (mean of seeds) "
        "| tree depth only: max/avg | route to root (avg) |",
        "|---|---|---|---|---|",
    ]
    table: list[list[Any]] = []
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        failed = "; ".join(FAILURES.get(variant, []))
        if not mine:
            lines.append(f"| {variant}: {SCRIBE_VARIANTS[variant][0]} | failed: {failed} | | | |")
            continue
        counts = sorted({r["subscribers"] for r in mine})
        ratios, depth_ratios, averages = [], [], {}
        for count in counts:
            at = [r for r in mine if r["subscribers"] == count]
            avg = fmean(r["avg_hops"] for r in at)
            top = fmean(r["max_hops"] for r in at)
            route = fmean(r["route_hops"] for r in at)
            averages[count] = avg
            ratios.append(top / avg)
            if avg > route:
                depth_ratios.append((top - route) / (avg - route))
            table.append(
                [variant, count, len(at), f"{avg:.3f}", f"{top:.3f}", f"{top / avg:.3f}", f"{route:.2f}"]
            )
        shown = " / ".join(f"{averages[c]:.2f}" for c in (10, 80, 640, 5120) if c in averages)
        depth = f"{min(depth_ratios):.2f}-{max(depth_ratios):.2f}" if depth_ratios else "-"
        route_text = f"{fmean(r['route_hops'] for r in mine):.2f}"
        seeds = len({r["seed"] for r in mine})
        note = f" ({seeds} seeds; failed: {failed})" if failed else ""
        lines.append(
            f"| {variant}: {SCRIBE_VARIANTS[variant][0]}{note} | {shown} "
            f"| {min(ratios):.2f}-{max(ratios):.2f} | {depth} | {route_text} |"
        )
    with open(out / "scribe_summary.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["variant", "subscribers", "seeds", "avg_hops", "max_hops", "max_over_avg", "route_hops"]
        )
        writer.writerows(table)
    return "\n".join(lines) + "\n"


def _reductions(
    l60: list[dict[str, Any]], baseline: dict[tuple[int, int], dict[str, Any]], count: int, model: bool
) -> list[float]:
    """Per seed: 100 (1 - proposed L=60 avg / SG-TBPS avg) at ``count`` (``model``: against the
    idealised SG-TBPS on that baseline run's own vectors)."""
    values = []
    for r in l60:
        base = baseline.get((r["seed"], count))
        if r["subscribers"] != count or base is None:
            continue
        denominator = base["model_avg_hops"] if model else base["avg_hops"]
        values.append(100 * (1 - r["avg_hops"] / denominator))
    return values


def eexp_summary(out: Path, rows: list[dict[str, Any]], variants: Sequence[str]) -> str:
    baseline = {(r["seed"], r["subscribers"]): r for r in rows if r["system"] == "sgtbps"}
    lines = [
        "| reading | L=120: strict single hop (avg = max = 1) up to, per seed | L=120 avg at 80 / 160 "
        "| L=60 avg at 10 / 80 / 160 / 1280 | L=60 reduction vs SG-TBPS at <= 80 (10 / 20 / 40 / 80) "
        "| at >= 160 (160 / 320 / 640 / 1280) | the same against the idealised SG-TBPS (model on each run's "
        "vectors), <= 80 / >= 160 |",
        "|---|---|---|---|---|---|---|",
    ]
    table: list[list[Any]] = []
    for variant in variants:
        l120 = [r for r in rows if r["variant"] == variant and r["table_size"] == 120]
        l60 = [r for r in rows if r["variant"] == variant and r["table_size"] == 60]
        limits = []
        for seed in sorted({r["seed"] for r in l120}):
            mine = sorted((r for r in l120 if r["seed"] == seed), key=lambda r: r["subscribers"])
            limit = 0
            for r in mine:
                if r["avg_hops"] <= 1.0 + 1e-9 and r["max_hops"] <= 1:
                    limit = r["subscribers"]
                else:
                    break
            limits.append(limit)

        def avg_at(group: list[dict[str, Any]], count: int) -> str:
            values = [r["avg_hops"] for r in group if r["subscribers"] == count]
            return _mean_sd(values) if values else "-"

        def cell(counts: Sequence[int], model: bool, l60: list[dict[str, Any]] = l60) -> str:
            return " / ".join(
                _mean_sd(v) if (v := _reductions(l60, baseline, c, model)) else "-" for c in counts
            )

        def span(counts: Sequence[int], model: bool, l60: list[dict[str, Any]] = l60) -> str:
            means = [fmean(v) for c in counts if (v := _reductions(l60, baseline, c, model))]
            return f"{min(means):.0f}-{max(means):.0f} %" if means else "-"

        low, high = (10, 20, 40, 80), (160, 320, 640, 1280)
        failed = "; ".join(FAILURES.get(variant, []))
        lines.append(
            f"| {variant}: {EEXP_VARIANTS[variant][0]}{f' (failed: {failed})' if failed else ''} "
            f"| {', '.join(str(x) for x in limits) or '-'} "
            f"| {avg_at(l120, 80)} / {avg_at(l120, 160)} "
            f"| {' / '.join(avg_at(l60, c) for c in (10, 80, 160, 1280))} "
            f"| {cell(low, False)} % ({span(low, False)}) | {cell(high, False)} % ({span(high, False)}) "
            f"| {span(low, True)} / {span(high, True)} |"
        )
        for count in sorted({r["subscribers"] for r in l60 + l120}):
            for size, group in ((60, l60), (120, l120)):
                values = [r["avg_hops"] for r in group if r["subscribers"] == count]
                if not values:
                    continue
                red = _reductions(l60, baseline, count, False) if size == 60 else []
                red_model = _reductions(l60, baseline, count, True) if size == 60 else []
                table.append(
                    [
                        variant,
                        size,
                        count,
                        len(values),
                        f"{fmean(values):.4f}",
                        f"{stdev(values):.4f}" if len(values) > 1 else "",
                        f"{fmean(r['max_hops'] for r in group if r['subscribers'] == count):.3f}",
                        f"{fmean(red):.2f}" if red else "",
                        f"{stdev(red):.2f}" if len(red) > 1 else "",
                        f"{fmean(red_model):.2f}" if red_model else "",
                    ]
                )
    with open(out / "eexp_summary.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "variant",
                "table_size",
                "subscribers",
                "seeds",
                "avg_hops",
                "avg_hops_sd",
                "max_hops",
                "reduction_pct",
                "reduction_pct_sd",
                "reduction_vs_model_pct",
            ]
        )
        writer.writerows(table)
    base_rows = sorted(baseline.values(), key=lambda r: (r["subscribers"], r["seed"]))
    counts = sorted({r["subscribers"] for r in base_rows})
    lines += [
        "",
        "SG-TBPS baseline (the same seeds; avg hops mean ± sd; idealised model on the same vectors): "
        + ", ".join(
            f"{c}: {_mean_sd([r['avg_hops'] for r in base_rows if r['subscribers'] == c])} "
            f"({fmean(r['model_avg_hops'] for r in base_rows if r['subscribers'] == c):.2f})"
            for c in counts
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("family", choices=("scribe", "eexp"))
    parser.add_argument("--nodes", type=int, default=None, help="default 10,000 (scribe) or 2,000 (eexp)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    parser.add_argument("--out", default="docs/figures/baselines")
    args = parser.parse_args(argv)
    family = args.family
    catalogue = SCRIBE_VARIANTS if family == "scribe" else EEXP_VARIANTS
    variants = [v for v in args.only.split(",") if v] or list(catalogue)
    unknown = [v for v in variants if v not in catalogue]
    if unknown:
        raise SystemExit(f"unknown {family} variants {unknown}; choose from {list(catalogue)}")
    out = Path(args.out)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    nodes = args.nodes or (10_000 if family == "scribe" else 2_000)
    counts = tuple(c for c in ExperimentConfig().subscriber_counts if c < nodes)
    base = ExperimentConfig(
        nodes=nodes,
        subscriber_counts=counts,
        overlay_options=paper_sweep.SWEEP_OVERLAY_OPTIONS,
        sgtbps_overlay_options=paper_sweep.SWEEP_SGTBPS_OPTIONS,
    )
    rows: list[dict[str, Any]] = []
    if family == "scribe":
        for variant in variants:
            cfg = replace(base, scribe_options=catalogue[variant][1])
            rows += run_variant(out, family, variant, "scribe", None, seeds, cfg)
        summary = scribe_summary(out, rows, variants)
    else:
        import overlay.node  # noqa: F401 - loaded once before forking

        l60 = replace(base, subscriber_counts=tuple(c for c in counts if c <= 1280))
        l120 = replace(base, subscriber_counts=tuple(c for c in counts if c <= 160))
        rows += run_variant(out, family, "baseline", "sgtbps", None, seeds, l60)
        for variant in variants:
            extra = catalogue[variant][1]
            rows += run_variant(
                out,
                family,
                variant,
                "proposed",
                120,
                seeds,
                replace(l120, overlay_options=base.overlay_options + extra),
            )
            rows += run_variant(
                out,
                family,
                variant,
                "proposed",
                60,
                seeds,
                replace(l60, overlay_options=base.overlay_options + extra),
            )
        summary = eexp_summary(out, rows, variants)
    out.mkdir(parents=True, exist_ok=True)
    write_runs(out, family, rows)
    header = f"python bench/baseline_variants.py {' '.join(argv if argv is not None else sys.argv[1:])}\n\n"
    (out / f"{family}_summary.md").write_text(header + summary)
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
