"""Where a broker's CPU per delivery goes: py-spy ``--native`` samples grouped by stage (run by hand).

``bench/publish_cost.py --breakdown RUNS`` measures the total (the broker's threads' run time
over uninstrumented lock-step runs) and the kernel's share of it (stime); this module turns one
py-spy raw profile (``name (file:line)`` frames, root first, a count per stack) into samples per
stage - the decoder, the packet handlers, routing, session and queue bookkeeping, encoding, the
write flush, the ack path, SQLite, the garbage collector, the loop and transport - and prints the
table whose rows add up to the measured total. The deepest frame that names a stage decides;
samples waiting in epoll or on a lock (idle), in fdatasync (the disk) or inside a read/write
system call (kernel time, or a run-queue wait after waking the peer: py-spy samples wall-clock
time) are counted apart; the kernel's row is the measured stime instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

IDLE = "(idle: waiting in epoll or on a lock; not CPU)"
DISK = "(waiting on the disk: fdatasync; not CPU)"
# the groups of the breakdown, in the order the table lists them
STAGES = (
    "the kernel: system calls (recv, send, epoll; the broker's stime)",
    "(samples inside a system call: kernel time and run-queue waits; the row above counts it)",
    "event loop and transport (uvloop, libuv, asyncio; the listener's protocol)",
    "decode (the MQTT decoder)",
    "the packet handlers (dispatch, handle_publish, checks)",
    "routing (topic checks, trie, delivery plan)",
    "session and queue bookkeeping (outbound, session, durability)",
    "encode (the outgoing PUBLISH)",
    "the write flush (the connection's buffered output)",
    "the ack path (PUBACK in and out)",
    "SQLite (statements, COMMIT and its hand-off to the commit thread; the store adapter)",
    "garbage collector",
    "other (interpreter start-up of callbacks, metrics, timers)",
)
KERNEL, IN_SYSCALL = STAGES[0], STAGES[1]
USER_STAGES = STAGES[2:]
_SYSCALL_READ = ("read", "recv", "recvfrom", "recvmsg", "readv")
_SYSCALL_WRITE = ("write", "writev", "send", "sendto", "sendmsg")


def classify_stack(frames: list[str]) -> str:
    """The stage one sample (frames root first, py-spy's ``name (file:line)``) belongs to: the
    deepest frame that names one decides."""
    leaf = frames[-1]
    leaf_name = leaf.split(" (")[0]
    if leaf_name == "epoll_pwait" or leaf_name == "epoll_wait":
        return IDLE
    if leaf_name == "fdatasync" or leaf_name == "fsync":
        return DISK
    for frame in frames:
        if "PyThread_acquire_lock_timed" in frame or frame.startswith(("Condition.wait ", "Queue.get ")):
            return IDLE
    for frame in reversed(frames):
        name, _, where = frame.partition(" (")
        where = where.rstrip(")")
        if "libsqlite3" in where or "_sqlite" in where or "broker/adapters/sqlite" in where:
            return STAGES[10]
        if "libc.so" in where and name in _SYSCALL_READ + _SYSCALL_WRITE:
            return IN_SYSCALL
        if name.startswith("gc_collect") or name == "gc_collect_main":
            return STAGES[11]
        if ".py:" not in where:
            continue
        path = where.split(":")[0]
        if "ack" in name.lower() and ("client" in path or "outbound" in path or "codec_publish" in path):
            return STAGES[9]
        if path.endswith("broker/mqtt/protocol.py"):
            return STAGES[3]
        if "broker/mqtt/codec" in path:
            return STAGES[7] if "encode" in name or name.startswith("_topic_field") else STAGES[3]
        if path.endswith(("broker/core/routing.py", "broker/mqtt/topics.py", "broker/core/reserved.py")):
            return STAGES[5]
        if path.endswith("broker/core/outbound.py"):
            if "encode" in name:
                return STAGES[7]
            if "flush" in name:
                return STAGES[8]
            return STAGES[6]
        if path.endswith(("broker/core/session.py", "broker/core/sessions.py", "broker/core/records.py")):
            return STAGES[6]
        if "broker/core/durability" in path:
            return STAGES[6]
        if path.endswith("broker/core/client_base.py") and "flush" in name:
            return STAGES[8]
        if path.startswith("broker/core/client") or "/broker/core/client" in path:
            return STAGES[4]
        if "listeners.py" in path or "asyncio/" in path or "uvloop/" in path:
            return STAGES[2]
        return STAGES[12]
    # no Python frame and none of the above: uvloop's and libuv's own C
    return STAGES[2]


def breakdown(profile: Path) -> dict[str, int]:
    """Samples per stage (and the idle and disk-wait samples) of one py-spy raw profile."""
    counts: dict[str, int] = {}
    for line in profile.read_text(errors="replace").splitlines():
        stack, _, number = line.rpartition(" ")
        if not stack or not number.isdigit():
            continue
        stage = classify_stack(stack.split(";"))
        counts[stage] = counts.get(stage, 0) + int(number)
    return counts


def print_breakdown(result: dict[str, Any]) -> None:
    scenarios = result["scenarios"]
    print("| stage (us of broker CPU per delivery) | " + " | ".join(r["scenario"] for r in scenarios) + " |")
    print("|---|" + "---:|" * len(scenarios))
    for stage in STAGES:
        cells = []
        for res in scenarios:
            us = res["us_per_delivery_by_stage"][stage]
            if stage == IN_SYSCALL:
                cells.append(f"{res['samples'].get(stage, 0)} samples")
                continue
            share = 100 * us / max(1e-9, res["cpu_us_per_delivery"])
            cells.append(f"{us:.2f} ({share:.0f} %)")
        print(f"| {stage} | " + " | ".join(cells) + " |")
    print(
        "| **total** (median of the uninstrumented runs) | "
        + " | ".join(f"**{r['cpu_us_per_delivery']:.2f}**" for r in scenarios)
        + " |"
    )
    print(
        "| samples in user space (idle / disk wait left out) | "
        + " | ".join(
            f"{r['busy_samples']} ({r['samples'].get(IDLE, 0)} / {r['samples'].get(DISK, 0)})"
            for r in scenarios
        )
        + " |"
    )
    print(
        "| the kernel's share of the CPU (stime, uninstrumented runs) | "
        + " | ".join(f"{100 * r['system_share']:.0f} %" for r in scenarios)
        + " |"
    )
