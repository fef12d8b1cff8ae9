"""Reproduce seed 003 §4 (Banno & Shudo): path lengths (Fig. 5, 6) and the delay model (Fig. 7).

Runs ``overlay.sim.experiment.run_series`` for every (system, L, seed) in worker processes,
shows a progress bar, and writes

* ``<out>/paper_sweep_runs.csv``   one row per (system, L, seed, subscriber count)
* ``<out>/paper_sweep.csv``        the mean over seeds (what the figures plot)
* ``<out>/fig5_avg_path.png``, ``fig6_max_path.png``, ``fig7_delay.png``
* ``<out>/paper_sweep_summary.md`` the comparison with the paper's statements, wall time, peak RSS

Usage (docs/overlay-reproduction.md)::

    python bench/paper_sweep.py [--nodes 10000] [--seeds 3] [--table-sizes 60,120]
        [--subscribers 10,20,40,...,5120] [--systems proposed,sgtbps,scribe]
        [--out docs/figures] [--jobs 2] [--quick] [--measured-order incremental|fresh|...]
        [--explain] [--overlay-option NAME=VALUE ...]

``--explain`` adds ``<out>/paper_sweep_explain.md``: per run and step, the proposed system's
publisher table (entries per level, subscribers held), subscribers known vs reached in one hop,
and why each other subscriber is not (never learned, or evicted - by which ≤FRT proposition).
``--overlay-option`` measures an alternative rule (docs/overlay.md §5, "EEXP rules").

Size: one runnable script - the sweep's tasks and worker processes, then its report. The split it
would take: the report (CSVs, figures, the comparison with the paper, the summary and explain
markdown; ~330 lines) into its own module reading the runs' CSV.
"""

from __future__ import annotations

import argparse
import csv
import gc
import hashlib
import json
import multiprocessing as mp
import os
import platform
import queue
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# --compiled re-runs this script with the mypyc build's directory here (bench/compiled_core.py):
# its ``overlay`` package then shadows the repository's.
_COMPILED_CORE = os.environ.get("SKIPMQ_COMPILED_CORE")
if _COMPILED_CORE:
    sys.path.insert(0, _COMPILED_CORE)

from overlay.sim.experiment import (  # noqa: E402 - after the path set-up above
    MEASURED_ORDERS,
    PAPER_SUBSCRIBER_COUNTS,
    SYSTEMS,
    AggregatePoint,
    ExperimentConfig,
    PathSample,
    StepExplanation,
    aggregate,
    run_series,
    single_broker_delay_ms,
    system_label,
)

# The paper's experiment has no churn, so the failure detector and the periodic REXP refresh
# (§3.5.5) run slowly in the sweep; every table is still built by the protocol's own
# SEARCH/REXP/EEXP/NEW/learning (see docs/overlay-reproduction.md, "What was simulated").
SWEEP_OVERLAY_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("rexp_interval_s", 600.0),
    ("ping_interval_s", 300.0),
    ("failure_timeout_s", 900.0),
)
# Both overlays re-search their position once after each join (OverlayConfig.join_verify_rounds,
# core default 1, docs/overlay.md §10); the SG-TBPS baseline names it here so that the baseline keeps
# it even if the core's default changes: without it the build's concurrent joins split its level-0
# list into interleaved chains that its plain Skip Graph tables repair one node per round trip -
# 52,972 of 60,000 virtual nodes had a wrong level-0 neighbour after the N=10,000 build (seed 1) and
# measured publishes reached 3 of 10 subscribers (issue #18, docs/overlay-reproduction.md).
# --overlay-option overrides this for both systems.
SWEEP_SGTBPS_OPTIONS: tuple[tuple[str, Any], ...] = (("join_verify_rounds", 1),)

Task = tuple[str, int | None, int]  # (system, L, seed)


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise SystemExit(f"--{what}: expected comma-separated integers, got {text!r}")
    if not values:
        raise SystemExit(f"--{what}: empty list")
    return values


def parse_overlay_options(items: Sequence[str]) -> tuple[tuple[str, Any], ...]:
    """``NAME=VALUE`` pairs for OverlayConfig, each VALUE typed like the field's default."""
    from overlay.config import OverlayConfig

    return _parse_config_options(items, OverlayConfig, "--overlay-option")


def parse_scribe_options(items: Sequence[str]) -> tuple[tuple[str, Any], ...]:
    """``NAME=VALUE`` pairs for ScribeConfig (overlay/sim/scribe.py), typed like the defaults."""
    from overlay.sim.scribe import ScribeConfig

    return _parse_config_options(items, ScribeConfig, "--scribe-option")


def _parse_config_options(items: Sequence[str], config: Any, flag: str) -> tuple[tuple[str, Any], ...]:
    from dataclasses import fields

    defaults = {f.name: f.default for f in fields(config)}
    options: list[tuple[str, Any]] = []
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in defaults:
            raise SystemExit(f"{flag}: expected NAME=VALUE (a {config.__name__} field), got {item!r}")
        default: Any = defaults[name]
        try:
            if isinstance(default, bool):
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(text)
                value: Any = text.lower() in ("true", "1")
            else:
                value = type(default)(text)
        except ValueError:
            raise SystemExit(f"{flag} {name}: {text!r} is not a {type(default).__name__}")
        options.append((name, value))
    try:
        config(**dict(options))
    except ValueError as exc:
        raise SystemExit(f"{flag}: {exc}")
    return tuple(options)


def load_raw(paths: Sequence[Path]) -> tuple[list[PathSample], dict[str, Any]]:
    """Samples and run information of one or more saved sweeps (``paper_sweep_raw.json``)."""
    samples: list[PathSample] = []
    info: dict[str, Any] = {}
    for path in paths:
        raw = json.loads(path.read_text())
        samples.extend(
            PathSample(**{**item, "messages_by_kind": tuple(map(tuple, item["messages_by_kind"]))})
            for item in raw["samples"]
        )
        part = raw["info"]
        if not info:
            info = dict(part, timings=list(part["timings"]), commands=[part.get("command", "")])
            continue
        info["timings"].extend(part["timings"])
        info["commands"].append(part.get("command", ""))
        info["wall_s"] += part["wall_s"]
        info["peak_total_rss_mib"] = max(info["peak_total_rss_mib"], part["peak_total_rss_mib"])
        info["explanations"] = [*info.get("explanations", []), *part.get("explanations", [])]
    return samples, info


def build_tasks(
    systems: Sequence[str], table_sizes: Sequence[int], seeds: int, first_seed: int = 1
) -> list[Task]:
    tasks: list[Task] = []
    for seed in range(first_seed, first_seed + seeds):
        for system in systems:
            if system == "proposed":
                tasks.extend(("proposed", size, seed) for size in sorted(table_sizes, reverse=True))
            else:
                tasks.append((system, None, seed))
    cost = {"proposed": 0, "sgtbps": 1, "scribe": 2}  # most expensive first balances the workers
    return sorted(tasks, key=lambda task: (cost[task[0]], -(task[1] or 0), task[2]))


def _worker(tasks: mp.Queue, results: mp.Queue, cfg: ExperimentConfig) -> None:
    # A run allocates tens of millions of short-lived tuples and messages: a larger first
    # generation makes the cyclic collector run less often (about 5 % of a run's time with the
    # default 700); what the parent imported is never garbage and is left out of every pass.
    gc.freeze()
    gc.set_threshold(100_000, 20, 20)
    while True:
        task = tasks.get()
        if task is None:  # one sentinel per worker ends the queue
            return
        system, table_size, seed = task
        started = time.perf_counter()

        def progress(stage: str, done: int, total: int, task: Task = task) -> None:
            results.put(("progress", task, stage, done, total))

        try:
            series = run_series(system, table_size, seed, cfg, progress)
        except Exception as exc:  # reported and re-raised by the parent, with the seed
            results.put(("error", task, f"{type(exc).__name__}: {exc}"))
            return
        import resource

        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        results.put(("done", task, series, time.perf_counter() - started, rss_mib))
        del series
        # the finished run's simulator is one large graph of cycles: free it before the next run
        # builds its own (with the raised threshold a full pass may otherwise come much later,
        # and a worker's peak was the sum of its runs': 2.9 GiB instead of 1.1 GiB)
        gc.collect()


def _rss_of(pids: Sequence[int]) -> float:
    total_kib = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total_kib += int(line.split()[1])
                        break
        except OSError:
            continue
    return total_kib / 1024


class ProgressBar:
    """A one-line progress bar on stderr (units: build chunks and subscriber steps)."""

    def __init__(self, total_units: int) -> None:
        self.total = total_units
        self.done = 0
        self.started = time.perf_counter()
        self.last_line = ""

    def advance(self, label: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.started
        fraction = self.done / self.total
        eta = elapsed / fraction - elapsed if fraction > 0 else 0.0
        width = 30
        filled = int(width * fraction)
        line = (
            f"\r[{'#' * filled}{'.' * (width - filled)}] {100 * fraction:5.1f}% "
            f"{elapsed:6.0f}s elapsed, ~{eta:5.0f}s left  {label:<40}"
        )
        sys.stderr.write(line)
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")


def run_sweep(
    tasks: list[Task], cfg: ExperimentConfig, jobs: int, checkpoint: Path | None = None
) -> tuple[list[PathSample], dict[str, Any]]:
    """Run every task on ``jobs`` worker processes. With ``checkpoint``, the samples of the runs
    finished so far are rewritten there after each run (the raw format, so ``--from-raw`` reads
    it): a sweep stopped part-way keeps its finished runs."""
    context = mp.get_context("fork")
    task_queue: mp.Queue = context.Queue()
    result_queue: mp.Queue = context.Queue()
    for task in tasks:
        task_queue.put(task)
    for _ in range(jobs):
        task_queue.put(None)
    units_per_task = 20 + len(cfg.subscriber_counts)
    bar = ProgressBar(units_per_task * len(tasks))
    workers = [context.Process(target=_worker, args=(task_queue, result_queue, cfg)) for _ in range(jobs)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    peak_total_rss = [0.0]
    stop = threading.Event()

    def sample_rss() -> None:
        while not stop.is_set():
            peak_total_rss[0] = max(peak_total_rss[0], _rss_of([w.pid for w in workers if w.pid]))
            stop.wait(0.5)

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    samples: list[PathSample] = []
    explanations: list[StepExplanation] = []
    timings: list[dict[str, Any]] = []
    finished = 0
    try:
        while finished < len(tasks):
            try:
                message = result_queue.get(timeout=5.0)
            except queue.Empty:
                if not any(worker.is_alive() for worker in workers):
                    raise SystemExit("all workers exited before the sweep finished")
                continue
            kind, task = message[0], message[1]
            label = f"{system_label(task[0], task[1])} seed {task[2]}"
            if kind == "progress":
                bar.advance(f"{label}: {message[2]} {message[3]}/{message[4]}")
            elif kind == "error":
                raise SystemExit(f"\n{label} failed: {message[2]}")
            else:
                series, wall_s, rss_mib = message[2], message[3], message[4]
                samples.extend(series.samples)
                explanations.extend(series.explanations)
                timings.append(
                    {
                        "system": task[0],
                        "table_size": task[1],
                        "seed": task[2],
                        "wall_s": wall_s,
                        "worker_peak_rss_mib": rss_mib,
                        "virtual_nodes": series.virtual_nodes,
                        "level0_wrong_after_build": series.level0_wrong_after_build,
                        "build_messages": sum(count for _, count in series.build_messages_by_kind),
                        "build_messages_by_kind": dict(series.build_messages_by_kind),
                    }
                )
                finished += 1
                if checkpoint is not None:
                    partial = {
                        "wall_s": time.perf_counter() - started,
                        "peak_total_rss_mib": peak_total_rss[0],
                        "timings": timings,
                        "explanations": [asdict(e) for e in explanations],
                        "partial": True,
                    }
                    saved = {"samples": [asdict(s) for s in samples], "info": partial}
                    checkpoint.write_text(json.dumps(saved))
    finally:
        stop.set()
        bar.close()
        for worker in workers:
            worker.join(timeout=5.0)
            if worker.is_alive():
                worker.terminate()
    info = {
        "wall_s": time.perf_counter() - started,
        "peak_total_rss_mib": peak_total_rss[0],
        "timings": timings,
        "explanations": [asdict(e) for e in explanations],
    }
    return samples, info


def write_csvs(out: Path, samples: list[PathSample], points: list[AggregatePoint]) -> None:
    with open(out / "paper_sweep_runs.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "system",
                "table_size",
                "seed",
                "subscribers",
                "avg_hops",
                "max_hops",
                "delivered",
                "route_hops",
                "level0_wrong",
                "publisher_run_entries",
                "publisher_run_neighbours",
                "run_neighbours_missing",
                "run_entries_extra",
                "model_avg_hops",
                "model_max_hops",
                "model_agree",
            ]
        )
        for s in sorted(samples, key=lambda s: (s.system, s.table_size or 0, s.seed, s.subscribers)):
            writer.writerow(
                [
                    s.system,
                    s.table_size or "",
                    s.seed,
                    s.subscribers,
                    f"{s.avg_hops:.4f}",
                    s.max_hops,
                    s.delivered,
                    f"{s.route_hops:.2f}",
                    s.level0_wrong,
                    s.publisher_run_entries,
                    s.publisher_run_neighbours,
                    s.run_neighbours_missing,
                    s.run_entries_extra,
                    f"{s.model_avg_hops:.4f}",
                    s.model_max_hops,
                    s.model_agree,
                ]
            )
    with open(out / "paper_sweep.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "series",
                "system",
                "table_size",
                "subscribers",
                "seeds",
                "avg_hops",
                "max_hops",
                "delay_ms",
                "single_broker_delay_ms",
                "min_delivered_fraction",
                "route_hops",
                "avg_hops_sd",
                "max_hops_sd",
                "model_avg_hops",
                "model_max_hops",
                "level0_wrong",
            ]
        )
        for p in points:
            writer.writerow(
                [
                    system_label(p.system, p.table_size),
                    p.system,
                    p.table_size or "",
                    p.subscribers,
                    p.seeds,
                    f"{p.avg_hops:.4f}",
                    f"{p.max_hops:.3f}",
                    f"{p.delay_ms:.2f}",
                    f"{single_broker_delay_ms(p.subscribers):.2f}",
                    f"{p.min_delivered_fraction:.4f}",
                    f"{p.route_hops:.2f}",
                    f"{p.avg_hops_sd:.4f}",
                    f"{p.max_hops_sd:.3f}",
                    f"{p.model_avg_hops:.4f}",
                    f"{p.model_max_hops:.3f}",
                    f"{p.level0_wrong:.1f}",
                ]
            )


def _series(points: list[AggregatePoint]) -> dict[str, list[AggregatePoint]]:
    grouped: dict[str, list[AggregatePoint]] = {}
    for point in points:
        grouped.setdefault(system_label(point.system, point.table_size), []).append(point)
    return grouped


def _subscriber_axis(ax: Any, counts: list[int]) -> None:
    """Log-2 x axis labelled with the subscriber counts themselves (10, 20, 40, ...)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts)
    ax.set_xticklabels([str(c) for c in counts], rotation=45 if len(counts) > 8 else 0)
    ax.xaxis.set_minor_locator(matplotlib_ticker().NullLocator())
    ax.set_xlabel("number of subscribers")


def matplotlib_ticker() -> Any:
    import matplotlib.ticker

    return matplotlib.ticker


STYLE = {"proposed L=60": "o-", "proposed L=120": "s-", "SG-TBPS": "^--", "Scribe": "v:"}


def _cell(point: AggregatePoint) -> str:
    """avg / max hops of a summary cell, with the standard deviation over seeds when > 1 seed."""
    if point.seeds > 1:
        return f"{point.avg_hops:.2f}±{point.avg_hops_sd:.2f} / {point.max_hops:.1f}±{point.max_hops_sd:.1f}"
    return f"{point.avg_hops:.2f} / {point.max_hops:.1f}"


def plot(out: Path, points: list[AggregatePoint], title_suffix: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files: list[Path] = []
    grouped = _series(points)
    counts: list[int] = sorted({p.subscribers for p in points})
    for name, attribute, ylabel, title in (
        ("fig5_avg_path.png", "avg_hops", "average path length [hops]", "Fig. 5: average path length"),
        ("fig6_max_path.png", "max_hops", "maximum path length [hops]", "Fig. 6: maximum path length"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, series in grouped.items():
            xs = [p.subscribers for p in series]
            ys = [getattr(p, attribute) for p in series]
            errors = [getattr(p, f"{attribute}_sd") for p in series]
            line = ax.plot(xs, ys, STYLE.get(label, ".-"), label=label)[0]
            if any(errors):  # one standard deviation over the seeds
                ax.errorbar(xs, ys, yerr=errors, fmt="none", ecolor=line.get_color(), capsize=3)
        _subscriber_axis(ax, counts)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"{title}{title_suffix}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        files.append(out / name)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, series in grouped.items():
        ax.plot(
            [p.subscribers for p in series], [p.delay_ms for p in series], STYLE.get(label, ".-"), label=label
        )
    ax.plot(counts, [single_broker_delay_ms(c) for c in counts], "k-", linewidth=2, label="single broker")
    _subscriber_axis(ax, counts)
    ax.set_yscale("log")
    ax.set_ylabel("estimated delay [ms]")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(
        f"Fig. 7: delay model (1 ms/node, 10 ms/link, 10 children, 0.1 ms/child){title_suffix}", fontsize=9
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fig7_delay.png", dpi=110)
    plt.close(fig)
    files.append(out / "fig7_delay.png")
    return files


def comparison(points: list[AggregatePoint]) -> list[tuple[str, str, str]]:
    """(paper's statement, reproduction's value, verdict) rows."""
    grouped = _series(points)
    rows: list[tuple[str, str, str]] = []

    def by_count(label: str) -> dict[int, AggregatePoint]:
        return {p.subscribers: p for p in grouped.get(label, [])}

    l120 = by_count("proposed L=120")
    if l120:
        single = [c for c, p in sorted(l120.items()) if p.avg_hops <= 1.0 + 1e-9 and p.max_hops <= 1.0 + 1e-9]
        largest: float = max(single) if single else 0
        rows.append(
            (
                "L=120: single hop up to 80 subscribers",
                f"single hop (avg = max = 1) up to {largest}",
                "matches" if largest == 80 else f"differs ({largest} vs 80)",
            )
        )
    l60, sg = by_count("proposed L=60"), by_count("SG-TBPS")
    if l60 and sg:
        for paper, selector, low, high in (
            ("L=60: reduction vs SG-TBPS 63-77 % at <= 80 subscribers", lambda c: c <= 80, 63, 77),
            ("L=60: reduction vs SG-TBPS 22-47 % at >= 160 subscribers", lambda c: c >= 160, 22, 47),
        ):
            reductions = [
                100 * (1 - l60[c].avg_hops / sg[c].avg_hops) for c in sorted(l60) if c in sg and selector(c)
            ]
            if reductions:
                least, most = min(reductions), max(reductions)
                close = least >= low - 5 and most <= high + 5
                verdict = "matches" if close else f"differs (paper {low}-{high} %)"
                rows.append((paper, f"{least:.0f}-{most:.0f} %", verdict))
    for label, paper, low_ratio, high_ratio in (
        ("SG-TBPS", "SG-TBPS: maximum about 2x its average", 1.6, 2.4),
        ("Scribe", "Scribe: maximum 1.5-2.5x its average", 1.5, 2.5),
    ):
        series = grouped.get(label)
        if series:
            ratios = [p.max_hops / p.avg_hops for p in series if p.avg_hops > 0]
            least_ratio, most_ratio = min(ratios), max(ratios)
            close = least_ratio >= low_ratio - 0.2 and most_ratio <= high_ratio + 0.2
            rows.append((paper, f"{least_ratio:.2f}-{most_ratio:.2f}x", "matches" if close else "differs"))
    scribe = grouped.get("Scribe")
    if scribe:
        depth_ratios = [
            (p.max_hops - p.route_hops) / (p.avg_hops - p.route_hops)
            for p in scribe
            if p.avg_hops > p.route_hops
        ]
        if depth_ratios:
            rows.append(
                (
                    "(Scribe counted as root -> subscriber tree depth only)",
                    f"{min(depth_ratios):.2f}-{max(depth_ratios):.2f}x",
                    "for comparison",
                )
            )
    for label in ("proposed L=60", "proposed L=120"):
        series = grouped.get(label)
        if series and series[0].subscribers <= 20:
            rows.append(
                (
                    "proposed: maximum path 1 at few subscribers",
                    f"{label}: max {series[0].max_hops:.0f} at {series[0].subscribers}",
                    "matches" if series[0].max_hops == 1 else "differs",
                )
            )
    return rows


def explain_markdown(explanations: Sequence[dict[str, Any]]) -> str:
    """The --explain report: per run and step, the publisher's table and each missing subscriber."""
    lines = [
        "# The publisher's table at each step (paper_sweep --explain)",
        "",
        "known: subscribers that are entries of the publisher's table after the step's publishes; "
        "one hop: subscribers the last measured publish reached at 1 hop; ever learned: subscribers "
        "the table ever held. Non-SUB / SUB by level: entries of levels 0, 1, 2, ...",
        "",
        "| run | subscribers | entries (sticky) | SUB | non-SUB by level | SUB by level | known | one hop "
        "| ever learned | why the others are not one hop |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    details: list[str] = []
    for item in sorted(explanations, key=lambda e: (e["table_size"] or 0, e["seed"], e["subscribers"])):
        label = f"{system_label(item['system'], item['table_size'])} seed {item['seed']}"
        reasons: dict[str, int] = {}
        for _, why in item["missing"]:
            reasons[why] = reasons.get(why, 0) + 1
        why_text = "; ".join(f"{n} {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])) or "-"
        lines.append(
            f"| {label} | {item['subscribers']} | {item['table_entries']} ({item['sticky_entries']}) "
            f"| {item['sub_entries']} | {list(item['nonsub_by_level'])} | {list(item['sub_by_level'])} "
            f"| {item['known']} | {item['one_hop']} | {item['ever_learned']} | {why_text} |"
        )
        if item["missing"] and item["subscribers"] <= 160:
            details.append(f"* {label}, {item['subscribers']} subscribers:")
            details.extend(f"  * `{key}`: {why}" for key, why in item["missing"])
    if details:
        lines += ["", "## Each subscriber not reached in one hop (steps up to 160 subscribers)", "", *details]
    return "\n".join(lines) + "\n"


def core_digest() -> str:
    """A short digest of the overlay core's sources, naming the version a sweep ran on."""
    digest = hashlib.blake2b(digest_size=6)
    for path in sorted((Path(__file__).resolve().parents[1] / "overlay").glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def summary_markdown(
    points: list[AggregatePoint], info: dict[str, Any], cfg: ExperimentConfig, argv: Sequence[str], seeds: int
) -> str:
    commands = info.get("commands") or [info.get("command", f"python bench/paper_sweep.py {' '.join(argv)}")]
    if len(commands) > 1:  # merged with --from-raw a,b,...
        commands = [*commands, f"python bench/paper_sweep.py {' '.join(argv)}"]
    lines = [
        *(f"Command: `{command}`" for command in commands),
        "",
        f"N = {cfg.nodes} physical nodes, {seeds} seed(s), subscriber counts {list(cfg.subscriber_counts)}.",
        f"Overlay core sources digest (overlay/*.py): {info.get('core_digest', core_digest())}; "
        f"core {info.get('core', 'interpreted (CPython)')}.",
        "",
        "| series | " + " | ".join(str(c) for c in cfg.subscriber_counts) + " |",
        "|---|" + "---|" * len(cfg.subscriber_counts),
    ]
    for label, series in _series(points).items():
        by_count = {p.subscribers: p for p in series}
        cells = [_cell(by_count[c]) if c in by_count else "" for c in cfg.subscriber_counts]
        lines.append(f"| {label} (avg / max hops) | " + " | ".join(cells) + " |")
        if label == "SG-TBPS" and any(p.model_avg_hops for p in series):
            cells = [
                f"{m.model_avg_hops:.2f} / {m.model_max_hops:.1f}" if (m := by_count.get(c)) else ""
                for c in cfg.subscriber_counts
            ]
            lines.append("| idealised SG-TBPS on the same membership vectors | " + " | ".join(cells) + " |")
    lines += ["", "| paper (§4) | reproduction | verdict |", "|---|---|---|"]
    for paper, ours, verdict in comparison(points):
        lines.append(f"| {paper} | {ours} | {verdict} |")
    lines += [
        "",
        f"Wall time {info['wall_s']:.0f} s; peak RSS of all workers together "
        f"{info['peak_total_rss_mib']:.0f} MiB "
        f"(machine: {os.cpu_count()} CPUs, {platform.python_implementation()} {platform.python_version()}, "
        f"{platform.machine()}).",
        "",
        "| run | wall s | worker peak RSS MiB | virtual nodes | build messages | wrong level-0 after build |",
        "|---|---|---|---|---|---|",
    ]
    for timing in sorted(info["timings"], key=lambda t: (t["system"], t["table_size"] or 0, t["seed"])):
        lines.append(
            f"| {system_label(timing['system'], timing['table_size'])} seed {timing['seed']} "
            f"| {timing['wall_s']:.0f} | {timing['worker_peak_rss_mib']:.0f} "
            f"| {timing['virtual_nodes']} | {timing['build_messages']} "
            f"| {timing.get('level0_wrong_after_build', -1)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=10_000, help="physical nodes (paper: 10,000)")
    parser.add_argument("--seeds", type=int, default=3, help="runs averaged (paper: 3)")
    parser.add_argument("--table-sizes", default="60,120", help="L values of the proposed system")
    parser.add_argument("--subscribers", default=",".join(str(c) for c in PAPER_SUBSCRIBER_COUNTS))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--out", default=None, help="default docs/figures (docs/figures/quick with --quick)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, 1 seed, up to 640 subscribers")
    parser.add_argument(
        "--measured-order",
        choices=MEASURED_ORDERS,
        default="incremental",
        help="incremental: one topic, publisher first, subscribers added 10 -> 20 -> ...; "
        "with_background: the same, the first count joining during the background build; "
        "fresh: a new measured topic per subscriber count, subscribers first, then the publisher "
        "(docs/overlay-reproduction.md; the level-0 insertion fault it exposed at N=10,000 is fixed, "
        "docs/overlay.md §10)",
    )
    parser.add_argument("--scribe-digit-bits", type=int, default=4, help="Pastry's b for the Scribe baseline")
    parser.add_argument(
        "--scribe-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a ScribeConfig field for the Scribe baseline, repeatable (e.g. publish_mode=tree, "
        "join_state=rows, leaf_half=4; overlay/sim/scribe.py, docs/overlay-reproduction.md)",
    )
    parser.add_argument(
        "--overlay-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra OverlayConfig field for the proposed/SG-TBPS nodes, repeatable "
        "(e.g. eexp_split=even to measure an alternative EEXP rule; docs/overlay.md §5)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="trace the proposed system's publisher table: per step its composition, subscribers "
        "known vs reached in one hop, and why each other one is not (never learned, or evicted by "
        "which ≤FRT proposition); writes paper_sweep_explain.md (slower: O(L^2) per eviction)",
    )
    parser.add_argument(
        "--membership-window-s",
        type=float,
        default=ExperimentConfig().membership_window_s,
        help="virtual seconds over which the background topic joins are spread (default 20; a "
        "long window makes the joins sequential: docs/notes/overlay-history.md, 2026-11-27)",
    )
    parser.add_argument(
        "--allow-misses",
        action="store_true",
        help="do not stop a run whose measured publish misses a subscriber (the path average is "
        "then over the subscribers reached; only to reproduce such a run, see the delivered column)",
    )
    parser.add_argument(
        "--first-seed",
        type=int,
        default=1,
        help="the seeds run are first-seed .. first-seed + seeds - 1 (to run seeds one at a time "
        "and merge them with --from-raw a.json,b.json)",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="run on the overlay core compiled with mypyc (bench/compiled_core.py: built once per "
        "source version into build/compiled-core/, about a minute; the same results, a run about 2.8x "
        "faster); the summary names the core that ran",
    )
    parser.add_argument(
        "--from-raw",
        help="re-plot from saved paper_sweep_raw.json files instead of simulating (comma-separated: "
        "their samples are merged; wall times add up, peak RSS is the largest)",
    )
    args = parser.parse_args(args_list)
    if args.compiled and not args.from_raw and not _COMPILED_CORE:
        import compiled_core

        built = compiled_core.build()
        env = {**os.environ, compiled_core.ENV_VAR: str(built)}
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *args_list], env)

    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"--systems: unknown {unknown}; choose from {list(SYSTEMS)}")
    nodes, seeds = args.nodes, args.seeds
    counts = parse_ints(args.subscribers, "subscribers")
    if args.quick:
        nodes, seeds = 1000, 1
        counts = tuple(c for c in counts if c <= 640) or (10,)
    if nodes < 2 or seeds < 1 or args.jobs < 1:
        raise SystemExit("--nodes must be >= 2, --seeds and --jobs >= 1")
    counts = tuple(c for c in counts if c < nodes)
    table_sizes = parse_ints(args.table_sizes, "table-sizes")
    cfg = replace(
        ExperimentConfig(
            nodes=nodes,
            subscriber_counts=counts,
            measured_order=args.measured_order,
            explain=args.explain,
            allow_missed_deliveries=args.allow_misses,
            membership_window_s=args.membership_window_s,
        ),
        overlay_options=SWEEP_OVERLAY_OPTIONS + parse_overlay_options(args.overlay_option),
        sgtbps_overlay_options=SWEEP_SGTBPS_OPTIONS,
        scribe_options=(("digit_bits", args.scribe_digit_bits), *parse_scribe_options(args.scribe_option)),
    )
    out = Path(args.out if args.out is not None else ("docs/figures/quick" if args.quick else "docs/figures"))
    out.mkdir(parents=True, exist_ok=True)

    if {"proposed", "sgtbps"} & set(systems):
        import overlay.node  # loaded once before forking: every worker runs the same core
    core = "interpreted (CPython)"
    if _COMPILED_CORE:
        from compiled_core import compiled_modules_loaded

        import overlay.sim.engine  # noqa: F401 - imported here too, so the check below sees it

        loaded = compiled_modules_loaded()
        if not loaded:
            raise SystemExit(f"--compiled: no compiled overlay module was imported from {_COMPILED_CORE}")
        core = f"compiled with mypyc ({len(loaded)} modules: {', '.join(loaded)})"

    tasks = build_tasks(systems, table_sizes, seeds, args.first_seed)
    print(
        f"paper sweep: {len(tasks)} runs, N={nodes}, seeds={seeds}, L={list(table_sizes)}, "
        f"subscribers={list(counts)}, jobs={args.jobs}",
        file=sys.stderr,
    )
    raw_path = out / "paper_sweep_raw.json"
    if args.from_raw:
        samples, info = load_raw([Path(name) for name in args.from_raw.split(",") if name])
        seeds = len({sample.seed for sample in samples})
        # the summary names what was simulated, not this command's defaults
        counts = tuple(sorted({sample.subscribers for sample in samples}))
        cfg = replace(cfg, nodes=info.get("nodes", cfg.nodes), subscriber_counts=counts)
    else:
        digest = core_digest()  # before the workers start: names the code that actually runs
        checkpoint = out / "paper_sweep_raw.partial.json"
        samples, info = run_sweep(tasks, cfg, args.jobs, checkpoint)
        checkpoint.unlink(missing_ok=True)
        info["command"] = f"python bench/paper_sweep.py {' '.join(args_list)}"
        info["nodes"] = nodes
        info["core_digest"] = digest
        info["core"] = core
        raw_path.write_text(json.dumps({"samples": [asdict(s) for s in samples], "info": info}))
    points = aggregate(samples)
    write_csvs(out, samples, points)
    suffix = f" (N={nodes}, {seeds} seed{'s' if seeds > 1 else ''})"
    files = plot(out, points, suffix)
    summary = summary_markdown(points, info, cfg, args_list, seeds)
    (out / "paper_sweep_summary.md").write_text(summary)
    (out / "paper_sweep_timings.csv").write_text(
        "system,table_size,seed,wall_s,worker_peak_rss_mib,virtual_nodes,build_messages,level0_wrong_after_build\n"
        + "".join(
            f"{t['system']},{t['table_size'] or ''},{t['seed']},{t['wall_s']:.1f},"
            f"{t['worker_peak_rss_mib']:.0f},{t['virtual_nodes']},{t['build_messages']},"
            f"{t.get('level0_wrong_after_build', -1)}\n"
            for t in info["timings"]
        )
    )
    if info.get("explanations"):
        explain_text = explain_markdown(info["explanations"])
        (out / "paper_sweep_explain.md").write_text(explain_text)
        print(explain_text.split("\n## ")[0])
    print(summary)
    print("wrote", ", ".join(str(f) for f in [out / "paper_sweep.csv", out / "paper_sweep_runs.csv", *files]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
