"""The HTTP metrics source follows brokers that join and leave, each on its own HTTP port.

Every broker announces its HTTP port in its links' Hello (protos/skipmq/v1/cluster.proto); a
broker's ``/cluster`` lists its peers' ports as ``peer_http_ports``, and the ``skipmq_metrics``
source scrapes each peer there. Before the announcement, brokers on one host with different HTTP
ports were scraped at the seed's port (the wrong broker, or nothing). No Spark session needed: the
scraper's discovery is plain Python.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.sources.http_metrics import Scraper
from tests.support.cluster import LIVE_CLUSTERS, wait_until
from tools.launcher import start_cluster


def test_brokers_joining_and_leaving_are_scraped_at_their_own_http_ports(tmp_path: Path) -> None:
    cluster = start_cluster(2, data_root=str(tmp_path / "data"))
    LIVE_CLUSTERS.append(cluster)
    try:
        first, second = cluster.brokers[0], cluster.brokers[1]
        assert first.http_port != second.http_port
        state = cluster.cluster_state(0)
        assert state["peer_http_ports"] == {second.peer_id: second.http_port}, state
        scraper = Scraper(
            {
                "urls": f"http://127.0.0.1:{first.http_port}",
                "spool": str(tmp_path / "spool.jsonl"),
                "scrape_interval_s": "3600",  # targets() is called here, not by the thread
            }
        )
        url = "http://127.0.0.1:{}".format
        assert scraper.targets() == [url(first.http_port), url(second.http_port)]

        third = cluster.add_broker()
        wait_until(
            lambda: url(third.http_port) in scraper.targets(),
            timeout_s=30,
            what="the joined broker listed at its own HTTP port",
        )
        assert sorted(scraper.targets()) == sorted(url(b.http_port) for b in (first, second, third))
        samples = scraper.scrape(0.0)
        up = {s["instance"] for s in samples if s["name"] == "up" and s["value"] == 1.0}
        assert up == {f"127.0.0.1:{b.http_port}" for b in (first, second, third)}, up
        # each port is that broker's own /metrics: the node id its /healthz gives
        scraped = {(s["instance"], s["node_id"]) for s in samples if s["name"] != "up"}
        assert scraped == {(f"127.0.0.1:{b.http_port}", b.node_id) for b in (first, second, third)}

        cluster.stop_broker(1)
        wait_until(
            lambda: url(second.http_port) not in scraper.targets(),
            timeout_s=30,
            what="the broker that left no longer listed",
        )
        assert sorted(scraper.targets()) == sorted(url(b.http_port) for b in (first, third))
    finally:
        cluster.close()
        LIVE_CLUSTERS.remove(cluster)
