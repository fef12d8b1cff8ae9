"""Operations: /healthz, /metrics (Prometheus text parsed with prometheus_client.parser), the
structured "listening" log line, and graceful SIGTERM (MQTT 5 §3.14.2.1: DISCONNECT 0x8B server
shutting down, then exit status 0 promptly).

/metrics, /healthz and the log line are SkipMQ features (mosquitto has $SYS instead): those
tests are skipped for the mosquitto target.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.interop_broker import IS_MOSQUITTO, BrokerProcess
from tests.support.interop_clients import PahoClient, unique_id
from tests.support.interop_raw import RawClient
from tools.mqtt_raw import DISCONNECT

PahoFactory = Callable[..., PahoClient]
skipmq_only = pytest.mark.skipif(
    IS_MOSQUITTO, reason="SkipMQ's HTTP endpoint / JSON logs; mosquitto has none"
)


def _http(broker: BrokerProcess, path: str, method: str = "GET") -> tuple[int, str, bytes]:
    request = urllib.request.Request(f"http://{broker.host}:{broker.http_port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read()


def _samples(broker: BrokerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, content_type, body = _http(broker, "/metrics")
    assert status == 200 and content_type.startswith("text/plain"), (status, content_type)
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@skipmq_only
def test_healthz_and_http_errors(fresh_broker: BrokerProcess) -> None:
    status, content_type, body = _http(fresh_broker, "/healthz")
    assert status == 200 and "json" in content_type
    assert json.loads(body)["status"] == "ok"
    assert _http(fresh_broker, "/nope")[0] == 404
    assert _http(fresh_broker, "/metrics", method="POST")[0] == 405


@skipmq_only
def test_listening_log_line(fresh_broker: BrokerProcess) -> None:
    record = fresh_broker.wait_log(lambda r: r.get("event") == "listening")
    assert str(fresh_broker.port) in json.dumps(record), record


@skipmq_only
def test_metrics_follow_traffic(fresh_broker: BrokerProcess, paho_factory: PahoFactory) -> None:
    before = _samples(fresh_broker)
    topic = unique_id("metrics")
    sub = paho_factory(fresh_broker, version=5)
    sub.subscribe(topic, 1)
    pub = paho_factory(fresh_broker, version=5)
    for _ in range(7):
        pub.publish(topic, b"m", 1)
    for _ in range(3):
        pub.publish(topic, b"z", 0)
    sub.wait_messages(10)
    pub.publish(topic, b"r", 1, retain=True)
    sub.wait_message()
    with RawClient(fresh_broker.host, fresh_broker.port, level=5) as raw:  # one protocol error
        raw.connect(unique_id("bad"))
        raw.send(b"\x30\xff\xff\xff\xff\x7f")
        raw.read_until_closed()
    deadline = time.monotonic() + 5
    while True:
        after = _samples(fresh_broker)
        received1 = _value(after, "skipmq_messages_received_total", qos="1") - _value(
            before, "skipmq_messages_received_total", qos="1"
        )
        if received1 >= 8 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert received1 == 8
    assert (
        _value(after, "skipmq_messages_received_total", qos="0")
        - _value(before, "skipmq_messages_received_total", qos="0")
        == 3
    )
    sent = sum(_value(after, "skipmq_messages_sent_total", qos=q) for q in "012") - sum(
        _value(before, "skipmq_messages_sent_total", qos=q) for q in "012"
    )
    assert sent >= 11
    assert _value(after, "skipmq_connections") >= 2
    assert _value(after, "skipmq_connections_total") - _value(before, "skipmq_connections_total") >= 3
    assert _value(after, "skipmq_retained_messages") >= 1
    assert _value(after, "skipmq_subscriptions") >= 1
    assert sum(v for (name, _), v in after.items() if name == "skipmq_packet_errors_total") >= 1
    assert _value(after, "skipmq_bytes_received_total") > _value(before, "skipmq_bytes_received_total")


def test_sigterm_disconnects_v5_clients_and_exits_zero(
    fresh_broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    v5 = paho_factory(fresh_broker, version=5)
    with RawClient(fresh_broker.host, fresh_broker.port, level=5) as raw:
        assert raw.connect(unique_id("term"))[1] == 0
        started = time.monotonic()
        assert fresh_broker.proc is not None
        fresh_broker.proc.send_signal(15)
        seen = raw.read_until_closed(timeout_s=5.0)
        status = fresh_broker.proc.wait(timeout=5.0)
        elapsed = time.monotonic() - started
    assert status == 0, f"exit status {status}"
    assert elapsed < 5.0, f"took {elapsed:.1f} s to stop"
    if not IS_MOSQUITTO:  # mosquitto 2.0.11 closes the sockets without a DISCONNECT
        assert seen and seen[-1].ptype == DISCONNECT and seen[-1].body[0] == 0x8B, seen
        reason = v5.wait_disconnected()
        assert reason.value == 0x8B, f"paho saw {reason}"
