"""Memory per idle MQTT connection inside the broker, measured with tracemalloc (run by hand).

RSS per connection (``broker_bench.py``) counts whole pages and the allocator's slack; this
counts what the Python objects of one connection hold: its transport and protocol objects, the
core's ``ClientConnection`` with its decoder and buffers, the session and its subscription
records (the session table, the topic trie, the delivery plans). The broker runs in this process
(``ThreadedBroker``, uvloop like ``skipmq``), the clients in a child process (MQTT 3.1.1, clean
session, keep alive 600 s, one QoS 1 subscription each to a topic of their own), so only the
broker's allocations are traced. Prints the bytes per connection and the source lines that
allocated most of them; ``--by-type`` adds the objects themselves: every object the broker's
garbage collector tracks (and the untracked ones they refer to: strings, ints, floats) counted
by type, allocating line and size, before and after the clients connected, per connection.

    .venv/bin/python bench/idle_memory.py --connections 10000
    .venv/bin/python bench/idle_memory.py --connections 5000 --by-type
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools import loadclient  # noqa: E402


class _Idle(loadclient.LoadClient):
    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while len(buf) >= 2:
            length = buf[1]  # CONNACK and a one-filter SUBACK: short packets
            if len(buf) < 2 + length:
                return
            if buf[0] >> 4 == 2:
                self.connack_received(buf[3])
            elif buf[0] >> 4 == 9:
                self.suback_received((buf[2] << 8) | buf[3], bytes(buf[2 : 2 + length]))
            del buf[: 2 + length]


async def _open_idle(port: int, count: int) -> list[_Idle]:
    clients: list[_Idle] = []
    for start in range(0, count, 200):
        batch = await asyncio.gather(
            *(
                loadclient.open_client(lambda i=i: _Idle(f"idle-{i}"), port, f"idle-{i}", keepalive_s=600)
                for i in range(start, min(count, start + 200))
            )
        )
        await asyncio.gather(
            *(loadclient.subscribe(c, [f"idle/{start + n}/status"], 1) for n, c in enumerate(batch))
        )
        clients.extend(batch)
    return clients


def run_clients(port: int, count: int) -> None:
    """Child process: open ``count`` idle subscribed connections, say so, hold them until stdin closes."""

    async def main() -> None:
        clients = await _open_idle(port, count)
        print(f"ready {len(clients)}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        for client in clients:
            client.close()

    asyncio.run(main())


def census() -> dict[tuple[str, str, int], int]:
    """Objects by (type, allocating line, size in bytes): the garbage collector's objects and the
    untracked objects they refer to, each once; objects allocated before tracing began are left
    out (no traceback)."""
    gc.collect()
    counts: dict[tuple[str, str, int], int] = {}
    seen: set[int] = set()

    def visit(obj: object) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        traceback = tracemalloc.get_object_traceback(obj)
        if traceback is None:
            return
        frame = traceback[0]
        key = (type(obj).__name__, f"{Path(frame.filename).name}:{frame.lineno}", sys.getsizeof(obj))
        counts[key] = counts.get(key, 0) + 1

    for obj in gc.get_objects():
        visit(obj)
        for referent in gc.get_referents(obj):
            if not gc.is_tracked(referent):
                visit(referent)
    return counts


def by_type(
    before: dict[tuple[str, str, int], int], after: dict[tuple[str, str, int], int], opened: int
) -> list[dict[str, Any]]:
    """What the connections added: per (type, line, size), objects and bytes per connection
    (rows of at least one object per 10 connections)."""
    rows = []
    for (kind, where, size), count in after.items():
        added = count - before.get((kind, where, size), 0)
        if added * 10 >= opened:
            rows.append(
                {
                    "type": kind,
                    "where": where,
                    "size": size,
                    "objects_per_connection": added / opened,
                    "bytes_per_connection": size * added / opened,
                }
            )
    rows.sort(key=lambda row: -row["bytes_per_connection"])
    return rows


def measure(
    count: int, top: int, frames: int = 1, loop: str = "uvloop", types: bool = False
) -> dict[str, Any]:
    from broker.adapters.server import ThreadedBroker
    from broker.config import load_config

    used = "asyncio"
    if loop == "uvloop":
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            used = "uvloop"
        except ImportError:
            pass
    data_dir = tempfile.mkdtemp(prefix="skipmq-idle-")
    config = load_config(
        None,
        env={},
        overrides={
            "listeners.tcp.host": "127.0.0.1",
            "listeners.tcp.port": 0,
            "http.port": 0,
            "data_dir": data_dir,
            "logging.level": "warning",
        },
    )
    tracemalloc.start(frames)
    broker = ThreadedBroker(config)
    ports = broker.start()
    try:
        census_before = broker.call(census, timeout_s=600) if types else {}
        gc.collect()
        before = tracemalloc.take_snapshot()
        before_bytes = tracemalloc.get_traced_memory()[0]
        child = subprocess.Popen(
            [sys.executable, __file__, "--run-clients", str(ports["tcp"]), str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        opened = int(line.split()[1])
        time.sleep(1.0)
        connected = broker.call(lambda: broker.broker.connected_count)
        broker.call(gc.collect)
        after = tracemalloc.take_snapshot()
        after_bytes = tracemalloc.get_traced_memory()[0]
        census_after = broker.call(census, timeout_s=600) if types else {}
        child.stdin.close()
        child.wait(timeout=60)
    finally:
        broker.stop()
        tracemalloc.stop()
    stats = after.compare_to(before, "traceback" if frames > 1 else "lineno")
    lines = [
        {
            "where": " <- ".join(f"{Path(frame.filename).name}:{frame.lineno}" for frame in stat.traceback),
            "bytes_per_connection": stat.size_diff / opened,
        }
        for stat in stats[:top]
    ]
    return {
        "loop": used,
        "connections": opened,
        "connected_in_broker": connected,
        "traced_bytes_before": before_bytes,
        "traced_bytes_after": after_bytes,
        "bytes_per_connection": (after_bytes - before_bytes) / opened,
        "top_lines": lines,
        "by_type": by_type(census_before, census_after, opened) if types else [],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else "",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=15, help="source lines listed")
    parser.add_argument(
        "--frames", type=int, default=1, help="call frames per allocation site listed (1: the line only)"
    )
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the broker's event loop: uvloop (the broker's default where installed) or the standard one",
    )
    parser.add_argument(
        "--by-type",
        action="store_true",
        help="also count the objects the connections added, by type, allocating line and size",
    )
    parser.add_argument("--json", default=None, help="write the result here")
    parser.add_argument("--run-clients", nargs=2, type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_clients:
        run_clients(*args.run_clients)
        return 0
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = measure(args.connections, args.top, args.frames, args.loop, args.by_type)
    print(
        f"{result['connections']} idle connections (one subscription each, {result['loop']}): "
        f"{result['bytes_per_connection'] / 1024:.2f} KiB per connection traced by tracemalloc"
    )
    for line in result["top_lines"]:
        print(f"  {line['bytes_per_connection']:8.0f} B  {line['where']}")
    if result["by_type"]:
        print("objects the connections added (per connection: objects x size = bytes; type, line):")
        for row in result["by_type"]:
            print(
                f"  {row['objects_per_connection']:5.2f} x {row['size']:5d} B = "
                f"{row['bytes_per_connection']:6.0f} B  {row['type']:18s} {row['where']}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
