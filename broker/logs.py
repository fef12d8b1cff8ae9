"""Structured logging for the broker on the stdlib ``logging`` module.

``setup_logging(level, fmt)`` configures the root logger to write to stderr (stdout stays free
for the CLI): ``"json"`` writes one JSON object per line with ``ts`` (ISO 8601 UTC), ``level``,
``logger``, ``msg`` and every extra field; ``"text"`` writes ``ts LEVEL logger msg key=value ...``.

``log_event(logger, level, "malformed_packet", client_id=..., reason=...)`` logs an event with
fields: ``msg`` and ``event`` are the event name, the fields become top-level keys (a field that
would clash with ``ts``/``level``/``logger``/``msg``/``event`` is written as ``field_<name>``).
Plain ``logger.info("...", extra={...})`` calls get their extra fields in the output as well.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
FORMATS = ("json", "text")

_BASE_KEYS = frozenset({"ts", "level", "logger", "msg", "event"})
_FIELDS_ATTR = "skipmq_fields"
# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    _FIELDS_ATTR,
}


def _timestamp(record: logging.LogRecord) -> str:
    seconds = int(record.created)
    millis = int((record.created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields of a record: ``extra=`` attributes plus ``log_event`` fields."""
    fields = {key: value for key, value in record.__dict__.items() if key not in _STANDARD_ATTRS}
    fields.update(getattr(record, _FIELDS_ATTR, {}))
    return fields


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record_fields(record).items():
            entry[key if key not in entry else f"field_{key}"] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=_json_default, ensure_ascii=False)


def _text_value(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    text = str(value)
    if not text or any(char.isspace() or char in '"=' for char in text):
        return json.dumps(text, ensure_ascii=False)
    return text


class TextFormatter(logging.Formatter):
    """Readable lines: ``2026-01-01T00:00:00.000Z INFO broker.core listening port=1883``."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), f"{record.levelname:<7}", record.name, record.getMessage()]
        fields = record_fields(record)
        if fields.get("event") == record.getMessage():
            del fields["event"]
        parts.extend(f"{key}={_text_value(value)}" for key, value in fields.items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class _SkipmqHandler(logging.StreamHandler[TextIO]):
    """Marks the handler setup_logging installed, so a second call replaces it."""


def setup_logging(level: str, fmt: str, *, stream: TextIO | None = None) -> None:
    """Configure the root logger: ``level`` in LEVELS, ``fmt`` "json" or "text"; output to stderr."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _SkipmqHandler):
            root.removeHandler(handler)
            handler.close()
    handler = _SkipmqHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(LEVELS[level])


def log_event(logger: logging.Logger, level: int, event: str, /, **fields: Any) -> None:
    """Log ``event`` with structured ``fields`` (cheap when the level is disabled)."""
    if not logger.isEnabledFor(level):
        return
    safe: dict[str, Any] = {"event": event}
    safe.update({(f"field_{key}" if key in _BASE_KEYS else key): value for key, value in fields.items()})
    logger.log(level, event, extra={_FIELDS_ATTR: safe}, stacklevel=2)
