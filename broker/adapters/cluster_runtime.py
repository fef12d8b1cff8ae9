"""The cluster runtime: runs the cluster engine (``broker.cluster.engine``) over gRPC on asyncio.

Thin by design: it starts the gRPC transport (``broker.adapters.transport``), binds the engine to
the core and the transport, resolves ``cluster.join`` (a DNS name may stand for several brokers,
e.g. a Kubernetes headless service), starts the engine, and on stop leaves the overlay and drains
the links. Everything the cluster decides happens in the engine and its pure cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import random
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from broker.adapters.class_snapshots import ClassSnapshotPublisher
from broker.adapters.cluster_store import SqliteClusterStore
from broker.adapters.origin_keys import link_identity_for, origin_checks_for
from broker.adapters.replication import (
    WithReplicationCounters,
    replication_for,
    start_replication,
    with_replication_gauges,
)
from broker.cluster.engine import ClusterEngine
from broker.cluster.engine_replication import ReplicatedClusterPort
from broker.cluster.origin_hello import DIAL_REFUSAL_REASONS
from broker.metrics import ClusterCollector

log = logging.getLogger("skipmq.cluster")

if TYPE_CHECKING:
    from broker.adapters.sqlite_store import Store
    from broker.config import BrokerConfig, ClusterConfig
    from broker.core.ports import BrokerApi, ClusterPort, Scheduler


class ClusterRuntime:
    """The engine of one broker process and its gRPC transport."""

    def __init__(
        self,
        config: BrokerConfig,
        scheduler: Scheduler,
        *,
        transport_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.cluster = config.cluster
        self.engine = ClusterEngine(
            config.cluster, scheduler, rng=random.Random(int.from_bytes(os.urandom(8), "big"))
        )
        # origin proofs (docs/security.md): signed with and checked against the cluster TLS files
        self.engine.origin_checks = origin_checks_for(config.cluster)
        self._transport_factory = transport_factory
        # replicated durability (cluster.replicas > 1): the engine with its replication log is the
        # core's cluster port; with 1 copy the engine itself (broker/cluster/engine_replication.py)
        self.replication = replication_for(config, self.engine)
        self.port: ClusterPort = (
            ReplicatedClusterPort(self.engine, self.replication)
            if self.replication is not None
            else self.engine
        )
        self.transport: Any = None
        self.http_port = 0  # announced to peers in Hello; see announce_http_port
        self.snapshots: ClassSnapshotPublisher | None = None

    async def start(self, broker: BrokerApi, store: Store | None = None) -> int:
        """Bind the cluster port, enter the overlay through ``cluster.join``; returns the port."""
        cluster = self.cluster
        advertise = cluster.advertise_host or (
            cluster.host if cluster.host not in ("0.0.0.0", "::", "") else socket.gethostname()
        )
        factory = self._transport_factory
        engine = self.engine
        replication = self.replication
        on_receive = replication.on_receive if replication is not None else engine.on_receive
        on_peer_down = replication.on_peer_down if replication is not None else engine.on_peer_down
        if factory is None:
            from broker.adapters.transport import GrpcTransport, TransportConfig

            self.transport = GrpcTransport(
                advertise_host=advertise,
                on_receive=on_receive,
                on_peer_down=on_peer_down,
                config=TransportConfig(
                    max_batch_items=cluster.max_batch_items,
                    max_message_bytes=cluster.max_frame_bytes,
                    runtime=cluster.link_runtime,
                ),
                tls=cluster_tls(cluster),
                identity=link_identity_for(cluster),  # who answers a dial (docs/security.md)
            )
            self.transport.http_port = self.http_port
        else:
            self.transport = factory(
                advertise_host=advertise, on_receive=on_receive, on_peer_down=on_peer_down
            )
        port = int(await self.transport.start(cluster.host, cluster.port))
        # the send log and stream positions live in the broker's store (none: persistence off)
        cluster_store = SqliteClusterStore(store) if store is not None else None
        engine.bind(broker, self.transport, self.transport.self_id, cluster_store)
        contacts = await resolve_contacts(cluster.join, engine.peer_id, port)
        engine.start(contacts)
        if replication is not None:
            start_replication(replication, broker, store, contacts)
        self.snapshots = ClassSnapshotPublisher(engine, broker, float(cluster.class_snapshot_interval_s))
        self.snapshots.start()
        return port

    async def stop(self) -> None:
        """Graceful leave: UNSUB/LEAVE every virtual node, drain the links, close."""
        if self.snapshots is not None:
            await self.snapshots.stop()
        if self.replication is not None:
            self.replication.stop()
        self.engine.stop()
        if self.transport is not None:
            await self.transport.stop(drain_timeout_s=2.0)

    def state(self) -> dict[str, Any]:
        state = self.engine.state()
        ports = getattr(self.transport, "peer_http_ports", None)
        state["peer_http_ports"] = ports() if ports is not None else {}
        return state

    def announce_http_port(self, port: int) -> None:
        """This broker's HTTP port, carried in the Hello of every link (``/cluster`` of its peers)."""
        self.http_port = port
        if self.transport is not None and hasattr(self.transport, "http_port"):
            self.transport.http_port = port

    def collector(self) -> Collector:
        engine = self.engine
        replication = self.replication
        gauges = engine.gauges if replication is None else with_replication_gauges(engine.gauges, replication)
        cluster = ClusterCollector(engine.stats, gauges, engine.overlay_figures, engine.sender_counters)
        links = _WithLinkMetrics(cluster, lambda: self.transport)
        return links if replication is None else WithReplicationCounters(links, replication)


class _WithLinkMetrics(Collector):
    """The cluster's metric families plus the links' own: ``skipmq_cluster_link_refused_total``
    (PeerLink streams this broker's transport refused before a link, by gRPC status code),
    ``skipmq_cluster_link_dial_refused_total{reason}`` and
    ``skipmq_cluster_link_frames_oversized_total``."""

    def __init__(self, cluster: Collector, transport: Callable[[], Any]) -> None:
        self.cluster = cluster
        self.transport = transport

    def collect(self) -> Iterator[Metric]:
        yield from self.cluster.collect()
        refused = CounterMetricFamily(
            "skipmq_cluster_link_refused",
            "Cluster link streams refused before the link was up (bad or unproven Hello), by gRPC status",
            labels=["code"],
        )
        for code, count in sorted(getattr(self.transport(), "refusals", {}).items()):
            refused.add_metric([code], count)
        yield refused
        dial_refused = CounterMetricFamily(
            "skipmq_cluster_link_dial_refused",
            "Dials refused because the answering broker's Hello did not prove the dialed peer id "
            "(no_proof, wrong_proof, wrong_peer_id; certificate: on link runtime h2, its TLS "
            "certificate did not name the dialed peer id; docs/security.md)",
            labels=["reason"],
        )
        refusals = getattr(self.transport(), "dial_refusals", {})
        for reason in sorted({*DIAL_REFUSAL_REASONS, *refusals}):  # (every reason from 0: rate() works)
            dial_refused.add_metric([reason], refusals.get(reason, 0))
        yield dial_refused
        yield CounterMetricFamily(
            "skipmq_cluster_link_unproven",
            "Dialed links taken without an answer to the Hello challenge (cluster.origin_proofs = optional)",
            value=getattr(self.transport(), "unproven_links", 0),
        )
        stats = getattr(self.transport(), "stats", None)
        if stats is not None and hasattr(stats, "frames_oversized"):
            yield CounterMetricFamily(
                "skipmq_cluster_link_frames_oversized",
                "Cluster link frames over cluster.max_frame_bytes that ended their stream with "
                "RESOURCE_EXHAUSTED, read from the length prefix before buffering (link runtime h2)",
                value=stats.frames_oversized,
            )


def cluster_tls(cluster: ClusterConfig) -> Any:
    """The mutual-TLS credentials of the cluster links, or None with ``cluster.insecure`` (warned
    about at every start: anyone who reaches the cluster port can act as a broker)."""
    if cluster.insecure:
        log.warning(
            "cluster.insecure is set: cluster links are plaintext and unauthenticated; anyone who "
            "reaches %s:%d can read and inject cluster traffic (docs/security.md)",
            cluster.host,
            cluster.port,
        )
        return None
    from broker.adapters.transport.tls import ClusterTls, TlsFiles

    return ClusterTls(TlsFiles(cluster.tls_ca_file, cluster.tls_cert_file, cluster.tls_key_file))


async def resolve_contacts(join: str, self_id: str, own_port: int | None = None) -> list[str]:
    """host:port entries; a DNS name resolving to several addresses gives several contacts.

    An entry that is this broker (``self_id``, or an address of this host with ``own_port``,
    e.g. a headless service that resolves to every pod) is listed once as ``self_id``: it makes
    this broker a seed that may found the cluster (overlay.formation)."""
    loop = asyncio.get_running_loop()
    local = await _local_addresses() if own_port is not None else set()
    contacts: list[str] = []
    for entry in (item.strip() for item in join.split(",")):
        if not entry:
            continue
        host, _, port_text = entry.rpartition(":")
        host = host.strip("[]")
        addresses = [host]
        with contextlib.suppress(OSError):
            infos = await loop.getaddrinfo(host, int(port_text), type=0, proto=6)
            resolved = sorted({str(info[4][0]) for info in infos if info[0].name in ("AF_INET", "AF_INET6")})
            if resolved and not _is_ip(host):
                addresses = resolved
        for address in addresses:
            peer = f"[{address}]:{port_text}" if ":" in address else f"{address}:{port_text}"
            if own_port is not None and port_text == str(own_port) and address in local:
                peer = self_id
            if peer not in contacts:
                contacts.append(peer)
    return contacts


async def _local_addresses() -> set[str]:
    """This host's addresses (loopback and those its name resolves to)."""
    addresses = {"127.0.0.1", "::1"}
    with contextlib.suppress(OSError):
        infos = await asyncio.get_running_loop().getaddrinfo(socket.gethostname(), None, proto=6)
        addresses.update(str(info[4][0]) for info in infos)
    return addresses


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
