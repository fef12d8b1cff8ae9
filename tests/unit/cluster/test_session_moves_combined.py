"""Session moves combined with crashes, partitions and message loss (issue #10's combined-fault
sweep, ``python -m simulation --faults crash,move --loss 0.05`` and ``--faults partition,move``):
scripted tests of the causes found, one per cause, each naming the seed that showed it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from broker.adapters.cluster_store import SqliteClusterStore
from broker.adapters.sqlite_store import Store
from broker.cluster.interest import Interest
from broker.cluster.messages import ClaimReply, ForwardedMessage, SessionClaim, StreamPosition
from broker.cluster.store_port import MemoryClusterStore
from broker.cluster.stream_receiver import StreamReceiver
from broker.cluster.stream_sender import ReceiverAt, StreamSender
from broker.cluster.takeover import Answer, ClaimFinished, HandOver, LateSession, NoSession, Refuse, Takeover
from broker.core.session import Message, SessionSnapshot


def _snapshot(client_id: str = "c") -> SessionSnapshot:
    return SessionSnapshot(client_id, 4, 3600, None, [], [], set())


# ============================================================================ the reply with the session
def test_a_claim_repeated_because_its_reply_with_the_session_was_lost_gets_the_session_again() -> None:
    """Seed 58 (crash,move): the subscriber's broker A crashed, the client reconnected to B; when
    A came back it handed the stored session to B's repeated claim, and that reply was lost. B
    repeats an unanswered claim, but A had ended its copy: the answer said "no session" and the
    session - with the messages queued for it and the positions B needed - was gone."""
    old = Takeover("a:1", wait_s=0.5, repeat_s=1.0)
    new = Takeover("b:1", wait_s=0.5, repeat_s=1.0)
    claim, waits = new.claim("c", False, [], now=0.0, wall_ns=10, unreachable=["a:1"])
    assert not waits  # A is down: the CONNECT does not wait, the claim is repeated to A
    assert old.on_claim(claim, connected_here=False) == HandOver(claim, transfer=True)
    reply = ClaimReply(claim.claim_id, "c", True, _snapshot(), (StreamPosition("b:1/x", "=t", 5),))
    old.handed_over(claim.claim_id, claim.origin, reply, now=0.1)
    # the reply is lost on the way: B has no answer from A and repeats its claim
    assert new.repeats(now=1.0) == [("a:1", claim)]
    assert old.on_claim(claim, connected_here=False) == Answer(claim, reply)  # the same session
    assert new.on_reply("a:1", reply) == LateSession(reply.snapshot)  # type: ignore[arg-type]
    assert new.repeats(now=2.0) == []  # answered
    # kept while the claimant may repeat, then dropped
    old.forget_handed_over(now=0.1 + old.repeat_for_s + 1)
    assert old.on_claim(claim, connected_here=False) == HandOver(claim, transfer=True)


def test_a_repeated_claim_does_not_get_the_session_again_once_the_client_reconnected_here() -> None:
    old = Takeover("a:1", wait_s=0.5, repeat_s=1.0)
    claimant = Takeover("b:1", wait_s=0.5, repeat_s=1.0)
    claim, _ = claimant.claim("c", False, ["a:1"], now=0.0, wall_ns=10)
    old.on_claim(claim, connected_here=True)
    old.handed_over(claim.claim_id, claim.origin, ClaimReply(claim.claim_id, "c", True, _snapshot()), 0.1)
    old.claim("c", False, ["b:1"], now=0.5, wall_ns=20)  # the client came back to A: newer
    assert old.on_claim(claim, connected_here=True) == Refuse(claim)


def test_a_claim_repeated_to_a_broker_that_came_back_is_repeated_until_it_answers() -> None:
    """Seed 35 (crash,partition,move): the subscriber's broker A crashed and the client reconnected
    to B before B noticed the crash (A neither connected nor reported down: the claim was not kept
    for A). When A came back, B repeated its claim to A once (``claims_to_repeat``) and that repeat
    was lost: A kept the client's old session, with a message B had sent A's stream after the
    crash, for good. The repeat is now kept until A answers, like an unanswered claim."""
    b = Takeover("b:1", wait_s=0.5, repeat_s=1.0)
    claim, waits = b.claim("c", False, [], now=0.0, wall_ns=10)
    assert not waits and b.repeats(now=5.0) == []  # nobody to repeat it to
    # A is back: B repeats the claims of its connected clients to it (the send is lost)
    again = b.claims_to_repeat(lambda client_id: client_id == "c")
    assert again == [claim]
    b.repeat_to("a:1", again, now=6.0)
    assert b.repeats(now=6.5) == []  # not before repeat_s
    assert b.repeats(now=7.0) == [("a:1", claim)]
    assert b.repeats(now=8.0) == [("a:1", claim)]
    a = Takeover("a:1", wait_s=0.5, repeat_s=1.0)
    assert a.on_claim(claim, connected_here=False) == HandOver(claim, transfer=True)
    reply = ClaimReply(claim.claim_id, "c", True, _snapshot())
    assert b.on_reply("a:1", reply) == LateSession(reply.snapshot)  # type: ignore[arg-type]
    assert b.repeats(now=9.0) == []  # answered


def test_a_session_handed_to_a_broker_that_went_down_right_after_goes_to_the_next_claim() -> None:
    """Seed 177 (crash,partition,move; also 607, 688, 789, 932): the client connected to P, whose
    claim reached the subscriber's broker H after P had crashed. H handed the session over (with a
    queued message and its stream positions) and kept the reply for a repeat of that claim - which
    never came: the restarted P knows nothing of it. The client reconnected to P and its new claim
    got "no session": the message was lost. A session handed over to a broker reported down right
    after (``unconfirmed_s``) now goes to the client's next newer claim, from any broker."""
    h = Takeover("h:1", wait_s=0.5, repeat_s=1.0, unconfirmed_s=2.0)
    old = SessionClaim("p:1", "c", 10, False)
    assert h.on_claim(old, connected_here=True) == HandOver(old, transfer=True)
    reply = ClaimReply(10, "c", True, _snapshot(), (StreamPosition("q:1/x", "=t", 12),))
    h.handed_over(10, "p:1", reply, now=4.58)
    h.claimant_down("p:1", now=4.63)  # P crashed: its reply was on its way
    newer = SessionClaim("p:1", "c", 20, False)  # the client connected to the restarted P
    moved = ClaimReply(20, "c", True, reply.snapshot, reply.positions)
    assert h.on_claim(newer, connected_here=False) == Answer(newer, moved, moved_from=(10, "p:1"))
    assert h.on_claim(newer, connected_here=False) == Answer(newer, moved)  # kept for its repeats
    assert h.on_claim(old, connected_here=False) == HandOver(old, transfer=True)  # no longer P's


def test_a_session_handed_over_long_before_its_claimant_went_down_stays_with_it() -> None:
    h = Takeover("h:1", wait_s=0.5, repeat_s=1.0, unconfirmed_s=2.0)
    old = SessionClaim("p:1", "c", 10, False)
    h.on_claim(old, connected_here=True)
    h.handed_over(10, "p:1", ClaimReply(10, "c", True, _snapshot()), now=1.0)
    h.claimant_down("p:1", now=30.0)  # P had imported it long before: no second copy
    newer = SessionClaim("q:1", "c", 20, False)
    assert h.on_claim(newer, connected_here=False) == HandOver(newer, transfer=True)


def test_a_claim_whose_connect_still_waits_is_repeated_to_a_broker_that_comes_back() -> None:
    """Seed 470 (crash,partition,move; also 159, 483, 745): the client's session was at A; it
    connected to B, restarted while cut off from A (B knew nothing of A: neither connected nor
    reported down, so the claim was kept for nobody there). The partition healed while the CONNECT
    still waited for its replies: B repeated to A the claims of its *connected* clients only, so A
    never got the claim and kept the session, with a message for it, for good."""
    b = Takeover("b:2", wait_s=0.5, repeat_s=1.0)
    claim, waits = b.claim("c", False, ["c:1"], now=6.0, wall_ns=10)
    assert waits
    assert b.claims_to_repeat(lambda client_id: False) == [claim]  # A is back at 6.3: waiting
    b.repeat_to("a:1", [claim], now=6.3)
    assert b.repeats(now=7.3) == [("a:1", claim), ("c:1", claim)]  # until each answers
    b.tick(now=6.5)  # the wait ends: no session present; the client attaches
    assert b.claims_to_repeat(lambda client_id: True) == [claim]
    assert b.claims_to_repeat(lambda client_id: False) == []  # gone: nothing to claim for


# ============================================ both brokers down before the session arrived
def test_a_restarted_claimant_asks_again_for_a_session_handed_over_while_both_brokers_went_down() -> None:
    """Seeds 27 (crash,move) and 392 (crash,partition,move), found with issue #11's coalesced
    replies: the client moved from H to P; H handed its session over and kept the reply (durably),
    the reply was lost (loss; a partition between H and P), then H crashed and P crashed. H's
    memory that P went down (``claimant_down``) died with H, and a restarted P does not repeat its
    connections' claims: the client's next claim found no session anywhere, and what H's reply
    carried (the positions the client's messages had to be fetched from) was lost for good. Now P
    keeps the claim durably until its session arrives and, restarted, asks every broker for it
    again as ``recover``."""
    store_h, store_p = MemoryClusterStore(), MemoryClusterStore()
    h = Takeover("h:1", wait_s=0.5, repeat_s=1.0)
    p = Takeover("p:1", wait_s=0.5, repeat_s=1.0)
    claim, waits = p.claim("c", False, ["h:1", "q:1"], now=4.4, wall_ns=10)
    assert waits and p.pending_claim(claim.claim_id) == claim
    store_p.set_pending_claim(claim.claim_id, claim)  # the engine: durable before it leaves
    assert h.on_claim(claim, connected_here=False) == HandOver(claim, transfer=True)
    reply = ClaimReply(claim.claim_id, "c", True, _snapshot(), (StreamPosition("q:1/x", "=plant", 8),))
    h.handed_over(claim.claim_id, claim.origin, reply, now=4.4)
    store_h.set_handed_over(claim.claim_id, claim.origin, reply)
    # the reply is lost; q answers "no session" (that alone does not settle the claim: h has not)
    assert not p.answered_without_session(claim.claim_id, "q:1")
    # H crashes, then P crashes: both restart from their stores
    h2 = Takeover("h:1", wait_s=0.5, repeat_s=1.0)
    h2.restore_handed_over(store_h.load_handed_over(), now=7.2)
    p2 = Takeover("p:1", wait_s=0.5, repeat_s=1.0)
    p2.restore_pending(store_p.load_pending_claims(), now=7.3)
    (recover,) = p2.recovery_claims()  # sent to every broker that talks to the restarted P
    assert recover.recover and recover.claim_id == claim.claim_id and recover.client_id == "c"
    assert p2.is_own_claim(claim.claim_id, "c")  # its answer is accepted
    assert h2.on_claim(recover, connected_here=False) == Answer(recover, reply)  # the kept session
    q = Takeover("q:1", wait_s=0.5, repeat_s=1.0)
    assert q.on_claim(recover, connected_here=False) == NoSession(recover)
    assert p2.on_reply("h:1", reply) == LateSession(reply.snapshot)  # no CONNECT waits for it now
    assert p2.settled(claim.claim_id) and p2.recovery_claims() == []


def test_a_recover_claim_never_takes_a_session_held_here() -> None:
    """A ``recover`` claim only asks for a session kept for it: a broker that holds the client's
    session (its client offline, or connected) hands nothing over - an old claim repeated after a
    restart must not take a newer session from where the client left it."""
    h = Takeover("h:1", wait_s=0.5, repeat_s=1.0)
    h.claim("c", False, [], now=1.0, wall_ns=50)  # the client connected here after the old claim
    recover = SessionClaim("p:1", "c", 10, False, None, recover=True)
    assert h.on_claim(recover, connected_here=False) == NoSession(recover)
    assert h.on_claim(recover, connected_here=True) == NoSession(recover)


def test_a_claim_answered_by_every_broker_without_a_session_is_no_longer_pending() -> None:
    p = Takeover("p:1", wait_s=0.5, repeat_s=1.0, repeat_for_s=600.0)
    claim, _waits = p.claim("c", False, ["h:1", "q:1"], now=1.0, wall_ns=10)
    assert not p.answered_without_session(claim.claim_id, "h:1")
    assert p.answered_without_session(claim.claim_id, "q:1")  # settled: the store forgets it
    assert p.pending_claim(claim.claim_id) is None
    clean, _ = p.claim("d", True, ["h:1"], now=1.0, wall_ns=20)  # clean start: nothing to bring
    assert p.pending_claim(clean.claim_id) is None
    other, _ = p.claim("e", False, ["h:1"], now=1.0, wall_ns=30)
    assert p.expire_pending(now=500.0) == [] and p.expire_pending(now=602.0) == [other.claim_id]


def test_a_recover_claim_is_repeated_until_answered_without_a_connection() -> None:
    p = Takeover("p:2", wait_s=0.5, repeat_s=1.0)
    p.restore_pending([SessionClaim("p:2", "c", 10, False)], now=7.0)
    (recover,) = p.recovery_claims()
    p.repeat_to("h:1", [recover], now=7.0)
    assert p.repeats(now=8.0) == [("h:1", recover)]  # the client is connected nowhere here
    p.on_reply("h:1", ClaimReply(10, "c", False, None))
    assert p.repeats(now=9.0) == []


def test_the_sqlite_cluster_store_keeps_pending_claims_across_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "skipmq.db")
    store = Store(path)
    cluster_store = SqliteClusterStore(store)
    claim = SessionClaim("p:1", "c", 10, False, "alice")
    cluster_store.set_pending_claim(10, claim)
    cluster_store.set_pending_claim(11, SessionClaim("p:1", "d", 11, False))
    cluster_store.set_pending_claim(11, None)
    store.commit()
    store.close()
    reopened = Store(path)
    assert SqliteClusterStore(reopened).load_pending_claims() == [claim]
    reopened.close()


# ====================================================== streams the old broker never received
def test_the_sender_lists_its_streams_of_a_class_and_their_whole_log() -> None:
    """Seeds 27 and 271 (crash,move): a session moved to B while B's messages of the class had
    never reached the old broker (the overlay delivered them late), so the hand-over positions do
    not name B's stream. Where B knew the old broker stood (registered by filter propagation when
    it subscribed, after the session's own subscription, or when the session had moved there from
    a broker B's stream had not reached either) is no bound: B delivers its whole log of the
    stream to the session (the catch-up in ``broker.cluster.streams``)."""
    sender = StreamSender(
        "b:1/inc", retransmit_s=1.0, retention_s=100.0, presence_grace_s=2.0, receivers_of=lambda cls: ["a:1"]
    )
    sender.restore([ForwardedMessage("b:1/old", "=t", 7, Message("t/x", b"old", qos=1))], [], now=0.0)
    for n in range(1, 4):
        sender.append("=t", Message("t/x", str(n).encode(), qos=1), now=0.0)
    sender.append("=u", Message("u/x", b"u", qos=1), now=0.0)
    assert sender.streams_of("=t") == [("b:1/inc", "=t"), ("b:1/old", "=t")]  # restored ones too
    messages, kept_from = sender.logged_from(("b:1/inc", "=t"), 0)
    assert [m.seq for m in messages] == [1, 2, 3] and kept_from == 1


# ====================================================== a stream on its way for other subscribers
def test_a_stream_not_heard_of_yet_is_not_started_at_a_moved_sessions_position() -> None:
    """Seed 86 (crash,move): a session moved from C to A while C's first messages of the class had
    not reached A, where another client subscribes the class too. A started C's stream at the
    moved session's position (``adopt``, and acknowledged it): C's earlier messages then arrived
    as stale and were dropped - for the client that had been subscribed at A all along. A now
    starts such a stream as any other (first message, or its ``low``) and catches the moved
    session up from there; it adopts the position only when nobody else here needs the stream."""
    interest = Interest(1)
    interest.subscribe("stay", "mv/x", None)
    interest.subscribe("moved", "mv/#", None)
    assert interest.subscribed_by_others("=mv", "moved")
    assert interest.subscribed_by_others("=mv", "stay")  # "moved" subscribes it too
    alone = Interest(1)
    alone.subscribe("moved", "mv/x", None)
    assert not alone.subscribed_by_others("=mv", "moved")  # adopt: nobody else needs the stream
    receiver = StreamReceiver(ret_delay_s=0.2, retransmit_s=1.0, ack_delay_s=0.05)
    key = ("c:1/inc", "=mv")
    assert receiver.start_of(key) == 0
    first = ForwardedMessage("c:1/inc", "=mv", 4, Message("mv/x", b"4", qos=1), 1)
    receiver.receive(first, 1, now=0.0)
    assert receiver.start_of(key) == 1  # from its low: 1..3 are asked for, not dropped as stale


# ====================================================== a broker the client moved on from
def test_a_claim_is_not_repeated_once_a_newer_claim_for_the_client_came_from_elsewhere() -> None:
    """Seeds 149, 176 and 250 (partition,move): the client's session was cut off at A; it
    reconnected to B (a new session, B's claim repeated to A until it answers), then moved on to C,
    which took B's session. B kept repeating its claim (its connection record was still its own):
    when the partition healed, A handed the client's old session, with everything queued for it
    during the split, to B - where nobody connects any more."""
    b = Takeover("b:1", wait_s=0.5, repeat_s=1.0)
    claim, _ = b.claim("c", False, [], now=0.0, wall_ns=10, unreachable=["a:1"])
    assert b.repeats(now=1.0) == [("a:1", claim)]
    newer = SessionClaim("c:1", "c", 20, False)  # the client connected to C
    assert b.on_claim(newer, connected_here=False) == HandOver(newer, transfer=True)
    # B no longer claims the client: repeated, the claim only asks for a session kept for it
    (repeat,) = b.repeats(now=2.0)
    assert repeat == ("a:1", dataclasses.replace(claim, recover=True))
    a = Takeover("a:1", wait_s=0.5, repeat_s=1.0)
    a.claim("c", False, [], now=0.0, wall_ns=5)  # A holds the client's old session
    assert a.on_claim(repeat[1], connected_here=False) == NoSession(repeat[1])  # it stays for C
    assert b.newest_remote_claim("c") == (20, "c:1")  # a late session goes on to C


def test_a_claim_whose_connect_was_given_up_is_repeated_as_recover_while_its_session_is_in_flight() -> None:
    """Seed 229 (crash,partition,move): the client left B's CONNECT before its CONNACK and
    connected to C. A had handed the session to B's claim and that reply was lost; B no longer
    repeated its claim (its connection was gone), A crashed and C's claim found no session at A
    (handed over) nor at B (never arrived): the messages queued in it were lost. B now repeats
    the claim as ``recover`` to the brokers that have not answered it; A, back, answers with the
    kept reply and B passes the session on to C's newer claim."""
    a = Takeover("a:1", wait_s=0.5, repeat_s=1.0)
    b = Takeover("b:1", wait_s=0.5, repeat_s=1.0)
    claim, waits = b.claim("c", False, ["a:1", "x:1"], now=0.0, wall_ns=10)
    assert waits
    assert a.on_claim(claim, connected_here=True) == HandOver(claim, transfer=True)
    reply = ClaimReply(claim.claim_id, "c", True, _snapshot())
    a.handed_over(claim.claim_id, claim.origin, reply, now=0.01)  # ... and the reply is lost
    b.on_reply("x:1", ClaimReply(claim.claim_id, "c", False, None))  # x has none
    newer = SessionClaim("c:1", "c", 20, False)  # the client gave up on B and connected to C
    assert b.on_claim(newer, connected_here=False) == HandOver(newer, transfer=True)  # (nothing here)
    assert a.on_claim(newer, connected_here=False) == HandOver(newer, transfer=True)  # (gone already)
    assert b.tick(now=0.5) == [ClaimFinished(claim.claim_id, None)]  # (the CONNECT is gone)
    b.forget(has_session=lambda _client: False)  # a clean-up before A answers: C's claim is kept
    recover = dataclasses.replace(claim, recover=True)
    assert b.repeats(now=1.0) == [("a:1", recover)]  # only A may still have the session in flight
    assert a.on_claim(recover, connected_here=False) == Answer(recover, reply)
    assert b.on_reply("a:1", reply) == LateSession(reply.snapshot)  # type: ignore[arg-type]
    assert b.newest_remote_claim("c") == (20, "c:1")  # the engine passes it on to C
    assert b.repeats(now=2.0) == []


def test_a_session_passed_on_to_a_broker_reported_down_goes_to_the_clients_next_claim() -> None:
    """Seed 263 (crash,partition,move): the late session of B's claim went on to C, the client's
    newer broker - which had crashed meanwhile and, restarted, did not ask for it. Handed over to a
    claimant reported down, the session goes to the client's next newer claim."""
    b = Takeover("b:1", wait_s=0.5, repeat_s=1.0)
    reply = ClaimReply(20, "c", True, _snapshot())  # to C's claim 20
    b.handed_over(20, "c:1", reply, now=7.0, claimant_down=True)
    again = SessionClaim("c:1", "c", 30, False)  # C restarted; the client connected there again
    moved = b.on_claim(again, connected_here=False)
    assert moved == Answer(again, dataclasses.replace(reply, claim_id=30), moved_from=(20, "c:1"))
    # handed to a claimant that is up, the session stays with its claim
    b.handed_over(40, "d:1", ClaimReply(40, "e", True, _snapshot("e")), now=7.0)
    later = SessionClaim("c:1", "e", 50, False)
    assert b.on_claim(later, connected_here=False) == HandOver(later, transfer=True)


# ====================================================== classes a moved session brings
def test_a_whole_list_of_classes_registers_a_receiver_from_the_log_start_lowering_a_guess() -> None:
    """Seed 271 (partition,move): a session moved from A (which B's messages had never reached) to
    C, which subscribed the class only then: B registered C from its next message, after the
    messages the session still needed, and then completed their publication without C (B was
    cut off alone: the overlay saw nobody else). The broker a session moved to announces its whole
    list (``ClassInterest.full``): its senders register it from the start of their logs - also
    lowering a registration not yet confirmed by an acknowledgement, never an acknowledged one."""
    sender = StreamSender("b:1/inc", retransmit_s=1.0, retention_s=100.0, presence_grace_s=2.0)
    for n in range(1, 5):
        sender.append("=t", Message("t/x", str(n).encode(), qos=1), now=0.0)
    key = ("b:1/inc", "=t")
    assert sender.register("c:1", "=t", now=0.1, from_log_start=False) == [ReceiverAt(key, "c:1", 5)]
    assert sender.register("c:1", "=t", now=0.2, from_log_start=True) == [ReceiverAt(key, "c:1", 1)]
    sender.acked("d:1", (StreamPosition("b:1/inc", "=t", 3),), now=0.3)  # d acknowledged: rules
    assert sender.register("d:1", "=t", now=0.4, from_log_start=True) == []


# ====================================================== the kept reply survives a restart
def test_a_reply_kept_for_a_repeated_claim_survives_a_restart_of_the_broker(tmp_path: Path) -> None:
    """Seed 7 (crash,move): the reply carrying the session was lost and the old broker crashed
    before the claim was repeated; the reply kept for the repeat was in memory only, so after the
    restart the repeated claim got "no session". It is now written with the hand-over's commit."""
    store = Store(str(tmp_path / "skipmq.db"))
    cluster_store = SqliteClusterStore(store)
    claim = SessionClaim("b:1", "c", 10, False)
    reply = ClaimReply(10, "c", True, _snapshot(), (StreamPosition("b:1/x", "=t", 5),))
    cluster_store.set_handed_over(claim.claim_id, claim.origin, reply)
    store.commit()
    store.close()
    again = SqliteClusterStore(Store(str(tmp_path / "skipmq.db")))
    restarted = Takeover("a:1", wait_s=0.5, repeat_s=1.0)
    restarted.restore_handed_over(again.load_handed_over(), now=0.0)
    assert restarted.on_claim(claim, connected_here=False) == Answer(claim, reply)
    memory = MemoryClusterStore()
    memory.set_handed_over(10, "b:1", reply)
    memory.set_handed_over(10, "b:1", None)
    assert memory.load_handed_over() == []


def test_a_claim_goes_to_the_brokers_that_came_back_while_its_connect_waited() -> None:
    """Seed 147 (crash,move): the client's broker A crashed with its stored session; the client
    moved on to B, whose claim (a restarted broker: A not known to be down) went to the others
    only. A came back while B's CONNECT waited for the moved session's classes before its CONNACK:
    B repeats the claims of connected clients and of CONNECTs waiting for replies to a broker
    that comes back, not this one's, and A kept the session with the positions of what was
    published while it was down. When the CONNECT attaches, its claim goes to the brokers it was
    not sent to, and is repeated until they answer."""
    b = Takeover("b:2", wait_s=0.5, repeat_s=1.0)
    claim, waits = b.claim("c", False, ["d:1"], now=5.0, wall_ns=50)
    assert waits
    snapshot = _snapshot()
    assert b.on_reply("d:1", ClaimReply(claim.claim_id, "c", True, snapshot)) == ClaimFinished(
        claim.claim_id, snapshot
    )
    assert b.claims_to_repeat(connected=lambda _c: False) == []  # waiting to attach: not repeated
    assert b.unasked("c", ["d:1", "a:1"]) == (claim, ["a:1"])  # attached: A came back meanwhile
    b.repeat_to("a:1", [claim], now=6.0)
    assert b.repeats(now=7.0) == [("a:1", claim)]  # until A answers
    assert b.unasked("c", ["d:1", "a:1"]) is None  # asked already
    a = Takeover("a:2", wait_s=0.5, repeat_s=1.0)
    a.claim("c", False, [], now=0.0, wall_ns=10)  # A's old connection of the client
    assert a.on_claim(claim, connected_here=False) == HandOver(claim, transfer=True)
    b.on_reply("a:1", ClaimReply(claim.claim_id, "c", True, _snapshot()))
    assert b.repeats(now=8.0) == []
    # a claim made elsewhere, or none: nothing to send
    assert b.unasked("other", ["a:1"]) is None
