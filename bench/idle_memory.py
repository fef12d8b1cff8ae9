"""Memory per idle MQTT connection inside the broker, measured with tracemalloc (run by hand).

RSS per connection (``broker_bench.py``) counts whole pages and the allocator's slack; this
counts what the Python objects of one connection hold: its transport and protocol objects, the
core's ``ClientConnection`` with its decoder and buffers, the session and its subscription
records (the session table, the topic trie, the delivery plans). The broker runs in this process
(``ThreadedBroker``, uvloop like ``skipmq``), the clients in a child process (MQTT 3.1.1, clean
session, keep alive 600 s, one QoS 1 subscription each to a topic of their own), so only the
broker's allocations are traced. Prints the bytes per connection and the source lines that
allocated most of them.

    .venv/bin/python bench/idle_memory.py --connections 10000
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


def measure(count: int, top: int, frames: int = 1, loop: str = "uvloop") -> dict[str, Any]:
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
    parser.add_argument("--json", default=None, help="write the result here")
    parser.add_argument("--run-clients", nargs=2, type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_clients:
        run_clients(*args.run_clients)
        return 0
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = measure(args.connections, args.top, args.frames, args.loop)
    print(
        f"{result['connections']} idle connections (one subscription each, {result['loop']}): "
        f"{result['bytes_per_connection'] / 1024:.2f} KiB per connection traced by tracemalloc"
    )
    for line in result["top_lines"]:
        print(f"  {line['bytes_per_connection']:8.0f} B  {line['where']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
