"""Resends and stalls of the reliable streams under loss, counted in the whole-cluster simulation.

    python bench/cluster_resends_bench.py --seeds 1:4 --loss 0.02

One publisher broker streams QoS 1 messages on one class to subscribers on every other broker (5
brokers by default); one subscriber (clean session) leaves half-way. Virtual time, so the figures
do not depend on the machine's load. Printed per seed: the stalls a staying subscriber saw (gaps
over 0.3 s between two receipts while the stream ran), and the streams' counters summed over the
brokers (resent, republished, RETs sent, duplicates dropped). Issue #10, docs/cluster.md
"Resends under loss".
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

from simulation.network import NetworkConfig
from simulation.scenario import Run, Scenario, _subscribe_once


def run_one(seed: int, brokers: int, loss: float, messages: int, interval_s: float) -> str:
    run = Run(
        seed, Scenario(brokers=brokers, quiet_s=15.0, title="resends", network=NetworkConfig(loss_rate=loss))
    )
    peers = run.peer_ids
    run.start_brokers()
    run.add_client("pub", peers[0], persistent=False)
    leaver = f"s{len(peers) - 2}"
    for index, home in enumerate(peers[1:]):
        client_id = f"s{index}"
        client = run.add_client(client_id, home, persistent=client_id != leaver)
        client.on_connack = _subscribe_once("r/x")
        run.world.at(2.5 + 0.05 * index, run.connect, client_id)
    run.world.at(2.0, run.connect, "pub")
    start_s = 5.0
    end_s = start_s + messages * interval_s
    run.publish_stream("pub", messages, interval_s, start_s, "r/x")
    run.world.at(start_s + messages * interval_s / 2, run.clients[leaver].disconnect)
    result = run.finish(end_s=end_s + 15.0)
    receipts: dict[str, list[float]] = {}
    for event in result.history.events:
        if event[1] == "receive" and event[2] != leaver:
            receipts.setdefault(str(event[2]), []).append(float(event[0]))  # type: ignore[arg-type]
    stalls = [
        b - a
        for times in receipts.values()
        for a, b in itertools.pairwise(times)
        if b - a > 0.3 and a < end_s
    ]
    totals = {"resent": 0, "republished": 0, "rets": 0, "duplicates": 0}
    for sim in run.brokers.values():
        stats = sim.engine.stats
        totals["resent"] += stats.resent
        totals["republished"] += stats.republished
        totals["rets"] += stats.rets_sent
        totals["duplicates"] += stats.duplicates_dropped
    lost = [v for v in result.violations if leaver not in v.detail]
    return (
        f"seed {seed}: stalls>0.3s {len(stalls)} total {sum(stalls):.1f} s "
        f"max {max(stalls, default=0):.2f} s; "
        + ", ".join(f"{k} {v}" for k, v in totals.items())
        + f"; violations {len(lost)}"
    )


def main() -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="1:4", help="START:STOP (1:4)")
    parser.add_argument("--brokers", type=int, default=5)
    parser.add_argument("--loss", type=float, default=0.02, help="loss rate of every link (0.02)")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    args = parser.parse_args()
    start, _, stop = args.seeds.partition(":")
    for seed in range(int(start), int(stop)):
        print(run_one(seed, args.brokers, args.loss, args.messages, args.interval_ms / 1000.0), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
