"""Suite-wide: the order in which test files run, longest first (docs/testing.md).

scripts/test.sh runs the suite in three pytest-xdist workers with ``--dist loadfile``: each file is
one unit of work, handed to whichever worker runs low, in collection order (``--no-loadscope-reorder``:
xdist's own order, most tests first, put the long one-test files such as the pipeline's quick start
at the end, where one worker ran them while the other was idle). Here the files are ordered by
their measured seconds, tests/file_durations.json (``scripts/file_durations.py`` refreshes it from
a run's JUnit report), longest first; files not in the table are short and follow in collection
order. Within a file the order never changes (module-scoped fixtures, scenarios).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILE_DURATIONS = Path(__file__).with_name("file_durations.json")


def _relative(item: pytest.Item) -> str:
    try:
        return item.path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return item.path.as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds: dict[str, float] = json.loads(FILE_DURATIONS.read_text())
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(_relative(item), index)

    def order(item: pytest.Item) -> tuple[float, int]:
        path = _relative(item)
        return (-seconds.get(path, 0.0), first_seen[path])

    items.sort(key=order)  # stable: a file's tests keep their order
