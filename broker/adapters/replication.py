"""Replicated durability in a broker process (``cluster.replicas`` > 1): the thin adapter that
builds ``broker.cluster.engine_replication.EngineReplication`` for the cluster runtime, gives it
the store (``broker.adapters.replication_store``) and the router (a gone origin's entries are
published again through it), and adds its gauges to /metrics (docs/cluster.md, Replicas).

Two observation points on the broker (wrapped, not replaced, as the simulation's adapter does):
the store's session writes mark the client ids they touch and, after each successful commit,
those sessions are given to the replication (``EngineReplication.sessions_committed``); a takeover
claim answered here first adopts a held copy of the client's session whose home is gone
(``Broker.hand_over``). The engine's stream acknowledgements wait for the sessions they cover to
be durable on N (``EngineReplication.gate_acks``).

``started_empty`` - the replication core's word for "this incarnation's earlier log exists only on
its holders now" - is read before the store is opened: the data directory holds no store file
yet (a wiped disk, a replaced machine, or a broker that never ran).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from broker.adapters.replication_store import SqliteReplicaStore
from broker.cluster.engine_replication import EngineReplication
from broker.cluster.engine_replication_sessions import UNCOPIED_REASONS

if TYPE_CHECKING:
    from broker.adapters.sqlite_store import Store
    from broker.cluster.engine import ClusterEngine
    from broker.config import BrokerConfig
    from broker.core.messages import Message
    from broker.core.ports import BrokerApi, Completion


def store_path(config: BrokerConfig) -> str | None:
    """The store file the broker opens (``broker.adapters.server.open_store``), None without one."""
    if not config.store.persistence:
        return None
    path = config.store.path
    if path == ":memory:":
        return None
    return path or os.path.join(config.data_dir, "skipmq.db")


def replication_for(config: BrokerConfig, engine: ClusterEngine) -> EngineReplication | None:
    """The replication of a broker with ``cluster.replicas`` > 1 (None with one copy). Called
    before the store is opened: ``started_empty`` is whether its file exists yet."""
    cluster = config.cluster
    if cluster.replicas <= 1:
        return None
    path = store_path(config)
    started_empty = path is None or not os.path.exists(path)
    return EngineReplication(
        engine, started_empty=started_empty, failover_after_s=float(cluster.replica_failover_s)
    )


# the store's writes of one persistent session (client id first), and of several
_SESSION_WRITES = (
    "upsert_session",
    "delete_session",
    "add_subscription",
    "remove_subscription",
    "enqueue",
    "set_inflight",
    "ack",
    "ack_many",
    "drop_oldest",
    "add_incoming_qos2",
    "remove_incoming_qos2",
    "set_will",  # the will and its delay are in the session copy
)


def observe_session_writes(store: Store, replication: EngineReplication) -> None:
    """After each commit of ``store``, the sessions it wrote go to ``replication``."""
    dirty: set[str] = set()

    def marking(write: Callable[..., Any]) -> Callable[..., Any]:
        def marked(client_id: str, *args: Any, **kwargs: Any) -> Any:
            dirty.add(client_id)
            return write(client_id, *args, **kwargs)

        return marked

    for name in _SESSION_WRITES:
        setattr(store, name, marking(getattr(store, name)))
    enqueue_many = store.enqueue_many

    def enqueue_many_marked(client_ids: list[str], *args: Any, **kwargs: Any) -> list[int]:
        dirty.update(client_ids)
        return enqueue_many(client_ids, *args, **kwargs)

    store.enqueue_many = enqueue_many_marked  # type: ignore[method-assign]
    commit = store.commit

    def commit_then_replicate() -> None:
        commit()  # raises on failure: the marks stay for the next commit
        if dirty:
            written = list(dirty)
            dirty.clear()
            replication.sessions_committed(written)

    store.commit = commit_then_replicate  # type: ignore[method-assign]


def start_replication(
    replication: EngineReplication, broker: BrokerApi, store: Store | None, contacts: list[str]
) -> None:
    """After the engine's start: the holder's copies in ``store``, the router for take-overs, the
    observation points (the store's session writes, the claims answered here, the stream acks)."""
    if store is not None:
        replication.store = SqliteReplicaStore(store)
        observe_session_writes(store, replication)
    hand_over = getattr(broker, "hand_over", None)
    if hand_over is not None:

        def adopt_then_hand_over(client_id: str, *, transfer: bool) -> tuple[bool, Any]:
            replication.claimed(client_id, from_elsewhere=True)  # a held copy of a gone home answers it
            return hand_over(client_id, transfer=transfer)

        broker.hand_over = adopt_then_hand_over  # type: ignore[method-assign]
    replication.gate_acks()
    router: Any = getattr(broker, "router", None)
    node_id = str(getattr(broker, "node_id", ""))
    if router is not None:

        def republish(message: Message) -> Completion[bool] | None:
            return router.publish(replace(message, origin=node_id), None).wait

        replication.republish = republish
    replication.start(contacts)


def with_replication_gauges(
    gauges: Callable[[], dict[str, int]], replication: EngineReplication
) -> Callable[[], dict[str, int]]:
    """The engine's gauges plus ``skipmq_cluster_replication_*``: ``under_replicated`` (entries of
    this broker's log not durable on N yet: their PUBACKs wait), ``held_entries`` / ``held_logs``
    (what it holds for other brokers), ``taken_over_entries`` (entries of gone brokers it
    published again), ``under_replicated_sessions`` (persistent sessions of this broker whose
    latest state is not on N brokers yet), ``held_sessions`` (copies of other brokers' sessions
    held here), ``adopted_sessions`` (sessions of gone brokers taken here), ``leaving`` (1 while
    this broker drains)."""

    def both() -> dict[str, int]:
        values = dict(gauges())
        for name, value in replication.gauges().items():
            values[f"replication_{name}"] = value
        values["replication_taken_over_entries"] = replication.taken_over_total
        values["replication_adopted_sessions"] = replication.adopted_total
        return values

    return both


class WithReplicationCounters(Collector):
    """The cluster's metric families plus the replication's counters: the SUBACKs and UNSUBACKs of
    persistent sessions that waited for the session's state on N brokers
    (``skipmq_cluster_replication_session_copy_waits_total``) and those that left without it, by
    reason (``skipmq_cluster_replication_session_acks_uncopied_total{reason}``: ``timed_out``
    after ``cluster.subscribe_wait_ms``, ``fewer_than_n_live``, ``stopping``)."""

    def __init__(self, cluster: Collector, replication: EngineReplication) -> None:
        self.cluster = cluster
        self.replication = replication

    def collect(self) -> Iterator[Metric]:
        yield from self.cluster.collect()
        replication = self.replication
        yield CounterMetricFamily(
            "skipmq_cluster_replication_session_copy_waits",
            "SUBACKs and UNSUBACKs of persistent sessions held until the session's state was on "
            "cluster.replicas brokers (seed 004's acknowledgement stage)",
            value=replication.copy_waits_total,
        )
        uncopied = CounterMetricFamily(
            "skipmq_cluster_replication_session_acks_uncopied",
            "SUBACKs and UNSUBACKs of persistent sessions sent before the session's state was on "
            "cluster.replicas brokers, by reason (timed_out: after cluster.subscribe_wait_ms; "
            "fewer_than_n_live: fewer than N brokers live; stopping: the broker stops)",
            labels=["reason"],
        )
        for reason in UNCOPIED_REASONS:
            uncopied.add_metric([reason], replication.acks_uncopied[reason])
        yield uncopied

    def describe(self) -> Iterator[Metric]:
        return self.collect()
