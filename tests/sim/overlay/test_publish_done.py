"""End-to-end publish completion (``publish_done_enabled``): DONE per PUB delegation and one
``PublishDone`` per ``Publish`` (docs/overlay.md §5 "End-to-end completion"; seed 003 §3.5.4 PUB).

Scripted with the hand-stepped ``Cluster`` of test_node_scripted.py (one-hop, multi-hop with a
small L, local virtual nodes, a delegate crashing after its ACK, no subscribers, publish during
the publisher's join), plus a seeded simulation under loss and crashes checked by
``PublishDoneChecker``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from overlay import messages as m
from overlay.api import (
    Deliver,
    JoinTopic,
    LeaveTopic,
    PeerUnreachable,
    Publish,
    PublishDone,
    Receive,
    Role,
    Send,
    Tick,
)
from overlay.config import OverlayConfig
from overlay.node import OverlayNode
from overlay.sim.checkers import DeliveryChecker, PublishDoneChecker, check_level0_ring
from overlay.sim.engine import NetworkConfig, Simulator
from tests.support.overlay_harness import PUB_ROLE, SUB_ROLE, Cluster, joined, small_config


def done_config(**overrides: Any) -> OverlayConfig:
    return small_config(publish_done_enabled=True, **overrides)


def outcomes(cluster: Cluster, publication_id: int) -> list[tuple[int, bool]]:
    return [(peer, d.complete) for peer, d in cluster.done if d.publication_id == publication_id]


def delivered_before_done(cluster: Cluster, publication_id: int) -> set[int]:
    """Peers that emitted a Deliver of ``publication_id`` before its PublishDone (action order)."""
    peers: set[int] = set()
    for peer, action in cluster.log:
        if isinstance(action, PublishDone) and action.publication_id == publication_id:
            return peers
        if isinstance(action, Deliver) and action.publication_id == publication_id:
            peers.add(peer)
    raise AssertionError(f"no PublishDone for publication {publication_id}")


def reached(cluster: Cluster, publication_id: int) -> list[bool]:
    """``PublishDone.reached`` of every PublishDone of ``publication_id`` so far."""
    return [done.reached for _peer, done in cluster.done if done.publication_id == publication_id]


def test_one_hop_publish_completes_after_every_subscriber_delivered() -> None:
    cluster = Cluster(4, done_config())
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE), (1, "t", SUB_ROLE), (2, "t", SUB_ROLE), (3, "t", SUB_ROLE)])
    cluster.event(0, Publish("t", b"x", 1))
    pubs = cluster.pending("PUB")
    assert len(pubs) == 3 and all(send.message.ack_id for _, send in pubs)
    # every subscriber answers ACK then (after its Deliver, in the same action list) DONE
    for item in pubs:
        actions = cluster.deliver(item)
        kinds = [a.message.kind if isinstance(a, Send) else type(a).__name__ for a in actions]
        assert kinds.index("Deliver") < kinds.index("DONE"), kinds
        assert kinds.index("ACK") < kinds.index("Deliver"), kinds
    # the publisher is told only when the last DONE arrives
    dones = cluster.pending("DONE")
    assert sorted(send.message.ack_id for _, send in dones) == sorted(send.message.ack_id for _, send in pubs)
    for item in dones[:-1]:
        cluster.deliver(item)
        assert outcomes(cluster, 1) == []
    cluster.drain()
    assert outcomes(cluster, 1) == [(0, True)]
    assert reached(cluster, 1) == [True]  # it went to other peers
    assert delivered_before_done(cluster, 1) == {1, 2, 3}
    cluster.advance(10.0)  # the timeout passes: no second PublishDone
    assert outcomes(cluster, 1) == [(0, True)]


def test_multi_hop_with_a_local_subscriber_completes_once_the_whole_tree_is_done() -> None:
    cluster = Cluster(8, done_config(table_size=3))
    cluster.bootstrap_all()
    plan = [(0, "t", PUB_ROLE), (0, "t", SUB_ROLE)] + [(peer, "t", SUB_ROLE) for peer in range(1, 8)]
    joined(cluster, plan, settle_s=60.0)
    for publication_id in range(1, 4):
        start = len(cluster.trace)
        cluster.publish(0, "t", publication_id)
        assert outcomes(cluster, publication_id) == [(0, True)]
        assert delivered_before_done(cluster, publication_id) == set(range(8))
        got = [d for _, d in cluster.delivered if d.publication_id == publication_id]
        assert max(d.hops for d in got) > 1  # really multi-hop
        pubs = [msg for _, _, msg in cluster.trace[start:] if msg.kind == "PUB"]
        dones = [msg for _, _, msg in cluster.trace[start:] if msg.kind == "DONE"]
        assert sorted(msg.ack_id for msg in dones) == sorted(msg.ack_id for msg in pubs)
    # the local delegations (e.g. publisher vnode -> subscriber vnode on peer 0) were tracked
    # and closed by local DONEs: no delegation is left open anywhere
    assert all(not node.done_slots for node in cluster.nodes.values())


def _publish_and_crash_a_forwarder_after_its_ack(cluster: Cluster) -> tuple[int, set[int]]:
    """Publish 1 at peer 0; the delegate with the most subscribers behind it acknowledges, emits
    its Deliver and crashes before anything else it sent leaves. Returns (victim, its range's
    other subscribers)."""
    cluster.event(0, Publish("t", b"probe", 1))
    first_hop = [item for item in cluster.pending("PUB") if item[0] == 0]
    subs = range(1, 8)
    victim_item = max(
        first_hop, key=lambda it: sum(it[1].message.lo <= ("t", 1, p) < it[1].message.hi for p in subs)
    )
    victim_pub = victim_item[1].message
    victim = victim_pub.dest[2]
    behind = {p for p in subs if victim_pub.lo <= ("t", 1, p) < victim_pub.hi and p != victim}
    assert behind, "the victim must be a forwarder"
    cluster.deliver(victim_item)
    cluster.deliver_next(lambda src, send: src == victim and send.message.kind == "ACK")
    cluster.crashed.add(victim)
    cluster.in_flight = [item for item in cluster.in_flight if item[0] != victim]
    cluster.drain()
    return victim, behind


def test_forwarder_crashing_after_ack_times_out_to_incomplete() -> None:
    config = done_config(
        table_size=3, ping_interval_s=50.0, failure_timeout_s=150.0, publish_done_timeout_s=3.0
    )
    cluster = Cluster(8, config)
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE)] + [(peer, "t", SUB_ROLE) for peer in range(1, 8)], settle_s=60.0)
    _, behind = _publish_and_crash_a_forwarder_after_its_ack(cluster)
    got = {peer for peer, d in cluster.delivered if d.publication_id == 1}
    assert not behind & got  # the subscribers behind the victim never got it
    cluster.advance(2.5, step_s=0.25)
    assert outcomes(cluster, 1) == []  # the ACK came, so nothing is re-sent; DONE is awaited
    cluster.advance(1.0, step_s=0.25)
    assert outcomes(cluster, 1) == [(0, False)]
    cluster.advance(10.0)
    assert outcomes(cluster, 1) == [(0, False)]  # exactly once


def test_forwarder_crash_reported_by_the_transport_is_redelegated_then_vouched_after_probation() -> None:
    config = done_config(
        table_size=3,
        ping_interval_s=2.0,
        failure_timeout_s=6.0,
        pub_ack_timeout_s=0.5,
        publish_done_timeout_s=3.0,
    )
    cluster = Cluster(8, config)
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE)] + [(peer, "t", SUB_ROLE) for peer in range(1, 8)], settle_s=60.0)
    victim, behind = _publish_and_crash_a_forwarder_after_its_ack(cluster)
    assert outcomes(cluster, 1) == []
    # the connections to the victim break (the transport tells every peer); the publisher
    # re-delegates the victim's sub-range around it at once
    for peer in range(8):
        if peer != victim:
            cluster.event(peer, PeerUnreachable(victim))
    cluster.advance(1.0, step_s=0.25)
    assert behind <= {peer for peer, d in cluster.delivered if d.publication_id == 1}
    # but right after a crash nobody can vouch that no live node hides behind the lost one
    # (such nodes re-link only after their own failure detection): not complete
    cluster.advance(3.0, step_s=0.25)
    assert outcomes(cluster, 1) == [(0, False)]
    # after the probation (failure_timeout + ping_interval + link_retry = 9 s) it is vouched again
    cluster.advance(6.0, step_s=0.25)
    cluster.publish(0, "t", 2)
    assert outcomes(cluster, 2) == [(0, True)]
    assert delivered_before_done(cluster, 2) == set(range(1, 8)) - {victim}


def test_no_subscribers_completes_at_once_without_sending() -> None:
    cluster = Cluster(3, done_config())
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE), (1, "other", SUB_ROLE)])
    assert cluster.nodes[0].subscriber_presence("t") is False
    actions = cluster.event(0, Publish("t", b"nobody", 1))
    # complete, and reaching no other peer (SkipMQ's streams do not take it as delivered everywhere)
    assert actions == [PublishDone("t", 1, True, reached=False)]
    assert not cluster.in_flight


def test_publish_during_the_publisher_join_completes_after_the_join() -> None:
    cluster = Cluster(4, done_config(max_pending_publishes=2))
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", SUB_ROLE), (1, "t", SUB_ROLE), (2, "t", SUB_ROLE)])
    cluster.event(3, JoinTopic("t", PUB_ROLE))
    assert cluster.nodes[3].joining_keys() == [("t", 0, 3)]
    assert cluster.event(3, Publish("t", b"a", 1)) == []
    assert cluster.event(3, Publish("t", b"b", 2)) == []
    # the queue is full: refused at once, and said so
    assert cluster.event(3, Publish("t", b"c", 3)) == [PublishDone("t", 3, False)]
    cluster.drain()
    assert cluster.nodes[3].joining_keys() == []
    assert outcomes(cluster, 1) == [(3, True)] and outcomes(cluster, 2) == [(3, True)]
    assert delivered_before_done(cluster, 1) == {0, 1, 2} == delivered_before_done(cluster, 2)
    # a publisher that leaves before its join completes: its queued publishes are incomplete
    cluster.event(1, JoinTopic("t", PUB_ROLE))
    cluster.event(1, Publish("t", b"d", 4))
    cluster.event(1, LeaveTopic("t", PUB_ROLE))
    assert outcomes(cluster, 4) == [(1, False)]


def test_lost_done_is_recovered_by_resending_and_a_silent_tree_times_out() -> None:
    cluster = Cluster(3, done_config(publish_done_timeout_s=3.0))
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE), (1, "t", SUB_ROLE), (2, "t", SUB_ROLE)])
    cluster.event(0, Publish("t", b"x", 1))
    while not cluster.pending("DONE"):
        cluster.deliver(cluster.in_flight[0])
    lost = cluster.pending("DONE")[0]
    cluster.in_flight.remove(lost)
    cluster.drain()
    assert outcomes(cluster, 1) == []
    cluster.advance(1.5, step_s=0.25)  # after timeout / 3 the PUB goes once more, new ack id
    resent = [msg for _, dest, msg in cluster.trace if msg.kind == "PUB" and dest == lost[0]]
    assert len(resent) == 2 and resent[0].ack_id != resent[1].ack_id
    assert outcomes(cluster, 1) == [(0, True)]
    assert len([d for peer, d in cluster.delivered if d.publication_id == 1 and peer == lost[0]]) == 1
    # every DONE lost: incomplete when the timeout passes, and not before
    start = cluster.now
    cluster.event(0, Publish("t", b"x", 2))
    while cluster.now < start + 4.0:
        while cluster.in_flight:
            item = cluster.in_flight[0]
            if item[1].message.kind == "DONE":
                cluster.in_flight.remove(item)
            else:
                cluster.deliver(item)
        if cluster.now < start + 3.0:
            assert outcomes(cluster, 2) == []
        cluster.now += 0.25
        for peer, node in cluster.nodes.items():
            deadline = node.next_deadline()
            if deadline is not None and deadline <= cluster.now:
                cluster.event(peer, Tick())
    assert outcomes(cluster, 2) == [(0, False)]


def test_done_needs_per_hop_acks_and_a_positive_timeout() -> None:
    with pytest.raises(ValueError, match="pub_ack_enabled"):
        OverlayConfig(publish_done_enabled=True, pub_ack_enabled=False)
    with pytest.raises(ValueError, match="publish_done_timeout_s"):
        OverlayConfig(publish_done_enabled=True, publish_done_timeout_s=0.0)


def test_done_for_an_unknown_delegation_is_ignored() -> None:
    cluster = Cluster(2, done_config())
    cluster.bootstrap_all()
    assert cluster.event(0, Receive(1, m.DONE(987654))) == []


@pytest.mark.slow
def test_simulated_complete_publishes_were_delivered_everywhere_first() -> None:
    """40 peers, 5 % loss, jittered latency, crashes mid-stream: every Publish gets one
    PublishDone and each complete=True one follows a Deliver at every subscriber; most are
    complete before the crashes and again after the repair."""
    config = OverlayConfig(
        table_size=6,
        rexp_interval_s=10.0,
        ping_interval_s=2.0,
        failure_timeout_s=6.0,
        pub_ack_timeout_s=0.5,
        publish_done_enabled=True,
        publish_done_timeout_s=4.0,
    )
    seed = 11
    sim = Simulator(
        seed, NetworkConfig(base_latency_s=0.01, link_spread_s=0.02, jitter_s=0.005, loss_rate=0.05)
    )
    done_checker = PublishDoneChecker()
    # under 5 % loss a delegation can be given up (PUB and its retry lost) and its subscribers
    # missed: then the publisher hears complete=False. So deliveries are checked here only for
    # duplicates and strays; completeness is what PublishDoneChecker vouches for.
    delivery_checker = DeliveryChecker(settle_s=15.0, window_s=8.0)
    delivery_checker.lenient_between(0.0, float("inf"))
    sim.observers += [done_checker, delivery_checker]
    plan = random.Random(seed)
    peers = 40
    for peer in range(peers):
        sim.add_node(
            OverlayNode(peer, rng=sim.node_rng(peer), config=config), (0,) if peer else (), at=peer * 0.05
        )
    sim.run_for(5.0)
    sim.inject(0, JoinTopic("news", Role.PUBLISHER))
    subscribers = plan.sample(range(1, peers), 18)  # > L: multi-hop
    for peer in subscribers:
        sim.inject(peer, JoinTopic("news", Role.SUBSCRIBER), at=sim.now + plan.random() * 3.0)
    for peer in range(1, peers):
        sim.inject(peer, JoinTopic(f"noise/{peer % 4}", Role.SUBSCRIBER), at=sim.now + plan.random() * 3.0)
    sim.run_for(60.0)
    check_level0_ring(sim)
    publication = 0
    for _ in range(10):
        publication += 1
        sim.inject(0, Publish("news", b"x", publication))
        sim.run_for(0.5)
    crashed = plan.sample(subscribers, 3)
    for peer in crashed:
        sim.crash(peer)
    for _ in range(10):
        publication += 1
        sim.inject(0, Publish("news", b"x", publication))
        sim.run_for(0.5)
    sim.run_for(20.0)  # repair, and the probation of the crashed peers' neighbours, are over
    repaired_from = publication
    for _ in range(10):
        publication += 1
        sim.inject(0, Publish("news", b"x", publication))
        sim.run_for(0.5)
    sim.run_for(10.0)
    assert done_checker.check(sim, until_s=sim.now) == publication
    assert delivery_checker.check(sim) == publication
    assert done_checker.complete[True] + done_checker.complete[False] == publication
    outcome = {ident[1]: record.outcomes[0][1] for ident, record in done_checker.records.items()}
    before_crash = [outcome[i] for i in range(1, 11)]
    after_repair = [outcome[i] for i in range(repaired_from + 1, publication + 1)]
    assert sum(before_crash) >= 5 and sum(after_repair) >= 5, outcome  # seen: 8 and 8 of 10
    assert sim.stats.sent_by_kind["DONE"] > 0 and sim.stats.lost > 100


def test_a_done_or_ack_from_a_peer_the_delegation_did_not_go_to_is_ignored() -> None:
    """Ack ids are small counters: a member that guesses one must not complete (DONE) or settle
    (ACK) a delegation sent to another peer - a forged DONE would let the publisher's broker free
    its send log before the subscriber had the message (docs/security.md, trust boundary)."""
    cluster = Cluster(4, done_config())
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE), (1, "t", SUB_ROLE), (2, "t", SUB_ROLE)])
    cluster.event(0, Publish("t", b"x", 1))
    pubs = cluster.pending("PUB")
    assert len(pubs) == 2
    target = pubs[0][1]
    # peer 3 (no subscriber, not a destination) answers the delegation sent to peer 1 or 2
    cluster.event(0, Receive(3, m.ACK(target.message.ack_id)))
    assert target.message.ack_id in cluster.nodes[0].outstanding
    cluster.event(0, Receive(3, m.DONE(target.message.ack_id)))
    cluster.event(0, Receive(3, m.DONE(pubs[1][1].message.ack_id)))
    assert outcomes(cluster, 1) == []  # not completed by the forgeries
    cluster.drain()
    assert outcomes(cluster, 1) == [(0, True)]  # the real subscribers still complete it
