"""Durable custody between real broker processes (docs/federation.md "Delivery semantics").

``cloud`` (a subscriber) <- ``edge_b`` (a publisher, with its SQLite store). The cloud is killed
with -9; edge B's publisher keeps publishing QoS 1 events, each acknowledged (PUBACK) by edge B
while it has no link: they are in edge B's custody, and in its store. Then edge B - the broker
that relays its site's events into the place, and the only one holding them - is killed with
-9 too. The cloud restarts and its subscriber comes back; edge B restarts on the same data
directory, restores its custody, re-links and re-routes: every event edge B acknowledged
reaches the cloud's subscriber, none twice. With custody in memory only
(``store.persistence=false`` at edge B) the same run loses all of them.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sqlite3
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.support.cluster import wait_until
from tests.support.federation import HOST, WAIT_S, Client, Sites, key

pytestmark = pytest.mark.slow

EVENTS = 100


def custody_rows(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return int(db.execute("SELECT COUNT(*) FROM federation_custody").fetchone()[0])


def test_events_acknowledged_by_an_edge_survive_kill_9_of_that_edge_and_of_its_upstream(
    sites: Sites,
) -> None:
    cloud = sites.start("cloud")
    edge_b = sites.start("edge_b", cloud, args=("--set", "store.persistence=true"))
    at_cloud = Client(cloud, "sub-cloud")
    at_cloud.subscribe("plant/#")
    wait_until(lambda: key("plant/#") in edge_b.state()["received_from"][cloud.address], WAIT_S)
    assert cloud.process is not None and edge_b.process is not None
    os.kill(cloud.process.pid, signal.SIGKILL)
    cloud.process.wait()
    at_cloud.close()

    publisher = paho.Client(CallbackAPIVersion.VERSION2, client_id="pub-b")
    publisher.connect(HOST, edge_b.mqtt)
    publisher.loop_start()
    acked: list[bytes] = []
    try:
        for serial in range(EVENTS):
            payload = f"m{serial}".encode()
            info = publisher.publish("plant/line/1", payload, qos=1)
            info.wait_for_publish(timeout=WAIT_S)
            if info.is_published():
                acked.append(payload)
    finally:
        publisher.disconnect()
        publisher.loop_stop()
    assert len(acked) == EVENTS
    assert edge_b.state()["custody"]["in_custody"] == EVENTS
    os.kill(edge_b.process.pid, signal.SIGKILL)
    edge_b.process.wait()

    sites.restart(cloud)
    at_cloud = Client(cloud, "sub-cloud-2")
    try:
        at_cloud.subscribe("plant/#")
        wait_until(lambda: key("plant/#") in cloud.state()["local_keys"], WAIT_S)
        sites.restart(edge_b, cloud)
        assert edge_b.state()["custody"]["restored"] == EVENTS
        got: list[bytes] = []

        def all_arrived() -> bool:
            while True:
                try:
                    got.append(at_cloud.received(0.05)[1])
                except queue.Empty:
                    return set(acked) <= set(got)

        wait_until(all_arrived, 20.0, what="every event edge B acknowledged, at the cloud")
        assert len(got) == len(set(got)), "an event was delivered twice"
        wait_until(lambda: edge_b.state()["custody"]["in_custody"] == 0, 20.0, what="edge B's custody empty")
        # and its rows are gone from the store (written by an idle broker's next tick)
        wait_until(lambda: custody_rows(sites.tmp / "edge_b" / "skipmq.db") == 0, WAIT_S, what="rows deleted")
    finally:
        at_cloud.close()
