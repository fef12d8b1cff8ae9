"""What one message between two processes costs on this machine, without SkipMQ's cluster code:
the floor under a cross-broker delivery (issue #11).

A sender process writes paced 100-byte messages (``--rate`` per second) to a receiver process on
loopback, one message per write, the way a forwarded message goes out when it is alone in its
event-loop iteration; the receiver takes the send time from the message (``perf_counter_ns``; one
clock for both processes on Linux). Three links, interleaved within each round:

* ``tcp``: an asyncio stream (``StreamWriter.write``), no framing beyond a length prefix: what a
  wake-up and a loopback hop cost here;
* ``grpc.aio``: a bare bidirectional stream of bytes, plaintext (``call.write``/``read``), the
  library SkipMQ's links are built on, nothing of SkipMQ;
* ``GrpcTransport``: SkipMQ's broker link (``broker.adapters.transport``, plaintext), with overlay
  ``PING`` items as the messages.

Reported per link: one-way latency p50/p99, CPU per message of each process (utime+stime from
``/proc``, over the paced window, so the wake-ups between messages are in it) and its context
switches per message (summed over its threads, ``tools.proc_stats``): how many times a thread
went to sleep and was woken to move one message. Before the rounds, what one wake-up costs on this
machine: a byte sent back and forth between two processes over pipes. A cross-broker
delivery pays one such hop on top of two client hops (publisher -> its broker, a broker -> its
subscriber), so the single-broker path's p50 plus one hop is the floor of the cross-broker p50.

    .venv/bin/python bench/link_floor_bench.py --rounds 3 --rate 1000 --messages 3000
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.adapters.transport import GrpcTransport
from overlay.messages import PING
from tools.ports import free_ports
from tools.proc_stats import context_switches, cpu_s, wakeup_round_trip_us

HOST = "127.0.0.1"
MESSAGE_BYTES = 100
HEAD = struct.Struct("!q")  # perf_counter_ns at send
LINKS = ("tcp", "grpc.aio", "GrpcTransport")
logging.getLogger("skipmq.transport").setLevel(logging.ERROR)


# ---------------------------------------------------------------- receivers (one process each)
def _receiver_main(link: str, port: int, count: int, ready: Any, result: Any) -> None:
    latencies: list[int] = []
    done = asyncio.Event()
    # from the first message to the last, while every thread of the link is alive (a thread that
    # ends takes its count with it): the switches of count - 1 messages
    switches: list[int] = []

    def took(sent_ns: int) -> None:
        latencies.append(time.perf_counter_ns() - sent_ns)
        if len(latencies) == 1 or len(latencies) >= count:
            switches.append(context_switches(os.getpid()))
        if len(latencies) >= count:
            done.set()

    async def tcp() -> None:
        async def on_client(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
            while not done.is_set():
                data = await reader.readexactly(MESSAGE_BYTES)
                took(HEAD.unpack_from(data)[0])

        server = await asyncio.start_server(on_client, HOST, port)
        ready.set()
        await done.wait()
        server.close()

    async def bare_grpc() -> None:
        import grpc

        async def handler(requests: Any, _context: Any) -> Any:
            async for data in requests:
                took(HEAD.unpack_from(data)[0])
                if done.is_set():
                    yield b"done"
                    return

        server = grpc.aio.server()
        method = grpc.stream_stream_rpc_method_handler(handler)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b.B", {"Open": method}),))
        server.add_insecure_port(f"{HOST}:{port}")
        await server.start()
        ready.set()
        await done.wait()
        await server.stop(grace=0.5)

    async def transport() -> None:
        def on_receive(_peer: str, item: object) -> None:
            if isinstance(item, PING):
                took(item.nonce)

        link_ = GrpcTransport(advertise_host=HOST, on_receive=on_receive, on_peer_down=lambda _p: None)
        await link_.start(HOST, port)
        ready.set()
        await done.wait()
        await link_.stop(0.5)

    run = {"tcp": tcp, "grpc.aio": bare_grpc, "GrpcTransport": transport}[link]
    asyncio.run(run())
    result.put((latencies, (switches[-1] - switches[0]) / max(1, count - 1)))


# ---------------------------------------------------------------- sender (this process)
async def _send(link: str, port: int, rate: float, count: int) -> int:
    """Send ``count`` paced messages; returns this process's context switches while sending."""
    interval_ns = int(1e9 / rate)
    pad = b"p" * (MESSAGE_BYTES - HEAD.size)
    switches = 0

    async def paced(write: Any) -> None:
        nonlocal switches
        switches = -context_switches(os.getpid())
        start = time.perf_counter_ns()
        for n in range(count):
            delay_ns = start + n * interval_ns - time.perf_counter_ns()
            if delay_ns > 0:
                await asyncio.sleep(delay_ns / 1e9)
            await write(HEAD.pack(time.perf_counter_ns()) + pad)
        switches += context_switches(os.getpid())  # before the link closes (its threads may end)

    if link == "tcp":
        _reader, writer = await asyncio.open_connection(HOST, port)

        async def tcp_write(data: bytes) -> None:
            writer.write(data)

        await paced(tcp_write)
        await writer.drain()
        writer.close()
    elif link == "grpc.aio":
        import grpc

        channel = grpc.aio.insecure_channel(f"{HOST}:{port}")
        call = channel.stream_stream("/b.B/Open")()
        await paced(call.write)
        await call.done_writing()
        await channel.close()
    else:
        sender = GrpcTransport(
            advertise_host=HOST, on_receive=lambda _p, _i: None, on_peer_down=lambda _p: None
        )
        (own_port,) = free_ports(1)
        await sender.start(HOST, own_port)
        peer = f"{HOST}:{port}"

        async def item_write(data: bytes) -> None:
            sender.send(peer, PING(HEAD.unpack_from(data)[0]))

        await paced(item_write)
        await asyncio.sleep(0.2)
        await sender.stop(0.5)
    return switches


def measure(link: str, rate: float, count: int) -> dict[str, Any]:
    (port,) = free_ports(1)
    context = multiprocessing.get_context("spawn")
    ready, result = context.Event(), context.Queue()
    receiver = context.Process(target=_receiver_main, args=(link, port, count, ready, result))
    receiver.start()
    if not ready.wait(20):
        receiver.kill()
        raise RuntimeError(f"{link} receiver did not start")
    assert receiver.pid is not None
    own_before, peer_before = cpu_s(os.getpid()), cpu_s(receiver.pid)
    own_switches = asyncio.run(_send(link, port, rate, count))
    received, peer_switches_per_message = result.get(timeout=60)
    latencies = sorted(received)
    own_after, peer_after = cpu_s(os.getpid()), cpu_s(receiver.pid)
    receiver.join(10)
    return {
        "link": link,
        "received": len(latencies),
        "p50_us": latencies[len(latencies) // 2] / 1e3,
        "p99_us": latencies[int(len(latencies) * 0.99)] / 1e3,
        "sender_cpu_us": (own_after - own_before) * 1e6 / count,
        "receiver_cpu_us": (peer_after - peer_before) * 1e6 / count,
        "sender_switches": own_switches / count,
        "receiver_switches": peer_switches_per_message,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second (default 1000)")
    parser.add_argument("--messages", type=int, default=3000, help="messages per measurement (default 3000)")
    args = parser.parse_args()
    wakeup_us = wakeup_round_trip_us()
    print(f"a byte back and forth between two processes (two wake-ups): {wakeup_us:.0f} us", flush=True)
    rows: dict[str, list[dict[str, Any]]] = {link: [] for link in LINKS}
    for round_ in range(args.rounds):
        order = LINKS[round_ % len(LINKS) :] + LINKS[: round_ % len(LINKS)]
        for link in order:
            row = measure(link, args.rate, args.messages)
            rows[link].append(row)
            print(
                f"round {round_ + 1}/{args.rounds} {link:13}: one-way p50 {row['p50_us']:.0f}"
                f" p99 {row['p99_us']:.0f} us;"
                f" CPU/message sender {row['sender_cpu_us']:.0f} us,"
                f" receiver {row['receiver_cpu_us']:.0f} us;"
                f" context switches/message sender {row['sender_switches']:.1f},"
                f" receiver {row['receiver_switches']:.1f}"
                f" [load {os.getloadavg()[0]:.1f}]",
                flush=True,
            )
    print(f"\n{args.rate:.0f} msg/s, {args.messages} messages, medians of {args.rounds} rounds;")
    print(f"a round trip between two processes (two wake-ups): {wakeup_us:.0f} us\n")
    print(
        "| link | one-way p50 (us) | p99 (us) | sender CPU/message (us) | receiver CPU/message (us) |"
        " sender context switches/message | receiver context switches/message |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for link in LINKS:
        med = {key: statistics.median(r[key] for r in rows[link]) for key in rows[link][0] if key != "link"}
        print(
            f"| {link} | {med['p50_us']:.0f} | {med['p99_us']:.0f} | {med['sender_cpu_us']:.0f} |"
            f" {med['receiver_cpu_us']:.0f} | {med['sender_switches']:.1f} | {med['receiver_switches']:.1f} |"
        )


if __name__ == "__main__":
    main()
