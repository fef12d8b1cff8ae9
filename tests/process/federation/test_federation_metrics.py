"""The ``skipmq_federation_*`` families on ``/metrics`` of real federated brokers
(broker/adapters/federation/metrics.py; docs/observability.md "Federation"), read with
prometheus_client's parser: links up, filters per link, events forwarded / received /
delivered, registrations stopped by TTL, custody depth - each moved by what the test does."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import wait_until
from tests.support.federation import HOST, WAIT_S, Client, Site, Sites, key
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow


def scrape(site: Site) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{HOST}:{site.http}/metrics", timeout=2) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("skipmq_federation_"):
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(site: Site, name: str, **labels: str) -> float:
    return scrape(site).get((name, tuple(sorted(labels.items()))), -1.0)


def test_federation_metrics_follow_links_filters_events_and_custody(sites: Sites) -> None:
    cloud = sites.start("cloud")
    regional = sites.start("regional", cloud)
    edge = sites.start("edge", regional, ttl="2")
    at_cloud, at_edge = Client(cloud, "c-cloud"), Client(edge, "c-edge")
    try:
        assert value(regional, "skipmq_federation_links", role="parent") == 1
        assert value(regional, "skipmq_federation_links", role="child") == 1
        assert value(cloud, "skipmq_federation_links", role="parent") == 0

        at_cloud.subscribe("plant/#")  # TTL 16: reaches every site
        at_edge.subscribe("alarm/#")  # TTL 2: regional is the last router it reaches
        wait_until(lambda: key("plant/#") in edge.state()["received_from"][regional.address], WAIT_S)
        wait_until(lambda: key("alarm/#") in regional.state()["received_from"][edge.address], WAIT_S)
        assert value(edge, "skipmq_federation_link_filters", peer=regional.address, direction="in") == 1
        assert value(edge, "skipmq_federation_link_filters", peer=regional.address, direction="out") == 1
        assert value(regional, "skipmq_federation_registrations_stopped_by_ttl_total") == 1
        assert value(cloud, "skipmq_federation_registrations_stopped_by_ttl_total") == 0
        assert value(regional, "skipmq_federation_link_filter_sources", peer=cloud.address) == 0

        second = Client(edge, "c-edge-2")  # a second source of a key only counts (Table 1)
        second.subscribe("alarm/#")
        wait_until(
            lambda: value(edge, "skipmq_federation_link_filter_sources", peer=regional.address) == 2, WAIT_S
        )
        second.close()

        for n in range(3):
            at_edge.publish("plant/line/1", f"m{n}".encode())  # QoS 1
        for _ in range(3):
            at_cloud.received()
        assert value(edge, "skipmq_federation_events_forwarded_total") == 3
        assert value(regional, "skipmq_federation_events_received_total") == 3
        assert value(cloud, "skipmq_federation_events_delivered_total") == 3
        assert value(edge, "skipmq_federation_messages_sent_total", kind="Event") == 3
        assert value(edge, "skipmq_federation_custody_total", outcome="held") == 3
        wait_until(lambda: value(edge, "skipmq_federation_custody_total", outcome="completed") == 3, WAIT_S)
        assert value(edge, "skipmq_federation_custody_events") == 0
    finally:
        at_cloud.close()
        at_edge.close()


def test_every_federation_family_is_documented_in_observability(sites: Sites) -> None:
    cloud = sites.start("cloud")
    with urllib.request.urlopen(f"http://{HOST}:{cloud.http}/metrics", timeout=2) as response:
        text = response.read().decode()
    families = {
        (f.name, f.type)
        for f in text_string_to_metric_families(text)
        if f.name.startswith("skipmq_federation_")
    }
    assert len(families) >= 10, families  # the scrape found them: the check is not vacuous
    docs = (Path(REPO_ROOT) / "docs" / "observability.md").read_text()
    section = docs.split("## Federation", 1)[1].split("\n## ", 1)[0]
    served = [f"{name}_total" if kind == "counter" else name for name, kind in families]
    missing = sorted(name for name in served if f"`{name}`" not in section)
    assert not missing, f"missing from docs/observability.md ## Federation: {missing}"
