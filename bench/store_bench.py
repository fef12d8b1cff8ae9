"""Micro-benchmark of broker.adapters.sqlite_store group commit: µs per enqueue+commit at 1, 10 and
100 messages per commit.

Reports the best of --repeat runs (the machine may be shared; the best run is the least disturbed).

Run from the repo root:
    PYTHONPATH=. .venv/bin/python bench/store_bench.py [--messages N] [--synchronous normal|full] [--fanout K]
Uses a real WAL database file in a temporary directory (see broker/store.py for the durability model).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from broker.adapters.sqlite_store import Store
from broker.core.records import StoredMessage


def bench(batch_size: int, total_messages: int, synchronous: str, fanout: int) -> float:
    """Return µs per enqueued message (including its share of the commit)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(os.path.join(tmp, "bench.db"), synchronous=synchronous)
        clients = [f"client-{i}" for i in range(max(fanout, 1))]
        for client_id in clients:
            store.upsert_session(
                client_id, protocol_level=5, expiry_interval_s=3600, username=None, disconnected_at=None
            )
        store.commit()
        payload = b"x" * 64
        batches = total_messages // batch_size
        started = time.perf_counter()
        for batch in range(batches):
            for i in range(batch_size):
                message = StoredMessage(f"bench/{i % 10}", payload, 1, False, {}, None, "node-a")
                if fanout > 1:
                    store.enqueue_many(clients, message)
                else:
                    store.enqueue(clients[0], message)
            store.commit()
            if batch % 50 == 49:  # keep the queues from growing without bound, like acks would
                for client_id in clients:
                    store.drop_oldest(client_id, 1_000_000)
                store.commit()
        elapsed_s = time.perf_counter() - started
        store.close()
    return elapsed_s / (batches * batch_size) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--synchronous", choices=["normal", "full"], default="normal")
    parser.add_argument("--fanout", type=int, default=1, help="sessions per message (enqueue_many)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per batch size; the best is reported")
    args = parser.parse_args()
    for batch_size in (1, 10, 100):
        total = args.messages if batch_size > 1 else max(args.messages // 4, 1)
        us = min(bench(batch_size, total, args.synchronous, args.fanout) for _ in range(args.repeat))
        label = f"synchronous={args.synchronous} fanout={args.fanout} batch={batch_size:>3}"
        print(f"{label}: {us:8.1f} µs/message")


if __name__ == "__main__":
    main()
