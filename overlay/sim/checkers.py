"""Invariant checkers run during simulations of the overlay (seed 003 §3.2-§3.5, design "Overlay").

Snapshot checks (call after the overlay has stabilised), using the core's read-only inspection
API (``virtual_keys``, ``level0_neighbors``, ``table_entries``, ``sticky_entries``, ``config``):

* ``check_level0_ring``: every live virtual node's level-0 neighbours are its predecessor and
  successor in the sorted order of all live virtual keys (Skip Graph level 0, §3.1). At the two
  ends either ``None`` (a list) or the wrap-around key (a ring) is accepted.
* ``check_tables``: a routing table never exceeds ``config.table_size`` (FRT entry filtering,
  §3.3; only when ``config.frt_enabled``), sticky entries are in the table, and the level-0
  neighbours are sticky (§3.4: "level-0 neighbours are sticky entries").

Running checks (``DeliveryChecker``, an engine observer):

* every publish reaches every subscriber that was stable around it exactly once, and nobody
  who never subscribed (§3.5.1 range multicast, design "each subscriber receiving a publish once");
* exhaust data (§3.2): once the rendezvous point's ``SubscriberPresence(False)`` reached a
  publisher, a ``Publish`` at that publisher sends no PUB for the topic until presence is True.

``PublishDoneChecker`` (an engine observer, for ``publish_done_enabled``): every ``Publish`` gets
exactly one ``PublishDone``, and one with ``complete=True`` comes after a ``Deliver`` at every
peer whose subscriber virtual node existed at the ``Publish`` and still exists.

Every violation raises ``InvariantViolation`` naming the seed, so the run can be replayed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from overlay.api import (
    Action,
    Deliver,
    Event,
    JoinTopic,
    LeaveTopic,
    PeerId,
    Publish,
    PublishDone,
    Role,
    Send,
    Shutdown,
    SubscriberPresence,
)
from overlay.sim.engine import SimulationError, Simulator

__all__ = [
    "DeliveryChecker",
    "InspectableOverlay",
    "InvariantViolation",
    "PublishDoneChecker",
    "PublishRecord",
    "check_level0_ring",
    "check_tables",
]


class InvariantViolation(SimulationError):
    """An overlay invariant does not hold (message lists the first violations and the seed)."""


class InspectableOverlay(Protocol):
    """The read-only inspection API the checkers need from ``overlay.node.OverlayNode``."""

    peer_id: PeerId
    config: Any  # has table_size: int and frt_enabled: bool

    def virtual_keys(self) -> Iterable[Any]: ...

    def level0_neighbors(self, key: Any) -> tuple[Any | None, Any | None]: ...

    def table_entries(self, key: Any) -> Iterable[Any]: ...

    def sticky_entries(self, key: Any) -> Iterable[Any]: ...


def _key_of(item: Any) -> Any:
    """Entries may be keys or objects carrying ``.key``; compare by key."""
    return getattr(item, "key", item)


def _raise_if(problems: list[str], sim: Simulator, what: str, limit: int = 10) -> None:
    if problems:
        shown = "; ".join(problems[:limit])
        more = f" (+{len(problems) - limit} more)" if len(problems) > limit else ""
        message = f"{what}: {len(problems)} violation(s): {shown}{more}"
        raise InvariantViolation(message, seed=sim.seed, now_s=sim.now)


def _inspectable_nodes(sim: Simulator) -> list[InspectableOverlay]:
    nodes: list[InspectableOverlay] = []
    for node in sim.nodes.values():
        if not hasattr(node, "virtual_keys"):
            raise InvariantViolation(
                f"node {node.peer_id!r} ({type(node).__name__}) has no inspection API (virtual_keys)",
                seed=sim.seed,
                now_s=sim.now,
            )
        nodes.append(node)  # type: ignore[arg-type]
    return nodes


def check_level0_ring(sim: Simulator) -> int:
    """Compare every live virtual node's level-0 neighbours with the sorted live keys.

    Returns the number of virtual nodes checked; raises ``InvariantViolation`` otherwise.
    """
    owner: dict[Any, PeerId] = {}
    problems: list[str] = []
    nodes = _inspectable_nodes(sim)
    for node in nodes:
        for key in node.virtual_keys():
            if key in owner:
                problems.append(f"key {key!r} held by both {owner[key]!r} and {node.peer_id!r}")
            owner[key] = node.peer_id
    ordered = sorted(owner)
    count = len(ordered)
    by_peer = {node.peer_id: node for node in nodes}
    for index, key in enumerate(ordered):
        left, right = by_peer[owner[key]].level0_neighbors(key)
        left_key = None if left is None else _key_of(left)
        right_key = None if right is None else _key_of(right)
        want_left = ordered[index - 1] if index > 0 else None
        want_right = ordered[index + 1] if index + 1 < count else None
        ok_left = left_key == want_left or (index == 0 and count > 1 and left_key == ordered[-1])
        ok_right = right_key == want_right or (index == count - 1 and count > 1 and right_key == ordered[0])
        if not ok_left:
            problems.append(f"{key!r}: level-0 left is {left_key!r}, expected {want_left!r}")
        if not ok_right:
            problems.append(f"{key!r}: level-0 right is {right_key!r}, expected {want_right!r}")
    _raise_if(problems, sim, "level-0 ring")
    return count


def check_tables(sim: Simulator) -> int:
    """Table size <= L (FRT only), sticky entries present, level-0 neighbours sticky.

    Returns the largest table size seen.
    """
    problems: list[str] = []
    largest = 0
    for node in _inspectable_nodes(sim):
        limit = node.config.table_size if getattr(node.config, "frt_enabled", True) else None
        for key in node.virtual_keys():
            entries = {_key_of(entry) for entry in node.table_entries(key)}
            sticky = {_key_of(entry) for entry in node.sticky_entries(key)}
            largest = max(largest, len(entries))
            if limit is not None and len(entries) > limit:
                problems.append(f"{key!r}: table has {len(entries)} entries > L={limit}")
            missing = sticky - entries
            if missing:
                problems.append(f"{key!r}: sticky entries not in table: {sorted(missing, key=repr)[:3]!r}")
            for neighbour in node.level0_neighbors(key):
                if neighbour is not None and _key_of(neighbour) not in sticky:
                    problems.append(f"{key!r}: level-0 neighbour {_key_of(neighbour)!r} is not sticky")
    _raise_if(problems, sim, "routing tables")
    return largest


@dataclass(slots=True)
class PublishRecord:
    """One injected publish and the deliveries it produced."""

    publisher: PeerId
    topic: str
    publication_id: int
    time_s: float
    deliveries: dict[PeerId, list[int]] = field(default_factory=dict)  # peer -> hops of each delivery


class DeliveryChecker:
    """Engine observer checking exactly-once delivery and the exhaust-data rule.

        A subscriber is *expected* for a publish at time t when it subscribed at or before
        ``t - settle_s``, stayed subscribed and alive until ``t + window_s``. Deliveries to peers that
        never subscribed to the topic, and any duplicate, are violations; a subscriber that joined or
        left within the window may or may not receive it. ``check(sim)`` verifies every publish whose
        window has passed. ``strict_presence`` enables the exhaust-data check. ``lenient_between`` marks
    periods (churn) whose publishes are only checked for duplicates and strays.
    """

    def __init__(self, *, settle_s: float = 5.0, window_s: float = 5.0, strict_presence: bool = True) -> None:
        self.settle_s = settle_s
        self.window_s = window_s
        self.strict_presence = strict_presence
        self.publishes: dict[tuple[PeerId, int], PublishRecord] = {}
        self.history: dict[tuple[PeerId, str], list[tuple[float, bool]]] = defaultdict(list)
        self.presence: dict[tuple[PeerId, str], bool] = {}
        self.violations: list[str] = []
        self.checked: set[tuple[PeerId, int]] = set()
        self.suppressed_publishes = 0
        self.presence_changes = 0
        self.lenient_periods: list[tuple[float, float]] = []
        self.lenient_checked = 0

    def lenient_between(self, start_s: float, end_s: float) -> None:
        """Publishes injected within [start_s, end_s] (e.g. while crashed forwarders are not yet
        detected) are checked only for duplicates and deliveries to non-subscribers."""
        self.lenient_periods.append((start_s, end_s))

    # the engine calls this after every handled event
    def __call__(self, sim: Simulator, peer: PeerId, event: Event, actions: list[Action]) -> None:
        now = sim.now
        if isinstance(event, JoinTopic) and event.role == Role.SUBSCRIBER:
            self.history[(peer, event.topic)].append((now, True))
        elif isinstance(event, LeaveTopic) and event.role == Role.SUBSCRIBER:
            self.history[(peer, event.topic)].append((now, False))
        elif isinstance(event, Shutdown):
            for (subscriber, _topic), changes in self.history.items():
                if subscriber == peer and changes and changes[-1][1]:
                    changes.append((now, False))
        elif isinstance(event, Publish):
            record = PublishRecord(peer, event.topic, event.publication_id, now)
            self.publishes[(peer, event.publication_id)] = record
            if self.strict_presence and self.presence.get((peer, event.topic)) is False:
                self.suppressed_publishes += 1
                for action in actions:
                    if isinstance(action, Send) and getattr(action.message, "kind", None) == "PUB":
                        self.violations.append(
                            f"publisher {peer!r} sent PUB for {event.topic!r} after SubscriberPresence(False)"
                        )
                        break
        for action in actions:
            if isinstance(action, Deliver):
                found = self.publishes.get((action.publisher, action.publication_id))
                if found is None:
                    self.violations.append(
                        f"{peer!r} delivered unknown publication {action.publication_id} "
                        f"of {action.publisher!r}"
                    )
                    continue
                if action.topic != found.topic:
                    self.violations.append(
                        f"{peer!r} delivered {found.topic!r} publication as {action.topic!r}"
                    )
                found.deliveries.setdefault(peer, []).append(action.hops)
            elif isinstance(action, SubscriberPresence):
                self.presence[(peer, action.topic)] = action.present
                self.presence_changes += 1

    def _subscribed_throughout(self, peer: PeerId, topic: str, start_s: float, end_s: float) -> bool:
        state = False
        for time_s, subscribed in self.history.get((peer, topic), ()):
            if time_s <= start_s:
                state = subscribed
            elif time_s <= end_s:
                return False
            else:
                break
        return state

    def expected_subscribers(self, sim: Simulator, record: PublishRecord) -> set[PeerId]:
        """Peers that must receive ``record`` exactly once."""
        expected: set[PeerId] = set()
        for (peer, topic), _ in self.history.items():
            if topic != record.topic or peer in sim.crashed:
                continue
            start_s = record.time_s - self.settle_s
            if self._subscribed_throughout(peer, topic, start_s, record.time_s + self.window_s):
                expected.add(peer)
        return expected

    def check(self, sim: Simulator) -> int:
        """Verify every publish whose window has passed; returns how many were verified in total."""
        problems = list(self.violations)
        for ident, record in self.publishes.items():
            if ident in self.checked or sim.now < record.time_s + self.window_s:
                continue
            self.checked.add(ident)
            expected = self.expected_subscribers(sim, record)
            for peer, hops in record.deliveries.items():
                if len(hops) > 1:
                    problems.append(f"publication {ident!r} delivered {len(hops)} times at {peer!r}")
                if peer not in expected and (peer, record.topic) not in self.history:
                    problems.append(f"publication {ident!r} delivered at non-subscriber {peer!r}")
            if any(start <= record.time_s <= end for start, end in self.lenient_periods):
                self.lenient_checked += 1
                continue
            missing = expected - record.deliveries.keys()
            if missing:
                problems.append(
                    f"publication {ident!r} of {record.topic!r} missed {len(missing)}/{len(expected)} "
                    f"subscribers, e.g. {sorted(missing, key=repr)[:5]!r}"
                )
        _raise_if(problems, sim, "delivery")
        return len(self.checked)


@dataclass(slots=True)
class _DoneRecord:
    subscribers: frozenset[PeerId]  # peers with a subscriber virtual node at the Publish
    delivered: set[PeerId] = field(default_factory=set)
    outcomes: list[tuple[float, bool, frozenset[PeerId]]] = field(default_factory=list)


class PublishDoneChecker:
    """Engine observer for end-to-end publish completion (``OverlayConfig.publish_done_enabled``).

    ``check(sim, until_s)`` verifies, for every ``Publish`` injected before ``until_s``: exactly one
    ``PublishDone``; and when it says ``complete=True``, a ``Deliver`` of that publication was
    emitted earlier at every peer that held a subscriber virtual node of the topic when the
    ``Publish`` was handled and still held it (alive) at the ``PublishDone``. ``complete`` counts the
    outcomes (True, False) seen.
    """

    def __init__(self) -> None:
        self.records: dict[tuple[PeerId, int], _DoneRecord] = {}
        self.published_at: dict[tuple[PeerId, int], float] = {}
        self.violations: list[str] = []
        self.complete = {True: 0, False: 0}

    def __call__(self, sim: Simulator, peer: PeerId, event: Event, actions: list[Action]) -> None:
        if isinstance(event, Publish):
            subscribers = frozenset(
                node.peer_id
                for node in _inspectable_nodes(sim)
                if (event.topic, int(Role.SUBSCRIBER), node.peer_id) in node.virtual_keys()
            )
            ident = (peer, event.publication_id)
            if ident in self.records:
                self.violations.append(f"publication {ident!r} published twice (test setup error)")
            self.records[ident] = _DoneRecord(subscribers)
            self.published_at[ident] = sim.now
        for action in actions:
            if isinstance(action, Deliver):
                record = self.records.get((action.publisher, action.publication_id))
                if record is not None:
                    record.delivered.add(peer)
            elif isinstance(action, PublishDone):
                record = self.records.get((peer, action.publication_id))
                if record is None:
                    self.violations.append(f"{peer!r}: PublishDone for unknown publication {action!r}")
                    continue
                self.complete[action.complete] += 1
                record.outcomes.append((sim.now, action.complete, frozenset(record.delivered)))
                if action.complete:
                    key = (action.topic, int(Role.SUBSCRIBER))
                    alive = {
                        p
                        for p in record.subscribers
                        if p in sim.nodes and (*key, p) in sim.nodes[p].virtual_keys()  # type: ignore[attr-defined]
                    }
                    missed = alive - record.delivered
                    if missed:
                        self.violations.append(
                            f"publication {(peer, action.publication_id)!r} reported complete before "
                            f"a Deliver at {sorted(missed, key=repr)[:5]!r}"
                        )

    def check(self, sim: Simulator, until_s: float) -> int:
        """Verify every publish injected before ``until_s``; returns how many were verified."""
        problems = list(self.violations)
        verified = 0
        for ident, record in self.records.items():
            if self.published_at[ident] >= until_s:
                continue
            verified += 1
            if len(record.outcomes) != 1:
                problems.append(f"publication {ident!r} got {len(record.outcomes)} PublishDone actions")
        _raise_if(problems, sim, "publish completion")
        return verified
