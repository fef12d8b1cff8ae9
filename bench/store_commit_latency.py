"""How long the store's COMMITs block the thread that issues them, per checkpoint strategy.

The broker commits its SQLite store on the event loop (group commit, once per loop iteration that
queued persistent work), so a long COMMIT holds every message behind it. This benchmark replays
the store calls of a paced QoS 1 stream to one persistent subscriber - per tick: ``enqueue`` the
message, ``set_inflight`` it, ``ack`` the previous one, ``commit`` - through the real
``broker.adapters.sqlite_store.Store`` on a real WAL file, and records every COMMIT's duration and
how late each tick ran (the loop's own stall). Strategies (``--strategies``):

- ``inline``: the store with SQLite's automatic checkpoint inside COMMIT (``wal_autocheckpoint``
  1000 pages: every ~1,000 pages one COMMIT also copies the WAL into the database and fsyncs both)
- ``none``: no checkpoint at all (the lower bound; the WAL grows without end)
- ``background``: the store's own checkpointer (``Store(checkpoint="background")``): the COMMIT
  never checkpoints; a thread with its own connection runs PASSIVE checkpoints

Variants run interleaved, ``--rounds`` each, a fresh database per run, in one process.
Reports commit p50/p99/p99.9/max, tick lateness p99/max, the WAL file's largest size and the
checkpoints run. Run by hand (not part of CI):

    .venv/bin/python bench/store_commit_latency.py --rate 1000 --duration 3 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.adapters.sqlite_store import Store
from broker.core.records import PUBLISH_SENT, StoredMessage


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else 0.0


def run(strategy: str, rate: int, duration_s: float, directory: str) -> dict[str, Any]:
    path = os.path.join(directory, f"{strategy}.db")
    if strategy == "inline":
        store = Store(path, checkpoint="inline")
    elif strategy == "none":
        store = Store(path, checkpoint="inline")
        store.db.execute("PRAGMA wal_autocheckpoint=0")
    else:
        store = Store(path, checkpoint="background")
    client = "bench-sub"
    store.upsert_session(
        client, protocol_level=4, expiry_interval_s=3600, username=None, disconnected_at=None
    )
    store.commit()
    payload = bytes(64)
    commits_ms: list[float] = []
    lateness_ms: list[float] = []
    wal_max = 0
    previous: int | None = None
    interval = 1.0 / rate
    started = time.perf_counter()
    tick = 0
    while True:
        due = started + tick * interval
        now = time.perf_counter()
        if now - started >= duration_s:
            break
        if now < due:
            time.sleep(due - now)
            now = time.perf_counter()
        lateness_ms.append((now - due) * 1e3)
        seq = store.enqueue(client, StoredMessage("bench/t", payload, 1, False, {}, None, "node"))
        store.set_inflight(client, seq, seq % 65535 + 1, PUBLISH_SENT)
        if previous is not None:
            store.ack(client, previous)
        previous = seq
        t0 = time.perf_counter()
        store.commit()
        commits_ms.append((time.perf_counter() - t0) * 1e3)
        if tick % 50 == 0:
            try:
                wal_max = max(wal_max, os.path.getsize(path + "-wal"))
            except OSError:
                pass
        tick += 1
    checkpoints = store.checkpoints_run
    checkpointer = store._checkpointer
    complete = checkpointer.completed if checkpointer is not None else 0
    store.close()
    return {
        "strategy": strategy,
        "commits": len(commits_ms),
        "commit_p50_ms": _pct(commits_ms, 0.5),
        "commit_p99_ms": _pct(commits_ms, 0.99),
        "commit_p999_ms": _pct(commits_ms, 0.999),
        "commit_max_ms": max(commits_ms),
        "commits_over_10ms": sum(1 for c in commits_ms if c > 10),
        "late_p99_ms": _pct(lateness_ms, 0.99),
        "late_max_ms": max(lateness_ms),
        "wal_max_mib": wal_max / 2**20,
        "checkpoints": checkpoints,
        "checkpoints_complete": complete,
        "load_average": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=int, default=1000, help="commits per second (1000)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run (3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per strategy (3)")
    parser.add_argument("--strategies", default="inline,background,none", help="comma-separated")
    parser.add_argument("--dir", default=None, help="directory for the databases (a temporary one)")
    parser.add_argument("--json", default=None, help="write every run here")
    args = parser.parse_args(argv)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for round_index in range(args.rounds):
            order = strategies if round_index % 2 == 0 else list(reversed(strategies))
            for strategy in order:
                result = run(strategy, args.rate, args.duration, directory)
                result["round"] = round_index + 1
                runs.append(result)
                print(
                    f"round {round_index + 1} {strategy:10s} commits {result['commits']:5d}  commit ms "
                    f"p50 {result['commit_p50_ms']:.3f} p99 {result['commit_p99_ms']:.3f} "
                    f"p99.9 {result['commit_p999_ms']:.2f} max {result['commit_max_ms']:.1f} "
                    f">10ms {result['commits_over_10ms']:3d}  late p99 {result['late_p99_ms']:.2f} "
                    f"max {result['late_max_ms']:.1f}  WAL max {result['wal_max_mib']:.2f} MiB  "
                    f"checkpoints {result['checkpoints']} complete {result['checkpoints_complete']}  "
                    f"load {result['load_average']:.1f}",
                    flush=True,
                )
                for suffix in ("", "-wal", "-shm"):
                    try:
                        os.unlink(os.path.join(directory, f"{strategy}.db{suffix}"))
                    except OSError:
                        pass
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv[1:], "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
