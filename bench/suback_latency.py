"""What a persistent session's SUBACK and UNSUBACK cost with ``cluster.replicas`` (docs/cluster.md,
Replicas): SUBSCRIBE -> SUBACK and UNSUBSCRIBE -> UNSUBACK with replicas 1 and 2 side by side, on
3-broker clusters on loopback (run by hand; docs/notes/replication.md). With replicas 2 the SUBACK
and UNSUBACK of a persistent session wait until the session's state with (without) the
subscription is on 2 brokers (given to the holders at once, then the holder's commit and
acceptance); a clean session's never wait for a copy.

Per variant and round: ``--count`` SUBSCRIBEs, one at a time, each to a new filter of an already
joined class (so the overlay's class join is not in the figure), each followed by the UNSUBSCRIBE
of that filter, by a persistent client (MQTT 3.1.1 clean session 0) and by a clean one, on broker
1. Rounds alternate the variants' order; the report gives per-variant medians of p50 / p99 over
rounds and the load average.

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

from bench.replication_bench import (  # noqa: E402
    Client,
    _remaining_length,
    _string,
    connect,
    percentile,
    subscribe_packet,
)
from tools.launcher import LocalCluster, start_cluster  # noqa: E402

UNSUBACK = 0xB0


class _Unsubacks:
    """Sets ``unsubacked`` when an UNSUBACK arrives (the client's own parser ignores it)."""

    def __init__(self, client: Client) -> None:
        self.event = asyncio.Event()
        received = client.data_received

        def data_received(data: bytes) -> None:
            # an UNSUBACK is 4 bytes (3.1.1: 0xB0 0x02 id id) and comes alone while nothing else
            # flows to this client: its first byte is enough
            if data[:1] == bytes((UNSUBACK,)):
                self.event.set()
                data = data[4:]
            if data:
                received(data)

        client.data_received = data_received  # type: ignore[method-assign]


def unsubscribe_packet(topic_filter: str, packet_id: int) -> bytes:
    body = packet_id.to_bytes(2, "big") + _string(topic_filter)
    return b"\xa2" + _remaining_length(len(body)) + body


async def suback_ms(client: Client, topic_filter: str, packet_id: int) -> float:
    client.subacked.clear()
    sent = time.perf_counter()
    client.send(subscribe_packet(topic_filter, packet_id, qos=1))
    await asyncio.wait_for(client.subacked.wait(), 30)
    return (time.perf_counter() - sent) * 1000


async def unsuback_ms(client: Client, unsubacks: _Unsubacks, topic_filter: str, packet_id: int) -> float:
    unsubacks.event.clear()
    sent = time.perf_counter()
    client.send(unsubscribe_packet(topic_filter, packet_id))
    await asyncio.wait_for(unsubacks.event.wait(), 30)
    return (time.perf_counter() - sent) * 1000


async def run(args: argparse.Namespace) -> int:
    clusters: dict[int, LocalCluster] = {}
    clients: dict[tuple[int, bool], Client] = {}
    unsubacks: dict[tuple[int, bool], _Unsubacks] = {}
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
                unsubacks[(replicas, persistent)] = _Unsubacks(client)
        figures: dict[tuple[int, bool, str], list[tuple[float, float]]] = {
            (*key, ack): [] for key in clients for ack in ("SUBACK", "UNSUBACK")
        }
        packet_id = 1
        for round_no in range(args.rounds):
            order = sorted(clients, reverse=bool(round_no % 2))
            for key in order:
                values: dict[str, list[float]] = {"SUBACK": [], "UNSUBACK": []}
                for n in range(args.count):
                    topic_filter = f"sb/{key[1]}/{round_no}/{n}"
                    packet_id = packet_id % 65535 + 1
                    values["SUBACK"].append(await suback_ms(clients[key], topic_filter, packet_id))
                    packet_id = packet_id % 65535 + 1
                    values["UNSUBACK"].append(
                        await unsuback_ms(clients[key], unsubacks[key], topic_filter, packet_id)
                    )
                for ack, acks in values.items():
                    figures[(*key, ack)].append((percentile(acks, 0.5), percentile(acks, 0.99)))
                    print(
                        f"round {round_no + 1} replicas {key[0]} {'persistent' if key[1] else 'clean'}"
                        f" {ack}: p50 {percentile(acks, 0.5):.2f} ms, p99 {percentile(acks, 0.99):.2f} ms,"
                        f" load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
        print(f"machine: nproc {os.cpu_count()}; medians over {args.rounds} rounds of {args.count}:")
        for (replicas, persistent, ack), rows in sorted(figures.items()):
            p50 = statistics.median(row[0] for row in rows)
            p99 = statistics.median(row[1] for row in rows)
            kind = "persistent" if persistent else "clean"
            print(f"  replicas {replicas} {kind:10} {ack:8}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    finally:
        for cluster in clusters.values():
            cluster.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (variants alternate their order)")
    parser.add_argument(
        "--count", type=int, default=40, help="SUBSCRIBEs (each then UNSUBSCRIBEd) per variant and round"
    )
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
