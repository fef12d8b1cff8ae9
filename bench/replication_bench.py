"""The PUBACK cost of ``cluster.replicas`` (docs/cluster.md, Replicas): QoS 1 with 1, 2 and 3 copies
side by side, on 3-broker clusters on loopback (run by hand; docs/benchmarks-cluster.md, Replicas;
docs/notes/replication-in-brokers.md).

One cluster per variant (``--replicas 1,2,3``), all running at once; each round measures every
variant in turn (rotating order), and the report gives per-variant medians over rounds and the
ratio to the first variant within each round (the machine is noisy: ratios of one round compare
like with like). Per variant and round:

* **PUBACK latency**: a closed loop (one QoS 1 PUBLISH in flight) of ``--latency-count`` messages
  from a publisher on broker 0; p50 / p99 of PUBLISH -> PUBACK;
* **throughput**: ``--messages`` QoS 1 messages with ``--window`` in flight; messages/s from the
  first PUBLISH to the last PUBACK, and the CPU seconds of the 3 broker processes per message.

A subscriber on broker 1 makes the messages cross the cluster, as in production. By default
(``--subscriber persistent``) it is a persistent session (MQTT 3.1.1 clean session 0, i.e. clean
start 0 / never-expiring) with a QoS 1 subscription that PUBACKs every message: its broker commits
the session after each store commit and copies the whole session (queue included) to its N-1
holders at most every 50 ms, and the acknowledgement of a message taken from the publisher's
broker's stream waits until that session is on N brokers - the session path of replication is
in the measurement. ``--subscriber qos0`` is the earlier setting (a clean session with a QoS 0
subscription: only the send log is replicated). Each throughput run also waits (bounded) until the
subscriber has every message, and the CPU figure includes the brokers' work after the last
PUBACK (session flushes, copies, stream acknowledgements).

With 3 brokers, ``cluster.replicas = 3`` puts a copy on every broker. Progress lines go to stdout
(one per variant and round); ``--png`` draws the per-round ratios to the first variant.

The clients are a minimal asyncio MQTT 3.1.1 client (CONNECT, SUBSCRIBE,
PUBLISH, PUBACK) to keep the client side cheap on a 2-core machine. Brokers run with the
defaults (mutual TLS on the cluster links, persistence on).

    .venv/bin/python bench/replication_bench.py --help
    .venv/bin/python bench/replication_bench.py --rounds 5 --json /tmp/replication.json \\
        --png /tmp/replication.png

``--session-copy 1000,10000`` measures instead what one copy of a persistent session with that many
queued QoS 1 messages costs (a session copy is the whole state, its queue included:
``engine_replication_sessions.SESSION_COPY_MESSAGES_PER_S`` spaces the copies by it), in one
process, with the components a broker uses: the home encodes the ``SessionReplica`` record (the
cluster wire codec), the holder decodes it and writes it to its SQLite store in a commit
(``SqliteReplicaStore``, WAL, ``synchronous=normal`` as the broker's default), and an adopter that
restarts reads it back (``load_sessions``). Per size: bytes on the wire, wall milliseconds and CPU
milliseconds per step (median of ``--copy-rounds``).

    .venv/bin/python bench/replication_bench.py --session-copy 1000,10000 --json /tmp/copies.json

Size: two measurements of one subject (what a copy costs), one command and one report format;
the session copy part is ~100 lines beside the cluster runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools.launcher import LocalCluster, start_cluster  # noqa: E402


def _remaining_length(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n % 128
        n //= 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!H", len(data)) + data


def connect_packet(client_id: str, clean: bool = True) -> bytes:
    flags = 0x02 if clean else 0x00
    body = _string("MQTT") + bytes((4, flags)) + struct.pack("!H", 60) + _string(client_id)
    return b"\x10" + _remaining_length(len(body)) + body


def publish_packet(topic: str, payload: bytes, packet_id: int) -> bytes:
    body = _string(topic) + struct.pack("!H", packet_id) + payload
    return b"\x32" + _remaining_length(len(body)) + body


def publish_qos0_packet(topic: str, payload: bytes) -> bytes:
    body = _string(topic) + payload
    return b"\x30" + _remaining_length(len(body)) + body


def subscribe_packet(topic_filter: str, packet_id: int, qos: int = 0) -> bytes:
    body = struct.pack("!H", packet_id) + _string(topic_filter) + bytes((qos,))
    return b"\x82" + _remaining_length(len(body)) + body


class Client(asyncio.Protocol):
    """Counts PUBACKs (by packet id) and received PUBLISHes; nothing else is parsed."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.connacked = asyncio.Event()
        self.subacked = asyncio.Event()
        self.acked: dict[int, float] = {}
        self.received = 0
        self.last_received_at = 0.0
        self.progress = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while len(buffer) >= 2:
            length, shift, pos = 0, 0, 1
            while True:
                if pos >= len(buffer):
                    return
                byte = buffer[pos]
                length |= (byte & 0x7F) << shift
                shift += 7
                pos += 1
                if not byte & 0x80:
                    break
            if len(buffer) < pos + length:
                return
            kind = buffer[0] >> 4
            qos = (buffer[0] >> 1) & 0x03
            body = bytes(buffer[pos : pos + length])
            del buffer[: pos + length]
            if kind == 4:  # PUBACK
                self.acked[struct.unpack("!H", body[:2])[0]] = time.perf_counter()
                self.progress.set()
            elif kind == 3:
                self.received += 1
                self.last_received_at = time.perf_counter()
                if qos:  # acknowledge as a real subscriber does (the session path)
                    topic_length = struct.unpack("!H", body[:2])[0]
                    self.send(b"\x40\x02" + body[2 + topic_length : 4 + topic_length])
                self.progress.set()
            elif kind == 2:
                self.connacked.set()
            elif kind == 9:
                self.subacked.set()

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)


async def connect(port: int, host: str, client_id: str, clean: bool = True) -> Client:
    loop = asyncio.get_running_loop()
    _transport, client = await loop.create_connection(Client, host, port)
    client.send(connect_packet(client_id, clean))
    await asyncio.wait_for(client.connacked.wait(), 10)
    return client


async def wait_for(predicate: Any, client: Client, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no progress")
        client.progress.clear()
        if predicate():
            return
        try:
            await asyncio.wait_for(client.progress.wait(), remaining)
        except TimeoutError:
            pass


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


class Variant:
    def __init__(self, replicas: int, cluster: LocalCluster, persistent: bool) -> None:
        self.replicas = replicas
        self.cluster = cluster
        self.persistent = persistent
        self.publisher: Client | None = None
        self.subscriber: Client | None = None
        self.next_id = 1
        self.delivered_per_s = 0.0
        self.topic = f"bench/replicas{replicas}/t"

    def pids(self) -> list[int]:
        return [b.process.pid for b in self.cluster.brokers if b.process is not None]

    async def open(self) -> None:
        b0, b1 = self.cluster.brokers[0], self.cluster.brokers[1]
        self.subscriber = await connect(
            b1.mqtt_port, b1.host, f"bench-sub-{self.replicas}", clean=not self.persistent
        )
        self.subscriber.send(subscribe_packet(self.topic, 1, qos=1 if self.persistent else 0))
        await asyncio.wait_for(self.subscriber.subacked.wait(), 10)
        self.publisher = await connect(b0.mqtt_port, b0.host, f"bench-pub-{self.replicas}")
        deadline = time.monotonic() + 30
        while self.subscriber.received == 0:  # the route is there once a probe arrives
            if time.monotonic() > deadline:
                raise TimeoutError("no route to the subscriber")
            self.publisher.send(publish_qos0_packet(self.topic, b"probe"))
            await asyncio.sleep(0.1)

    def _packet_id(self) -> int:
        packet_id = self.next_id
        self.next_id = packet_id % 65535 + 1
        return packet_id

    async def latency(self, count: int) -> list[float]:
        publisher = self.publisher
        assert publisher is not None
        values = []
        for n in range(count):
            packet_id = self._packet_id()
            publisher.acked.pop(packet_id, None)
            sent = time.perf_counter()
            publisher.send(publish_packet(self.topic, b"l%d" % n, packet_id))
            await wait_for(lambda pid=packet_id: pid in publisher.acked, publisher, 30)
            values.append(publisher.acked[packet_id] - sent)
        return values

    async def throughput(self, messages: int, window: int) -> tuple[float, float, int]:
        publisher, subscriber = self.publisher, self.subscriber
        assert publisher is not None and subscriber is not None
        publisher.acked.clear()
        received_before = subscriber.received
        pids = self.pids()
        cpu_before = cpu_s(pids)
        started = time.perf_counter()
        in_flight: list[int] = []
        done = 0
        sent = 0
        while done < messages:
            while sent < messages and len(in_flight) < window:
                packet_id = self._packet_id()
                publisher.acked.pop(packet_id, None)
                publisher.send(publish_packet(self.topic, b"t%d" % sent, packet_id))
                in_flight.append(packet_id)
                sent += 1
            await wait_for(lambda: in_flight[0] in publisher.acked, publisher, 60)
            while in_flight and in_flight[0] in publisher.acked:
                in_flight.pop(0)
                done += 1
        elapsed = time.perf_counter() - started
        # every message at the subscriber, or none more for 3 s (a shortfall is reported)
        while subscriber.received - received_before < messages:
            seen = subscriber.received
            try:
                await wait_for(lambda seen=seen: subscriber.received > seen, subscriber, 3)
            except TimeoutError:
                break
        delivered = subscriber.received - received_before
        self.delivered_per_s = delivered / max(1e-9, subscriber.last_received_at - started)
        await asyncio.sleep(0.5)  # the session flushes, copies and stream acks after the last one
        cpu = cpu_s(pids) - cpu_before
        return messages / elapsed, cpu / messages, delivered


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def held_sessions(cluster: LocalCluster) -> list[float]:
    """``skipmq_cluster_replication_held_sessions`` of each broker (N-1 copies expected in all)."""
    values = []
    for index in range(len(cluster.brokers)):
        value = 0.0
        for line in cluster.metrics_text(index).splitlines():
            if line.startswith("skipmq_cluster_replication_held_sessions"):
                value += float(line.rsplit(" ", 1)[1])
        values.append(value)
    return values


def dropped(cluster: LocalCluster) -> dict[str, float]:
    """``skipmq_messages_dropped`` summed over the brokers, by reason (e.g. queue_full_oldest)."""
    totals: dict[str, float] = {}
    for index in range(len(cluster.brokers)):
        for line in cluster.metrics_text(index).splitlines():
            if line.startswith(("skipmq_messages_dropped_total{", "skipmq_messages_dropped{")):
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                totals[reason] = totals.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
    return {reason: value for reason, value in totals.items() if value}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    replicas = [int(item) for item in args.replicas.split(",")]
    variants: list[Variant] = []
    results: dict[str, Any] = {
        "machine": {
            "nproc": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "cpu_model": _cpu_model(),
        },
        "args": vars(args),
        "rounds": [],
    }
    persistent = args.subscriber == "persistent"
    started = time.monotonic()
    try:
        for n in replicas:
            print(f"starting a 3-broker cluster with cluster.replicas = {n}", flush=True)
            cluster = start_cluster(3, settings={"cluster.replicas": str(n)})
            variant = Variant(n, cluster, persistent)
            variants.append(variant)
            print(f"replicas {n}: broker pids {variant.pids()}", flush=True)
            await variant.open()
        for variant in variants:  # warm-up
            print(f"warm-up replicas {variant.replicas}", flush=True)
            await variant.latency(50)
            await variant.throughput(min(500, args.messages), args.window)
        for round_no in range(args.rounds):
            order = variants[round_no % len(variants) :] + variants[: round_no % len(variants)]
            record: dict[str, Any] = {"load": os.getloadavg()[0]}
            for variant in order:
                lat = await variant.latency(args.latency_count)
                rate, cpu, delivered = await variant.throughput(args.messages, args.window)
                record[str(variant.replicas)] = {
                    "p50_ms": percentile(lat, 0.5) * 1000,
                    "p99_ms": percentile(lat, 0.99) * 1000,
                    "msg_per_s": rate,
                    "cpu_us_per_msg": cpu * 1e6,
                    "delivered": delivered,
                    "delivered_per_s": variant.delivered_per_s,
                }
                print(
                    f"  round {round_no + 1}/{args.rounds} replicas {variant.replicas}:"
                    f" p50 {percentile(lat, 0.5) * 1000:.2f} ms, p99"
                    f" {percentile(lat, 0.99) * 1000:.2f} ms, {rate:,.0f} msg/s,"
                    f" {cpu * 1e6:,.0f} us CPU/msg, delivered {delivered}/{args.messages},"
                    f" load {os.getloadavg()[0]:.1f}, {time.monotonic() - started:.0f} s",
                    flush=True,
                )
            record["load_after"] = os.getloadavg()[0]
            results["rounds"].append(record)
            print(f"round {round_no + 1}: {json.dumps(record)}", flush=True)
        results["held_sessions"] = {  # copies of the subscriber's session on its holders
            str(variant.replicas): held_sessions(variant.cluster) for variant in variants
        }
        print(f"sessions held as copies (per broker): {results['held_sessions']}", flush=True)
        results["dropped"] = {str(variant.replicas): dropped(variant.cluster) for variant in variants}
        print(f"messages dropped (all brokers, by reason): {results['dropped']}", flush=True)
    finally:
        for variant in variants:
            variant.cluster.close()
    return results


def report(results: dict[str, Any]) -> str:
    rounds = results["rounds"]
    keys = [key for key in rounds[0] if key.isdigit()]
    base = keys[0]
    lines = [
        "| replicas | PUBACK p50 (ms) | PUBACK p99 (ms) | QoS 1 msg/s (window) | broker CPU per msg (us) |"
        " p50 ratio | msg/s ratio | CPU ratio | delivered (min of rounds) | delivered msg/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:

        def med(name: str, key: str = key) -> float:
            return statistics.median(r[key][name] for r in rounds)

        def ratio(name: str, key: str = key) -> float:
            return statistics.median(r[key][name] / r[base][name] for r in rounds)

        lines.append(
            f"| {key} | {med('p50_ms'):.2f} | {med('p99_ms'):.2f} | {med('msg_per_s'):,.0f} |"
            f" {med('cpu_us_per_msg'):,.0f} | {ratio('p50_ms'):.2f}x | {ratio('msg_per_s'):.2f}x |"
            f" {ratio('cpu_us_per_msg'):.2f}x | {min(r[key].get('delivered', 0) for r in rounds):,} |"
            f" {statistics.median(r[key].get('delivered_per_s', 0.0) for r in rounds):,.0f} |"
        )
    loads = [r["load"] for r in rounds] + [r["load_after"] for r in rounds]
    lines.append("")
    short = [
        f"replicas {key} round {n + 1}: {r[key]['delivered']}"
        for key in keys
        for n, r in enumerate(rounds)
        if r[key].get("delivered", results["args"]["messages"]) < results["args"]["messages"]
    ]
    if short:
        lines.append(f"subscriber short of {results['args']['messages']}: " + ", ".join(short))
    lines.append(
        f"{len(rounds)} rounds (medians; ratios to replicas {base} within each round), load average"
        f" {min(loads):.1f}-{max(loads):.1f}, {results['machine']['nproc']} cores"
    )
    return "\n".join(lines)


def plot(results: dict[str, Any], path: str) -> None:
    """Per-round ratios to the first variant (p50, p99, msg/s, CPU per message), one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = results["rounds"]
    keys = [key for key in rounds[0] if key.isdigit()]
    base = keys[0]
    metrics = [
        ("p50_ms", "PUBACK p50"),
        ("p99_ms", "PUBACK p99"),
        ("msg_per_s", "QoS 1 msg/s"),
        ("cpu_us_per_msg", "broker CPU per message"),
    ]
    figure, axes = plt.subplots(1, len(metrics), figsize=(12, 3.2))
    for axis, (name, title) in zip(axes, metrics, strict=True):
        for n, key in enumerate(keys):
            ratios = [r[key][name] / r[base][name] for r in rounds]
            axis.scatter([n] * len(ratios), ratios, s=14, alpha=0.6)
            axis.hlines(statistics.median(ratios), n - 0.3, n + 0.3, colors="black")
        axis.set_xticks(range(len(keys)), [f"replicas {key}" for key in keys])
        axis.set_title(f"{title} / replicas {base}", fontsize=9)
        axis.axhline(1.0, color="grey", linewidth=0.5)
    loads = [r["load"] for r in rounds]
    figure.suptitle(
        f"cluster.replicas cost, 3 brokers, {len(rounds)} rounds (dots), medians (bars);"
        f" load {min(loads):.0f}-{max(loads):.0f} on {results['machine']['nproc']} cores",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=80)


def _copy_once(record: Any, held: Any, store: Any) -> dict[str, tuple[float, float]]:
    """One copy of ``record``: encoded by the home, decoded and committed by the holder, loaded
    back by a restarted adopter; (wall ms, CPU ms) per step."""
    from broker.adapters.transport.wire import pb
    from broker.adapters.transport.wire_replication import replica_from_proto, replica_to_proto

    times: dict[str, tuple[float, float]] = {}
    wall, cpu = time.perf_counter(), time.process_time()

    def lap(name: str) -> None:
        nonlocal wall, cpu
        now_wall, now_cpu = time.perf_counter(), time.process_time()
        times[name] = ((now_wall - wall) * 1e3, (now_cpu - cpu) * 1e3)
        wall, cpu = time.perf_counter(), time.process_time()

    message = pb.Replica()
    replica_to_proto(record, message)
    data = message.SerializeToString()
    lap("encode")
    received = pb.Replica()
    received.ParseFromString(data)
    got = replica_from_proto(received)
    lap("decode")
    held.persist_session(("10.0.0.9:7883", "inc-home"), got.client_id, got.snapshot, got.positions)
    store.commit()
    lap("persist")
    loaded = held.load_sessions()
    lap("load")
    assert len(loaded[0][1].pending) == len(record.snapshot.pending)
    times["bytes"] = (float(len(data)), 0.0)
    return times


def session_copy(sizes: list[int], rounds: int) -> dict[str, Any]:
    """What one session copy costs per queue size (see the module docstring)."""
    import tempfile

    from broker.adapters.replication_store import SqliteReplicaStore
    from broker.adapters.sqlite_store import Store
    from broker.cluster.messages import StreamPosition
    from broker.cluster.replication_messages import SessionReplica
    from broker.core.messages import Message, OutEntry, SessionSnapshot, SubOptions

    out: dict[str, Any] = {"machine": _machine(), "sizes": {}}
    topic = "plant/line-7/press-12/telemetry"
    for size in sizes:
        payloads = [b"%08d" % n + b"x" * 56 for n in range(size)]
        pending = [
            OutEntry(Message(topic, payload, 1, False, {}, None, "pub-7", "pub-7"), 1, False, [], n)
            for n, payload in enumerate(payloads)
        ]
        snapshot = SessionSnapshot(
            client_id="sub-7",
            protocol_level=5,
            expiry_interval_s=3600,
            username=None,
            subscriptions=[SubOptions("plant/#", 1, match_filter="plant/#")],
            pending=pending,
            incoming_qos2=set(),
        )
        positions = tuple(StreamPosition(f"10.0.0.{n}:7883/inc{n}", "=plant", 1000 + size) for n in range(4))
        record = SessionReplica("inc-home", "sub-7", 1, snapshot, positions)
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(os.path.join(tmp, "holder.db"))
            held = SqliteReplicaStore(store)
            samples = [_copy_once(record, held, store) for _ in range(rounds)]
            store.close()
        row: dict[str, Any] = {"bytes": int(samples[0]["bytes"][0])}
        for name in ("encode", "decode", "persist", "load"):
            row[f"{name}_wall_ms"] = statistics.median(sample[name][0] for sample in samples)
            row[f"{name}_cpu_ms"] = statistics.median(sample[name][1] for sample in samples)
        row["copy_cpu_ms"] = row["encode_cpu_ms"] + row["decode_cpu_ms"] + row["persist_cpu_ms"]
        out["sizes"][str(size)] = row
        print(
            f"{size:>6} queued: {row['bytes'] / 1024:8.1f} KiB; CPU ms encode {row['encode_cpu_ms']:.1f},"
            f" decode {row['decode_cpu_ms']:.1f}, persist+commit {row['persist_cpu_ms']:.1f}"
            f" (wall {row['persist_wall_ms']:.1f}), load {row['load_cpu_ms']:.1f};"
            f" one copy {row['copy_cpu_ms']:.1f} ms CPU = {row['copy_cpu_ms'] * 1e3 / size:.1f} us per queued"
            f" message",
            flush=True,
        )
    out["load_after"] = os.getloadavg()
    return out


def _machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "load": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--replicas",
        default="1,2,3",
        help="comma-separated cluster.replicas values; ratios are to the first (default 1,2,3)",
    )
    parser.add_argument(
        "--subscriber",
        choices=("persistent", "qos0"),
        default="persistent",
        help="the subscriber on broker 1: a persistent session (clean session 0) with a QoS 1"
        " subscription that acknowledges (default; replicated sessions in the path), or a clean"
        " session with a QoS 0 subscription (only the send log is replicated)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds, each measuring every variant (default 3)"
    )
    parser.add_argument(
        "--latency-count", type=int, default=300, help="closed-loop PUBLISH -> PUBACK samples per round"
    )
    parser.add_argument("--messages", type=int, default=3000, help="QoS 1 messages per throughput run")
    parser.add_argument("--window", type=int, default=50, help="QoS 1 PUBLISHes in flight (throughput)")
    parser.add_argument("--json", metavar="PATH", help="also write the raw results as JSON")
    parser.add_argument(
        "--png", metavar="PATH", help="also draw the per-round ratios to the first variant (matplotlib)"
    )
    parser.add_argument(
        "--session-copy",
        metavar="SIZES",
        help="measure instead one session copy's cost for these queue sizes (e.g. 1000,10000)",
    )
    parser.add_argument("--copy-rounds", type=int, default=7, help="copies measured per size (median)")
    args = parser.parse_args(argv)
    if args.session_copy:
        copies = session_copy([int(n) for n in args.session_copy.split(",")], args.copy_rounds)
        if args.json:
            Path(args.json).write_text(json.dumps(copies, indent=2) + "\n")
        return 0
    results = asyncio.run(run(args))
    text = report(results)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if args.png:
        plot(results, args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
