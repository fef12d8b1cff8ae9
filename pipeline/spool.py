"""An append-only spool of JSON lines whose line numbers are a streaming source's offsets.

What the sources receive (MQTT snapshots as they arrive, HTTP scrapes as they are taken) is written
here first; Spark's offsets are line counts, so any range of offsets can be read again after a
restart (``readBetweenOffsets``) and a restart resumes exactly at the committed offset. Writers and
readers may be different threads of one process; a line is counted only once written and flushed.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


class Spool:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.path.touch(exist_ok=True)
        self._starts: list[int] = []  # byte offset of each complete line
        self._size = 0  # bytes of complete lines seen
        self._index()

    def _index(self) -> None:
        """Index the complete lines past those already indexed (another process may append)."""
        with self.path.open("rb") as handle:
            handle.seek(self._size)
            position = self._size
            for line in handle:
                if not line.endswith(b"\n"):
                    break
                self._starts.append(position)
                position += len(line)
            self._size = position

    def append(self, records: Iterable[dict[str, Any]]) -> int:
        """Write ``records`` (one line each); the line count after them."""
        lines = "".join(json.dumps(record, separators=(",", ":")) + "\n" for record in records)
        with self._lock:
            if lines:
                with self.path.open("a", encoding="utf-8") as handle:
                    handle.write(lines)
                    handle.flush()
                    os.fsync(handle.fileno())
                self._index()
            return len(self._starts)

    def recent_keys(self, limit: int) -> list[tuple[str, int, float]]:
        """(broker, seq, ts) of the snapshot records among the last ``limit`` lines."""
        start = max(0, self.count() - limit)
        keys = dict.fromkeys(
            (r["broker"], r["seq"], r["ts"]) for r in self.read(start, self.count()) if "seq" in r
        )
        return list(keys)

    def count(self) -> int:
        with self._lock:
            return len(self._starts)

    def read(self, start: int, end: int) -> Iterator[dict[str, Any]]:
        """The records of lines ``start`` (inclusive) to ``end`` (exclusive)."""
        with self._lock:
            if end > len(self._starts):
                self._index()
            end = min(end, len(self._starts))
            if end <= start:
                return
            first = self._starts[start]
        with self.path.open("rb") as handle:
            handle.seek(first)
            for _ in range(end - start):
                yield json.loads(handle.readline())
