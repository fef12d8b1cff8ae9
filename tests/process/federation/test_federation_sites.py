"""SIONet federation between real broker processes (seed 000 §3.7; docs/federation.md).

Sites: ``cloud`` <- ``regional`` <- ``edge_a``, ``edge_b`` (each its own ``skipmq`` process,
linked over the federation gRPC service), paho-mqtt clients. Checked: a subscription at one
edge draws events published at the other edge and at the cloud; counters on every router
(GET /federation) count sources and only transitions travel; unsubscribing stops the flow (the
publisher's site no longer forwards); TTL 2 keeps a filter one site away; kill -9 of the
regional broker: both edges re-link to the cloud (found by upstream discovery) and delivery
resumes; a gracefully stopped broker hands its child its parent (§3.7.3 leave); a will crosses
sites; two edge sites made of 2-broker clusters get every event once.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.support.cluster import wait_until
from tests.support.federation import HOST, WAIT_S, Client, Site, Sites, key
from tools.ports import free_ports

pytestmark = pytest.mark.slow

# the edge sites' cluster links in plaintext: this file tests federation, docs/security.md and
# tests/process/cluster/test_cluster_security.py cover the cluster's mTLS
INSECURE = ("--set", "cluster.insecure=true")


def test_three_levels_subscribe_unsubscribe_ttl_and_kill_of_the_regional_broker(sites: Sites) -> None:
    cloud = sites.start("cloud", description="plant telemetry")
    regional = sites.start("regional", cloud)
    edge_a = sites.start("edge_a", regional)
    edge_b = sites.start("edge_b", regional, ttl="2")
    assert edge_a.state()["topology"] == [cloud.address, regional.address, edge_a.address]
    clients = [Client(site, f"c-{site.name}") for site in (cloud, regional, edge_a, edge_b)]
    at_cloud, at_regional, at_a, at_b = clients
    try:
        # subscribe at edge A: the filter travels to regional, cloud and edge B
        at_a.subscribe("plant/+/temp")
        wait_until(lambda: key("plant/+/temp") in cloud.state()["received_from"][regional.address], WAIT_S)
        wait_until(lambda: key("plant/+/temp") in edge_b.state()["received_from"][regional.address], WAIT_S)
        at_b.publish("plant/b/temp", b"from edge b")
        at_cloud.publish("plant/c/temp", b"from cloud")
        assert sorted([at_a.received(), at_a.received()]) == [
            ("plant/b/temp", b"from edge b"),
            ("plant/c/temp", b"from cloud"),
        ]

        # a second subscriber of the same filter only counts: nothing more leaves edge A
        registers_before = edge_a.state()["sent"]["Register"]
        second = Client(edge_a, "c-edge-a-2")
        clients.append(second)
        second.subscribe("plant/+/temp")
        wait_until(lambda: edge_a.state()["counters"][regional.address].get(key("plant/+/temp")) == 2, WAIT_S)
        assert edge_a.state()["sent"]["Register"] == registers_before
        assert regional.state()["counters"][cloud.address] == {key("plant/+/temp"): 1}

        # unsubscribing both: 2 -> 1 stays local, 1 -> 0 unregisters everywhere
        second.unsubscribe("plant/+/temp")
        wait_until(lambda: edge_a.state()["counters"][regional.address].get(key("plant/+/temp")) == 1, WAIT_S)
        assert key("plant/+/temp") in regional.state()["received_from"][edge_a.address]
        at_a.unsubscribe("plant/+/temp")
        wait_until(lambda: not regional.state()["received_from"][edge_a.address], WAIT_S)
        wait_until(lambda: not edge_b.state()["received_from"][regional.address], WAIT_S)
        assert regional.state()["counters"][cloud.address] == {}
        forwarded_before = edge_b.state()["events_forwarded"]
        at_b.publish("plant/b/temp", b"nobody wants this")
        assert at_a.nothing_within(0.5)
        assert edge_b.state()["events_forwarded"] == forwarded_before  # it no longer leaves edge B

        # TTL 2 at edge B: its filter reaches regional only
        at_b.subscribe("alarm/#")
        wait_until(lambda: key("alarm/#") in regional.state()["received_from"][edge_b.address], WAIT_S)
        assert key("alarm/#") not in cloud.state()["received_from"][regional.address]
        assert key("alarm/#") not in edge_a.state()["received_from"][regional.address]
        at_cloud.publish("alarm/1", b"cloud, out of reach")
        at_a.publish("alarm/2", b"edge a, out of reach")
        at_regional.publish("alarm/3", b"regional, one hop")
        assert at_b.received() == ("alarm/3", b"regional, one hop")
        assert at_b.nothing_within(0.5)

        # kill -9 the regional broker: the edges re-link to the cloud, found by discovery
        at_a.subscribe("plant/+/temp")
        wait_until(lambda: key("plant/+/temp") in edge_b.state()["received_from"][regional.address], WAIT_S)
        assert edge_a.state()["upstream_known"] == {regional.address: 1, cloud.address: 2}
        assert regional.process is not None
        os.kill(regional.process.pid, signal.SIGKILL)
        for edge in (edge_a, edge_b):
            wait_until(lambda edge=edge: edge.state()["parent"] == cloud.address, WAIT_S, what="re-link")
        wait_until(lambda: key("plant/+/temp") in cloud.state()["received_from"][edge_a.address], WAIT_S)
        wait_until(lambda: key("plant/+/temp") in edge_b.state()["received_from"][cloud.address], WAIT_S)
        at_b.publish("plant/b/temp", b"after the crash")
        assert at_a.received() == ("plant/b/temp", b"after the crash")
        at_cloud.publish("plant/c/temp", b"cloud after the crash")
        assert at_a.received() == ("plant/c/temp", b"cloud after the crash")
    finally:
        for client in clients:
            client.close()


def test_a_leaving_broker_hands_its_children_its_parent(sites: Sites) -> None:
    cloud = sites.start("cloud")
    regional = sites.start("regional", cloud)
    edge = sites.start("edge", regional)
    at_cloud, at_edge = Client(cloud, "c-cloud"), Client(edge, "c-edge")
    try:
        # a will crosses sites like any publication: a mosquitto_sub killed with -9 at the edge
        at_cloud.subscribe("will/#")
        wait_until(lambda: key("will/#") in edge.state()["received_from"][regional.address], WAIT_S)
        doomed = subprocess.Popen(
            ["mosquitto_sub", "-p", str(edge.mqtt), "-t", "nothing", "-i", "doomed",
             "--will-topic", "will/doomed", "--will-payload", "gone", "--will-qos", "1"],
        )  # fmt: skip
        wait_until(lambda: '"doomed"' in edge.log.read_text(), WAIT_S, what="mosquitto_sub connected")
        doomed.kill()
        doomed.wait()
        assert at_cloud.received() == ("will/doomed", b"gone")

        at_edge.subscribe("$share/workers/jobs/#")  # a shared subscription stays in its site
        at_edge.subscribe("cmd/#")
        wait_until(lambda: key("cmd/#") in cloud.state()["received_from"][regional.address], WAIT_S)
        assert key("jobs/#") not in regional.state()["received_from"][edge.address]
        assert edge.state()["local_keys"] == [key("cmd/#")]
        assert regional.process is not None
        regional.process.send_signal(signal.SIGTERM)  # graceful: Leave(replacement = cloud)
        wait_until(lambda: edge.state()["parent"] == cloud.address, WAIT_S, what="re-link after leave")
        assert regional.process.wait(timeout=WAIT_S) == 0
        assert '"federation_neighbour_left"' in edge.log.read_text()
        wait_until(lambda: key("cmd/#") in cloud.state()["received_from"].get(edge.address, {}), WAIT_S)
        at_cloud.publish("cmd/reboot", b"after leave")
        assert at_edge.received() == ("cmd/reboot", b"after leave")
    finally:
        at_cloud.close()
        at_edge.close()


def test_two_edge_sites_of_two_clustered_brokers_each_get_every_event_once(sites: Sites) -> None:
    """Each edge site is a 2-broker SkipMQ cluster whose brokers both link to the regional broker
    with the same federation.site: events published in a site are delivered there by the
    cluster only, events from elsewhere by the federation only - each subscriber gets one copy,
    also after kill -9 of the regional broker, when all four edge brokers re-link to the cloud."""
    cloud = sites.start("cloud")
    regional = sites.start("regional", cloud)
    edge: dict[str, Site] = {}
    for site_name in ("a", "b"):
        first_port, second_port = free_ports(2)
        first = sites.start(
            f"{site_name}1",
            regional,
            args=("--cluster-port", str(first_port), *INSECURE),
            site=f"edge-{site_name}",
        )
        second = sites.start(
            f"{site_name}2",
            regional,
            args=("--cluster-port", str(second_port), "--join", f"{HOST}:{first_port}", *INSECURE),
            site=f"edge-{site_name}",
        )
        edge[f"{site_name}1"], edge[f"{site_name}2"] = first, second
    subscribers = {name: Client(edge[name], f"sub-{name}") for name in ("a1", "a2")}
    publishers = {name: Client(site, f"pub-{name}") for name, site in {**edge, "cloud": cloud}.items()}
    try:
        for client in subscribers.values():
            client.subscribe("plant/#")
        wait_until(lambda: key("plant/#") in cloud.state()["received_from"][regional.address], WAIT_S)
        for name in ("a1", "a2"):  # the cluster carries in-site events: a probe from the other broker
            other = "a2" if name == "a1" else "a1"
            wait_until(
                lambda name=name, other=other: _probe(publishers[other], subscribers[name]),
                WAIT_S,
                what="cluster",
            )
        for client in subscribers.values():  # drop the probes' copies
            while not client.nothing_within(0.3):
                pass
        # the site's own filters do not come back to it: the regional broker registers a2's
        # filter toward b1/b2, never toward a1 (same site), so an event published in site a with
        # nobody outside subscribing never leaves it (no out-and-back, no custody for it)
        wait_until(lambda: key("plant/#") in regional.state()["received_from"][edge["a2"].address], WAIT_S)
        b1 = edge["b1"].address
        wait_until(lambda: key("plant/#") in regional.state()["registered_toward"][b1], WAIT_S)
        for name in ("a1", "a2"):
            assert key("plant/#") not in regional.state()["registered_toward"][edge[name].address], name
            assert edge[name].state()["received_from"][regional.address] == {}, name
        before = {name: edge[name].state() for name in ("a1", "a2")}
        regional_in = regional.state()["events_in"]
        for publisher in ("b1", "b2", "cloud", "a1", "a2"):
            payload = f"from {publisher}".encode()
            publishers[publisher].publish("plant/x", payload)
            for name, client in subscribers.items():
                assert client.received() == ("plant/x", payload), (publisher, name)
            for name, client in subscribers.items():
                assert client.nothing_within(0.3), f"{name} got the event from {publisher} twice"
        assert regional.state()["events_in"] == regional_in + 3  # from b1, b2 and the cloud only
        for name in ("a1", "a2"):
            after = edge[name].state()
            forwarded = before[name]["events_forwarded"]
            assert after["events_forwarded"] == forwarded, f"{name} sent its site's event out"
            assert after["custody"]["held"] == before[name]["custody"]["held"], name

        # a subscriber outside the site: a1's events go out to it, and still not back into the site
        outside = Client(sites.sites["b1"], "sub-b1")
        outside.subscribe("plant/#")
        wait_until(lambda: key("plant/#") in edge["a1"].state()["received_from"][regional.address], WAIT_S)
        a2_in = edge["a2"].state()["events_in"]
        forwarded = edge["a1"].state()["events_forwarded"]
        publishers["a1"].publish("plant/out", b"from a1 to b1")
        assert outside.received() == ("plant/out", b"from a1 to b1")
        for name, client in subscribers.items():
            assert client.received() == ("plant/out", b"from a1 to b1"), name
            assert client.nothing_within(0.3), f"{name} got a1's event twice"
        assert edge["a1"].state()["events_forwarded"] == forwarded + 1
        assert edge["a2"].state()["events_in"] == a2_in, "a1's event came back into its site"
        outside.close()

        # kill -9 the regional broker: all four edge brokers re-link to the cloud
        assert regional.process is not None
        os.kill(regional.process.pid, signal.SIGKILL)
        for site in edge.values():
            wait_until(lambda site=site: site.state()["parent"] == cloud.address, WAIT_S, what="re-link")
        for name in ("a1", "a2"):
            wait_until(
                lambda name=name: key("plant/#") in cloud.state()["received_from"][edge[name].address], WAIT_S
            )
        for name in ("b1", "b2"):
            wait_until(
                lambda name=name: key("plant/#") in edge[name].state()["received_from"][cloud.address], WAIT_S
            )
        for publisher in ("b2", "cloud"):
            payload = f"from {publisher} after the crash".encode()
            publishers[publisher].publish("plant/y", payload)
            for name, client in subscribers.items():
                assert client.received() == ("plant/y", payload), (publisher, name)
            for name, client in subscribers.items():
                assert client.nothing_within(0.3), f"{name} got the event from {publisher} twice"
    finally:
        for client in [*subscribers.values(), *publishers.values()]:
            client.close()


def _probe(publisher: Client, subscriber: Client) -> bool:
    publisher.publish("plant/probe", b"probe")
    try:
        while True:
            if subscriber.received(0.3) == ("plant/probe", b"probe"):
                while not subscriber.nothing_within(0.3):
                    pass
                return True
    except queue.Empty:
        return False


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "leave"])
def test_qos1_events_acknowledged_at_an_edge_survive_kill_9_of_the_regional_broker(
    sites: Sites, stop: signal.Signals
) -> None:
    """A publisher at edge B sends QoS 1 events while the regional broker is killed with -9 (or
    stopped: it leaves the place) half-way: every event edge B acknowledged (PUBACK) reaches the
    subscriber at edge A, none twice (custody: held across the broken link, re-routed after the
    re-link through the cloud)."""
    cloud = sites.start("cloud")
    regional = sites.start("regional", cloud)
    edge_a = sites.start("edge_a", regional)
    edge_b = sites.start("edge_b", regional)
    at_a = Client(edge_a, "sub-a")
    publisher = paho.Client(CallbackAPIVersion.VERSION2, client_id="pub-b")
    publisher.connect(HOST, edge_b.mqtt)
    publisher.loop_start()
    acked: list[bytes] = []
    try:
        at_a.subscribe("plant/#")
        wait_until(lambda: key("plant/#") in edge_b.state()["received_from"][regional.address], WAIT_S)
        assert regional.process is not None
        for serial in range(400):
            payload = f"m{serial}".encode()
            info = publisher.publish("plant/line/1", payload, qos=1)
            info.wait_for_publish(timeout=WAIT_S)
            if info.is_published():
                acked.append(payload)
            if serial == 150:
                os.kill(regional.process.pid, stop)
            time.sleep(0.003)
        assert len(acked) == 400
        got: list[bytes] = []

        def all_arrived() -> bool:
            while True:
                try:
                    got.append(at_a.received(0.05)[1])
                except queue.Empty:
                    return set(acked) <= set(got)

        wait_until(all_arrived, 20.0, what="every acknowledged event at edge A")
        assert len(got) == len(set(got)), "an event was delivered twice"
        assert edge_a.state()["parent"] == cloud.address and edge_b.state()["parent"] == cloud.address
    finally:
        publisher.disconnect()
        publisher.loop_stop()
        at_a.close()


def test_type_only_routing_registers_the_class_and_matches_at_the_destination(sites: Sites) -> None:
    """federation.mode = type_only (vocabulary-concept routing, §3.7.2): the topic class travels,
    events of the class cross the links, the destination broker delivers only exact matches."""
    cloud = sites.start("cloud", mode="type_only")
    edge_a = sites.start("edge_a", cloud, mode="type_only")
    edge_b = sites.start("edge_b", cloud, mode="type_only")
    at_a, at_b = Client(edge_a, "sub-a"), Client(edge_b, "pub-b")
    try:
        at_a.subscribe("plant/a")
        at_a.subscribe("plant/+/x")  # same class: counted, not sent again
        wait_until(lambda: edge_a.state()["counters"][cloud.address] == {"t:=plant": 2}, WAIT_S)
        wait_until(lambda: "t:=plant" in edge_b.state()["received_from"][cloud.address], WAIT_S)
        assert edge_a.state()["sent"]["Register"] == 1
        forwarded = edge_b.state()["events_forwarded"]
        at_b.publish("plant/b", b"same class, no match")
        at_b.publish("plant/a", b"match")
        assert at_a.received() == ("plant/a", b"match")
        assert at_a.nothing_within(0.5)
        assert edge_b.state()["events_forwarded"] == forwarded + 2  # the wasted event crossed too
    finally:
        at_a.close()
        at_b.close()
