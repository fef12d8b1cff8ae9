"""QoS 2 (and QoS 1) delivery to a persistent subscriber on one broker: throughput, broker CPU per
message and latency, the path ``broker/core/outbound.py`` holds a new QoS 2 PUBLISH on until the
commit that records its packet id (run by hand; docs/broker.md "Guarantees").

One SkipMQ broker process (``python -m broker`` from ``--broker-root``, default this checkout; a
fresh data directory, the defaults), one publisher and one subscriber with a persistent session
(MQTT 3.1.1, clean session 0), raw asyncio clients on tools/mqtt_raw.py (no client library's cost
in the measurement). Per QoS in ``--qos``:

* throughput: the publisher keeps ``--window`` messages unacknowledged (PUBREC / PUBACK) for
  ``--duration`` s, and at most a window not yet at the subscriber (no queue builds up); delivered
  messages per second at the subscriber, the broker's CPU per message;
* latency: ``--rate`` messages per second, paced, for ``--duration`` s; publish -> the subscriber
  receives the PUBLISH, p50 / p99 in ms.

    .venv/bin/python bench/qos2_delivery.py --json /tmp/q2.json
    .venv/bin/python bench/compare_revisions.py --before main --after HEAD --rounds 3 --script-here \\
        --bench "bench/qos2_delivery.py --broker-root {root} --json {json}"

The machine is shared and noisy: compare revisions side by side (compare_revisions.py), never
figures of different runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from tools import mqtt_raw as raw  # noqa: E402

HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")
TOPIC = "bench/q2"
PAD = b"x" * 56  # 64-byte payloads: 8 bytes of send time, then padding


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class Conn:
    """One MQTT connection: packets in, the QoS 2 / QoS 1 acknowledgements answered."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buffer = bytearray()

    async def packet(self) -> tuple[int, int, bytes]:
        while True:
            parsed = self._parse()
            if parsed is not None:
                return parsed
            chunk = await self.reader.read(65536)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.buffer += chunk

    def _parse(self) -> tuple[int, int, bytes] | None:
        buf = self.buffer
        if len(buf) < 2:
            return None
        length, shift, i = 0, 0, 1
        while True:
            if i >= len(buf):
                return None
            byte = buf[i]
            length += (byte & 0x7F) << shift
            shift += 7
            i += 1
            if not byte & 0x80:
                break
        if len(buf) < i + length:
            return None
        first, body = buf[0], bytes(buf[i : i + length])
        del buf[: i + length]
        return first >> 4, first & 0x0F, body


async def connect(port: int, client_id: str) -> Conn:
    reader, writer = await asyncio.open_connection(HOST, port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = Conn(reader, writer)
    writer.write(raw.connect_packet(client_id, clean=False, keepalive_s=600))
    ptype, _flags, body = await conn.packet()
    assert ptype == raw.CONNACK and body[1] == 0, body
    return conn


class Subscriber:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.received = 0
        self.progress = asyncio.Event()
        self.latencies_s: list[float] = []
        self.record = False

    async def run(self) -> None:
        conn = self.conn
        write = conn.writer.write
        while True:
            ptype, flags, body = await conn.packet()
            if ptype == raw.PUBLISH:
                qos = (flags >> 1) & 3
                topic_len = struct.unpack_from("!H", body, 0)[0]
                offset = 2 + topic_len
                packet_id = struct.unpack_from("!H", body, offset)[0]
                sent = struct.unpack_from("!d", body, offset + 2)[0]
                self.received += 1
                self.progress.set()
                if self.record:
                    self.latencies_s.append(time.perf_counter() - sent)
                write(raw.ack_packet(raw.PUBREC if qos == 2 else raw.PUBACK, packet_id))
            elif ptype == raw.PUBREL:
                write(raw.ack_packet(raw.PUBCOMP, struct.unpack_from("!H", body, 0)[0]))


class Publisher:
    def __init__(self, conn: Conn, qos: int, subscriber: Subscriber) -> None:
        self.conn = conn
        self.qos = qos
        self.subscriber = subscriber
        self.sent = 0
        self.unacked = 0
        self.room = asyncio.Event()
        self.room.set()
        self.window = 1
        self.next_id = 0

    async def run_acks(self) -> None:
        conn = self.conn
        while True:
            ptype, _flags, body = await conn.packet()
            if ptype == raw.PUBREC:
                conn.writer.write(raw.ack_packet(raw.PUBREL, struct.unpack_from("!H", body, 0)[0]))
                self._acked()
            elif ptype == raw.PUBACK:
                self._acked()

    def _acked(self) -> None:
        self.unacked -= 1
        if self.unacked < self.window:
            self.room.set()

    async def publish(self) -> None:
        sub = self.subscriber
        while self.unacked >= self.window or self.sent - sub.received >= self.window:
            if self.unacked >= self.window:
                self.room.clear()
                await self.room.wait()
            else:  # end to end: at most a window not yet at the subscriber (no queue builds up)
                sub.progress.clear()
                await sub.progress.wait()
        self.next_id = self.next_id % 65535 + 1
        payload = struct.pack("!d", time.perf_counter()) + PAD
        self.unacked += 1
        self.sent += 1
        self.conn.writer.write(raw.publish_packet(TOPIC, payload, qos=self.qos, packet_id=self.next_id))


async def measure(port: int, pid: int, qos: int, args: argparse.Namespace) -> dict[str, Any]:
    sub_conn = await connect(port, f"q2bench-sub-{qos}")
    sub_conn.writer.write(raw.subscribe_packet(1, [(TOPIC, qos)]))
    ptype, _flags, _body = await sub_conn.packet()
    assert ptype == raw.SUBACK
    subscriber = Subscriber(sub_conn)
    pub = Publisher(await connect(port, f"q2bench-pub-{qos}"), qos, subscriber)
    tasks = [asyncio.ensure_future(subscriber.run()), asyncio.ensure_future(pub.run_acks())]
    try:
        # throughput: a window of unacknowledged publishes
        pub.window = args.window
        stop = time.perf_counter() + 0.5  # warm-up
        while time.perf_counter() < stop:
            await pub.publish()
        r0, c0, t0 = subscriber.received, cpu_ticks(pid), time.perf_counter()
        stop = t0 + args.duration
        while time.perf_counter() < stop:
            await pub.publish()
        r1, c1, t1 = subscriber.received, cpu_ticks(pid), time.perf_counter()
        delivered = r1 - r0
        # latency: paced
        while pub.unacked or subscriber.received < pub.sent:
            await asyncio.sleep(0.01)
        pub.window = args.window
        subscriber.record = True
        start = time.perf_counter()
        count = int(args.rate * args.duration)
        for index in range(count):
            delay = start + index / args.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await pub.publish()
        deadline = time.perf_counter() + 10
        while len(subscriber.latencies_s) < count and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        lat = sorted(subscriber.latencies_s)
    finally:
        for task in tasks:
            task.cancel()
        for conn in (sub_conn, pub.conn):
            conn.writer.close()
    return {
        "msgs_per_s": delivered / (t1 - t0),
        "broker_cpu_us_per_msg": (c1 - c0) / CLK_TCK * 1e6 / delivered if delivered else None,
        "latency_p50_ms": 1000 * statistics.median(lat) if lat else None,
        "latency_p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
        "latency_samples": len(lat),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/qos2_delivery.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--broker-root", default=str(REPO_ROOT), help="start SkipMQ from this checkout")
    parser.add_argument("--qos", default="2,1", help="comma list of QoS levels (default 2,1)")
    parser.add_argument("--window", type=int, default=100, help="unacknowledged publishes (100)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measurement (3)")
    parser.add_argument("--rate", type=float, default=200.0, help="paced rate for latency (200/s)")
    parser.add_argument("--json", default="", help="write the results here")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="q2bench-") as tmp:
        port, http_port = free_port(), free_port()
        cmd = [
            sys.executable, "-m", "broker", "--bind", HOST, "--port", str(port), "--http-port",
            str(http_port), "--data-dir", str(Path(tmp) / "data"), "--log-level", "warning",
        ]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(Path(args.broker_root).resolve()))
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection((HOST, port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("the broker did not start") from None
                    time.sleep(0.05)
            for qos in (int(q) for q in args.qos.split(",")):
                results[f"qos{qos}"] = asyncio.run(measure(port, proc.pid, qos, args))
                print(f"qos{qos}: {results[f'qos{qos}']}", file=sys.stderr)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    results["load_after"] = os.getloadavg()[0]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
