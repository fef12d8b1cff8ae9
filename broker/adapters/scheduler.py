"""The core's scheduler port on an asyncio event loop (``broker.core.ports.Scheduler``).

``time``, ``call_soon``, ``call_later`` and ``call_at`` are the loop's own bound methods, so the
core pays nothing extra on its hot paths; ``wall_time`` is ``time.time``; ``run_blocking`` runs a
function in the loop's default executor (a worker thread) and resolves a core ``Completion`` back
on the loop thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from broker.core.ports import Completion

T = TypeVar("T")


class AsyncioScheduler:
    """``broker.core.ports.Scheduler`` on ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.time: Callable[[], float] = loop.time
        self.call_soon: Callable[..., Any] = loop.call_soon
        self.call_later: Callable[..., asyncio.TimerHandle] = loop.call_later
        self.call_at: Callable[..., asyncio.TimerHandle] = loop.call_at

    @staticmethod
    def wall_time() -> float:
        return time.time()

    def run_blocking(self, func: Callable[[], T]) -> Completion[T]:
        completion: Completion[T] = Completion()

        def finished(future: asyncio.Future[T]) -> None:
            if future.cancelled():
                completion.set_exception(asyncio.CancelledError())
            elif future.exception() is not None:
                exc = future.exception()
                assert exc is not None
                completion.set_exception(exc)
            else:
                completion.set_result(future.result())

        self.loop.run_in_executor(None, func).add_done_callback(finished)
        return completion
