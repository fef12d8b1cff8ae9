"""Reads the process's resident memory for the memory high-water mark (docs/security.md).

Every ``limits.memory_check_interval_ms`` the RSS (``/proc/self/statm``: one small read, a few
microseconds) goes to ``Broker.memory_observed`` (broker/core/memory_guard.py decides). While the
broker is above the mark, glibc is asked to give freed heap memory back to the system
(``malloc_trim(0)``): without it the RSS of a CPython process may stay high after the buffers
that pushed it up are freed, and the broker would not see itself recover (measured:
docs/security.md "Memory high-water mark").
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.core.broker import Broker

log = logging.getLogger("skipmq.memory")
_STATM = "/proc/self/statm"


def rss_bytes() -> int | None:
    """The resident set size of this process, or None where /proc is not available."""
    try:
        with open(_STATM, "rb") as statm:
            fields = statm.read().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _heap_trimmer() -> Callable[[], None] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def trim_heap() -> None:
        trim(0)

    return trim_heap


class MemoryWatch:
    """The periodic RSS reading of one broker (a task on the event loop)."""

    def __init__(self, broker: Broker, interval_s: float, *, trim_heap: bool = True) -> None:
        self.broker = broker
        self.interval_s = interval_s
        self._trim = _heap_trimmer() if trim_heap else None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        broker = self.broker
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                if broker.memory.above and self._trim is not None:
                    self._trim()
                used = rss_bytes()
                if used is not None:
                    broker.memory_observed(used)
            except Exception:  # never let the watch die silently: log and keep watching
                log.exception("memory watch failed")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
