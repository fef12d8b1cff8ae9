"""The replication glue (broker/cluster/engine_replication.py) between two brokers, scripted: the
records of one event-loop iteration merged per peer, the holder's ack sent only after the commit
of what it acknowledges (never when that commit fails), the PUBACKs released by the ack."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.cluster.engine_replication import EngineReplication, MemoryReplicaStore
from broker.cluster.replication_messages import ReplicaAck, ReplicaAppend
from broker.config import load_config
from broker.core.messages import Message


class _Scheduler:
    def __init__(self) -> None:
        self.now = 100.0
        self.soon: list[tuple[Callable[..., object], tuple[Any, ...]]] = []

    def time(self) -> float:
        return self.now

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        self.soon.append((callback, args))

    def call_later(self, _delay_s: float, _callback: Callable[..., object], *_args: Any) -> Any:
        return _Handle()

    def run_soon(self) -> None:  # one event-loop iteration's scheduled calls
        calls, self.soon = self.soon, []
        for callback, args in calls:
            callback(*args)


class _Handle:
    def cancel(self) -> None:
        return None


class _Broker:
    """Records the order of commits and sends (the holder's disk before its ack)."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.pending = False
        self.fail = False

    def store_pending(self) -> bool:
        return self.pending

    def commit_now(self) -> bool:
        self.events.append("commit" if not self.fail else "commit failed")
        self.pending = self.fail
        return not self.fail


class _Transport:
    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.sent: list[tuple[str, object]] = []

    def send(self, peer: str, item: object) -> None:
        self.events.append(f"send {type(item).__name__}")
        self.sent.append((peer, item))

    def connected_peers(self) -> frozenset[str]:
        return frozenset()


class _Engine:
    """What the glue reads of the cluster engine."""

    def __init__(self, peer_id: str, scheduler: _Scheduler) -> None:
        self.cluster = load_config(env={}, overrides={"cluster.replicas": 2}).cluster
        self.scheduler = scheduler
        self.peer_id = peer_id
        self.incarnation = f"inc-{peer_id}"
        self.retransmit_s = 1.0
        self.events: list[str] = []
        self.broker = _Broker(self.events)
        self.transport = _Transport(self.events)
        self.sender = None
        self.received: list[object] = []

    def on_receive(self, sender: str, item: object) -> None:
        self.received.append(item)

    def on_peer_down(self, peer: str) -> None:
        return None

    def _known_peers(self) -> set[str]:
        return set()


class _Store(MemoryReplicaStore):
    def __init__(self, broker: _Broker) -> None:
        super().__init__()
        self.broker = broker

    def persist(self, key: Any, first_seq: int, messages: tuple[Message, ...]) -> None:
        super().persist(key, first_seq, messages)
        self.broker.pending = True  # in the open transaction until the commit


def _pair() -> tuple[_Scheduler, _Engine, EngineReplication, _Engine, EngineReplication]:
    scheduler = _Scheduler()
    origin_engine, holder_engine = _Engine("a:1", scheduler), _Engine("b:1", scheduler)
    origin = EngineReplication(origin_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
    holder = EngineReplication(holder_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
    holder.store = _Store(holder_engine.broker)
    origin.start(["b:1"])
    holder.start(["a:1"])
    _deliver(scheduler, origin_engine, origin, holder_engine, holder)  # the hellos
    return scheduler, origin_engine, origin, holder_engine, holder


def _deliver(
    scheduler: _Scheduler, a_engine: _Engine, a: EngineReplication, b_engine: _Engine, b: EngineReplication
) -> None:
    """Run the iterations and carry every record sent until nothing moves."""
    for _ in range(10):
        scheduler.run_soon()
        moved = False
        for engine, other in ((a_engine, b), (b_engine, a)):
            sent, engine.transport.sent = engine.transport.sent, []
            for _peer, item in sent:
                other.on_receive(engine.peer_id, item)
                moved = True
        if not moved and not scheduler.soon:
            return


def test_one_iterations_publishes_go_as_one_append_and_the_ack_leaves_after_the_holders_commit() -> None:
    scheduler, origin_engine, origin, holder_engine, holder = _pair()
    holder_engine.events.clear()
    messages = [Message(f"t/{n}", b"x", 1, False, {}, None, "a", "pub") for n in range(3)]
    waits = [origin.append(message, []) for message in messages]
    assert not any(wait.done() for wait in waits)
    scheduler.run_soon()  # the origin's outbox: one append for the three
    appends = [item for _peer, item in origin_engine.transport.sent if isinstance(item, ReplicaAppend)]
    assert len(appends) == 1 and len(appends[0].messages) == 3 and appends[0].first_seq == 1
    _deliver(scheduler, origin_engine, origin, holder_engine, holder)
    assert holder_engine.events.index("commit") < holder_engine.events.index("send ReplicaAck")
    assert all(wait.done() for wait in waits)  # durable on 2: the PUBACKs may go
    assert holder.store.load() == [(("a:1", "inc-a:1"), n + 1, message) for n, message in enumerate(messages)]
    assert origin.gauges()["under_replicated"] == 0 and holder.gauges()["held_entries"] == 3


def test_a_failed_commit_at_the_holder_sends_no_ack_and_the_puback_waits() -> None:
    scheduler, origin_engine, origin, holder_engine, holder = _pair()
    holder_engine.broker.fail = True
    wait = origin.append(Message("t", b"x", 1, False, {}, None, "a", "pub"), [])
    _deliver(scheduler, origin_engine, origin, holder_engine, holder)
    assert "commit failed" in holder_engine.events
    assert not [item for _peer, item in holder_engine.transport.sent if isinstance(item, ReplicaAck)]
    assert not wait.done() and origin.gauges()["under_replicated"] == 1


def test_other_items_go_to_the_engine() -> None:
    _scheduler, origin_engine, origin, _holder_engine, _holder = _pair()
    origin.on_receive("b:1", "an overlay message")
    assert origin_engine.received == ["an overlay message"]
