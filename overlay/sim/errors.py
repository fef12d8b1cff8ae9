"""The simulator's error: a failed run, named by the seed and virtual time that replay it.

Its own module so that ``overlay/sim/engine.py`` holds no subclass of a built-in type and can be
compiled with mypyc for long sweeps (``bench/compiled_core.py``); ``engine`` re-exports it.
"""

from __future__ import annotations


class SimulationError(RuntimeError):
    """A simulation failed; the message names the seed and virtual time needed to replay it."""

    def __init__(self, message: str, *, seed: int, now_s: float) -> None:
        super().__init__(f"{message} [seed={seed} t={now_s:.6f}s]")
        self.seed = seed
        self.now_s = now_s
