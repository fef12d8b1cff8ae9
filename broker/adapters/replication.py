"""Replicated durability in a broker process (``cluster.replicas`` > 1): the thin adapter that
builds ``broker.cluster.engine_replication.EngineReplication`` for the cluster runtime, gives it
the store (``broker.adapters.replication_store``) and the router (a gone origin's entries are
published again through it), and adds its gauges to /metrics (docs/cluster.md, Replicas).

``started_empty`` - the replication core's word for "this incarnation's earlier log exists only on
its holders now" - is read before the store is opened: the data directory holds no store file
yet (a wiped disk, a replaced machine, or a broker that never ran).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from broker.adapters.replication_store import SqliteReplicaStore
from broker.cluster.engine_replication import EngineReplication

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


def start_replication(
    replication: EngineReplication, broker: BrokerApi, store: Store | None, contacts: list[str]
) -> None:
    """After the engine's start: the holder's copies in ``store``, the router for take-overs."""
    if store is not None:
        replication.store = SqliteReplicaStore(store)
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
    published again)."""

    def both() -> dict[str, int]:
        values = dict(gauges())
        for name, value in replication.gauges().items():
            values[f"replication_{name}"] = value
        values["replication_taken_over_entries"] = replication.taken_over_total
        return values

    return both
