"""aiohttp vs an ASGI app on uvicorn for the HTTP listener, side by side in one run (by hand).

Issue 16 asked to "measure and choose" the HTTP server of the pull gateway. Both servers run the
same two handlers in their own process, each on one asyncio event loop (the standard one: no
uvloop for either) with a C HTTP parser (aiohttp's own; uvicorn's ``httptools``):

* ``GET /json``: a trivial JSON answer (``{"ok": true}``), the server's own overhead;
* ``POST /v1/pull``: shaped like the gateway's: read the JSON body (16 acknowledged numbers),
  parse it with ``broker.core.pull.parse_pull``, answer 16 messages (seq, topic, QoS, retain,
  a 64-byte payload) and ``remaining`` as JSON. No broker behind it: the server is what is measured.

A keep-alive load generator in this process (raw asyncio streams, ``--connections`` persistent
connections, one request in flight on each) drives each server for ``--seconds``; the servers take
turns, ``--rounds`` times (aiohttp, uvicorn, aiohttp, ...), and the median of the rounds is
reported: requests/s, and server CPU per request (``utime+stime`` of the server process from
``/proc/<pid>/stat``, so the load generator's CPU is not counted). The machine is shared (2
cores): compare the ratios within one run, not the absolute numbers across runs.

uvicorn is not a dependency of the project: install it into the virtual environment for this
benchmark only (``.venv/bin/pip install uvicorn httptools``).

    .venv/bin/python bench/http_server_bench.py --help
    .venv/bin/python bench/http_server_bench.py                  # 3 rounds x 2 servers x 2 paths x 5 s
    .venv/bin/python bench/http_server_bench.py --rounds 5 --connections 32 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.core.pull import Problem, parse_pull  # noqa: E402
from tools.ports import free_port  # noqa: E402

HOST = "127.0.0.1"
TICKS = os.sysconf("SC_CLK_TCK")
SERVERS = ("aiohttp", "uvicorn")
PULL_BODY = json.dumps({"client_id": "dev-1", "acks": list(range(1, 17)), "wait_s": 0}).encode()
MESSAGES = [
    {
        "seq": seq,
        "topic": f"meters/7/reading/{seq}",
        "qos": 1,
        "retain": False,
        "payload": "x" * 64,
    }
    for seq in range(17, 33)
]


# ---------------------------------------------------------------------- the handlers, shared
def json_answer() -> tuple[int, bytes]:
    return 200, b'{"ok": true}'


def pull_answer(body: bytes) -> tuple[int, bytes]:
    """The gateway's /v1/pull work without a broker: parse, validate, answer 16 messages."""
    try:
        parsed = parse_pull(json.loads(body or b"{}"), max_wait_s=30)
    except ValueError as exc:
        return 400, json.dumps({"status": 400, "detail": str(exc)}).encode()
    if isinstance(parsed, Problem):
        return parsed.status, json.dumps(parsed.body()).encode()
    answer = {
        "client_id": parsed.client_id,
        "epoch": "bench",
        "session_present": True,
        "acks_applied": True,
        "messages": MESSAGES[: parsed.max_messages],
        "remaining": False,
    }
    return 200, json.dumps(answer).encode()


# ---------------------------------------------------------------------- the two servers
def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def get_json(_request: web.Request) -> web.Response:
        status, body = json_answer()
        return web.Response(status=status, body=body, content_type="application/json")

    async def post_pull(request: web.Request) -> web.Response:
        status, body = pull_answer(await request.read())
        return web.Response(status=status, body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/json", get_json)
    app.router.add_post("/v1/pull", post_pull)
    web.run_app(app, host=HOST, port=port, access_log=None, print=None)


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def asgi_app(scope: Scope, receive: Receive, send: Send) -> None:
    """A bare ASGI application (no framework: the thinnest thing uvicorn can serve)."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/json" and scope["method"] == "GET":
        status, body = json_answer()
    elif scope["path"] == "/v1/pull" and scope["method"] == "POST":
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        status, body = pull_answer(b"".join(chunks))
    else:
        status, body = 404, b'{"status": 404}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve_uvicorn(port: int) -> None:
    import uvicorn

    uvicorn.run(
        asgi_app,
        host=HOST,
        port=port,
        http="httptools",
        loop="asyncio",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )


# ---------------------------------------------------------------------- the load generator
def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def request_bytes(path: str) -> bytes:
    if path == "/json":
        return f"GET /json HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
    head = (
        f"POST /v1/pull HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(PULL_BODY)}\r\n\r\n"
    )
    return head.encode() + PULL_BODY


async def _connection(port: int, request: bytes, deadline: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        while time.monotonic() < deadline:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer: {head[:80]!r}")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            counts[0] += 1
    finally:
        writer.close()


async def load(port: int, path: str, connections: int, seconds: float) -> tuple[int, float]:
    """(requests answered, wall seconds) with ``connections`` keep-alive connections."""
    counts = [0]
    request = request_bytes(path)
    started = time.monotonic()
    deadline = started + seconds
    await asyncio.gather(*(_connection(port, request, deadline, counts) for _ in range(connections)))
    return counts[0], time.monotonic() - started


def start_server(kind: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return proc, port
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"{kind} did not start (is it installed? see --help)") from None
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{kind} did not listen within 20 s")


def measure(kind: str, path: str, connections: int, seconds: float) -> dict[str, float]:
    proc, port = start_server(kind)
    try:
        asyncio.run(load(port, path, connections, 0.5))  # warm up
        before = cpu_ticks(proc.pid)
        requests, wall = asyncio.run(load(port, path, connections, seconds))
        cpu_s = (cpu_ticks(proc.pid) - before) / TICKS
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return {
        "requests": requests,
        "requests_per_s": requests / wall,
        "server_cpu_us_per_request": 1e6 * cpu_s / max(requests, 1),
        "server_cpu_share": cpu_s / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Each round runs every server on every path; the median over rounds is printed. "
        "Needs uvicorn and httptools in the environment (.venv/bin/pip install uvicorn httptools).",
    )
    parser.add_argument("--rounds", type=int, default=3, help="turns per server (default 3)")
    parser.add_argument("--seconds", type=float, default=5.0, help="load per measurement (default 5)")
    parser.add_argument("--connections", type=int, default=16, help="keep-alive connections (default 16)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        (serve_aiohttp if args.serve == "aiohttp" else serve_uvicorn)(args.port)
        return
    import aiohttp
    import httptools
    import uvicorn

    versions = {
        "aiohttp": aiohttp.__version__,
        "uvicorn": uvicorn.__version__,
        "httptools": httptools.__version__,
    }
    print(f"versions: {versions}; python {sys.version.split()[0]}; {os.cpu_count()} cores", flush=True)
    results: dict[str, dict[str, list[dict[str, float]]]] = {
        path: {kind: [] for kind in SERVERS} for path in ("/json", "/v1/pull")
    }
    for round_no in range(1, args.rounds + 1):
        for path, per_kind in results.items():
            for kind in SERVERS:
                figures = measure(kind, path, args.connections, args.seconds)
                per_kind[kind].append(figures)
                rps, cpu_us = figures["requests_per_s"], figures["server_cpu_us_per_request"]
                share = 100 * figures["server_cpu_share"]
                print(
                    f"round {round_no}/{args.rounds} {path:9} {kind:8} {rps:8.0f} req/s "
                    f"{cpu_us:6.1f} us CPU/req (server at {share:.0f}% of a core)",
                    flush=True,
                )
    summary: dict[str, Any] = {"versions": versions, "connections": args.connections, "paths": {}}
    print(
        f"\nmedian of {args.rounds} rounds, {args.connections} keep-alive connections, "
        f"{args.seconds:g} s each:"
    )
    print(f"{'path':10} {'server':8} {'req/s':>8} {'us CPU/req':>11}")
    for path, per_kind in results.items():
        medians = {
            kind: {
                key: statistics.median(run[key] for run in runs)
                for key in ("requests_per_s", "server_cpu_us_per_request")
            }
            for kind, runs in per_kind.items()
        }
        for kind, median in medians.items():
            print(
                f"{path:10} {kind:8} {median['requests_per_s']:8.0f} "
                f"{median['server_cpu_us_per_request']:11.1f}"
            )
        ratio_rps = medians["uvicorn"]["requests_per_s"] / medians["aiohttp"]["requests_per_s"]
        ratio_cpu = (
            medians["uvicorn"]["server_cpu_us_per_request"] / medians["aiohttp"]["server_cpu_us_per_request"]
        )
        print(f"{path:10} uvicorn/aiohttp: requests/s x{ratio_rps:.2f}, CPU per request x{ratio_cpu:.2f}")
        summary["paths"][path] = {"median": medians, "runs": per_kind, "uvicorn_over_aiohttp_rps": ratio_rps,
                                  "uvicorn_over_aiohttp_cpu": ratio_cpu}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
