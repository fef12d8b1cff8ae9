"""tools.proc_stats: the /proc readings the cluster and link benchmarks report per message."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tools.proc_stats import context_switches, cpu_s, wakeup_round_trip_us


def test_cpu_s_grows_with_work_and_not_with_sleep() -> None:
    before = cpu_s(os.getpid())
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    busy = cpu_s(os.getpid()) - before
    assert busy >= 0.1  # clock ticks: 0.2 s of work reads as at least 0.1 s
    before = cpu_s(os.getpid())
    time.sleep(0.2)
    assert cpu_s(os.getpid()) - before < 0.1


_CHILD = """
import sys, threading, time
def worker():
    for _ in range(100):
        time.sleep(0.001)  # asleep, then woken: one voluntary switch each
    print("slept", flush=True)
    threading.Event().wait()  # alive, so that its count stays readable
threading.Thread(target=worker, daemon=True).start()
sys.stdin.readline()  # the main thread sleeps once until the parent has read
"""


def test_context_switches_sum_every_thread_of_the_process() -> None:
    """A process whose main thread sleeps once and whose other thread sleeps 100 times: the sum is
    the other thread's count too (a reading of the main thread alone would be ~1)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "slept"
        assert context_switches(child.pid) >= 100
    finally:
        child.kill()
        child.wait(10)


def test_wakeup_round_trip_is_a_positive_time() -> None:
    assert 0 < wakeup_round_trip_us(rounds=200) < 1_000_000
