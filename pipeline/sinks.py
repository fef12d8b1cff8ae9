"""The pipeline's sinks: Parquet tables, the console, and retained findings over MQTT.

Parquet: one directory per table under the output directory, partitioned by ``date`` and
``window`` (the window's start, ``yyyyMMddTHHmmss``). Each micro-batch overwrites exactly the
partitions of the windows it holds (dynamic partition overwrite), so a micro-batch replayed after
a restart from the checkpoint rewrites its windows instead of adding a second copy: no window is
lost (the checkpointed offsets replay it) and none is duplicated.

MQTT: the latest findings as retained JSON on ``$SYS/skipmq/analytics/<table>`` at every broker
given (``$SYS`` is per broker: the cluster never forwards it), for brokers, dashboards and devices.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("skipmq.pipeline")
ANALYTICS_PREFIX = "$SYS/skipmq/analytics"


def write_parquet(frame: pd.DataFrame, out_dir: str, table: str) -> None:
    """Overwrite this frame's (date, window) partitions of ``table`` (pyarrow's dataset writer with
    ``delete_matching``: Spark's dynamic partition overwrite; the tables read back with Spark,
    pandas or any Parquet reader)."""
    if frame.empty:
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_to_dataset(
        pa.Table.from_pandas(frame, preserve_index=False),
        f"{out_dir}/{table}",
        partition_cols=["date", "window"],
        existing_data_behavior="delete_matching",
        basename_template="part-{i}.parquet",
        coerce_timestamps="us",  # Spark reads microseconds, not pandas' nanoseconds
        allow_truncated_timestamps=True,
    )


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if value != value:  # NaN / NaT
        return None
    return value.item() if hasattr(value, "item") else value


def rows_as_json(frame: pd.DataFrame, limit: int = 100) -> list[dict[str, Any]]:
    records = frame.head(limit).drop(columns=["date", "window"], errors="ignore").to_dict("records")
    return [{str(key): _plain(value) for key, value in record.items()} for record in records]


class FindingsPublisher:
    """One paho client per broker; publishes retained QoS 1 findings. Best effort while a broker
    is down; the latest finding of each table is published again when a client (re)connects, so
    a broker that was down, or not yet connected at the batch, still ends up with it retained."""

    def __init__(
        self,
        brokers: list[tuple[str, int]],
        client_id: str = "skipmq-pipeline-findings",
        *,
        username: str = "",
        password: str = "",
    ) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self._lock = threading.Lock()
        self._latest: dict[str, str] = {}  # table -> the payload of its latest finding
        self.clients: list[Any] = []
        for host, port in brokers:
            client = paho.Client(
                callback_api_version=CallbackAPIVersion.VERSION2,
                client_id=f"{client_id}-{host}-{port}",
                protocol=paho.MQTTv5,
            )
            if username:  # a broker with an ACL grants this user $SYS/skipmq/analytics/# (docs/security.md)
                client.username_pw_set(username, password or None)
            client.on_connect = self._on_connect
            client.reconnect_delay_set(1, 5)
            client.connect_async(host, port, keepalive=15)
            client.loop_start()
            self.clients.append(client)

    def _on_connect(self, client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if getattr(reason, "is_failure", False):
            return
        with self._lock:
            latest = dict(self._latest)
        for table, payload in latest.items():
            client.publish(f"{ANALYTICS_PREFIX}/{table}", payload, qos=1, retain=True)

    def publish(self, table: str, findings: dict[str, Any]) -> None:
        payload = json.dumps(findings, separators=(",", ":"), default=str)
        with self._lock:
            self._latest[table] = payload
        for client in self.clients:
            if client.is_connected():
                client.publish(f"{ANALYTICS_PREFIX}/{table}", payload, qos=1, retain=True)

    def close(self) -> None:
        for client in self.clients:
            client.loop_stop()
            client.disconnect()
