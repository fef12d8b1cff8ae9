"""``skipmq_metrics``: a streaming source of every broker's Prometheus ``/metrics``.

A scraper thread (started with the query, in the process that runs the source's reader) scrapes
every known broker every ``scrape_interval_s`` and appends the samples to the spool; Spark's offsets
are spool line counts, so a restart replays exactly, and how often brokers are scraped does not
depend on how fast the micro-batches go. Brokers are the ``urls`` given plus
those found in their ``/cluster`` (``connected_peers``: the cluster address host of each peer, with
the HTTP port the peer announced in its link's Hello (``peer_http_ports``), else ``peer_http_port``,
else the port of the URL it was found through - brokers older than the announcement). A broker that does not
answer is kept and reported with a sample ``up`` = 0 (as Prometheus does); one found only through
``/cluster`` and no longer listed there is dropped (brokers that leave).

Options: ``urls`` (http://host:port,...; required), ``spool`` (file; required), ``discover``
(true), ``peer_http_port``, ``timeout_s`` (2), ``scrape_interval_s`` (10).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.types import StructType

from pipeline.records import METRIC_FIELDS, METRIC_SCHEMA, as_row, metric_records
from pipeline.spool import Spool

KEPT_PREFIXES = ("skipmq_", "process_")  # not the histograms' _bucket series (the _sum and _count are kept)
BROKER_INFO = "skipmq_pipeline_broker_info"  # value 1, label broker: the instance's cluster address


def _get(url: str, timeout_s: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return bytes(response.read())


class Scraper:
    def __init__(self, options: dict[str, str]) -> None:
        if "spool" not in options or "urls" not in options:
            raise ValueError(
                "skipmq_metrics needs the options urls (http://host:port,...) and spool (a file)"
            )
        self.seeds = [url.strip().rstrip("/") for url in options["urls"].split(",") if url.strip()]
        for url in self.seeds:
            if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).port:
                raise ValueError(f"urls: {url!r} is not http://host:port")
        self.discover = options.get("discover", "true").lower() != "false"
        self.peer_http_port = options.get("peer_http_port")
        self.timeout_s = float(options.get("timeout_s", "2"))
        self.interval_s = float(options.get("scrape_interval_s", "10"))
        self.spool = Spool(options["spool"])
        self._thread = threading.Thread(target=self._run, name="skipmq-metrics-scraper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            started = time.monotonic()
            self.spool.append(self.scrape(time.time()))
            time.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    def targets(self) -> list[str]:
        """The seeds and the brokers their ``/cluster`` lists now."""
        found = list(self.seeds)
        if not self.discover:
            return found
        for seed in self.seeds:
            try:
                state = json.loads(_get(seed + "/cluster", self.timeout_s))
            except (OSError, ValueError):
                continue
            fallback = self.peer_http_port or str(urlsplit(seed).port)
            announced = state.get("peer_http_ports") or {}
            for peer in state.get("connected_peers", []):
                host = str(peer).rsplit(":", 1)[0]
                port = announced.get(peer) or fallback
                url = f"{urlsplit(seed).scheme}://{host}:{port}"
                if url not in found:
                    found.append(url)
        return found

    def _cluster_address(self, url: str) -> str:
        """The broker's cluster address (``peer_id`` in its /cluster; "" when unclustered)."""
        try:
            return str(json.loads(_get(url + "/cluster", self.timeout_s)).get("peer_id") or "")
        except (OSError, ValueError):
            return ""

    def scrape(self, now_s: float) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for url in self.targets():
            instance = urlsplit(url).netloc
            try:
                text = _get(url + "/metrics", self.timeout_s).decode()
                node_id = ""
                try:
                    node_id = str(json.loads(_get(url + "/healthz", self.timeout_s)).get("node_id", ""))
                except (OSError, ValueError):
                    pass
                records.extend(
                    record
                    for record in metric_records(text, instance, node_id, now_s)
                    if record["name"].startswith(KEPT_PREFIXES) and not record["name"].endswith("_bucket")
                )
                peer = self._cluster_address(url)
                if peer:  # the name the snapshots give this broker, to name it one way everywhere
                    labels = json.dumps({"broker": peer}, separators=(",", ":"))
                    records.append(
                        {"instance": instance, "node_id": node_id, "ts": now_s, "name": BROKER_INFO,
                         "labels": labels, "value": 1.0}
                    )  # fmt: skip
                up = 1.0
            except (OSError, ValueError):
                up = 0.0
            records.append(
                {"instance": instance, "node_id": "", "ts": now_s, "name": "up", "labels": "{}", "value": up}
            )
        return records


_SCRAPERS: dict[str, Scraper] = {}
_LOCK = threading.Lock()


def scraper_for(options: dict[str, str]) -> Scraper:
    """One scraper per spool in a process, however often Spark builds a reader."""
    with _LOCK:
        scraper = _SCRAPERS.get(options["spool"])
        if scraper is None:
            scraper = _SCRAPERS[options["spool"]] = Scraper(options)
        return scraper


class MetricsReader(SimpleDataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        if "spool" not in options or "urls" not in options:
            raise ValueError(
                "skipmq_metrics needs the options urls (http://host:port,...) and spool (a file)"
            )
        for url in options["urls"].split(","):
            split = urlsplit(url.strip())
            if split.scheme not in ("http", "https") or not split.port:
                raise ValueError(f"urls: {url!r} is not http://host:port")
        self.options = options
        self._scraper: Scraper | None = None

    @property
    def spool(self) -> Spool:
        if self._scraper is None:
            self._scraper = scraper_for(self.options)
        return self._scraper.spool

    def initialOffset(self) -> dict[str, int]:
        self.spool  # noqa: B018 - start scraping as soon as the query starts
        return {"line": 0}

    def read(self, start: dict[str, int]) -> tuple[Iterator[tuple[Any, ...]], dict[str, int]]:
        spool = self.spool
        end = spool.count()
        rows = [as_row(record, METRIC_FIELDS) for record in spool.read(start["line"], end)]
        return iter(rows), {"line": end}

    def readBetweenOffsets(self, start: dict[str, int], end: dict[str, int]) -> Iterator[tuple[Any, ...]]:
        # may run in another Python worker: reads the spool file, starts no scraper
        spool = self._scraper.spool if self._scraper is not None else Spool(self.options["spool"])
        return iter([as_row(record, METRIC_FIELDS) for record in spool.read(start["line"], end["line"])])

    def commit(self, end: dict[str, int]) -> None:
        pass


class MetricsDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "skipmq_metrics"

    def schema(self) -> str:
        return METRIC_SCHEMA

    def simpleStreamReader(self, schema: StructType) -> MetricsReader:
        return MetricsReader(dict(self.options))
