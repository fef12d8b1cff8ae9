"""The simulated network between broker processes.

Links behave like the gRPC streams of ``broker.adapters.transport``: FIFO per direction, a link
to a peer comes up when a message is first sent to it, ``connected_peers`` lists the peers with a
link, and ``on_peer_down`` fires when a link breaks - at once (``down_notice_s``) when the peer's
process dies (its sockets are reset), after ``partition_notice_s`` (gRPC keep-alive) when a
partition cuts it. Items pass through the ``skipmq.v1`` wire codec, so the receiver gets fresh
objects exactly as over gRPC. On top of that, faults the real network only sometimes shows:
latency and jitter, loss, duplication and reordering (a reordered item overtakes the link's FIFO)
at configurable rates, and partitions (items across a cut are dropped).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from broker.adapters.transport.wire import decode_item, encode_item
from simulation.world import World


@dataclass(frozen=True)
class NetworkConfig:
    latency_s: float = 0.002
    jitter_s: float = 0.001
    loss_rate: float = 0.0
    duplicate_rate: float = 0.0
    reorder_rate: float = 0.0
    reorder_delay_s: float = 0.030
    down_notice_s: float = 0.050  # a dead peer's links break this long after the crash
    partition_notice_s: float = 10.0  # a link cut by a partition is declared down after this
    wire: bool = True  # items go through the skipmq.v1 wire codec


@dataclass
class NetworkStats:
    sent: int = 0
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    partitioned: int = 0
    to_dead_peer: int = 0


class Network:
    """Who is up, who can reach whom, and the links between broker processes."""

    def __init__(self, world: World, config: NetworkConfig) -> None:
        self.world = world
        self.config = config
        self.rng: random.Random = world.rng_for("network")
        self.stats = NetworkStats()
        self._endpoints: dict[str, PeerEndpoint] = {}
        self._generation: dict[str, int] = {}
        self._partition_of: dict[str, int] | None = None
        self._last_arrival: dict[tuple[str, str], float] = {}

    def endpoint(
        self, peer_id: str, on_receive: Callable[[str, object], None], on_peer_down: Callable[[str], None]
    ) -> PeerEndpoint:
        """A process with address ``peer_id`` starts: its transport."""
        self._generation[peer_id] = self._generation.get(peer_id, 0) + 1
        endpoint = PeerEndpoint(self, peer_id, self._generation[peer_id], on_receive, on_peer_down)
        self._endpoints[peer_id] = endpoint
        return endpoint

    def process_died(self, peer_id: str) -> None:
        """The process at ``peer_id`` is gone: every link to it breaks shortly after."""
        endpoint = self._endpoints.pop(peer_id, None)
        if endpoint is None:
            return
        endpoint.alive = False
        for other in list(self._endpoints.values()):
            if peer_id in other.links:
                self.world.after(self.config.down_notice_s, other.link_down, peer_id, endpoint.generation)

    def partition(self, groups: Iterable[Iterable[str]]) -> None:
        """Cut the network into ``groups`` (peers named in no group form one more group)."""
        partition_of: dict[str, int] = {}
        for index, group in enumerate(groups, start=1):
            for peer in group:
                partition_of[peer] = index
        self._partition_of = partition_of
        for endpoint in list(self._endpoints.values()):
            for peer in list(endpoint.links):
                if not self.reachable(endpoint.peer_id, peer):
                    generation = self._generation.get(peer, 0)
                    self.world.after(self.config.partition_notice_s, endpoint.link_cut, peer, generation)

    def heal(self) -> None:
        self._partition_of = None

    def reachable(self, a: str, b: str) -> bool:
        partition_of = self._partition_of
        return partition_of is None or partition_of.get(a, 0) == partition_of.get(b, 0)

    def transmit(self, src: PeerEndpoint, dest: str, item: object) -> None:
        stats = self.stats
        config = self.config
        rng = self.rng
        stats.sent += 1
        data: Any = encode_item(item) if config.wire else item
        if not self.reachable(src.peer_id, dest):
            stats.partitioned += 1
            return
        if config.loss_rate and rng.random() < config.loss_rate:
            stats.lost += 1
            return
        copies = 2 if config.duplicate_rate and rng.random() < config.duplicate_rate else 1
        stats.duplicated += copies - 1
        generation = self._generation.get(dest, 0)
        link = (src.peer_id, dest)
        for _ in range(copies):
            delay = config.latency_s + (config.jitter_s * rng.random() if config.jitter_s else 0.0)
            arrival = self.world.now + delay
            if config.reorder_rate and rng.random() < config.reorder_rate:
                stats.reordered += 1
                arrival += config.reorder_delay_s * rng.random()  # overtakes the link's FIFO
            else:
                arrival = max(arrival, self._last_arrival.get(link, 0.0))  # FIFO per direction
                self._last_arrival[link] = arrival
            self.world.at(arrival, self._arrive, src.peer_id, dest, generation, data)

    def _arrive(self, src: str, dest: str, generation: int, data: Any) -> None:
        endpoint = self._endpoints.get(dest)
        if endpoint is None or endpoint.generation != generation:
            self.stats.to_dead_peer += 1  # the process it was sent to died meanwhile
            return
        if not self.reachable(src, dest):
            self.stats.partitioned += 1
            return
        self.stats.delivered += 1
        item = decode_item(data) if self.config.wire else data
        endpoint.receive(src, item)


class PeerEndpoint:
    """One broker process's transport (``broker.cluster.engine.PeerTransport``)."""

    def __init__(
        self,
        network: Network,
        peer_id: str,
        generation: int,
        on_receive: Callable[[str, object], None],
        on_peer_down: Callable[[str], None],
    ) -> None:
        self.network = network
        self.peer_id = peer_id
        self.generation = generation
        self.alive = True
        self.links: set[str] = set()
        self._on_receive = on_receive
        self._on_peer_down = on_peer_down

    # ------------------------------------------------------------------ PeerTransport
    def send(self, peer: str, item: object) -> None:
        if not self.alive:
            return
        network = self.network
        if peer not in network._endpoints:
            network.stats.to_dead_peer += 1
            if peer in self.links:  # a dial that fails reports the peer down at once
                self.links.discard(peer)
                network.world.after(network.config.down_notice_s, self._report_down, peer)
            return
        if network.reachable(self.peer_id, peer):
            self.links.add(peer)
            network._endpoints[peer].links.add(self.peer_id)
        network.transmit(self, peer, item)

    def connected_peers(self) -> frozenset[str]:
        return frozenset(self.links)

    def drop_queued(self, peer: str) -> int:
        return 0

    # ------------------------------------------------------------------ network events
    def receive(self, src: str, item: object) -> None:
        if self.alive:
            self._on_receive(src, item)

    def link_down(self, peer: str, generation: int) -> None:
        """The process at ``peer`` (of ``generation``) died: the link broke."""
        if not self.alive or peer not in self.links:
            return
        current = self.network._endpoints.get(peer)
        if current is not None and current.generation != generation and self.peer_id in current.links:
            return  # already linked to its next incarnation
        self.links.discard(peer)
        self._on_peer_down(peer)

    def link_cut(self, peer: str, generation: int) -> None:
        """A partition cut the link to ``peer``: keep-alive gave up on it."""
        if not self.alive or peer not in self.links or self.network.reachable(self.peer_id, peer):
            return
        self.links.discard(peer)
        self._on_peer_down(peer)

    def _report_down(self, peer: str) -> None:
        if self.alive:
            self._on_peer_down(peer)
