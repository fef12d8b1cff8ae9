"""The overlay's own figures for ``/metrics``, read from its state at scrape time (issue #14).

Pure: the overlay node's routing tables (seed 003 §3.3-§3.4, FRT), the brokers known to subscribe
each class, and the peers the failure detector and the transport watch go in; plain numbers come
out. Nothing here runs per message: ``broker.metrics.ClusterCollector`` calls it when Prometheus
scrapes, at a cost linear in the virtual nodes' table entries (at most L+1 each) and the peers.

* Routing-table composition (§3.4): per entry, ``sticky`` (a level-0 neighbour, never filtered),
  ``same_class_subscriber`` (a subscriber of the virtual node's own topic class, what ≤FRT keeps
  for one-hop delivery) or ``other``.
* Published classes by delivery (§3.3): a class this broker publishes is ``one_hop`` when its
  publisher virtual node's table holds every other broker known to subscribe the class (each gets
  the PUB directly), ``multi_hop`` when it misses some (they are reached through other brokers),
  ``no_subscribers`` when no other broker subscribes it (publishes of it are suppressed, seed 003
  §3.2 exhaust data, unless this broker's own clients subscribe).
* Peer suspicion: a peer is suspected while the overlay's failure detector declared it dead (no
  PONG for ``cluster.failure_timeout_ms``) or the transport reported it unreachable, and it has not
  spoken since.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from overlay.keys import PUBLISHER, make_key
from overlay.node import OverlayNode


@dataclass(slots=True)
class OverlayFigures:
    routing_entries: dict[str, int] = field(
        default_factory=lambda: {"sticky": 0, "same_class_subscriber": 0, "other": 0}
    )
    published_classes: dict[str, int] = field(
        default_factory=lambda: {"one_hop": 0, "multi_hop": 0, "no_subscribers": 0}
    )
    peer_suspected: dict[str, int] = field(default_factory=dict)  # peer -> 1 suspected, 0 not
    peer_silence_s: dict[str, float] = field(default_factory=dict)  # watched peer -> seconds silent


def routing_entries(node: OverlayNode) -> dict[str, int]:
    """Entries of every virtual node's routing table, by kind (each entry counted once, as sticky
    when it is a level-0 neighbour)."""
    counts = {"sticky": 0, "same_class_subscriber": 0, "other": 0}
    for vnode in node.vnodes.values():
        table = vnode.table
        sticky = table.sticky_keys()
        sticky_subs = sum(1 for key in sticky if table.is_sub(key))
        counts["sticky"] += len(sticky)
        counts["same_class_subscriber"] += table.sub_count - sticky_subs
        counts["other"] += len(table) - len(sticky) - (table.sub_count - sticky_subs)
    return counts


def published_classes(
    node: OverlayNode, classes: Iterable[str], subscriber_peers: Callable[[str], Iterable[str]]
) -> dict[str, int]:
    """Classes this broker publishes, by how the overlay delivers them (see the module docstring);
    ``subscriber_peers(cls)``: the other brokers known to subscribe ``cls``."""
    counts = {"one_hop": 0, "multi_hop": 0, "no_subscribers": 0}
    peer = node.peer_id
    for cls in classes:
        remote = set(subscriber_peers(cls))
        remote.discard(peer)
        if not remote:
            counts["no_subscribers"] += 1
            continue
        vnode = node.vnodes.get(make_key(cls, PUBLISHER, peer))
        if vnode is None:  # not (yet) in the class's publisher range: routed by others
            counts["multi_hop"] += 1
            continue
        table = vnode.table
        known = {key[2] for key in table if table.is_sub(key)}
        counts["one_hop" if remote <= known else "multi_hop"] += 1
    return counts


def peer_suspicion(
    node: OverlayNode, now: float, peers: Iterable[str], unreachable: Mapping[str, float]
) -> tuple[dict[str, int], dict[str, float]]:
    """(peer -> 1 if suspected else 0, watched peer -> seconds since last heard) for ``peers``
    and every peer the failure detector watches or declared dead."""
    everyone = set(peers) | set(node.last_heard) | set(node.dead) | set(unreachable)
    everyone.discard(node.peer_id)
    suspected = {peer: int(peer in node.dead or peer in unreachable) for peer in sorted(everyone)}
    silence = {peer: max(0.0, now - heard) for peer, heard in node.last_heard.items() if peer != node.peer_id}
    return suspected, silence
