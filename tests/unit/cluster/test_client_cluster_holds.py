"""Review of issue #4 (docs/cluster.md "When is the publisher acknowledged", "Session takeover"):
the connection side of the cluster port, ``broker/core/client.py`` (claims, acks held for the cluster).

A real broker (real listener, real SQLite store) with a small ClusterPort implementation whose
completions the test resolves by hand: the broker under test is real; the hook only stands for "the
cluster has not answered yet", which is exactly the state these cases are about.

* PUBREC/PUBACK held for the cluster count once against the MQTT 5 Receive Maximum (§4.9), not
  twice for QoS 2 (incoming_qos2 and the held queue).
* acknowledgements leave in PUBLISH order, also for a re-sent QoS 2 PUBLISH.
* a session handed over while its CONNECT was waiting is kept when that connection closes first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.adapters.server import ThreadedBroker
from broker.core.ports import Completion, NullCluster
from broker.core.session import Message, OutEntry, SessionSnapshot
from broker.mqtt.packets import MQTT_3_1_1, MQTT_5, Connect, Puback, Publish, Pubrec
from tests.support.core import RawClient, make_config

WAIT_S = 5.0


class HeldCluster(NullCluster):
    """Every QoS>0 publish and (when ``hold_claims``) every CONNECT waits for a future the test
    resolves, as the cluster runtime's would be until the other brokers answer."""

    __slots__ = ("claims", "hold_claims", "publish_waits")

    def __init__(self) -> None:
        self.publish_waits: list[Completion[bool]] = []
        self.claims: list[Completion[SessionSnapshot | None]] = []
        self.hold_claims = False

    def on_publish(self, message: Message, from_client_id: str | None) -> Completion[bool] | None:
        if not message.qos:
            return None
        wait: Completion[bool] = Completion()
        self.publish_waits.append(wait)
        return wait

    def before_attach(
        self, client_id: str, clean_start: bool, username: str | None = None
    ) -> Completion[SessionSnapshot | None] | None:
        if not self.hold_claims:
            return None
        claim: Completion[SessionSnapshot | None] = Completion()
        self.claims.append(claim)
        return claim


Start = Callable[..., tuple[ThreadedBroker, HeldCluster]]


@pytest.fixture
def start_held(tmp_path: Path) -> Iterator[Start]:
    started: list[ThreadedBroker] = []

    def _start(**overrides: Any) -> tuple[ThreadedBroker, HeldCluster]:
        cluster = HeldCluster()
        config = make_config(tmp_path / "data", **{k.replace("__", "."): v for k, v in overrides.items()})
        threaded = ThreadedBroker(config, cluster=cluster)
        threaded.start()
        started.append(threaded)
        return threaded, cluster

    yield _start
    for threaded in started:
        threaded.stop()


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _resolve(threaded: ThreadedBroker, completion: Completion[Any], result: Any) -> None:
    threaded.call(completion.set_result, result)


def test_held_qos2_acks_count_once_against_receive_maximum(start_held: Start) -> None:
    threaded, cluster = start_held(limits__receive_maximum=4)
    client = RawClient(threaded.ports["tcp"], protocol_level=MQTT_5)
    client.connect("rm-publisher")
    for packet_id in (1, 2, 3):  # three unacknowledged QoS 2 publishes: within a maximum of 4
        client.publish("rm/t", b"x", qos=2, packet_id=packet_id)
    _wait_for(lambda: len(cluster.publish_waits) == 3, "three cluster waits")
    client.expect_nothing()  # neither a PUBREC (held) nor a DISCONNECT 0x93
    for wait in cluster.publish_waits:
        _resolve(threaded, wait, True)
    assert [client.expect(Pubrec).packet_id for _ in range(3)] == [1, 2, 3]


def test_a_resent_qos2_publish_is_not_acknowledged_before_the_held_original(start_held: Start) -> None:
    threaded, cluster = start_held()
    client = RawClient(threaded.ports["tcp"])
    client.connect("dup-publisher")
    client.publish("dup/t", b"x", qos=2, packet_id=7)
    _wait_for(lambda: len(cluster.publish_waits) == 1, "the cluster wait")
    client.send(Publish("dup/t", b"x", qos=2, packet_id=7, dup=True))
    # the cluster has not confirmed storage: no PUBREC may leave yet, not even for the re-send
    client.expect_nothing(0.5)
    _resolve(threaded, cluster.publish_waits[0], True)
    assert client.expect(Pubrec).packet_id == 7
    assert client.expect(Pubrec).packet_id == 7
    assert len(cluster.publish_waits) == 1  # the re-send was not published again


def test_qos1_acks_leave_in_publish_order_across_held_and_immediate(start_held: Start) -> None:
    threaded, cluster = start_held()
    client = RawClient(threaded.ports["tcp"])
    client.connect("order-publisher")
    client.publish("ord/a", b"1", qos=1, packet_id=1)
    client.publish("ord/b", b"2", qos=1, packet_id=2)
    _wait_for(lambda: len(cluster.publish_waits) == 2, "two cluster waits")
    _resolve(threaded, cluster.publish_waits[1], True)
    client.expect_nothing()  # 2 is confirmed but 1 is not: 2 must not overtake it
    _resolve(threaded, cluster.publish_waits[0], True)
    assert [client.expect(Puback).packet_id for _ in range(2)] == [1, 2]


def test_a_session_handed_over_to_a_connect_that_closed_meanwhile_is_kept(start_held: Start) -> None:
    threaded, cluster = start_held()
    cluster.hold_claims = True
    client = RawClient(threaded.ports["tcp"])
    client.send(
        Connect(
            client_id="mover",
            protocol_level=MQTT_3_1_1,
            protocol_name="MQTT",
            clean_start=False,
            keep_alive_s=60,
        )
    )
    _wait_for(lambda: len(cluster.claims) == 1, "the session claim")
    client.close()  # the client gives up before the other broker answered
    time.sleep(0.3)
    queued = Message("moved/t", b"acknowledged elsewhere", qos=1, origin="other", publisher_id="p")
    snapshot = SessionSnapshot(
        client_id="mover",
        protocol_level=MQTT_3_1_1,
        expiry_interval_s=0xFFFFFFFF,
        username=None,
        subscriptions=[],
        pending=[OutEntry(queued, 1, False, [])],
        incoming_qos2=set(),
    )
    _resolve(threaded, cluster.claims[0], snapshot)  # the old broker already ended its copy
    _wait_for(lambda: threaded.call(threaded.broker.has_session, "mover"), "the imported session")
    cluster.hold_claims = False
    again = RawClient(threaded.ports["tcp"])
    connack = again.connect("mover", clean=False)
    assert connack.session_present
    publish = again.expect_publish()
    assert publish.payload == b"acknowledged elsewhere"
