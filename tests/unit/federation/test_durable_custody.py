"""Durable custody (custody.py, store_port.py): the events a router kept survive its crash.

Sites ``cloud`` (a subscriber) <- ``edge_b`` (a publisher). The cloud crashes; edge B's
publisher gets its QoS 1 events accepted while edge B is unlinked (custody holds them, and the
store); then edge B crashes too. The cloud comes back; edge B restarts on the same store,
restores, re-links: every held event reaches the cloud's subscriber, once. A restart without
the store's rows loses them (the difference this test would catch)."""

from __future__ import annotations

import dataclasses

import pytest

from broker.federation.messages import Event
from broker.federation.router import PlaceSettings
from broker.federation.store_port import MemoryCustodyStore
from simulation.federation import FederationNet

SETTINGS = PlaceSettings("plant", retry_interval_s=1.0, custody_grace_s=5.0)


@pytest.mark.parametrize("durable", [True, False], ids=["restored", "store-lost"])
def test_events_held_by_a_crashed_router_reach_the_subscriber_after_its_restart(durable: bool) -> None:
    net = FederationNet(SETTINGS)
    store = MemoryCustodyStore()
    net.add("cloud")
    net.add("edge_b", store=store)
    net.build_tree({"edge_b": "cloud"})
    net.do("cloud", net.routers["cloud"].subscribe("plant/#"))

    net.crash("cloud")
    events = [Event("plant/line/1", f"m{n}".encode(), qos=1) for n in range(5)]
    for event in events:
        net.do("edge_b", net.routers["edge_b"].publish(event, net.now))
    assert net.routers["edge_b"].custody_stats()["in_custody"] == 5
    assert len(store.rows) == 5  # what a broker's PUBACK waited for
    net.tick(1.0)

    net.crash("edge_b")
    net.add("cloud")
    net.do("cloud", net.routers["cloud"].subscribe("plant/#"))
    restarted = dataclasses.replace(SETTINGS, incarnation="edge_b/2")
    router = net.add("edge_b", restarted, store=store if durable else MemoryCustodyStore())
    assert router.restore(net.now) == (5 if durable else 0)
    net.do("edge_b", router.set_upstream("cloud", net.now))
    for _ in range(3):
        net.tick(1.0)
    got = [event.payload for event in net.delivered["cloud"]]
    if not durable:
        assert got == []
        return
    assert sorted(got) == sorted(event.payload for event in events)  # every one, once
    net.tick(10.0)  # acknowledged by the cloud, grace over: custody and store empty
    assert router.custody_stats()["in_custody"] == 0
    assert store.rows == {}
    assert len(net.delivered["cloud"]) == 5


def test_a_restored_event_is_not_delivered_twice_by_a_neighbour_that_had_it() -> None:
    """Edge B's event reached the cloud and edge A; edge B crashed before the cloud's
    acknowledgement: restored, it sends the event again; the cloud acknowledges the copy and
    delivers nothing twice."""
    net = FederationNet(SETTINGS)
    store = MemoryCustodyStore()
    net.add("cloud")
    net.add("edge_a")
    net.add("edge_b", store=store)
    net.build_tree({"edge_a": "cloud", "edge_b": "cloud"})
    net.do("edge_a", net.routers["edge_a"].subscribe("plant/#"))
    net.do("cloud", net.routers["cloud"].subscribe("plant/#"))
    net.apply("edge_b", net.routers["edge_b"].publish(Event("plant/x", b"once", qos=1), net.now))
    net.step(1)  # the event reached the cloud
    net.crash("edge_b", settle=False)  # before the cloud's acknowledgement came back
    net.run()
    assert [e.payload for e in net.delivered["cloud"]] == [b"once"]
    assert len(store.rows) == 1
    router = net.add("edge_b", dataclasses.replace(SETTINGS, incarnation="edge_b/2"), store=store)
    assert router.restore(net.now) == 1
    net.do("edge_b", router.set_upstream("cloud", net.now))
    net.tick(1.0)
    net.tick(10.0)
    assert [e.payload for e in net.delivered["cloud"]] == [b"once"]
    assert [e.payload for e in net.delivered["edge_a"]] == [b"once"]
    assert store.rows == {}


def test_an_unlinked_router_keeps_its_events_until_it_is_linked_again() -> None:
    """The grace of held events runs only once the router has a parent again: a site whose
    upstream is away for longer than ``custody_grace_s`` loses nothing."""
    net = FederationNet(SETTINGS)
    net.add("edge")
    net.do("edge", net.routers["edge"].set_upstream("cloud", net.now))  # not there yet
    net.do("edge", net.routers["edge"].publish(Event("plant/x", b"held", qos=1), net.now))
    for _ in range(6):
        net.tick(5.0)  # 30 s, six graces
    assert net.routers["edge"].custody_stats()["in_custody"] == 1
    net.add("cloud")
    net.do("cloud", net.routers["cloud"].subscribe("plant/#"))
    for _ in range(3):
        net.tick(1.0)
    assert net.routers["edge"].parent == "cloud"
    assert [e.payload for e in net.delivered["cloud"]] == [b"held"]
    net.tick(6.0)  # the grace runs from the re-link
    assert net.routers["edge"].custody_stats()["in_custody"] == 0
