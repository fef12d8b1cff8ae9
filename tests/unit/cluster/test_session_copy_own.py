"""The CONNECT of a client whose home broker is gone arrives at the home's current holder before
that broker saw the home's link break (``ReplicatedClusterPort.before_attach``; the core's
``Replication.claimed(..., home_silent=True)`` and ``_on_lookup``), scripted between the broker
where the client connects (B: the home's holder, with the newest copy) and a former holder (C: it
held the session while B was down - B then rejoined with its disk lost and got the home's copies
again; C's copy stopped there).

Seen in a 5-broker run of ``tests/process/replication/test_disk_loss.py`` (QoS 2, 2026-11-29
10:45 UTC): the subscriber's CONNECT reached the holder 1 ms before its link to the killed home
broke, so the home was live in its view and it did not adopt its own copy; the claim found no
session and the CONNECT took the copy the former holder answered the lookup with - stream
positions 1,540 messages old: 2,744 duplicates of 5,000 at QoS 2. Had no former holder answered,
the client would have had no session at all (its holder's copy adopted only seconds later, at
the failover)."""

from __future__ import annotations

from broker.cluster.engine_replication import EngineReplication, ReplicatedClusterPort
from broker.cluster.messages import StreamPosition
from broker.cluster.replication_messages import ReplicaHello
from broker.core.messages import SessionSnapshot
from broker.core.ports import Completion
from tests.unit.cluster.test_engine_replication import _deliver, _Store
from tests.unit.cluster.test_engine_replication_sessions import _Later, _SessionEngine, _snapshot
from tests.unit.cluster.test_replicated_port_copy import _ClaimingEngine

HOME, HERE, FORMER = "a:1", "b:1", "c:1"  # the ring: a -> b (the holder of a's sessions) -> c
NEW = (StreamPosition("x:1/inc", "=t", 1544),)  # where the home stood at its last copy to B
OLD = (StreamPosition("x:1/inc", "=t", 2),)  # ... at its last copy to C (before B was back)


class _Takeover:
    wait_s = 0.5


class _HolderEngine(_ClaimingEngine):
    """Records the catch-up an adopted session starts (``ClusterEngine._catch_up``)."""

    def _catch_up(self, client_id: str, positions: tuple[StreamPosition, ...], filters: object) -> None:
        self.order.append(f"catch up {client_id} from {positions[0].next_seq}")


def _brokers() -> tuple[_Later, _ClaimingEngine, EngineReplication, _SessionEngine, EngineReplication]:
    scheduler = _Later()
    here_engine, former_engine = _HolderEngine(HERE, scheduler), _SessionEngine(FORMER, scheduler)
    here_engine.takeover = _Takeover()  # type: ignore[assignment]
    here = EngineReplication(here_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
    former = EngineReplication(former_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
    here.store = _Store(here_engine.broker)
    former.store = _Store(former_engine.broker)
    here.store.persist_session((HOME, "inc-a"), "dev", _snapshot("dev", queued=0), NEW)
    former.store.persist_session((HOME, "inc-a"), "dev", _snapshot("dev", queued=5), OLD)
    here.start([FORMER])
    former.start([HERE])
    # the home is live in both views: its link has not broken yet
    for replication in (here, former):
        replication.on_receive(HOME, ReplicaHello("inc-a", False, wants_reply=False))
    _deliver(scheduler, here_engine, here, former_engine, former)  # type: ignore[arg-type]  # hellos
    assert here.core is not None and here.core.holders_of(HOME) == [HERE]
    return scheduler, here_engine, here, former_engine, former


def _connect(here_engine: _ClaimingEngine, here: EngineReplication) -> Completion[SessionSnapshot | None]:
    port = ReplicatedClusterPort(here_engine, here)  # type: ignore[arg-type]
    result = port.before_attach("dev", False)
    assert result is not None
    return result


def test_the_holders_own_copy_is_the_clients_session_when_its_home_did_not_answer_the_claim() -> None:
    scheduler, here_engine, here, former_engine, former = _brokers()
    result = _connect(here_engine, here)
    assert here.adopted_total == 0  # the home is live in our view: not adopted at the CONNECT
    here_engine.claim.set_result(None)  # the home did not answer the claim
    _deliver(scheduler, here_engine, here, former_engine, former)  # type: ignore[arg-type]  # the lookup
    # the home, live in our view, does not answer the lookup either: the CONNECT's wait runs out
    scheduler.now += _Takeover.wait_s
    scheduler.run_later()
    assert result.done() and result.result() is None  # the CONNECT attaches the adopted session
    assert here_engine.broker.sessions["dev"].pending == [], "a former holder's older copy was taken"
    assert here.adopted_total == 1 and here.core is not None and here.core.held_sessions() == {}
    assert here_engine.order == ["catch up dev from 1544"]  # from where the home stood last


def test_a_former_holder_does_not_answer_a_lookup_with_its_older_copy() -> None:
    scheduler, here_engine, here, former_engine, former = _brokers()
    assert former.core is not None and former.core.held_sessions() == {(HOME, "inc-a"): ["dev"]}
    lookup_id, actions = here.core.lookup("dev")  # type: ignore[union-attr]
    here._apply(actions)
    _deliver(scheduler, here_engine, here, former_engine, former)  # type: ignore[arg-type]
    assert lookup_id not in here.copies, "the former holder answered with its older copy"
    assert here.core.lookup_unanswered(lookup_id) == [HOME]  # type: ignore[union-attr]  # C: "no copy"
