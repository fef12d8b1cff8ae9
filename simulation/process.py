"""One simulated SkipMQ broker process: the real broker core, cluster engine and SQLite store.

:class:`SimBroker` wires exactly what ``broker.adapters.server.BrokerServer`` wires in a real
process - ``broker.core.broker.Broker`` with its cluster port ``broker.cluster.engine.ClusterEngine``
(overlay node of seed 003 and the pure cluster cores), a real ``broker.adapters.sqlite_store.Store``
on a file in the broker's data directory, and ``broker.auth`` - but on the simulation's clock
(:class:`simulation.world.ProcessScheduler`) and network (:class:`simulation.network.PeerEndpoint`)
instead of asyncio and gRPC. Nothing of the broker is replaced or patched.

:meth:`SimBroker.crash` is ``kill -9``: the process's timers stop, its links break, its client
sockets are reset and whatever the store had not committed is gone (the SQLite connection is closed
without a commit, which rolls the open transaction back). A restart is a new :class:`SimBroker` on
the same data directory and peer id - a new incarnation that restores its store and rejoins.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from broker.adapters.cluster_store import SqliteClusterStore
from broker.adapters.sqlite_store import Store
from broker.auth.from_config import build_access
from broker.cluster.engine import ClusterEngine
from broker.config import load_config
from broker.core.broker import Broker
from simulation.world import ProcessScheduler, World

if TYPE_CHECKING:
    from broker.core.client import ClientConnection
    from broker.core.ports import ClusterPort
    from simulation.clients import SimSocket
    from simulation.network import Network, PeerEndpoint

# Faster failure detection and shorter waits than the defaults keep virtual runs short; the same
# keys a real cluster is tuned with (docs/configuration.md).
DEFAULT_SETTINGS: dict[str, Any] = {
    "cluster.ping_interval_ms": 500,
    "cluster.failure_timeout_ms": 2000,
    "sys.interval_s": 0,
    "uvloop": False,
}


class SimBroker:
    """A broker process at ``peer_id`` (its cluster address) with its data in ``data_dir``."""

    def __init__(
        self,
        world: World,
        network: Network,
        peer_id: str,
        data_dir: str,
        *,
        incarnation: int = 1,
        settings: dict[str, Any] | None = None,
        clock_offset_s: float = 0.0,
    ) -> None:
        self.world = world
        self.peer_id = peer_id
        self.data_dir = data_dir
        self.incarnation = incarnation
        self.alive = True
        values: dict[str, Any] = {
            **DEFAULT_SETTINGS,
            "node_id": peer_id,
            "data_dir": data_dir,
            "cluster.enabled": True,
            **(settings or {}),
        }
        self.config = config = load_config(None, env={}, overrides=values)
        self.scheduler = ProcessScheduler(world, clock_offset_s=clock_offset_s)
        os.makedirs(data_dir, exist_ok=True)
        self.store = Store(os.path.join(data_dir, "skipmq.db"), synchronous=config.store.synchronous)
        self.engine = ClusterEngine(
            config.cluster, self.scheduler, rng=world.rng_for("engine", peer_id, incarnation)
        )
        authenticator, acl = build_access(config.auth)
        self.broker = Broker(
            config,
            self.scheduler,
            authenticator=authenticator,
            acl=acl,
            store=self.store,
            cluster=self._cluster_port(),
            rng=world.rng_for("broker", peer_id, incarnation),
        )
        # insertion-ordered (not a set of objects hashed by address): a crash resets the client
        # sockets in the same order in every run, so a seed replays exactly
        self.sockets: dict[SimSocket, None] = {}
        self.endpoint: PeerEndpoint = network.endpoint(peer_id, self._on_receive, self._on_peer_down)
        self.network = network

    def _cluster_port(self) -> ClusterPort:
        """The core's cluster port: the engine itself (a subclass may wrap it:
        ``simulation.replication``)."""
        return self.engine

    def start(self, contacts: list[str]) -> None:
        """Restore the store, enter the overlay through ``contacts`` (the start-up order of
        ``BrokerServer.start``: core first, then the cluster, then clients may connect)."""
        self.broker.start()
        self.engine.bind(self.broker, self.endpoint, self.peer_id, SqliteClusterStore(self.store))
        self.engine.start(contacts)

    def accept(self, socket: SimSocket) -> ClientConnection | None:
        """A client socket connects (what the TCP listener does for an accepted socket)."""
        if not self.alive:
            return None
        conn = self.broker.new_client(socket, "tcp", peer=socket.name)
        if conn is not None:
            self.sockets[socket] = None
        return conn

    # ------------------------------------------------------------------ network callbacks
    def _on_receive(self, sender: str, item: object) -> None:
        if self.alive:
            self.engine.on_receive(sender, item)

    def _on_peer_down(self, peer: str) -> None:
        if self.alive:
            self.engine.on_peer_down(peer)

    # ------------------------------------------------------------------ faults
    def crash(self) -> None:
        """``kill -9``: nothing more runs; uncommitted store work is lost; sockets are reset."""
        if not self.alive:
            return
        self.alive = False
        self.scheduler.kill()
        self.network.process_died(self.peer_id)
        self.store.abandon()  # no commit: SQLite rolls the open transaction back
        for socket in list(self.sockets):
            socket.reset()
        self.sockets.clear()

    # ------------------------------------------------------------------ what the checkers read
    def retained(self) -> dict[str, bytes]:
        return {message.topic: message.payload for message in self.broker.retained_messages()}

    def connected(self, client_id: str) -> bool:
        return self.alive and self.broker.client_connected(client_id)
