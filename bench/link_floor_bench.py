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
* ``h2+uvloop``: the smallest gRPC stream of our own on the ``h2`` library (the HTTP/2 state
  machine grpclib uses) on uvloop: a message is taken from ``data_received`` itself, no queue and
  no task between the socket and the receiver, one ``transport.write`` per message: what a gRPC
  layer of our own over h2 would cost (headers and flow control as a stock peer needs them);
* ``h2-lean+uvloop``: the same, but DATA frames are written and read by hand (a 9-byte frame
  header in front of the gRPC message; ``h2`` still does the preface, settings and headers): the
  floor of a gRPC layer with HTTP/2 framing of our own on the hot path;
* ``PeerLink``: SkipMQ's broker link as it is in this tree (``broker.adapters.transport.GrpcTransport``,
  plaintext, on uvloop like the broker) on the ``grpcio`` runtime (grpc.aio), with overlay
  ``PING`` items as the messages (run the bench from an older checkout for an older link:
  ``bench/compare_revisions.py`` style);
* ``PeerLink-h2``: the same broker link on the ``h2`` runtime (``cluster.link_runtime = h2``,
  broker/adapters/transport/h2_runtime.py: DATA frames written and parsed by hand, frames
  delivered from ``data_received``).

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

Size: one runnable script with its two processes (receiver, sender) and every candidate link side
by side, so that a round runs them on one footing. The split it would take: the two gRPC streams
of our own on ``h2`` (``_H2*``, ~185 lines) into their own module.
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
LINKS = (
    "tcp",
    "tcp+uvloop",
    "grpc.aio",
    "grpclib",
    "grpclib+uvloop",
    "h2+uvloop",
    "h2-lean+uvloop",
    "PeerLink",
    "PeerLink-h2",
)
logging.getLogger("skipmq.transport").setLevel(logging.ERROR)

Write = Callable[[bytes], Awaitable[None]]


def _uses_uvloop(link: str) -> bool:
    return link.endswith("+uvloop") or link.startswith("PeerLink")


def _peer_link_config(link: str) -> Any:
    """``PeerLink``: the broker link on grpc.aio; ``PeerLink-h2``: on SkipMQ's own h2 runtime."""
    from broker.adapters.transport import TransportConfig

    return TransportConfig(runtime="h2" if link == "PeerLink-h2" else "grpcio")


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


# ---------------------------------------------------------------- a gRPC stream of our own on h2
_H2_WINDOW = 16 * 1024 * 1024


class _H2Receiver(asyncio.Protocol):
    """Server side of one bare gRPC stream on ``h2``: answers the request headers, hands each
    length-prefixed message to ``on_message`` from ``data_received``, returns the window."""

    def __init__(self, on_message: Callable[[bytes], None]) -> None:
        import h2.config
        import h2.connection

        self.on_message = on_message
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        import h2.settings

        self.transport: Any = transport
        self.h2.initiate_connection()
        self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _H2_WINDOW})
        self.h2.increment_flow_control_window(_H2_WINDOW)
        self.transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        import h2.events

        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
                self.h2.send_headers(event.stream_id, headers)
            elif isinstance(event, h2.events.DataReceived):
                buffer = self.buffer
                buffer += event.data
                while len(buffer) >= 5:
                    size = int.from_bytes(buffer[1:5], "big")
                    if len(buffer) < 5 + size:
                        break
                    self.on_message(bytes(buffer[5 : 5 + size]))
                    del buffer[: 5 + size]
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.h2.send_headers(event.stream_id, [(b"grpc-status", b"0")], end_stream=True)
        out = self.h2.data_to_send()
        if out:
            self.transport.write(out)


class _H2Sender(asyncio.Protocol):
    """Client side: opens ``/b.B/Open`` and writes each message as one DATA frame (waiting for
    the peer's window when it is spent: HTTP/2 flow control)."""

    def __init__(self) -> None:
        import h2.config
        import h2.connection

        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.window_open = asyncio.Event()
        self.stream_id = 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.h2.initiate_connection()
        self.transport.write(self.h2.data_to_send())

    async def open(self) -> None:
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", METHOD.encode()),
            (b":authority", HOST.encode()),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
        self.h2.send_headers(self.stream_id, headers)
        self.transport.write(self.h2.data_to_send())

    async def write(self, data: bytes) -> None:
        message = b"\x00" + len(data).to_bytes(4, "big") + data
        while self.h2.local_flow_control_window(self.stream_id) < len(message):
            self.window_open.clear()
            await self.window_open.wait()
        self.h2.send_data(self.stream_id, message)
        self.transport.write(self.h2.data_to_send())

    def end(self) -> None:
        self.h2.end_stream(self.stream_id)
        self.transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        self.h2.receive_data(data)  # settings, window updates, the answer headers
        self.window_open.set()
        out = self.h2.data_to_send()
        if out:
            self.transport.write(out)


_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA = 0
_WINDOW_UPDATE = 8


class _H2LeanReceiver(_H2Receiver):
    """Frames split by hand: DATA frames are read here, every other frame goes to ``h2``; the
    window is returned by hand (WINDOW_UPDATE for the connection and the stream) per MiB read."""

    def __init__(self, on_message: Callable[[bytes], None]) -> None:
        super().__init__(on_message)
        self.raw = bytearray()
        self.preface = True
        self.consumed = 0

    def data_received(self, data: bytes) -> None:
        raw = self.raw
        raw += data
        if self.preface:
            if len(raw) < len(_PREFACE):
                return
            super().data_received(bytes(raw[: len(_PREFACE)]))
            del raw[: len(_PREFACE)]
            self.preface = False
        while len(raw) >= 9:
            length = int.from_bytes(raw[0:3], "big")
            if len(raw) < 9 + length:
                break
            if raw[3] == _DATA:
                self.consumed += length
                buffer = self.buffer
                buffer += raw[9 : 9 + length]
                while len(buffer) >= 5:
                    size = int.from_bytes(buffer[1:5], "big")
                    if len(buffer) < 5 + size:
                        break
                    self.on_message(bytes(buffer[5 : 5 + size]))
                    del buffer[: 5 + size]
            else:
                super().data_received(bytes(raw[: 9 + length]))
            del raw[: 9 + length]
        if self.consumed >= 1 << 20:
            increment = self.consumed.to_bytes(4, "big")
            for stream in (0, 1):
                self.transport.write(b"\x00\x00\x04\x08\x00" + stream.to_bytes(4, "big") + increment)
            self.consumed = 0


class _H2LeanSender(_H2Sender):
    """Writes each message as a DATA frame built by hand (``h2`` only for settings and headers);
    its window is what the peer granted, tracked by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.header = b"\x00" + self.stream_id.to_bytes(4, "big")
        self.paused = asyncio.Event()
        self.paused.set()

    async def write(self, data: bytes) -> None:
        message = b"\x00" + len(data).to_bytes(4, "big") + data
        if not self.paused.is_set():
            await self.paused.wait()
        self.transport.write(len(message).to_bytes(3, "big") + b"\x00" + self.header + message)

    def pause_writing(self) -> None:
        self.paused.clear()

    def resume_writing(self) -> None:
        self.paused.set()

    def data_received(self, data: bytes) -> None:
        # the receiver's hand-made WINDOW_UPDATEs are not for h2 (its window for us is untouched)
        raw = self.raw = getattr(self, "raw", b"") + data
        while len(raw) >= 9:
            length = int.from_bytes(raw[0:3], "big")
            if len(raw) < 9 + length:
                break
            if raw[3] != _WINDOW_UPDATE:
                super().data_received(raw[: 9 + length])
            raw = raw[9 + length :]
        self.raw = raw


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
            if counter.count == 0:  # throughput: a 4-byte batch size, the warm-up message, batches
                size = int.from_bytes(await reader.readexactly(4), "big") * MESSAGE_BYTES
                counter.took(await reader.readexactly(MESSAGE_BYTES))
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
    elif link.startswith("h2"):
        server = await asyncio.get_running_loop().create_server(lambda: _H2Receiver(counter.took), HOST, port)
        ready.set()
        await counter.done.wait()
        await asyncio.sleep(0.05)
        server.close()
    else:
        from broker.adapters.transport import GrpcTransport

        def on_receive(_peer: str, item: object) -> None:
            if isinstance(item, PING):
                counter.took(HEAD.pack(item.nonce) + b"p" * (MESSAGE_BYTES - HEAD.size))

        transport = GrpcTransport(
            advertise_host=HOST,
            on_receive=on_receive,
            on_peer_down=lambda _p: None,
            config=_peer_link_config(link),
        )
        await transport.start(HOST, port)
        ready.set()
        await counter.done.wait()
        await transport.stop(0.5)


def _receiver_main(link: str, port: int, count: int, ready: Any, result: Any) -> None:
    counter = _Counter(count)

    async def report() -> None:  # at the end of the window, before the link's teardown
        await counter.done.wait()
        if count:
            switches = (counter.switches[-1] - counter.switches[0]) / max(1, count - 1)
            result.put((counter.latencies, switches))
        else:
            result.put((counter.received, (counter.last_ns - counter.first_ns) / 1e9))

    async def main() -> None:
        reporting = asyncio.get_running_loop().create_task(report())
        await _receive(link, port, counter, ready)
        await reporting

    _run(link, main)


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
    elif link.startswith("h2"):
        sender_ = _H2LeanSender if link.startswith("h2-lean") else _H2Sender
        _transport, protocol = await asyncio.get_running_loop().create_connection(sender_, HOST, port)
        await protocol.open()
        await body(protocol.write)
        protocol.end()
        await asyncio.sleep(0.05)
        _transport.close()
    else:
        from broker.adapters.transport import GrpcTransport

        sender = GrpcTransport(
            advertise_host=HOST,
            on_receive=lambda _p, _i: None,
            on_peer_down=lambda _p: None,
            config=_peer_link_config(link),
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
        result.put(switches[0])

    async def main() -> None:
        await _with_link(link, port, 0, paced)

    _run(link, main)


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
        result.put(sent[0])

    async def main() -> None:
        await _with_link(link, port, batch, bulk)

    _run(link, main)


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


def _end(*processes: Any) -> None:
    """The results are in: a teardown that hangs is not measured, and is ended."""
    for process in processes:
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join(5)


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
    _end(sender, receiver)
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
    _end(sender, receiver)
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
