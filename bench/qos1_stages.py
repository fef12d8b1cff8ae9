"""Where a QoS 1 message to a persistent subscriber spends its latency, stage by stage.

The paced run of ``broker_bench.py --latency-qos 1`` (one publisher, one subscriber with a
persistent session, a send timestamp in each payload), against a SkipMQ broker started through
this script's ``--serve`` mode, which wraps a few broker functions with ``perf_counter_ns``
timestamps (CLOCK_MONOTONIC, the same clock as the load client's). Per message:

- ``to_read``: sent by the load client -> the broker's ``receive`` of the bytes that held it
  (the kernel, and the broker's loop busy or its process not on a CPU);
- ``handle``: that ``receive`` -> its ``handle_publish`` returned (decode, route, the store's
  enqueue and set_inflight, the PUBLISH queued for the subscriber); of which
  ``decode_before_handler`` (the read's decoding and the packets before it in the same read) and
  ``store_calls`` (the SQLite statements: enqueue, set_inflight, an ack of an earlier one);
- ``to_write``: -> the loop's write flush that sent it (other work of the same iteration);
- ``to_subscriber``: the flush -> the subscriber read it (the kernel, the load client's loop).

Per group COMMIT: start, duration, on the loop or on the commit thread, and what it carried
(enqueues, set_inflights, acks since the previous one). The slowest 1 % of messages are
broken down by stage and by what overlapped them (a COMMIT on the loop, the broker waiting for a
CPU). Wrapping costs ~1 us per call; it is a diagnosis, not the benchmark (use broker_bench.py).

    .venv/bin/python bench/qos1_stages.py --rates 1000,5000 --rounds 3 --realtime \\
        --json docs/qos1_stages.json
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))
if sys.argv[1:2] == ["--serve"]:  # the broker of the tree under test (PYTHONPATH) comes first
    sys.path.insert(0, os.environ.get("PYTHONPATH", str(REPO_ROOT)).split(os.pathsep)[0])


# ---- the instrumented broker (--serve) --------------------------------------------------------
SLOW_CALL_NS = 200_000


def serve(trace_path: str, broker_args: list[str]) -> int:
    """Run ``python -m broker`` with timestamps around receive, handle_publish, the write flush
    and the COMMITs; dump them as JSON to ``trace_path`` at exit."""
    from broker import __main__ as broker_main
    from broker.adapters import sqlite_store
    from broker.core import client, client_publish, outbound

    now = time.perf_counter_ns
    # stamp, read, handle start, handle end, flush start, flush end, time in store calls
    messages: list[list[int]] = []
    unflushed: list[list[int]] = []
    commits: list[list[Any]] = []  # start, duration, "loop"/"thread", enqueues, set_inflights, acks
    counts = [0, 0, 0]
    state = {"read": 0, "store_ns": 0}
    slow_calls: list[list[Any]] = []  # start, duration, store call: the ones over SLOW_CALL_NS

    receive = client.ClientConnection.receive

    def timed_receive(self: Any, data: bytes) -> None:
        state["read"] = now()
        receive(self, data)

    handle_publish = client_publish.ClientPublish.handle_publish

    def timed_handle_publish(self: Any, packet: Any) -> None:
        start = now()
        store_before = state["store_ns"]
        handle_publish(self, packet)
        if packet.qos and len(packet.payload) >= 8:
            stamp = int.from_bytes(packet.payload[:8], "big")
            record = [stamp, state["read"], start, now(), 0, 0, state["store_ns"] - store_before]
            messages.append(record)
            unflushed.append(record)

    flush_writes = outbound.Outbound.flush_writes

    def timed_flush_writes(self: Any) -> None:
        start = now()
        flush_writes(self)
        end = now()
        for record in unflushed:
            record[4] = start
            record[5] = end
        unflushed.clear()

    store_cls = sqlite_store.Store

    def counting(name: str, index: int) -> None:
        original = getattr(store_cls, name)

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            counts[index] += 1
            start = now()
            result = original(self, *args, **kwargs)
            took = now() - start
            state["store_ns"] += took
            if took >= SLOW_CALL_NS:
                slow_calls.append([start, took, name])
            return result

        setattr(store_cls, name, counted)

    counting("enqueue", 0)
    counting("set_inflight", 1)
    counting("ack", 2)
    settle = store_cls._settle

    def timed_settle(self: Any) -> None:
        start = now()
        settle(self)
        took = now() - start
        if took >= SLOW_CALL_NS:
            slow_calls.append([start, took, "wait for the commit thread"])

    store_cls._settle = timed_settle  # type: ignore[method-assign]

    def carried() -> list[int]:
        batch = list(counts)
        counts[:] = [0, 0, 0]
        return batch

    commit = store_cls.commit

    def timed_commit(self: Any) -> None:
        pending = self._db.in_transaction and not self._bg_running
        start = now()
        commit(self)
        if pending:
            commits.append([start, now() - start, "loop", *carried()])

    on_thread = store_cls._commit_on_thread

    def timed_on_thread(self: Any) -> None:
        start = now()
        on_thread(self)
        commits.append([start, now() - start, "thread", *batch_at_submit.pop(0, [0, 0, 0])])

    batch_at_submit: dict[int, list[int]] = {}
    in_background = store_cls.commit_in_background

    def timed_in_background(self: Any, done: Any) -> bool:
        before = list(counts)
        started: bool = in_background(self, done)
        if started:
            batch_at_submit[0] = before
            counts[:] = [0, 0, 0]
        return started

    client.ClientConnection.receive = timed_receive  # type: ignore[method-assign]
    client_publish.ClientPublish.handle_publish = timed_handle_publish  # type: ignore[method-assign]
    from broker.mqtt.packets import Publish

    client._HANDLERS[Publish] = timed_handle_publish
    outbound.Outbound.flush_writes = timed_flush_writes  # type: ignore[method-assign]
    store_cls.commit = timed_commit  # type: ignore[method-assign]
    store_cls._commit_on_thread = timed_on_thread  # type: ignore[method-assign]
    store_cls.commit_in_background = timed_in_background  # type: ignore[method-assign]

    def dump() -> None:
        Path(trace_path).write_text(
            json.dumps({"messages": messages, "commits": commits, "slow_calls": slow_calls})
        )

    atexit.register(dump)
    return broker_main.main(broker_args)


# ---- the driver ------------------------------------------------------------------------------
async def paced(port: int, pid: int, rate: int, duration_s: float, tag: str) -> dict[str, Any]:
    """broker_bench.run_latency at QoS 1, keeping each message's receive time (in order)."""
    import broker_bench as bb

    class Received(list[int]):
        """The subscriber appends each latency; keep (sent, received) beside it."""

        pairs: list[tuple[int, int]] = []

        def append(self, latency_ns: int) -> None:
            received = time.perf_counter_ns()
            self.pairs.append((received - latency_ns, received))
            super().append(latency_ns)

    base = f"bench/stages{tag}{rate}"
    sub = await bb.open_persistent_client(port, f"{base}-s")
    pub = await bb.open_client(port, f"{base}-p", bb.Publisher)
    await bb.subscribe(sub, [f"{base}/t"], 1)
    received = Received()
    received.pairs = []
    sub.latencies_ns = received
    pad = bytes(bb.PAYLOAD_BYTES - 8)
    packet_id = 0
    t0 = time.perf_counter()
    sent = 0
    warmup_s = min(0.5, duration_s / 4)
    end = t0 + warmup_s + duration_s
    measured_from_ns = int((t0 + warmup_s) * 1e9)
    wait0 = bb.sched_wait_ns(pid)
    while (now := time.perf_counter()) < end:
        due = int((now - t0) * rate)
        if due > sent:
            packets = []
            for _ in range(due - sent):
                packet_id = packet_id % 65535 + 1
                stamp = time.perf_counter_ns().to_bytes(8, "big")
                packets.append(bb.raw.publish_packet(f"{base}/t", stamp + pad, qos=1, packet_id=packet_id))
            pub.write(b"".join(packets))
            sent = due
        await asyncio.sleep(0.0005)
    await asyncio.sleep(0.3)
    run_queue_wait_ms = (bb.sched_wait_ns(pid) - wait0) / 1e6
    await bb.close_clients([sub, pub])
    return {
        "pairs": received.pairs,
        "measured_from_ns": measured_from_ns,
        "sent": sent,
        "run_queue_wait_ms": run_queue_wait_ms,
        "load_average": os.getloadavg()[0],
    }


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def analyse(run: dict[str, Any], trace: dict[str, Any]) -> dict[str, Any]:
    """Join the subscriber's receive times with the broker's stage timestamps (by stamp)."""
    by_stamp = {m[0]: m for m in trace["messages"]}
    stamps = sorted(by_stamp)
    rows = []
    import bisect

    for approx_sent, received in run["pairs"]:
        # the subscriber's sent time is received - latency, computed ~1 us after the latency
        i = bisect.bisect_left(stamps, approx_sent - 50_000)
        best = None
        while i < len(stamps) and stamps[i] <= approx_sent + 5_000:
            best = stamps[i]
            i += 1
        if best is None or best < run["measured_from_ns"]:
            continue
        stamp, read, h0, h1, f0, f1, in_store = by_stamp[best]
        if not f0:
            continue
        rows.append(
            {
                "total": (received - stamp) / 1e3,
                "to_read": (read - stamp) / 1e3,
                "handle": (h1 - read) / 1e3,
                "decode_before_handler": (h0 - read) / 1e3,
                "store_calls": in_store / 1e3,
                "to_write": (f0 - h1) / 1e3,
                "write": (f1 - f0) / 1e3,
                "to_subscriber": (received - f1) / 1e3,
                "sent": stamp,
                "received": received,
            }
        )
    commits = [c for c in trace["commits"] if c[0] >= run["measured_from_ns"]]
    loop_commits = [c for c in commits if c[2] == "loop"]
    stages: tuple[str, ...] = ("to_read", "handle", "to_write", "write", "to_subscriber")
    stages += ("decode_before_handler", "store_calls")  # parts of "handle"
    out: dict[str, Any] = {"messages": len(rows), "sent": run["sent"]}
    if not rows:
        return out
    totals = [r["total"] for r in rows]
    p99 = pct(totals, 0.99)
    slow = [r for r in rows if r["total"] >= p99]
    out["p50_us"] = pct(totals, 0.5)
    out["p99_us"] = p99
    out["max_us"] = max(totals)
    out["stage_median_us"] = {s: statistics.median(r[s] for r in rows) for s in stages}
    out["slowest_1pct_stage_mean_us"] = {s: statistics.fmean(r[s] for r in slow) for s in stages}
    # what the loop was doing while a slow message waited to be read: COMMITs on the loop
    overlap = 0
    for r in slow:
        if any(c[0] < r["sent"] + r["to_read"] * 1e3 and c[0] + c[1] > r["sent"] for c in loop_commits):
            overlap += 1
    out["slowest_1pct_behind_a_loop_commit"] = overlap
    slow_calls = [c for c in trace.get("slow_calls", []) if c[0] >= run["measured_from_ns"]]
    by_call: dict[str, list[float]] = {}
    for _start, took, name in slow_calls:
        by_call.setdefault(name, []).append(took / 1e3)
    out["store_calls_over_200us"] = {
        k: {"count": len(v), "total_us": sum(v), "max_us": max(v)} for k, v in by_call.items()
    }
    out["slowest_1pct"] = len(slow)
    durations = [c[1] / 1e3 for c in commits]
    out["commits"] = {
        "count": len(commits),
        "on_loop": len(loop_commits),
        "on_thread": len(commits) - len(loop_commits),
        "per_message": len(commits) / len(rows),
        "duration_p50_us": pct(durations, 0.5),
        "duration_p99_us": pct(durations, 0.99),
        "duration_max_us": max(durations) if durations else None,
        "over_1ms": sum(d >= 1000 for d in durations),
        "over_10ms": sum(d >= 10_000 for d in durations),
        "loop_time_ms": sum(c[1] for c in loop_commits) / 1e6,
        "enqueues_per_commit_mean": statistics.fmean(c[3] for c in commits) if commits else None,
        "acks_per_commit_mean": statistics.fmean(c[5] for c in commits) if commits else None,
        "commits_with_only_acks": sum(1 for c in commits if c[3] == 0 and c[5] > 0),
    }
    out["run_queue_wait_ms"] = run["run_queue_wait_ms"]
    out["load_average"] = run["load_average"]
    return out


async def one_run(
    rate: int, duration_s: float, realtime: bool, workdir: Path, tag: str, root: Path
) -> dict[str, Any]:
    import subprocess

    import broker_bench as bb

    from tools.ports import free_port

    port, http_port = free_port(), free_port()
    trace = workdir / f"trace-{tag}.json"
    env = dict(os.environ, PYTHONPATH=str(root))
    command = [
        sys.executable, str(Path(__file__).resolve()), "--serve", str(trace),
        "--bind", bb.HOST, "--port", str(port),
        "--http-port", str(http_port), "--data-dir", str(workdir / f"data-{tag}"),
        "--log-level", "warning", "--log-format", "json",
    ]  # fmt: skip
    with bb.realtime(realtime):
        proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
        try:
            bb.wait_port(port, proc)
            run = await paced(port, proc.pid, rate, duration_s, tag)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    return analyse(run, json.loads(trace.read_text()))


def summary_line(rate: int, res: dict[str, Any]) -> str:
    stages = res.get("slowest_1pct_stage_mean_us", {})
    commits = res.get("commits", {})
    return (
        f"@{rate}/s: p50 {res.get('p50_us', 0):.0f} us, p99 {res.get('p99_us', 0):.0f} us; slowest 1 % "
        + ", ".join(f"{k} {v:.0f}" for k, v in stages.items())
        + f" us; behind a loop COMMIT {res.get('slowest_1pct_behind_a_loop_commit')}"
        f"/{res.get('slowest_1pct')}; "
        f"commits {commits.get('count')} ({commits.get('on_thread')} on the thread, "
        f"{commits.get('per_message', 0):.2f}/msg, p50 {commits.get('duration_p50_us', 0):.0f} us, "
        f"max {commits.get('duration_max_us') or 0:.0f} us, "
        f"only-acks {commits.get('commits_with_only_acks')}); "
        f"run-queue wait {res.get('run_queue_wait_ms', 0):.0f} ms, load {res.get('load_average', 0):.1f}; "
        f"store calls over 0.2 ms: "
        + (
            ", ".join(
                f"{k} {v['count']}x (max {v['max_us']:.0f} us)"
                for k, v in res.get("store_calls_over_200us", {}).items()
            )
            or "none"
        )
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve(argv[1], argv[2:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="1000,5000", help="paced rates, msg/s (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per rate (a fresh broker each)")
    parser.add_argument("--duration", type=float, default=2.0, help="measured seconds per run")
    parser.add_argument("--realtime", action="store_true", help="broker and load client as SCHED_FIFO")
    parser.add_argument("--json", type=Path, help="write every run's breakdown here")
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a source tree whose broker to run (repeat: the trees take turns in each round); "
        "default: this checkout",
    )
    args = parser.parse_args(argv)
    import tempfile

    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree] or [
        ("here", REPO_ROOT)
    ]
    workdir = Path(tempfile.mkdtemp(prefix="skipmq-stages-"))
    rates = [int(r) for r in args.rates.split(",")]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {str(r): [] for r in rates} for name, _ in trees
    }
    for round_no in range(args.rounds):
        for rate in rates:
            for name, root in trees:
                tag = f"{name}-{rate}-{round_no}"
                res = asyncio.run(one_run(rate, args.duration, args.realtime, workdir, tag, root))
                res.pop("rows", None)
                results[name][str(rate)].append(res)
                print(f"{name} " + summary_line(rate, res), flush=True)
    for name, _ in trees:
        for rate in rates:
            runs = results[name][str(rate)]
            p99s = [r["p99_us"] for r in runs if "p99_us" in r]
            commits = [r["commits"]["per_message"] for r in runs if "commits" in r]
            if p99s:
                print(
                    f"{name} @{rate}/s: p99 median {statistics.median(p99s):.0f} us (per round "
                    + ", ".join(f"{p:.0f}" for p in p99s)
                    + f"), COMMITs per message {statistics.median(commits):.2f}"
                )
    if args.json:
        payload = {"trees": {n: str(p) for n, p in trees}, "realtime": args.realtime, "results": results}
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
