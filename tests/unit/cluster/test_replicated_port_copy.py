"""A holder's session copy taken at a CONNECT (``ReplicatedClusterPort.before_attach``,
broker/cluster/engine_replication.py), scripted between the broker where the client connects and
the holder of its gone home's session: the copy's stream positions catch the session up right
after its import - in the event-loop iteration that follows it - not at the CONNACK.

The CONNACK waits for the subscriptions' classes (``subscriptions_ready``): a message published on
this broker in between went live into the imported session ahead of what the positions fetch, so
the client got 77, then 72-76 (seeds 197, 759 and 849 of the simulation's ``--sessions`` sweep;
the simulation's adapter got the same one call, docs/notes/replication.md)."""

from __future__ import annotations

from typing import Any

from broker.cluster.engine_replication import EngineReplication, ReplicatedClusterPort
from broker.cluster.messages import StreamPosition
from broker.core.messages import SessionSnapshot
from broker.core.ports import Completion
from tests.unit.cluster.test_engine_replication import _deliver, _Store
from tests.unit.cluster.test_engine_replication_sessions import _Later, _SessionEngine, _snapshot

HOME = "a:1"  # the session's home, gone with its disk
POSITIONS = (StreamPosition("p:1/inc", "=t", 72),)  # where the home stood when it copied


class _ClaimingEngine(_SessionEngine):
    """The cluster engine of the broker the client connects to: its claim waits (``before_attach``)
    and a moved session's positions are applied by ``_apply_moved_positions``."""

    def __init__(self, peer_id: str, scheduler: _Later) -> None:
        super().__init__(peer_id, scheduler)
        self.claim: Completion[SessionSnapshot | None] = Completion()
        self.order: list[str] = []

    def before_attach(self, client_id: str, clean_start: bool, username: str | None = None) -> Any:
        return self.claim

    def _apply_moved_positions(self, client_id: str) -> None:
        positions = self._moved_positions.pop(client_id, None)
        if positions:
            self.order.append(f"catch up {client_id} from {positions[0].next_seq}")

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        self.order.append(f"CONNACK {client_id}")
        self._apply_moved_positions(client_id)


def test_a_copy_taken_at_a_connect_is_caught_up_right_after_its_import_not_at_the_connack() -> None:
    scheduler = _Later()
    here_engine, holder_engine = _ClaimingEngine("c:1", scheduler), _SessionEngine("b:1", scheduler)
    here = EngineReplication(here_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
    holder = EngineReplication(holder_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
    here.store = _Store(here_engine.broker)
    holder.store = _Store(holder_engine.broker)
    holder.store.persist_session((HOME, "inc-a"), "dev", _snapshot("dev", queued=2), POSITIONS)
    here.start(["b:1"])
    holder.start(["c:1"])  # restores the copy it held of the home's session
    _deliver(scheduler, here_engine, here, holder_engine, holder)  # type: ignore[arg-type]  # hellos
    port = ReplicatedClusterPort(here_engine, here)  # type: ignore[arg-type]

    result = port.before_attach("dev", False)
    assert result is not None
    # the CONNECT imports what the claim (or the copy) gives, synchronously (client_connect._claimed)
    result.add_done_callback(lambda done: here_engine.order.append(f"import {done.result() is not None}"))
    _deliver(scheduler, here_engine, here, holder_engine, holder)  # type: ignore[arg-type]  # lookup, copy
    here_engine.claim.set_result(None)  # the home did not answer the claim: the copy is the session
    assert here_engine.order == ["import True"]
    scheduler.run_soon()  # the next event-loop iteration, before the CONNACK (which waits for the
    # subscriptions' classes)
    assert here_engine.order == ["import True", "catch up dev from 72"]
    here_engine.on_client_connected("dev", True)
    assert here_engine.order == ["import True", "catch up dev from 72", "CONNACK dev"]  # once only
