"""Interop: will messages.

Follows MQTT 3.1.1 §3.1.2.5 (MQTT-3.1.2-8/10: will published when the connection closes without
DISCONNECT, removed on DISCONNECT) and MQTT 5 §3.1.2.5 / §3.1.3.2 (will delay interval, cancelled
by a reconnect in time) and §3.14.2.1 (DISCONNECT 0x04 "disconnect with will message").
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.interop_broker import BrokerProcess
from tests.support.interop_clients import PahoClient, unique_id, v5_props
from tests.support.interop_raw import RawClient
from tools.mqtt_raw import disconnect_packet

PahoFactory = Callable[..., PahoClient]


def _watch(broker: BrokerProcess, paho_factory: PahoFactory, topic: str) -> PahoClient:
    watcher = paho_factory(broker, version=5)
    watcher.subscribe(topic, 1)
    return watcher


@pytest.mark.parametrize("version", [4, 5])
def test_will_on_abnormal_close(broker: BrokerProcess, paho_factory: PahoFactory, version: int) -> None:
    cid = unique_id("will")
    watcher = _watch(broker, paho_factory, f"{cid}/will")
    client = paho_factory(broker, client_id=cid, version=version, will=(f"{cid}/will", b"died", 1, False))
    client.drop()
    got = watcher.wait_message()
    assert (got.topic, got.payload, got.qos, got.retain) == (f"{cid}/will", b"died", 1, False)


@pytest.mark.parametrize("version", [4, 5])
def test_no_will_on_clean_disconnect(broker: BrokerProcess, paho_factory: PahoFactory, version: int) -> None:
    cid = unique_id("nowill")
    watcher = _watch(broker, paho_factory, f"{cid}/will")
    client = paho_factory(broker, client_id=cid, version=version, will=(f"{cid}/will", b"died", 1, False))
    client.disconnect()
    watcher.assert_no_message(0.8)


def test_v5_disconnect_with_will_message(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    cid = unique_id("will04")
    watcher = _watch(broker, paho_factory, f"{cid}/will")
    with RawClient(broker.host, broker.port, level=5) as raw:
        assert raw.connect(cid, will=(f"{cid}/will", b"asked", 1, False))[1] == 0
        raw.send(disconnect_packet(5, 0x04))
        raw.read_until_closed(3.0)
    assert watcher.wait_message().payload == b"asked"


def test_retained_will(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    cid = unique_id("willret")
    client = paho_factory(broker, client_id=cid, will=(f"{cid}/status", b"offline", 1, True))
    client.drop()
    time.sleep(0.5)
    late = paho_factory(broker)
    late.subscribe(f"{cid}/status", 1)
    got = late.wait_message()
    assert (got.payload, got.retain) == (b"offline", True)


def _drop_with_a_delayed_will(
    broker: BrokerProcess, paho_factory: PahoFactory, cid: str, session: Properties
) -> None:
    """An MQTT 5 client ``cid`` with a session (``session``) and a will on ``{cid}/will`` (b"late",
    QoS 1) delayed 2 s, whose connection then drops."""
    will_props = v5_props(PacketTypes.WILLMESSAGE, WillDelayInterval=2)
    client = paho_factory(
        broker,
        client_id=cid,
        version=5,
        will=(f"{cid}/will", b"late", 1, False),
        will_props=will_props,
        connect_props=session,
    )
    client.drop()


def test_v5_will_delay(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    cid = unique_id("willdelay")
    watcher = _watch(broker, paho_factory, f"{cid}/will")
    session = v5_props(PacketTypes.CONNECT, SessionExpiryInterval=60)
    _drop_with_a_delayed_will(broker, paho_factory, cid, session)
    dropped_at = time.monotonic()
    watcher.assert_no_message(1.2)  # not before the delay
    got = watcher.wait_message(5.0)
    waited = time.monotonic() - dropped_at
    assert got.payload == b"late"
    assert 1.5 <= waited <= 6.0, f"will after {waited:.2f} s, delay was 2 s"


def test_v5_will_delay_cancelled_by_reconnect(broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    cid = unique_id("willcancel")
    watcher = _watch(broker, paho_factory, f"{cid}/will")
    session = v5_props(PacketTypes.CONNECT, SessionExpiryInterval=60)
    _drop_with_a_delayed_will(broker, paho_factory, cid, session)
    time.sleep(0.3)
    back = paho_factory(broker, client_id=cid, version=5, clean=False, connect_props=session)
    assert back.session_present
    watcher.assert_no_message(3.0)
    back.disconnect()
