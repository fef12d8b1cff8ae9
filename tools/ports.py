"""Free TCP ports for brokers started by tests, benchmarks and the local-cluster launcher.

The ports come from *below* the kernel's ephemeral range (``ip_local_port_range``), never from
it. A broker that is killed and restarted keeps its ports (its cluster address is its id); a
port from the ephemeral range can meanwhile become the local end of any outgoing connection on
the machine (another test's client, a gRPC dial), and the restart then fails with "address
already in use" (CI, 2026-11-29). Outgoing connections never take a port below that range.

Each process walks its own slice of the range (one per pytest-xdist worker, the others by pid)
with a cursor, so two launchers never hand out the same port, and a port handed out a moment
ago is not handed out again until the slice wraps. A port is checked by binding it.
"""

from __future__ import annotations

import os
import socket
import threading

HOST = "127.0.0.1"

LOWEST_PORT = 15000
"""The range starts here (the well-known and registered ports below are left alone)."""
SLICES = 16
"""Slices of the range: 0-7 for pytest-xdist workers gw0-gw7, 8-15 for other processes by pid."""
FALLBACK_EPHEMERAL_LOW = 32768
"""Linux's default start of the ephemeral range, used when /proc does not say."""

_lock = threading.Lock()
_cursor: dict[int, int] = {}


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        with open(path, encoding="ascii") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return FALLBACK_EPHEMERAL_LOW


def _slice_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        return int(worker[2:]) % (SLICES // 2)
    return SLICES // 2 + os.getpid() % (SLICES // 2)


def _slice_bounds() -> tuple[int, int]:
    high = ephemeral_low()
    if high - LOWEST_PORT < SLICES * 64:  # an unusual range: fall back to the kernel's choice
        return 0, 0
    size = (high - LOWEST_PORT) // SLICES
    start = LOWEST_PORT + _slice_index() * size
    return start, start + size


def _bindable(sock: socket.socket, host: str, port: int) -> bool:
    try:
        sock.bind((host, port))
    except OSError:
        return False
    return True


def free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` distinct ports that were free a moment ago (each bound once, then closed)."""
    start, end = _slice_bounds()
    sockets: list[socket.socket] = []
    try:
        if start == end:
            for _ in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind((host, 0))
            return [int(sock.getsockname()[1]) for sock in sockets]
        ports: list[int] = []
        with _lock:
            cursor = _cursor.get(start, start + os.getpid() % (end - start))
            for _ in range(end - start):
                port = cursor
                cursor = start if cursor + 1 >= end else cursor + 1
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                if _bindable(sock, host, port):
                    sockets.append(sock)
                    ports.append(port)
                    if len(ports) == count:
                        break
                else:
                    sock.close()
            _cursor[start] = cursor
        if len(ports) < count:
            raise OSError(f"no {count} free ports in {start}-{end - 1} on {host}")
        return ports
    finally:
        for sock in sockets:
            sock.close()


def free_port(host: str = HOST) -> int:
    """A TCP port that was free a moment ago."""
    return free_ports(1, host)[0]
