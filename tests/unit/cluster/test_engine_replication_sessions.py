"""The replication glue's session side (broker/cluster/engine_replication.py), scripted between two
brokers: a persistent session written by the home's store reaches its holder's table; the home's
stream acknowledgement (seed 004's REQ) that covers it leaves only once the holder accepted the
session (and at once while no holder is live: fewer than N); a holder whose home is gone adopts the
session when a claim for it arrives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.cluster.engine_replication import EngineReplication
from broker.cluster.messages import StreamAck, StreamPosition
from broker.cluster.stream_receiver import SendAck
from broker.core.messages import Message, OutEntry, SessionSnapshot, SubOptions
from tests.unit.cluster.test_engine_replication import _Broker, _deliver, _Engine, _Handle, _Scheduler, _Store


class _Later(_Scheduler):
    """The test scheduler, with the timers kept to be run by hand (the session flush)."""

    def __init__(self) -> None:
        super().__init__()
        self.later: list[tuple[Callable[..., object], tuple[Any, ...]]] = []

    def call_later(self, _delay_s: float, callback: Callable[..., object], *args: Any) -> Any:
        self.later.append((callback, args))
        return _Handle()

    def run_later(self) -> None:
        calls, self.later = self.later, []
        for callback, args in calls:
            callback(*args)


class _SessionBroker(_Broker):
    """A broker core with persistent sessions (what the glue reads and adopts into)."""

    def __init__(self, events: list[str]) -> None:
        super().__init__(events)
        self.sessions: dict[str, SessionSnapshot] = {}
        self.late: list[SessionSnapshot] = []

    def export_session(self, client_id: str) -> SessionSnapshot | None:
        return self.sessions.get(client_id)

    def has_session(self, client_id: str) -> bool:
        return client_id in self.sessions

    def receive_late_session(self, snapshot: SessionSnapshot, *, adopted: bool = False) -> None:
        self.late.append(snapshot)
        self.sessions[snapshot.client_id] = snapshot


class _SessionEngine(_Engine):
    def __init__(self, peer_id: str, scheduler: _Scheduler) -> None:
        super().__init__(peer_id, scheduler)
        self.broker = _SessionBroker(self.events)
        self.acks_sent: list[SendAck] = []
        self.takeover = None
        self._moved_positions: dict[str, Any] = {}

    def _receiver_actions(self, actions: list[Any]) -> None:
        self.acks_sent += [action for action in actions if isinstance(action, SendAck)]


def _snapshot(client_id: str, queued: int) -> SessionSnapshot:
    message = Message("t/a", b"x", 1, False, {}, None, "c", "pub")
    return SessionSnapshot(
        client_id=client_id,
        protocol_level=5,
        expiry_interval_s=600,
        username=None,
        subscriptions=[SubOptions("t/#", 1, match_filter="t/#")],
        pending=[OutEntry(message, 1, False, []) for _ in range(queued)],
        incoming_qos2=set(),
    )


def _pair() -> tuple[_Later, _SessionEngine, EngineReplication, _SessionEngine, EngineReplication]:
    scheduler = _Later()
    home_engine, holder_engine = _SessionEngine("a:1", scheduler), _SessionEngine("b:1", scheduler)
    home = EngineReplication(home_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
    holder = EngineReplication(holder_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
    home.store = _Store(home_engine.broker)
    holder.store = _Store(holder_engine.broker)
    home.start(["b:1"])
    holder.start(["a:1"])
    home.gate_acks()
    _deliver(scheduler, home_engine, home, holder_engine, holder)  # type: ignore[arg-type]  # the hellos
    return scheduler, home_engine, home, holder_engine, holder


ACK = SendAck("c:1", StreamAck((StreamPosition("c:1", "t", 7),)))


def test_the_stream_ack_covering_a_session_leaves_only_once_its_holder_has_the_session() -> None:
    scheduler, home_engine, home, holder_engine, holder = _pair()
    home_engine.broker.sessions["dev"] = _snapshot("dev", queued=3)
    home.sessions_committed(["dev"])  # the store committed the deliveries into the session
    home_engine._receiver_actions([ACK])  # (wrapped by gate_acks)
    assert home_engine.acks_sent == [], "the REQ left before the session was on 2 brokers"
    scheduler.run_later()  # the session flush
    assert home_engine.acks_sent == [] and home.gauges()["under_replicated_sessions"] == 1
    _deliver(scheduler, home_engine, home, holder_engine, holder)  # type: ignore[arg-type]
    assert home_engine.acks_sent == [ACK]
    assert home.gauges()["under_replicated_sessions"] == 0 and holder.gauges()["held_sessions"] == 1
    held = holder.store.load_sessions()
    assert [(key, snapshot) for key, snapshot, _positions in held] == [
        (("a:1", "inc-a:1"), _snapshot("dev", queued=3))
    ]
    # nothing changed since: the next ack is not held
    home_engine._receiver_actions([ACK])
    assert home_engine.acks_sent == [ACK, ACK]


def test_with_no_live_holder_the_ack_is_not_held() -> None:
    scheduler, home_engine, home, _holder_engine, _holder = _pair()
    home.on_peer_down("b:1")
    home_engine.broker.sessions["dev"] = _snapshot("dev", queued=1)
    home.sessions_committed(["dev"])
    home_engine._receiver_actions([ACK])
    assert home_engine.acks_sent == [ACK]  # fewer than N live: a second fault is not covered
    scheduler.run_later()
    assert home.gauges()["under_replicated_sessions"] == 1


def test_a_holder_adopts_the_session_of_a_gone_home_when_its_client_is_claimed() -> None:
    scheduler, home_engine, home, holder_engine, holder = _pair()
    home_engine.broker.sessions["dev"] = _snapshot("dev", queued=2)
    home.sessions_committed(["dev"])
    scheduler.run_later()
    _deliver(scheduler, home_engine, home, holder_engine, holder)  # type: ignore[arg-type]
    holder.claimed("dev")  # the home is live: its own session answers the claim
    assert holder_engine.broker.late == []
    holder.on_peer_down("a:1")
    holder.claimed("dev")
    assert holder_engine.broker.late == [_snapshot("dev", queued=2)]
    assert holder.gauges()["held_sessions"] == 0 and holder.adopted_total == 1
