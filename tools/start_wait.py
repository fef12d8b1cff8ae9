"""How long a harness waits for a broker process it started to become ready.

A broker on an idle 2-core machine answers in 1-2 s; with eight engineers' suites on the same two
cores (load average ~28) the same start has been seen to take over 10 s - Python imports and TLS
setup only get their share of the CPU. A fixed short wait then fails a test for the machine's
sake. The harnesses (tools/launcher.py, tests/support/interop_broker.py,
tests/support/federation.py) therefore wait on readiness (a port that accepts, /healthz, GET
/federation), which returns as soon as the broker is ready, with a bound that grows with the
machine's load: ``base_s`` times the run queue per CPU (the 1-minute load average / CPUs, at least
1), at most ``MAX_FACTOR`` times ``base_s``. A broker not ready by then is reported as broken
with its last log lines (``not_ready_error``). ``SKIPMQ_START_TIMEOUT_S`` fixes the bound.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_S = 30.0
MAX_FACTOR = 4.0
ENV = "SKIPMQ_START_TIMEOUT_S"


def load_factor() -> float:
    """The 1-minute load average per CPU, at least 1 (1 where the OS does not say)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def start_timeout_s(base_s: float = BASE_S) -> float:
    """The bound for one broker start: ``base_s`` scaled by the load (module docstring)."""
    fixed = os.environ.get(ENV)
    if fixed:
        return float(fixed)
    return round(base_s * min(MAX_FACTOR, load_factor()), 1)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a broker's log file ("" when there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "".join(text.splitlines(True)[-lines:])


def not_ready_error(what: str, waited_s: float, reason: str, log: Path) -> str:
    """The message for a broker that was not ready in time: what, how long, why, the load, the log."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{what} not ready within {waited_s:.1f} s ({reason}; load average {load:.1f} on "
        f"{os.cpu_count()} CPUs; {ENV} sets the bound); last lines of {log}:\n{log_tail(log)}"
    )
