"""``skipmq_snapshots``: a streaming source of the brokers' per-class snapshots over MQTT.

One paho-mqtt client per broker (``$SYS`` is never forwarded between brokers, so each broker is
asked for its own) with a persistent session (clean start 0, ``session_expiry_s``) subscribed at
QoS 1 to ``$SYS/skipmq/+/classes``: snapshots published while the job is down wait in the
brokers' queues. Each snapshot is flattened (``pipeline.records``) and appended to the spool
before paho acknowledges it; Spark's offsets are spool line counts.

Options: ``brokers`` (host:port,...; required), ``spool`` (file; required), ``client_id``
(default ``skipmq-pipeline``), ``topic``, ``session_expiry_s`` (3600), ``username``/``password``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.types import StructType

from pipeline.records import (
    SNAPSHOT_FIELDS,
    SNAPSHOT_SCHEMA,
    BadSnapshot,
    as_row,
    parse_brokers,
    snapshot_records,
)
from pipeline.spool import Spool

log = logging.getLogger("skipmq.pipeline")
DEFAULT_TOPIC = "$SYS/skipmq/+/classes"
RECENT_KEYS = 10_000
SETTLE_S = 2.0
START_WAIT_S = 15.0


class SnapshotListener:
    """The paho clients feeding one spool (in the process that runs the source's reader)."""

    def __init__(self, options: dict[str, str], spool: Spool) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.spool = spool
        self.bad = 0
        # (broker, seq, ts) of the snapshots spooled lately: one delivered again (the pipeline
        # stopped after spooling it and before acknowledging it) is not spooled twice
        self._seen: dict[tuple[str, int, float], None] = dict.fromkeys(spool.recent_keys(RECENT_KEYS))
        self.topic = options.get("topic", DEFAULT_TOPIC)
        client_id = options.get("client_id", "skipmq-pipeline")
        expiry_s = int(options.get("session_expiry_s", "3600"))
        self._lock = threading.Lock()
        self.clients: list[Any] = []
        self.started = time.monotonic()
        self._subscribed: set[int] = set()  # ids of the clients whose subscription was acknowledged
        self.all_subscribed_at: float | None = None
        brokers = parse_brokers(options["brokers"])
        self.expected = len(brokers)
        for host, port in brokers:
            client = paho.Client(
                callback_api_version=CallbackAPIVersion.VERSION2,
                client_id=f"{client_id}-{host}-{port}",
                protocol=paho.MQTTv5,
            )
            if options.get("username"):
                client.username_pw_set(options["username"], options.get("password"))
            client.on_connect = self._on_connect
            client.on_message = self._on_message
            client.on_subscribe = self._on_subscribe
            client.reconnect_delay_set(1, 5)
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = expiry_s
            client.connect_async(host, port, keepalive=15, clean_start=False, properties=props)
            client.loop_start()
            self.clients.append(client)

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if not reason.is_failure:
            client.subscribe(self.topic, qos=1)

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        with self._lock:
            self._subscribed.add(id(client))
            if len(self._subscribed) == self.expected and self.all_subscribed_at is None:
                self.all_subscribed_at = time.monotonic()

    def settled(self) -> bool:
        """Every broker's queued snapshots had their chance to arrive (each client subscribed, then
        SETTLE_S), or START_WAIT_S passed (a broker is down). Until then the reader hands Spark
        nothing: a snapshot queued while the job was down, arriving in a later micro-batch than a
        newer one from another broker, would be behind the watermark and dropped."""
        now = time.monotonic()
        ready = self.all_subscribed_at is not None and now >= self.all_subscribed_at + SETTLE_S
        return ready or now >= self.started + START_WAIT_S

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        try:
            records = snapshot_records(message.payload)
        except BadSnapshot as exc:
            self.bad += 1
            log.warning("pipeline: dropped a bad snapshot on %s: %s", message.topic, exc)
            return
        if not records:
            return
        key = (records[0]["broker"], records[0]["seq"], records[0]["ts"])
        with self._lock:
            if key in self._seen:
                return
            self._seen[key] = None
            if len(self._seen) > RECENT_KEYS:
                del self._seen[next(iter(self._seen))]
            self.spool.append(records)  # before paho's PUBACK: a crash now means a resend, not a loss

    def close(self) -> None:
        for client in self.clients:
            client.loop_stop()
            client.disconnect()


_LISTENERS: dict[str, SnapshotListener] = {}
_LOCK = threading.Lock()


def listener_for(options: dict[str, str]) -> SnapshotListener:
    """One listener per spool in a process, however often Spark builds a reader."""
    path = options["spool"]
    with _LOCK:
        listener = _LISTENERS.get(path)
        if listener is None:
            listener = _LISTENERS[path] = SnapshotListener(options, Spool(path))
        return listener


class SnapshotReader(SimpleDataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        if "spool" not in options or "brokers" not in options:
            raise ValueError("skipmq_snapshots needs the options brokers (host:port,...) and spool (a file)")
        parse_brokers(options["brokers"])
        self.options = options
        self._listener: SnapshotListener | None = None

    @property
    def spool(self) -> Spool:
        if self._listener is None:
            self._listener = listener_for(self.options)
        return self._listener.spool

    def initialOffset(self) -> dict[str, int]:
        self.spool  # noqa: B018 - start listening as soon as the query starts
        return {"line": 0}

    def read(self, start: dict[str, int]) -> tuple[Iterator[tuple[Any, ...]], dict[str, int]]:
        spool = self.spool
        assert self._listener is not None
        if not self._listener.settled():
            return iter([]), start
        end = spool.count()
        rows = [as_row(record, SNAPSHOT_FIELDS) for record in spool.read(start["line"], end)]
        return iter(rows), {"line": end}

    def readBetweenOffsets(self, start: dict[str, int], end: dict[str, int]) -> Iterator[tuple[Any, ...]]:
        # may run in another Python worker than read(): it reads the spool file and starts no
        # listener (a second client with the same id would take the first one's session over)
        spool = self._listener.spool if self._listener is not None else Spool(self.options["spool"])
        rows = [as_row(record, SNAPSHOT_FIELDS) for record in spool.read(start["line"], end["line"])]
        return iter(rows)

    def commit(self, end: dict[str, int]) -> None:
        pass


class SnapshotDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "skipmq_snapshots"

    def schema(self) -> str:
        return SNAPSHOT_SCHEMA

    def simpleStreamReader(self, schema: StructType) -> SnapshotReader:
        return SnapshotReader(dict(self.options))
