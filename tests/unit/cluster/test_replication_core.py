"""The pure core of replicated durability (``broker.cluster.replication``), scripted: brokers'
cores wired to one another by a hand-run mailbox, so that each step (an entry sent, lost, acked, a
broker down, a hello) is chosen by the test. Seed 004's stages: a holder's ack is acceptance, the
origin's ``Durable`` is pre-acknowledgement over the replica group, a release is acknowledgement."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker.cluster.replication import Replication
from broker.cluster.replication_messages import (
    Drop,
    Durable,
    Persist,
    ReplicaAppend,
    ReplicationAction,
    SendReplica,
    TakeOver,
)
from broker.core.messages import Message

A, B, C = "a:1", "b:1", "c:1"


def msg(n: int) -> Message:
    return Message(f"t/{n}", str(n).encode(), qos=1)


class Cluster:
    """Cores of brokers ``peers``; items in flight wait in ``mailbox`` until ``deliver``."""

    def __init__(self, peers: list[str], replicas: int = 2) -> None:
        self.peers = peers
        self.replicas = replicas
        self.now = 0.0
        self.cores: dict[str, Replication] = {}
        self.mailbox: list[tuple[str, SendReplica]] = []
        self.durable: dict[str, set[int]] = {p: set() for p in peers}
        self.disk: dict[str, list[ReplicationAction]] = {p: [] for p in peers}
        self.taken: dict[str, list[TakeOver]] = {p: [] for p in peers}
        self._incarnations: dict[str, int] = {}
        for peer in peers:
            self.boot(peer, started_empty=True)

    def boot(self, peer: str, *, started_empty: bool) -> Replication:
        number = self._incarnations.get(peer, 0) + 1
        self._incarnations[peer] = number
        core = Replication(
            peer,
            f"{peer}#{number}",
            replicas=self.replicas,
            retransmit_s=0.1,
            failover_after_s=5.0,
            retention_s=30.0,
            started_empty=started_empty,
        )
        self.cores[peer] = core
        self.mailbox = [(src, send) for src, send in self.mailbox if send.peer != peer and src != peer]
        self.apply(peer, core.start(self.peers, self.now))
        return core

    def apply(self, peer: str, actions: list[ReplicationAction]) -> None:
        for action in actions:
            if isinstance(action, SendReplica):
                self.mailbox.append((peer, action))
            elif isinstance(action, Durable):
                self.durable[peer].update(range(action.first_seq, action.end_seq))
            elif isinstance(action, TakeOver):
                self.taken[peer].append(action)
            else:
                self.disk[peer].append(action)

    def deliver(self, keep: Callable[[str, SendReplica], bool] = lambda src, send: True) -> int:
        """Deliver everything in flight (and what that sends) until quiet; ``keep`` False drops."""
        count = 0
        while self.mailbox:
            src, send = self.mailbox.pop(0)
            if not keep(src, send):
                continue
            count += 1
            self.apply(send.peer, self.cores[send.peer].on_item(src, send.item, self.now))
        return count

    def append(self, peer: str, n: int) -> int:
        seq, actions = self.cores[peer].append(msg(n), self.now)
        self.apply(peer, actions)
        return seq

    def tick(self, dt: float) -> None:
        self.now += dt
        for peer, core in self.cores.items():
            self.apply(peer, core.tick(self.now))


def test_one_replica_is_durable_at_once_and_sends_nothing() -> None:
    cluster = Cluster([A, B, C], replicas=1)
    cluster.deliver()
    assert cluster.append(A, 1) == 1
    assert cluster.durable[A] == {1}
    assert not cluster.mailbox


def test_holders_are_the_next_live_brokers_on_the_ring_of_peer_ids() -> None:
    cluster = Cluster([C, A, B], replicas=2)
    core = cluster.cores[A]
    assert core.holders_of(A) == []  # a member holds replicas once heard from (removed: never)
    cluster.deliver()
    assert core.holders_of(A) == [B]
    assert core.holders_of(C) == [A]  # the ring wraps
    core.on_peer_down(B, 0.0)
    assert core.holders_of(A) == [C]
    three = Cluster([A, B, C], replicas=3)
    three.deliver()
    assert three.cores[A].holders_of(B) == [C, A]


def test_an_entry_is_durable_only_once_its_holder_committed_it() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()  # the hellos
    cluster.append(A, 1)
    assert cluster.durable[A] == set()  # not before the holder's acceptance
    ((_src, send),) = cluster.mailbox
    assert send.peer == B and isinstance(send.item, ReplicaAppend)
    cluster.deliver()
    assert cluster.durable[A] == {1}
    persisted = [a for a in cluster.disk[B] if isinstance(a, Persist)]
    assert persisted == [Persist((A, f"{A}#1"), 1, (msg(1),))]
    assert cluster.disk[C] == []  # not a holder of A


def test_a_lost_entry_is_sent_again_after_the_retransmit_period_and_a_gap_waits() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    cluster.append(A, 1)
    cluster.deliver(keep=lambda src, send: False)  # entry 1 lost
    cluster.append(A, 2)
    cluster.deliver()  # entry 2 alone: a gap at the holder, nothing accepted
    assert cluster.durable[A] == set()
    assert not [a for a in cluster.disk[B] if isinstance(a, Persist)]
    cluster.tick(0.05)
    cluster.deliver()
    assert cluster.durable[A] == set()  # within the retransmit period
    cluster.tick(0.1)
    cluster.deliver()
    assert cluster.durable[A] == {1, 2}


def test_a_holder_down_is_replaced_by_the_next_and_gets_every_unreleased_entry() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    for n in (1, 2, 3):
        cluster.append(A, n)
    cluster.deliver()
    assert cluster.durable[A] == {1, 2, 3}
    cluster.append(A, 4)
    cluster.mailbox.clear()  # B dies with entry 4 on the way
    cluster.apply(A, cluster.cores[A].on_peer_down(B, cluster.now))
    cluster.deliver()
    assert cluster.durable[A] == {1, 2, 3, 4}  # C's acceptance
    persisted = [a for a in cluster.disk[C] if isinstance(a, Persist)]
    assert [m for a in persisted for m in a.messages] == [msg(1), msg(2), msg(3), msg(4)]


def test_fewer_live_brokers_than_n_acknowledge_nothing() -> None:
    cluster = Cluster([A, B], replicas=2)
    cluster.deliver()
    cluster.apply(A, cluster.cores[A].on_peer_down(B, 0.0))
    cluster.append(A, 1)
    cluster.deliver()
    assert cluster.durable[A] == set()
    assert cluster.cores[A].under_replicated() == 1


def test_origin_back_with_its_disk_lost_its_holder_takes_over_in_order() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    for n in (1, 2, 3, 4):
        cluster.append(A, n)
    cluster.deliver()
    cluster.apply(A, cluster.cores[A].released(2, cluster.now))  # entry 1 taken by every receiver
    cluster.deliver()
    assert Drop((A, f"{A}#1"), 2) in cluster.disk[B]
    cluster.boot(A, started_empty=True)  # kill -9, data directory deleted, started again
    cluster.deliver()
    (takeover,) = cluster.taken[B]
    assert takeover.key == (A, f"{A}#1")
    assert takeover.messages == (msg(2), msg(3), msg(4))
    assert cluster.taken[C] == []
    assert cluster.cores[B].taken_over(takeover.key) == [Drop(takeover.key, None)]
    assert cluster.cores[B].held_count() == 0


def test_origin_back_with_its_disk_is_not_taken_over_and_its_old_log_expires() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    cluster.append(A, 1)
    cluster.deliver()
    cluster.boot(A, started_empty=False)
    cluster.deliver()
    assert cluster.taken[B] == []
    cluster.tick(29.0)
    assert Drop((A, f"{A}#1"), None) not in cluster.disk[B]
    cluster.tick(2.0)
    assert Drop((A, f"{A}#1"), None) in cluster.disk[B]


def test_origin_down_for_good_is_taken_over_after_the_failover_time() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    cluster.append(A, 1)
    cluster.append(A, 2)
    cluster.deliver()
    cluster.apply(B, cluster.cores[B].on_peer_down(A, cluster.now))
    cluster.tick(4.9)
    assert cluster.taken[B] == []
    cluster.tick(0.2)
    (takeover,) = cluster.taken[B]
    assert takeover.messages == (msg(1), msg(2))
    cluster.tick(1.0)
    assert len(cluster.taken[B]) == 1  # once


def test_a_holder_back_with_its_disk_lost_gets_the_entries_again() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    cluster.append(A, 1)
    cluster.deliver()
    cluster.disk[B].clear()
    cluster.boot(B, started_empty=True)
    cluster.deliver()
    persisted = [a for a in cluster.disk[B] if isinstance(a, Persist)]
    assert [m for a in persisted for m in a.messages] == [msg(1)]


def test_replicas_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="replicas"):
        Replication(A, "x", replicas=0, retransmit_s=1, failover_after_s=1, retention_s=1, started_empty=True)


def test_a_restarted_holder_takes_over_a_restored_log_whose_origin_never_answers() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    cluster.append(A, 1)
    cluster.deliver()
    key = (A, f"{A}#1")
    # A is removed for good while B is down; B starts again on its disk and restores what it held
    restarted = Replication(
        B, "b#2", replicas=2, retransmit_s=0.1, failover_after_s=5.0, retention_s=30.0, started_empty=False
    )
    restarted.restore_held(key, 1, [msg(1)])
    restarted.start([A, B, C], 0.0)
    assert [a for a in restarted.tick(4.9) if isinstance(a, TakeOver)] == []
    (takeover,) = [a for a in restarted.tick(5.1) if isinstance(a, TakeOver)]
    assert takeover == TakeOver(key, 1, (msg(1),))


def test_a_lost_hello_is_sent_again_so_two_brokers_do_not_wait_for_each_other() -> None:
    cluster = Cluster([A, B])
    cluster.deliver(keep=lambda src, send: False)  # every hello lost (seed 206 of the sweep)
    cluster.append(A, 1)
    cluster.deliver()
    assert cluster.durable[A] == set()  # A has heard from no holder
    cluster.tick(0.05)
    cluster.deliver()
    assert cluster.durable[A] == set()  # within the retransmit period
    cluster.tick(0.1)
    cluster.deliver()
    assert cluster.durable[A] == {1}


def test_a_gap_is_filled_while_the_origin_keeps_appending_faster_than_the_retransmit_period() -> None:
    """Seed 536 of the every-fault sweep: new entries sent to a holder restarted the retransmission
    timer, so with a publish every 0.1 s (the sweep's retransmit period is 1 s) the holder's gap
    was never filled - nothing after it became durable, and a failover's republished entries stayed
    on one broker until that broker lost its disk."""
    cluster = Cluster([A, B, C])
    cluster.deliver()
    cluster.append(A, 1)
    cluster.deliver(keep=lambda src, send: False)  # entry 1 lost
    for n in range(2, 8):
        cluster.tick(0.03)  # a new entry every 0.03 s, under the 0.1 s retransmit period
        cluster.append(A, n)
        cluster.deliver()
    assert cluster.durable[A] == set(range(1, 8))
