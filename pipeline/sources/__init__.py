"""The pipeline's streaming sources (PySpark Python Data Source API, simple stream readers).

Both write what they receive to a ``pipeline.spool.Spool`` before Spark sees it, and use its line
counts as offsets: a restart from a checkpoint replays exactly the committed ranges.

- ``skipmq_snapshots`` (``mqtt_snapshots``): the per-class snapshots every broker publishes on
  ``$SYS/skipmq/<broker-id>/classes``. Per class, pushed, complete: the source for class-level
  analytics (rates, hot classes, hops, wasted forwards, crossings of L, per-broker load).
- ``skipmq_metrics`` (``http_metrics``): every broker's Prometheus ``/metrics``, brokers found
  through ``/cluster``. Broker-wide, pulled: works against brokers of any version (no snapshots
  needed) and carries what snapshots do not (bytes, drops, process CPU and memory, queue depth).
"""

from pipeline.sources.http_metrics import MetricsDataSource
from pipeline.sources.mqtt_snapshots import SnapshotDataSource

__all__ = ["MetricsDataSource", "SnapshotDataSource"]
