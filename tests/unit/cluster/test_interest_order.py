"""Announcements of interest are ordered (``(epoch, version)``; seed 50 of ``python -m simulation
--seed 50 --conversation --loss 0.05 --faults crash,partition``).

There, the empty whole list a broker announced when it came back reached a sender after the same
broker's later "I subscribe ``*0:``" and erased it: the sender stopped keeping what it published on
a class whose overlay route did not reach that broker (a partition), and PUBACKed messages were
lost. A receiver now applies only what is newer than what it applied, a whole list replaces only
older state, and the epoch is durable so a restarted announcer's versions beat its earlier ones.
"""

from __future__ import annotations

import random
from pathlib import Path

from broker.adapters.cluster_store import SqliteClusterStore
from broker.adapters.sqlite_store import Store
from broker.adapters.transport.wire import envelope_from_proto, envelope_to_proto
from broker.cluster.interest_table import InterestAnnouncer, InterestTable
from broker.cluster.messages import ClassInterest, Envelope
from broker.cluster.store_port import MemoryClusterStore

PEER = "b:1"


def _announcer(epoch: int = 1) -> InterestAnnouncer:
    announcer = InterestAnnouncer(retransmit_s=1.0)
    announcer.begin(epoch)
    return announcer


def test_a_stale_empty_whole_list_does_not_erase_a_later_subscription() -> None:
    announcer = _announcer()
    back = announcer.stamp(ClassInterest((), (), True))  # the broker comes back: nothing yet
    joined = announcer.stamp(ClassInterest(("*0:",)))  # then a client subscribes
    table = InterestTable()
    assert table.apply(PEER, joined) == (["*0:"], [])
    assert table.stale(PEER, back) is False  # older than the news of "*0:", but no whole list yet
    assert table.apply(PEER, back) == ([], [])  # overtaken: "*0:" stays
    assert table.peers_of("*0:") == {PEER}
    assert table.apply(PEER, back) == ([], [])  # and again (duplicated)
    assert table.peers_of("*0:") == {PEER}


def test_a_newer_whole_list_replaces_older_state_and_older_news_is_ignored() -> None:
    announcer = _announcer()
    joined_a = announcer.stamp(ClassInterest(("=a",)))
    joined_b = announcer.stamp(ClassInterest(("=b",)))
    full = announcer.stamp(ClassInterest(("=c",), (), True))
    table = InterestTable()
    table.apply(PEER, joined_a)
    assert table.apply(PEER, full) == (["=c"], ["=a"])
    assert table.stale(PEER, joined_b)
    assert table.apply(PEER, joined_b) == ([], [])  # older than the whole list: "=b" is not back
    assert table.classes_of(PEER) == {"=c"}


def test_reordered_join_and_leave_end_in_the_latest_state() -> None:
    announcer = _announcer()
    joined = announcer.stamp(ClassInterest(("=a",)))
    left = announcer.stamp(ClassInterest((), ("=a",)))
    table = InterestTable()
    assert table.apply(PEER, left) == ([], [])
    assert table.apply(PEER, joined) == ([], [])  # the join came late: the leave is newer
    assert table.peers_of("=a") == frozenset()


def test_the_repeated_whole_list_carries_the_classes_of_now() -> None:
    """The whole list, unanswered, is repeated with what is subscribed now (a change announced
    meanwhile included) under a new version, not as it was first sent."""
    announcer = _announcer()
    [(_peer, _ref, full)] = announcer.announce(ClassInterest((), (), True), [PEER], now=0.0)
    [(_peer, _ref, joined)] = announcer.announce(ClassInterest(("*0:",)), [PEER], now=0.1)
    assert announcer.pending(PEER, "*0:")
    [(_peer, _ref, again)] = announcer.tick(now=1.1)
    assert again.full and again.subscribed == ("*0:",)
    assert (again.epoch, again.version) > (joined.epoch, joined.version) > (full.epoch, full.version)
    table = InterestTable()
    for interest in (joined, again, full):  # whatever the order the network delivers them
        table.apply(PEER, interest)
    assert table.classes_of(PEER) == {"*0:"}


def test_a_restarted_announcer_beats_its_previous_epoch() -> None:
    store = MemoryClusterStore()
    epochs = []
    for _start in range(2):
        epoch = store.load_interest_epoch() + 1
        store.set_interest_epoch(epoch)
        epochs.append(epoch)
    before = _announcer(epochs[0])
    before.stamp(ClassInterest(("=x",)))
    before.stamp(ClassInterest(("=y",)))
    old_full = before.stamp(ClassInterest(("=x", "=y"), (), True))  # version 3 of epoch 1
    after = _announcer(epochs[1])
    new_full = after.stamp(ClassInterest((), (), True))  # version 1 of epoch 2
    table = InterestTable()
    table.apply(PEER, new_full)
    assert table.stale(PEER, old_full)
    assert table.apply(PEER, old_full) == ([], [])
    assert table.classes_of(PEER) == frozenset()


def test_any_order_and_duplication_of_every_announcement_ends_in_the_announcers_state() -> None:
    rng = random.Random(20261125)
    classes = [f"={n}" for n in range(6)]
    for _trial in range(300):
        announcer = _announcer(rng.randint(1, 3))
        subscribed: set[str] = set()
        sent = []
        for _step in range(rng.randint(1, 12)):
            if rng.random() < 0.2:
                subscribed = set(rng.sample(classes, rng.randint(0, 3)))
                interest = ClassInterest(tuple(sorted(subscribed)), (), True)
            else:
                cls = rng.choice(classes)
                interest = ClassInterest((), (cls,)) if cls in subscribed else ClassInterest((cls,))
                subscribed ^= {cls}
            [(_peer, _ref, stamped)] = announcer.announce(interest, [PEER], now=0.0)
            sent.append(stamped)
            if rng.random() < 0.3:
                sent += [again for _p, _r, again in announcer.tick(now=10.0 * (_step + 1))]
        delivered = sent + rng.sample(sent, rng.randint(0, len(sent)))  # duplicates
        rng.shuffle(delivered)
        table = InterestTable()
        for interest in delivered:
            table.apply(PEER, interest)
        assert table.classes_of(PEER) == subscribed, (sent, delivered)


def test_unordered_announcements_apply_as_they_come() -> None:
    table = InterestTable()
    table.apply(PEER, ClassInterest(("=a",)))
    assert table.apply(PEER, ClassInterest((), (), True)) == ([], ["=a"])


def test_the_version_crosses_the_wire() -> None:
    body = ClassInterest(("*0:",), ("=a",), True, epoch=7, version=2**40)
    envelope = Envelope("a:1", "b:1", "", "", 3, 4, body)
    assert envelope_from_proto(envelope_to_proto(envelope)).body == body
    old = Envelope("a:1", "b:1", "", "", 3, 4, ClassInterest(("*0:",)))  # a sender without versions
    assert envelope_from_proto(envelope_to_proto(old)).body == ClassInterest(("*0:",), (), False, 0, 0)


def test_the_sqlite_cluster_store_keeps_the_interest_epoch_across_a_crash(tmp_path: Path) -> None:
    path = str(tmp_path / "skipmq.db")
    store = Store(path)
    cluster_store = SqliteClusterStore(store)
    assert cluster_store.load_interest_epoch() == 0
    cluster_store.set_interest_epoch(1)
    store.abandon()  # kill -9 right after: the epoch was committed at once
    reopened = Store(path)
    try:
        assert SqliteClusterStore(reopened).load_interest_epoch() == 1
    finally:
        reopened.close()
