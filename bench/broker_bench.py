"""Broker benchmark: SkipMQ vs Debian mosquitto 2.0.11 vs the amqtt 0.12.1 broker, in ONE run with
the SAME load clients (run by hand; not part of CI).

Implements the measurement plan of the issue "SkipMQ broker core" (part 5) and checks its targets:
SkipMQ QoS0 1->1 throughput >= 0.5 x mosquitto's; broker CPU per QoS0 message <= 20 us; 10k
unrelated subscriptions cost < 10 % throughput; <= 10 KiB per idle connection.

Load clients are a small asyncio raw-socket MQTT 3.1.1 client (hand-encoded packets, MQTT 3.1.1
§3.1/§3.3/§3.8; C-level slicing to count fixed-size PUBLISH packets), so Python parsing is not
the bottleneck the way paho would be. Throughput runs are closed-loop: at most a window of
undelivered messages per subscriber is outstanding (no queue overflow, no drops by design); a
stall (messages dropped by the broker) is detected and the window is reset, and counted.

Measured per broker: delivered msgs/s for QoS 0 and 1, 64-byte payloads, 1->1, 1->100 fan-out,
100->1 fan-in, each without and with 10k unrelated subscriptions held by another client;
broker CPU us per delivered message from /proc/<pid>/stat (utime+stime); p50/p99 end-to-end
latency at paced 1k and 5k msg/s (timestamp in the payload); RSS per idle connection (VmRSS
delta after opening N idle MQTT connections). Results: JSON, a markdown table, a PNG bar chart.

    .venv/bin/python bench/broker_bench.py --help
    .venv/bin/python bench/broker_bench.py --quick
    .venv/bin/python bench/broker_bench.py --update-docs   # full run; rewrites "## Broker core" in docs
Size: one runnable script; the split it would take: its report (~410 lines) into a module of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools import loadclient  # noqa: E402
from tools import mqtt_raw as raw  # noqa: E402
from tools.loadclient import LoadClient  # noqa: E402
from tools.ports import free_port  # noqa: E402

DOCS = REPO_ROOT / "docs"
# the tree whose ``broker`` package is started as SkipMQ (--broker-root: another revision's
# checkout, driven by this script's load client; compare_revisions.py --quick uses it)
BROKER_ROOT = REPO_ROOT
# mosquitto with ``persistence true`` (its autosave keeps sessions and queued messages on disk every
# autosave_interval, 1800 s by default; SkipMQ commits every QoS>0 message a persistent session
# queues); --no-mosquitto-persistence runs it without
MOSQUITTO_PERSISTENCE = True
HOST = "127.0.0.1"
PAYLOAD_BYTES = 64
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = 4
MOSQUITTO_BIN = "/usr/sbin/mosquitto"
ALL_BROKERS = ("skipmq", "mosquitto", "amqtt")
SETUP_TIMEOUT_S = 60.0
# closed loop: undelivered messages allowed per subscriber (below both brokers' default
# max_queued_messages of 1000, so nothing is dropped by design)
WINDOW_QOS0 = 1000
WINDOW_QOS1 = 500
STALL_S = 2.0  # no delivery for this long while messages are outstanding = the broker dropped them


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---- the load client protocol ----------------------------------------------------------------
class Client(LoadClient):
    """One MQTT connection of the load generator (tools.loadclient does the set-up).

    Setup (CONNACK, SUBACK) goes through a generic parser; during a run a subscriber counts
    fixed-size PUBLISH packets with C-level slicing (fast path) and falls back to the generic
    parser when the stream is not uniform.
    """

    def __init__(self, run: Run | None = None, name: str = "") -> None:
        super().__init__(name)
        self.run = run
        # subscriber fast path: (packet length, first byte) of the expected PUBLISH
        self.fixed_len = 0
        self.fixed_first = 0
        self.delivered = 0
        self.latencies_ns: list[int] | None = None
        self.pid_offset = 0  # where the packet id sits in a fixed-size QoS 1 PUBLISH

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        length = self.fixed_len
        if length:
            n = len(buf) // length
            if n and self.latencies_ns is None:
                end = n * length
                if buf[0:end:length] == bytes([self.fixed_first]) * n:
                    if self.fixed_first & 0x06:  # QoS 1: PUBACK each one, built with slicing
                        pid_at = self.pid_offset
                        acks = bytearray(4 * n)
                        acks[0::4] = b"\x40" * n
                        acks[1::4] = b"\x02" * n
                        acks[2::4] = buf[pid_at:end:length]
                        acks[3::4] = buf[pid_at + 1 : end : length]
                        self.write(bytes(acks))
                    del buf[:end]
                    self.delivered += n
                    if self.run is not None:
                        self.run.on_delivered(n)
                    return
        self._parse_generic()

    def _parse_generic(self) -> None:
        buf = self.buf
        pos = 0
        size = len(buf)
        delivered = 0
        acks: list[bytes] = []
        while pos + 2 <= size:
            first = buf[pos]
            length, shift, i = 0, 0, pos + 1
            complete = False
            while i < size and i < pos + 5:
                byte = buf[i]
                length += (byte & 0x7F) << shift
                shift += 7
                i += 1
                if not byte & 0x80:
                    complete = True
                    break
            if not complete or i + length > size:
                break
            ptype = first >> 4
            if ptype == 3:
                qos = (first >> 1) & 3
                tlen = (buf[i] << 8) | buf[i + 1]
                at = i + 2 + tlen
                if qos:
                    acks.append(b"\x40\x02" + bytes(buf[at : at + 2]))
                    at += 2
                if self.latencies_ns is not None:
                    sent_ns = int.from_bytes(buf[at : at + 8], "big")
                    self.latencies_ns.append(time.perf_counter_ns() - sent_ns)
                delivered += 1
            elif ptype == 4:  # PUBACK for our QoS 1 publish
                self.unacked -= 1
                if self.run is not None:
                    self.run.on_puback()
            elif ptype == 9:
                self.suback_received((buf[i] << 8) | buf[i + 1], bytes(buf[i : i + length]))
            elif ptype == 2:
                self.connack_received(buf[i + 1])
            pos = i + length
        del buf[:pos]
        if acks:
            self.write(b"".join(acks))
        if delivered:
            self.delivered += delivered
            if self.run is not None:
                self.run.on_delivered(delivered)


class Publisher(Client):
    """A publisher: PUBACKs counted in the fast path (4-byte packets) during a run."""

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        n = len(buf) // 4
        if n and buf[0 : 4 * n : 4] == b"\x40" * n:
            del buf[: 4 * n]
            self.unacked -= n
            if self.run is not None:
                self.run.on_puback()
            return
        self._parse_generic()


async def open_client(port: int, client_id: str, cls: type[Client] = Client) -> Client:
    return await loadclient.open_client(lambda: cls(None, client_id), port, client_id, keepalive_s=600)


async def subscribe(client: Client, filters: list[str], qos: int, packet_id: int = 1) -> None:
    await loadclient.subscribe(client, filters, qos, packet_id=packet_id)


async def close_clients(clients: list[Client]) -> None:
    for client in clients:
        client.close()
    await asyncio.sleep(0.05)


# ---- /proc measurements --------------------------------------------------------------------
def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)


def sched_wait_ns(pid: int) -> int:
    """Nanoseconds the threads of ``pid`` have waited on a run queue (ready, not running):
    /proc/PID/task/*/schedstat field 2 (0 where the kernel does not keep schedstats)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return total


@contextlib.contextmanager
def realtime(enabled: bool) -> Iterator[None]:
    """SCHED_FIFO (priority 10) for this process and whatever it starts meanwhile (a broker
    inherits it): the other jobs of a shared machine cannot preempt the paced latency runs, so
    their p99 is the broker's own. Only for paced runs (a few % of a core): a CPU-bound FIFO
    task would starve the machine (the kernel keeps 5 % for others)."""
    if not enabled:
        yield
        return
    previous = os.sched_getscheduler(0), os.sched_getparam(0)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    try:
        yield
    finally:
        os.sched_setscheduler(0, previous[0], previous[1])


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


# ---- a closed-loop throughput run ---------------------------------------------------------
@dataclass
class Run:
    """Publishers -> subscribers with at most `window` undelivered messages per subscriber."""

    publishers: list[Publisher]
    subscribers: list[Client]
    packets: list[bytes]  # per publisher: pre-encoded back-to-back PUBLISH packets
    packet_len: int
    qos: int
    fanout: int  # deliveries per publish
    window: int
    batch: int = 128
    running: bool = False
    published: int = 0
    delivered: int = 0
    forgiven: int = 0
    stalls: int = 0
    cursor: list[int] = field(default_factory=list)
    rr: int = 0
    pub_inflight_max: int = 20

    def __post_init__(self) -> None:
        self.cursor = [0] * len(self.publishers)
        for client in (*self.publishers, *self.subscribers):
            client.run = self

    def outstanding(self) -> int:
        return self.published * self.fanout - self.delivered - self.forgiven

    def on_delivered(self, n: int) -> None:
        self.delivered += n
        if self.running:
            self.pump()

    def on_puback(self) -> None:
        if self.running:
            self.pump()

    def pump(self) -> None:
        budget = (self.window - self.outstanding()) // self.fanout
        npub = len(self.publishers)
        tries = 0
        while budget > 0 and tries < npub:
            index = self.rr
            self.rr = (index + 1) % npub
            pub = self.publishers[index]
            count = min(budget, self.batch)
            if self.qos:
                count = min(count, self.pub_inflight_max - pub.unacked)
            if count <= 0 or (pub.transport is not None and pub.transport.get_write_buffer_size() > 1 << 20):
                tries += 1
                continue
            tries = 0
            blob = self.packets[index]
            start = self.cursor[index]
            total = len(blob) // self.packet_len
            if start + count > total:
                count = total - start
            pub.write(blob[start * self.packet_len : (start + count) * self.packet_len])
            self.cursor[index] = (start + count) % total
            pub.unacked += count if self.qos else 0
            self.published += count
            budget -= count

    async def watchdog(self) -> None:
        last, quiet_since = -1, time.perf_counter()
        while self.running:
            await asyncio.sleep(0.1)
            if self.delivered != last or self.outstanding() <= 0:
                last, quiet_since = self.delivered, time.perf_counter()
            elif time.perf_counter() - quiet_since > STALL_S:
                # the broker dropped what we are waiting for: forgive it and go on
                self.stalls += 1
                self.forgiven += self.outstanding()
                for pub in self.publishers:
                    pub.unacked = 0
                self.pump()
                quiet_since = time.perf_counter()


@dataclass
class Scenario:
    name: str
    qos: int
    n_pub: int
    n_sub: int


SCENARIOS = [
    Scenario("1->1", 0, 1, 1),
    Scenario("1->100", 0, 1, 100),
    Scenario("100->1", 0, 100, 1),
    Scenario("1->1", 1, 1, 1),
    Scenario("1->100", 1, 1, 100),
    Scenario("100->1", 1, 100, 1),
]


def _payload() -> bytes:
    return bytes(range(PAYLOAD_BYTES))


async def run_throughput(port: int, pid: int, sc: Scenario, duration_s: float, tag: str) -> dict[str, Any]:
    base = f"bench/{tag}{sc.qos}{sc.n_pub:03d}{sc.n_sub:03d}"
    subs = await asyncio.gather(*(open_client(port, f"{base}-s{i}") for i in range(sc.n_sub)))
    pubs = [
        p
        for p in await asyncio.gather(
            *(open_client(port, f"{base}-p{i}", Publisher) for i in range(sc.n_pub))
        )
        if isinstance(p, Publisher)
    ]
    topic_filter = f"{base}/+"
    await asyncio.gather(*(subscribe(s, [topic_filter], sc.qos) for s in subs))
    topics = [f"{base}/{i:03d}" for i in range(sc.n_pub)]
    payload = _payload()
    if sc.qos:
        # QoS 1: distinct packet ids 1..4096 (the window keeps far fewer than that in flight)
        packets = [
            b"".join(raw.publish_packet(t, payload, qos=1, packet_id=i + 1) for i in range(4096))
            for t in topics
        ]
    else:
        packets = [raw.publish_packet(t, payload) * 1024 for t in topics]
    packet_len = len(raw.publish_packet(topics[0], payload, qos=sc.qos, packet_id=1))
    for sub in subs:
        sub.fixed_len = packet_len
        sub.fixed_first = 0x30 | (sc.qos << 1)
        sub.pid_offset = 2 + 2 + len(topics[0])  # fixed header (2) + topic length (2) + topic
    window_per_sub = WINDOW_QOS0 if sc.qos == 0 else WINDOW_QOS1
    run = Run(pubs, subs, packets, packet_len, sc.qos, sc.n_sub, window_per_sub * sc.n_sub)
    run.running = True
    watchdog = asyncio.ensure_future(run.watchdog())
    run.pump()
    await asyncio.sleep(min(0.5, duration_s / 4))  # warm-up
    d0, c0, t0 = run.delivered, cpu_ticks(pid), time.perf_counter()
    self0 = os.times()
    await asyncio.sleep(duration_s)
    d1, c1, t1 = run.delivered, cpu_ticks(pid), time.perf_counter()
    self1 = os.times()
    run.running = False
    watchdog.cancel()
    await close_clients([*pubs, *subs])
    delivered = d1 - d0
    elapsed = t1 - t0
    cpu_s = (c1 - c0) / CLK_TCK
    client_cpu_s = (self1.user + self1.system) - (self0.user + self0.system)
    return {
        "msgs_per_s": delivered / elapsed,
        "delivered": delivered,
        "broker_cpu_us_per_msg": (cpu_s * 1e6 / delivered) if delivered else None,
        "broker_cpu_pct": 100 * cpu_s / elapsed,
        "load_client_cpu_pct": 100 * client_cpu_s / elapsed,
        "stalls": run.stalls,
    }


async def open_persistent_client(port: int, client_id: str) -> Client:
    """A subscriber with a persistent session (MQTT 3.1.1 clean session 0): the broker keeps what
    it queues for it (SkipMQ commits each such QoS 1 message before the publisher's PUBACK; the
    PUBLISH to a connected subscriber leaves in the same loop iteration, before that commit)."""
    loop = asyncio.get_running_loop()
    _transport, client = await loop.create_connection(lambda: Client(None, client_id), HOST, port)
    client.write(raw.connect_packet(client_id, clean=False, keepalive_s=600))
    code = await asyncio.wait_for(client.connack, SETUP_TIMEOUT_S)
    if code != 0:
        raise ConnectionError(f"{client_id}: CONNACK return code {code}")
    return client


async def run_latency(
    port: int, pid: int, rate: int, duration_s: float, tag: str, qos: int = 0
) -> dict[str, Any]:
    """Paced 1->1 latency. QoS 1: publisher and subscription at QoS 1, the subscriber's session
    persistent (PUBACKs from the load client as each PUBLISH is parsed)."""
    base = f"bench/lat{tag}{rate}q{qos}"
    sub = await (open_persistent_client(port, f"{base}-s") if qos else open_client(port, f"{base}-s"))
    pub = await open_client(port, f"{base}-p", Publisher)
    await subscribe(sub, [f"{base}/t"], qos)
    sub.latencies_ns = []
    next_packet_id = 0
    pad = bytes(PAYLOAD_BYTES - 8)
    t0 = time.perf_counter()
    sent = 0
    warmup_s = min(0.5, duration_s / 4)
    end = t0 + warmup_s + duration_s
    measured_from = 0
    wait0 = sched_wait_ns(pid)
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        if measured_from == 0 and now - t0 >= warmup_s:
            measured_from = len(sub.latencies_ns)
        due = int((now - t0) * rate)
        if due > sent:
            packets = []
            for _ in range(due - sent):
                stamp = time.perf_counter_ns().to_bytes(8, "big")
                if qos:
                    next_packet_id = next_packet_id % 65535 + 1
                    packets.append(
                        raw.publish_packet(f"{base}/t", stamp + pad, qos=qos, packet_id=next_packet_id)
                    )
                else:
                    packets.append(raw.publish_packet(f"{base}/t", stamp + pad))
            pub.write(b"".join(packets))
            sent = due
        await asyncio.sleep(0.0005)
    await asyncio.sleep(0.3)
    run_queue_wait_ms = (sched_wait_ns(pid) - wait0) / 1e6
    samples = sorted(sub.latencies_ns[measured_from:])
    await close_clients([sub, pub])
    if not samples:
        return {"rate": rate, "qos": qos, "p50_ms": None, "p99_ms": None, "received": 0, "sent": sent}

    def pct(p: float) -> float:
        return samples[min(len(samples) - 1, int(p * len(samples)))] / 1e6

    return {
        "rate": rate,
        "qos": qos,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "p999_ms": pct(0.999),
        "max_ms": samples[-1] / 1e6,
        "received": len(samples),
        "sent": sent,
        # the broker's threads, ready but not running, over the paced run (other jobs' CPU)
        "broker_run_queue_wait_ms": run_queue_wait_ms,
        "load_average": os.getloadavg()[0],
    }


def store_commits(http_port: int) -> dict[str, Any]:
    """The broker's ``skipmq_store_commit_seconds`` histogram (the whole life of the broker: the
    paced run and its warm-up) from its /metrics: how many group commits, how long in all, how many
    over 1, 10 and 100 ms (a COMMIT blocks the event loop, so every message behind it waits)."""
    url = f"http://{HOST}:{http_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except OSError as exc:
        return {"store_commits_error": str(exc)}
    buckets: dict[float, float] = {}
    total_s = 0.0
    for line in text.splitlines():
        if line.startswith("skipmq_store_commit_seconds_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(bound)] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("skipmq_store_commit_seconds_sum"):
            total_s = float(line.rsplit(" ", 1)[1])
    count = buckets.get(float("inf"), 0.0)

    def over(bound_s: float) -> int:
        return int(count - buckets.get(bound_s, count))

    return {
        "store_commits": int(count),
        "store_commit_total_ms": total_s * 1e3,
        "store_commits_over_1ms": over(0.001),
        "store_commits_over_10ms": over(0.01),
        "store_commits_over_100ms": over(0.1),
        "store_commit_buckets": {str(k): v for k, v in sorted(buckets.items())},
    }


async def hold_unrelated_subscriptions(port: int, count: int) -> Client:
    client = await open_client(port, "bench-noise")
    per_packet = 100
    for start in range(0, count, per_packet):
        filters = [
            f"noise/{i}/+/status" if i % 2 else f"noise/device{i}/temperature"
            for i in range(start, min(count, start + per_packet))
        ]
        await subscribe(client, filters, 0, packet_id=start // per_packet + 1)
    return client


async def measure_idle_rss(port: int, pid: int, count: int) -> dict[str, Any]:
    before = rss_kib(pid)
    clients: list[Client] = []
    batch = 250
    started = time.perf_counter()
    failed = 0
    for start in range(0, count, batch):
        results = await asyncio.gather(
            *(open_client(port, f"idle-{i}") for i in range(start, min(count, start + batch))),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, Client):
                clients.append(result)
            else:
                failed += 1
        if time.perf_counter() - started > 120:
            log(f"  idle connections: stopping after {len(clients)} (time limit)")
            break
    await asyncio.sleep(1.0)
    after = rss_kib(pid)
    opened = len(clients)
    await close_clients(clients)
    return {
        "connections": opened,
        "failed": failed,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "kib_per_connection": (after - before) / opened if opened else None,
        "connect_s": time.perf_counter() - started,
    }


# ---- brokers -------------------------------------------------------------------------------


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} not open after {timeout_s} s")


class BrokerUnderTest:
    def __init__(self, kind: str, workdir: Path) -> None:
        self.kind = kind
        self.workdir = workdir
        self.port = free_port()
        self.http_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.version = ""

    def command(self) -> list[str]:
        if self.kind == "skipmq":
            return [
                sys.executable, "-m", "broker", "--bind", HOST, "--port", str(self.port),
                "--http-port", str(self.http_port), "--data-dir", str(self.workdir / "data"),
                "--log-level", "warning", "--log-format", "json",
            ]  # fmt: skip
        if self.kind == "mosquitto":
            conf = self.workdir / "mosquitto.conf"
            persistence = (
                f"persistence true\npersistence_location {self.workdir}/\n" if MOSQUITTO_PERSISTENCE else ""
            )
            conf.write_text(
                f"listener {self.port} {HOST}\nallow_anonymous true\nper_listener_settings false\n"
                f"log_dest none\nuser root\n{persistence}"
            )
            return [MOSQUITTO_BIN, "-c", str(conf)]
        return [sys.executable, str(Path(__file__).resolve()), "--run-amqtt-broker", str(self.port)]

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(BROKER_ROOT))
        err = open(self.workdir / "stderr.log", "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            self.command(), stdout=err, stderr=err, stdin=subprocess.DEVNULL, env=env
        )
        wait_port(self.port, self.proc)
        if self.kind == "skipmq":
            self.version = "SkipMQ (this tree)"
        elif self.kind == "mosquitto":
            self.version = "mosquitto 2.0.11"
        else:
            self.version = "amqtt 0.12.1"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            text = (self.workdir / "stderr.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def run_amqtt_broker(port: int) -> None:
    """The amqtt broker with its default configuration (default_broker.yaml), on our port."""
    import logging

    import yaml
    from amqtt.broker import Broker

    logging.basicConfig(level=logging.WARNING)
    import amqtt

    default = Path(str(amqtt.__file__)).parent / "scripts" / "default_broker.yaml"
    config = yaml.safe_load(default.read_text())
    config["listeners"]["default"]["bind"] = f"{HOST}:{port}"

    async def main() -> None:
        broker = Broker(config)
        await broker.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await broker.shutdown()

    asyncio.run(main())


# ---- orchestration -------------------------------------------------------------------------
@dataclass
class Settings:
    brokers: list[str]
    duration_s: float
    latency_duration_s: float
    latency_rates: list[int]
    noise_subscriptions: int
    idle_connections: int
    scenarios: list[Scenario]
    skip_idle: bool = False
    repeat: int = 1
    skip_latency: bool = False
    latency_realtime: bool = False
    latency_rounds: int = 1
    latency_qos: list[int] = field(default_factory=lambda: [0])


async def bench_one(kind: str, workdir: Path, settings: Settings) -> dict[str, Any]:
    """Every measurement gets a FRESH broker process, so a backlog left by one scenario (amqtt's
    unbounded queues) cannot slow the next one down."""
    out: dict[str, Any] = {"version": "", "throughput": {}, "latency": [], "idle": None}
    broker_starts = 0

    async def with_broker(what: str, body: Any, timeout_s: float, rt: bool = False) -> Any:
        nonlocal broker_starts
        broker_starts += 1
        broker = BrokerUnderTest(kind, workdir / f"{kind}-{broker_starts}")
        try:
            with realtime(rt):
                broker.start()
                out["version"] = broker.version
                return await asyncio.wait_for(body(broker), timeout_s)
        except (TimeoutError, ConnectionError, OSError) as exc:
            log(
                f"{kind}: {what} FAILED {type(exc).__name__}: {exc}; "
                f"broker stderr tail:\n{broker.stderr_tail()}"
            )
            return {"error": f"{type(exc).__name__}: {exc}", "msgs_per_s": None, "kib_per_connection": None}
        finally:
            broker.stop()

    paced = [(q, r) for q in settings.latency_qos for r in settings.latency_rates]

    async def paced_run(b: BrokerUnderTest, rate: int, qos: int) -> dict[str, Any]:
        res = await run_latency(b.port, b.pid, rate, settings.latency_duration_s, kind[:2], qos)
        if kind == "skipmq" and qos:
            res.update(await asyncio.to_thread(store_commits, b.http_port))
        return res

    for qos, rate in paced if not settings.skip_latency else []:
        res = await with_broker(
            f"latency QoS {qos} @ {rate}/s",
            lambda b, rate=rate, qos=qos: paced_run(b, rate, qos),
            SETUP_TIMEOUT_S,
            rt=settings.latency_realtime,
        )
        res.setdefault("rate", rate)
        res.setdefault("qos", qos)
        out["latency"].append(res)
        log(
            f"{kind}: latency QoS {qos} @ {rate}/s: p50 {_fmt(res.get('p50_ms'), 3)} ms, "
            f"p99 {_fmt(res.get('p99_ms'), 3)} ms, p99.9 {_fmt(res.get('p999_ms'), 3)} ms, "
            f"broker run-queue wait {_fmt(res.get('broker_run_queue_wait_ms'), 1)} ms"
            + (
                f"; store commits {res['store_commits']}, {res['store_commit_total_ms']:.0f} ms in all, "
                f"over 10 ms {res['store_commits_over_10ms']}, over 100 ms {res['store_commits_over_100ms']}"
                if "store_commits" in res
                else ""
            )
        )
    # each scenario runs without and then with the unrelated subscriptions, back to back, so a
    # change in the machine's background load affects both sides of the comparison alike
    for sc in settings.scenarios:
        runs_by_key: dict[str, list[dict[str, Any]]] = {}
        for attempt in range(settings.repeat):
            for noise in (0, settings.noise_subscriptions) if settings.noise_subscriptions else (0,):
                key = f"qos{sc.qos} {sc.name}" + (f" +{noise // 1000}k subs" if noise else "")

                async def scenario(
                    b: BrokerUnderTest, sc: Scenario = sc, noise: int = noise
                ) -> dict[str, Any]:
                    noise_client = None
                    if noise:
                        started = time.perf_counter()
                        noise_client = await hold_unrelated_subscriptions(b.port, noise)
                        log(
                            f"{kind}: {noise} unrelated subscriptions held "
                            f"({time.perf_counter() - started:.1f} s)"
                        )
                    res = await run_throughput(b.port, b.pid, sc, settings.duration_s, f"{kind[:2]}{noise}")
                    if noise_client is not None:
                        await close_clients([noise_client])
                    return res

                res = await with_broker(key, scenario, SETUP_TIMEOUT_S * 3 + settings.duration_s)
                runs_by_key.setdefault(key, []).append(res)
                if res.get("msgs_per_s") is not None:
                    log(
                        f"{kind}: {key} [{attempt + 1}/{settings.repeat}]: {res['msgs_per_s']:,.0f} msgs/s, "
                        f"broker CPU {_fmt(res['broker_cpu_us_per_msg'], 1)} us/msg "
                        f"({res['broker_cpu_pct']:.0f} %), "
                        f"load client {res['load_client_cpu_pct']:.0f} % CPU, "
                        f"stalls {res['stalls']}"
                    )
        for key, key_runs in runs_by_key.items():
            out["throughput"][key] = summarize(key_runs)
    if not settings.skip_idle:
        idle = await with_broker(
            "idle connections", lambda b: measure_idle_rss(b.port, b.pid, settings.idle_connections), 200
        )
        out["idle"] = idle
        if idle.get("kib_per_connection") is not None:
            log(
                f"{kind}: {idle['connections']} idle connections: "
                f"{_fmt(idle['kib_per_connection'], 2)} KiB each (RSS {idle['rss_before_kib']} -> "
                f"{idle['rss_after_kib']} KiB)"
            )
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over repeated runs (msgs/s and CPU us/msg separately); all runs kept under "runs"."""
    good = [r for r in runs if r.get("msgs_per_s") is not None and r.get("broker_cpu_us_per_msg")]
    if not good:
        return {**runs[-1], "runs": runs}

    def median(values: list[float]) -> float:
        values = sorted(values)
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    return {
        "msgs_per_s": median([r["msgs_per_s"] for r in good]),
        "broker_cpu_us_per_msg": median([r["broker_cpu_us_per_msg"] for r in good]),
        "broker_cpu_pct": median([r["broker_cpu_pct"] for r in good]),
        "load_client_cpu_pct": median([r["load_client_cpu_pct"] for r in good]),
        "stalls": sum(r["stalls"] for r in good),
        "runs": runs,
    }


def _verdict(met: bool | None) -> str:
    return "not measured" if met is None else ("met" if met else "NOT met")


def _fmt(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Check the issue's targets for SkipMQ.

    Throughput targets are judged on CPU-normalized capacity (deliveries per broker CPU-second =
    1e6 / CPU us per message): on a shared 2-core machine the raw msgs/s of a window mostly says
    how much CPU the scheduler gave the broker in it. The raw ratios are reported next to them.
    """
    targets: list[dict[str, Any]] = []
    brokers = results["brokers"]
    sk = brokers.get("skipmq")
    mq = brokers.get("mosquitto")
    if sk is None:
        return targets

    def tp(b: dict[str, Any], key: str) -> float | None:
        value = b["throughput"].get(key, {}).get("msgs_per_s")
        return float(value) if value else None

    def capacity(b: dict[str, Any], key: str) -> float | None:
        cpu = b["throughput"].get(key, {}).get("broker_cpu_us_per_msg")
        return 1e6 / float(cpu) if cpu else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    if mq is not None:
        raw = ratio(tp(sk, "qos0 1->1"), tp(mq, "qos0 1->1"))
        cap = ratio(capacity(sk, "qos0 1->1"), capacity(mq, "qos0 1->1"))
        targets.append(
            {
                "target": "SkipMQ QoS0 1->1 throughput >= 0.5 x mosquitto",
                "value": f"{_fmt(cap, 2)} x per broker CPU-second "
                f"({_fmt(capacity(sk, 'qos0 1->1'))} vs {_fmt(capacity(mq, 'qos0 1->1'))} msgs/CPU-s); "
                f"raw msgs/s ratio {_fmt(raw, 2)} x",
                "met": None if cap is None else cap >= 0.5,
                "capacity_ratio": cap,
                "raw_ratio": raw,
            }
        )
    cpu = sk["throughput"].get("qos0 1->1", {}).get("broker_cpu_us_per_msg")
    targets.append(
        {
            "target": "broker CPU per QoS0 message <= 20 us (1->1)",
            "value": f"{_fmt(cpu, 1)} us",
            "met": None if cpu is None else cpu <= 20,
        }
    )
    costs = []
    for key in list(sk["throughput"]):
        if "subs" in key:
            continue
        with_noise = next((k for k in sk["throughput"] if k.startswith(key + " +")), None)
        if with_noise is None:
            continue
        cap = ratio(capacity(sk, with_noise), capacity(sk, key))
        raw = ratio(tp(sk, with_noise), tp(sk, key))
        if cap is not None:
            costs.append((key, 1 - cap, None if raw is None else 1 - raw))
    if costs:
        worst_key, worst, _ = max(costs, key=lambda kv: kv[1])
        targets.append(
            {
                "target": "10k unrelated subscriptions cost < 10 % throughput",
                "value": f"worst {worst * 100:.1f} % per CPU-second ({worst_key}); "
                + ", ".join(
                    f"{k}: {c * 100:+.1f} % (raw {_fmt(None if r is None else r * 100, 1)} %)"
                    for k, c, r in costs
                ),
                "met": worst < 0.10,
            }
        )
    if mq is not None:
        for qos, rate in latency_cases(results):
            sk_p99 = latency_summary(sk["latency"], rate, qos).get("p99_ms")
            mq_p99 = latency_summary(mq["latency"], rate, qos).get("p99_ms")
            if sk_p99 is None or mq_p99 is None:
                continue
            lat_ratio = sk_p99 / mq_p99 if mq_p99 else None
            targets.append(
                {
                    "target": f"p99 {latency_label(qos, rate)} <= 1.5 x mosquitto",
                    "value": f"{_fmt(lat_ratio, 2)} x ({_fmt(sk_p99, 2)} vs {_fmt(mq_p99, 2)} ms, "
                    f"median of {latency_summary(sk['latency'], rate, qos)['rounds']} round(s))",
                    "met": None if lat_ratio is None else lat_ratio <= 1.5,
                }
            )
    idle = (sk.get("idle") or {}).get("kib_per_connection")
    targets.append(
        {
            "target": "<= 10 KiB per idle connection",
            "value": f"{_fmt(idle, 2)} KiB",
            "met": None if idle is None else idle <= 10,
        }
    )
    return targets


def latency_summary(runs: list[dict[str, Any]], rate: int, qos: int = 0) -> dict[str, Any]:
    """The median over the rounds of each latency figure at ``rate`` and ``qos`` (empty: no run)."""
    at_rate = [
        r for r in runs if r.get("rate") == rate and r.get("qos", 0) == qos and r.get("p99_ms") is not None
    ]
    if not at_rate:
        return {}
    out: dict[str, Any] = {"rounds": len(at_rate)}
    for key in ("p50_ms", "p99_ms", "p999_ms", "max_ms", "broker_run_queue_wait_ms"):
        values = sorted(r[key] for r in at_rate if r.get(key) is not None)
        if values:
            out[key] = values[len(values) // 2]
    return out


def latency_cases(results: dict[str, Any]) -> list[tuple[int, int]]:
    settings = results["settings"]
    return [(q, r) for q in settings.get("latency_qos", [0]) for r in settings.get("latency_rates", [])]


def latency_label(qos: int, rate: int) -> str:
    return f"latency QoS{qos} 1->1{' persistent subscriber' if qos else ''} @ {rate}/s"


def markdown(results: dict[str, Any]) -> str:
    brokers = list(results["brokers"])
    lines = ["| scenario | " + " | ".join(f"{b}: msgs/s (CPU us/msg, CPU %)" for b in brokers) + " |"]
    lines.append("|---|" + "---:|" * len(brokers))
    keys: list[str] = []
    for b in brokers:
        for key in results["brokers"][b]["throughput"]:
            if key not in keys:
                keys.append(key)
    for key in keys:
        cells = []
        for b in brokers:
            res = results["brokers"][b]["throughput"].get(key, {})
            if res.get("msgs_per_s") is None:
                cells.append("failed")
            else:
                cells.append(
                    f"{res['msgs_per_s']:,.0f} ({_fmt(res.get('broker_cpu_us_per_msg'), 1)} us, "
                    f"{_fmt(res.get('broker_cpu_pct'))} %)"
                )
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    realtime_note = " (SCHED_FIFO)" if results["settings"].get("latency_realtime") else ""
    for qos, rate in latency_cases(results):
        cells = []
        for b in brokers:
            lat = latency_summary(results["brokers"][b]["latency"], rate, qos)
            cells.append(f"p50 {_fmt(lat.get('p50_ms'), 2)} / p99 {_fmt(lat.get('p99_ms'), 2)} ms")
        lines.append(f"| {latency_label(qos, rate)}{realtime_note} | " + " | ".join(cells) + " |")
    cells = []
    for b in brokers:
        idle = results["brokers"][b].get("idle") or {}
        cells.append(f"{_fmt(idle.get('kib_per_connection'), 2)} KiB ({idle.get('connections', 0)} conns)")
    lines.append("| RSS per idle connection | " + " | ".join(cells) + " |")
    cells = []
    for b in brokers:
        idle = results["brokers"][b].get("idle") or {}
        before = idle.get("rss_before_kib")
        cells.append("n/a" if before is None else f"{before / 1024:.1f} MiB")
    lines.append("| RSS of the idle broker (no connections) | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| target (SkipMQ) | measured | met? |")
    lines.append("|---|---|---|")
    for t in results["targets"]:
        lines.append(f"| {t['target']} | {t['value']} | {_verdict(t['met'])} |")
    return "\n".join(lines) + "\n"


def bar_chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    brokers = list(results["brokers"])
    keys: list[str] = []
    for b in brokers:
        for key in results["brokers"][b]["throughput"]:
            if key not in keys:
                keys.append(key)
    fig, ax = plt.subplots(figsize=(max(8, len(keys) * 0.9), 4.8))
    width = 0.8 / max(1, len(brokers))
    for i, b in enumerate(brokers):
        values = [results["brokers"][b]["throughput"].get(k, {}).get("msgs_per_s") or 0 for k in keys]
        ax.bar([x + i * width for x in range(len(keys))], values, width, label=b)
    ax.set_xticks([x + width * (len(brokers) - 1) / 2 for x in range(len(keys))])
    ax.set_xticklabels(keys, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("delivered messages / s")
    ax.set_yscale("log")
    ax.set_title(f"Broker throughput, {PAYLOAD_BYTES}-byte payloads (closed loop, same load client)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def findings(results: dict[str, Any]) -> list[str]:
    """Plain-language bullet points computed from the results (no hand-edited numbers)."""
    out: list[str] = []
    brokers = results["brokers"]

    def get(b: str, key: str, field_name: str) -> float | None:
        value = brokers.get(b, {}).get("throughput", {}).get(key, {}).get(field_name)
        return float(value) if value is not None else None

    for t in results.get("targets", []):
        out.append(f'- Target "{t["target"]}": **{_verdict(t["met"])}** ({t["value"]}).')
    sk = brokers.get("skipmq", {}).get("throughput", {})
    costs = [
        (k, ratio_cost)
        for k in sk
        if "subs" not in k
        for noisy in [next((n for n in sk if n.startswith(k + " +")), None)]
        if noisy and sk[k].get("broker_cpu_us_per_msg") and sk[noisy].get("broker_cpu_us_per_msg")
        for ratio_cost in [sk[noisy]["broker_cpu_us_per_msg"] / sk[k]["broker_cpu_us_per_msg"] - 1]
    ]
    if costs:
        worst_key, _ = max(costs, key=lambda kv: kv[1])
        noisy_key = next(n for n in sk if n.startswith(worst_key + " +"))

        def per_run(key: str) -> str:
            return ", ".join(f"{r['broker_cpu_us_per_msg']:.2f}" for r in sk[key].get("runs", [sk[key]]))

        out.append(
            f"- skipmq, worst case for the 10k subscriptions ({worst_key}): CPU us/msg per run "
            f"{per_run(worst_key)} without vs {per_run(noisy_key)} with them (run-to-run spread vs cost)."
        )
    for b in brokers:
        base = get(b, "qos0 1->1", "msgs_per_s")
        noisy = get(b, "qos0 1->1 +10k subs", "msgs_per_s")
        cpu0 = get(b, "qos0 1->1", "broker_cpu_us_per_msg")
        cpu1 = get(b, "qos0 1->1 +10k subs", "broker_cpu_us_per_msg")
        if base and noisy and cpu0 and cpu1:
            out.append(
                f"- {b}: QoS0 1->1 with 10k unrelated subscriptions: {_fmt(base)} -> {_fmt(noisy)} msgs/s, "
                f"CPU {cpu0:.1f} -> {cpu1:.1f} us/msg (x{cpu1 / cpu0:.2f})."
            )
    loads = [
        r.get("load_client_cpu_pct") or 0.0
        for b in brokers.values()
        for res in b["throughput"].values()
        for r in res.get("runs", [res])
    ]
    if loads:
        out.append(
            f"- The load client used at most {max(loads):.0f} % of a core in any run, so it was not the "
            "bottleneck."
        )
    for qos, rate in latency_cases(results):
        for b, data in brokers.items():
            lat = latency_summary(data.get("latency", []), rate, qos)
            if lat:
                per_round = ", ".join(
                    f"{r['p99_ms']:.2f}"
                    for r in data["latency"]
                    if r.get("rate") == rate and r.get("qos", 0) == qos and r.get("p99_ms") is not None
                )
                out.append(
                    f"- {b}: {latency_label(qos, rate)}, medians of {lat['rounds']} round(s): p99 "
                    f"{_fmt(lat.get('p99_ms'), 2)} ms (per round {per_round}), p99.9 "
                    f"{_fmt(lat.get('p999_ms'), 2)} ms, max {_fmt(lat.get('max_ms'), 2)} ms; the broker "
                    f"waited {_fmt(lat.get('broker_run_queue_wait_ms'), 1)} ms on a run queue per run."
                )
    for b, data in brokers.items():
        idle = data.get("idle") or {}
        if idle.get("kib_per_connection") is not None:
            out.append(
                f"- {b}: {idle['connections']} idle connections cost "
                f"{idle['kib_per_connection']:.2f} KiB each "
                f"(RSS {idle['rss_before_kib'] / 1024:.1f} -> {idle['rss_after_kib'] / 1024:.1f} MiB)."
            )
    return out


def previous_table(text: str) -> list[str]:
    """The machine line and the results table of the "## Broker core" section being replaced, so
    that the docs keep the previous figures beside the new ones (docs/benchmarks.md, the rule)."""
    start = text.find("## Broker core")
    if start == -1:
        return []
    end = text.find("\n## ", start + 1)
    lines = text[start : end if end != -1 else len(text)].splitlines()
    if "### The previous run, for comparison" in lines:  # only the last run is kept
        lines = lines[: lines.index("### The previous run, for comparison")]
    machine = [line for line in lines if line.startswith("- Machine:")]
    table = []
    for line in lines:
        if line.startswith("| scenario |") or (table and line.startswith("|")):
            table.append(line)
        elif table:
            break
    if not table:
        return []
    return [*(machine[:1]), "", *table]


def update_docs(results: dict[str, Any], table: str, command: str, docs_path: Path) -> None:
    m = results["machine"]
    section = [
        "## Broker core",
        "",
        "Produced by `bench/broker_bench.py` (see bench/README.md); raw results in",
        "`docs/broker_bench.json`, chart `docs/broker_bench.png`.",
        "",
        f"- Machine: {m['nproc']} CPUs ({m['cpu_model']}), Python {m['python']}, {m['platform']}; "
        f"run {m['date_utc']} UTC. The machine was shared with other jobs while this ran: treat",
        "  the figures as indicative (+-20 %), the ratios between brokers (same run, same clients)",
        "  as the result.",
        f"- Command: `{command}`",
        f"- Settings: {results['settings']['duration_s']} s measured per throughput scenario "
        "(after warm-up), "
        f"{PAYLOAD_BYTES}-byte payloads, MQTT 3.1.1 load clients (asyncio raw sockets, one process), "
        f"closed loop (<= {WINDOW_QOS0} undelivered QoS0 / {WINDOW_QOS1} QoS1 messages per subscriber, "
        "publisher QoS1 window 20); "
        f"{results['settings']['noise_subscriptions']} unrelated subscriptions held by another client "
        f"in the '+Nk subs' rows; {results['settings']['idle_connections']} idle connections for RSS.",
        "- Brokers: SkipMQ from this tree (uvloop, default config), Debian mosquitto 2.0.11 ("
        + ("`persistence true`, " if MOSQUITTO_PERSISTENCE else "no persistence, ")
        + "logging off), amqtt 0.12.1 broker with its default_broker.yaml (port changed). The load "
        "clients connect with clean sessions: neither broker writes a QoS 1 message of these rows to "
        "disk (SkipMQ commits what it queues for persistent sessions; bench/publish_cost.py measures that).",
        "- CPU us/msg = broker process utime+stime over the measured window / messages delivered;",
        "  CPU % = the broker's share of one core in that window (below 100 % = it was not CPU-bound:",
        "  other jobs held the cores, or the closed loop's round trip limited it). Throughput targets are",
        "  judged per broker CPU-second (1e6 / CPU us per message), which the background load disturbs",
        "  far less than raw msgs/s; both are shown. A broker that was not CPU-bound batches less, so its",
        "  CPU us/msg is, if anything, pessimistic.",
        f"- Figures are medians of {results['settings'].get('repeat', 1)} run(s) per scenario "
        "(all runs are in the JSON).",
        "- Latency: one publisher and one subscriber, paced (the publisher writes what is due "
        "every 0.5 ms), a send timestamp in the payload; QoS 0, and where listed QoS 1 to a subscriber "
        "with a persistent session (SkipMQ commits each message before its PUBACK; mosquitto "
        "writes its persistence file only on autosave); "
        f"{results['settings'].get('latency_duration_s')} s measured after 0.5 s of warm-up, a fresh "
        f"broker per run, {results['settings'].get('latency_rounds', 1)} round(s) per broker and rate "
        "interleaved between the brokers (medians)"
        + (
            "; load client and brokers ran as SCHED_FIFO (`--latency-realtime`), so that the other "
            "jobs of the shared machine did not preempt them."
            if results["settings"].get("latency_realtime")
            else "; default scheduling (other jobs of the shared machine preempt the brokers)."
        ),
        "",
        table,
        "![broker throughput](broker_bench.png)",
        "",
        "### Reading the results",
        "",
        *findings(results),
        "",
    ]
    text = docs_path.read_text() if docs_path.exists() else "# Benchmarks\n\n"
    previous = previous_table(text)
    if previous:
        section += ["### The previous run, for comparison", "", *previous, ""]
    start = text.find("## Broker core")
    if start == -1:
        new = text.rstrip("\n") + "\n\n" + "\n".join(section)
    else:
        nxt = text.find("\n## ", start + 1)
        new = text[:start] + "\n".join(section) + ("\n" + text[nxt + 1 :] if nxt != -1 else "")
    docs_path.write_text(new)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else "",
        epilog="Writes docs/broker_bench.json and docs/broker_bench.png; --update-docs also rewrites the "
        '"## Broker core" section of docs/benchmarks.md. A full run takes ~8 min on 2 cores '
        "(x1.6 with --repeat 2).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--brokers", default=",".join(ALL_BROKERS), help="comma-separated subset of skipmq,mosquitto,amqtt"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short runs: 2 s per scenario and latency rate, 2000 idle connections",
    )
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds measured per throughput scenario"
    )
    parser.add_argument("--idle-connections", type=int, default=None, help="idle connections for RSS (10000)")
    parser.add_argument("--noise-subscriptions", type=int, default=10_000, help="unrelated subscriptions")
    parser.add_argument(
        "--repeat", type=int, default=1, help="measure each throughput pair N times, report medians (1)"
    )
    parser.add_argument("--no-idle", action="store_true", help="skip the idle-connection RSS measurement")
    parser.add_argument("--no-latency", action="store_true", help="skip the paced latency runs")
    parser.add_argument(
        "--latency-rounds",
        type=int,
        default=1,
        help="paced latency runs per broker and rate, interleaved between brokers; medians (1)",
    )
    parser.add_argument(
        "--latency-qos",
        default="0",
        help="comma-separated QoS levels of the paced latency runs (default 0; 1 = QoS 1 to a "
        "persistent subscriber: SkipMQ commits each message before its PUBACK)",
    )
    parser.add_argument(
        "--latency-realtime",
        action="store_true",
        help="run the paced latency runs (load client and broker) as SCHED_FIFO, so that other jobs "
        "on a shared machine cannot preempt them (needs root or CAP_SYS_NICE)",
    )
    parser.add_argument(
        "--no-mosquitto-persistence", action="store_true", help="run mosquitto without 'persistence true'"
    )
    parser.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated subset of the throughput scenarios, e.g. 'qos0 1->1,qos1 1->1' (default all)",
    )
    parser.add_argument(
        "--broker-root",
        default=None,
        help="start SkipMQ from the broker package of this directory (another revision's checkout)",
    )
    parser.add_argument("--json", default=str(DOCS / "broker_bench.json"), help="results JSON path")
    parser.add_argument("--png", default=str(DOCS / "broker_bench.png"), help="bar chart PNG path")
    parser.add_argument(
        "--update-docs", action="store_true", help='rewrite "## Broker core" in docs/benchmarks.md'
    )
    parser.add_argument(
        "--from-json", default=None, help="do not measure: re-render table/chart/docs from a results JSON"
    )
    parser.add_argument("--run-amqtt-broker", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_amqtt_broker is not None:
        run_amqtt_broker(args.run_amqtt_broker)
        return 0
    if args.from_json:
        loaded: dict[str, Any] = json.loads(Path(args.from_json).read_text())
        return report(loaded, args)
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    unknown = [b for b in brokers if b not in ALL_BROKERS]
    if unknown:
        print(f"unknown broker(s) {unknown}; choose from {', '.join(ALL_BROKERS)}", file=sys.stderr)
        return 2
    if "mosquitto" in brokers and not Path(MOSQUITTO_BIN).exists():
        print(f"{MOSQUITTO_BIN} not found (apt-get install mosquitto)", file=sys.stderr)
        return 2
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    scenarios = SCENARIOS
    if args.scenarios:
        wanted = [w.strip() for w in args.scenarios.split(",") if w.strip()]
        scenarios = [sc for sc in SCENARIOS if f"qos{sc.qos} {sc.name}" in wanted]
        if len(scenarios) != len(wanted):
            known = ", ".join(f"qos{sc.qos} {sc.name}" for sc in SCENARIOS)
            print(f"unknown scenario in {wanted}; choose from {known}", file=sys.stderr)
            return 2
    global BROKER_ROOT, MOSQUITTO_PERSISTENCE
    if args.broker_root:
        BROKER_ROOT = Path(args.broker_root).resolve()
    MOSQUITTO_PERSISTENCE = not args.no_mosquitto_persistence
    settings = Settings(
        brokers=brokers,
        duration_s=args.duration or (2.0 if args.quick else 5.0),
        latency_duration_s=2.0 if args.quick else 5.0,
        latency_rates=[1000, 5000],
        noise_subscriptions=args.noise_subscriptions,
        idle_connections=args.idle_connections or (2000 if args.quick else 10_000),
        scenarios=scenarios,
        skip_idle=args.no_idle,
        skip_latency=args.no_latency,
        repeat=max(1, args.repeat),
        latency_realtime=args.latency_realtime,
        latency_rounds=max(1, args.latency_rounds),
        latency_qos=[int(q) for q in args.latency_qos.split(",") if q.strip()],
    )
    if settings.idle_connections > hard - 200:
        settings.idle_connections = hard - 200
        log(f"fd limit {hard}: idle connections capped at {settings.idle_connections}")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    results: dict[str, Any] = {
        "command": (
            "python bench/broker_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
        ).strip(),
        "machine": machine_info(),
        "settings": {k: v for k, v in settings.__dict__.items() if k != "scenarios"},
        "brokers": {},
    }
    workdir = Path(tempfile.mkdtemp(prefix="skipmq-bench-"))
    try:
        # interleaved: every measurement (the latency runs, each scenario, the idle connections)
        # runs for every broker back to back, so a change in the machine's background load
        # between measurements hits all brokers alike
        latency_phase = dataclasses.replace(settings, scenarios=[], skip_idle=True)
        phases: list[Settings] = [latency_phase] * settings.latency_rounds
        phases += [
            dataclasses.replace(settings, scenarios=[sc], skip_idle=True, skip_latency=True)
            for sc in settings.scenarios
        ]
        phases.append(dataclasses.replace(settings, scenarios=[], skip_latency=True))
        for phase_index, phase in enumerate(phases):
            for kind in brokers:
                part = asyncio.run(bench_one(kind, workdir / f"{kind}-{phase_index}", phase))
                merged = results["brokers"].setdefault(kind, {"version": "", "throughput": {}, "latency": []})
                merged["version"] = part["version"] or merged["version"]
                merged["throughput"].update(part["throughput"])
                merged["latency"].extend(part["latency"])
                if part.get("idle") is not None or "idle" not in merged:
                    merged["idle"] = part.get("idle")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report(results, args)


def report(results: dict[str, Any], args: argparse.Namespace) -> int:
    results["targets"] = evaluate_targets(results)
    table = markdown(results)
    print()
    print(table)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    bar_chart(results, Path(args.png))
    log(f"wrote {args.json} and {args.png}")
    if args.update_docs:
        update_docs(
            results, table, results.get("command", "python bench/broker_bench.py"), DOCS / "benchmarks.md"
        )
        log("updated docs/benchmarks.md (## Broker core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
