"""Retained messages shared by the sites of a place (broker/federation/retained.py): a write
floods the tree whoever subscribes, every router stores it, last writer wins whatever the order
writes arrive in, deletions travel, and a (re-)linked router gets and gives what it missed."""

from __future__ import annotations

import dataclasses

from broker.federation.messages import Event
from broker.federation.router import PlaceSettings
from simulation.federation import FederationNet

PLACE = PlaceSettings("plant", retained_place=True)
TREE = {"regional": "cloud", "edge_a": "regional", "edge_b": "regional"}


def net_of(settings: PlaceSettings = PLACE) -> FederationNet:
    net = FederationNet(settings)
    for name in ("cloud", "regional", "edge_a", "edge_b"):
        net.add(name)
    net.build_tree(TREE)
    return net


def stored(net: FederationNet, topic: str) -> dict[str, bytes]:
    return {name: table[topic].payload for name, table in net.stored.items() if topic in table}


def retain(net: FederationNet, name: str, payload: bytes, wall_ms: int, *, settle: bool = True) -> None:
    event = Event("plant/cfg", payload, qos=1, retain=True)
    actions = net.routers[name].publish(event, net.now, wall_ms=wall_ms)
    net.apply(name, actions)
    if settle:
        net.run()


def test_a_retained_write_reaches_every_site_without_subscribers() -> None:
    net = net_of()
    retain(net, "edge_b", b"v1", 1_000)
    assert stored(net, "plant/cfg") == {"cloud": b"v1", "regional": b"v1", "edge_a": b"v1"}
    assert not net.delivered["edge_a"]  # stored, not delivered: nobody subscribes
    assert net.sent["Retained"] == 3  # each link once, never back


def test_concurrent_writes_converge_on_the_last_writer() -> None:
    net = net_of()
    retain(net, "cloud", b"cloud-1500", 1_500, settle=False)
    retain(net, "edge_a", b"edge-a-2000", 2_000, settle=False)
    retain(net, "edge_b", b"edge-b-1800", 1_800, settle=False)
    net.run()
    everywhere = {name: net.routers[name].retained.everything()[0].payload for name in net.routers}
    assert set(everywhere.values()) == {b"edge-a-2000"}, everywhere


def test_a_deletion_travels_and_a_relinked_site_catches_up() -> None:
    net = net_of()
    retain(net, "edge_b", b"v1", 1_000)
    net.crash("edge_a")
    retain(net, "edge_b", b"", 2_000)  # delete while edge A is away
    assert stored(net, "plant/cfg")["cloud"] == b""
    back = net.add("edge_a")
    back.retained.seed("plant/cfg", b"v1", 1)  # what its store held: the oldest version
    back.retained.seed("plant/only-a", b"a", 0)  # written while cut off: the others learn it
    net.do("edge_a", back.set_upstream("regional", net.now))
    assert stored(net, "plant/cfg")["edge_a"] == b""
    assert stored(net, "plant/only-a") == {"regional": b"a", "cloud": b"a", "edge_b": b"a"}


def test_with_retained_per_site_nothing_floods() -> None:
    net = net_of(dataclasses.replace(PLACE, retained_place=False))
    retain(net, "edge_b", b"v1", 1_000)
    assert net.sent["Retained"] == 0 and net.stored == {}
