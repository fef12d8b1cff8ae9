"""Tests of the deterministic simulator (overlay/sim/engine.py) and its checkers (overlay/sim/checkers.py).

Uses a tiny stand-in pub/sub node defined here (full membership directory, direct one-hop
delivery) so the engine and checkers are exercised independently of the real overlay core; broken
variants of it prove that every checker can fail.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from overlay.api import (
    Action,
    Bootstrap,
    Deliver,
    Event,
    JoinTopic,
    LeaveTopic,
    PeerId,
    Publish,
    Receive,
    Role,
    Send,
    Shutdown,
    SubscriberPresence,
    Tick,
)
from overlay.sim.checkers import DeliveryChecker, InvariantViolation, check_level0_ring, check_tables
from overlay.sim.engine import NetworkConfig, SimulationError, Simulator, derive_seed

# ------------------------------------------------------------------ the stand-in node


@dataclass(frozen=True, slots=True)
class Hello:
    members: tuple[tuple[Any, ...], ...]
    reply: bool
    kind: str = "HELLO"


@dataclass(frozen=True, slots=True)
class Announce:
    key: tuple[Any, ...]
    present: bool
    kind: str = "ANNOUNCE"


@dataclass(frozen=True, slots=True)
class Gossip:
    sequence: int
    kind: str = "GOSSIP"


@dataclass(frozen=True, slots=True)
class Pub:
    topic: str
    publication_id: int
    publisher: PeerId
    kind: str = "PUB"


class StandInNode:
    """Directory-based pub/sub: everyone knows every (topic, role, peer) key; PUB goes direct."""

    def __init__(
        self,
        peer_id: int,
        rng: random.Random,
        *,
        gossip_interval_s: float = 0.5,
        drop_every: int = 0,
        duplicate: bool = False,
        ring_shift: bool = False,
        table_overflow: bool = False,
        ignore_presence: bool = False,
    ) -> None:
        self.peer_id = peer_id
        self.rng = rng
        self.config = SimpleNamespace(table_size=4, frt_enabled=True)
        self.peers: dict[PeerId, None] = {}
        self.members: set[tuple[Any, ...]] = set()
        self.own: set[tuple[Any, ...]] = set()
        self.gossip_interval_s = gossip_interval_s
        self.next_gossip_s: float | None = None
        self.sequence = 0
        self.received: list[tuple[PeerId, int]] = []
        self.presence: dict[str, bool] = {}
        self.drop_every = drop_every
        self.duplicate = duplicate
        self.ring_shift = ring_shift
        self.table_overflow = table_overflow
        self.ignore_presence = ignore_presence
        self.delivered = 0
        self.handled_at: list[tuple[str, float]] = []

    def handle(self, event: Event, now: float) -> list[Action]:
        self.handled_at.append((type(event).__name__, now))
        out: list[Action] = []
        if isinstance(event, Bootstrap):
            self.next_gossip_s = now + self.gossip_interval_s
            for contact in event.contacts:
                self.peers[contact] = None
                out.append(Send(contact, Hello(tuple(sorted(self.members)), reply=False)))
        elif isinstance(event, JoinTopic | LeaveTopic):
            key = (event.topic, int(event.role), self.peer_id)
            present = isinstance(event, JoinTopic)
            self._apply(key, present)
            for peer in self.peers:
                out.append(Send(peer, Announce(key, present)))
        elif isinstance(event, Shutdown):
            for key in sorted(self.own):
                self._apply(key, False)
                for peer in self.peers:
                    out.append(Send(peer, Announce(key, False)))
        elif isinstance(event, Publish):
            subscribers = sorted(k[2] for k in self.members if k[:2] == (event.topic, Role.SUBSCRIBER))
            present = bool(subscribers)
            if self.presence.get(event.topic) != present:
                self.presence[event.topic] = present
                out.append(SubscriberPresence(event.topic, present))
            if not present and self.ignore_presence and self.peers:
                subscribers = [next(iter(self.peers))]
            for peer in subscribers:
                message = Pub(event.topic, event.publication_id, self.peer_id)
                if peer == self.peer_id:
                    out.extend(self._on_pub(message))
                else:
                    out.append(Send(peer, message))
        elif isinstance(event, Receive):
            self.peers.setdefault(event.sender, None)
            message = event.message
            if isinstance(message, Hello):
                for key in message.members:
                    if key[2] != self.peer_id:  # a node is the authority on its own keys
                        self._apply(key, True)
                if not message.reply:
                    out.append(Send(event.sender, Hello(tuple(sorted(self.members)), reply=True)))
            elif isinstance(message, Announce):
                self._apply(message.key, message.present)
            elif isinstance(message, Gossip):
                self.received.append((event.sender, message.sequence))
            elif isinstance(message, Pub):
                out.extend(self._on_pub(message))
        elif isinstance(event, Tick):
            assert self.next_gossip_s is not None and now >= self.next_gossip_s, "ticked before its deadline"
            self.next_gossip_s = now + self.gossip_interval_s * (0.5 + self.rng.random())
            if self.peers:
                self.sequence += 1
                target = self.rng.choice(sorted(self.peers))
                out.append(Send(target, Gossip(self.sequence)))
        return out

    def _apply(self, key: tuple[Any, ...], present: bool) -> None:
        if present:
            self.members.add(key)
            if key[2] == self.peer_id:
                self.own.add(key)
        else:
            self.members.discard(key)
            self.own.discard(key)

    def _on_pub(self, message: Pub) -> list[Action]:
        key = (message.topic, int(Role.SUBSCRIBER), self.peer_id)
        if key not in self.own:
            return []
        self.delivered += 1
        if self.drop_every and self.delivered % self.drop_every == 0:
            return []
        deliver = Deliver(message.topic, b"", message.publication_id, message.publisher, 1)
        return [deliver, deliver] if self.duplicate else [deliver]

    def next_deadline(self) -> float | None:
        return self.next_gossip_s

    # inspection API (what the checkers use)
    def virtual_keys(self) -> list[tuple[Any, ...]]:
        return sorted(self.own)

    def level0_neighbors(self, key: tuple[Any, ...]) -> tuple[Any, Any]:
        ordered = sorted(self.members)
        index = ordered.index(key)
        if self.ring_shift:
            index += 1
        left = ordered[index - 1] if 0 < index <= len(ordered) else None
        right = ordered[index + 1] if index + 1 < len(ordered) else None
        return left, right

    def table_entries(self, key: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if self.table_overflow:
            return sorted(self.members - {key})
        return [k for k in self.level0_neighbors(key) if k is not None]

    def sticky_entries(self, key: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return [k for k in self.level0_neighbors(key) if k is not None]


def build(seed: int, count: int, network: NetworkConfig | None = None, **variant: Any) -> Simulator:
    sim = Simulator(seed, network, trace=True)
    for peer in range(count):
        contacts = tuple(range(peer))
        sim.add_node(StandInNode(peer, sim.node_rng(peer), **variant), contacts, at=peer * 0.01)
    sim.run_for(1.0)
    return sim


def gossip_workload(seed: int, network: NetworkConfig | None = None) -> Simulator:
    sim = build(seed, 8, network)
    for peer in range(8):
        sim.inject(peer, JoinTopic(f"t{peer % 3}", Role.SUBSCRIBER if peer % 2 else Role.PUBLISHER))
    sim.run_for(10.0)
    return sim


# ------------------------------------------------------------------ engine


def test_same_seed_same_trace_and_different_seeds_differ() -> None:
    network = NetworkConfig(link_spread_s=0.02, jitter_s=0.005, loss_rate=0.05, reorder_rate=0.2)
    first = gossip_workload(7, network)
    second = gossip_workload(7, network)
    other = gossip_workload(8, network)
    assert first.stats.handled_events > 100
    assert first.trace_digest() == second.trace_digest()
    assert first.stats.sent == second.stats.sent and first.stats.lost == second.stats.lost
    assert first.trace_digest() != other.trace_digest()


def test_derived_seeds_are_stable_and_distinct() -> None:
    assert derive_seed(1, "node", 5) == derive_seed(1, "node", 5)
    assert derive_seed(1, "node", 5) != derive_seed(1, "node", 6)
    assert derive_seed(1, "node", 5) != derive_seed(2, "node", 5)


def test_loss_is_applied_at_the_configured_rate() -> None:
    sim = gossip_workload(3, NetworkConfig(loss_rate=0.3))
    sim.run_for(60.0)
    assert sim.stats.sent > 500
    rate = sim.stats.lost / sim.stats.sent
    assert 0.2 < rate < 0.4, rate
    assert sim.stats.delivered + sim.stats.lost + sim.stats.to_dead_peer <= sim.stats.sent


def test_no_loss_delivers_everything_in_link_order() -> None:
    sim = gossip_workload(3, NetworkConfig(base_latency_s=0.01))
    assert sim.stats.lost == 0 and sim.stats.partitioned == 0
    for node in sim.nodes.values():
        assert isinstance(node, StandInNode)
        for sender in {s for s, _ in node.received}:
            sequences = [seq for s, seq in node.received if s == sender]
            assert sequences == sorted(sequences), "constant latency must keep per-link order"


def test_reordering_is_applied() -> None:
    sim = gossip_workload(3, NetworkConfig(reorder_rate=0.5, reorder_delay_s=2.0))
    assert sim.stats.reordered > 0
    out_of_order = 0
    for node in sim.nodes.values():
        assert isinstance(node, StandInNode)
        for sender in {s for s, _ in node.received}:
            sequences = [seq for s, seq in node.received if s == sender]
            out_of_order += sum(1 for a, b in itertools.pairwise(sequences) if b < a)
    assert out_of_order > 0


def test_partition_drops_cross_group_messages_until_healed() -> None:
    sim = build(5, 6)
    crossing: list[tuple[PeerId, PeerId]] = []
    left, right = {0, 1, 2}, {3, 4, 5}

    def observe(s: Simulator, peer: PeerId, event: Event, actions: list[Action]) -> None:
        if isinstance(event, Receive) and (peer in left) != (event.sender in left):
            crossing.append((event.sender, peer))

    sim.run_for(1.0)
    sim.observers.append(observe)
    sim.partition([left, right])
    sim.run_for(0.05)  # let messages sent before the partition land
    crossing.clear()
    sim.run_for(10.0)
    assert crossing == []
    assert sim.stats.partitioned > 0
    sim.heal()
    sim.run_for(10.0)
    assert crossing, "after healing, messages cross again"


def test_crash_stops_a_node_and_drops_its_incoming_messages() -> None:
    sim = build(5, 5)
    sim.run_for(2.0)
    victim = sim.nodes[2]
    assert isinstance(victim, StandInNode)
    sim.crash(2)
    handled_before = len(victim.handled_at)
    sim.run_for(10.0)
    assert len(victim.handled_at) == handled_before
    assert sim.stats.to_dead_peer > 0
    assert 2 not in sim.live_peers() and 2 in sim.crashed
    with pytest.raises(SimulationError, match="seed=5"):
        sim.inject(99, Tick())


def test_ticks_never_fire_before_the_deadline() -> None:
    sim = gossip_workload(11)
    for node in sim.nodes.values():
        assert isinstance(node, StandInNode)
        ticks = [t for name, t in node.handled_at if name == "Tick"]
        assert len(ticks) > 5  # the assertion inside handle() checks deadline <= now


def test_query_rates_report_every_kind() -> None:
    sim = gossip_workload(2)
    sim.reset_query_counts()
    sim.run_for(20.0)
    rates = sim.query_rates()
    assert set(rates) == {"GOSSIP"}  # HELLO/ANNOUNCE happened before the window
    gossip = rates["GOSSIP"]
    # one gossip per 0.5 s on average per node (interval jittered by 0.5..1.5)
    assert 1.0 < gossip["mean_per_node_per_s"] < 3.0
    assert gossip["max_per_node_per_s"] >= gossip["mean_per_node_per_s"]


def test_engine_errors_name_the_seed() -> None:
    sim = Simulator(1234)
    with pytest.raises(SimulationError, match="seed=1234"):
        sim.inject("nobody", Tick())
    with pytest.raises(ValueError, match="loss_rate"):
        NetworkConfig(loss_rate=1.5)
    sim.add_node(StandInNode(0, sim.node_rng(0)))
    with pytest.raises(SimulationError, match="already in use"):
        sim.add_node(StandInNode(0, sim.node_rng(0)))


# ------------------------------------------------------------------ checkers


def pubsub_run(seed: int, **variant: Any) -> tuple[Simulator, DeliveryChecker]:
    sim = build(seed, 10, **variant)
    checker = DeliveryChecker(settle_s=1.0, window_s=1.0)
    sim.observers.append(checker)
    sim.inject(0, JoinTopic("news", Role.PUBLISHER))
    for peer in range(1, 10, 2):
        sim.inject(peer, JoinTopic("news", Role.SUBSCRIBER))
    sim.run_for(2.0)
    for publication_id in range(1, 4):
        sim.inject(0, Publish("news", b"x", publication_id))
        sim.run_for(1.5)
    return sim, checker


def test_checkers_pass_on_a_correct_node() -> None:
    sim, checker = pubsub_run(1)
    assert checker.check(sim) == 3
    for record in checker.publishes.values():
        assert sorted(record.deliveries) == [1, 3, 5, 7, 9]
    assert check_level0_ring(sim) == 6
    assert check_tables(sim) == 2


def test_delivery_checker_catches_dropped_deliveries() -> None:
    sim, checker = pubsub_run(1, drop_every=2)
    with pytest.raises(InvariantViolation, match=r"missed .*seed=1"):
        checker.check(sim)


def test_delivery_checker_catches_duplicates() -> None:
    sim, checker = pubsub_run(1, duplicate=True)
    with pytest.raises(InvariantViolation, match="delivered 2 times"):
        checker.check(sim)


def test_delivery_checker_tolerates_churn_within_the_window_only() -> None:
    sim, checker = pubsub_run(4)
    checker.check(sim)
    sim.inject(3, LeaveTopic("news", Role.SUBSCRIBER))
    sim.run_for(2.0)
    sim.inject(0, Publish("news", b"x", 10))
    sim.run_for(2.0)
    checker.check(sim)  # 3 left before the publish: not expected, not delivered
    assert 3 not in checker.publishes[(0, 10)].deliveries
    assert 3 not in checker.expected_subscribers(sim, checker.publishes[(0, 10)])


def test_exhaust_check_catches_pub_after_absence() -> None:
    def run(**variant: Any) -> tuple[Simulator, DeliveryChecker]:
        sim = build(6, 4, **variant)
        checker = DeliveryChecker(settle_s=1.0, window_s=1.0)
        sim.observers.append(checker)
        sim.inject(0, JoinTopic("quiet", Role.PUBLISHER))
        sim.run_for(1.0)
        for publication_id in (1, 2):
            sim.inject(0, Publish("quiet", b"x", publication_id))
            sim.run_for(1.5)
        return sim, checker

    sim, checker = run()
    checker.check(sim)
    assert checker.presence[(0, "quiet")] is False and checker.suppressed_publishes == 1
    assert sim.stats.sent_by_kind["PUB"] == 0
    broken_sim, broken = run(ignore_presence=True)
    with pytest.raises(InvariantViolation, match="after SubscriberPresence"):
        broken.check(broken_sim)


def test_ring_checker_catches_wrong_level0_neighbours() -> None:
    sim, _ = pubsub_run(2, ring_shift=True)
    with pytest.raises(InvariantViolation, match="level-0"):
        check_level0_ring(sim)


def test_table_checker_catches_oversized_tables() -> None:
    sim, _ = pubsub_run(2, table_overflow=True)
    with pytest.raises(InvariantViolation, match="> L=4"):
        check_tables(sim)
