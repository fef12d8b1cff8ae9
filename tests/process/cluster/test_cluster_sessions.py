"""Sessions across brokers: takeover, kicking a live duplicate client id, wills (docs/cluster.md).

MQTT 3.1.1 §3.1.2.4 / MQTT 5 §3.1.2.4 (session present, stored QoS 1/2 messages), §3.1.4-2 /
v5 §3.1.4 (a second connection with the same client id disconnects the first; v5 reason
0x8E "session taken over"), §3.1.2.5 (the will on an abnormal close) — when the two
connections, or the will and its subscribers, are on different brokers of the cluster.
"""

from __future__ import annotations

import time

import pytest

from tests.support.cluster import ClientFactory, ClusterFactory, numbers, probe_route, unique_id
from tests.support.interop_raw import RawClient
from tools.launcher import LocalCluster
from tools.mqtt_raw import PUBCOMP, PUBREC, PUBREL, ack_packet, publish_packet

SESSION_TAKEN_OVER = 0x8E


@pytest.mark.parametrize("version", [4, 5])
def test_persistent_session_moves_to_another_broker_with_its_queue(
    cluster3: LocalCluster, client_factory: ClientFactory, version: int
) -> None:
    topic = f"{unique_id('tk')}/queue"
    client_id = unique_id("roamer")
    roamer = client_factory(
        cluster3, 0, client_id=client_id, version=version, clean=False, session_expiry_s=600
    )
    assert not roamer.session_present
    roamer.subscribe(topic, 1)
    probe_route(cluster3, 1, roamer, topic)
    roamer.disconnect()

    publisher = client_factory(cluster3, 1)
    for n in range(20):
        publisher.publish(topic, f"q{n}".encode(), 1)  # PUBACK: stored for the offline session

    roamer.connect(cluster3.brokers[2].mqtt_port)  # same client id, another broker
    assert roamer.session_present, "the session (subscription + queue) must follow the client"
    got = roamer.wait_messages(20, timeout_s=20)
    assert numbers([m.payload for m in got], b"q") == list(range(20))
    assert {m.qos for m in got} == {1}

    # the subscription now lives on broker 2: new messages from broker 1 arrive there, once
    probe_route(cluster3, 1, roamer, topic)
    for n in range(20, 25):
        publisher.publish(topic, f"q{n}".encode(), 1)
    got = roamer.wait_messages(5)
    assert numbers([m.payload for m in got], b"q") == list(range(20, 25))
    roamer.assert_no_message(0.7)


def test_clean_start_on_another_broker_discards_the_session(
    cluster3: LocalCluster, client_factory: ClientFactory
) -> None:
    topic = f"{unique_id('cs')}/queue"
    client_id = unique_id("cleaner")
    first = client_factory(cluster3, 0, client_id=client_id, clean=False, session_expiry_s=600)
    first.subscribe(topic, 1)
    probe_route(cluster3, 2, first, topic)
    first.disconnect()
    client_factory(cluster3, 2).publish(topic, b"stale", 1)
    fresh = client_factory(cluster3, 1, client_id=client_id, clean=True)
    assert not fresh.session_present
    fresh.assert_no_message(1.0)


@pytest.mark.parametrize("version", [4, 5])
def test_same_client_id_on_another_broker_kicks_the_live_connection(
    cluster3: LocalCluster, client_factory: ClientFactory, version: int
) -> None:
    client_id = unique_id("twin")
    old = client_factory(cluster3, 0, client_id=client_id, version=version)
    # the old connection is established in the cluster (a routed subscription) before the new one
    settle_topic = f"{unique_id('tw')}/settle"
    old.subscribe(settle_topic, 1)
    probe_route(cluster3, 2, old, settle_topic)
    new = client_factory(cluster3, 2, client_id=client_id, version=version)
    reason = old.wait_disconnected(10)
    if version == 5:
        assert getattr(reason, "value", None) == SESSION_TAKEN_OVER, f"v5 DISCONNECT reason {reason}"
    assert new.client.is_connected()
    # the new connection works: a message from broker 1 reaches it
    topic = f"{unique_id('tw')}/after"
    new.subscribe(topic, 1)
    probe_route(cluster3, 1, new, topic)
    client_factory(cluster3, 1).publish(topic, b"hi", 1)
    assert new.wait_message().payload == b"hi"
    assert old.client.socket() is None, "the old connection must be closed"


def test_will_of_an_abnormal_close_reaches_other_brokers(
    cluster3: LocalCluster, client_factory: ClientFactory
) -> None:
    will_topic = f"{unique_id('will')}/status"
    watchers = [client_factory(cluster3, 1), client_factory(cluster3, 2, version=4)]
    for watcher in watchers:
        watcher.subscribe(will_topic, 1)
        probe_route(cluster3, 0, watcher, will_topic)
    dying = client_factory(cluster3, 0, will=(will_topic, b"gone", 1, False))
    polite = client_factory(cluster3, 0, will=(will_topic, b"polite", 1, False))
    polite.disconnect()  # a normal DISCONNECT discards the will
    dying.drop()  # abnormal: socket closed without DISCONNECT
    for watcher in watchers:
        msg = watcher.wait_message(15)
        assert (msg.topic, msg.payload, msg.qos) == (will_topic, b"gone", 1)
        watcher.assert_no_message(0.5)


def test_the_newest_connection_wins_right_after_the_old_one_connected(
    cluster3: LocalCluster, client_factory: ClientFactory
) -> None:
    """Two CONNECTs with one client id on two brokers a few milliseconds apart: the later one
    must survive (MQTT §3.1.4-2), however the brokers' session claims cross in the overlay."""
    both_kicked: list[str] = []
    for attempt in range(5):
        client_id = unique_id(f"race{attempt}")
        old = client_factory(cluster3, attempt % 3, client_id=client_id)
        new = client_factory(cluster3, (attempt + 1) % 3, client_id=client_id)
        old.wait_disconnected(10)
        # give a wrong kick of the new connection time to happen, then check it did not
        time.sleep(0.5)
        if new.client.socket() is None or new.disconnected.is_set():
            both_kicked.append(f"{client_id} (reason {new.disconnect_reason})")
    assert not both_kicked, f"the newer connection was disconnected too: {both_kicked}"


def test_wills_of_a_broker_shutting_down_reach_the_other_brokers(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    """SIGTERM disconnects the clients (their wills are published) before the broker leaves the
    overlay, so the wills reach subscribers on the other brokers."""
    cluster = cluster_factory(2)
    will_topic = f"{unique_id('bye')}/status"
    watcher = client_factory(cluster, 1)
    watcher.subscribe(will_topic, 1)
    probe_route(cluster, 0, watcher, will_topic)
    client_factory(cluster, 0, will=(will_topic, b"broker went away", 1, False))
    assert cluster.stop_broker(0) == 0
    msg = watcher.wait_message(15)
    assert (msg.topic, msg.payload) == (will_topic, b"broker went away")


def test_qos2_publishers_packet_ids_survive_kill_9_and_a_session_move(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    """MQTT-4.3.3 for the publisher's session across brokers: a QoS 2 PUBLISH that got its PUBREC
    but no PUBREL yet is remembered with the message (one commit), so the publisher's PUBLISH sent
    again after its broker's kill -9, or after its session moved to another broker, is
    acknowledged and not delivered again. The publisher is a hand-written socket client (paho
    sends PUBREL at once; the gap between PUBREC and PUBREL is the point), the subscriber paho."""
    cluster = cluster_factory(3)
    topic = f"{unique_id('q2in')}/t"
    sub = client_factory(cluster, 1, client_id=unique_id("q2in-sub"), clean=False, session_expiry_s=600)
    assert sub.subscribe(topic, 2) == [2]
    probe_route(cluster, 0, sub, topic)
    publisher_id = unique_id("q2in-pub")

    def connect_publisher(index: int, *, present: bool) -> RawClient:
        broker = cluster.brokers[index]
        raw = RawClient(broker.host, broker.mqtt_port)
        assert raw.connect(publisher_id, clean=False)[:2] == (present, 0)
        return raw

    def publish_until_pubrec(raw: RawClient, payload: bytes, packet_id: int, *, dup: bool) -> None:
        raw.send(publish_packet(topic, payload, qos=2, packet_id=packet_id, dup=dup))
        pubrec = raw.read_packet(10)
        assert (pubrec.ptype, int.from_bytes(pubrec.body[:2], "big")) == (PUBREC, packet_id)

    def complete(raw: RawClient, packet_id: int) -> None:
        raw.send(ack_packet(PUBREL, packet_id))
        pubcomp = raw.read_packet(10)
        assert (pubcomp.ptype, int.from_bytes(pubcomp.body[:2], "big")) == (PUBCOMP, packet_id)

    # 1. PUBREC received, then kill -9 of the publisher's broker before the PUBREL
    raw = connect_publisher(0, present=False)
    publish_until_pubrec(raw, b"q2in-a", 7, dup=False)
    cluster.kill_broker(0)
    raw.close()
    cluster.restart_broker(0)
    cluster.wait_ready(30)
    raw = connect_publisher(0, present=True)
    publish_until_pubrec(raw, b"q2in-a", 7, dup=True)  # sent again (MQTT-4.4.0-1): not a new message
    complete(raw, 7)
    # 2. PUBREC received, then the publisher's session moves to broker 2 before the PUBREL
    publish_until_pubrec(raw, b"q2in-b", 8, dup=False)
    raw.close()  # gone without DISCONNECT, as a device that lost its network
    raw = connect_publisher(2, present=True)
    publish_until_pubrec(raw, b"q2in-b", 8, dup=True)
    complete(raw, 8)
    raw.close()

    got = sub.wait_messages(2, timeout_s=20)
    assert sorted(m.payload for m in got) == [b"q2in-a", b"q2in-b"]
    sub.assert_no_message(1.5)  # neither PUBLISH sent again was delivered a second time
