"""Tests for broker.metrics (parsed back with prometheus_client.parser) and broker.logs."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[3]
from broker.core.stats import DROP_REASONS  # noqa: E402
from broker.logs import log_event, setup_logging  # noqa: E402
from broker.metrics import BrokerStats, make_registry, render  # noqa: E402

METRIC_NAMES = [
    "skipmq_build_info",
    "skipmq_connections",
    "skipmq_connections_total",
    "skipmq_messages_received_total",
    "skipmq_messages_sent_total",
    "skipmq_bytes_received_total",
    "skipmq_bytes_sent_total",
    "skipmq_messages_dropped_total",
    "skipmq_packet_errors_total",
    "skipmq_store_errors_total",
    "skipmq_packets_received_total",
    "skipmq_packets_sent_total",
    "skipmq_retained_messages",
    "skipmq_subscriptions",
    "skipmq_queued_messages",
    "skipmq_sessions",
    "skipmq_inflight_messages",
    "skipmq_uptime_seconds",
    "skipmq_session_queue_limit",
    "skipmq_session_queue_depth_max",
    "skipmq_sessions_queue_near_limit",
    "skipmq_store_commit_seconds_count",
    "skipmq_store_checkpoints_total",
    "skipmq_store_checkpoint_seconds_count",
]


def scrape(stats: BrokerStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Render a fresh registry and parse it: (sample name, sorted labels) -> value."""
    body, content_type = render(make_registry(stats))
    assert content_type.startswith("text/plain; version=0.0.4")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_all_metric_names_present_with_zero_defaults() -> None:
    samples = scrape(BrokerStats())
    names = {name for name, _labels in samples}
    for name in METRIC_NAMES:
        assert name in names, name
    assert value(samples, "skipmq_connections") == 0
    for qos in "012":
        assert value(samples, "skipmq_messages_received_total", qos=qos) == 0
        assert value(samples, "skipmq_messages_sent_total", qos=qos) == 0
    for reason in DROP_REASONS:
        assert value(samples, "skipmq_messages_dropped_total", reason=reason) == 0
    assert value(samples, "skipmq_packets_received_total", packet_type="PUBLISH") == 0
    for kind in ("operation", "commit", "resync"):
        assert value(samples, "skipmq_store_errors_total", kind=kind) == 0


def test_build_info_is_one_with_version_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    import broker.metrics
    from broker import __version__

    monkeypatch.setattr(broker.metrics, "git_revision", lambda: "abc123")
    samples = scrape(BrokerStats())
    labels = {"version": __version__, "python_version": platform.python_version(), "revision": "abc123"}
    assert value(samples, "skipmq_build_info", **labels) == 1
    assert [name for name, _labels in samples if name == "skipmq_build_info"] == ["skipmq_build_info"]
    monkeypatch.setattr(broker.metrics, "git_revision", lambda: None)  # no checkout: label left out
    labels.pop("revision")
    assert value(scrape(BrokerStats()), "skipmq_build_info", **labels) == 1


def test_build_info_revision_from_the_checkout_or_left_out() -> None:
    """The revision comes from the source checkout's git files when there is one (this
    repository: HEAD's commit), otherwise the label is left out."""
    import subprocess

    from broker.metrics import build_info, git_revision

    git_revision.cache_clear()
    try:
        family = build_info()
    finally:
        git_revision.cache_clear()
    (sample,) = family.samples
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    if head:
        assert sample.labels["revision"] == head
    else:
        assert "revision" not in sample.labels
    assert sample.value == 1


def test_process_collector_included() -> None:
    samples = scrape(BrokerStats())
    names = {name for name, _labels in samples}
    assert "process_resident_memory_bytes" in names
    assert "process_cpu_seconds_total" in names
    assert value(samples, "process_resident_memory_bytes") > 0


def test_values_follow_the_stats_at_scrape_time() -> None:
    stats = BrokerStats(uptime_started_at=time.time() - 100)
    registry = make_registry(stats)
    stats.connections_current = 3
    stats.connections_total = 17
    stats.messages_received[0] += 5
    stats.messages_received[2] += 1
    stats.messages_sent[1] += 9
    stats.bytes_received += 1234
    stats.bytes_sent += 4321
    stats.messages_dropped["queue_full_oldest"] += 2
    stats.messages_dropped["brand_new_reason"] = 4
    stats.packet_errors["CONNECT"] = 6
    stats.store_errors["commit"] += 3
    stats.packets_received["PUBLISH"] += 6
    stats.packets_sent["PUBACK"] += 2
    stats.retained_messages = 8
    stats.subscriptions = 11
    stats.queued_messages = 12
    stats.sessions = 13
    stats.inflight_messages = 14

    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(render(registry)[0].decode())
        for sample in family.samples
    }
    assert value(samples, "skipmq_connections") == 3
    assert value(samples, "skipmq_connections_total") == 17
    assert value(samples, "skipmq_messages_received_total", qos="0") == 5
    assert value(samples, "skipmq_messages_received_total", qos="2") == 1
    assert value(samples, "skipmq_messages_sent_total", qos="1") == 9
    assert value(samples, "skipmq_bytes_received_total") == 1234
    assert value(samples, "skipmq_bytes_sent_total") == 4321
    assert value(samples, "skipmq_messages_dropped_total", reason="queue_full_oldest") == 2
    assert value(samples, "skipmq_messages_dropped_total", reason="brand_new_reason") == 4
    assert value(samples, "skipmq_packet_errors_total", packet_type="CONNECT") == 6
    assert value(samples, "skipmq_store_errors_total", kind="commit") == 3
    assert value(samples, "skipmq_packets_received_total", packet_type="PUBLISH") == 6
    assert value(samples, "skipmq_packets_sent_total", packet_type="PUBACK") == 2
    assert value(samples, "skipmq_retained_messages") == 8
    assert value(samples, "skipmq_subscriptions") == 11
    assert value(samples, "skipmq_queued_messages") == 12
    assert value(samples, "skipmq_sessions") == 13
    assert value(samples, "skipmq_inflight_messages") == 14
    assert 99 <= value(samples, "skipmq_uptime_seconds") < 200

    # The same registry follows later changes: nothing is cached between scrapes.
    stats.connections_current = 0
    stats.messages_received[0] += 1
    again = scrape(stats)
    assert value(again, "skipmq_connections") == 0
    assert value(again, "skipmq_messages_received_total", qos="0") == 6


def test_metric_types() -> None:
    # Read the TYPE lines directly: the parser folds "skipmq_connections_total" (counter) into the
    # family name "skipmq_connections", which is also the gauge's name.
    body, _ = render(make_registry(BrokerStats()))
    types = dict(
        line.split()[2:4] for line in body.decode().splitlines() if line.startswith("# TYPE skipmq_")
    )
    assert types["skipmq_connections"] == "gauge"
    assert types["skipmq_connections_total"] == "counter"
    assert types["skipmq_messages_received_total"] == "counter"
    assert types["skipmq_packet_errors_total"] == "counter"
    assert types["skipmq_uptime_seconds"] == "gauge"
    assert types["skipmq_build_info"] == "gauge"
    assert types["skipmq_store_errors_total"] == "counter"
    assert types["skipmq_queued_messages"] == "gauge"
    assert types["skipmq_store_commit_seconds"] == "histogram"
    families = [name.removesuffix("_count") for name in METRIC_NAMES]
    # labelled by certificate setting: no series without configured certificate files
    families += ["skipmq_tls_certificate_expiry_timestamp_seconds", "skipmq_tls_certificate_read_errors"]
    assert sorted(types) == sorted(families)


def test_registries_are_independent() -> None:
    first, second = BrokerStats(), BrokerStats()
    first.connections_current = 1
    second.connections_current = 2
    assert value(scrape(first), "skipmq_connections") == 1
    assert value(scrape(second), "skipmq_connections") == 2


# --- broker.logs ---------------------------------------------------------------------------------


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    stream = io.StringIO()
    yield stream
    for handler in list(root.handlers):
        if handler not in saved_handlers:
            root.removeHandler(handler)
    root.setLevel(saved_level)


def test_json_logging_one_object_per_line(captured: io.StringIO) -> None:
    setup_logging("info", "json", stream=captured)
    log = logging.getLogger("broker.test")
    log_event(log, logging.WARNING, "malformed_packet", client_id="c1", reason="bad length", peer="1.2.3.4:5")
    log.info("plain %s", "message", extra={"port": 1883})
    log_event(log, logging.DEBUG, "hidden", x=1)  # below the level
    log_event(log, logging.ERROR, "clash", msg="m", level="l", data=b"\x01\x02")
    lines = captured.getvalue().splitlines()
    assert len(lines) == 3
    first, second, third = (json.loads(line) for line in lines)
    assert first["level"] == "warning" and first["logger"] == "broker.test"
    assert first["msg"] == "malformed_packet" and first["event"] == "malformed_packet"
    assert (first["client_id"], first["reason"], first["peer"]) == ("c1", "bad length", "1.2.3.4:5")
    assert first["ts"].endswith("Z") and "T" in first["ts"]
    assert second["msg"] == "plain message" and second["port"] == 1883
    assert (third["msg"], third["field_msg"], third["field_level"], third["level"]) == (
        "clash",
        "m",
        "l",
        "error",
    )
    assert third["data"] == "0102"


def test_text_logging_and_reconfiguration(captured: io.StringIO) -> None:
    setup_logging("debug", "json", stream=io.StringIO())
    setup_logging("debug", "text", stream=captured)  # replaces, never duplicates, our handler
    log = logging.getLogger("broker.test")
    log_event(log, logging.DEBUG, "listening", port=1883, host="0.0.0.0", note="two words")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    text = captured.getvalue()
    first_line = text.splitlines()[0]
    assert "DEBUG" in first_line and "broker.test listening" in first_line
    assert 'port=1883 host=0.0.0.0 note="two words"' in first_line
    assert "RuntimeError: boom" in text
    assert sum(1 for line in text.splitlines() if "listening" in line) == 1


def test_setup_logging_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="log level must be one of debug, info, warning, error"):
        setup_logging("verbose", "json")
    with pytest.raises(ValueError, match="log format must be one of json, text, got 'xml'"):
        setup_logging("info", "xml")
