"""The hand-stepped overlay harness of the scripted overlay tests (etcd-raft style, seed 003 §3.5).

``Cluster`` holds 2-8 physical ``overlay.node.OverlayNode`` s; a test decides which in-flight
message is delivered next and when virtual time advances. Used by tests/unit/overlay (scripted
interaction tests) and tests/sim/overlay (publish completion, level-0 repair).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from overlay.api import (
    Bootstrap,
    Deliver,
    JoinTopic,
    Publish,
    PublishDone,
    Receive,
    Role,
    Send,
    SubscriberPresence,
    Tick,
)
from overlay.config import OverlayConfig
from overlay.node import OverlayNode

PUB_ROLE = Role.PUBLISHER
SUB_ROLE = Role.SUBSCRIBER


class Cluster:
    """Physical nodes 0..n-1 and the messages in flight between them (FIFO unless picked)."""

    def __init__(self, size: int, config: OverlayConfig, seed: int = 7) -> None:
        self.config = config
        self.nodes = {
            peer: OverlayNode(peer, rng=random.Random(seed * 100 + peer), config=config)
            for peer in range(size)
        }
        self.now = 0.0
        self.in_flight: list[tuple[int, Send]] = []
        self.delivered: list[tuple[int, Deliver]] = []
        self.presence: list[tuple[int, SubscriberPresence]] = []
        self.done: list[tuple[int, PublishDone]] = []
        self.log: list[tuple[int, Any]] = []  # every non-Send action, in the order emitted
        self.trace: list[tuple[int, int, Any]] = []  # (src, dest, message) in delivery order
        self.crashed: set[int] = set()

    # ----------------------------------------------------------------- stepping

    def event(self, peer: int, event: Any) -> list[Any]:
        actions = self.nodes[peer].handle(event, self.now)
        self.log.extend((peer, action) for action in actions if not isinstance(action, Send))
        for action in actions:
            if isinstance(action, Send):
                assert action.dest != peer, "a node must handle its own virtual nodes locally"
                self.in_flight.append((peer, action))
            elif isinstance(action, Deliver):
                self.delivered.append((peer, action))
            elif isinstance(action, SubscriberPresence):
                self.presence.append((peer, action))
            elif isinstance(action, PublishDone):
                self.done.append((peer, action))
            else:  # pragma: no cover - the API has no other action
                raise AssertionError(f"unknown action {action!r}")
        return actions

    def pending(self, kind: str | None = None) -> list[tuple[int, Send]]:
        return [item for item in self.in_flight if kind is None or item[1].message.kind == kind]

    def deliver(self, item: tuple[int, Send]) -> list[Any]:
        self.in_flight.remove(item)
        src, send = item
        if send.dest in self.crashed or src in self.crashed:
            return []
        self.trace.append((src, send.dest, send.message))
        return self.event(send.dest, Receive(src, send.message))

    def deliver_next(self, predicate: Callable[[int, Send], bool] = lambda src, send: True) -> list[Any]:
        for item in self.in_flight:
            if predicate(*item):
                return self.deliver(item)
        raise AssertionError("no in-flight message matches")

    def drain(self, max_steps: int = 200_000) -> int:
        steps = 0
        while self.in_flight:
            self.deliver(self.in_flight[0])
            steps += 1
            assert steps <= max_steps, "message storm: the overlay did not quiesce"
        return steps

    def advance(self, seconds: float, step_s: float = 0.5) -> None:
        """Let time pass: deliver everything, fire due timers, repeat every ``step_s``."""
        end = self.now + seconds
        while True:
            self.drain()
            if self.now >= end:
                return
            self.now = min(end, self.now + step_s)
            for peer, node in self.nodes.items():
                deadline = node.next_deadline()
                if peer not in self.crashed and deadline is not None and deadline <= self.now:
                    self.event(peer, Tick())

    # ----------------------------------------------------------------- setup & checks

    def bootstrap_all(self) -> None:
        self.event(0, Bootstrap(()))
        for peer in range(1, len(self.nodes)):
            self.event(peer, Bootstrap((0,)))
        self.advance(3.0)

    def all_keys(self) -> list[tuple[Any, ...]]:
        return sorted(
            key
            for peer, node in self.nodes.items()
            if peer not in self.crashed
            for key in node.virtual_keys()
        )

    def assert_level0_ring(self) -> None:
        keys = self.all_keys()
        for index, key in enumerate(keys):
            expected_left = keys[index - 1] if index > 0 else None
            expected_right = keys[index + 1] if index + 1 < len(keys) else None
            assert self.nodes[key[2]].level0_neighbors(key) == (expected_left, expected_right), key

    def publish(self, peer: int, topic: str, publication_id: int) -> list[tuple[int, Deliver]]:
        before = len(self.delivered)
        self.event(peer, Publish(topic, f"payload-{publication_id}".encode(), publication_id))
        self.drain()
        return [item for item in self.delivered[before:] if item[1].publication_id == publication_id]


def small_config(**overrides: Any) -> OverlayConfig:
    values: dict[str, Any] = {"table_size": 10, "anchor_enabled": False}
    values.update(overrides)
    return OverlayConfig(**values)


def joined(cluster: Cluster, plan: list[tuple[int, str, Role]], settle_s: float = 40.0) -> None:
    for peer, topic, role in plan:
        cluster.event(peer, JoinTopic(topic, role))
        cluster.drain()
    cluster.advance(settle_s)
