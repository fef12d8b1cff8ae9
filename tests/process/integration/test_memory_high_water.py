"""The memory high-water mark (issue #12; docs/security.md "Memory high-water mark").

A real broker whose ``limits.memory_high_water_bytes`` is its idle RSS plus 40 MB. A subscriber
that never reads (a raw socket with a small receive buffer, QoS 1) makes the broker hold every
message for it; a paho publisher sends 256 KB QoS 1 messages until RSS crosses the mark. Then:
a new paho CONNECT gets 0x89 Server busy, a QoS 0 PUBLISH is dropped and counted, the producer
is no longer read from (its next QoS 1 PUBLISH is not acknowledged), and the broker logs
``memory_high_water``. When the slow subscriber goes away its messages are freed, RSS falls
below the low-water mark, the broker logs ``memory_recovered``, the paused producer's PUBLISH is
acknowledged and new clients connect again.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.interop_broker import IS_MOSQUITTO, BrokerOptions, BrokerProcess
from tests.support.interop_clients import PahoClient, unique_id
from tests.support.interop_raw import RawClient

pytestmark = pytest.mark.skipif(IS_MOSQUITTO, reason="SkipMQ's limits.memory_* keys")
Factory = Callable[[BrokerOptions], BrokerProcess]
SERVER_BUSY = 0x89
MARGIN_BYTES = 40 * 1024 * 1024
PAYLOAD = b"m" * (256 * 1024)


def _rss(pid: int) -> int:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * 4096


def _metrics(broker: BrokerProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def _dropped(broker: BrokerProcess, reason: str) -> float:
    prefix = f'skipmq_messages_dropped_total{{reason="{reason}"}} '
    for line in _metrics(broker).splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def _options(high_water_bytes: int) -> BrokerOptions:
    limits: dict[str, Any] = {
        "memory_check_interval_ms": 100,
        "max_queued_messages": 100_000,
    }
    if high_water_bytes:
        limits["memory_high_water_bytes"] = high_water_bytes
    return BrokerOptions(skipmq_extra={"limits": limits})


def test_above_the_high_water_mark_the_broker_sheds_load_and_recovers_below_the_low_one(
    broker_factory: Factory,
) -> None:
    probe = broker_factory(_options(0))
    time.sleep(1.0)
    idle_rss = _rss(probe.pid)
    probe.close()
    high = idle_rss + MARGIN_BYTES
    broker = broker_factory(_options(high))
    slow = RawClient(broker.host, broker.port, level=4)
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    assert slow.connect(unique_id("slow"))[1] == 0
    assert slow.subscribe([("mem/#", 1)]) == [1]
    producer = PahoClient(broker.host, broker.port, version=5, client_id=unique_id("producer"))
    qos0 = PahoClient(broker.host, broker.port, version=5, client_id=unique_id("qos0"))
    try:
        deadline = time.monotonic() + 60
        while _rss(broker.pid) <= high:  # each message is held for the subscriber that never reads
            assert time.monotonic() < deadline, f"RSS {_rss(broker.pid)} never passed {high}"
            info = producer.client.publish("mem/fill", PAYLOAD, qos=1)
            info.wait_for_publish(5.0)
            if not info.is_published():
                break  # already paused: the broker is above the mark
        record = broker.wait_log(lambda r: r.get("event") == "memory_high_water", timeout_s=10.0)
        assert record["rss_bytes"] > high
        # a new connection is refused with 0x89 Server busy and a reason naming the key
        refused = PahoClient(broker.host, broker.port, version=5, expect_success=False)
        assert refused.connack_reason is not None and int(refused.connack_reason.value) == SERVER_BUSY
        refused.close()
        # QoS 0 from a connected client is dropped and counted
        qos0.client.publish("mem/zero", b"dropped", qos=0)
        deadline = time.monotonic() + 10
        while _dropped(broker, "memory_high_water") < 1:
            assert time.monotonic() < deadline, "the QoS 0 PUBLISH was not dropped"
            time.sleep(0.1)
        # the producer's QoS 1 PUBLISH read above the mark is handled (acknowledged); after it the
        # producer is not read from: its next one waits for its PUBACK
        accepted = producer.client.publish("mem/late", b"read-above-the-mark", qos=1)
        accepted.wait_for_publish(5.0)
        assert accepted.is_published()
        paused = producer.client.publish("mem/late", b"not-read-yet", qos=1)
        paused.wait_for_publish(1.5)
        assert not paused.is_published()
    finally:
        slow.close()  # its clean session ends: everything held for it is freed
    recovered = broker.wait_log(lambda r: r.get("event") == "memory_recovered", timeout_s=20.0)
    assert recovered["rss_bytes"] < recovered["low_water_bytes"]
    paused.wait_for_publish(10.0)
    assert paused.is_published()  # read again and acknowledged: nothing the producer sent is lost
    again = PahoClient(broker.host, broker.port, version=5)
    again.close()
    producer.close()
    qos0.close()
