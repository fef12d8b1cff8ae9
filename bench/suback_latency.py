"""What a persistent session's SUBACK costs with ``cluster.replicas`` (docs/cluster.md, Replicas):
SUBSCRIBE -> SUBACK with replicas 1 and 2 side by side, on 3-broker clusters on loopback (run by
hand; docs/notes/replication.md). With replicas 2 the SUBACK of a persistent session waits until
the session's state with the subscription is on 2 brokers (the session flush, at most every
50 ms, then the holder's commit and acceptance); a clean session's SUBACK never waits for a copy.

Per variant and round: ``--count`` SUBSCRIBEs, one at a time, each to a new filter of an already
joined class (so the overlay's class join is not in the figure), by a persistent client (MQTT
3.1.1 clean session 0) and by a clean one, on broker 1. Rounds alternate the variants' order;
the report gives per-variant medians of p50 / p99 over rounds and the load average.

    .venv/bin/python bench/suback_latency.py --rounds 3 --count 40
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.replication_bench import Client, connect, percentile, subscribe_packet  # noqa: E402
from tools.launcher import LocalCluster, start_cluster  # noqa: E402


async def suback_ms(client: Client, topic_filter: str, packet_id: int) -> float:
    client.subacked.clear()
    sent = time.perf_counter()
    client.send(subscribe_packet(topic_filter, packet_id, qos=1))
    await asyncio.wait_for(client.subacked.wait(), 30)
    return (time.perf_counter() - sent) * 1000


async def run(args: argparse.Namespace) -> int:
    clusters: dict[int, LocalCluster] = {}
    clients: dict[tuple[int, bool], Client] = {}
    try:
        for replicas in (1, 2):
            print(f"starting a 3-broker cluster with cluster.replicas = {replicas}", flush=True)
            cluster = clusters[replicas] = start_cluster(3, settings={"cluster.replicas": str(replicas)})
            b1 = cluster.brokers[1]
            for persistent in (True, False):
                client = await connect(
                    b1.mqtt_port, b1.host, f"suback-{replicas}-{persistent}", not persistent
                )
                await suback_ms(client, f"sb/{persistent}/warm", 1)  # the class joins here
                clients[(replicas, persistent)] = client
        figures: dict[tuple[int, bool], list[tuple[float, float]]] = {key: [] for key in clients}
        packet_id = 1
        for round_no in range(args.rounds):
            order = sorted(clients, reverse=bool(round_no % 2))
            for key in order:
                values = []
                for n in range(args.count):
                    packet_id = packet_id % 65535 + 1
                    values.append(await suback_ms(clients[key], f"sb/{key[1]}/{round_no}/{n}", packet_id))
                figures[key].append((percentile(values, 0.5), percentile(values, 0.99)))
                print(
                    f"round {round_no + 1} replicas {key[0]} {'persistent' if key[1] else 'clean'}:"
                    f" p50 {percentile(values, 0.5):.2f} ms, p99 {percentile(values, 0.99):.2f} ms,"
                    f" load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        print(f"machine: nproc {os.cpu_count()}; medians over {args.rounds} rounds of {args.count}:")
        for key, rows in sorted(figures.items()):
            p50 = statistics.median(row[0] for row in rows)
            p99 = statistics.median(row[1] for row in rows)
            kind = "persistent" if key[1] else "clean"
            print(f"  replicas {key[0]} {kind:10}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    finally:
        for cluster in clusters.values():
            cluster.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (variants alternate their order)")
    parser.add_argument("--count", type=int, default=40, help="SUBSCRIBEs per variant and round")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
