"""Queue overflow of an offline persistent session is never silent (docs/broker.md "Queue overflow").

A real broker process and paho-mqtt clients: a QoS 1 subscriber with a persistent session goes
offline, a publisher sends more QoS 1 messages than ``limits.max_queued_messages``; every one is
PUBACKed, the evicted ones show up in ``/metrics`` (``skipmq_messages_dropped_total{reason=
"queue_full_oldest"}``) and in a ``messages_dropped`` warning naming the client, and the
subscriber gets the newest ones when it comes back. SkipMQ's /metrics and JSON logs: skipped for
the mosquitto target.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.interop_broker import IS_MOSQUITTO, BrokerOptions, BrokerProcess
from tests.support.interop_clients import PahoClient, unique_id

PahoFactory = Callable[..., PahoClient]
pytestmark = pytest.mark.skipif(IS_MOSQUITTO, reason="SkipMQ's /metrics and JSON logs")

QUEUE_LIMIT = 5
PUBLISHED = 20


def dropped_total(broker: BrokerProcess, reason: str) -> float:
    url = f"http://{broker.host}:{broker.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "skipmq_messages_dropped_total" and sample.labels.get("reason") == reason:
                return sample.value
    raise AssertionError(f"no skipmq_messages_dropped_total{{reason={reason!r}}} in /metrics")


def test_offline_session_overflow_is_counted_in_metrics_and_logged(
    broker_factory: Callable[[BrokerOptions], BrokerProcess], paho_factory: PahoFactory
) -> None:
    broker = broker_factory(
        BrokerOptions(
            skipmq_extra={
                "limits": {"max_queued_messages": QUEUE_LIMIT, "queue_overflow": "drop_oldest"},
                "logging": {"dropped_messages_interval_s": 1},
            }
        )
    )
    topic = unique_id("overflow")
    client_id = unique_id("offline-sub")
    subscriber = paho_factory(broker, client_id=client_id, clean=False)
    subscriber.subscribe(topic, 1)
    subscriber.disconnect()
    assert dropped_total(broker, "queue_full_oldest") == 0
    publisher = paho_factory(broker)
    for index in range(PUBLISHED):
        publisher.publish(topic, str(index).encode(), 1)  # each one PUBACKed
    deadline = time.monotonic() + 5
    while (
        dropped_total(broker, "queue_full_oldest") < PUBLISHED - QUEUE_LIMIT and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert dropped_total(broker, "queue_full_oldest") == PUBLISHED - QUEUE_LIMIT
    assert dropped_total(broker, "queue_full_new") == 0
    lines = []
    deadline = time.monotonic() + 5
    while sum(line["dropped"] for line in lines) < PUBLISHED - QUEUE_LIMIT and time.monotonic() < deadline:
        time.sleep(0.1)
        lines = [
            record
            for record in broker.log_records()
            if record.get("event") == "messages_dropped" and record.get("client_id") == client_id
        ]
    assert lines and all(line["level"] == "warning" for line in lines), lines
    assert lines[0]["reason"] == "queue_full_oldest" and lines[0]["queue_limit"] == QUEUE_LIMIT
    assert sum(line["dropped"] for line in lines) == PUBLISHED - QUEUE_LIMIT
    # the first drop at once, the rest summed into one line per 1 s interval
    assert lines[0]["dropped"] == 1 and len(lines) >= 2
    back = paho_factory(broker, client_id=client_id, clean=False)
    assert back.session_present
    received = [message.payload for message in back.wait_messages(QUEUE_LIMIT)]
    assert received == [str(index).encode() for index in range(PUBLISHED - QUEUE_LIMIT, PUBLISHED)]
