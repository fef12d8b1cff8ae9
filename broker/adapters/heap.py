"""The broker process's heap after start-up: the garbage collector stops re-scanning it.

A started broker holds ~50,000 objects that live as long as the process (the modules of asyncio,
uvloop, aiohttp, grpc, the overlay, the configuration, the core's tables). CPython's full
collection walks every one of them: ~13 ms on the 2-core benchmark machine, during which no
client is served. The publish path allocates no lasting objects, so full collections are rare,
but the first one comes soon after start-up (the start-up itself counted towards it) and each
later one pays for those 50,000 objects again. ``gc.collect()`` then ``gc.freeze()`` once the
listeners are up moves them to the permanent generation: later collections see only what was
made since (connections, sessions, messages). Objects frozen here are never collected; a cycle
among them that becomes garbage later stays in memory (start-up objects live for the process
anyway). Measured: docs/notes/single-broker.md, "p99 latency".
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect once, then exempt every surviving object from later collections; returns how many
    objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
