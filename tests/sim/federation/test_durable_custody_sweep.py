"""Seeded simulation of durable custody (broker/federation/custody.py, store_port.py) across 60
sites: QoS 1 events are published at random sites; after each, a random broker is killed
(unsent frames lost) and restarted on its custody store - every third time the publisher,
before any of its frames left - with a new incarnation, its subscriptions restored as a
persistent session's are, re-linking to the parent it had. After the re-links every event
reaches every site with a matching subscription; sites that never restarted get it exactly
once (a restarted site may get a copy twice: its memory of delivered ids is not durable -
docs/federation.md). Nothing is left in custody or in any store. With an empty store at each
restart, events are lost (seen failing).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

from broker.federation.messages import Event
from broker.federation.router import PlaceSettings
from broker.federation.store_port import MemoryCustodyStore
from broker.mqtt.topics import topic_matches
from simulation.federation import FederationNet
from tests.sim.federation.test_federation_sweep import SITES, random_filter, random_topic


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_qos1_events_survive_crash_and_restart_of_any_broker_holding_them(seed: int) -> None:
    rng = random.Random(seed)
    settings = PlaceSettings("durable", ttl=64, probe_hops=8, custody_grace_s=30.0)
    net = FederationNet(settings)
    stores = {f"s{i:02d}": MemoryCustodyStore() for i in range(SITES)}
    names = sorted(stores)
    for name in names:
        net.add(name, store=stores[name])
    upstream = {name: rng.choice(names[:index]) for index, name in enumerate(names) if index}
    net.build_tree(upstream)
    root = names[0]
    subs: dict[str, list[str]] = {name: [] for name in names}
    for _ in range(80):
        site, topic_filter = rng.choice(names), random_filter(rng)
        subs[site].append(topic_filter)
        net.do(site, net.routers[site].subscribe(topic_filter))
    events: list[tuple[str, str, bytes]] = []
    restarted: set[str] = set()
    for serial in range(15):
        net.tick(settings.probe_interval_s)  # discovery known before the crash
        publisher = rng.choice(names)
        topic, payload = random_topic(rng), f"e{serial}".encode()
        events.append((publisher, topic, payload))
        net.apply(publisher, net.routers[publisher].publish(Event(topic, payload, qos=1), net.now))
        if serial % 3 == 0 and publisher != root:
            victim = publisher  # killed before its frames left: only its store has the event
        else:
            net.step(rng.randint(0, 40))  # the event is somewhere on its way
            victim = rng.choice(names[1:])
        parent = net.routers[victim].parent or upstream[victim]
        net.crash(victim, settle=False, drop_outgoing=True)  # kill -9: unsent frames are lost
        net.run()
        net.tick(settings.retry_interval_s)
        incarnation = dataclasses.replace(settings, incarnation=f"{victim}/{serial}")
        delivered_before = net.delivered[victim]  # delivered before the crash stays delivered
        router = net.add(victim, incarnation, store=stores[victim])
        net.delivered[victim] = delivered_before
        router.restore(net.now)
        for topic_filter in subs[victim]:
            net.apply(victim, router.subscribe(topic_filter))
        # back where it was in the tree (its configured upstream is its parent of the moment): a
        # subscriber that comes back elsewhere is the limit docs/federation.md names
        net.do(victim, router.set_upstream(parent, net.now))
        restarted.add(victim)
        for _ in range(3):
            net.tick(settings.retry_interval_s)
    for _ in range(8):  # re-routes done and acknowledged; custody given back
        net.tick(settings.custody_grace_s / 2)
    for publisher, topic, payload in events:
        wanted = {
            site
            for site, filters in subs.items()
            if site != publisher and any(topic_matches(f, topic) for f in filters)
        }
        got = Counter(
            site for site, log in net.delivered.items() for event in log if event.payload == payload
        )
        assert set(got) >= wanted, (payload, sorted(wanted - set(got)))
        twice = {site: count for site, count in got.items() if count > 1 and site not in restarted}
        assert not twice, (payload, twice)
    left = {name: router.custody_stats()["in_custody"] for name, router in net.routers.items()}
    assert not any(left.values()), left
    assert all(not store.rows for store in stores.values())
