"""What the cluster's metrics add per message, measured in isolation (run by hand; not part of CI).

    .venv/bin/python bench/metrics_overhead_bench.py [--repeat 7] [--number 200000]

The cluster benchmark (bench/cluster_bench.py, compared across revisions with
bench/compare_revisions.py) measures the whole broker, where these few operations drown in the
noise of a shared machine. Here each addition on the per-message path runs alone, side by side with
what it replaced, interleaved, best of ``--repeat`` rounds, in nanoseconds per call:

* the hop histogram: the old bucket loop (bounds 1,2,3,4,6,8,12,16) vs the new indexed bucket
  (one per hop count), for 1-hop and 5-hop deliveries;
* counting overlay messages by kind and picking 1 PUB in 8 for the round-trip histogram (what
  ``ClusterEngine._send`` / ``on_receive`` now do per overlay message), against a bare call;
* the sampled publish-confirm observation in ``StreamSender.done`` (7 of 8 publications: one AND).

Prints a markdown table; the figures go into docs/observability.md with the machine.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

from broker.cluster.stats import ClusterStats
from broker.core.stats import Histogram
from overlay.messages import PING, PUB

OLD_BOUNDS = (1, 2, 3, 4, 6, 8, 12, 16)


class OldHops:
    """``ClusterStats.observe_hops`` before the hop histogram and overlay counters were added."""

    def __init__(self) -> None:
        self.hop_counts = [0] * (len(OLD_BOUNDS) + 1)
        self.hop_sum = 0

    def observe_hops(self, hops: int) -> None:
        self.hop_sum += hops
        for index, bound in enumerate(OLD_BOUNDS):
            if hops <= bound:
                self.hop_counts[index] += 1
                return
        self.hop_counts[-1] += 1


def per_call_ns(func: Callable[[], None], number: int) -> float:
    """CPU time of this thread per call (not wall time: on a shared, loaded machine wall time
    counts the other jobs' turns too)."""
    started = time.thread_time_ns()
    for _ in range(number):
        func()
    return (time.thread_time_ns() - started) / number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=7, help="interleaved rounds; the best is reported")
    parser.add_argument("--number", type=int, default=200_000, help="calls per measurement")
    args = parser.parse_args(argv)

    old, new = OldHops(), ClusterStats()
    sent: dict[type, int] = {}
    round_trips: dict[tuple[str, int], float] = {}
    pub = PUB(("t", 0, "a"), (("t", 0, "b"), 1), "t", b"x", 1, (("t", 0, "b"), 1), 1, ("t",), ("u",), 16)
    ping = PING(3)
    histogram = Histogram((0.001, 0.01, 0.1, 1.0))

    def bare() -> None:
        return None

    def count(item: object) -> None:  # as ClusterEngine._send
        kind = type(item)
        try:
            sent[kind] += 1
        except KeyError:
            sent[kind] = 1
        if kind is PUB:
            ack_id = item.ack_id  # type: ignore[attr-defined]
            if ack_id and not ack_id & 7:
                round_trips[("b", ack_id)] = 0.0
        elif kind is PING:
            round_trips[("b", item.nonce)] = 0.0  # type: ignore[attr-defined]

    publication = [0]

    def confirm() -> None:
        publication[0] += 1
        if histogram is not None and not publication[0] & 7:
            histogram.observe(0.004)

    cases: dict[str, Callable[[], None]] = {
        "empty call (reference)": bare,
        "empty lambda call (reference of the lambdas below)": lambda: bare(),
        "hops, old loop, 1 hop": lambda: old.observe_hops(1),
        "hops, new index, 1 hop": lambda: new.observe_hops(1),
        "hops, old loop, 5 hops": lambda: old.observe_hops(5),
        "hops, new index, 5 hops": lambda: new.observe_hops(5),
        "count an overlay PUB by kind (+ 1-in-8 RTT pick)": lambda: count(pub),
        "count an overlay PING by kind (+ RTT)": lambda: count(ping),
        "publish-confirm sample (1 in 8 observed)": confirm,
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(args.repeat):
        for name, func in cases.items():
            best[name] = min(best[name], per_call_ns(func, args.number))
    machine = f"Python {platform.python_version()}, {platform.machine()}"
    print(f"{machine}, thread CPU time, best of {args.repeat} x {args.number} calls\n")
    print("| operation | ns per call |\n|---|---|")
    for name, value in best.items():
        print(f"| {name} | {value:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
