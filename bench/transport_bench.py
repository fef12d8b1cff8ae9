"""The broker-to-broker link alone: round-trip latency and one-way throughput of
``broker.adapters.transport.GrpcTransport`` (grpc.aio bidirectional stream, issue #11), with mutual
TLS (the cluster default) and with plaintext links (``cluster.insecure = true``), side by side.

Two processes on loopback, each with a real ``GrpcTransport``: the client sends overlay ``PING``
items, the echo process answers each with a ``PONG`` (round trips, one at a time) or only counts
them (throughput: bursts of ``--burst`` items per event-loop iteration, the way the cluster engine
hands a burst of forwarded messages to the transport). CPU per item is utime+stime of both
processes over the window (``/proc``). Variants are interleaved within each round (the machine is
shared and noisy: read the ratios of one run).

    .venv/bin/python bench/transport_bench.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.adapters.transport import GrpcTransport
from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert, make_ca
from overlay.messages import PING, PONG
from tools.ports import free_ports
from tools.proc_stats import cpu_s

HOST = "127.0.0.1"
logging.getLogger("skipmq.transport").setLevel(logging.ERROR)
BULK = 1 << 40  # PING nonce of a throughput item (not answered) ...
END = 1 << 41  # ... and of the item ending a throughput run (answered with the count so far)


def _tls(ca_dir: str | None, peer_id: str) -> ClusterTls | None:
    if ca_dir is None:
        return None
    cert, key = issue_broker_cert(ca_dir, peer_id)
    return ClusterTls(TlsFiles(str(Path(ca_dir) / "ca.pem"), str(cert), str(key)))


def _echo_main(port: int, ca_dir: str | None, ready: Any) -> None:
    async def run() -> None:
        transport: GrpcTransport

        def on_receive(peer: str, item: object) -> None:
            if isinstance(item, PING) and item.nonce < BULK:
                transport.send(peer, PONG(item.nonce))
            elif isinstance(item, PING):  # a throughput item: answered only at the end of a run
                counted[0] += 1
                if item.nonce == END:
                    transport.send(peer, PONG(counted[0]))

        counted = [0]
        transport = GrpcTransport(
            advertise_host=HOST, on_receive=on_receive, on_peer_down=lambda peer: None,
            tls=_tls(ca_dir, f"{HOST}:{port}"),
        )  # fmt: skip
        await transport.start(HOST, port)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(run())


async def _measure(
    port: int, ca_dir: str | None, echo_pid: int, args: argparse.Namespace
) -> dict[str, float]:
    replies: asyncio.Queue[int] = asyncio.Queue()
    client_port = free_ports(1)[0]
    transport = GrpcTransport(
        advertise_host=HOST, on_receive=lambda peer, item: replies.put_nowait(getattr(item, "nonce", -9)),
        on_peer_down=lambda peer: None, tls=_tls(ca_dir, f"{HOST}:{client_port}"),
    )  # fmt: skip
    await transport.start(HOST, client_port)
    peer = f"{HOST}:{port}"
    try:
        for nonce in range(50):  # warm-up: link up, code paths hot
            transport.send(peer, PING(nonce))
            await asyncio.wait_for(replies.get(), 10.0)
        rtts = []
        for nonce in range(args.round_trips):
            started = time.perf_counter_ns()
            transport.send(peer, PING(nonce))
            await asyncio.wait_for(replies.get(), 10.0)
            rtts.append((time.perf_counter_ns() - started) / 1000.0)
        rtts.sort()
        cpu_before = cpu_s(os.getpid()) + cpu_s(echo_pid)
        started_s = time.perf_counter()
        sent = 0
        while sent < args.items:
            for _ in range(args.burst):
                transport.send(peer, PING(BULK))
            sent += args.burst
            while transport.queued(peer) > 4 * args.burst:
                await asyncio.sleep(0)
            await asyncio.sleep(0)
        transport.send(peer, PING(END))
        total = 0
        while total < sent + 1:  # the echo process counts cumulatively over runs of this variant
            total = await asyncio.wait_for(replies.get(), 30.0)
            if total >= sent + 1:
                break
        elapsed_s = time.perf_counter() - started_s
        used_cpu_s = cpu_s(os.getpid()) + cpu_s(echo_pid) - cpu_before
        return {
            "rtt_p50_us": statistics.median(rtts),
            "rtt_p99_us": rtts[int(0.99 * (len(rtts) - 1))],
            "items_per_s": (sent + 1) / elapsed_s,
            "cpu_us_per_item": used_cpu_s * 1e6 / (sent + 1),
        }
    finally:
        await transport.stop(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--round-trips", type=int, default=2000, help="PING/PONG round trips per run")
    parser.add_argument("--items", type=int, default=100_000, help="one-way items per throughput run")
    parser.add_argument("--burst", type=int, default=64, help="items handed over per event-loop iteration")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"plaintext": [], "mutual TLS": []}
    with tempfile.TemporaryDirectory(prefix="skipmq-transport-bench-") as tmp:
        make_ca(tmp)
        context = multiprocessing.get_context("spawn")
        echoes = {}
        for variant, ca_dir in (("plaintext", None), ("mutual TLS", tmp)):
            port = free_ports(1)[0]
            ready = context.Event()
            process = context.Process(target=_echo_main, args=(port, ca_dir, ready), daemon=True)
            process.start()
            if not ready.wait(30):
                raise SystemExit(f"transport_bench: the {variant} echo process did not start")
            echoes[variant] = (port, ca_dir, process)
        try:
            for round_index in range(args.rounds):
                order = list(echoes) if round_index % 2 == 0 else list(reversed(echoes))
                for variant in order:
                    port, ca_dir, process = echoes[variant]
                    assert process.pid is not None
                    result = asyncio.run(_measure(port, ca_dir, process.pid, args))
                    results[variant].append(result)
                    print(
                        f"round {round_index + 1}/{args.rounds} {variant:10s}:"
                        f" RTT p50 {result['rtt_p50_us']:.0f}"
                        f" p99 {result['rtt_p99_us']:.0f} us; {result['items_per_s']:,.0f} items/s,"
                        f" {result['cpu_us_per_item']:.2f} us CPU/item [load {os.getloadavg()[0]:.1f}]",
                        flush=True,
                    )
        finally:
            for _port, _ca, process in echoes.values():
                process.kill()
                process.join(5)
    print("\n| link | RTT p50 (us) | RTT p99 (us) | items/s | CPU us/item (both ends) |")
    print("|---|---:|---:|---:|---:|")
    medians = {}
    for variant, runs in results.items():
        medians[variant] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        m = medians[variant]
        print(
            f"| {variant} | {m['rtt_p50_us']:.0f} | {m['rtt_p99_us']:.0f} | {m['items_per_s']:,.0f}"
            f" | {m['cpu_us_per_item']:.2f} |"
        )
    tls, plain = medians["mutual TLS"], medians["plaintext"]
    print(
        f"\nTLS / plaintext: RTT p50 {tls['rtt_p50_us'] / plain['rtt_p50_us']:.2f}x,"
        f" items/s {tls['items_per_s'] / plain['items_per_s']:.2f}x,"
        f" CPU/item {tls['cpu_us_per_item'] / plain['cpu_us_per_item']:.2f}x"
        f" (medians of {args.rounds} rounds; load {os.getloadavg()[0]:.1f} at the end)"
    )


if __name__ == "__main__":
    main()
