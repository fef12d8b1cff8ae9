"""A holder's session copy that arrives after the CONNECT's takeover claim is done
(``ReplicatedClusterPort.before_attach``, broker/cluster/engine_replication.py; the lookup's
answers, ``Replication.lookup_answered``), scripted between the broker where the client connects
(C) and the holder (B) of the session of its home (A), which was killed with its disk.

The timing of the failure seen once in a CI run of
``tests/process/replication/test_replicated_sessions.py`` (session present False 0.06 s after the
reconnect, 3,473 of 5,000 lost): C had already seen A's link break, so its claim waited for B
alone; B had not yet (its event loop took C's claim before A's broken link), so A was live in its
view, it did not adopt its copy and answered the claim "no session". The copy, B's answer to the
lookup that C sends beside the claim, left B's replication outbox an event-loop iteration after
that answer: C took "no session" before the copy came. C now waits, at most the CONNECT's own
wait (``cluster.takeover_wait_ms``), until a copy came or every member it asked and sees live
answered ("no copy here" is an answer too)."""

from __future__ import annotations

from broker.cluster.engine_replication import EngineReplication, ReplicatedClusterPort
from broker.cluster.messages import StreamPosition
from broker.cluster.replication_messages import ReplicaHello, SessionCopy, SessionLookup
from broker.config.schema import ClusterConfig
from broker.core.messages import SessionSnapshot
from broker.core.ports import Completion
from tests.unit.cluster.test_engine_replication import _deliver, _Store
from tests.unit.cluster.test_engine_replication_sessions import _Later, _SessionEngine, _snapshot
from tests.unit.cluster.test_replicated_port_copy import _ClaimingEngine

HOME, HOLDER, HERE = "a:1", "b:1", "c:1"
POSITIONS = (StreamPosition("c:1/inc", "=t", 40),)
WAIT_S = ClusterConfig().takeover_wait_ms / 1000.0  # the default


class _Takeover:
    wait_s = WAIT_S


def _brokers(
    *, holder_has_copy: bool
) -> tuple[_Later, _ClaimingEngine, EngineReplication, _SessionEngine, EngineReplication]:
    scheduler = _Later()
    here_engine, holder_engine = _ClaimingEngine(HERE, scheduler), _SessionEngine(HOLDER, scheduler)
    here_engine.takeover = _Takeover()  # type: ignore[assignment]
    here = EngineReplication(here_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
    holder = EngineReplication(holder_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
    here.store = _Store(here_engine.broker)
    holder.store = _Store(holder_engine.broker)
    if holder_has_copy:
        holder.store.persist_session((HOME, "inc-a"), "dev", _snapshot("dev", queued=2), POSITIONS)
    here.start([HOLDER])
    holder.start([HERE])  # restores the copy it held of the home's session
    # the home is live in the holder's view (its link has not broken there yet)
    holder.on_receive(HOME, ReplicaHello("inc-a", False, wants_reply=False))
    assert holder.core is not None and holder.core.is_live(HOME)
    _deliver(scheduler, here_engine, here, holder_engine, holder)  # type: ignore[arg-type]  # hellos
    return scheduler, here_engine, here, holder_engine, holder


def _connect(here_engine: _ClaimingEngine, here: EngineReplication) -> Completion[SessionSnapshot | None]:
    port = ReplicatedClusterPort(here_engine, here)  # type: ignore[arg-type]
    result = port.before_attach("dev", False)
    assert result is not None
    return result


def test_a_copy_that_comes_after_the_claim_answered_no_session_is_still_the_clients_session() -> None:
    scheduler, here_engine, here, holder_engine, holder = _brokers(holder_has_copy=True)
    result = _connect(here_engine, here)
    # the holder answers the claim first: "no session" (the home is live in its view: no adoption)
    assert holder.core is not None and holder.core.claimed("dev") == []
    here_engine.claim.set_result(None)
    assert not result.done(), "the claim's 'no session' was taken before the holder's copy could come"
    _deliver(scheduler, here_engine, here, holder_engine, holder)  # type: ignore[arg-type]  # lookup, copy
    assert result.done()
    snapshot = result.result()
    assert snapshot is not None and snapshot.client_id == "dev" and len(snapshot.pending) == 2
    _deliver(scheduler, here_engine, here, holder_engine, holder)  # type: ignore[arg-type]  # copy taken
    assert here_engine.order == ["catch up dev from 40"]  # from where the home stood
    assert holder.core.held_sessions() == {}  # the holder dropped its copy: one session, here


def test_with_no_copy_anywhere_the_connect_goes_on_once_every_live_member_said_so() -> None:
    scheduler, here_engine, here, holder_engine, holder = _brokers(holder_has_copy=False)
    result = _connect(here_engine, here)
    here_engine.claim.set_result(None)
    assert not result.done()  # the holder's answer to the lookup is not in yet
    scheduler.run_soon()  # the lookup leaves
    (lookup,) = [item for _peer, item in here_engine.transport.sent if isinstance(item, SessionLookup)]
    here_engine.transport.sent = []
    holder.on_receive(HERE, lookup)
    scheduler.run_soon()  # the answer leaves the holder's outbox
    (answer,) = [item for _peer, item in holder_engine.transport.sent if isinstance(item, SessionCopy)]
    assert answer.snapshot is None  # "no copy here"
    here.on_receive(HOLDER, answer)
    assert result.done() and result.result() is None  # at once, not after the CONNECT's wait


def test_a_live_member_that_never_answers_holds_the_connect_no_longer_than_its_wait() -> None:
    scheduler, here_engine, here, _holder_engine, _holder = _brokers(holder_has_copy=True)
    result = _connect(here_engine, here)
    here_engine.claim.set_result(None)
    scheduler.run_soon()
    here_engine.transport.sent = []  # the lookup is lost, and so are the ones sent again
    scheduler.now += WAIT_S / 2
    scheduler.run_later()
    assert not result.done()
    scheduler.now += WAIT_S / 2
    scheduler.run_later()
    assert result.done() and result.result() is None  # the CONNECT goes on, as after a claim's wait
