"""What one message between two processes costs on this machine, per link runtime: the floor
under a cross-broker delivery, and the candidates for the brokers' gRPC links.

A sender process writes paced 100-byte messages (``--rate`` per second) to a receiver process on
loopback, one message per write, the way a forwarded message goes out when it is alone in its
event-loop iteration; the receiver takes the send time from the message (``perf_counter_ns``; one
clock for both processes on Linux). The links, interleaved within each round:

* ``tcp`` / ``tcp+uvloop``: an asyncio stream (``StreamWriter.write``) with no framing: what a
  wake-up and a loopback hop cost here, on the standard loop and on uvloop (the broker's loop);
* ``grpc.aio``: a bare bidirectional gRPC stream of bytes, plaintext (``call.write``/``read``):
  grpcio's C core with its own threads, nothing of SkipMQ;
* ``grpclib`` / ``grpclib+uvloop``: the same bare stream with grpclib (gRPC in Python over the
  ``h2`` HTTP/2 state machine, on the event loop's own thread);
* ``PeerLink``: SkipMQ's broker link as it is in this tree (``broker.adapters.transport.GrpcTransport``,
  plaintext, on uvloop like the broker), with overlay ``PING`` items as the messages (run the
  bench from an older checkout for an older link: ``bench/compare_revisions.py`` style).

Reported per link: one-way latency p50/p99, CPU per message of each process (utime+stime from
``/proc``, over the paced window, so the wake-ups between messages are in it) and its context
switches per message (summed over its threads, ``tools.proc_stats``): how many times a thread
went to sleep and was woken to move one message. Before the rounds, what one wake-up costs on
this machine: a byte sent back and forth between two processes over pipes.

``--throughput`` measures instead how many messages per second a link carries when the sender
writes as fast as the link takes them, ``--batch`` messages per write (one gRPC message holding
them, as the broker link batches its items into one ``Frame``), for ``--seconds``: received
messages/s and CPU per message at both ends.

    .venv/bin/python bench/link_floor_bench.py --rounds 3 --rate 100 --messages 600
    .venv/bin/python bench/link_floor_bench.py --rounds 3 --rate 1000 --messages 3000
    .venv/bin/python bench/link_floor_bench.py --rounds 3 --throughput --batch 64 --seconds 2
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from overlay.messages import PING
from tools.ports import free_ports
from tools.proc_stats import context_switches, cpu_s, wakeup_round_trip_us

HOST = "127.0.0.1"
MESSAGE_BYTES = 100
HEAD = struct.Struct("!q")  # perf_counter_ns at send
END_MARK = (1 << 63) - 1  # a throughput run's last message carries this instead of a time
METHOD = "/b.B/Open"
LINKS = ("tcp", "tcp+uvloop", "grpc.aio", "grpclib", "grpclib+uvloop", "PeerLink")
logging.getLogger("skipmq.transport").setLevel(logging.ERROR)

Write = Callable[[bytes], Awaitable[None]]


def _uses_uvloop(link: str) -> bool:
    return link.endswith("+uvloop") or link == "PeerLink"


def _run(link: str, main: Callable[[], Awaitable[Any]]) -> Any:
    if _uses_uvloop(link):
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


class _RawCodec:
    """grpclib codec passing the message bytes through (the content subtype a stock client sends)."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


# ---------------------------------------------------------------- receivers (one process each)
class _Counter:
    """What the receiver saw: one-way latencies, its switches over the paced window, the count and
    the time of the last message (throughput)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.latencies: list[int] = []
        self.switches: list[int] = []
        self.received = 0
        self.first_ns = 0
        self.last_ns = 0
        self.done = asyncio.Event()

    def took(self, data: bytes | memoryview) -> None:
        """One message (paced) or one batch of messages (throughput: ``count`` is 0)."""
        now = time.perf_counter_ns()
        if self.count == 0:
            if len(data) == MESSAGE_BYTES and HEAD.unpack_from(data)[0] == 0:
                return  # the warm-up message
            self.received += len(data) // MESSAGE_BYTES
            if not self.first_ns:
                self.first_ns = now
            self.last_ns = now
            if HEAD.unpack_from(data, len(data) - MESSAGE_BYTES)[0] == END_MARK:
                self.done.set()
            return
        sent_ns = HEAD.unpack_from(data)[0]
        if sent_ns == 0:  # the warm-up message (opens the link before the window)
            return
        self.latencies.append(now - sent_ns)
        # from the first message to the last, while every thread of the link is alive (a thread
        # that ends takes its count with it): the switches of count - 1 messages
        if len(self.latencies) == 1 or len(self.latencies) >= self.count:
            self.switches.append(context_switches(os.getpid()))
        if len(self.latencies) >= self.count:
            self.done.set()


async def _receive(link: str, port: int, counter: _Counter, ready: Any) -> None:
    if link.startswith("tcp"):
        size = MESSAGE_BYTES

        async def on_client(reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
            nonlocal size
            if counter.count == 0:  # throughput: a 4-byte batch size first
                size = int.from_bytes(await reader.readexactly(4), "big") * MESSAGE_BYTES
            while not counter.done.is_set():
                counter.took(await reader.readexactly(size))

        server = await asyncio.start_server(on_client, HOST, port)
        ready.set()
        await counter.done.wait()
        server.close()
    elif link == "grpc.aio":
        import grpc

        async def handler(requests: Any, _context: Any) -> Any:
            async for data in requests:
                counter.took(data)
                if counter.done.is_set():
                    yield b"done"
                    return

        server = grpc.aio.server()
        method = grpc.stream_stream_rpc_method_handler(handler)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b.B", {"Open": method}),))
        server.add_insecure_port(f"{HOST}:{port}")
        await server.start()
        ready.set()
        await counter.done.wait()
        await server.stop(grace=0.5)
    elif link.startswith("grpclib"):
        from grpclib.const import Cardinality, Handler
        from grpclib.server import Server

        class Service:
            def __mapping__(self) -> dict[str, Handler]:
                return {METHOD: Handler(self.open, Cardinality.STREAM_STREAM, None, None)}

            async def open(self, stream: Any) -> None:
                async for data in stream:
                    counter.took(data)
                    if counter.done.is_set():
                        await stream.send_message(b"done")
                        return

        server_ = Server([Service()], codec=_RawCodec())  # type: ignore[arg-type]
        await server_.start(HOST, port)
        ready.set()
        await counter.done.wait()
        await asyncio.sleep(0.05)
        server_.close()
    else:
        from broker.adapters.transport import GrpcTransport

        def on_receive(_peer: str, item: object) -> None:
            if isinstance(item, PING):
                counter.took(HEAD.pack(item.nonce) + b"p" * (MESSAGE_BYTES - HEAD.size))

        transport = GrpcTransport(advertise_host=HOST, on_receive=on_receive, on_peer_down=lambda _p: None)
        await transport.start(HOST, port)
        ready.set()
        await counter.done.wait()
        await transport.stop(0.5)


def _receiver_main(link: str, port: int, count: int, ready: Any, result: Any) -> None:
    counter = _Counter(count)

    async def main() -> None:
        await _receive(link, port, counter, ready)

    _run(link, main)
    if count:
        switches = (counter.switches[-1] - counter.switches[0]) / max(1, count - 1)
        result.put((counter.latencies, switches))
    else:
        result.put((counter.received, (counter.last_ns - counter.first_ns) / 1e9))


# ---------------------------------------------------------------- sender (a process of its own)
async def _with_link(link: str, port: int, batch: int, body: Callable[[Write], Awaitable[None]]) -> None:
    """Open ``link`` to the receiver on ``port`` and run ``body`` with its write function."""
    if link.startswith("tcp"):
        _reader, writer = await asyncio.open_connection(HOST, port)
        if batch:
            writer.write(batch.to_bytes(4, "big"))

        async def tcp_write(data: bytes) -> None:
            writer.write(data)
            if batch:
                await writer.drain()

        await body(tcp_write)
        await writer.drain()
        writer.close()
    elif link == "grpc.aio":
        import grpc

        channel = grpc.aio.insecure_channel(f"{HOST}:{port}")
        call = channel.stream_stream(METHOD)()
        await body(call.write)
        await call.done_writing()
        await channel.close()
    elif link.startswith("grpclib"):
        from grpclib.client import Channel
        from grpclib.const import Cardinality

        channel_ = Channel(HOST, port, codec=_RawCodec())  # type: ignore[arg-type]
        async with channel_.request(METHOD, Cardinality.STREAM_STREAM, None, None) as stream:  # type: ignore[arg-type]
            await stream.send_request()
            await body(stream.send_message)
            await stream.end()
            await stream.recv_message()
        channel_.close()
    else:
        from broker.adapters.transport import GrpcTransport

        sender = GrpcTransport(
            advertise_host=HOST, on_receive=lambda _p, _i: None, on_peer_down=lambda _p: None
        )
        (own_port,) = free_ports(1)
        await sender.start(HOST, own_port)
        peer = f"{HOST}:{port}"

        async def item_write(data: bytes) -> None:
            for offset in range(0, len(data), MESSAGE_BYTES):
                sender.send(peer, PING(HEAD.unpack_from(data, offset)[0] & ((1 << 63) - 1)))
            if batch:  # throughput: let the transport's drain task take the batch
                while sender.queued(peer) > batch:
                    await asyncio.sleep(0)

        await body(item_write)
        await asyncio.sleep(0.2)
        await sender.stop(0.5)


async def _warm_up(write: Write, ready: Any, go: Any) -> None:
    """One message that opens the link (not counted), then wait for the measurement to start."""
    await write(HEAD.pack(0) + b"p" * (MESSAGE_BYTES - HEAD.size))
    await asyncio.sleep(0.3)
    ready.set()
    while not go.is_set():
        await asyncio.sleep(0.01)


def _sender_main(link: str, port: int, rate: float, count: int, ready: Any, go: Any, result: Any) -> None:
    """Paced: send ``count`` messages at ``rate``; puts this process's context switches."""
    interval_ns = int(1e9 / rate)
    pad = b"p" * (MESSAGE_BYTES - HEAD.size)
    switches = [0]

    async def paced(write: Write) -> None:
        await _warm_up(write, ready, go)
        switches[0] = -context_switches(os.getpid())
        start = time.perf_counter_ns()
        for n in range(count):
            delay_ns = start + n * interval_ns - time.perf_counter_ns()
            if delay_ns > 0:
                await asyncio.sleep(delay_ns / 1e9)
            await write(HEAD.pack(time.perf_counter_ns()) + pad)
        switches[0] += context_switches(os.getpid())  # before the link closes (its threads may end)

    async def main() -> None:
        await _with_link(link, port, 0, paced)

    _run(link, main)
    result.put(switches[0])


def _bulk_sender_main(
    link: str, port: int, batch: int, seconds: float, ready: Any, go: Any, result: Any
) -> None:
    """Throughput: write batches of ``batch`` messages as fast as the link takes them."""
    pad = b"p" * (MESSAGE_BYTES - HEAD.size)
    message = HEAD.pack(1) + pad
    sent = [0]

    async def bulk(write: Write) -> None:
        await _warm_up(write, ready, go)
        data = message * batch
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            await write(data)
            sent[0] += batch
        await write(message * (batch - 1) + HEAD.pack(END_MARK) + pad)
        sent[0] += batch

    async def main() -> None:
        await _with_link(link, port, batch, bulk)

    _run(link, main)
    result.put(sent[0])


def _start_receiver(link: str, count: int) -> tuple[Any, Any, int]:
    (port,) = free_ports(1)
    context = multiprocessing.get_context("spawn")
    ready, result = context.Event(), context.Queue()
    receiver = context.Process(target=_receiver_main, args=(link, port, count, ready, result))
    receiver.start()
    if not ready.wait(20):
        receiver.kill()
        raise RuntimeError(f"{link} receiver did not start")
    return receiver, result, port


def measure(link: str, rate: float, count: int) -> dict[str, Any]:
    receiver, result, port = _start_receiver(link, count)
    context = multiprocessing.get_context("spawn")
    own_result, sender_ready, go = context.Queue(), context.Event(), context.Event()
    sender = context.Process(
        target=_sender_main, args=(link, port, rate, count, sender_ready, go, own_result)
    )
    sender.start()
    assert receiver.pid is not None and sender.pid is not None
    if not sender_ready.wait(30):
        raise RuntimeError(f"{link} sender did not connect")
    own_before, peer_before = cpu_s(sender.pid), cpu_s(receiver.pid)
    go.set()
    received, peer_switches_per_message = result.get(timeout=120)
    own_after, peer_after = cpu_s(sender.pid), cpu_s(receiver.pid)
    own_switches = own_result.get(timeout=30)
    sender.join(10)
    receiver.join(10)
    latencies = sorted(received)
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


def measure_throughput(link: str, batch: int, seconds: float) -> dict[str, Any]:
    receiver, result, port = _start_receiver(link, 0)
    context = multiprocessing.get_context("spawn")
    own_result, sender_ready, go = context.Queue(), context.Event(), context.Event()
    sender = context.Process(
        target=_bulk_sender_main, args=(link, port, batch, seconds, sender_ready, go, own_result)
    )
    sender.start()
    assert receiver.pid is not None and sender.pid is not None
    if not sender_ready.wait(30):
        raise RuntimeError(f"{link} sender did not connect")
    own_before, peer_before = cpu_s(sender.pid), cpu_s(receiver.pid)
    go.set()
    received, elapsed_s = result.get(timeout=120)
    own_after, peer_after = cpu_s(sender.pid), cpu_s(receiver.pid)
    own_result.get(timeout=30)
    sender.join(10)
    receiver.join(10)
    return {
        "link": link,
        "messages_per_s": received / max(elapsed_s, 1e-9),
        "sender_cpu_us": (own_after - own_before) * 1e6 / max(1, received),
        "receiver_cpu_us": (peer_after - peer_before) * 1e6 / max(1, received),
    }


def _medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.median(row[key] for row in rows) for key in rows[0] if key != "link"}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second (default 1000)")
    parser.add_argument("--messages", type=int, default=3000, help="messages per measurement (default 3000)")
    parser.add_argument(
        "--links", default=",".join(LINKS), help=f"comma-separated subset of {', '.join(LINKS)}"
    )
    parser.add_argument("--throughput", action="store_true", help="throughput with batching instead of paced")
    parser.add_argument("--batch", type=int, default=64, help="messages per write with --throughput (64)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per --throughput run (2)")
    args = parser.parse_args()
    links = tuple(link for link in args.links.split(",") if link)
    wakeup_us = wakeup_round_trip_us()
    print(f"a byte back and forth between two processes (two wake-ups): {wakeup_us:.0f} us", flush=True)
    rows: dict[str, list[dict[str, Any]]] = {link: [] for link in links}
    for round_ in range(args.rounds):
        order = links[round_ % len(links) :] + links[: round_ % len(links)]
        for link in order:
            if args.throughput:
                row = measure_throughput(link, args.batch, args.seconds)
                print(
                    f"round {round_ + 1}/{args.rounds} {link:24}: {row['messages_per_s']:,.0f} msg/s;"
                    f" CPU/message sender {row['sender_cpu_us']:.1f} us,"
                    f" receiver {row['receiver_cpu_us']:.1f} us [load {os.getloadavg()[0]:.1f}]",
                    flush=True,
                )
            else:
                row = measure(link, args.rate, args.messages)
                print(
                    f"round {round_ + 1}/{args.rounds} {link:24}: one-way p50 {row['p50_us']:.0f}"
                    f" p99 {row['p99_us']:.0f} us;"
                    f" CPU/message sender {row['sender_cpu_us']:.0f} us,"
                    f" receiver {row['receiver_cpu_us']:.0f} us;"
                    f" context switches/message sender {row['sender_switches']:.1f},"
                    f" receiver {row['receiver_switches']:.1f}"
                    f" [load {os.getloadavg()[0]:.1f}]",
                    flush=True,
                )
            rows[link].append(row)
    if args.throughput:
        print(f"\nthroughput, {args.batch} messages of {MESSAGE_BYTES} bytes per write,", end=" ")
        print(f"medians of {args.rounds} rounds\n")
        print("| link | messages/s | sender CPU/message (us) | receiver CPU/message (us) |")
        print("|---|---:|---:|---:|")
        for link in links:
            med = {
                key: statistics.median(r[key] for r in rows[link]) for key in rows[link][0] if key != "link"
            }
            print(
                f"| {link} | {med['messages_per_s']:,.0f} | {med['sender_cpu_us']:.1f} |"
                f" {med['receiver_cpu_us']:.1f} |"
            )
        return
    print(f"\n{args.rate:.0f} msg/s, {args.messages} messages, medians of {args.rounds} rounds;")
    print(f"a round trip between two processes (two wake-ups): {wakeup_us:.0f} us\n")
    print(
        "| link | one-way p50 (us) | p99 (us) | sender CPU/message (us) | receiver CPU/message (us) |"
        " sender context switches/message | receiver context switches/message |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for link in links:
        med = _medians(rows[link])
        print(
            f"| {link} | {med['p50_us']:.0f} | {med['p99_us']:.0f} | {med['sender_cpu_us']:.0f} |"
            f" {med['receiver_cpu_us']:.0f} | {med['sender_switches']:.1f} | {med['receiver_switches']:.1f} |"
        )


if __name__ == "__main__":
    main()
