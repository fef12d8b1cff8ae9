"""Cluster benchmark: 1 vs 3 vs 5 SkipMQ brokers on loopback, and the one-hop/multi-hop switch
at a small routing-table size L (issue #4 "SkipMQ cluster", Benchmark section; run by hand).

What it follows:

* seed 003 (Banno & Shudo, SG-TBPS + FRT) §3.3/§3.5: a topic whose subscribers sit on fewer
  than about L brokers is reached in one hop (the publisher's broker holds a routing-table entry
  for every subscriber broker); a bigger one falls back to Skip-Graph multi-hop delivery. The
  brokers count the overlay hops of every forwarded message they deliver in the histogram
  ``skipmq_cluster_delivery_hops`` (1 = direct from the publisher's broker); this script reads
  it from ``GET /metrics`` before and after each measurement and reports the difference.
* the issue's measurement plan: one publisher (on broker 0) and 10 subscribers spread
  round-robin over the brokers of a 1-, 3- and 5-broker cluster, the same topic and the same
  clients; end-to-end latency p50/p99 from a ``perf_counter_ns`` timestamp in the payload (the
  clients share one process, hence one clock); aggregate delivered messages/s with a QoS 0
  publisher sending as fast as the closed loop allows and a QoS 1 publisher with a window;
  hop counts from the brokers' metrics. A standalone broker (clustering off) is measured too,
  as a reference. Every configuration runs side by side in each round (interleaved, rotating
  order) and the report uses medians of rounds; ``os.getloadavg()`` is recorded per measurement.
* the small-L run: ``cluster.table_size=L`` (default 2 and 4) on 8 brokers, publisher on broker
  0, one subscriber on each of brokers 1..k for k = 1, 2, 3, 4, 5, 7 (added step by step); each
  step is measured right after the warm-up and again once the routing tables had time to learn
  (``--small-l-settle-s``; the overlay's EEXP at publish runs at most every 10 s). The hop
  histogram per step shows the topic switching from one hop to multi-hop as k passes L.

Clients are a small asyncio raw-socket MQTT 3.1.1 client (hand-encoded CONNECT/SUBSCRIBE/
PUBLISH/PUBACK, MQTT 3.1.1 §3.1, §3.3, §3.4, §3.8) so client-side parsing stays cheap on the
2-core machine; brokers are started with ``tools.launcher.start_cluster``.

    .venv/bin/python bench/cluster_bench.py --help
    .venv/bin/python bench/cluster_bench.py --quick                 # ~1 min smoke run
    .venv/bin/python bench/cluster_bench.py --update-docs           # full run (~10 min)
    .venv/bin/python bench/cluster_bench.py --from-json R.json --update-docs   # re-render only

Size: one runnable script in six sections that share its result records - the load client, the
brokers, one configuration's measurements, the two phases, the report, the command line. The split
it would take first: the report (summaries, targets, markdown, figures; ~570 lines) into its own
module reading the results JSON, which ``--from-json`` already re-renders.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools import loadclient  # noqa: E402
from tools import mqtt_raw as raw  # noqa: E402
from tools.launcher import LocalCluster, start_cluster  # noqa: E402
from tools.loadclient import LoadClient  # noqa: E402
from tools.ports import free_ports  # noqa: E402
from tools.proc_stats import context_switches, cpu_s  # noqa: E402

DOCS = REPO_ROOT / "docs"
FIGURES = DOCS / "figures"
RESULTS_MD = DOCS / "benchmarks-cluster.md"
HOST = "127.0.0.1"
TOPIC = "bench/cluster/temperature"
SUBSCRIPTION_FILTER = TOPIC
PAYLOAD_BYTES = 64
CLK_TCK = os.sysconf("SC_CLK_TCK")
BROKER_SETTINGS: dict[str, str] = {"sys.interval_s": "0", "logging.level": "warning"}
MAIN_KINDS = ("latency", "qos0", "qos1")  # the measurements of the main phase, in this order
STANDALONE = 0  # the "broker count" key of the standalone (clustering off) reference broker
# --tls-compare: the key -N is N brokers with plaintext links (cluster.insecure = true) beside the
# N brokers with mutual TLS between them (the default, docs/security.md)

# closed loop: undelivered messages allowed per subscriber (below the default max_queued_messages
# of 1000, so no broker needs to drop anything by design)
DELIVERY_WINDOW = 500
PUBLISH_BATCH = 50
STALL_S = 2.0  # no progress for this long while messages are outstanding: a stall (counted)
DRAIN_S = 3.0  # after a run: wait this long (without progress) for late deliveries
DRAIN_QOS1_S = 7.0  # ... and this long for missing PUBACKs (default publish_ack_wait_ms is 5 s)
WARMUP_TIMEOUT_S = 30.0
WARMUP_PROBE_INTERVAL_S = 0.05
SETTLE_S = 0.5  # probes keep flowing this long after every subscriber saw one
SETTLE_PROBE_RATE_PER_S = 50.0  # small-L run: probe rate while the routing tables settle
CONNECT_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 5.0

KIND_PROBE = b"W"
KIND_DATA = b"D"
PAYLOAD_HEAD = struct.Struct("!cIIq")  # kind, run tag, sequence number, perf_counter_ns at send
PAYLOAD_PAD = b"\x00" * (PAYLOAD_BYTES - PAYLOAD_HEAD.size)
HOP_BUCKET_LABELS = (*(str(hops) for hops in range(1, 17)), "+Inf")  # a broker before #14: 1,2,3,4,6,8,12,16

ProgressFn = Callable[[str], None]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def make_payload(kind: bytes, run_tag: int, seq: int, sent_ns: int) -> bytes:
    return PAYLOAD_HEAD.pack(kind, run_tag, seq, sent_ns) + PAYLOAD_PAD


# ---- the load client ---------------------------------------------------------------------------
class BenchClient(LoadClient):
    """One MQTT connection (tools.loadclient does the set-up): a subscriber counts the data
    messages of the current run (and their latencies when asked) and acknowledges QoS 1; the
    publisher counts its PUBACKs."""

    def __init__(self, name: str, progress: asyncio.Event) -> None:
        super().__init__(name)
        self.progress = progress
        # subscriber state
        self.run_tag = b""  # 4 bytes: only data of this run is counted
        self.received = 0
        self.latencies_ns: list[int] | None = None
        self.probe_tag = b""
        self.probe_seen = False
        self.protocol_errors = 0
        # publisher state
        self.acked = 0
        self.puback_sent_ns: dict[bytes, int] | None = None  # packet id -> send time, when timed
        self.puback_rtt_ns: list[int] = []

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.progress.set()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        size = len(buf)
        pos = 0
        now_ns = time.perf_counter_ns()
        acks = bytearray()
        counted = 0
        acked = 0
        run_tag = self.run_tag
        latencies = self.latencies_ns
        while size - pos >= 2:
            first = buf[pos]
            length = 0
            shift = 0
            index = pos + 1
            complete = False
            while index < size:
                byte = buf[index]
                index += 1
                length |= (byte & 0x7F) << shift
                if byte < 0x80:
                    complete = True
                    break
                shift += 7
            end = index + length
            if not complete or end > size:
                break
            ptype = first >> 4
            if ptype == 3:
                qos = (first >> 1) & 3
                topic_len = (buf[index] << 8) | buf[index + 1]
                start = index + 2 + topic_len
                if qos:
                    acks += b"\x40\x02"
                    acks += buf[start : start + 2]
                    start += 2
                kind = buf[start : start + 1]
                if kind == KIND_DATA:
                    if buf[start + 1 : start + 5] == run_tag:
                        counted += 1
                        if latencies is not None:
                            sent_ns = int.from_bytes(buf[start + 9 : start + 17], "big", signed=True)
                            latencies.append(now_ns - sent_ns)
                elif kind == KIND_PROBE and buf[start + 1 : start + 5] == self.probe_tag:
                    self.probe_seen = True
            elif ptype == 4:
                acked += 1
                sent_at = self.puback_sent_ns
                if sent_at is not None:
                    sent_ns = sent_at.pop(bytes(buf[index : index + 2]), -1)
                    if sent_ns >= 0:
                        self.puback_rtt_ns.append(now_ns - sent_ns)
            elif ptype == 2:
                self.connack_received(buf[index + 1] if length >= 2 else 255)
            elif ptype == 9:
                self.suback_received((buf[index] << 8) | buf[index + 1], bytes(buf[index:end]))
            elif ptype != 13:  # PINGRESP is harmless; anything else is unexpected
                self.protocol_errors += 1
            pos = end
        if pos:
            del buf[:pos]
        if acks and self.transport is not None:
            self.transport.write(bytes(acks))
        if counted or acked:
            self.received += counted
            self.unacked -= acked
            self.acked += acked
            self.progress.set()

    # helpers
    def begin_run(self, run_tag: int, *, record_latency: bool) -> None:
        self.run_tag = struct.pack("!I", run_tag)
        self.received = 0
        self.latencies_ns = [] if record_latency else None


async def connect_client(name: str, port: int, progress: asyncio.Event) -> BenchClient:
    def factory() -> BenchClient:
        return BenchClient(name, progress)

    return await loadclient.open_client(factory, port, name, timeout_s=CONNECT_TIMEOUT_S)


async def subscribe(client: BenchClient, topic_filter: str, qos: int) -> None:
    await loadclient.subscribe(client, [topic_filter], qos, timeout_s=CONNECT_TIMEOUT_S)


# ---- brokers -----------------------------------------------------------------------------------
class StandaloneBroker:
    """One SkipMQ broker with clustering off (``python -m broker``), the reference single broker."""

    def __init__(self) -> None:
        self.data_dir = tempfile.mkdtemp(prefix="skipmq-bench-standalone-")
        self.mqtt_port, self.http_port = free_ports(2)
        self.log_path = os.path.join(self.data_dir, "broker.log")
        cmd = [
            sys.executable, "-m", "broker", "--bind", HOST, "--port", str(self.mqtt_port),
            "--http-port", str(self.http_port), "--data-dir", self.data_dir, "--node-id", "standalone",
        ]  # fmt: skip
        for key, value in BROKER_SETTINGS.items():
            cmd += ["--set", f"{key}={value}"]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                cmd, cwd=self.data_dir, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 20.0
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"standalone broker exited with {self.process.returncode}: {self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"http://{HOST}:{self.http_port}/healthz", timeout=1.0) as rsp:
                    if rsp.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"standalone broker not healthy within 20 s: {self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-20:])
        return ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process in seconds (tools.proc_stats); 0.0 once it is gone."""
    try:
        return cpu_s(pid)
    except OSError:
        return 0.0


def parse_hops(metrics_text: str) -> dict[str, float]:
    """Cumulative ``skipmq_cluster_delivery_hops_bucket`` counts by ``le`` label."""
    buckets: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith("skipmq_cluster_delivery_hops_bucket{"):
            labels, _, value = line.rpartition(" ")
            le = labels.split('le="', 1)[1].split('"', 1)[0]
            le = le[:-2] if le.endswith(".0") else le
            buckets[le] = float(value)
    return buckets


def hops_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Per-bucket (non-cumulative) deliveries between two scrapes: {"1": n1, "2": n2, ...}."""
    result: dict[str, int] = {}
    previous = 0.0
    for label in HOP_BUCKET_LABELS:
        if label not in after:
            continue  # a bucket this broker does not expose: the next one covers it
        cumulative = after[label] - before.get(label, 0.0)
        count = round(cumulative - previous)
        if count:
            result[label] = count
        previous = cumulative
    return result


def merge_hops(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for label, count in part.items():
            total[label] = total.get(label, 0) + count
    return {label: total[label] for label in HOP_BUCKET_LABELS if label in total}


def hops_mean(hist: dict[str, int]) -> float | None:
    count = sum(hist.values())
    if not count:
        return None
    return sum((16.0 if label == "+Inf" else float(label)) * n for label, n in hist.items()) / count


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, math.ceil(fraction * len(sorted_values)) - 1))
    return float(sorted_values[rank])


def http_text(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=HTTP_TIMEOUT_S) as response:
        return str(response.read().decode("utf-8", errors="replace"))


# ---- one configuration under test: brokers + the same clients ----------------------------------
@dataclass
class Setup:
    """A broker set (standalone or an n-broker cluster) with 1 publisher and its subscribers."""

    brokers: int  # 0 = standalone
    label: str
    mqtt_ports: list[int]
    http_ports: list[int]
    pids: list[int]
    cluster: LocalCluster | None = None
    standalone: StandaloneBroker | None = None
    publisher: BenchClient | None = None
    subscribers: list[BenchClient] = field(default_factory=list)
    subscriber_broker: list[int] = field(default_factory=list)
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def clustered(self) -> bool:
        return self.cluster is not None

    def scrape_hops(self) -> list[dict[str, float]]:
        if self.cluster is None:
            return []
        return [parse_hops(http_text(port, "/metrics")) for port in self.http_ports]

    def cpu_s(self) -> float:
        return sum(process_cpu_s(pid) for pid in self.pids)

    def switches(self) -> int:
        """Context switches of every thread of every broker so far (tools.proc_stats)."""
        total = 0
        for pid in self.pids:
            with contextlib.suppress(OSError):
                total += context_switches(pid)
        return total

    def close(self) -> None:
        for client in [self.publisher, *self.subscribers]:
            if client is not None:
                client.close()
        if self.cluster is not None:
            self.cluster.close()
        if self.standalone is not None:
            self.standalone.close()


def label_for(brokers: int) -> str:
    if brokers == STANDALONE:
        return "standalone"
    if brokers < 0:
        return f"{-brokers} brokers, plaintext"
    return f"{brokers} broker" + ("s" if brokers > 1 else "")


async def start_setup(brokers: int, settings: dict[str, str]) -> Setup:
    if brokers == STANDALONE:
        standalone = await asyncio.to_thread(StandaloneBroker)
        return Setup(
            STANDALONE, label_for(STANDALONE), [standalone.mqtt_port], [standalone.http_port],
            [standalone.pid], standalone=standalone,
        )  # fmt: skip
    if brokers < 0:
        settings = {**settings, "cluster.insecure": "true"}
    cluster = await asyncio.to_thread(start_cluster, abs(brokers), settings={**BROKER_SETTINGS, **settings})
    try:
        await asyncio.to_thread(cluster.wait_ready, 60)
    except BaseException:
        cluster.close()
        raise
    return Setup(
        brokers,
        label_for(brokers),
        [b.mqtt_port for b in cluster.brokers],
        [b.http_port for b in cluster.brokers],
        [int(b.pid) for b in cluster.brokers if b.pid is not None],
        cluster=cluster,
    )


_client_counter = 0


def _client_name(prefix: str) -> str:
    global _client_counter
    _client_counter += 1
    return f"{prefix}-{os.getpid()}-{_client_counter}"


async def connect_publisher(setup: Setup) -> None:
    setup.publisher = await connect_client(_client_name("bench-pub"), setup.mqtt_ports[0], setup.progress)


async def add_subscriber(setup: Setup, broker_index: int) -> BenchClient:
    client = await connect_client(_client_name("bench-sub"), setup.mqtt_ports[broker_index], setup.progress)
    await subscribe(client, SUBSCRIPTION_FILTER, 1)
    setup.subscribers.append(client)
    setup.subscriber_broker.append(broker_index)
    return client


_tags = iter(range(1, 2**31))


def next_tag() -> int:
    return next(_tags)


async def warm_up(setup: Setup) -> float:
    """Publish probes from broker 0 until every subscriber received one (its broker's subscription
    reached the publisher's broker through the overlay), then SETTLE_S more; returns seconds."""
    publisher = setup.publisher
    assert publisher is not None
    tag = next_tag()
    tag_bytes = struct.pack("!I", tag)
    for sub in setup.subscribers:
        sub.probe_tag = tag_bytes
        sub.probe_seen = False
    prefix = raw.publish_prefix(TOPIC, 0, PAYLOAD_BYTES)
    start = time.monotonic()
    settle_until: float | None = None
    seq = 0
    while True:
        now = time.monotonic()
        if settle_until is None and all(sub.probe_seen for sub in setup.subscribers):
            settle_until = now + SETTLE_S
        if settle_until is not None and now >= settle_until:
            return now - start
        if now - start > WARMUP_TIMEOUT_S:
            missing = [
                f"{sub.name} on broker {broker}"
                for sub, broker in zip(setup.subscribers, setup.subscriber_broker, strict=True)
                if not sub.probe_seen
            ]
            raise TimeoutError(
                f"{setup.label}: no probe reached {', '.join(missing)} within {WARMUP_TIMEOUT_S} s"
                " (the subscription never propagated through the overlay)"
            )
        seq += 1
        publisher.write(prefix + make_payload(KIND_PROBE, tag, seq, time.perf_counter_ns()))
        await asyncio.sleep(WARMUP_PROBE_INTERVAL_S)


async def publish_probes(setup: Setup, duration_s: float, rate_per_s: float) -> int:
    """Keep the topic in use: probes (not counted as data) at rate_per_s for duration_s."""
    publisher = setup.publisher
    assert publisher is not None
    prefix = raw.publish_prefix(TOPIC, 0, PAYLOAD_BYTES)
    tag = next_tag()
    end = time.monotonic() + duration_s
    sent = 0
    while time.monotonic() < end:
        sent += 1
        publisher.write(prefix + make_payload(KIND_PROBE, tag, sent, time.perf_counter_ns()))
        await asyncio.sleep(1.0 / rate_per_s)
    return sent


async def wait_drained(setup: Setup, expected_per_subscriber: int, *, qos1_publisher: bool) -> None:
    """Wait until every subscriber got expected messages (and PUBACKs are in), or DRAIN_S passes
    without progress (DRAIN_QOS1_S while PUBACKs are missing: a broker may hold a PUBACK up to
    cluster.publish_ack_wait_ms)."""
    publisher = setup.publisher
    assert publisher is not None
    while True:
        done = all(sub.received >= expected_per_subscriber for sub in setup.subscribers)
        if done and (not qos1_publisher or publisher.unacked <= 0):
            return
        setup.progress.clear()
        quiet_s = DRAIN_QOS1_S if qos1_publisher and publisher.unacked > 0 else DRAIN_S
        try:
            await asyncio.wait_for(setup.progress.wait(), quiet_s)
        except TimeoutError:
            return


def latency_summary(values_ns: list[int]) -> dict[str, float]:
    ordered = sorted(values_ns)
    return {
        "count": float(len(ordered)),
        "p50_ms": percentile(ordered, 0.50) / 1e6,
        "p99_ms": percentile(ordered, 0.99) / 1e6,
        "max_ms": (ordered[-1] / 1e6) if ordered else float("nan"),
    }


async def measure_latency(setup: Setup, rate_per_s: float, duration_s: float, qos: int = 0) -> dict[str, Any]:
    """Paced publishing (QoS ``qos``: 0, or 1 with a packet id each and the PUBACKs timed) at
    rate_per_s for duration_s; end-to-end latency per delivery."""
    publisher = setup.publisher
    assert publisher is not None
    tag = next_tag()
    for sub in setup.subscribers:
        sub.begin_run(tag, record_latency=True)
    count = max(1, int(rate_per_s * duration_s))
    interval_ns = int(1e9 / rate_per_s)
    prefix = raw.publish_prefix(TOPIC, qos, PAYLOAD_BYTES)
    sent_at: dict[bytes, int] = {}
    publisher.unacked = 0
    publisher.puback_sent_ns = sent_at if qos else None
    publisher.puback_rtt_ns = []
    hops_before = await asyncio.to_thread(setup.scrape_hops)
    cpu_before = setup.cpu_s()
    cpu_each_before = [process_cpu_s(pid) for pid in setup.pids]
    switches_before = setup.switches()
    start_ns = time.perf_counter_ns()
    for seq in range(count):
        delay_ns = start_ns + seq * interval_ns - time.perf_counter_ns()
        if delay_ns > 0:
            await asyncio.sleep(delay_ns / 1e9)
        now_ns = time.perf_counter_ns()
        if qos:
            id_bytes = (seq % 65535 + 1).to_bytes(2, "big")
            sent_at[id_bytes] = now_ns
            publisher.unacked += 1
            publisher.write(prefix + id_bytes + make_payload(KIND_DATA, tag, seq, now_ns))
        else:
            publisher.write(prefix + make_payload(KIND_DATA, tag, seq, now_ns))
    await wait_drained(setup, count, qos1_publisher=bool(qos))
    # the brokers' CPU per message published at this paced rate (every message alone in its
    # event-loop iteration: what a cross-broker hop costs unbatched, issue #11)
    cpu_us_per_publish = (setup.cpu_s() - cpu_before) * 1e6 / count
    cpu_us_each = [
        (process_cpu_s(pid) - before) * 1e6 / count
        for pid, before in zip(setup.pids, cpu_each_before, strict=True)
    ]
    # ... and how many times a broker thread slept and was woken per message (each a hand-off
    # between threads or processes: docs/benchmarks-cluster.md, "Why the latency goal ...")
    switches_per_publish = (setup.switches() - switches_before) / count
    hops_after = await asyncio.to_thread(setup.scrape_hops)
    everyone: list[int] = []
    remote: list[int] = []
    local: list[int] = []
    sub_p50: list[float | None] = []
    received = 0
    for sub, broker in zip(setup.subscribers, setup.subscriber_broker, strict=True):
        values = sub.latencies_ns or []
        sub_p50.append(percentile(sorted(values), 0.5) / 1e6 if values else None)
        received += sub.received
        everyone.extend(values)
        (remote if broker != 0 else local).extend(values)
        sub.latencies_ns = None
    expected = count * len(setup.subscribers)
    per_broker = [hops_delta(b, a) for b, a in zip(hops_before, hops_after, strict=True)]
    per_subscriber = [
        {"broker": broker, "received": sub.received, "p50_ms": p50}
        for sub, broker, p50 in zip(setup.subscribers, setup.subscriber_broker, sub_p50, strict=True)
    ]
    rtts = sorted(publisher.puback_rtt_ns)
    publisher.puback_sent_ns = None
    return {
        "qos": qos,
        "published": count,
        "puback_p50_ms": percentile(rtts, 0.5) / 1e6 if rtts else None,
        "puback_p99_ms": percentile(rtts, 0.99) / 1e6 if rtts else None,
        "broker_cpu_us_per_publish": cpu_us_per_publish,
        "broker_cpu_us_per_publish_each": cpu_us_each,  # per broker process (broker 0 first)
        "broker_switches_per_publish": switches_per_publish,
        "expected": expected,
        "received": received,
        "lost": expected - received,
        "all": latency_summary(everyone),
        "remote": latency_summary(remote) if remote else None,
        "local": latency_summary(local) if local else None,
        "hops": merge_hops(per_broker),
        "hops_per_broker": per_broker,
        "per_subscriber": per_subscriber,
    }


async def measure_throughput(
    setup: Setup, qos: int, duration_s: float, publish_window: int
) -> dict[str, Any]:
    """Closed-loop throughput: the publisher sends as fast as QoS allows, at most DELIVERY_WINDOW
    messages ahead of the slowest subscriber and (QoS 1) at most publish_window unacknowledged."""
    publisher = setup.publisher
    assert publisher is not None
    subs = setup.subscribers
    tag = next_tag()
    for sub in subs:
        sub.begin_run(tag, record_latency=False)
    publisher.unacked = 0
    sent_at: dict[bytes, int] = {}
    publisher.puback_sent_ns = sent_at if qos else None
    publisher.puback_rtt_ns = []
    prefix = raw.publish_prefix(TOPIC, qos, PAYLOAD_BYTES)
    payload = make_payload(KIND_DATA, tag, 0, 0)
    qos0_packet = prefix + payload
    packet_id = 0
    sent = 0
    credit = 0  # messages written off by a stall
    stalls = 0
    progress = setup.progress
    hops_before = await asyncio.to_thread(setup.scrape_hops)
    cpu_before = setup.cpu_s()
    start = time.perf_counter()
    end = start + duration_s
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        slowest = min(sub.received for sub in subs)
        allowed = slowest + credit + DELIVERY_WINDOW - sent
        if qos:
            allowed = min(allowed, publish_window - publisher.unacked)
        if allowed > 0:
            batch = min(allowed, PUBLISH_BATCH)
            if qos == 0:
                publisher.write(qos0_packet * batch)
            else:
                parts = []
                sent_ns = time.perf_counter_ns()
                for _ in range(batch):
                    packet_id = packet_id % 65535 + 1
                    id_bytes = packet_id.to_bytes(2, "big")
                    parts.append(prefix + id_bytes + payload)
                    sent_at[id_bytes] = sent_ns
                publisher.write(b"".join(parts))
                publisher.unacked += batch
            sent += batch
            await asyncio.sleep(0)
            continue
        progress.clear()
        wait_s = min(STALL_S, end - now + 0.001)
        try:
            await asyncio.wait_for(progress.wait(), wait_s)
        except TimeoutError:
            if wait_s < STALL_S:
                break  # the measured window ended while waiting
            # deliveries missing for STALL_S: the broker dropped them, write them off. Missing
            # PUBACKs are not written off: a broker may hold them (cluster.publish_ack_wait_ms), and
            # their late arrival is what the PUBACK latency must show.
            stalls += 1
            credit = sent - min(sub.received for sub in subs)
    elapsed_s = time.perf_counter() - start
    delivered_in_window = sum(sub.received for sub in subs)
    cpu_s = setup.cpu_s() - cpu_before
    await wait_drained(setup, sent, qos1_publisher=bool(qos))
    hops_after = await asyncio.to_thread(setup.scrape_hops)
    per_broker = [hops_delta(b, a) for b, a in zip(hops_before, hops_after, strict=True)]
    delivered_total = sum(sub.received for sub in subs)
    rtts = sorted(publisher.puback_rtt_ns)
    publisher.puback_sent_ns = None
    return {
        "qos": qos,
        "published": sent,
        "delivered_per_s": delivered_in_window / elapsed_s,
        "published_per_s": sent / elapsed_s,
        "lost": sent * len(subs) - delivered_total,
        "stalls": stalls,
        "broker_cpu_us_per_msg": (cpu_s * 1e6 / delivered_in_window) if delivered_in_window else None,
        "broker_cpu_pct": 100.0 * cpu_s / elapsed_s,
        "puback_p50_ms": percentile(rtts, 0.5) / 1e6 if rtts else None,
        "puback_p99_ms": percentile(rtts, 0.99) / 1e6 if rtts else None,
        "unacked_at_end": publisher.unacked if qos else 0,
        "hops": merge_hops(per_broker),
    }


# ---- the two phases -------------------------------------------------------------------------------
@dataclass
class Plan:
    broker_counts: list[int]
    standalone: bool
    tls_compare: bool
    subscribers: int
    rounds: int
    latency_rate_per_s: float
    latency_s: float
    throughput_s: float
    qos1_window: int
    small_l_sizes: list[int]
    small_l_brokers: int
    small_l_steps: list[int]
    small_l_messages: int
    small_l_rate_per_s: float
    small_l_settle_s: float
    small_l_repeats: int
    kinds: tuple[str, ...] = MAIN_KINDS
    local: bool = False  # every subscriber on the publisher's broker (local deliveries in a cluster)
    profile_dir: str | None = None  # --profile: py-spy samples of every broker in the latency runs
    profile_tool: str = "py-spy"  # --profile-tool: py-spy (Python stacks) or perf (native, kernel)
    latency_qos: int = 0  # --latency-qos: the paced runs' PUBLISH QoS


async def run_main_phase(plan: Plan, results: dict[str, Any]) -> None:
    """All configurations run at once; every round measures each of them back to back."""
    configs = ([STANDALONE] if plan.standalone else []) + plan.broker_counts
    if plan.tls_compare:
        configs += [-n for n in plan.broker_counts if n > 1]
    setups: list[Setup] = []
    records: list[dict[str, Any]] = results.setdefault("main", [])
    try:
        for brokers in configs:
            log(f"starting {label_for(brokers)} ...")
            setup = await start_setup(brokers, {})
            setups.append(setup)
            await connect_publisher(setup)
            count = 1 if plan.local else max(1, abs(brokers))
            for j in range(plan.subscribers):
                await add_subscriber(setup, j % count)
            warm_s = await warm_up(setup)
            log(f"{setup.label}: {plan.subscribers} subscribers warmed up in {warm_s:.2f} s")
        kinds = plan.kinds
        for round_index in range(plan.rounds):
            for kind in kinds:
                order = setups[round_index % len(setups) :] + setups[: round_index % len(setups)]
                for setup in order:
                    load_before = os.getloadavg()
                    if kind == "latency":
                        spies = start_profilers(plan, setup, round_index, kind, plan.latency_s)
                        result = await measure_latency(
                            setup, plan.latency_rate_per_s, plan.latency_s, plan.latency_qos
                        )
                        await finish_profilers(spies)
                        summary = (
                            f"p50 {result['all']['p50_ms']:.3f} ms p99 {result['all']['p99_ms']:.3f} ms"
                            + (
                                f" (other brokers p50 {result['remote']['p50_ms']:.3f} ms)"
                                if result["remote"]
                                else ""
                            )
                            + f" lost {result['lost']} hops {result['hops'] or '-'}"
                            + f" (brokers {result['broker_cpu_us_per_publish']:.0f} us CPU"
                            + f" {'/'.join(f'{x:.0f}' for x in result['broker_cpu_us_per_publish_each'])},"
                            f" {result['broker_switches_per_publish']:.1f} context switches per message)"
                        )
                        if result["puback_p50_ms"] is not None:
                            summary += (
                                f" PUBACK p50 {result['puback_p50_ms']:.2f} ms"
                                f" p99 {result['puback_p99_ms']:.2f} ms"
                            )
                    else:
                        qos = 0 if kind == "qos0" else 1
                        spies = start_profilers(plan, setup, round_index, kind, plan.throughput_s)
                        result = await measure_throughput(setup, qos, plan.throughput_s, plan.qos1_window)
                        await finish_profilers(spies)
                        cpu = result["broker_cpu_us_per_msg"]
                        summary = (
                            f"{result['delivered_per_s']:,.0f} delivered/s"
                            f" (brokers {cpu if cpu is None else round(cpu, 1)} us CPU/msg,"
                            f" {result['broker_cpu_pct']:.0f} % CPU) lost {result['lost']}"
                            f" stalls {result['stalls']} hops {result['hops'] or '-'}"
                        )
                        if result["puback_p50_ms"] is not None:
                            summary += (
                                f" PUBACK p50 {result['puback_p50_ms']:.2f} ms"
                                f" p99 {result['puback_p99_ms']:.2f} ms"
                            )
                    record = {
                        "round": round_index,
                        "brokers": setup.brokers,
                        "kind": kind,
                        "loadavg": [round(x, 2) for x in load_before],
                        **result,
                    }
                    records.append(record)
                    log(
                        f"round {round_index + 1}/{plan.rounds} {kind:7s} {setup.label:11s}: {summary}"
                        f" [load {load_before[0]:.1f}]"
                    )
    finally:
        for setup in setups:
            setup.close()


def start_profilers(
    plan: Plan, setup: Setup, round_index: int, kind: str, duration_s: float
) -> list[subprocess.Popen[bytes]]:
    """--profile: ``py-spy record --nonblocking -f raw`` (collapsed stacks) of every broker of a
    cluster for a run's length, one file per broker, kind and round (bench/link_profile.py)."""
    if plan.profile_dir is None or not setup.clustered:
        return []
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out_dir = Path(plan.profile_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    label = setup.label.replace(" ", "-").replace(",", "")
    seconds = str(max(1, math.ceil(duration_s)))
    spies = []
    for index, pid in enumerate(setup.pids):
        name = f"{label}-{kind}-r{round_index + 1}-broker{index}"
        if plan.profile_tool == "perf":  # native stacks, kernel included: perf report -i FILE --sort dso
            command = ["perf", "record", "-F", "499", "-g", "-p", str(pid), "-o", f"{out_dir / name}.data"]
            command += ["--", "sleep", seconds]
        else:
            command = [
                spy,
                "record",
                "--nonblocking",
                "-r",
                "250",
                "-f",
                "raw",
                "-o",
                f"{out_dir / name}.txt",
            ]
            command += ["-d", seconds, "-p", str(pid)]
        spies.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


async def finish_profilers(spies: list[subprocess.Popen[bytes]]) -> None:
    for spy in spies:
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(spy.wait, 30)
        if spy.poll() is None:
            spy.kill()


async def run_small_l_phase(plan: Plan, results: dict[str, Any]) -> None:
    """Per repeat and L: a fresh cluster of small_l_brokers brokers (new random overlay keys),
    subscribers added step by step; each step is measured in a window right after the warm-up and
    in one small_l_settle_s later, so the transient right after a subscriber broker joined shows
    apart from the settled route."""
    runs: list[dict[str, Any]] = results.setdefault("small_l", [])
    window_s = plan.small_l_messages / plan.small_l_rate_per_s
    for repeat in range(plan.small_l_repeats):
        for table_size in plan.small_l_sizes:
            log(
                f"small-L run {repeat + 1}/{plan.small_l_repeats}: {plan.small_l_brokers} brokers,"
                f" cluster.table_size={table_size} ..."
            )
            setup = await start_setup(plan.small_l_brokers, {"cluster.table_size": str(table_size)})
            run: dict[str, Any] = {
                "table_size": table_size,
                "brokers": plan.small_l_brokers,
                "repeat": repeat,
                "steps": [],
            }
            runs.append(run)
            try:
                await connect_publisher(setup)
                for step in plan.small_l_steps:
                    while len(setup.subscribers) < step:
                        await add_subscriber(setup, len(setup.subscribers) + 1)
                    warm_s = await warm_up(setup)
                    windows: list[dict[str, Any]] = []
                    settle_until = time.monotonic() + plan.small_l_settle_s
                    for window in range(2):
                        if window == 1:
                            # let the routing tables learn (EEXP at publish is rate-limited to one per
                            # eexp_publish_min_interval_s, 10 s by default) while the topic stays in use
                            await publish_probes(
                                setup, settle_until - time.monotonic(), SETTLE_PROBE_RATE_PER_S
                            )
                        load_before = os.getloadavg()
                        result = await measure_latency(setup, plan.small_l_rate_per_s, window_s)
                        windows.append(
                            {
                                "loadavg": [round(x, 2) for x in load_before],
                                "published": result["published"],
                                "lost": result["lost"],
                                "latency": result["all"],
                                "hops": result["hops"],
                                "hops_per_broker": result["hops_per_broker"],
                                "per_subscriber": result["per_subscriber"],
                            }
                        )
                    run["steps"].append(
                        {
                            "subscriber_brokers": step,
                            "warmup_s": round(warm_s, 3),
                            "settle_s": plan.small_l_settle_s,
                            "windows": windows,
                        }
                    )
                    first, last = windows[0], windows[-1]
                    log(
                        f"L={table_size} subscribers on {step} broker(s): hops first window"
                        f" {first['hops'] or '-'} -> last window {last['hops'] or '-'}"
                        f" (mean {_fmt(hops_mean(last['hops']), 2)}),"
                        f" last p50 {last['latency']['p50_ms']:.3f} ms"
                        f" p99 {last['latency']['p99_ms']:.3f} ms, lost {sum(w['lost'] for w in windows)}"
                        f" [load {windows[0]['loadavg'][0]:.1f}]"
                    )
            finally:
                setup.close()


def aggregate_small_l(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per L, per k: hop histograms of the first and of the last window summed over repeats,
    median p50/p99 of the last windows, losses."""
    by_size: dict[int, dict[str, Any]] = {}
    for run in runs:
        entry = by_size.setdefault(
            run["table_size"],
            {"table_size": run["table_size"], "brokers": run["brokers"], "repeats": 0, "steps": {}},
        )
        entry["repeats"] += 1
        for step in run["steps"]:
            windows = step["windows"]
            agg = entry["steps"].setdefault(
                step["subscriber_brokers"],
                {"subscriber_brokers": step["subscriber_brokers"], "first": [], "last": [], "p50": [],
                 "p99": [], "lost": 0, "windows": 0, "load": []},
            )  # fmt: skip
            agg["first"].append(windows[0]["hops"])
            agg["last"].append(windows[-1]["hops"])
            agg["p50"].append(windows[-1]["latency"]["p50_ms"])
            agg["p99"].append(windows[-1]["latency"]["p99_ms"])
            agg["lost"] += sum(w["lost"] for w in windows)
            agg["windows"] = len(windows)
            agg["load"].extend(w["loadavg"][0] for w in windows)
    result = []
    for table_size in sorted(by_size):
        entry = by_size[table_size]
        steps = []
        for k in sorted(entry["steps"]):
            agg = entry["steps"][k]
            steps.append(
                {
                    "subscriber_brokers": k,
                    "hops_first": merge_hops(agg["first"]),
                    "hops": merge_hops(agg["last"]),
                    "p50_ms": _median(agg["p50"]),
                    "p99_ms": _median(agg["p99"]),
                    "lost": agg["lost"],
                    "windows": agg["windows"],
                    "load": agg["load"],
                }
            )
        result.append(
            {
                "table_size": table_size,
                "brokers": entry["brokers"],
                "repeats": entry["repeats"],
                "steps": steps,
            }
        )
    return result


# ---- summaries, targets, markdown, figures -------------------------------------------------------
def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None and v == v]
    return statistics.median(present) if present else None


def summarize_main(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per broker count: medians over rounds (and min/max for the plots)."""
    summary: dict[int, dict[str, Any]] = {}
    for brokers in sorted({r["brokers"] for r in records}, key=lambda b: (abs(b), b < 0)):
        mine = [r for r in records if r["brokers"] == brokers]
        lat = [r for r in mine if r["kind"] == "latency"]
        q0 = [r for r in mine if r["kind"] == "qos0"]
        q1 = [r for r in mine if r["kind"] == "qos1"]

        def series(
            rows: list[dict[str, Any]], getter: Callable[[dict[str, Any]], float | None]
        ) -> list[float]:
            return [v for v in (getter(r) for r in rows) if v is not None]

        p50_all = series(lat, lambda r: r["all"]["p50_ms"])
        p99_all = series(lat, lambda r: r["all"]["p99_ms"])
        p50_remote = series(lat, lambda r: r["remote"]["p50_ms"] if r["remote"] else None)
        p99_remote = series(lat, lambda r: r["remote"]["p99_ms"] if r["remote"] else None)
        p50_local = series(lat, lambda r: r["local"]["p50_ms"] if r.get("local") else None)
        q0_rate = series(q0, lambda r: r["delivered_per_s"])
        q1_rate = series(q1, lambda r: r["delivered_per_s"])
        summary[brokers] = {
            "label": label_for(brokers),
            "rounds": len(lat),
            "p50_all_ms": _median(p50_all),
            "p99_all_ms": _median(p99_all),
            "p50_remote_ms": _median(p50_remote),
            "p99_remote_ms": _median(p99_remote),
            "p50_local_ms": _median(p50_local),
            "p50_all_range": (min(p50_all), max(p50_all)) if p50_all else None,
            "p99_all_range": (min(p99_all), max(p99_all)) if p99_all else None,
            "p50_remote_range": (min(p50_remote), max(p50_remote)) if p50_remote else None,
            "p99_remote_range": (min(p99_remote), max(p99_remote)) if p99_remote else None,
            "qos0_per_s": _median(q0_rate),
            "qos1_per_s": _median(q1_rate),
            "qos0_range": (min(q0_rate), max(q0_rate)) if q0_rate else None,
            "qos1_range": (min(q1_rate), max(q1_rate)) if q1_rate else None,
            "qos0_cpu_us": _median(r["broker_cpu_us_per_msg"] for r in q0),
            "qos1_cpu_us": _median(r["broker_cpu_us_per_msg"] for r in q1),
            "paced_cpu_us": _median(r.get("broker_cpu_us_per_publish") for r in lat),
            "paced_switches": _median(r.get("broker_switches_per_publish") for r in lat),
            "puback_p50_ms": _median(r.get("puback_p50_ms") for r in q1),
            "puback_p99_ms": _median(r.get("puback_p99_ms") for r in q1),
            "lost": sum(int(r["lost"]) for r in mine),
            "stalls": sum(int(r.get("stalls", 0)) for r in mine),
            "hops_latency": merge_hops(r["hops"] for r in lat),
            "hops_all": merge_hops(r["hops"] for r in mine),
            "load_1min": [r["loadavg"][0] for r in mine],
        }
    return summary


def paired_latency_ratios(records: list[dict[str, Any]], brokers: int, baseline: int) -> list[float]:
    """Per round: remote-subscriber p50 of `brokers` / all-subscriber p50 of `baseline`."""
    ratios = []
    rounds = sorted({r["round"] for r in records})
    for round_index in rounds:
        mine = [
            r for r in records
            if r["round"] == round_index and r["kind"] == "latency"
            and r["brokers"] == brokers and r["remote"]
        ]  # fmt: skip
        base = [
            r for r in records
            if r["round"] == round_index and r["kind"] == "latency" and r["brokers"] == baseline
        ]  # fmt: skip
        if mine and base and base[0]["all"]["p50_ms"] > 0:
            ratios.append(mine[0]["remote"]["p50_ms"] / base[0]["all"]["p50_ms"])
    return ratios


def hop_text(hist: dict[str, int]) -> str:
    total = sum(hist.values())
    if not total:
        return "-"
    parts = [f"{'>16' if label == '+Inf' else label}: {100.0 * n / total:.0f} %" for label, n in hist.items()]
    return ", ".join(parts) + f" (n={total:,})"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def evaluate_targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) rows; met None = not measurable in this run."""
    rows: list[tuple[str, str, bool | None]] = []
    records = results.get("main", [])
    summary = summarize_main(records)
    base = summary.get(1)
    for brokers, row in summary.items():
        if brokers <= 1:
            continue
        target = f"one-hop topic p50 across brokers <= 2x single-broker p50 ({row['label']})"
        if base is None or base["p50_all_ms"] is None or row["p50_remote_ms"] is None:
            rows.append((target, "not measured", None))
            continue
        ratio = row["p50_remote_ms"] / base["p50_all_ms"]
        paired = paired_latency_ratios(records, brokers, 1)
        hops = row["hops_latency"]
        one_hop = set(hops) <= {"1"}
        measured = (
            f"{ratio:.2f}x: p50 {row['p50_remote_ms']:.3f} ms (subscribers on brokers 1..{brokers - 1})"
            f" vs {base['p50_all_ms']:.3f} ms (1-broker cluster), medians of {row['rounds']} rounds;"
            f" per-round ratios median {_fmt(_median(paired), 2)}"
            f" (range {_fmt(min(paired) if paired else None, 2)}-{_fmt(max(paired) if paired else None, 2)});"
            f" topic was one-hop: {'yes' if one_hop else 'NO, ' + hop_text(hops)}"
        )
        rows.append((target, measured, ratio <= 2.0))
    # hop count 1 while subscribers sit on fewer than L brokers: one row per L measured
    target = "hop count 1 while subscribers sit on fewer than L brokers"
    checked: list[str] = []
    violations: list[str] = []
    for brokers, row in summary.items():
        if brokers <= 1:
            continue
        hops = row["hops_all"]
        text = f"{row['label']} ({brokers - 1} subscriber brokers besides the publisher's): {hop_text(hops)}"
        checked.append(text)
        if not hops or set(hops) != {"1"}:
            violations.append(text)
    if checked:
        rows.append(
            (
                f"{target} (default L=60, all latency + throughput runs)",
                "; ".join(checked) if not violations else "violations: " + "; ".join(violations),
                not violations,
            )
        )
    for run in aggregate_small_l(results.get("small_l", [])):
        checked, violations, transients = [], [], []
        for step in run["steps"]:
            if step["subscriber_brokers"] >= run["table_size"]:
                continue
            text = f"k={step['subscriber_brokers']}: {hop_text(step['hops'])}"
            checked.append(text)
            if not step["hops"] or set(step["hops"]) != {"1"}:
                violations.append(text)
            if step["hops_first"] and set(step["hops_first"]) != {"1"}:
                transients.append(f"k={step['subscriber_brokers']}: {hop_text(step['hops_first'])}")
        if not checked:
            continue
        measured = "settled windows: " + "; ".join(checked)
        if transients:
            measured += "; first windows (not judged): " + "; ".join(transients)
        rows.append(
            (
                f"{target} (L={run['table_size']}, {run['brokers']} brokers, {run['repeats']} repeat(s))",
                measured,
                not violations,
            )
        )
    return rows


def main_notes(records: list[dict[str, Any]], summary: dict[int, dict[str, Any]]) -> list[str]:
    """Observations the numbers imply, written out so a reader does not miss them."""
    notes: list[str] = []
    for brokers, row in summary.items():
        q1 = [r for r in records if r["brokers"] == brokers and r["kind"] == "qos1"]
        slow = [
            r
            for r in q1
            if (r.get("puback_p50_ms") or 0) > 1000 or r.get("unacked_at_end", 0) > 0 or r.get("stalls", 0)
        ]
        if slow:
            p50 = row.get("puback_p50_ms")
            waited = (
                f"after {p50:.0f} ms (p50)" if p50 else f"so late that the window stalled for {STALL_S:g} s"
            )
            notes.append(
                f"{row['label']}: QoS 1 PUBACKs came only {waited} in {len(slow)} of {len(q1)} rounds, so"
                f" the windowed QoS 1 publisher crawled ({_rate(row['qos1_per_s'])} delivered/s). The"
                " broker holds a PUBACK up to `cluster.publish_ack_wait_ms` (default 5000 ms) for the"
                ' cluster\'s "publish done"; here it never came'
                ' (`skipmq_cluster_publish_done_total{complete="false"}` counts these).'
            )
        stalls = sum(
            int(r.get("stalls", 0)) for r in records if r["brokers"] == brokers and r["kind"] == "qos0"
        )
        if stalls:
            notes.append(
                f"{row['label']}: {stalls} QoS 0 stall(s): no delivery for {STALL_S:g} s while messages were"
                " outstanding (the brokers dropped them; counted in lost)."
            )
    base = summary.get(1)
    for brokers, row in summary.items():
        if brokers > 1 and base and row.get("p50_local_ms") and base.get("p50_all_ms"):
            notes.append(
                f"{row['label']}: subscribers on the publisher's own broker saw p50"
                f" {row['p50_local_ms']:.3f} ms"
                f" vs {base['p50_all_ms']:.3f} ms in the 1-broker cluster: forwarding to the other brokers"
                " delays the publisher's broker's local deliveries too."
            )
    for brokers, row in summary.items():
        tls = summary.get(-brokers)
        if brokers < 0 and tls is not None:
            notes.append(f"{tls['label']} (mutual TLS) / {row['label']}: " + tls_cost_text(tls, row))
    return notes


def tls_cost_text(tls: dict[str, Any], plain: dict[str, Any]) -> str:
    """Ratios TLS / plaintext of the medians (--tls-compare)."""
    parts = []
    for key, name in (
        ("qos0_per_s", "QoS 0 delivered/s"),
        ("qos1_per_s", "QoS 1 delivered/s"),
        ("qos0_cpu_us", "QoS 0 broker CPU/msg"),
        ("qos1_cpu_us", "QoS 1 broker CPU/msg"),
        ("p50_remote_ms", "p50 other brokers"),
        ("p99_remote_ms", "p99 other brokers"),
    ):
        a, b = tls.get(key), plain.get(key)
        if a is not None and b:
            parts.append(f"{name} {a / b:.2f}x")
    return ", ".join(parts) if parts else "not measured"


def machine_info() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def render_markdown(results: dict[str, Any], figure_names: dict[str, str]) -> str:
    meta = results["meta"]
    machine = meta["machine"]
    plan = meta["plan"]
    records = results.get("main", [])
    summary = summarize_main(records)
    small = aggregate_small_l(results.get("small_l", []))
    loads = [r["loadavg"][0] for r in records] + [x for run in small for s in run["steps"] for x in s["load"]]
    lines: list[str] = []
    lines.append("## The last full run")
    lines.append("")
    lines.append(
        "Produced by `bench/cluster_bench.py --update-docs`. One"
        " publisher on broker 0 and subscribers on the brokers of a cluster on loopback; the clients"
        " are asyncio raw-socket MQTT 3.1.1 connections in one process (one clock for the payload"
        " timestamps)."
    )
    lines.append("")
    lines.append(
        f"- Machine: {machine['nproc']} CPUs ({machine['cpu_model']}), Python {machine['python']},"
        f" {machine['platform']}; run {meta['started']} - {meta['finished']} UTC."
    )
    if loads:
        lines.append(
            "- Load: 1-minute load average at the start of each measurement"
            f" {min(loads):.1f} - {max(loads):.1f}"
            f" (median {statistics.median(loads):.1f}) on {machine['nproc']} CPUs."
            + (
                " Other jobs (other helpers' tests) shared the machine while this ran: absolute numbers"
                " are indicative; the interleaved comparison within a round is the result."
                if max(loads) > (machine["nproc"] or 1) * 0.5
                else ""
            )
        )
    lines.append(f"- Command: `{meta['command']}`")
    lines.append(
        f"- Settings: {plan['subscribers']} subscribers "
        + (
            "all on the publisher's broker (`--local`: local deliveries in a cluster whose other"
            " brokers subscribe nothing)"
            if plan.get("local")
            else "round-robin over the brokers (subscriber j on broker j mod N)"
        )
        + f", publisher on broker 0, topic `{TOPIC}`, {PAYLOAD_BYTES}-byte payloads,"
        f" subscriptions QoS 1; default `cluster.table_size` (L=60) and `cluster.class_levels`=1;"
        f" {plan['rounds']} rounds, configurations interleaved (rotating order) within each round."
        f" Latency: QoS {plan.get('latency_qos', 0)} paced at {plan['latency_rate_per_s']:g} msg/s"
        f" for {plan['latency_s']:g} s per"
        f" round; end-to-end = receive time - send time (`perf_counter_ns` in the payload)."
        f" Throughput: {plan['throughput_s']:g} s per round, closed loop (<= {DELIVERY_WINDOW} undelivered"
        f" messages per subscriber), QoS 1 publisher window {plan['qos1_window']} unacknowledged; delivered"
        f" msgs/s = deliveries to all subscribers / elapsed."
    )
    lines.append(
        "- Before measuring, each configuration publishes probes until every subscriber received one"
        f" (the subscription reached the publisher's broker through the overlay), then {SETTLE_S:g} s more."
    )
    lines.append(
        "- `standalone` = one broker with clustering off (reference); `1 broker` = a one-broker cluster"
        ' (the baseline of the targets). "other brokers" = the subscribers not on the publisher\'s broker.'
    )
    lines.append("")
    if summary:
        lines.append("### 1 vs 3 vs 5 brokers (medians of rounds)")
        lines.append("")
        lines.append(
            "| brokers | p50 all (ms) | p99 all (ms) | p50 publisher's broker (ms) | p50 other brokers (ms)"
            " | p99 other brokers (ms)"
            " | QoS 0 delivered/s | QoS 1 delivered/s | QoS 1 PUBACK p50 / p99 (ms)"
            " | broker CPU us/msg QoS 0 / QoS 1 | paced: broker CPU us / context switches per message"
            " | hops (latency runs) | lost |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
        for row in summary.values():
            lines.append(
                f"| {row['label']} | {_fmt(row['p50_all_ms'])} | {_fmt(row['p99_all_ms'])}"
                f" | {_fmt(row['p50_local_ms'])} | {_fmt(row['p50_remote_ms'])}"
                f" | {_fmt(row['p99_remote_ms'])}"
                f" | {_rate(row['qos0_per_s'])} | {_rate(row['qos1_per_s'])}"
                f" | {_fmt(row['puback_p50_ms'], 2)} / {_fmt(row['puback_p99_ms'], 2)}"
                f" | {_fmt(row['qos0_cpu_us'], 1)} / {_fmt(row['qos1_cpu_us'], 1)}"
                f" | {_fmt(row['paced_cpu_us'], 0)} / {_fmt(row['paced_switches'], 1)}"
                f" | {hop_text(row['hops_latency']) if row['label'] != 'standalone' else 'n/a'}"
                f" | {row['lost']} |"
            )
        lines.append("")
        lines.append(
            "Broker CPU us/msg = utime+stime of all brokers of the configuration over the measured window"
            " / messages delivered to subscribers. Paced: the latency runs' broker CPU and context"
            " switches (every thread of every broker: a thread put to sleep, to be woken again) per"
            " message published. On 2 cores a 5-broker cluster's brokers and the load"
            " client compete for the same CPUs, so aggregate throughput measures the cluster's total"
            " CPU cost per delivery more than any scaling."
        )
        lines.append("")
        for note in main_notes(records, summary):
            lines.append(f"- {note}")
        lines.append("")
        if "latency" in figure_names:
            lines.append(f"![cluster latency]({figure_names['latency']})")
            lines.append("")
        if "throughput" in figure_names:
            lines.append(f"![cluster throughput]({figure_names['throughput']})")
            lines.append("")
        lines.append(
            f"Figures: `{meta['command']}` writes them all (docs/figures/cluster_latency.png,"
            " docs/figures/cluster_throughput.png and, below, docs/figures/cluster_hops.png);"
            " `--from-json FILE --update-docs` re-renders them from a run's `--json` output."
        )
        lines.append("")
    if small:
        lines.append("### Small L: one hop to multi-hop")
        lines.append("")
        lines.append(
            f"`cluster.table_size=L` on {small[0]['brokers']} brokers; publisher on broker 0, one subscriber"
            f" on each of brokers 1..k added step by step (a fresh cluster, i.e. new random overlay keys, per"
            f" repeat; {small[0]['repeats']} repeat(s) per L). Each step: warm-up (probes until the new"
            f" subscriber got one), a first window of {plan['small_l_messages']} QoS 0 messages at"
            f" {plan['small_l_rate_per_s']:g} msg/s, probes at {SETTLE_PROBE_RATE_PER_S:g} msg/s until"
            f" {plan.get('small_l_settle_s', 0):g} s after the warm-up (the overlay's EEXP at publish runs at"
            " most every 10 s), then the settled window of the same size. Hops = the subscriber brokers'"
            " `skipmq_cluster_delivery_hops` histogram (difference over a window; one bucket per hop"
            " count, 1,2,3,4,6,8,... before issue #14;"
            " one observation per message per subscriber broker), summed over repeats."
        )
        lines.append("")
        lines.append(
            "| L | subscriber brokers k | k < L | hops, first window | hops, settled | mean hops settled"
            " | p50 / p99 settled (ms) | lost |"
        )
        lines.append("|---:|---:|:---:|---|---|---:|---|---:|")
        for run in small:
            for step in run["steps"]:
                lines.append(
                    f"| {run['table_size']} | {step['subscriber_brokers']}"
                    f" | {'yes' if step['subscriber_brokers'] < run['table_size'] else 'no'}"
                    f" | {hop_text(step['hops_first'])} | {hop_text(step['hops'])}"
                    f" | {_fmt(hops_mean(step['hops']), 2)}"
                    f" | {_fmt(step['p50_ms'])} / {_fmt(step['p99_ms'])} | {step['lost']} |"
                )
        lines.append("")
        for run in small:
            if run["table_size"] == 2:
                lines.append(
                    "- L=2: a virtual node's table holds just its two level-0 neighbours (sticky), so the"
                    " range multicast walks the subscriber run one broker per hop: the k-th subscriber"
                    " broker is k hops away, the mean grows linearly with k."
                )
        for run in small:
            steps = run["steps"]
            bad = [st["subscriber_brokers"] for st in steps if st["subscriber_brokers"] < run["table_size"]
                   and st["hops"] and set(st["hops"]) != {"1"}]  # fmt: skip
            if bad:
                lines.append(
                    f"- L={run['table_size']}: with subscribers on {', '.join(map(str, bad))} broker(s)"
                    " (< L) some deliveries still took 2+ hops in the settled window: the publisher's table"
                    " did not hold an entry for every subscriber broker."
                )
        lines.append("")
        if "hops" in figure_names:
            lines.append(f"![cluster hop histogram]({figure_names['hops']})")
            lines.append("")
    targets = evaluate_targets(results)
    if targets:
        lines.append("### Targets")
        lines.append("")
        lines.append("| target | measured | met? |")
        lines.append("|---|---|---|")
        for target, measured, met in targets:
            verdict = "not measured" if met is None else ("met" if met else "NOT met")
            lines.append(f"| {target} | {measured} | {verdict} |")
        lines.append("")
    if records:
        lines.append("<details><summary>Per-round results</summary>")
        lines.append("")
        lines.append("| round | configuration | measurement | result | load (1 min) |")
        lines.append("|---:|---|---|---|---:|")
        for r in records:
            if r["kind"] == "latency":
                text = f"p50 {r['all']['p50_ms']:.3f} / p99 {r['all']['p99_ms']:.3f} ms"
                if r["remote"]:
                    remote = r["remote"]
                    text += f"; other brokers p50 {remote['p50_ms']:.3f} / p99 {remote['p99_ms']:.3f} ms"
                text += f"; lost {r['lost']}"
            else:
                text = f"{r['delivered_per_s']:,.0f} delivered/s; lost {r['lost']}; stalls {r['stalls']}"
            lines.append(
                f"| {r['round'] + 1} | {label_for(r['brokers'])} | {r['kind']} | {text}"
                f" | {r['loadavg'][0]:.2f} |"
            )
        lines.append("")
        lines.append("</details>")
        lines.append("")
    return "\n".join(lines)


def write_figures(results: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """PNG plots; returns {name: file name} of the ones written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    summary = summarize_main(results.get("main", []))
    measured_latency = any(row["p50_all_ms"] is not None for row in summary.values())
    measured_throughput = any(
        row[f"{key}_per_s"] is not None for row in summary.values() for key in ("qos0", "qos1")
    )
    if summary:
        keys = list(summary)
        labels = [summary[k]["label"] for k in keys]
        positions = list(range(len(keys)))
    if summary and measured_latency:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for axis, pct in zip(axes, ("p50", "p99"), strict=True):
            width = 0.38
            for offset, which, name in (
                (-width / 2, "all", "all subscribers"),
                (width / 2, "remote", "other brokers"),
            ):
                values = [summary[k][f"{pct}_{which}_ms"] for k in keys]
                ranges = [summary[k][f"{pct}_{which}_range"] for k in keys]
                xs = [p + offset for p, v in zip(positions, values, strict=True) if v is not None]
                ys = [v for v in values if v is not None]
                err_lo = [v - r[0] for v, r in zip(values, ranges, strict=True) if v is not None and r]
                err_hi = [r[1] - v for v, r in zip(values, ranges, strict=True) if v is not None and r]
                axis.bar(xs, ys, width, label=name, yerr=[err_lo, err_hi], capsize=3)
            if pct == "p50" and 1 in summary and summary[1]["p50_all_ms"] is not None:
                axis.axhline(
                    2 * summary[1]["p50_all_ms"], color="red", linestyle="--", linewidth=1,
                    label="target: 2x 1-broker p50",
                )  # fmt: skip
            axis.set_xticks(positions, labels)
            if pct == "p99":
                axis.set_yscale("log")
            axis.set_ylabel(f"{pct} end-to-end latency (ms)")
            axis.set_title(f"{pct}, QoS 0, 1 publisher -> 10 subscribers")
            axis.legend(fontsize=8)
            axis.grid(axis="y", alpha=0.3)
        fig.suptitle("SkipMQ cluster latency (median of rounds; whiskers: min-max of rounds)", fontsize=10)
        fig.tight_layout()
        fig.savefig(out_dir / "cluster_latency.png", dpi=110)
        plt.close(fig)
        written["latency"] = "cluster_latency.png"
    if summary and measured_throughput:
        fig, axis = plt.subplots(figsize=(7, 4.2))
        width = 0.38
        for offset, key, name in ((-width / 2, "qos0", "QoS 0"), (width / 2, "qos1", "QoS 1 (window)")):
            values = [summary[k][f"{key}_per_s"] for k in keys]
            ranges = [summary[k][f"{key}_range"] for k in keys]
            xs = [p + offset for p, v in zip(positions, values, strict=True) if v is not None]
            ys = [v for v in values if v is not None]
            err_lo = [v - r[0] for v, r in zip(values, ranges, strict=True) if v is not None and r]
            err_hi = [r[1] - v for v, r in zip(values, ranges, strict=True) if v is not None and r]
            axis.bar(xs, ys, width, label=name, yerr=[err_lo, err_hi], capsize=3)
        axis.set_xticks(positions, labels)
        axis.set_yscale("log")
        axis.set_ylabel("messages delivered / s (all subscribers, log scale)")
        axis.set_title("SkipMQ cluster throughput, 1 -> 10 (median of rounds)", fontsize=10)
        axis.legend(fontsize=8)
        axis.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "cluster_throughput.png", dpi=110)
        plt.close(fig)
        written["throughput"] = "cluster_throughput.png"
    small = aggregate_small_l(results.get("small_l", []))
    if small:
        fig, axes = plt.subplots(1, len(small), figsize=(6.0 * len(small), 4.4), squeeze=False)
        colors = plt.get_cmap("viridis")
        for axis, run in zip(axes[0], small, strict=True):
            steps = run["steps"]
            positions = list(range(len(steps)))
            used = [
                label
                for label in HOP_BUCKET_LABELS
                if any(label in s["hops"] or label in s["hops_first"] for s in steps)
            ]
            width = 0.38
            for offset, which, hatch, alpha in (
                (-width / 2, "hops_first", "//", 0.55),
                (width / 2, "hops", "", 1.0),
            ):
                bottoms = [0.0] * len(steps)
                for index, label in enumerate(used):
                    shares = []
                    for s in steps:
                        total = sum(s[which].values())
                        shares.append(100.0 * s[which].get(label, 0) / total if total else 0.0)
                    name = f"{'>16' if label == '+Inf' else label} hop{'s' if label != '1' else ''}"
                    axis.bar(
                        [p + offset for p in positions], shares, width, bottom=bottoms,
                        label=name if which == "hops" else None, color=colors(index / max(1, len(used))),
                        hatch=hatch, alpha=alpha, edgecolor="white",
                    )  # fmt: skip
                    bottoms = [b + v for b, v in zip(bottoms, shares, strict=True)]
            axis.set_xticks(positions, [str(s["subscriber_brokers"]) for s in steps])
            axis.set_xlabel(
                f"k = brokers with subscribers (of {run['brokers']}; publisher on broker 0)\n"
                "left bar (hatched): first window after k grew; right bar: settled"
            )
            axis.set_ylabel("share of deliveries (%)")
            axis.set_title(
                f"overlay hops, cluster.table_size L={run['table_size']} ({run['repeats']} repeat(s))"
            )
            axis.axvline(
                _boundary_position(steps, run["table_size"]), color="red", linestyle="--", linewidth=1,
                label="k = L",
            )  # fmt: skip
            axis.legend(fontsize=7, loc="lower left")
        fig.tight_layout()
        fig.savefig(out_dir / "cluster_hops.png", dpi=110)
        plt.close(fig)
        written["hops"] = "cluster_hops.png"
    return written


def _boundary_position(steps: list[dict[str, Any]], table_size: int) -> float:
    """x position (between categorical bars) where k reaches L."""
    for index, step in enumerate(steps):
        if step["subscriber_brokers"] >= table_size:
            return index - 0.5
    return len(steps) - 0.5


# ---- command line ----------------------------------------------------------------------------
def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


# options --quick shortens: dest -> (full-run default, --quick value); an explicit option wins
RUN_LENGTH_DEFAULTS: dict[str, tuple[Any, Any]] = {
    "rounds": (7, 1),
    "latency_s": (3.0, 1.0),
    "throughput_s": (3.0, 1.0),
    "small_l": ([2, 4], [2]),
    "small_l_brokers": (8, 5),
    "small_l_steps": ([1, 2, 3, 4, 5, 7], [1, 2, 4]),
    "small_l_messages": (400, 200),
    "small_l_settle_s": (12.0, 3.0),
    "small_l_repeats": (2, 1),
}


def _kind_list(text: str) -> tuple[str, ...]:
    kinds = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [kind for kind in kinds if kind not in MAIN_KINDS]
    if not kinds or unknown:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(MAIN_KINDS)}, got {text!r}")
    return kinds


def _show(value: Any) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, list) else f"{value:g}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=(
            "SkipMQ cluster benchmark: latency p50/p99, throughput and overlay hop counts for 1 vs 3"
            " vs 5 brokers on loopback (1 publisher on broker 0, subscribers round-robin), and the"
            " one-hop -> multi-hop switch at a small cluster.table_size. Prints progress lines and a"
            " markdown report; --update-docs writes it into docs/benchmarks-cluster.md (between its"
            " two marker comments, below the summary table; the rest of the page is kept) and"
            " docs/figures/cluster_*.png. The full run takes about 10 minutes."
        ),
    )

    def run_length(flag: str, kind: Callable[[str], Any], text: str) -> None:
        dest = flag.lstrip("-").replace("-", "_")
        full, quick = RUN_LENGTH_DEFAULTS[dest]
        parser.add_argument(
            flag, type=kind, default=None, help=f"{text} (default {_show(full)}; --quick: {_show(quick)})"
        )

    parser.add_argument("--quick", action="store_true", help="~1 minute smoke run (shorter defaults below)")
    run_length("--rounds", int, "interleaved rounds per configuration")
    parser.add_argument(
        "--brokers", type=_int_list, default=[1, 3, 5], help="cluster sizes to compare (default 1,3,5)"
    )
    parser.add_argument(
        "--no-standalone", action="store_true", help="skip the clustering-off reference broker"
    )
    parser.add_argument(
        "--tls-compare",
        action="store_true",
        help="also run every cluster size > 1 with plaintext links (cluster.insecure = true) beside the"
        " default mutual TLS, interleaved in the same rounds: the cost of TLS on the cluster path",
    )
    parser.add_argument(
        "--subscribers", type=int, default=10, help="subscribers, round-robin over the brokers (default 10)"
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help="put every subscriber on the publisher's broker (broker 0): local deliveries in a cluster"
        " whose other brokers subscribe nothing (issue #11)",
    )
    parser.add_argument(
        "--kinds",
        type=_kind_list,
        default=MAIN_KINDS,
        help="measurements of the main phase, comma-separated (default latency,qos0,qos1)",
    )
    parser.add_argument(
        "--latency-rate",
        type=float,
        default=500.0,
        help="paced publish rate of latency runs, msg/s (default 500)",
    )
    run_length("--latency-s", float, "seconds per latency run")
    parser.add_argument(
        "--latency-qos",
        type=int,
        choices=(0, 1),
        default=0,
        help="QoS of the latency runs' PUBLISHes (default 0; 1: each with its packet id, PUBACK"
        " latency reported too)",
    )
    run_length("--throughput-s", float, "seconds per throughput run")
    parser.add_argument(
        "--qos1-window", type=int, default=20, help="unacknowledged QoS 1 PUBLISHes allowed (default 20)"
    )
    run_length("--small-l", _int_list, "cluster.table_size values of the small-L run")
    run_length("--small-l-brokers", int, "brokers in the small-L run")
    run_length("--small-l-steps", _int_list, "subscriber broker counts k (subscribers on brokers 1..k)")
    run_length("--small-l-messages", int, "messages per small-L measurement window")
    parser.add_argument(
        "--small-l-rate",
        type=float,
        default=400.0,
        help="publish rate of small-L windows, msg/s (default 400)",
    )
    run_length("--small-l-settle-s", float, "small-L step: seconds from the warm-up to the settled window")
    run_length("--small-l-repeats", int, "fresh clusters per L (new random overlay keys)")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="record every cluster broker with py-spy (--nonblocking, collapsed stacks) during each"
        " measurement into DIR (one file per broker, kind and round; bench/link_profile.py sums them)",
    )
    parser.add_argument(
        "--profile-tool",
        choices=("py-spy", "perf"),
        default="py-spy",
        help="--profile with py-spy (Python stacks, default) or perf record -g (native and kernel"
        " stacks: where the C part of the event loop goes; read with perf report --sort dso,sym)",
    )
    parser.add_argument("--skip-main", action="store_true", help="skip the 1 vs 3 vs 5 comparison")
    parser.add_argument("--skip-small-l", action="store_true", help="skip the small-L run")
    parser.add_argument("--json", metavar="PATH", help="also write the raw results (all rounds) as JSON")
    parser.add_argument(
        "--from-json", metavar="PATH", help="re-render a previous --json file, measure nothing"
    )
    parser.add_argument(
        "--update-docs", action="store_true",
        help="write docs/benchmarks-cluster.md and docs/figures/cluster_*.png (else a temporary directory)",
    )  # fmt: skip
    return parser


def resolve_run_length(args: argparse.Namespace) -> None:
    """Options left unset take the full-run default, or the --quick value with --quick."""
    for dest, (full, quick) in RUN_LENGTH_DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, quick if args.quick else full)


def plan_from_args(args: argparse.Namespace) -> Plan:
    if min(args.subscribers, args.rounds, args.small_l_repeats, args.small_l_messages) < 1:
        raise SystemExit(
            "cluster_bench: --subscribers, --rounds, --small-l-repeats and --small-l-messages must be"
            " at least 1"
        )
    if args.small_l_settle_s < 0:
        raise SystemExit("cluster_bench: --small-l-settle-s must not be negative")
    if args.latency_rate <= 0 or args.small_l_rate <= 0:
        raise SystemExit("cluster_bench: rates must be positive")
    if max(args.small_l_steps) >= args.small_l_brokers:
        raise SystemExit(
            f"cluster_bench: --small-l-steps {max(args.small_l_steps)} needs more than that many brokers"
            f" (--small-l-brokers is {args.small_l_brokers}; broker 0 holds the publisher)"
        )
    plan = Plan(
        broker_counts=list(args.brokers),
        standalone=not args.no_standalone,
        tls_compare=args.tls_compare,
        subscribers=args.subscribers,
        rounds=args.rounds,
        latency_rate_per_s=args.latency_rate,
        latency_s=args.latency_s,
        throughput_s=args.throughput_s,
        latency_qos=args.latency_qos,
        qos1_window=args.qos1_window,
        small_l_sizes=list(args.small_l),
        small_l_brokers=args.small_l_brokers,
        small_l_steps=sorted(set(args.small_l_steps)),
        small_l_messages=args.small_l_messages,
        small_l_rate_per_s=args.small_l_rate,
        small_l_settle_s=args.small_l_settle_s,
        small_l_repeats=args.small_l_repeats,
        kinds=tuple(args.kinds),
        local=args.local,
        profile_dir=args.profile,
        profile_tool=args.profile_tool,
    )
    return plan


async def run_all(plan: Plan, args: argparse.Namespace, results: dict[str, Any]) -> None:
    if not args.skip_main:
        await run_main_phase(plan, results)
    if not args.skip_small_l:
        await run_small_l_phase(plan, results)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    resolve_run_length(args)
    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
    else:
        plan = plan_from_args(args)
        command = "python bench/cluster_bench.py " + " ".join(sys.argv[1:] if argv is None else argv)
        results = {
            "meta": {
                "machine": machine_info(),
                "command": command.strip(),
                "plan": plan.__dict__,
                "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                "finished": None,
            }
        }
        log(f"plan: {plan}")
        try:
            import uvloop

            runner: Callable[..., Any] = uvloop.run
        except ImportError:
            runner = asyncio.run
        started = time.monotonic()
        try:
            runner(run_all(plan, args, results))
        except KeyboardInterrupt:
            log("interrupted: reporting what was measured")
        results["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        log(f"measured in {time.monotonic() - started:.0f} s")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
            log(f"raw results: {args.json}")
    out_dir = FIGURES if args.update_docs else Path(tempfile.mkdtemp(prefix="skipmq-cluster-bench-"))
    figures = write_figures(results, out_dir)
    if args.update_docs:
        links = {name: f"figures/{file}" for name, file in figures.items()}
        markdown = render_markdown(results, links)
        RESULTS_MD.write_text(with_report(RESULTS_MD.read_text() if RESULTS_MD.exists() else "", markdown))
        log(f"wrote {RESULTS_MD} and {', '.join(str(out_dir / f) for f in figures.values())}")
    else:
        markdown = render_markdown(results, {name: str(out_dir / f) for name, f in figures.items()})
        log(f"figures in {out_dir}")
    print(markdown)
    failed = [t for t in evaluate_targets(results) if t[2] is False]
    for target, measured, _met in failed:
        log(f"target NOT met: {target}: {measured}")
    return 0


REPORT_BEGIN = "<!-- bench/cluster_bench.py --update-docs writes its report from here ... -->"
REPORT_END = "<!-- ... to here; the rest of this page is written by hand and kept -->"


def with_report(page: str, markdown: str) -> str:
    """``page`` with ``markdown`` between ``REPORT_BEGIN`` and ``REPORT_END``, the rest kept as it is.

    The hand-written summary table stays first and the hand-written sections stay where they are;
    a page without both markers (in that order) gets them, with the report, at its end.
    """
    begin, end = page.find(REPORT_BEGIN), page.find(REPORT_END)
    if begin < 0 or end < begin:
        return (
            page.rstrip("\n") + "\n\n" if page.strip() else ""
        ) + f"{REPORT_BEGIN}\n\n{markdown.strip()}\n\n{REPORT_END}\n"
    return page[: begin + len(REPORT_BEGIN)] + f"\n\n{markdown.strip()}\n\n" + page[end:]


if __name__ == "__main__":
    sys.exit(main())
