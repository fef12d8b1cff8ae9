"""Causal groups (``cluster.causal_groups``): what they cost, by hand (never in CI).

Four measurements, printed as markdown (docs/benchmarks.md "Causal groups"):

1. **Header bytes** of a forwarded message on the wire (``broker.adapters.transport.wire``) with the
   dependency vector of a broker that heard from n streams of the group, against the same message
   outside any group. Deterministic.
2. **Clock cost per message vs n** (the seed claims O(n)): wall-clock time of the pure core's
   ``stamp`` (the vector a sent message carries) and ``accepted`` (merging a received one's vector)
   plus the vector's wire encoding, for a clock of n streams; per message, median of 5 runs.
3. **Latency added by causal delivery**, in virtual time: the simulation's conversation
   (``simulation.causal``, 5 brokers, 30 % of link items delayed 30 ms) with and without the
   group; publish -> first receipt at the observers, p50 / p99 / max. Deterministic per seed.
4. **Broker CPU and throughput** with real processes (tools/launcher.py, 3 brokers, paho
   clients): publishers on A and B (QoS 1, window 20), subscribers to ``bench/#`` on A, B and C;
   rounds alternate "off" and "on" side by side; CPU seconds of the three brokers per delivered
   message (from /proc) and delivered messages per second.

    .venv/bin/python bench/causal_groups_bench.py [--seeds 40] [--messages 3000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from broker.adapters.transport.wire import encode_forwarded
from broker.cluster.causal_clock import CausalClock
from broker.cluster.messages import ForwardedMessage, StreamPosition
from broker.core.session import Message
from simulation.causal import causal_conversation
from tools.launcher import start_cluster
from tools.proc_stats import cpu_s

# The subscribers' paho loops fall behind two publishers: a queue large enough that nothing is
# dropped (limits.max_queued_messages, default 1000 with drop_oldest), so every round delivers all.
SETTINGS = {
    "cluster.ping_interval_ms": "500",
    "cluster.failure_timeout_ms": "2000",
    "limits.max_queued_messages": "1000000",
}


def header_bytes() -> list[tuple[int, int, int]]:
    """(n streams in the vector, bytes outside a group, bytes in a group) for a 64-byte payload."""
    message = Message("factory/line1/temp", b"x" * 64, qos=1)
    plain = len(encode_forwarded(ForwardedMessage("10.0.0.1:7883/9a5d192b4284", "=factory", 1234, message)))
    rows = []
    for n in (1, 2, 4, 8, 16, 32):
        deps = tuple(
            StreamPosition(f"10.0.0.{i + 1}:7883/9a5d192b42{i:02d}", "=factory", 1234) for i in range(n)
        )
        forwarded = ForwardedMessage(
            "10.0.0.1:7883/9a5d192b4284",
            "=factory",
            1234,
            message,
            0,
            deps,
            (("=factory", 1234), ("*0:", 99)),
        )
        rows.append((n, plain, len(encode_forwarded(forwarded))))
    return rows


def clock_cost(sizes: tuple[int, ...], messages: int = 20_000) -> list[tuple[int, float, float, float]]:
    """(n, stamp µs, accepted µs, encode µs) per message for a clock holding n streams."""
    rows = []
    message = Message("factory/line1/temp", b"x" * 64, qos=1)
    for n in sizes:
        clock = CausalClock(["factory/#"])
        groups = clock.groups_of("factory/line1/temp")
        origins = [f"10.0.0.{i + 1}:7883/9a5d192b42{i:02d}" for i in range(n)]
        for i, origin in enumerate(origins):
            clock.sent(groups, origin, (("=factory", i),))
        deps = clock.stamp(groups)
        incoming = [
            ForwardedMessage(origins[k % n], "=factory", k, message, 0, deps, (("=factory", k),))
            for k in range(messages)
        ]
        timings: list[tuple[float, float, float]] = []
        for _ in range(5):
            started = time.perf_counter()
            for _k in range(messages):
                clock.stamp(groups)
            stamped = time.perf_counter()
            for forwarded in incoming:
                clock.accepted(forwarded)
            merged = time.perf_counter()
            for forwarded in incoming[: messages // 10]:
                encode_forwarded(forwarded)
            encoded = time.perf_counter()
            timings.append(
                (
                    (stamped - started) / messages * 1e6,
                    (merged - stamped) / messages * 1e6,
                    (encoded - merged) / (messages // 10) * 1e6,
                )
            )
        stamp_us, accepted_us, encode_us = (statistics.median(t[i] for t in timings) for i in range(3))
        rows.append((n, stamp_us, accepted_us, encode_us))
    return rows


def latency(seeds: int) -> dict[bool, list[float]]:
    """Virtual publish -> first receipt (ms) at the conversation's observers, without / with the group."""
    out: dict[bool, list[float]] = {False: [], True: []}
    for causal in (False, True):
        for seed in range(seeds):
            result = causal_conversation(seed, causal=causal)
            published = {(a.publisher, a.epoch, a.seq): a.published_at for a in result.history.acked}
            seen: set[tuple[str, str, int, int]] = set()
            for r in result.history.received:
                key = (r.subscriber, r.publisher, r.epoch, r.seq)
                sent = published.get((r.publisher, r.epoch, r.seq))
                if key in seen or sent is None or not r.subscriber.startswith("watch"):
                    continue
                seen.add(key)
                out[causal].append((r.at - sent) * 1000.0)
    return out


class _Counter:
    def __init__(self) -> None:
        self.count = 0
        self.last_at = time.monotonic()
        self.lock = threading.Lock()

    def add(self, *_args: object) -> None:
        with self.lock:
            self.count += 1
            self.last_at = time.monotonic()


def _client(port: int, name: str) -> paho.Client:
    client = paho.Client(
        callback_api_version=CallbackAPIVersion.VERSION2, client_id=name, protocol=paho.MQTTv311
    )
    client.max_inflight_messages_set(20)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def one_round(causal: bool, messages: int, tag: str) -> dict[str, float]:
    settings = dict(SETTINGS)
    if causal:
        settings["cluster.causal_groups"] = "bench/#"
    cluster = start_cluster(3, settings=settings)
    try:
        cluster.wait_ready(60)
        ports = [b.mqtt_port for b in cluster.brokers]
        pids = [int(b.pid) for b in cluster.brokers if b.pid is not None]
        counter = _Counter()
        subscribers = []
        for index, port in enumerate(ports):
            sub = _client(port, f"sub-{tag}-{index}")
            sub.on_message = counter.add
            sub.subscribe("bench/#", 1)
            subscribers.append(sub)
        time.sleep(2.0)
        publishers = [_client(ports[i], f"pub-{tag}-{i}") for i in (0, 1)]
        expected = 2 * messages * len(subscribers)
        cpu_before = sum(cpu_s(pid) for pid in pids)
        started = time.monotonic()

        def publish(client: paho.Client, topic: str) -> None:
            for n in range(messages):
                while True:
                    info = client.publish(topic, f"{n}".encode(), 1)
                    if info.rc == paho.MQTT_ERR_SUCCESS:
                        break
                    time.sleep(0.001)  # the window of 20 is full

        threads = [
            threading.Thread(target=publish, args=(client, f"bench/{name}"))
            for client, name in zip(publishers, ("a", "b"), strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        while counter.count < expected and time.monotonic() - counter.last_at < 10.0:
            time.sleep(0.05)  # until all arrived, or nothing arrived for 10 s
        cpu = sum(cpu_s(pid) for pid in pids) - cpu_before
        elapsed = counter.last_at - started
        for client in [*publishers, *subscribers]:
            client.loop_stop()
            client.disconnect()
        return {"delivered": counter.count, "expected": expected, "per_s": counter.count / elapsed,
                "cpu_us": cpu / max(counter.count, 1) * 1e6}  # fmt: skip
    finally:
        cluster.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=40, help="conversation seeds for the latency (40)")
    parser.add_argument("--messages", type=int, default=3000, help="messages per publisher per round (3000)")
    parser.add_argument("--rounds", type=int, default=2, help="off/on round pairs (2)")
    args = parser.parse_args(argv)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
    print("\n### Header bytes (64-byte payload, topic factory/line1/temp)\n")
    print("| streams in the vector | outside a group | in a group | added |\n|---:|---:|---:|---:|")
    for n, plain, grouped in header_bytes():
        print(f"| {n} | {plain} | {grouped} | {grouped - plain} |")
    print("\n### Clock cost per message vs n streams in the vector (µs, median of 5)\n")
    print("| n | stamp (send) | accepted (merge) | encode the forwarded message |\n|---:|---:|---:|---:|")
    for n, stamp_us, accepted_us, encode_us in clock_cost((1, 2, 4, 8, 16, 32, 64)):
        print(f"| {n} | {stamp_us:.2f} | {accepted_us:.2f} | {encode_us:.2f} |")
    print(
        f"\n### Latency added (simulation, {args.seeds} seeds, virtual ms, publish -> first receipt)\n",
        flush=True,
    )
    values = latency(args.seeds)
    print("| | receipts | p50 | p99 | max |\n|---|---:|---:|---:|---:|")
    for causal in (False, True):
        v = sorted(values[causal])
        p99 = v[min(len(v) - 1, int(len(v) * 0.99))]
        label = "with the group" if causal else "without"
        print(f"| {label} | {len(v)} | {statistics.median(v):.2f} | {p99:.2f} | {v[-1]:.2f} |")
    print(
        f"\n### Real processes (3 brokers, 2 publishers x {args.messages} QoS 1, 3 subscribers)\n", flush=True
    )
    rows: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for index in range(args.rounds):
        for causal in (False, True):
            row = one_round(causal, args.messages, f"{index}{int(causal)}")
            rows[causal].append(row)
            print(f"  round {index} {'on ' if causal else 'off'}: {row}", file=sys.stderr, flush=True)
    print("| | delivered/s (median) | broker CPU µs per delivery (median) | delivered of expected |")
    print("|---|---:|---:|---:|")
    for causal in (False, True):
        rs = rows[causal]
        label = "with the group" if causal else "without"
        delivered = sum(r["delivered"] for r in rs)
        expected = sum(r["expected"] for r in rs)
        print(
            f"| {label} | {statistics.median(r['per_s'] for r in rs):,.0f} | "
            f"{statistics.median(r['cpu_us'] for r in rs):.1f} | {delivered:,.0f} / {expected:,.0f} |"
        )
    off, on = rows[False], rows[True]
    ratios = [b["cpu_us"] / a["cpu_us"] for a, b in zip(off, on, strict=True)]
    print(f"\nCPU per delivery, with / without, per round pair: {', '.join(f'{r:.2f}' for r in ratios)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
