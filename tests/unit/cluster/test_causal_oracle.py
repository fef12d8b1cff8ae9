"""The CO protocol core (``broker.cluster.causal``, seed 004) against an independent oracle.

The oracle is plain vector clocks (Mattern; seed 004 ref. 9), its own few lines, nothing of the
core: each application send increments its member's entry and stamps the message; a delivery
merges the stamp. A delivery of q at E_j is correct iff E_j already delivered exactly
``stamp[src] - 1`` messages of q's source (per-sender FIFO, no duplicate) and at least
``stamp[k]`` of every other member k (every message that happened before q, §2.2). At the end
every member delivered every message once (information preserving, §2.3).

The harness is a seeded discrete-event simulation: n = 3..6 members, random send times, per-link
random delay (so reordering), loss and duplication of every kind of message (data, idle ACK,
RET, retransmissions); ``tick`` at each member's ``next_deadline``. Cheap: < 2 s for all seeds.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import pytest

from broker.cluster.causal import Broadcast, CausalGroup, CoMessage, Deliver, Ret, SendTo


class CausalityViolation(AssertionError):
    pass


class VectorClockOracle:
    """Application-level causality: p -> q iff p's delivery (or send) at q's sender preceded q's send."""

    def __init__(self, members: list[str]) -> None:
        self.members = members
        self.clock = {member: dict.fromkeys(members, 0) for member in members}
        self.delivered = {member: dict.fromkeys(members, 0) for member in members}
        self.stamps: dict[str, tuple[str, dict[str, int]]] = {}  # message id -> (source, stamp)
        self.seen: dict[str, set[str]] = {member: set() for member in members}

    def sent(self, member: str, message_id: str) -> None:
        self.clock[member][member] += 1
        self.stamps[message_id] = (member, dict(self.clock[member]))

    def deliver(self, member: str, message_id: str) -> None:
        if message_id in self.seen[member]:
            raise CausalityViolation(f"{member} delivered {message_id} twice")
        source, stamp = self.stamps[message_id]
        done = self.delivered[member]
        if done[source] != stamp[source] - 1:
            raise CausalityViolation(f"{member}: {message_id} out of FIFO order ({done[source]} before)")
        for other, count in stamp.items():
            if other != source and done[other] < count:
                raise CausalityViolation(f"{member}: {message_id} before {count - done[other]} of {other}'s")
        self.seen[member].add(message_id)
        done[source] += 1
        if source != member:  # the own send already counted
            clock = self.clock[member]
            for other, count in stamp.items():
                clock[other] = max(clock[other], count)

    def missing(self) -> dict[str, set[str]]:
        everything = set(self.stamps)
        return {member: everything - seen for member, seen in self.seen.items() if everything - seen}


# ============================================================================ the oracle itself
def test_oracle_accepts_a_causal_order_and_rejects_the_violations() -> None:
    oracle = VectorClockOracle(["A", "B", "C"])
    oracle.sent("A", "p")
    oracle.deliver("A", "p")
    oracle.deliver("B", "p")
    oracle.sent("B", "q")  # p -> q
    oracle.deliver("B", "q")
    with pytest.raises(CausalityViolation, match="before 1 of A's"):
        oracle.deliver("C", "q")  # q before p at C
    oracle.deliver("C", "p")
    oracle.deliver("C", "q")
    with pytest.raises(CausalityViolation, match="twice"):
        oracle.deliver("C", "q")
    assert oracle.missing() == {"A": {"q"}}


def test_oracle_rejects_a_fifo_violation() -> None:
    oracle = VectorClockOracle(["A", "B"])
    oracle.sent("A", "a1")
    oracle.sent("A", "a2")
    with pytest.raises(CausalityViolation, match="FIFO"):
        oracle.deliver("B", "a2")


# ============================================================================ the harness
@dataclass
class Network:
    rng: random.Random
    loss: float
    duplication: float
    max_delay_s: float
    fifo_links: bool  # the seed's MC service keeps each sender's order (§2.3); False: reordering
    queue: list[tuple[float, int, str, CoMessage | Ret]] = field(default_factory=list)
    counter: int = 0
    carried: int = 0
    link_last: dict[tuple[str, str], float] = field(default_factory=dict)

    def send(self, destination: str, message: CoMessage | Ret, now: float) -> None:
        link = (message.src, destination)
        copies = 0 if self.rng.random() < self.loss else 1
        if self.rng.random() < self.duplication:
            copies += 1
        for _copy in range(copies):
            self.counter += 1
            self.carried += 1
            at = now + self.rng.uniform(0.001, self.max_delay_s)
            if self.fifo_links:
                at = self.link_last[link] = max(at, self.link_last.get(link, 0.0))
            heapq.heappush(self.queue, (at, self.counter, destination, message))


@dataclass
class Outcome:
    oracle: VectorClockOracle
    end_s: float
    carried: int
    entities: dict[str, CausalGroup]


def simulate(
    seed: int,
    *,
    members: int,
    messages_each: int,
    loss: float,
    duplication: float,
    fifo_links: bool = False,
    window: int = 4,
    horizon_s: float = 120.0,
) -> Outcome:
    rng = random.Random(seed)
    names = [f"b{index}" for index in range(members)]
    entities = {
        name: CausalGroup(name, names, window=window, retransmit_timeout_s=0.3, ack_delay_s=0.02)
        for name in names
    }
    oracle = VectorClockOracle(names)
    network = Network(rng, loss, duplication, max_delay_s=0.05, fifo_links=fifo_links)
    sends = sorted((rng.uniform(0.0, 2.0), name, index) for name in names for index in range(messages_each))
    now = 0.0

    def route(member: str, actions: list) -> None:  # type: ignore[type-arg]
        for action in actions:
            if isinstance(action, Broadcast):
                for other in names:
                    if other != member:
                        network.send(other, action.message, now)
            elif isinstance(action, SendTo):
                network.send(action.member, action.message, now)
            elif isinstance(action, Deliver):
                assert action.message.data is not None
                oracle.deliver(member, action.message.data.decode())

    while now < horizon_s:
        deadlines = [(entity.next_deadline(), name) for name, entity in entities.items()]
        timers = [(deadline, name) for deadline, name in deadlines if deadline is not None]
        candidates = []
        if sends:
            candidates.append(sends[0][0])
        if network.queue:
            candidates.append(network.queue[0][0])
        if timers:
            candidates.append(min(timers)[0])
        if not candidates:
            break
        now = max(now, min(candidates))
        if sends and sends[0][0] <= now:
            _at, name, index = sends.pop(0)
            message_id = f"{name}:{index}"
            oracle.sent(name, message_id)
            route(name, entities[name].send(message_id.encode(), now))
        elif network.queue and network.queue[0][0] <= now:
            _at, _counter, destination, message = heapq.heappop(network.queue)
            route(destination, entities[destination].receive(message, now))
        else:
            for deadline, name in timers:
                if deadline <= now:
                    route(name, entities[name].tick(now))
    return Outcome(oracle, now, network.carried, entities)


SCENARIOS = [
    # (seed, members, messages each, loss, duplication, FIFO links)
    *[(seed, 3 + seed % 4, 8, 0.0, 0.0, False) for seed in range(4)],
    *[(seed, 3 + seed % 4, 8, 0.1, 0.05, seed % 2 == 0) for seed in range(4, 16)],
    *[(seed, 3 + seed % 4, 6, 0.3, 0.1, seed % 2 == 0) for seed in range(16, 20)],
]


@pytest.mark.parametrize(("seed", "members", "messages_each", "loss", "duplication", "fifo"), SCENARIOS)
def test_random_runs_deliver_everything_once_in_causal_order(
    seed: int, members: int, messages_each: int, loss: float, duplication: float, fifo: bool
) -> None:
    outcome = simulate(
        seed,
        members=members,
        messages_each=messages_each,
        loss=loss,
        duplication=duplication,
        fifo_links=fifo,
    )
    assert outcome.oracle.missing() == {}, f"seed {seed}: not delivered after {outcome.end_s:.1f} s"
    for entity in outcome.entities.values():
        # quiet at the end: nothing queued or timed; at most trailing idle ACKs held (their
        # predecessors were lost and nobody needs them until the next message)
        assert entity.next_deadline() is None and entity.queued() == 0
        assert all(message.data is None for message in entity.held())


def test_harness_catches_a_core_that_delivers_out_of_causal_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break CPI (insert at the front of PRL): the oracle must notice on some seed."""
    from broker.cluster import causal

    def front(self: causal.CausalGroup, message: CoMessage) -> None:
        self._prl.appendleft(message)

    monkeypatch.setattr(causal.CausalGroup, "_cpi_insert", front)
    with pytest.raises(CausalityViolation):
        for seed in range(10):
            simulate(seed, members=4, messages_each=8, loss=0.1, duplication=0.0)


def test_without_loss_on_fifo_links_only_overtaking_across_links_asks_for_retransmission() -> None:
    """The seed's MC network keeps each sender's order, not the order between senders: a message
    of E_k acknowledging one of E_j still on its way meets failure condition (2) (a RET that a
    real loss would also need); failure condition (1) never holds, no probe, no sender timeout."""
    outcome = simulate(1, members=5, messages_each=10, loss=0.0, duplication=0.0, fifo_links=True)
    assert outcome.oracle.missing() == {}
    for entity in outcome.entities.values():
        stats = entity.stats
        assert stats.gaps_seen == 0 and stats.probes_sent == 0 and stats.delivered == 50
        assert stats.rets_sent <= stats.dependencies_missing
