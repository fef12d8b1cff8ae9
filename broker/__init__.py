"""SkipMQ broker: the adapters (MQTT listeners, SQLite store, HTTP, metrics) around pure cores."""

__version__ = "0.1.0"
