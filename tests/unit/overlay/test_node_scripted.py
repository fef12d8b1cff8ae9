"""Scripted interaction tests of overlay.node.OverlayNode (etcd-raft style, seed 003 §3.5).

A tiny hand-stepped harness (``Cluster``) holds 2-8 physical nodes; the test decides which
in-flight message is delivered next and when virtual time advances, and asserts the message
traces the paper's join/leave/publish/receipt rules prescribe.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from overlay import messages as m
from overlay.api import (
    JoinTopic,
    LeaveTopic,
    PeerUnreachable,
    Publish,
    Receive,
    Send,
    Shutdown,
)
from overlay.config import OverlayConfig
from overlay.keys import common_prefix_length
from tests.support.overlay_harness import PUB_ROLE, SUB_ROLE, Cluster, joined, small_config

# ===================================================================== join (§3.5.2)


def test_joining_subscriber_sends_rexp_level0_to_both_level0_neighbours() -> None:
    cluster = Cluster(3, small_config())
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE), (2, "t", SUB_ROLE)], settle_s=1.0)
    cluster.event(1, JoinTopic("t", SUB_ROLE))
    # SEARCH goes to the contact, FOUND comes back; then the joiner's first messages
    cluster.deliver_next(lambda src, send: send.message.kind == "SEARCH")
    while not cluster.pending("FOUND"):
        cluster.deliver(cluster.in_flight[0])
    cluster.in_flight = [item for item in cluster.in_flight if item[1].message.kind == "FOUND"]
    actions = cluster.deliver_next(lambda src, send: send.message.kind == "FOUND")
    rexps = [a for a in actions if isinstance(a, Send) and a.message.kind == "REXP"]
    assert sorted((a.message.dest, a.message.level) for a in rexps) == [
        (("t", 0, 0), 0),
        (("t", 1, 2), 0),
    ]
    me = ("t", 1, 1)
    assert all(a.message.sender[0] == me and a.message.forwarder[0] == me for a in rexps)
    assert sorted(cluster.nodes[1].sticky_entries(me)) == [("t", 0, 0), ("t", 1, 2)]
    cluster.advance(5.0)
    cluster.assert_level0_ring()


def test_concurrent_joins_converge_to_a_sorted_level0_list() -> None:
    cluster = Cluster(8, small_config(table_size=6))
    cluster.bootstrap_all()
    for peer in range(8):  # every join starts before any finishes
        cluster.event(peer, JoinTopic("x", SUB_ROLE if peer % 2 else PUB_ROLE))
        cluster.event(peer, JoinTopic(f"y{peer % 3}", SUB_ROLE))
    cluster.advance(60.0)
    assert len(cluster.all_keys()) == 16
    cluster.assert_level0_ring()
    for node in cluster.nodes.values():
        for key in node.virtual_keys():
            assert len(node.table_entries(key)) <= 6
            assert set(node.sticky_entries(key)) <= set(node.table_entries(key))


# ===================================================================== receipt rules (§3.5.6)


def _ref(cluster: Cluster, key: tuple[Any, ...]) -> tuple[tuple[Any, ...], int]:
    return (key, cluster.nodes[key[2]].membership_vector(key))


def test_receiver_not_in_existing_entry_list_answers_new_and_learns_sender() -> None:
    cluster = Cluster(3, small_config())
    cluster.bootstrap_all()
    joined(cluster, [(0, "a", PUB_ROLE), (1, "b", PUB_ROLE)])
    stranger = (("c", 1, 2), 12345)
    receiver = ("a", 0, 0)
    absent = cluster.event(0, Receive(2, m.REXP(receiver, stranger, stranger, (), 3)))
    news = [a for a in absent if isinstance(a, Send) and a.message.kind == "NEW"]
    assert [(a.dest, a.message.dest, a.message.sender[0]) for a in news] == [(2, ("c", 1, 2), receiver)]
    assert ("c", 1, 2) in cluster.nodes[0].table_entries(receiver)  # sender learned
    listed = cluster.event(0, Receive(2, m.REXP(receiver, stranger, stranger, (receiver,), 3)))
    assert not [a for a in listed if isinstance(a, Send) and a.message.kind == "NEW"]


def test_rexp_level_increment_rule() -> None:
    cluster = Cluster(6, small_config(table_size=20))
    cluster.bootstrap_all()
    joined(cluster, [(peer, "t", SUB_ROLE) for peer in range(6)])
    keys = cluster.all_keys()
    sender_key = keys[0]
    sender = _ref(cluster, sender_key)
    bits = cluster.config.mv_bits
    for receiver_key in keys[1:]:
        node = cluster.nodes[receiver_key[2]]
        shared = common_prefix_length(node.membership_vector(receiver_key), sender[1], bits)
        actions = node.handle(Receive(0, m.REXP(receiver_key, sender, sender, tuple(keys), 0)), cluster.now)
        forwards = [a.message for a in actions if isinstance(a, Send) and a.message.kind == "REXP"]
        expected_level = max(0, shared)
        right = [
            e
            for e in node.table_entries(receiver_key)
            if e > receiver_key and node.entry_level(receiver_key, e) >= expected_level
        ]
        if right:
            assert [(f.dest, f.level) for f in forwards] == [(right[0], expected_level)]
            assert forwards[0].sender == sender and forwards[0].forwarder[0] == receiver_key
        else:
            assert forwards == []


def _eexp_receiver(**config: Any) -> tuple[Cluster, Any, Any]:
    cluster = Cluster(5, small_config(table_size=20, **config))
    cluster.bootstrap_all()
    joined(cluster, [(0, "a", PUB_ROLE)] + [(peer, "t", SUB_ROLE) for peer in range(1, 5)])
    receiver = cluster.all_keys()[1]
    return cluster, cluster.nodes[receiver[2]], receiver


def _sends(actions: list[Any], kind: str) -> list[Any]:
    return [a.message for a in actions if isinstance(a, Send) and a.message.kind == kind]


def test_eexp_receipt_follows_the_seed_decrement_and_forward_rule() -> None:
    """§3.5.6: NEW if absent from the existing list; decrement the count at every receipt; if it is
    still >= 1 forward it - to every delegate of the range multicast, each with the whole count."""
    cluster, node, receiver = _eexp_receiver(eexp_decrement="every", eexp_split="whole")
    origin = (("zz", 0, 0), 99)
    lo, hi = ("t", 1), ("t", 2)
    actions = node.handle(Receive(0, m.EEXP(receiver, origin, origin, (), 3, lo, hi, False)), cluster.now)
    forwarded = _sends(actions, "EEXP")
    assert len(forwarded) >= 2 and all(f.missing == 2 for f in forwarded)
    assert all(f.forwarder[0] == receiver and f.sender == origin for f in forwarded)
    assert len(_sends(actions, "NEW")) == 1
    # a receiver the origin already has answers no NEW and still spends one
    passed = node.handle(
        Receive(0, m.EEXP(receiver, origin, origin, (receiver,), 2, lo, hi, False)), cluster.now
    )
    assert not _sends(passed, "NEW")
    assert _sends(passed, "EEXP") and all(f.missing == 1 for f in _sends(passed, "EEXP"))
    # a count of one ends at this receiver, known or not
    ended = node.handle(
        Receive(0, m.EEXP(receiver, origin, origin, (receiver,), 1, lo, hi, False)), cluster.now
    )
    assert not [a for a in ended if isinstance(a, Send)]
    # a random walk spends one at every hop
    walked = node.handle(
        Receive(0, m.EEXP(receiver, origin, origin, (receiver,), 1, (), (), True)), cluster.now
    )
    assert not _sends(walked, "EEXP") and not _sends(walked, "NEW")


def test_eexp_default_supplied_decrement_with_the_whole_count_to_every_delegate() -> None:
    """The defaults, ``eexp_split="whole"``: only a receiver that supplies a new entry spends one;
    every delegate gets the rest (docs/overlay.md §5: single hop to 80 at L = 120)."""
    cluster, node, receiver = _eexp_receiver()
    origin = (("zz", 0, 0), 99)
    lo, hi = ("t", 1), ("t", 2)
    actions = node.handle(Receive(0, m.EEXP(receiver, origin, origin, (), 3, lo, hi, False)), cluster.now)
    forwarded = _sends(actions, "EEXP")
    assert len(forwarded) >= 2 and all(f.missing == 2 for f in forwarded)
    known = m.EEXP(receiver, origin, origin, (receiver,), 1, lo, hi, False)
    passed = node.handle(Receive(0, known), cluster.now)
    assert not _sends(passed, "NEW") and all(f.missing == 1 for f in _sends(passed, "EEXP"))
    assert _sends(passed, "EEXP")


def test_eexp_even_split_divides_the_count_among_the_delegates() -> None:
    """``eexp_split="even"`` (the default before 2026-11-25, docs/overlay.md §5): the count is spent
    only on new entries and divided among the delegates."""
    cluster, node, receiver = _eexp_receiver(eexp_split="even")
    origin = (("zz", 0, 0), 99)
    lo, hi = ("t", 1), ("t", 2)
    actions = node.handle(Receive(0, m.EEXP(receiver, origin, origin, (), 3, lo, hi, False)), cluster.now)
    assert sum(f.missing for f in _sends(actions, "EEXP")) == 2  # divided among the delegates
    assert _sends(actions, "NEW")
    known = m.EEXP(receiver, origin, origin, (receiver,), 1, lo, hi, False)
    passed = node.handle(Receive(0, known), cluster.now)
    assert not _sends(passed, "NEW")
    assert sum(f.missing for f in _sends(passed, "EEXP")) == 1  # nothing supplied: nothing spent
    last = node.handle(Receive(0, m.EEXP(receiver, origin, origin, (), 1, lo, hi, False)), cluster.now)
    assert [a.message.kind for a in last if isinstance(a, Send)] == ["NEW"]


@pytest.mark.parametrize("trigger", ["below_l", "sub_deficit"])
def test_eexp_at_publish_only_while_the_table_is_below_l(trigger: str) -> None:
    """§3.5.4: EEXP with a publish only while |E| < L; "sub_deficit" (not the seed's) also
    explores with a full table that holds fewer than L - |sticky| subscribers."""
    config = small_config(table_size=4, eexp_trigger=trigger, eexp_random_delay_s=1000.0)
    cluster = Cluster(9, config)  # peers 4 and 5 stay without virtual nodes
    cluster.bootstrap_all()
    plan = [(0, "t", PUB_ROLE)] + [(peer, "a", PUB_ROLE) for peer in (1, 2, 6, 7, 8)]
    plan += [(3, "t", SUB_ROLE)]
    joined(cluster, plan, settle_s=30.0)
    publisher = ("t", 0, 0)
    table = cluster.nodes[0].table_of(publisher)
    assert len(table) == 4 and 4 - table.sub_count - len(table.sticky_keys()) >= 1, table.keys
    actions = cluster.event(0, Publish("t", b"x", 1))
    eexps = [msg for msg in _sends(actions, "EEXP") if msg.sender[0] == publisher]
    assert bool(eexps) == (trigger == "sub_deficit")


def test_unsub_removes_the_sender_and_does_not_learn_it() -> None:
    cluster = Cluster(4, small_config())
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE), (1, "t", SUB_ROLE), (2, "t", SUB_ROLE), (3, "t", SUB_ROLE)])
    publisher = ("t", 0, 0)
    assert ("t", 1, 3) in cluster.nodes[0].table_entries(publisher)
    cluster.event(3, LeaveTopic("t", SUB_ROLE))
    unsubs = cluster.pending("UNSUB")
    assert unsubs and all(send.message.sender[0] == ("t", 1, 3) for _, send in unsubs)
    cluster.drain()
    assert ("t", 1, 3) not in cluster.nodes[0].table_entries(publisher)
    # an UNSUB from a node the receiver never knew is not learned either
    ghost = (("t", 1, 9), 77)
    cluster.event(0, Receive(3, m.UNSUB(publisher, ghost, ghost, "t", ("t", 0), ("t", 1), 0)))
    assert ("t", 1, 9) not in cluster.nodes[0].table_entries(publisher)
    cluster.advance(5.0)
    cluster.assert_level0_ring()


# ===================================================================== publish (§3.5.1, §3.5.4)


def test_topic_with_three_subscribers_reaches_all_in_one_hop() -> None:
    cluster = Cluster(6, small_config())
    cluster.bootstrap_all()
    plan = [(0, "t", PUB_ROLE), (1, "t", SUB_ROLE), (3, "t", SUB_ROLE), (5, "t", SUB_ROLE)]
    plan += [(peer, f"noise{peer}", SUB_ROLE) for peer in range(6)]
    joined(cluster, plan)
    got = cluster.publish(0, "t", 1)
    assert sorted(peer for peer, _ in got) == [1, 3, 5]
    assert {d.hops for _, d in got} == {1}
    assert all(d.payload == b"payload-1" and d.publisher == 0 and d.topic == "t" for _, d in got)
    pubs = [msg for _, _, msg in cluster.trace if msg.kind == "PUB" and msg.publication_id == 1]
    assert len(pubs) == 3 and all(msg.forwarder[0] == ("t", 0, 0) for msg in pubs)


def test_small_table_goes_multi_hop_and_each_subscriber_gets_each_publish_once() -> None:
    cluster = Cluster(8, small_config(table_size=3))
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE)] + [(peer, "t", SUB_ROLE) for peer in range(1, 8)], settle_s=60.0)
    for publication_id in range(1, 6):
        got = cluster.publish(0, "t", publication_id)
        assert sorted(peer for peer, _ in got) == list(range(1, 8))
        assert max(d.hops for _, d in got) > 1
    per_subscriber = Counter((peer, d.publication_id) for peer, d in cluster.delivered)
    assert set(per_subscriber.values()) == {1}
    for _peer, node in cluster.nodes.items():
        for key in node.virtual_keys():
            assert len(node.table_entries(key)) <= 3


def test_baseline_skip_graph_tables_hold_only_level_neighbours_and_deliver() -> None:
    cluster = Cluster(8, small_config(frt_enabled=False))
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE)] + [(peer, "t", SUB_ROLE) for peer in range(1, 8)], settle_s=60.0)
    cluster.assert_level0_ring()
    keys = cluster.all_keys()
    for key in keys:
        node = cluster.nodes[key[2]]
        entries = node.table_entries(key)
        for side in (1, -1):
            ordered = sorted((e for e in entries if (e > key) == (side > 0)), reverse=side < 0)
            levels = [node.entry_level(key, e) for e in ordered]
            assert levels == sorted(set(levels)), "a baseline entry is shadowed by a nearer one"
    got = cluster.publish(0, "t", 1)
    assert sorted(peer for peer, _ in got) == list(range(1, 8))
    assert not cluster.pending("EEXP")


def test_duplicate_pub_is_delivered_once() -> None:
    cluster = Cluster(3, small_config())
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE), (1, "t", SUB_ROLE)])
    got = cluster.publish(0, "t", 5)
    assert len(got) == 1
    pub = next(msg for _, _, msg in cluster.trace if msg.kind == "PUB" and msg.publication_id == 5)
    cluster.event(1, Receive(0, pub))  # retransmission of the same publication
    assert len([d for _, d in cluster.delivered if d.publication_id == 5]) == 1


# ===================================================================== rendezvous point (§3.2)


def test_rendezvous_point_reports_absence_after_last_unsub_and_publisher_goes_quiet() -> None:
    cluster = Cluster(4, small_config())
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE), (1, "t", PUB_ROLE), (2, "t", SUB_ROLE)])
    assert cluster.nodes[1].is_rendezvous(("t", 0, 1))
    assert cluster.nodes[0].subscriber_presence("t") is True
    assert cluster.nodes[1].subscriber_presence("t") is True
    cluster.presence.clear()
    cluster.event(2, LeaveTopic("t", SUB_ROLE))
    cluster.drain()
    assert sorted((peer, p.present) for peer, p in cluster.presence) == [(0, False), (1, False)]
    sent_before = len(cluster.trace)
    actions = cluster.event(0, Publish("t", b"nobody listens", 9))
    assert actions == [] and not cluster.in_flight
    assert len(cluster.trace) == sent_before
    # a subscriber returns: presence comes back
    cluster.presence.clear()
    cluster.event(3, JoinTopic("t", SUB_ROLE))
    cluster.advance(5.0)
    assert sorted((peer, p.present) for peer, p in cluster.presence) == [(0, True), (1, True)]
    assert [peer for peer, _ in cluster.publish(0, "t", 10)] == [3]


def test_bad_input_is_rejected_with_a_clear_error() -> None:
    cluster = Cluster(2, small_config(anchor_enabled=True))
    cluster.bootstrap_all()
    with pytest.raises(ValueError, match="JoinTopic"):
        cluster.event(1, Publish("never-joined", b"x", 1))
    with pytest.raises(ValueError, match="non-empty"):
        cluster.event(1, JoinTopic("", SUB_ROLE))
    with pytest.raises(ValueError, match="non-empty"):
        cluster.event(1, Publish("", b"x", 1))  # the anchor virtual node is not a publisher
    with pytest.raises(TypeError, match="overlay event"):
        cluster.event(1, "not an event")
    with pytest.raises(TypeError, match="overlay message"):
        cluster.event(1, Receive(0, "not a message"))
    with pytest.raises(ValueError, match="table_size"):
        OverlayConfig(table_size=1)


# ===================================================================== crash & leave


def test_crash_is_detected_level0_is_relinked_and_delivery_resumes() -> None:
    config = small_config(table_size=4, ping_interval_s=1.0, failure_timeout_s=3.0, pub_ack_timeout_s=0.5)
    cluster = Cluster(7, config)
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE)] + [(peer, "t", SUB_ROLE) for peer in range(1, 7)], settle_s=60.0)
    cluster.assert_level0_ring()
    cluster.crashed.add(3)  # silent: no UNSUB, no LEAVE
    cluster.in_flight = [item for item in cluster.in_flight if item[1].dest != 3]
    cluster.advance(10.0, step_s=0.25)
    cluster.assert_level0_ring()
    keys = cluster.all_keys()
    ring_neighbours_of_crashed = [keys[i] for i in range(len(keys)) if keys[i] > ("t", 1, 3)][:1]
    ring_neighbours_of_crashed += [key for key in keys if key < ("t", 1, 3)][-1:]
    for key in ring_neighbours_of_crashed:  # the detectors dropped every entry of the dead peer
        assert all(entry[2] != 3 for entry in cluster.nodes[key[2]].table_entries(key))
    cluster.publish(0, "t", 42)
    cluster.advance(3.0, step_s=0.25)
    got = [item for item in cluster.delivered if item[1].publication_id == 42]
    assert sorted(peer for peer, _ in got) == [1, 2, 4, 5, 6]


def test_pub_to_a_crashed_delegate_is_redelegated_after_ack_timeout() -> None:
    config = small_config(table_size=3, ping_interval_s=5.0, failure_timeout_s=30.0, pub_ack_timeout_s=0.5)
    cluster = Cluster(8, config)
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE)] + [(peer, "t", SUB_ROLE) for peer in range(1, 8)], settle_s=60.0)
    cluster.event(0, Publish("t", b"probe", 1))
    first_hop = [send.message for _, send in cluster.pending("PUB")]
    # the victim is a delegate whose sub-range holds other subscribers too
    victim_pub = max(first_hop, key=lambda msg: sum(msg.lo <= ("t", 1, p) < msg.hi for p in range(1, 8)))
    victim = victim_pub.dest[2]
    assert sum(victim_pub.lo <= ("t", 1, p) < victim_pub.hi for p in range(1, 8)) >= 2
    cluster.crashed.add(victim)  # crashes before detection by pings (30 s)
    cluster.drain()
    cluster.advance(2.0, step_s=0.25)
    got = {peer for peer, d in cluster.delivered if d.publication_id == 1}
    assert got == set(range(1, 8)) - {victim}


def test_graceful_leave_unlinks_and_shutdown_leaves_everything() -> None:
    cluster = Cluster(5, small_config())
    cluster.bootstrap_all()
    joined(cluster, [(peer, "t", SUB_ROLE) for peer in range(5)] + [(0, "t", PUB_ROLE)])
    cluster.event(2, LeaveTopic("t", SUB_ROLE))
    cluster.drain()
    cluster.assert_level0_ring()
    assert ("t", 1, 2) not in cluster.all_keys()
    cluster.event(4, Shutdown())
    cluster.drain()
    assert cluster.nodes[4].virtual_keys() == []
    cluster.assert_level0_ring()
    got = cluster.publish(0, "t", 3)
    assert sorted(peer for peer, _ in got) == [0, 1, 3]


def test_same_seed_gives_same_trace() -> None:
    def run() -> list[str]:
        cluster = Cluster(5, small_config(anchor_enabled=True), seed=3)
        cluster.bootstrap_all()
        joined(cluster, [(peer, "t", SUB_ROLE) for peer in range(1, 5)] + [(0, "t", PUB_ROLE)], settle_s=20.0)
        cluster.publish(0, "t", 1)
        return [f"{src}>{dest}:{msg!r}" for src, dest, msg in cluster.trace]

    assert run() == run()


# ===================================================================== timers (§3.5.2, §3.5.5)


def test_periodic_rexp_goes_to_both_level0_neighbours() -> None:
    config = small_config(rexp_interval_s=10.0)
    cluster = Cluster(3, config)
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE), (1, "t", SUB_ROLE), (2, "t", SUB_ROLE)], settle_s=12.0)
    middle = ("t", 1, 1)
    start = len(cluster.trace)
    cluster.advance(11.5)  # one more period (jitter +-10 %) for every virtual node
    direct = {
        msg.dest
        for _, _, msg in cluster.trace[start:]
        if msg.kind == "REXP" and msg.sender[0] == middle and msg.forwarder[0] == middle
    }
    assert direct == {("t", 0, 0), ("t", 1, 2)}
    assert all(
        msg.level == 0
        for _, _, msg in cluster.trace[start:]
        if msg.kind == "REXP" and msg.forwarder[0] == msg.sender[0]
    )


def test_join_sends_eexp_to_the_subscriber_range_after_the_delay() -> None:
    config = small_config(table_size=30, eexp_delay_s=2.0, eexp_random_delay_s=100.0)
    cluster = Cluster(5, config)
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE)] + [(peer, "t", SUB_ROLE) for peer in range(1, 4)], settle_s=1.0)
    cluster.event(4, JoinTopic("t", SUB_ROLE))
    cluster.drain()
    assert not [msg for src, _, msg in cluster.trace if msg.kind == "EEXP" and src == 4]
    cluster.advance(1.5)
    assert not [msg for src, _, msg in cluster.trace if msg.kind == "EEXP" and src == 4]
    cluster.advance(1.0)
    eexps = [msg for src, _, msg in cluster.trace if msg.kind == "EEXP" and msg.sender[0] == ("t", 1, 4)]
    assert eexps and all(not msg.random_walk for msg in eexps)
    assert all(msg.lo >= ("t", 1) and msg.hi <= ("t", 2) for msg in eexps)


def test_peer_unreachable_hint_removes_the_peer_at_once() -> None:
    cluster = Cluster(4, small_config())
    cluster.bootstrap_all()
    joined(cluster, [(peer, "t", SUB_ROLE) for peer in range(4)])
    cluster.crashed.add(2)
    for peer in (0, 1, 3):
        cluster.event(peer, PeerUnreachable(2))
    cluster.advance(2.0)
    cluster.assert_level0_ring()
    for peer in (0, 1, 3):
        assert all(entry[2] != 2 for entry in cluster.nodes[peer].table_entries(("t", 1, peer)))


def test_pub_to_a_departed_virtual_node_bounces_with_gone_and_is_redelegated() -> None:
    cluster = Cluster(7, small_config(table_size=3))
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", PUB_ROLE)] + [(peer, "t", SUB_ROLE) for peer in range(1, 7)], settle_s=60.0)
    holders = [
        peer
        for peer, node in cluster.nodes.items()
        for key in node.virtual_keys()
        if ("t", 1, 3) in node.table_entries(key)
    ]
    assert holders
    cluster.event(3, LeaveTopic("t", SUB_ROLE))
    cluster.in_flight = [item for item in cluster.in_flight if item[0] != 3]  # its goodbyes are lost
    for publication_id in (1, 2):
        got = cluster.publish(0, "t", publication_id)
        assert sorted(peer for peer, _ in got) == [1, 2, 4, 5, 6]
    assert any(msg.kind == "GONE" and msg.gone == ("t", 1, 3) for _, _, msg in cluster.trace)
    assert all(
        ("t", 1, 3) not in cluster.nodes[peer].table_entries(key)
        for peer in holders
        for key in cluster.nodes[peer].virtual_keys()
    )


def test_first_node_rejoining_after_shutdown_finds_the_overlay_again() -> None:
    cluster = Cluster(4, small_config(anchor_enabled=True))
    cluster.bootstrap_all()
    joined(cluster, [(peer, "t", SUB_ROLE) for peer in range(1, 4)] + [(0, "t", PUB_ROLE)])
    cluster.event(0, Shutdown())
    cluster.drain()
    assert cluster.nodes[0].virtual_keys() == []
    cluster.event(0, JoinTopic("t", PUB_ROLE))  # the seed has no contacts: it must not start a new graph
    cluster.advance(10.0)
    cluster.assert_level0_ring()
    assert sorted(peer for peer, _ in cluster.publish(0, "t", 1)) == [1, 2, 3]
