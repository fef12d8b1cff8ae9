"""``python -m simulation``: run the whole-cluster simulation for one seed or a range of seeds.

    python -m simulation --help
    python -m simulation --seed 42                   # replay one seed: violations, trace, digest
    python -m simulation --seeds 0:1000              # sweep; exit 1 naming the failing seeds
    python -m simulation --seeds 0:200 --faults crash,partition,move --loss 0.05
    python -m simulation --seeds 0:1000 --faults crash,long-partition --loss 0.05
                                                     # partitions of 12-40 s: peers declared down
    python -m simulation --known                     # the three known faults, one run each
    python -m simulation --seeds 0:1000 --faults crash,partition,move --loss 0.05 --finite-clients
                                                     # streams of 125-500 msg/s, finite-rate clients
    python -m simulation --seeds 0:200 --conversation --loss 0.05 --faults crash,partition
                                                     # causal groups, every fault at once

A run is a pure function of its seed and options. Python's string hashing is salted per process
and would change the iteration order of sets, so this command re-executes itself with
``PYTHONHASHSEED=0`` unless that is already set: a seed replays exactly across processes too.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from simulation.causal import causal_conversation
from simulation.scenario import (
    FAULTS,
    Result,
    known_kill_subscriber_broker,
    known_publish_after_session_move,
    known_suback_then_publish,
    run_seed,
)

KNOWN = {
    "suback-then-publish": known_suback_then_publish,
    "publish-after-session-move": known_publish_after_session_move,
    "kill-subscriber-broker": known_kill_subscriber_broker,
}


def _seed_range(text: str) -> range:
    start, sep, stop = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected START:STOP (e.g. 0:1000), got {text!r}")
    return range(int(start), int(stop))


def _faults(text: str) -> frozenset[str]:
    chosen = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = chosen - set(FAULTS)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown fault(s) {sorted(unknown)}; choose from {', '.join(FAULTS)}"
        )
    return chosen


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m simulation",
        description=(
            "Seeded whole-cluster simulation of SkipMQ: 3-5 real brokers (broker core, cluster "
            "engine, overlay, SQLite store) on a virtual clock and network, simulated MQTT clients "
            "speaking real bytes, seeded faults, and invariant checkers (no acknowledged QoS 1 "
            "message lost, per-publisher order, one owner per client id, retained converges)."
        ),
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--seed", type=int, help="run one seed and print its violations and trace")
    what.add_argument("--seeds", type=_seed_range, help="run seeds START:STOP (STOP excluded)")
    what.add_argument("--known", action="store_true", help="run the three known-fault scenarios")
    parser.add_argument(
        "--faults",
        type=_faults,
        default=frozenset(),
        help=f"comma-separated fault kinds to add: {', '.join(FAULTS)} (default none); a "
        "partition lasts 1-5 s, a long-partition 12-40 s (longer than the 10 s after which a cut "
        "link is declared down, so the peer-down path runs)",
    )
    parser.add_argument("--loss", type=float, default=0.0, help="maximum message loss rate per run (0)")
    parser.add_argument(
        "--duplicate",
        type=float,
        default=0.05,
        help="maximum duplication rate (0.05; with --conversation: the rate of every link)",
    )
    parser.add_argument(
        "--reorder",
        type=float,
        default=None,
        help="maximum reordering rate (0.05; with --conversation: the rate of every link, 0.3)",
    )
    parser.add_argument(
        "--brokers", type=int, default=None, help="exactly this many brokers (default: 3 to 5 per seed)"
    )
    parser.add_argument(
        "--conversation",
        action="store_true",
        help="run the causal-group conversation (simulation/causal.py: 5 brokers, responders, an "
        "independent vector-clock oracle) instead of the random script; --loss, --duplicate and "
        "--reorder set every link's rates; --faults crash kills one broker mid-conversation, "
        "--faults partition cuts two brokers off the other three and heals (move: not here)",
    )
    parser.add_argument(
        "--no-causal-groups",
        action="store_true",
        help="with --conversation: without cluster.causal_groups (shows the order it breaks)",
    )
    parser.add_argument(
        "--finite-clients",
        action="store_true",
        help="random script only: each publisher sends 200-600 messages at 125-500 msg/s and each "
        "subscriber drains at 1.5-4 times the publishers' total rate (SimClient(drain_per_s=)), "
        "with the default limits (queue 1,000 per session): the backlog a fault leaves must reach "
        "a session no faster than it drains",
    )
    parser.add_argument("--trace", type=int, default=40, help="client events shown for a failing seed (40)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "simulation", *(argv or sys.argv[1:])])
    args = parse_args(argv)
    options: dict[str, object] = {
        "faults": args.faults,
        "loss": args.loss,
        "duplicate": args.duplicate,
        "reorder": 0.05 if args.reorder is None else args.reorder,
    }
    if args.brokers is not None:
        options["brokers"] = (args.brokers, args.brokers)
    if args.finite_clients:
        options["finite_clients"] = True
    if args.conversation:
        if "move" in args.faults:
            print("python -m simulation: --faults move is not part of --conversation", file=sys.stderr)
            return 2
        options = {
            "conversation": True,
            "causal": not args.no_causal_groups,
            "loss": args.loss,
            "duplicate": args.duplicate,
            "reorder": 0.3 if args.reorder is None else args.reorder,
            "crash": "crash" in args.faults,
            "partition": "partition" in args.faults,
        }
    if args.known:
        failed = 0
        for name, scenario in KNOWN.items():
            result = scenario()
            status = "reproduces" if not result.ok else "does not reproduce"
            print(f"{name}: {status} ({len(result.violations)} violations)")
            print(result.report(trace_lines=0))
            failed += not result.ok
        return 0 if failed == len(KNOWN) else 1
    if args.seed is not None:
        result = _run(args.seed, options)
        print(result.report(trace_lines=args.trace))
        verdict = "OK" if result.ok else "VIOLATIONS"
        print(f"  {result.events} events, {result.duplicates} duplicates; {verdict}")
        return 0 if result.ok else 1
    return _sweep(args.seeds, args.trace, options)


def _sweep(seeds: range, trace_lines: int, options: dict[str, object]) -> int:
    started = time.monotonic()
    failing: list[Result] = []
    events = 0
    duplicates = received = most = 0
    for index, seed in enumerate(seeds, start=1):
        result = _run(seed, options)
        events += result.events
        duplicates += result.duplicates
        received += len(result.history.received)
        most = max(most, result.duplicates)
        if not result.ok:
            failing.append(result)
            print(result.report(trace_lines=0), flush=True)
        if index % 50 == 0 or index == len(seeds):
            elapsed = time.monotonic() - started
            print(
                f"[{index}/{len(seeds)}] {len(failing)} failing, {index / elapsed:.1f} seeds/s",
                file=sys.stderr,
                flush=True,
            )
    elapsed = time.monotonic() - started
    print(
        f"{len(seeds)} seeds in {elapsed:.1f} s ({len(seeds) / elapsed:.2f} seeds/s, "
        f"{events / elapsed:,.0f} events/s); {len(failing)} failing"
        + (f": {[r.seed for r in failing]}" if failing else "")
    )
    print(
        f"duplicates: {duplicates:,} of {received:,} receipts"
        f" ({duplicates / max(1, received - duplicates):.4f} per message received),"
        f" at most {most:,} in one seed"
    )
    return 1 if failing else 0


def _run(seed: int, options: dict[str, object]) -> Result:
    if options.get("conversation"):
        rates = {name: float(options[name]) for name in ("loss", "duplicate", "reorder")}  # type: ignore[arg-type]
        faults = [name for name in ("crash", "partition") if options[name]]
        causal = bool(options["causal"])
        result = causal_conversation(
            seed,
            causal=causal,
            loss=rates["loss"],
            duplicate=rates["duplicate"],
            reorder=rates["reorder"],
            crash="crash" in faults,
            partition="partition" in faults,
        )
        words = [f"python -m simulation --seed {seed} --conversation"]
        words += [f"--{name} {rate}" for name, rate in rates.items()]
        words += [f"--faults {','.join(faults)}"] * bool(faults) + ["--no-causal-groups"] * (not causal)
        result.replay = " ".join(words)
        return result
    return run_seed(seed, **options)  # type: ignore[arg-type]


if __name__ == "__main__":
    raise SystemExit(main())
