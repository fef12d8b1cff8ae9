"""Retained messages across sites between real broker processes, ``federation.retained =
"place"`` (broker/federation/retained.py; docs/federation.md): a retained publish at edge B is
stored by the cloud and edge A although nobody there subscribes; a paho client subscribing at
edge A afterwards gets it from its own broker, retain flag set; a deletion (empty retained
payload) travels too. With the default ``"site"`` a later subscriber at another site gets
nothing (the difference the first check would catch)."""

from __future__ import annotations

import queue

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.support.cluster import wait_until
from tests.support.federation import HOST, WAIT_S, Client, Site, Sites

pytestmark = pytest.mark.slow


def late_subscriber(site: Site, client_id: str, topic_filter: str) -> queue.Queue[tuple[str, bytes, int]]:
    """Connect, subscribe, and return what arrives within a short wait: (topic, payload, retain)."""
    got: queue.Queue[tuple[str, bytes, int]] = queue.Queue()
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    client.on_message = lambda _c, _u, msg: got.put((msg.topic, msg.payload, int(msg.retain)))
    client.connect(HOST, site.mqtt)
    client.loop_start()
    try:
        client.subscribe(topic_filter, qos=1)
        try:
            first = got.get(timeout=2.0)
        except queue.Empty:
            return got
        got.put(first)
        return got
    finally:
        client.disconnect()
        client.loop_stop()


@pytest.mark.parametrize("scope", ["place", "site"])
def test_a_retained_message_published_at_one_edge_is_served_at_the_other(sites: Sites, scope: str) -> None:
    cloud = sites.start("cloud", retained=scope)
    edge_a = sites.start("edge_a", cloud, retained=scope)
    edge_b = sites.start("edge_b", cloud, retained=scope)
    publisher = Client(edge_b, "pub-b")
    try:
        publisher.client.publish("plant/line/cfg", b"speed=3", qos=1, retain=True).wait_for_publish(WAIT_S)
        if scope == "site":
            got = late_subscriber(edge_a, "late-a", "plant/+/cfg")
            assert got.empty()  # retained stays at edge B
            return
        wait_until(lambda: edge_a.state()["retained_known"] == 1, WAIT_S, what="edge A stored it")
        for site in (edge_a, cloud):
            got = late_subscriber(site, f"late-{site.name}", "plant/+/cfg")
            assert got.get_nowait() == ("plant/line/cfg", b"speed=3", 1)

        publisher.client.publish("plant/line/cfg", b"", qos=1, retain=True).wait_for_publish(WAIT_S)

        def deleted() -> bool:
            return late_subscriber(edge_a, "late-a-2", "plant/+/cfg").empty()

        wait_until(deleted, WAIT_S, what="the deletion at edge A")
    finally:
        publisher.close()
