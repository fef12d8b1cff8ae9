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

import json
import os
import queue
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.support.cluster import wait_until
from tests.support.paths import REPO_ROOT
from tools.ports import free_ports

pytestmark = pytest.mark.slow
HOST = "127.0.0.1"
WAIT_S = 10.0


@dataclass
class Site:
    name: str
    mqtt: int
    http: int
    fed: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.fed}"

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{HOST}:{self.http}/federation", timeout=2) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]


@dataclass
class Sites:
    tmp: Path
    sites: dict[str, Site] = field(default_factory=dict)

    def start(
        self, name: str, upstream: Site | None = None, *, args: tuple[str, ...] = (), **settings: str
    ) -> Site:
        mqtt, http, fed = free_ports(3)
        site = Site(name, mqtt, http, fed, self.tmp / f"{name}.log")
        command = [
            sys.executable, "-m", "broker", "--port", str(mqtt), "--http-port", str(http),
            "--data-dir", str(self.tmp / name), "--node-id", name, "--no-uvloop",
            "--set", "store.persistence=false", "--set", "sys.interval_s=0",
            "--set", "federation.enabled=true", "--set", "federation.place=plant",
            "--set", f"federation.port={fed}", "--set", "federation.retry_ms=300",
            "--set", "federation.probe_interval_ms=500",
        ]  # fmt: skip
        command += list(args)
        if upstream is not None:
            command += ["--set", f"federation.upstream={upstream.address}"]
        for key, value in settings.items():
            command += ["--set", f"federation.{key}={value}"]
        with site.log.open("wb") as log:
            site.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        self.sites[name] = site
        wait_until(lambda: _reachable(site), WAIT_S, what=f"{name} serving /federation")
        if upstream is not None:
            wait_until(lambda: site.state()["parent"] == upstream.address, WAIT_S, what=f"{name} linked")
        return site

    def close(self) -> None:
        for site in self.sites.values():
            if site.process is not None and site.process.poll() is None:
                site.process.send_signal(signal.SIGTERM)
        for site in self.sites.values():
            if site.process is not None:
                try:
                    site.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    site.process.kill()
                    site.process.wait()

    def tails(self) -> str:
        return "\n".join(
            f"--- {s.name}\n" + "".join(s.log.read_text().splitlines(True)[-15:]) for s in self.sites.values()
        )


def _reachable(site: Site) -> bool:
    try:
        site.state()
    except OSError:
        assert site.process is not None and site.process.poll() is None, site.log.read_text()[-2000:]
        return False
    return True


class Client:
    """A paho-mqtt client; received (topic, payload) pairs land in ``messages``."""

    def __init__(self, site: Site, client_id: str) -> None:
        self.messages: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        self.client.on_message = lambda _c, _u, msg: self.messages.put((msg.topic, msg.payload))
        self.client.connect(HOST, site.mqtt)
        self.client.loop_start()

    def subscribe(self, topic_filter: str) -> None:
        result, _mid = self.client.subscribe(topic_filter, qos=1)
        assert result == paho.MQTT_ERR_SUCCESS

    def unsubscribe(self, topic_filter: str) -> None:
        self.client.unsubscribe(topic_filter)

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=1).wait_for_publish(timeout=WAIT_S)

    def received(self, timeout_s: float = WAIT_S) -> tuple[str, bytes]:
        return self.messages.get(timeout=timeout_s)

    def nothing_within(self, seconds: float) -> bool:
        try:
            self.messages.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[Sites]:
    group = Sites(tmp_path)
    yield group
    group.close()
    print(group.tails())  # pytest shows it for a failing test only


def key(topic_filter: str) -> str:
    return "f:" + topic_filter


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

        at_edge.subscribe("cmd/#")
        wait_until(lambda: key("cmd/#") in cloud.state()["received_from"][regional.address], WAIT_S)
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
    cluster only, events from elsewhere by the federation only - each subscriber gets one copy."""
    cloud = sites.start("cloud")
    regional = sites.start("regional", cloud)
    edge: dict[str, Site] = {}
    for site_name in ("a", "b"):
        first_port, second_port = free_ports(2)
        first = sites.start(
            f"{site_name}1", regional, args=("--cluster-port", str(first_port)), site=f"edge-{site_name}"
        )
        second = sites.start(
            f"{site_name}2",
            regional,
            args=("--cluster-port", str(second_port), "--join", f"{HOST}:{first_port}"),
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
        for publisher in ("b1", "b2", "cloud", "a1", "a2"):
            payload = f"from {publisher}".encode()
            publishers[publisher].publish("plant/x", payload)
            for name, client in subscribers.items():
                assert client.received() == ("plant/x", payload), (publisher, name)
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
