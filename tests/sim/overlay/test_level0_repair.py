"""Regression tests for level-0 repair under false crash suspicions and departed virtual nodes
(docs/overlay.md §5 "Crashes", §10 Known issues; seed 003 §3.5.3, §3.5.6).

* a live peer declared crashed (lost PINGs, or a wrong ``PeerUnreachable`` hint) gets its entries
  back as soon as it is heard again, so the level-0 list is exact at once instead of after the
  next periodic REXP (at 1,000 peers with 5 % loss such false suspicions happen every few seconds);
* hearsay about a departed virtual node (GONE / LEAVE / UNSUB) is ignored for
  ``dead_peer_memory_s``: two neighbours that both still listed it used to re-teach it to each
  other (NEW -> LINK -> GONE -> NEW ...), a storm of ~10^5 messages per second found in the
  60-peer churn simulation; a new incarnation of the same key (new membership vector) is learned.
"""

from __future__ import annotations

from overlay import messages as m
from overlay.api import LeaveTopic, PeerUnreachable, Receive
from tests.support.overlay_harness import PUB_ROLE, SUB_ROLE, Cluster, joined, small_config


def test_falsely_suspected_peer_is_restored_as_soon_as_it_answers() -> None:
    cluster = Cluster(5, small_config(rexp_interval_s=600.0, ping_interval_s=300.0, failure_timeout_s=900.0))
    cluster.bootstrap_all()
    joined(cluster, [(peer, "t", SUB_ROLE) for peer in range(5)] + [(0, "t", PUB_ROLE)])
    cluster.assert_level0_ring()
    before = {key: cluster.nodes[0].level0_neighbors(key) for key in cluster.nodes[0].virtual_keys()}
    assert any(("t", 1, 1) in pair for pair in before.values())
    actions = cluster.event(0, PeerUnreachable(1))  # wrong: peer 1 is alive
    after = {key: cluster.nodes[0].level0_neighbors(key) for key in cluster.nodes[0].virtual_keys()}
    assert after != before  # its entries were dropped ...
    pings = [a for a in actions if getattr(a, "dest", None) == 1 and a.message.kind == "PING"]
    assert pings  # ... and it is probed at once
    # only the probe and its answer get through (the neighbours' corrections are lost): the PONG
    # alone makes peer 0 forgive peer 1 and put its entries back; no time passes
    while cluster.in_flight:
        item = cluster.in_flight[0]
        if item[1].message.kind in ("PING", "PONG"):
            cluster.deliver(item)
        else:
            cluster.in_flight.remove(item)
    restored = {key: cluster.nodes[0].level0_neighbors(key) for key in cluster.nodes[0].virtual_keys()}
    assert restored == before
    cluster.assert_level0_ring()


def test_departed_virtual_node_is_not_relearned_from_hearsay_but_a_new_incarnation_is() -> None:
    cluster = Cluster(4, small_config())
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", SUB_ROLE), (1, "t", SUB_ROLE), (2, "t", SUB_ROLE), (3, "t", PUB_ROLE)])
    departed = ("t", 1, 1)
    old_mv = cluster.nodes[1].membership_vector(departed)
    cluster.event(1, LeaveTopic("t", SUB_ROLE))
    cluster.drain()
    receiver = ("t", 1, 0)
    assert departed not in cluster.nodes[0].table_entries(receiver)
    # a neighbour that missed the departure offers it again: ignored
    cluster.event(0, Receive(2, m.NEW(receiver, (departed, old_mv))))
    assert departed not in cluster.nodes[0].table_entries(receiver)
    # the key joins again (a new membership vector): learned
    cluster.event(0, Receive(2, m.NEW(receiver, (departed, old_mv ^ 1))))
    assert departed in cluster.nodes[0].table_entries(receiver)


def test_gone_key_offered_back_by_a_stale_neighbour_does_not_start_a_storm() -> None:
    cluster = Cluster(4, small_config(rexp_interval_s=600.0))
    cluster.bootstrap_all()
    joined(cluster, [(0, "t", SUB_ROLE), (1, "t", SUB_ROLE), (2, "t", SUB_ROLE), (3, "t", PUB_ROLE)])
    departed = ("t", 1, 1)
    mv = cluster.nodes[1].membership_vector(departed)
    cluster.event(1, LeaveTopic("t", SUB_ROLE))
    cluster.in_flight = [item for item in cluster.in_flight if item[0] != 1]  # LEAVE and UNSUB lost
    left, right = ("t", 1, 0), ("t", 1, 2)
    assert departed in cluster.nodes[0].table_entries(left)
    assert departed in cluster.nodes[2].table_entries(right)
    # the left neighbour finds out (GONE), the right one has not yet and keeps offering it
    start = len(cluster.trace)
    cluster.event(0, Receive(1, m.GONE(departed, None)))
    for _ in range(3):
        cluster.event(0, Receive(2, m.NEW(left, (departed, mv))))
    cluster.drain()
    assert departed not in cluster.nodes[0].table_entries(left)
    links = [msg for _, _, msg in cluster.trace[start:] if msg.kind == "LINK" and msg.dest == departed]
    assert links == []


def test_stale_entry_offered_as_a_correction_is_reported_back_and_dropped() -> None:
    """A peer whose table still holds a departed node (it was no neighbour, nobody told it) offers
    it as a level-0 correction; the asker, which knows it departed, answers GONE and the stale
    entry is dropped. Without the answer the asker ignored the offer on every retry while the
    live node behind it stayed hidden, and re-learned the departed node once its memory expired:
    the 60-peer churn test's level-0 check failed with ``eexp_split="whole"`` (docs/overlay.md §10)."""
    cluster = Cluster(5, small_config(rexp_interval_s=600.0))
    cluster.bootstrap_all()
    joined(cluster, [(peer, "t", SUB_ROLE) for peer in range(5)])
    departed, asker, stale = ("t", 1, 1), ("t", 1, 0), ("t", 1, 4)
    mv = cluster.nodes[1].membership_vector(departed)
    assert departed in cluster.nodes[4].table_entries(stale)
    cluster.event(1, LeaveTopic("t", SUB_ROLE))
    cluster.drain()
    assert departed in cluster.nodes[4].table_entries(stale)  # not a neighbour: never told
    assert departed not in cluster.nodes[0].table_entries(asker)
    actions = cluster.event(0, Receive(4, m.NEW(asker, (departed, mv))))
    gones = [a.message for a in actions if a.dest == 4 and a.message.kind == "GONE"]
    assert gones == [m.GONE(departed, None)]
    cluster.drain()
    assert departed not in cluster.nodes[4].table_entries(stale)
    assert departed not in cluster.nodes[0].table_entries(asker)
    cluster.assert_level0_ring()


def test_hearsay_gone_never_cuts_a_live_level0_link() -> None:
    """GONE from a peer other than the key's host may come from a mere suspicion (lost PINGs):
    a level-0 neighbour stays (our own PINGs decide), another entry is dropped without a
    tombstone, so the next offer of it is learned again."""
    cluster = Cluster(5, small_config(rexp_interval_s=600.0))
    cluster.bootstrap_all()
    joined(cluster, [(peer, "t", SUB_ROLE) for peer in range(5)])
    owner, neighbour, far = ("t", 1, 0), ("t", 1, 1), ("t", 1, 3)
    node = cluster.nodes[0]
    assert node.level0_neighbors(owner)[1] == neighbour and far in node.table_entries(owner)
    far_mv = cluster.nodes[3].membership_vector(far)
    cluster.event(0, Receive(4, m.GONE(neighbour, None)))
    cluster.event(0, Receive(4, m.GONE(far, None)))
    assert node.level0_neighbors(owner)[1] == neighbour
    assert far not in node.table_entries(owner)
    cluster.event(0, Receive(2, m.NEW(owner, (far, far_mv))))
    assert far in node.table_entries(owner)
    cluster.assert_level0_ring()
