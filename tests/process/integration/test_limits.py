"""Resource limits against hostile raw sockets (issue #12; docs/security.md "Limits").

Each limit is a ``limits.*`` key; each test starts a real broker with a small value, attacks it
with raw sockets (``tools.mqtt_raw``), and checks the reason code the client gets, the log line
the broker writes, and that a well-behaved client still gets in. SkipMQ only (the keys and the
log lines are SkipMQ's; mosquitto has no per-IP or pre-CONNECT limits to compare with).
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.interop_broker import IS_MOSQUITTO, BrokerOptions, BrokerProcess
from tests.support.interop_clients import unique_id
from tests.support.interop_raw import ConnectionClosed, RawClient
from tools.mqtt_raw import CONNACK, connect_packet, publish_packet, varint

pytestmark = pytest.mark.skipif(IS_MOSQUITTO, reason="SkipMQ's limits.* keys and log lines")
Factory = Callable[[BrokerOptions], BrokerProcess]

QUOTA_EXCEEDED = 0x97
CONNECTION_RATE_EXCEEDED = 0x9F


def _limits(**values: Any) -> BrokerOptions:
    return BrokerOptions(skipmq_extra={"limits": values})


def _event(broker: BrokerProcess, event: str, **fields: Any) -> dict[str, Any]:
    return broker.wait_log(
        lambda r: r.get("event") == event and all(r.get(k) == v for k, v in fields.items()), timeout_s=5.0
    )


def _connack_code(broker: BrokerProcess, level: int = 5) -> int:
    with RawClient(broker.host, broker.port, level=level) as raw:
        _present, code, _props = raw.connect(unique_id("lim"))
        return code


def test_a_large_packet_before_connect_is_refused_before_it_is_buffered(broker_factory: Factory) -> None:
    """The issue's attack: announce a ~1 MB CONNECT and send part of it. With the pre-CONNECT cap
    the broker closes the socket as soon as the fixed header announces too much."""
    broker = broker_factory(_limits(max_connect_packet_bytes=65_536))
    with RawClient(broker.host, broker.port) as raw:
        raw.send(bytes((0x10,)) + varint(1_000_000) + b"\x00" * 4096)
        assert raw.read_until_closed(5.0) == []  # the level is unknown yet: no CONNACK, closed
    record = _event(broker, "protocol_error", reason_code=0x95)
    assert "65536" in record["message"]
    # a v5 CONNECT over the cap gets CONNACK 0x95 once its level is readable
    with RawClient(broker.host, broker.port, level=5) as raw:
        big = connect_packet(unique_id("big"), level=5, username="u" * 40_000, password=b"p" * 40_000)
        assert len(big) > 65_536
        raw.send(big)
        packets = raw.read_until_closed(5.0)
        assert [(p.ptype, p.body[1]) for p in packets] in ([], [(CONNACK, 0x95)])
    # an ordinary CONNECT, then a packet larger than the pre-CONNECT cap: accepted once connected
    with RawClient(broker.host, broker.port, level=5) as raw:
        _present, code, _props = raw.connect(unique_id("ok"))
        assert code == 0
        raw.send(publish_packet("limits/big", b"x" * 200_000, qos=1, packet_id=1, level=5))
        ack = raw.read_packet()
        assert ack.ptype == 4 and ack.body[:2] == b"\x00\x01"  # PUBACK


def test_connections_per_ip(broker_factory: Factory) -> None:
    broker = broker_factory(_limits(max_connections_per_ip=2))
    idle = [socket.create_connection((broker.host, broker.port), timeout=5) for _ in range(2)]
    try:
        assert _connack_code(broker) == QUOTA_EXCEEDED  # a 3rd socket from 127.0.0.1
        record = _event(broker, "connect_refused", reason_code=QUOTA_EXCEEDED)
        assert "more than 2 connections" in record["reason"]
        assert _connack_code(broker, level=4) == 3  # 3.1.1: server unavailable
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 5
    while _connack_code(broker) != 0:  # the idle sockets' close reaches the broker
        assert time.monotonic() < deadline, "a socket is still refused after the others closed"
        time.sleep(0.1)


def test_connect_rate_per_ip(broker_factory: Factory) -> None:
    broker = broker_factory(_limits(connect_rate_per_ip=2))  # bursts up to 4
    codes = [_connack_code(broker) for _ in range(8)]
    assert codes[0] == 0
    assert CONNECTION_RATE_EXCEEDED in codes, codes
    _event(broker, "connect_refused", reason_code=CONNECTION_RATE_EXCEEDED)
    time.sleep(1.2)  # the bucket refills at 2 per second
    assert _connack_code(broker) == 0


def test_connect_timeout(broker_factory: Factory) -> None:
    broker = broker_factory(_limits(connect_timeout_s=1))
    with RawClient(broker.host, broker.port) as raw:
        started = time.monotonic()
        assert raw.read_until_closed(8.0) == []
        assert time.monotonic() - started < 6.0
    _event(broker, "connect_timeout")


def _dropped(broker: BrokerProcess, reason: str) -> float:
    url = f"http://{broker.host}:{broker.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("skipmq_messages_dropped_total{") and f'reason="{reason}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_slow_consumer_output_buffer_cap(broker_factory: Factory) -> None:
    """A subscriber that never reads: QoS 0 beyond its output cap is dropped, counted and logged
    naming the client, and the broker keeps serving others."""
    broker = broker_factory(_limits(max_output_buffer_bytes=65_536))
    slow = RawClient(broker.host, broker.port, level=4)
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        slow_id = unique_id("slow")
        assert slow.connect(slow_id)[1] == 0
        assert slow.subscribe([("limits/slow", 0)]) == [0]
        with RawClient(broker.host, broker.port, level=4) as pub:
            assert pub.connect(unique_id("pub"))[1] == 0
            chunk = b"".join(publish_packet("limits/slow", b"z" * 16_384) for _ in range(64))
            deadline = time.monotonic() + 20
            while _dropped(broker, "slow_consumer") == 0:
                assert time.monotonic() < deadline, "no slow_consumer drop counted"
                pub.send(chunk)
        line = _event(broker, "messages_dropped", client_id=slow_id)
        assert line["dropped_by_reason"].get("slow_consumer", 0) > 0, line
        assert _connack_code(broker) == 0
    finally:
        try:
            slow.close()
        except ConnectionClosed:
            pass


def test_total_connections(broker_factory: Factory) -> None:
    broker = broker_factory(_limits(max_connections=2))
    first, second = RawClient(broker.host, broker.port, level=5), RawClient(broker.host, broker.port, level=5)
    try:
        assert first.connect(unique_id("one"))[1] == 0
        assert second.connect(unique_id("two"))[1] == 0
        assert _connack_code(broker) == 0x89  # Server busy
        _event(broker, "connect_refused", reason_code=0x89)
    finally:
        first.close()
        second.close()


def test_publish_rate_per_connection(broker_factory: Factory) -> None:
    """A connection publishing faster than limits.max_publish_rate (bursts up to twice it) is
    disconnected with 0x96 Message rate too high; what it had acknowledged was delivered."""
    broker = broker_factory(_limits(max_publish_rate=5))
    with (
        RawClient(broker.host, broker.port, level=5) as sub,
        RawClient(broker.host, broker.port, level=5) as pub,
    ):
        assert sub.connect(unique_id("sub"))[1] == 0
        assert sub.subscribe([("limits/rate", 1)]) == [1]
        assert pub.connect(unique_id("fast"))[1] == 0
        pub.send(
            b"".join(
                publish_packet("limits/rate", b"%d" % n, qos=1, packet_id=n + 1, level=5) for n in range(40)
            )
        )
        packets = pub.read_until_closed(5.0)
        acked = [p for p in packets if p.ptype == 4]
        disconnects = [p for p in packets if p.ptype == 14]
        assert disconnects and disconnects[-1].body[0] == 0x96, packets
        assert 1 <= len(acked) <= 10 + 1  # the burst (2 x 5) and perhaps one refilled token
        received = [sub.read_publish().payload for _ in acked]
        assert received == [b"%d" % n for n in range(len(acked))]
    _event(broker, "publish_rate_exceeded", reason_code=0x96)
    # another connection from the same address is not affected
    assert _connack_code(broker) == 0
