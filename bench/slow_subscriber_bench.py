"""A slow subscriber beside a fast one: the fast one's latency, by hand (never in CI).

Real processes (tools/launcher.py, 3 brokers A, B, C, default limits, the process suite's faster
failure detection) and paho clients. A publisher on A streams QoS 1 messages at ``--rate`` (each
payload carries its publish time); on B a persistent subscriber ``fast`` (paho as fast as it
goes) and, in the "beside" variant, a persistent ``slow`` one of the same topic that drains a
quarter of the rate (its on_message sleeps). Two modes:

* ``live``: no fault; the live stream is never paced, so this measures what the slow session's
  queue and drops cost the fast one on the same broker;
* ``restart``: B is killed (-9) about a second into the stream and restarted a second later, so
  B's stream from A catches up from A's send log, paced by B's sessions (docs/cluster.md "Flow
  control"): this measures head-of-line blocking.

Rounds interleave "alone" and "beside" per mode; printed per round: the fast one's latency
(publish -> first receipt) p50 / p99 / max, its lost messages, B's queue_full_oldest drops (its
counter) and the drops B logged per client (``messages_dropped`` lines, B stopped with SIGTERM at
the round's end so that it logs what it had only counted: the slow one's, the fast one's - a fast
one that falls behind on a loaded machine drops by the same policy - and any other's); then the
p99 ratio beside/alone per round and its median, the totals of lost and logged drops per mode,
the machine and the load average.

    .venv/bin/python bench/slow_subscriber_bench.py [--modes live,restart] [--rounds 3]
        [--rate 600] [--seconds 10] [--slow-back-s 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.cluster import ClusterClient, probe_route, unique_id
from tools.launcher import start_cluster

A, B = 0, 1
SETTINGS = {"cluster.ping_interval_ms": "500", "cluster.failure_timeout_ms": "2000"}  # as the process suite
WINDOW = 100


class TimedClient(ClusterClient):
    """Records, per id, the latency of its first receipt (payload ``z<n>:<publish time>``); sleeps
    ``1 / drain_per_s`` over each message when ``drain_per_s`` is set (the slow subscriber)."""

    def __init__(self, *args: Any, drain_per_s: float | None = None, **kwargs: Any) -> None:
        self.drain_per_s = drain_per_s
        self.latency: dict[int, float] = {}
        self.sent_at: dict[int, float] = {}
        super().__init__(*args, **kwargs)

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        now = time.time()
        payload = bytes(msg.payload)
        if payload.startswith(b"z"):
            number, _, sent = payload[1:].partition(b":")
            if int(number) not in self.latency:
                self.latency[int(number)] = now - float(sent)
                self.sent_at[int(number)] = float(sent)
        if self.drain_per_s:  # (0: no sleep)
            time.sleep(1.0 / self.drain_per_s)
        super()._on_message(client, userdata, msg)  # (probe_route's probes)


def publish(pub: ClusterClient, topic: str, count: int, rate: float, stop: threading.Event) -> None:
    """Paced QoS 1 publishes (a token bucket, bursts <= WINDOW, at most WINDOW unacknowledged)."""
    tokens, last, sent = 0.0, time.monotonic(), 0
    while sent < count and not stop.is_set():
        now = time.monotonic()
        tokens = min(float(WINDOW), tokens + (now - last) * rate)
        last = now
        if tokens < 1.0 or len(pub.pending) >= WINDOW or not pub.client.is_connected():
            time.sleep(0.002)
            continue
        pub.publish_nowait(topic, f"z{sent}:{time.time():.6f}".encode(), 1)
        sent += 1
        tokens -= 1.0


def dropped(cluster: Any, index: int) -> int:
    match = re.search(
        r'^skipmq_messages_dropped_total\{reason="queue_full_oldest"\} ([0-9.e+]+)$',
        cluster.metrics_text(index),
        re.MULTILINE,
    )
    return int(float(match.group(1))) if match else 0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def logged_drops(cluster: Any, index: int) -> dict[str, int]:
    """Messages dropped per client id as broker ``index`` logged them (``messages_dropped`` warning
    lines, every incarnation; a drop is logged at once or summed into its client's next line,
    and a broker stopped with SIGTERM logs what it had not yet)."""
    out: dict[str, int] = {}
    for record in cluster.brokers[index].log_records():
        if record.get("event") == "messages_dropped":
            client_id = str(record.get("client_id"))
            out[client_id] = out.get(client_id, 0) + int(record.get("dropped", 0))
    return out


def one_round(
    mode: str,
    beside: bool,
    rate: float,
    seconds: float,
    slow_share: float = 0.25,
    keep: str = "",
    slow_back_s: float = 0.0,
) -> dict[str, float]:
    count = int(rate * seconds)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
    kept = tempfile.mkdtemp(prefix=f"{mode}-{'beside' if beside else 'alone'}-", dir=keep) if keep else ""
    with contextlib.nullcontext(kept) if keep else tempfile.TemporaryDirectory(prefix="slowbench") as root:
        cluster = start_cluster(3, settings=dict(SETTINGS), data_root=root)
        clients: list[ClusterClient] = []
        slow_process: subprocess.Popen[str] | None = None
        try:
            cluster.wait_ready(30)
            port_b, host_b = cluster.brokers[B].mqtt_port, cluster.brokers[B].host
            topic = f"{unique_id('bench')}/stream"
            common: dict[str, Any] = {"clean": False, "session_expiry_s": 600, "host": host_b}
            fast = TimedClient(port_b, client_id=unique_id("fast"), **common)
            slow_id = unique_id("slow")
            subs = [fast]
            clients += subs
            if beside:  # in a process of its own (its sleeps are not the fast one's interpreter's)
                slow_process = subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--slow-client",
                        host_b,
                        str(port_b),
                        topic,
                        str(rate * slow_share),
                        slow_id,
                        str(slow_back_s),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert slow_process.stdout is not None
                if slow_process.stdout.readline().strip() != "subscribed":
                    raise RuntimeError("the slow subscriber did not subscribe")
            for sub in subs:
                sub.subscribe(topic, 1)
                probe_route(cluster, A, sub, topic)
            pub_broker = cluster.brokers[A]
            pub = ClusterClient(
                pub_broker.mqtt_port, client_id=unique_id("pub"), max_inflight=WINDOW, host=pub_broker.host
            )
            clients.append(pub)
            stop = threading.Event()
            thread = threading.Thread(target=publish, args=(pub, topic, count, rate, stop), daemon=True)
            process_b = cluster.brokers[B].process
            cpu_before = cpu_s(process_b.pid) if process_b is not None else 0.0
            thread.start()
            down_s, back_at = 0.0, 0.0
            if mode == "restart":
                time.sleep(1.0)
                killed_at = time.time()
                cluster.kill_broker(B)
                for sub in subs:
                    sub.wait_disconnected(10)
                time.sleep(1.0)
                cluster.restart_broker(B)
                for sub in subs:
                    sub.connect()
                back_at = time.time()
                down_s = back_at - killed_at
            thread.join(seconds * 10 + 60)
            stop.set()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and pub.pending:
                time.sleep(0.1)
            acked = {int(p[1:].partition(b":")[0]) for p in pub.acked_snapshot()}
            while time.monotonic() < deadline and not acked <= set(fast.latency):
                time.sleep(0.1)
            process_b = cluster.brokers[B].process
            cpu_b = cpu_s(process_b.pid) - (cpu_before if mode == "live" else 0.0) if process_b else 0.0
            got = [n for n in acked if n in fast.latency]
            latencies = sorted(fast.latency[n] for n in got)
            # the catch-up's own delay: from when the message was published or the subscribers were
            # back on the restarted broker, whichever came later (the downtime taken out)
            delays = sorted(fast.latency[n] - max(0.0, back_at - fast.sent_at[n]) for n in got)
            slow_back_s = 0.0
            if slow_process is not None and mode == "restart":
                # when the slow client was back on the restarted broker (its reconnect, seconds after
                # the fast one's when the restarted broker is slow to answer it: an away session)
                slow_process.terminate()
                out, _ = slow_process.communicate(timeout=10)
                backs = [float(line.split()[1]) for line in out.splitlines() if line.startswith("connected ")]
                slow_back_s = backs[0] - back_at if backs else float("nan")
            counted = dropped(cluster, B)  # (this incarnation's counter)
            cluster.stop_broker(B)  # SIGTERM: B logs the drops it had only counted so far
            logged = logged_drops(cluster, B)
            return {
                "acked": len(acked),
                "lost": len(acked - set(fast.latency)),
                "p50": latencies[len(latencies) // 2],
                "p99": latencies[int(len(latencies) * 0.99)],
                "max": latencies[-1],
                "delay_p99": delays[int(len(delays) * 0.99)],
                "down_s": down_s,
                "slow_back_s": slow_back_s,
                "dropped": counted,
                "slow_logged": logged.pop(slow_id, 0),
                "fast_logged": logged.pop(fast.client_id, 0),
                "others_logged": sum(logged.values()),
                "cpu_b": cpu_b,
            }
        finally:
            if slow_process is not None and slow_process.returncode is None:
                slow_process.terminate()
                slow_process.wait(10)
            for client in clients:
                try:
                    client.close()
                except Exception:
                    pass
            cluster.close()


def slow_client(
    host: str, port: int, topic: str, drain_per_s: float, client_id: str, back_s: float = 0.0
) -> None:
    """The slow subscriber's own process: subscribe, say so, drain; reconnect whenever the broker
    goes away (a restart), until terminated."""
    client = TimedClient(
        port, host=host, client_id=client_id, clean=False, session_expiry_s=600, drain_per_s=drain_per_s
    )
    client.subscribe(topic, 1)
    print("subscribed", flush=True)
    while True:
        client.disconnected.wait()
        if back_s:  # (--slow-back-s: a device whose reconnect back-off has grown)
            while True:  # from when its broker listens again (a TCP connect, no MQTT)
                try:
                    socket.create_connection((host, port), timeout=1.0).close()
                    break
                except OSError:
                    time.sleep(0.1)
            time.sleep(back_s)
        while True:
            try:
                client.connect()
                print(f"connected {time.time():.3f}", flush=True)  # (when it was back: the bench)
                break
            except Exception:
                time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--slow-client"]:
        host, port, topic, drain, client_id, back = argv[1:7]
        slow_client(host, int(port), topic, float(drain), client_id, float(back))
        return 0
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", default="live,restart", help="live, restart or both (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alone + beside per mode")
    parser.add_argument(
        "--rate", type=float, default=600.0, help="publishes per second (the slow one drains 1/4)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the stream")
    parser.add_argument(
        "--slow-share",
        type=float,
        default=0.25,
        help="the slow subscriber drains this share of the rate (0: as fast as paho goes, a control)",
    )
    parser.add_argument("--keep", default="", help="keep each round's data and broker logs here")
    parser.add_argument(
        "--slow-back-s",
        type=float,
        default=0.0,
        help="the slow client reconnects this long after its broker listens again (restart mode: its"
        " session is away meanwhile, as a device's whose reconnect back-off has grown)",
    )
    args = parser.parse_args(argv)
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}; may be shared")
    ratios: dict[str, list[float]] = {}
    p99s: dict[tuple[str, bool], list[float]] = {}
    loads: list[float] = []
    # per mode and variant: the fast one's lost and logged drops, the slow one's logged drops
    sums: dict[tuple[str, bool], dict[str, float]] = {}
    for number in range(args.rounds):
        for mode in args.modes.split(","):
            pair: dict[bool, dict[str, float]] = {}
            order = (False, True) if number % 2 == 0 else (True, False)  # interleaved both ways
            for beside in order:
                loads.append(os.getloadavg()[0])
                figures = one_round(
                    mode, beside, args.rate, args.seconds, args.slow_share, args.keep, args.slow_back_s
                )
                pair[beside] = figures
                total = sums.setdefault((mode, beside), {"lost": 0.0, "fast_logged": 0.0, "slow_logged": 0.0})
                for key in total:
                    total[key] += figures[key]
                print(
                    f"round {number} {mode:7} {'beside slow' if beside else 'alone':11} fast: "
                    f"acked {figures['acked']:.0f} lost {figures['lost']:.0f} "
                    f"p50 {figures['p50'] * 1000:.1f} ms "
                    f"p99 {figures['p99'] * 1000:.1f} ms max {figures['max'] * 1000:.1f} ms; "
                    + (
                        f"B down {figures['down_s']:.1f} s, "
                        f"catch-up delay p99 {figures['delay_p99'] * 1000:.1f} ms; "
                        + (f"slow back +{figures['slow_back_s']:.1f} s; " if beside else "")
                        if mode == "restart"
                        else ""
                    )
                    + f"B dropped {figures['dropped']:.0f} (logged: slow {figures['slow_logged']:.0f},"
                    f" fast {figures['fast_logged']:.0f}, others {figures['others_logged']:.0f}),"
                    f" B CPU {figures['cpu_b']:.1f} s; "
                    f"load {loads[-1]:.1f}",
                    flush=True,
                )
            ratios.setdefault(mode, []).append(pair[True]["p99"] / pair[False]["p99"])
            for beside in (False, True):
                p99s.setdefault((mode, beside), []).append(pair[beside]["p99"])
            if mode == "restart":
                ratios.setdefault("restart (catch-up delay)", []).append(
                    pair[True]["delay_p99"] / pair[False]["delay_p99"]
                )
    for mode, values in ratios.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(
            f"{mode}: fast p99 beside slow / alone per round: {shown}; median {statistics.median(values):.2f}"
        )
    for mode in args.modes.split(","):
        p99_alone, p99_beside = (statistics.median(p99s[(mode, b)]) for b in (False, True))
        print(
            f"{mode}: median fast p99 alone {p99_alone * 1000:.1f} ms, beside slow "
            f"{p99_beside * 1000:.1f} ms: {p99_beside / p99_alone:.2f}x"
        )
    for (mode, beside), total in sorted(sums.items()):
        print(
            f"{mode} {'beside slow' if beside else 'alone'}: fast lost {total['lost']:.0f}, fast dropped"
            f" (logged) {total['fast_logged']:.0f}; slow dropped (logged) {total['slow_logged']:.0f}"
        )
    print(f"load average (1 min) at the rounds' starts: {min(loads):.1f}-{max(loads):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
