"""Seeded whole-overlay simulations of the real ``OverlayNode`` (seed 003 §3-§4) with invariant checks.

* the paper's qualitative result at N = 1,000 physical nodes: one hop while the subscribers fit
  in L, multi-hop above, and shorter paths than SG-TBPS (the FRT-less baseline);
* the invariants (level-0 ring, table size <= L, sticky entries, exactly-once delivery, no PUB
  after SubscriberPresence(False)) on a smaller overlay under churn (joins, graceful leaves,
  crashes) and 5 % message loss with jittered latencies;
* whole-stack determinism (same seed, same trace).
"""

from __future__ import annotations

import random

import pytest

from overlay.api import JoinTopic, LeaveTopic, Publish, Role
from overlay.config import OverlayConfig
from overlay.node import OverlayNode
from overlay.sim.checkers import DeliveryChecker, check_level0_ring, check_tables
from overlay.sim.engine import NetworkConfig, Simulator
from overlay.sim.experiment import ExperimentConfig, run_series

# static experiment: no churn, so the periodic maintenance may be slow (see docs/overlay-reproduction.md)
QUIET_TIMERS = (("rexp_interval_s", 600.0), ("ping_interval_s", 300.0), ("failure_timeout_s", 900.0))


@pytest.mark.slow
@pytest.mark.timeout(180)  # ~17 s of CPU (2026-11-25): ~8x headroom over pytest's wall-clock 120 s
def test_one_hop_below_l_multi_hop_above_and_shorter_than_sgtbps() -> None:
    cfg = ExperimentConfig(nodes=1000, subscriber_counts=(10, 20, 160), overlay_options=QUIET_TIMERS)
    proposed = {s.subscribers: s for s in run_series("proposed", 60, 1, cfg).samples}
    sgtbps = {s.subscribers: s for s in run_series("sgtbps", None, 1, cfg).samples}
    for count in (10, 20, 160):
        assert proposed[count].delivered == count, f"proposed missed subscribers at {count} [seed=1]"
        assert sgtbps[count].delivered == count, f"SG-TBPS missed subscribers at {count} [seed=1]"
    assert proposed[10].avg_hops == 1.0 and proposed[10].max_hops == 1, proposed[10]
    assert proposed[160].avg_hops > 1.2 and proposed[160].max_hops >= 3, proposed[160]
    for count in (10, 20, 160):
        assert proposed[count].avg_hops < sgtbps[count].avg_hops, (count, proposed[count], sgtbps[count])
    assert sgtbps[160].avg_hops > sgtbps[10].avg_hops  # O(log M) growth of the baseline


CHURN_CONFIG = OverlayConfig(
    table_size=8,
    rexp_interval_s=10.0,
    ping_interval_s=2.0,
    failure_timeout_s=6.0,
    pub_ack_timeout_s=0.5,
)


def churn_simulation(
    seed: int, peers: int = 60, join_settle_s: float = 60.0
) -> tuple[Simulator, DeliveryChecker, int]:
    """Joins, then churn (crashes, leaves, newcomers) under 5 % loss, with the invariants checked.

    ``join_settle_s``: virtual time after the concurrent topic joins before the level-0 ring is
    checked. At 1,000 peers under 5 % loss the ring is exact soon after the joins; what remains
    are joins whose SEARCH (~20 hops) was lost and is retried only after ``search_timeout_s``,
    and live peers falsely declared crashed because PINGs were lost (their entries are restored
    as soon as they are heard again). 90 s (was 240 s) passed for seeds 42, 1 and 2
    (docs/overlay.md § Known issues).
    """
    network = NetworkConfig(base_latency_s=0.01, link_spread_s=0.02, jitter_s=0.005, loss_rate=0.05)
    sim = Simulator(seed, network)
    plan = random.Random(seed)
    checker = DeliveryChecker(settle_s=15.0, window_s=8.0)
    sim.observers.append(checker)
    for peer in range(peers):
        contacts = (0,) if peer else ()
        sim.add_node(OverlayNode(peer, rng=sim.node_rng(peer), config=CHURN_CONFIG), contacts, at=peer * 0.05)
    sim.run_for(5.0 + peers * 0.05)  # every peer has bootstrapped before the topics are joined
    topics = [f"room/{i}" for i in range(6)]
    for peer in range(peers):
        for topic in plan.sample(topics, 2):
            role = Role.PUBLISHER if plan.random() < 0.4 else Role.SUBSCRIBER
            sim.inject(peer, JoinTopic(topic, role), at=sim.now + plan.random() * 5.0)
    sim.inject(0, JoinTopic("news", Role.PUBLISHER))
    news_subscribers = plan.sample(range(1, peers), 20)  # 20 > L = 8: multi-hop delivery
    for peer in news_subscribers:
        sim.inject(peer, JoinTopic("news", Role.SUBSCRIBER), at=sim.now + plan.random() * 5.0)
    sim.run_for(join_settle_s)
    check_level0_ring(sim)
    check_tables(sim)
    publication = 0
    for _ in range(3):
        publication += 1
        sim.inject(0, Publish("news", b"x", publication))
        sim.run_for(2.0)

    # churn: crashes, graceful leaves, newcomers, subscriber changes
    crashed = plan.sample(range(1, peers), 6)
    for peer in crashed[:3]:
        sim.crash(peer)
    for peer in crashed[3:]:
        sim.leave(peer, drain_s=3.0)
    for peer in range(peers, peers + 6):
        sim.add_node(OverlayNode(peer, rng=sim.node_rng(peer), config=CHURN_CONFIG), (1, 2, 0))
        sim.inject(peer, JoinTopic("news", Role.SUBSCRIBER), at=sim.now + 1.0)
    for peer in news_subscribers[:4]:
        if peer not in crashed:
            sim.inject(peer, LeaveTopic("news", Role.SUBSCRIBER), at=sim.now + 0.5)
    # publishes while crashed forwarders are undetected: checked only for duplicates and strays
    checker.lenient_between(sim.now, sim.now + 8.0)
    for _ in range(4):
        publication += 1
        sim.inject(0, Publish("news", b"x", publication))
        sim.run_for(2.0)
    sim.run_for(60.0)  # failure detection and repair
    check_level0_ring(sim)
    check_tables(sim)
    for _ in range(3):
        publication += 1
        sim.inject(0, Publish("news", b"x", publication))
        sim.run_for(2.0)
    sim.run_for(10.0)

    # a topic whose last subscriber leaves: the publisher is told and stops forwarding
    sim.inject(5, JoinTopic("lonely", Role.PUBLISHER))
    sim.inject(7, JoinTopic("lonely", Role.SUBSCRIBER))
    sim.run_for(20.0)
    sim.inject(7, LeaveTopic("lonely", Role.SUBSCRIBER))
    sim.run_for(20.0)
    for _ in range(2):
        publication += 1
        sim.inject(5, Publish("lonely", b"x", publication))
        sim.run_for(2.0)
    sim.run_for(10.0)
    return sim, checker, publication


@pytest.mark.slow
def test_invariants_under_churn_and_five_percent_loss() -> None:
    sim, checker, publications = churn_simulation(42)
    assert checker.check(sim) == publications
    assert checker.lenient_checked == 4
    assert sim.stats.lost > 100  # the loss really happened
    presence = checker.presence.get((5, "lonely"))
    assert presence is False, "the rendezvous point never reported absence [seed=42]"
    assert checker.suppressed_publishes >= 2
    # the stable subscribers got every publish after the repair (checked exactly once above)
    last = checker.publishes[(0, 10)]
    assert len(last.deliveries) >= 16
    rates = sim.query_rates()
    for kind in ("REXP", "PUB", "NEW"):
        assert rates[kind]["total"] > 0, kind


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~35-44 s of CPU (2026-11-25): ~8x headroom over pytest's wall-clock 120 s
def test_invariants_under_churn_and_five_percent_loss_at_1000_peers() -> None:
    """The issue's CI-size run: N = 1,000 physical nodes, churn and 5 % loss, every invariant."""
    sim, checker, publications = churn_simulation(42, peers=1000, join_settle_s=90.0)
    assert len(sim.nodes) >= 1000
    assert checker.check(sim) == publications
    assert checker.lenient_checked == 4
    assert sim.stats.lost > 10_000  # the loss really happened
    assert checker.presence.get((5, "lonely")) is False
    assert checker.suppressed_publishes >= 2
    assert len(checker.publishes[(0, 10)].deliveries) >= 16


def test_whole_stack_is_deterministic() -> None:
    def trace(seed: int) -> str:
        sim = Simulator(seed, NetworkConfig(jitter_s=0.01, loss_rate=0.02), trace=True)
        for peer in range(20):
            sim.add_node(OverlayNode(peer, rng=sim.node_rng(peer), config=CHURN_CONFIG), (0,) if peer else ())
            role = Role.SUBSCRIBER if peer % 3 else Role.PUBLISHER
            sim.inject(peer, JoinTopic("t", role), at=1.0 + peer * 0.1)
        sim.run_for(20.0)
        sim.inject(0, Publish("t", b"x", 1))
        sim.run_for(5.0)
        return sim.trace_digest()

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)
