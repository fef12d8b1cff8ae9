"""The idealised SG-TBPS model's path lengths per subscriber count (overlay/sim/sfb_model.py).

SFB range multicast from the subscriber run's left edge (the rendezvous point) over a plain Skip
Graph whose membership vectors are i.i.d. uniform; every table holds exactly the Skip Graph
neighbours. Prints a table and writes ``<out>/sfb_model.csv`` (mean and standard deviation over
the draws of the per-draw average and maximum hops). docs/overlay-reproduction.md, "Issue #18,
2026-11-27: the baselines".

Usage::

    python bench/sfb_model.py [--subscribers 10,20,...,5120] [--trials 4000] [--seed 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from overlay.sim.experiment import PAPER_SUBSCRIBER_COUNTS
from overlay.sim.sfb_model import expected_path_lengths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--subscribers", default=",".join(str(c) for c in PAPER_SUBSCRIBER_COUNTS))
    parser.add_argument(
        "--trials", type=int, default=4000, help="draws per count (at most 400_000 // count, >= 200)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mv-bits", type=int, default=32)
    parser.add_argument("--out", default=None, help="directory for sfb_model.csv (none: print only)")
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.subscribers.split(",") if part.strip()]
    rng = random.Random(args.seed)
    rows = []
    print("| subscribers | draws | avg hops (mean ± sd over draws) | max hops (mean ± sd) |")
    print("|---|---|---|---|")
    for count in counts:
        trials = max(200, min(args.trials, 400_000 // count))
        (point,) = expected_path_lengths([count], trials, rng, args.mv_bits)
        rows.append(point)
        print(
            f"| {count} | {trials} | {point.avg_hops:.2f} ± {point.avg_hops_sd:.2f} "
            f"| {point.max_hops:.2f} ± {point.max_hops_sd:.2f} |"
        )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "sfb_model.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["subscribers", "trials", "avg_hops", "avg_hops_sd", "max_hops", "max_hops_sd"])
            for p in rows:
                writer.writerow(
                    [
                        p.subscribers,
                        p.trials,
                        f"{p.avg_hops:.4f}",
                        f"{p.avg_hops_sd:.4f}",
                        f"{p.max_hops:.4f}",
                        f"{p.max_hops_sd:.4f}",
                    ]
                )
        print("wrote", out / "sfb_model.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
