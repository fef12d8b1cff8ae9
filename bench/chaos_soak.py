"""Chaos soak (issue #12): a 5-broker cluster under a QoS 1 stream while random brokers are killed
with SIGKILL every few seconds; memory, latency, lost and duplicated messages over time.

The cluster is ``tools.launcher.LocalCluster`` (real ``python -m broker`` processes with mutual
TLS between them: the launcher makes a cluster CA and a certificate per broker, as
``skipmq certs`` does). Clients are paho-mqtt (MQTT 5, persistent sessions, QoS 1):

* one publisher sends ``--rate`` messages per second, each with a sequence number and its send
  time. A message counts as *acknowledged* when its PUBACK arrives; a message not acknowledged
  when the connection drops is sent again (same sequence number) after the reconnect.
* one subscriber (clean start false, session expiry 600 s) records what arrives.
* each client connects to a home broker; when its broker dies it reconnects to another live one
  (same client id: the session moves across the cluster) and later keeps that one.
* every ``--kill-every`` seconds a random live broker (at most ``--max-down`` at once) gets
  ``kill -9`` and is restarted ``--downtime`` seconds later with its data (same ports, node id).

At the end the chaos stops, every broker is brought back and the subscriber may drain for
``--drain`` seconds. *Lost* = acknowledged sequence numbers never received; *duplicated* =
sequence numbers received more than once (QoS 1 allows them; they are counted, not errors).
Every ``--sample-every`` seconds a row goes to ``<out>/samples.jsonl``: each broker's RSS
(``/proc/<pid>/statm``), messages acknowledged and received, duplicates, acknowledged messages
not received after 30 s so far, end-to-end latency p50/p99 of the interval. At the end
``<out>/summary.json`` and ``<out>/chaos_soak.png`` (matplotlib).

Tracing the duplicates: the brokers log at ``--log-level`` (info by default; their logs stay in
``<out>/cluster/broker-N.log``) and every receipt is kept (time, sequence number, the broker the
subscriber was connected to). ``<out>/bursts.json`` groups the duplicate receipts into bursts
(receipts less than ``BURST_GAP_S`` apart) and names for each: its size, the broker that delivered
it, the brokers and times of the first receipts of those messages, the kills and restarts of the
``BURST_LOOKBACK_S`` before it (how long each restart took) and the brokers' cluster log lines
about the subscriber's session in that time (hand-over, catch-up, late session merged...).

    .venv/bin/python -m bench.chaos_soak --minutes 10 --out /tmp/soak10
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tools.launcher import LocalCluster

TOPIC = "soak/stream"
SESSION_EXPIRY_S = 600
LATE_AFTER_S = 30.0  # an acknowledged message not received this long after its send counts as late
BURST_GAP_S = 2.0  # duplicate receipts closer than this belong to one burst (bursts.json)
BURST_LOOKBACK_S = 15.0  # the kills, restarts and session log lines this long before a burst
SESSION_EVENTS = (  # the brokers' log events about a session's moves, named in bursts.json
    "cluster_catch_up",
    "cluster_session_handed_over",
    "cluster_session_received",
    "cluster_late_session",
    "cluster_claim_grace_started",
    "session_taken_over",
    "cluster_catch_up_session_set_aside",
    "messages_dropped",
    "cluster_gap_given_up",
    "cluster_stream_started",  # a stream new on that broker: where it started (its ``low``)
    "cluster_resend_held",  # a peer's resend of a stream new there, held for its claim answer
    "cluster_stream_held_for_older_session",  # a stream new there, held for the client's older session
    "cluster_stream_hold_released",  # that hold's end without the session (answered none, timed out)
    "cluster_stream_hold_ended",  # the older session arrived: what it had of the held stream is dropped
)


def _rss_bytes(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * 4096
    except (OSError, ValueError, IndexError):
        return 0


def _connect_props() -> Properties:
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = SESSION_EXPIRY_S
    return props


class Client:
    """A paho client that follows the live brokers: a new paho connection (same client id, clean
    start false) to another live broker when its own dies."""

    def __init__(
        self, name: str, cluster: LocalCluster, home: int, down: set[int], lock: threading.Lock
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.index = home
        self.down = down
        self.down_lock = lock
        self.client: paho.Client | None = None
        self.connected = threading.Event()
        self.reconnects = 0
        self.on_message: Any = None
        self.on_publish: Any = None
        self.on_connected: Any = None

    def _make(self) -> paho.Client:
        client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.name,
            protocol=paho.MQTTv5,
            reconnect_on_failure=False,
        )
        client.max_inflight_messages_set(100)
        client.max_queued_messages_set(0)

        def on_connect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
            if not reason.is_failure:
                self.connected.set()
                if self.on_connected is not None:
                    self.on_connected(client)

        def on_disconnect(_c: Any, _u: Any, _f: Any, _r: Any, _p: Any) -> None:
            self.connected.clear()

        client.on_connect = on_connect
        client.on_disconnect = on_disconnect
        if self.on_message is not None:
            client.on_message = self.on_message
        if self.on_publish is not None:
            client.on_publish = self.on_publish
        return client

    def ensure(self, deadline_s: float = 60.0) -> paho.Client:
        """Connected (or reconnected to a live broker) within ``deadline_s``."""
        if self.client is not None and self.connected.is_set():
            return self.client
        if self.client is not None:
            self.client.loop_stop()
            self.client.disconnect()
            self.reconnects += 1
        stop_at = time.monotonic() + deadline_s
        while time.monotonic() < stop_at:
            with self.down_lock:
                live = [i for i in range(len(self.cluster.brokers)) if i not in self.down]
            if self.index not in live and live:
                self.index = random.choice(live)
            client = self._make()
            broker = self.cluster.brokers[self.index]
            try:
                client.connect(broker.host, broker.mqtt_port, keepalive=10, clean_start=False,
                               properties=_connect_props())  # fmt: skip
                client.loop_start()
                if self.connected.wait(5.0):
                    self.client = client
                    return client
                client.loop_stop()
                client.disconnect()
            except OSError:
                pass
            time.sleep(0.5)
            if live:
                self.index = random.choice(live)
        raise RuntimeError(f"{self.name}: no broker accepted a connection within {deadline_s} s")

    def close(self) -> None:
        if self.client is not None:
            self.client.disconnect()
            self.client.loop_stop()


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    sent_at: dict[int, float] = field(default_factory=dict)  # seq -> first send time
    acked: set[int] = field(default_factory=set)
    received: dict[int, int] = field(default_factory=dict)  # seq -> times received
    latencies_ms: deque[float] = field(default_factory=deque)  # since the last sample
    duplicates: int = 0
    receipts: list[tuple[float, int, int]] = field(default_factory=list)  # (time, seq, broker index)

    def late(self, now: float) -> int:
        return sum(1 for s in self.acked if s not in self.received and now - self.sent_at[s] > LATE_AFTER_S)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(args.seed)
        self.cluster = LocalCluster(
            args.brokers,
            # the default limits (limits.max_queued_messages 1,000): the catch-up after each
            # restart is paced by the subscriber (docs/cluster.md "Flow control")
            settings={"logging.level": args.log_level},
            data_root=str(self.out / "cluster"),
            keep_data=False,
        )
        self.down: set[int] = set()
        self.down_lock = threading.Lock()
        self.tally = Tally()
        self.stop = threading.Event()
        self.chaos_on = threading.Event()
        self.kills: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.started = 0.0
        self.started_wall = 0.0
        self.sub: Client | None = None

    # ---------------------------------------------------------------- clients
    def on_message(self, _c: Any, _u: Any, msg: paho.MQTTMessage) -> None:
        seq_text, sent_text = msg.payload.decode().split(" ", 1)
        seq, now = int(seq_text), time.time()
        tally = self.tally
        with tally.lock:
            count = tally.received.get(seq, 0)
            tally.received[seq] = count + 1
            tally.receipts.append((now, seq, self.sub.index if self.sub is not None else -1))
            if count:
                tally.duplicates += 1
            else:
                tally.latencies_ms.append((now - float(sent_text)) * 1000.0)

    def publisher(self) -> None:
        tally = self.tally
        pending: dict[int, int] = {}  # mid -> seq of the current paho connection
        early_acks: set[int] = set()  # PUBACKs that came before publish() returned the mid
        pending_lock = threading.Lock()

        def acknowledged(seq: int) -> None:
            with tally.lock:
                tally.acked.add(seq)

        def on_publish(_c: Any, _u: Any, mid: int, _r: Any, _p: Any) -> None:
            with pending_lock:
                seq = pending.pop(mid, None)
                if seq is None:
                    early_acks.add(mid)
            if seq is not None:
                acknowledged(seq)

        pub = Client("soak-pub", self.cluster, 0, self.down, self.down_lock)
        pub.on_publish = on_publish
        resend: deque[int] = deque()
        seq = 0
        interval = 1.0 / self.args.rate
        next_at = time.monotonic()
        client = pub.ensure()
        while not self.stop.is_set():
            if not pub.connected.is_set():
                with pending_lock:  # not acknowledged on the lost connection: send again
                    resend.extend(sorted(pending.values()))
                    pending.clear()
                    early_acks.clear()
                try:
                    client = pub.ensure()
                except RuntimeError:
                    continue
            if resend:
                current = resend.popleft()
            elif self.publishing:
                current = seq
                seq += 1
                with tally.lock:
                    tally.sent_at[current] = time.time()
            else:
                time.sleep(0.1)
                continue
            with tally.lock:
                sent_at = tally.sent_at[current]
            info = client.publish(TOPIC, f"{current} {sent_at}".encode(), qos=1)
            acked_early = False
            with pending_lock:
                if info.mid in early_acks:
                    early_acks.discard(info.mid)
                    acked_early = True
                elif info.rc in (paho.MQTT_ERR_SUCCESS, paho.MQTT_ERR_NO_CONN):
                    pending[info.mid] = current
                else:
                    resend.append(current)
            if acked_early:
                acknowledged(current)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()
        pub.close()

    publishing = True

    def subscriber(self) -> Client:
        sub = Client("soak-sub", self.cluster, 1, self.down, self.down_lock)
        sub.on_message = self.on_message
        sub.on_connected = lambda client: client.subscribe(TOPIC, 1)
        self.sub = sub
        return sub

    def keep_connected(self, client: Client) -> None:
        while not self.stop.wait(0.2):
            if not client.connected.is_set():
                try:
                    client.ensure(10.0)
                except RuntimeError:
                    pass

    # ---------------------------------------------------------------- chaos
    def _restart_later(self, index: int) -> None:
        time.sleep(self.args.downtime)
        try:
            self.cluster.restart_broker(index, timeout_s=60)
            outcome = "restarted"
        except Exception as exc:  # recorded: a restart failure is a finding
            outcome = f"restart failed: {exc}"
        with self.down_lock:
            self.down.discard(index)
        self.kills.append(
            {"t_s": round(time.monotonic() - self.started, 1), "broker": index, "event": outcome,
             "wall": time.time()}
        )  # fmt: skip

    def chaos(self) -> None:
        restarts: list[threading.Thread] = []
        while self.chaos_on.is_set() and not self.stop.wait(self.args.kill_every):
            if not self.chaos_on.is_set():
                break
            with self.down_lock:
                live = [i for i in range(self.args.brokers) if i not in self.down]
                if len(self.down) >= self.args.max_down or len(live) <= 1:
                    continue
                victim = self.rng.choice(live)
                self.down.add(victim)
            self.cluster.kill_broker(victim)
            self.kills.append(
                {"t_s": round(time.monotonic() - self.started, 1), "broker": victim, "event": "kill -9",
                 "wall": time.time()}
            )  # fmt: skip
            thread = threading.Thread(target=self._restart_later, args=(victim,), daemon=True)
            thread.start()
            restarts.append(thread)
        for thread in restarts:
            thread.join(timeout=120)

    # ---------------------------------------------------------------- sampling
    def sample(self, phase: str) -> dict[str, Any]:
        now = time.time()
        tally = self.tally
        with tally.lock:
            latencies = sorted(tally.latencies_ms)
            tally.latencies_ms.clear()
            row = {
                "t_s": round(time.monotonic() - self.started, 1),
                "phase": phase,
                "sent": len(tally.sent_at),
                "acked": len(tally.acked),
                "received_unique": len(tally.received),
                "duplicates": tally.duplicates,
                "late": tally.late(now),
            }
        row["latency_p50_ms"] = round(statistics.median(latencies), 1) if latencies else None
        row["latency_p99_ms"] = round(latencies[int(len(latencies) * 0.99)], 1) if latencies else None
        row["latency_max_ms"] = round(latencies[-1], 1) if latencies else None
        row["rss_mb"] = [round(_rss_bytes(b.pid) / 1e6, 1) for b in self.cluster.brokers]
        with self.down_lock:
            row["down"] = sorted(self.down)
        self.samples.append(row)
        with (self.out / "samples.jsonl").open("a") as out:
            out.write(json.dumps(row) + "\n")
        return row

    def run(self) -> dict[str, Any]:
        args = self.args
        (self.out / "samples.jsonl").write_text("")
        print(f"starting {args.brokers} brokers (mutual TLS) ...", flush=True)
        self.cluster.start()
        self.cluster.wait_ready(60)
        self.started = time.monotonic()
        self.started_wall = time.time()
        sub = self.subscriber()
        sub.ensure()
        threading.Thread(target=self.keep_connected, args=(sub,), daemon=True).start()
        time.sleep(1.0)
        publisher = threading.Thread(target=self.publisher, daemon=True)
        publisher.start()
        self.chaos_on.set()
        chaos = threading.Thread(target=self.chaos, daemon=True)
        chaos.start()
        chaos_until = self.started + args.minutes * 60
        while time.monotonic() < chaos_until:
            time.sleep(args.sample_every)
            row = self.sample("chaos")
            print(json.dumps(row), flush=True)
        self.chaos_on.clear()
        self.publishing = False
        chaos.join(timeout=180)
        print("chaos over; every broker back; draining", flush=True)
        for index, broker in enumerate(self.cluster.brokers):
            if not broker.alive():
                self.cluster.restart_broker(index, timeout_s=60)
        drain_until = time.monotonic() + args.drain
        while time.monotonic() < drain_until:
            time.sleep(min(args.sample_every, max(0.1, drain_until - time.monotonic())))
            row = self.sample("drain")
            print(json.dumps(row), flush=True)
            with self.tally.lock:
                missing = self.tally.acked - set(self.tally.received)
            if not missing and row["acked"] == row["sent"]:
                break
        self.stop.set()
        publisher.join(timeout=30)
        sub.close()
        with self.tally.lock:
            tally = self.tally
            lost = sorted(tally.acked - set(tally.received))
            summary = {
                "command": " ".join([".venv/bin/python -m bench.chaos_soak", *sys.argv[1:]]),
                "brokers": args.brokers,
                "minutes": args.minutes,
                "rate_per_s": args.rate,
                "kill_every_s": args.kill_every,
                "downtime_s": args.downtime,
                "max_down": args.max_down,
                "kills": sum(1 for k in self.kills if k["event"] == "kill -9"),
                "restart_failures": [k for k in self.kills if k["event"].startswith("restart failed")],
                "sent": len(tally.sent_at),
                "acknowledged": len(tally.acked),
                "received_unique": len(tally.received),
                "lost_acknowledged": len(lost),
                "lost_examples": lost[:20],
                "duplicates": tally.duplicates,
                "never_acknowledged": len(set(tally.sent_at) - tally.acked),
                "max_rss_mb": max((max(r["rss_mb"]) for r in self.samples), default=0),
                "latency_p99_ms_worst_interval": max(
                    (r["latency_p99_ms"] for r in self.samples if r["latency_p99_ms"] is not None),
                    default=None,
                ),
            }
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (self.out / "kills.json").write_text(json.dumps(self.kills, indent=1) + "\n")
        bursts = self.bursts()
        summary["duplicate_bursts"] = len(bursts)
        summary["largest_bursts"] = sorted((b["duplicates"] for b in bursts), reverse=True)[:10]
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (self.out / "bursts.json").write_text(json.dumps(bursts, indent=1) + "\n")
        self.plot()
        self.cluster.close()
        return summary

    def _session_log(self, since: float, until: float) -> list[str]:
        """The brokers' log lines (``SESSION_EVENTS``) between two wall-clock times, oldest first."""
        lines: list[tuple[str, str]] = []
        for broker in self.cluster.brokers:
            try:
                text = Path(broker.log_path).read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                if not any(event in line for event in SESSION_EVENTS) or "soak-pub" in line:
                    continue
                try:
                    entry = json.loads(line)
                    stamp = datetime.fromisoformat(entry["ts"].replace("Z", "+00:00")).timestamp()
                except (ValueError, KeyError, TypeError):
                    continue
                if since <= stamp <= until:
                    lines.append((entry["ts"], f"{entry['ts']} broker-{broker.index} {entry.get('msg', '')}"))
        return [text for _ts, text in sorted(lines)]

    def bursts(self) -> list[dict[str, Any]]:
        """The duplicate receipts grouped into bursts, each with what came before it (module doc)."""
        first: dict[int, tuple[float, int]] = {}
        groups: list[list[tuple[float, int, int]]] = []
        for receipt in self.tally.receipts:
            at, seq, broker = receipt
            if seq not in first:
                first[seq] = (at, broker)
                continue
            if groups and at - groups[-1][-1][0] < BURST_GAP_S:
                groups[-1].append(receipt)
            else:
                groups.append([receipt])
        out: list[dict[str, Any]] = []
        for group in groups:
            start, end = group[0][0], group[-1][0]
            seqs = [seq for _at, seq, _b in group]
            firsts = [first[seq] for seq in seqs]
            events = [
                {"t_s": round(k["wall"] - start, 1), "broker": k["broker"], "event": k["event"]}
                for k in self.kills
                if "wall" in k and start - BURST_LOOKBACK_S <= k["wall"] <= end
            ]
            out.append(
                {
                    "t_s": round(start - self.started_wall, 1),
                    "lasted_s": round(end - start, 1),
                    "duplicates": len(group),
                    "delivered_by": sorted({b for _at, _s, b in group}),
                    "seq_range": [min(seqs), max(seqs)],
                    "first_received_by": sorted({b for _at, b in firsts}),
                    "first_received_s_before": [round(start - max(a for a, _b in firsts), 1),
                                                round(start - min(a for a, _b in firsts), 1)],
                    "chaos_before (t_s relative to the burst)": events,
                    "session_log": self._session_log(start - BURST_LOOKBACK_S, end)[-40:],
                }
            )  # fmt: skip
        return out

    def plot(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.samples
        t = [r["t_s"] / 60 for r in rows]
        fig, (ax_mem, ax_lat, ax_cnt) = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
        for i in range(self.args.brokers):
            ax_mem.plot(t, [r["rss_mb"][i] for r in rows], label=f"broker {i}")
        ax_mem.set_ylabel("RSS (MB)")
        ax_mem.legend(loc="upper left", fontsize="small", ncol=5)
        ax_mem.set_title(
            f"chaos soak: {self.args.brokers} brokers, QoS 1 at {self.args.rate}/s, kill -9 every "
            f"{self.args.kill_every:g} s (down {self.args.downtime:g} s)"
        )
        kill_times = [k["t_s"] / 60 for k in self.kills if k["event"] == "kill -9"]
        for ax in (ax_mem, ax_lat, ax_cnt):
            for kt in kill_times:
                ax.axvline(kt, color="red", alpha=0.15, linewidth=0.8)
        ax_lat.plot(t, [r["latency_p50_ms"] for r in rows], label="p50")
        ax_lat.plot(t, [r["latency_p99_ms"] for r in rows], label="p99")
        ax_lat.set_yscale("log")
        ax_lat.set_ylabel("end-to-end latency (ms)")
        ax_lat.legend(loc="upper left", fontsize="small")
        ax_cnt.plot(
            t, [r["late"] for r in rows], label=f"acknowledged, not received after {LATE_AFTER_S:g} s"
        )
        ax_cnt.plot(t, [r["duplicates"] for r in rows], label="duplicates (cumulative)")
        ax_cnt.set_ylabel("messages")
        ax_cnt.set_xlabel("minutes (red lines: kill -9)")
        ax_cnt.legend(loc="upper left", fontsize="small")
        fig.tight_layout()
        fig.savefig(self.out / "chaos_soak.png", dpi=90)
        plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos_soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="chaos duration (default 10)")
    parser.add_argument("--brokers", type=int, default=5, help="cluster size (default 5)")
    parser.add_argument("--rate", type=float, default=20.0, help="QoS 1 messages per second (default 20)")
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between kills (default 5)")
    parser.add_argument("--downtime", type=float, default=3.0, help="seconds a killed broker stays down")
    parser.add_argument("--max-down", type=int, default=1, help="brokers down at once at most (default 1)")
    parser.add_argument("--drain", type=float, default=120.0, help="seconds to wait for stragglers")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=1, help="seed of the victim choice")
    parser.add_argument("--out", default="/tmp/skipmq-chaos-soak", help="output directory")
    parser.add_argument(
        "--log-level",
        default="info",
        help="the brokers' log level (default info: bursts.json names their events)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    summary = Soak(args).run()
    print(json.dumps(summary, indent=2))
    return 0 if summary["lost_acknowledged"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
