"""What a process has cost so far, read from Linux ``/proc`` (for benchmarks, by hand).

* ``cpu_s(pid)``: user + system CPU seconds of the whole process (every thread).
* ``context_switches(pid)``: voluntary + involuntary context switches summed over the process's
  threads. A voluntary switch is a thread going to sleep (``epoll_wait``, a futex, a blocking
  read) and so, when it is woken again, one wake-up: per message, it counts the hand-offs between
  threads and processes a message costs, which on a virtual machine cost far more than the Python
  work around them (docs/benchmarks-cluster.md, "Why the latency goal cannot be met here").
* ``wakeup_round_trip_us()``: what two such hand-offs cost on this machine - a byte sent back and
  forth between two processes over pipes, each side sleeping in ``read`` in between.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> int:
    """Voluntary + involuntary switches of every thread of ``pid`` alive now (a thread that ended
    in between takes its count with it: compare over windows in which the threads stay)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended while we read
        for line in text.splitlines():
            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                total += int(line.split(":", 1)[1])
    return total


def wakeup_round_trip_us(rounds: int = 3000) -> float:
    """Median over 3 runs of the mean round trip of one byte between two processes over pipes."""
    results = []
    for _ in range(3):
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                for _ in range(rounds):
                    os.read(to_child_r, 1)
                    os.write(to_parent_w, b"x")
            finally:
                os._exit(0)
        start = time.perf_counter()
        for _ in range(rounds):
            os.write(to_child_w, b"x")
            os.read(to_parent_r, 1)
        results.append((time.perf_counter() - start) / rounds * 1e6)
        os.waitpid(pid, 0)
        for fd in (to_child_r, to_child_w, to_parent_r, to_parent_w):
            os.close(fd)
    return sorted(results)[1]
