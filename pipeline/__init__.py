"""SkipMQ's data pipeline on Spark (issue #13; docs/pipeline.md).

A PySpark Structured Streaming job over a live cluster: two streaming sources (``pipeline.sources``:
the brokers' per-class snapshots over MQTT, their ``/metrics`` over HTTP), event-time windows with
watermarks (``pipeline.compute``), and sinks (``pipeline.sinks``: Parquet with checkpoints, the
console, retained findings on ``$SYS/skipmq/analytics/...``). ``python -m pipeline`` runs it,
``python -m pipeline.report`` charts its Parquet output. Needs the ``skipmq[spark]`` extra.
"""
