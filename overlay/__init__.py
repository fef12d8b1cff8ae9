"""SkipMQ overlay: a pure (sans-I/O) SG-TBPS Skip Graph with Flexible Routing Tables.

Nothing in this package may import asyncio, socket, time, threading or use module-level
randomness: events and ``now`` go in, actions come out (see docs/overlay.md).
"""
