"""Publishes the cluster engine's per-class snapshots on ``$SYS/skipmq/<broker-id>/classes``.

Thin: every ``cluster.class_snapshot_interval_s`` seconds it asks the engine for the next snapshot
(``broker.cluster.class_stats``, built from counters the engine keeps anyway), adds the broker-wide
gauges that are recomputed at scrape time (queued messages, connections) and delivers the JSON to
this broker's local subscribers, as ``$SYS`` is (never forwarded, not retained: every snapshot is
read once, by a consumer connected to each broker; docs/pipeline.md "Snapshots").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING

from broker.core.broker import Broker
from broker.core.session import Message

if TYPE_CHECKING:
    from broker.cluster.engine import ClusterEngine
    from broker.core.ports import BrokerApi

log = logging.getLogger("skipmq.cluster")


def snapshot_topic(broker_id: str) -> str:
    """The topic of one broker's snapshots (the id's ``/`` and wildcards would break the level)."""
    safe = broker_id.replace("/", "_").replace("+", "_").replace("#", "_")
    return f"$SYS/skipmq/{safe}/classes"


class ClassSnapshotPublisher:
    def __init__(self, engine: ClusterEngine, broker: BrokerApi, interval_s: float) -> None:
        self.engine = engine
        self.broker = broker
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def publish_once(self) -> None:
        engine = self.engine
        if engine.stopped or not engine.peer_id:
            return
        extra: dict[str, int] = {}
        broker = self.broker
        if isinstance(broker, Broker):
            broker.refresh_stats()
            extra = {
                "queued_messages": broker.stats.queued_messages,
                "connections": broker.stats.connections_current,
                "messages_received": sum(broker.stats.messages_received),
                "messages_sent": sum(broker.stats.messages_sent),
            }
        snapshot = engine.class_snapshot(time.time(), extra)
        payload = json.dumps(snapshot, separators=(",", ":")).encode()
        # QoS 1: queued for a consumer's persistent session while it is away (the pipeline restarting)
        message = Message(snapshot_topic(engine.peer_id), payload, 1, False, {}, None, engine.peer_id, None)
        broker.deliver_remote(message)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.publish_once()
            except Exception:  # a snapshot must never take the broker down
                log.exception("cluster: class snapshot failed")
