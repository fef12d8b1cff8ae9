"""Load check of the admin API: listing N sessions pages in bounded memory and time (by hand).

Starts one real broker process with the admin API, makes N persistent sessions with raw MQTT
3.1.1 CONNECTs (clean session off, then DISCONNECT: the session stays), then pages through
``GET /admin/v1/sessions?limit=L`` to the end, timing every page and reading the broker's
resident memory (``/proc/<pid>/status``: VmRSS now, VmHWM the peak) before and after paging.
Checks: every session listed exactly once, in client-id order. Prints a summary and writes it as
JSON (``--json``).

    .venv/bin/python -m bench.admin_bench --sessions 100000 --limit 1000 --json docs/admin_bench.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from broker.adapters.admin.access import set_admin_user, write_admin_users
from tools.mqtt_raw import connect_packet
from tools.ports import free_ports

HOST = "127.0.0.1"


def proc_memory_kib(pid: int) -> dict[str, int]:
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0])
    return values


async def make_sessions(port: int, count: int, concurrency: int) -> float:
    """``count`` persistent sessions (ids s-000000...); seconds taken."""
    started = time.perf_counter()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(count):
        queue.put_nowait(index)

    async def worker() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(connect_packet(f"s-{index:06d}", clean=False))
            await reader.readexactly(4)  # CONNACK
            writer.write(b"\xe0\x00")  # DISCONNECT
            await writer.drain()
            writer.close()
            await writer.wait_closed()
            if index and index % 10000 == 0:
                print(f"  {index} sessions made", file=sys.stderr, flush=True)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


def get(url: str, auth: str) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": auth})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--limit", type=int, default=1000, help="page size")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--json", help="write the summary here")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="admin-bench-"))
    users: dict[str, tuple[str, str]] = {}
    set_admin_user(users, "bench", "readonly", "bench-pw")
    write_admin_users(str(workdir / "admins"), users)
    mqtt_port, http_port = free_ports(2)
    cmd = [
        sys.executable,
        "-m",
        "broker",
        "--port",
        str(mqtt_port),
        "--http-port",
        str(http_port),
        "--data-dir",
        str(workdir / "data"),
        "--log-level",
        "warning",
        "--set",
        "admin.enabled=true",
        "--set",
        f"admin.users_file={workdir / 'admins'}",
    ]
    broker = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    auth = "Basic " + base64.b64encode(b"bench:bench-pw").decode()
    base = f"http://{HOST}:{http_port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                get(base + "/admin/v1/whoami", auth)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        print(f"making {args.sessions} sessions ...", file=sys.stderr)
        made_s = asyncio.run(make_sessions(mqtt_port, args.sessions, args.concurrency))
        before = proc_memory_kib(broker.pid)
        page_times: list[float] = []
        seen: list[str] = []
        cursor = None
        started = time.perf_counter()
        while True:
            url = f"{base}/admin/v1/sessions?limit={args.limit}" + (f"&cursor={cursor}" if cursor else "")
            t0 = time.perf_counter()
            page = get(url, auth)
            page_times.append(time.perf_counter() - t0)
            seen.extend(item["client_id"] for item in page["items"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        total_s = time.perf_counter() - started
        after = proc_memory_kib(broker.pid)
        expected = [f"s-{index:06d}" for index in range(args.sessions)]
        summary = {
            "sessions": args.sessions,
            "page_size": args.limit,
            "pages": len(page_times),
            "listed_once_in_order": seen == expected,
            "make_sessions_s": round(made_s, 1),
            "paging_total_s": round(total_s, 2),
            "page_ms_median": round(statistics.median(page_times) * 1000, 1),
            "page_ms_p90": round(sorted(page_times)[int(0.9 * (len(page_times) - 1))] * 1000, 1),
            "page_ms_max": round(max(page_times) * 1000, 1),
            "rss_mib_before_paging": round(before["VmRSS"] / 1024, 1),
            "rss_mib_after_paging": round(after["VmRSS"] / 1024, 1),
            "peak_rss_mib_before_paging": round(before["VmHWM"] / 1024, 1),
            "peak_rss_mib_after_paging": round(after["VmHWM"] / 1024, 1),
            "machine": {"nproc": os.cpu_count(), "loadavg": os.getloadavg()},
            "date": time.strftime("%Y-%m-%d"),
        }
        print(json.dumps(summary, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        return 0 if summary["listed_once_in_order"] else 1
    finally:
        broker.terminate()
        try:
            broker.wait(30)
        except subprocess.TimeoutExpired:
            broker.kill()


if __name__ == "__main__":
    sys.exit(main())
