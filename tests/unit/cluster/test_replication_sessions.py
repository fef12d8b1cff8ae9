"""Persistent sessions and graceful removal in the pure core of replicated durability
(``broker.cluster.replication``), scripted with the hand-run mailbox of
``test_replication_core``: a session's latest state kept on N brokers, adopted by a holder when
its home is gone, and a leaving broker's hand-over (seed 004's stages over the replica group)."""

from __future__ import annotations

from broker.cluster.messages import StreamPosition
from broker.cluster.replication_messages import (
    AdoptSessions,
    CopyFound,
    Drop,
    DropSessions,
    Persist,
    PersistSession,
    ReplicaHandedOver,
    ReplicaLeaving,
    SendReplica,
    SessionCopy,
    SessionDurable,
    SessionReplica,
)
from broker.core.messages import OutEntry, SessionSnapshot, SubOptions
from tests.unit.cluster.test_replication_core import A, B, C, Cluster, msg

D = "d:1"


def snap(client_id: str, *filters: str, queued: int = 0) -> SessionSnapshot:
    pending = [OutEntry(msg(n), 1, False, []) for n in range(queued)]
    return SessionSnapshot(client_id, 5, 3600, None, [SubOptions(f, 1) for f in filters], pending, {2})


def changed(cluster: Cluster, peer: str, client_id: str, snapshot: SessionSnapshot | None) -> None:
    cluster.apply(peer, cluster.cores[peer].session_changed(client_id, snapshot, cluster.now))


def durable(cluster: Cluster, peer: str) -> list[SessionDurable]:
    return [a for a in cluster.disk[peer] if isinstance(a, SessionDurable)]


def adopted(cluster: Cluster, peer: str) -> list[AdoptSessions]:
    return [a for a in cluster.disk[peer] if isinstance(a, AdoptSessions)]


def test_one_replica_makes_a_session_change_durable_at_once() -> None:
    cluster = Cluster([A, B, C], replicas=1)
    cluster.deliver()
    changed(cluster, A, "s1", snap("s1", "a/#"))
    assert durable(cluster, A) == [SessionDurable("s1", 1)]
    assert not cluster.mailbox


def test_a_session_change_is_durable_once_its_holder_committed_it_and_the_latest_state_wins() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    changed(cluster, A, "s1", snap("s1", "a/#"))
    assert durable(cluster, A) == []
    assert cluster.cores[A].under_replicated_sessions() == 1
    cluster.deliver(keep=lambda src, send: False)  # lost
    changed(cluster, A, "s1", snap("s1", "a/#", "b/#", queued=2))
    cluster.deliver()
    assert durable(cluster, A) == [SessionDurable("s1", 2)]  # version 1 is never needed
    assert cluster.cores[A].session_durable("s1")
    persisted = [a for a in cluster.disk[B] if isinstance(a, PersistSession)]
    assert persisted == [PersistSession((A, f"{A}#1"), "s1", snap("s1", "a/#", "b/#", queued=2))]
    assert cluster.cores[B].held_sessions() == {(A, f"{A}#1"): ["s1"]}
    assert cluster.disk[C] == []  # not a holder of A


def test_a_lost_session_replica_is_sent_again_after_the_retransmit_period() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    changed(cluster, A, "s1", snap("s1", "a/#"))
    cluster.deliver(keep=lambda src, send: False)
    cluster.tick(0.05)
    cluster.deliver()
    assert durable(cluster, A) == []
    cluster.tick(0.1)
    cluster.deliver()
    assert durable(cluster, A) == [SessionDurable("s1", 1)]


def test_home_back_with_its_disk_lost_its_holder_adopts_its_sessions_before_publishing_its_log() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    changed(cluster, A, "s1", snap("s1", "a/#", queued=1))
    changed(cluster, A, "s2", snap("s2", "b/#"))
    changed(cluster, A, "s2", None)  # s2 ended (clean start elsewhere): not adopted
    cluster.append(A, 1)
    cluster.deliver()
    assert cluster.cores[B].held_sessions() == {(A, f"{A}#1"): ["s1"]}
    cluster.boot(A, started_empty=True)
    cluster.deliver()
    key = (A, f"{A}#1")
    assert adopted(cluster, B) == [AdoptSessions(key, (snap("s1", "a/#", queued=1),), ((),))]
    (takeover,) = cluster.taken[B]
    assert takeover.messages == (msg(1),)
    assert cluster.cores[B].sessions_adopted(key) == [DropSessions(key)]
    assert cluster.cores[B].held_sessions() == {}


def test_home_down_for_good_its_sessions_are_adopted_after_the_failover_time() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    changed(cluster, A, "s1", snap("s1", "a/#"))
    cluster.deliver()
    cluster.apply(B, cluster.cores[B].on_peer_down(A, cluster.now))
    cluster.tick(4.9)
    assert adopted(cluster, B) == []
    cluster.tick(0.2)
    assert [a.snapshots for a in adopted(cluster, B)] == [(snap("s1", "a/#"),)]
    cluster.tick(1.0)
    assert len(adopted(cluster, B)) == 1  # once


def test_a_holder_down_is_replaced_and_a_holder_back_empty_gets_the_sessions_again() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    changed(cluster, A, "s1", snap("s1", "a/#"))
    cluster.deliver()
    cluster.apply(A, cluster.cores[A].on_peer_down(B, cluster.now))
    cluster.deliver()
    assert cluster.cores[C].held_sessions() == {(A, f"{A}#1"): ["s1"]}
    cluster.disk[B].clear()
    cluster.boot(B, started_empty=True)
    cluster.deliver()
    assert cluster.cores[B].held_sessions() == {(A, f"{A}#1"): ["s1"]}


def test_a_leaving_holder_is_replaced_before_it_is_drained_and_its_own_state_is_taken_over_at_once() -> None:
    cluster = Cluster([A, B, C, D])
    cluster.deliver()
    cluster.append(A, 1)
    changed(cluster, A, "s1", snap("s1", "a/#"))
    cluster.append(B, 2)
    changed(cluster, B, "s2", snap("s2", "b/#"))
    cluster.deliver()
    leaving = cluster.cores[B]  # holder of A's log and sessions, origin of its own
    cluster.apply(B, leaving.leave(cluster.now))
    assert all(isinstance(send.item, ReplicaLeaving) for _src, send in cluster.mailbox)
    assert not leaving.drained()  # A has not answered yet
    cluster.deliver()
    assert leaving.drained()
    assert cluster.cores[A].holders_of(A) == [C]  # the next broker on the ring
    assert cluster.cores[C].held_sessions()[(A, f"{A}#1")] == ["s1"]
    of_a = [a for a in cluster.disk[C] if isinstance(a, Persist) and a.key[0] == A]
    assert [m for a in of_a for m in a.messages] == [msg(1)]
    assert Drop((A, f"{A}#1"), None) in cluster.disk[B]
    assert DropSessions((A, f"{A}#1")) in cluster.disk[B]
    # B exits: C, its holder, takes its log and sessions over at once (no failover wait)
    cluster.apply(C, cluster.cores[C].on_peer_down(B, cluster.now))
    assert [t.messages for t in cluster.taken[C]] == [(msg(2),)]
    assert [a.snapshots for a in adopted(cluster, C)] == [(snap("s2", "b/#"),)]


def test_a_leaving_broker_answers_only_once_its_origin_has_n_copies_without_it() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    cluster.append(A, 1)
    cluster.deliver()
    cluster.apply(B, cluster.cores[B].leave(cluster.now))
    # C never accepts: A keeps waiting, and so does B's drain
    cluster.deliver(keep=lambda src, send: not (send.peer == C and src == A))
    assert not cluster.cores[B].drained()
    assert not [s for s in cluster.mailbox if isinstance(s[1].item, ReplicaHandedOver)]
    cluster.tick(0.2)
    cluster.deliver()
    assert cluster.cores[B].drained()


def test_a_leaving_broker_takes_over_what_it_holds_of_an_origin_that_is_down() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    cluster.append(A, 1)
    changed(cluster, A, "s1", snap("s1", "a/#"))
    cluster.deliver()
    cluster.apply(B, cluster.cores[B].on_peer_down(A, cluster.now))
    cluster.apply(B, cluster.cores[B].leave(cluster.now))
    assert [t.messages for t in cluster.taken[B]] == [(msg(1),)]
    assert [a.snapshots for a in adopted(cluster, B)] == [(snap("s1", "a/#"),)]


def test_a_holder_keeps_the_latest_version_of_a_session() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    core = cluster.cores[B]
    incarnation = f"{A}#1"
    core.on_item(A, SessionReplica(incarnation, "s1", 3, snap("s1", "new/#")), 0.0)
    late = core.on_item(A, SessionReplica(incarnation, "s1", 2, snap("s1", "old/#")), 0.0)
    assert not [a for a in late if isinstance(a, PersistSession)]  # an older copy, late
    assert core.held_sessions() == {(A, incarnation): ["s1"]}
    core.on_item(A, SessionReplica(incarnation, "s1", 4, None), 0.0)
    assert core.held_sessions() == {}


def test_a_claim_adopts_a_held_session_only_when_its_home_is_not_live_and_brings_its_positions() -> None:
    cluster = Cluster([A, B, C])
    cluster.deliver()
    at = (StreamPosition(C, "=plant", 7),)
    cluster.apply(A, cluster.cores[A].session_changed("s1", snap("s1", "a/#"), cluster.now, at))
    cluster.deliver()
    holder = cluster.cores[B]
    assert holder.claimed("s1") == []  # its home answers the claim itself
    assert holder.claimed("nobody") == []
    cluster.apply(B, holder.on_peer_down(A, cluster.now))  # long before the failover time
    (adopt,) = holder.claimed("s1")
    assert adopt == AdoptSessions((A, f"{A}#1"), (snap("s1", "a/#"),), (at,))
    key = (A, f"{A}#1")
    assert holder.sessions_adopted(key, ["s1"]) == [PersistSession(key, "s1", None)]
    assert holder.held_sessions() == {}


def test_a_holder_that_heard_a_home_only_through_its_records_does_not_adopt_at_a_claim() -> None:
    """Seed 298 of the --sessions sweep: a holder back from its disk loss got the home's session
    records before the home's hello and adopted the home's live session at a repeated claim."""
    cluster = Cluster([A, B, C])
    cluster.deliver()
    cluster.boot(B, started_empty=True)
    cluster.deliver(keep=lambda src, send: not (src == A and send.peer == B))  # A's hello lost
    fresh = cluster.cores[B]
    fresh.on_item(A, SessionReplica(f"{A}#1", "s1", 1, snap("s1", "a/#")), cluster.now)
    assert fresh.held_sessions() == {(A, f"{A}#1"): ["s1"]}
    assert fresh.claimed("s1") == []


def test_a_lookup_is_answered_by_the_holders_with_their_copy_and_a_taken_copy_is_dropped() -> None:
    """A CONNECT elsewhere asks every member beside the takeover claim (whose home may be gone
    but not yet reported down: seeds 50, 293, 301 of the --sessions sweep got no session present)."""
    cluster = Cluster([A, B, C])
    cluster.deliver()
    at = (StreamPosition(A, "=a", 3),)
    cluster.apply(A, cluster.cores[A].session_changed("s1", snap("s1", "a/#"), cluster.now, at))
    cluster.deliver()
    lookup_id, asks = cluster.cores[C].lookup("s1")
    assert sorted(send.peer for send in asks) == [A, B]
    answers = [cluster.cores[send.peer].on_item(C, send.item, 0.0) for send in asks]
    (from_a,), (from_b,) = answers
    # A, the home, holds no copy of its own: it answers "no copy here"
    assert from_a == SendReplica(C, SessionCopy(lookup_id, "", "", None))
    assert isinstance(from_b, SendReplica) and isinstance(from_b.item, SessionCopy)
    assert from_b.peer == C and from_b.item.snapshot == snap("s1", "a/#") and from_b.item.positions == at
    assert not cluster.cores[C].lookup_answered(lookup_id)
    (none_found,) = cluster.cores[C].on_item(A, from_a.item, 0.0)
    assert isinstance(none_found, CopyFound) and none_found.copy.snapshot is None
    assert not cluster.cores[C].lookup_answered(lookup_id)  # B's copy may still come
    (found,) = cluster.cores[C].on_item(B, from_b.item, 0.0)
    assert isinstance(found, CopyFound) and found.lookup_id == lookup_id and found.holder == B
    assert cluster.cores[C].lookup_answered(lookup_id)
    (taken,) = cluster.cores[C].copy_taken(B, found.copy, "s1")
    assert cluster.cores[B].on_item(C, taken.item, 0.0) == [PersistSession((A, f"{A}#1"), "s1", None)]
    assert cluster.cores[B].held_sessions() == {}


def test_a_session_adopted_at_a_claim_and_handed_on_is_still_given_to_lookups_for_a_while() -> None:
    """Seeds 17, 434, 475 and 657 of the --sessions sweep: the holder adopted the session at the
    claim and handed it over in its claim reply, which came after the CONNECT stopped waiting;
    the lookups it got meanwhile found no held copy (adopted) and the client had no session
    present. The holder now answers lookups with what it handed on - only once handed on (a
    session it still has answers the claim itself) and only for ``handed_copy_kept_s``."""
    cluster = Cluster([A, B, C])
    cluster.deliver()
    at = (StreamPosition(C, "=plant", 7),)
    cluster.apply(A, cluster.cores[A].session_changed("s1", snap("s1", "a/#"), cluster.now, at))
    cluster.deliver()
    holder = cluster.cores[B]
    cluster.apply(B, holder.on_peer_down(A, cluster.now))
    (adopt,) = holder.claimed("s1")
    holder.sessions_adopted(adopt.key, ["s1"])
    cluster.apply(B, holder.session_changed("s1", snap("s1", "a/#", queued=1), cluster.now, at))

    def asked() -> list[SessionCopy]:
        _lookup_id, asks = cluster.cores[C].lookup("s1")
        (to_b,) = [send for send in asks if send.peer == B]
        answers = holder.on_item(C, to_b.item, cluster.now)
        return [
            a.item
            for a in answers
            if isinstance(a, SendReplica) and isinstance(a.item, SessionCopy) and a.item.snapshot is not None
        ]

    assert asked() == []  # still B's own session: B answers the claim itself
    cluster.apply(B, holder.session_changed("s1", None, cluster.now))  # handed over to C's claim
    (copy,) = asked()
    assert copy.home == A and copy.snapshot == snap("s1", "a/#", queued=1) and copy.positions == at
    cluster.apply(B, holder.session_changed("s1", snap("s1", "a/#"), cluster.now, at))  # back here
    assert asked() == []
    cluster.apply(B, holder.session_changed("s1", None, cluster.now))  # and on again
    assert len(asked()) == 1
    cluster.now += holder.handed_copy_kept_s + 0.1
    cluster.apply(B, holder.tick(cluster.now))
    assert asked() == []
