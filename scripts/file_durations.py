"""Writes tests/file_durations.json, the seconds each test file takes, from pytest JUnit reports.

tests/conftest.py hands the longest files to the two pytest-xdist workers first (docs/testing.md
"Where the time goes"); this keeps its table current. After a whole run with a report::

    bash scripts/test.sh --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/file_durations.py /tmp/suite.xml

Each file's figure is the sum of its tests' setup, call and teardown times. Files of the table that
the reports do not mention keep their figure (a partial run refreshes what it ran); files under
``--min-s`` are left out (they run after the listed ones, in collection order).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tests" / "file_durations.json"


def test_file(classname: str) -> str | None:
    """``tests.unit.x.test_y`` or ``tests.unit.x.test_y.TestClass`` -> ``tests/unit/x/test_y.py``."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = "/".join(parts[:end]) + ".py"
        if (ROOT / candidate).is_file():
            return candidate
    return None


def file_seconds(reports: list[Path]) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            path = test_file(case.get("classname", ""))
            if path is not None:
                seconds[path] += float(case.get("time", "0") or 0)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reports", nargs="+", type=Path, help="JUnit XML reports (pytest --junitxml)")
    parser.add_argument(
        "--min-s", type=float, default=12.0, help="leave out files shorter than this (default 12)"
    )
    parser.add_argument("--table", type=Path, default=TABLE, help=f"the table to update (default {TABLE})")
    args = parser.parse_args(argv)
    measured = file_seconds(args.reports)
    if not measured:
        print("file_durations: no test cases in the reports", file=sys.stderr)
        return 1
    table: dict[str, float] = json.loads(args.table.read_text()) if args.table.exists() else {}
    table.update({path: round(seconds) for path, seconds in measured.items()})
    kept = {path: s for path, s in table.items() if s >= args.min_s and (ROOT / path).is_file()}
    ordered = dict(sorted(kept.items(), key=lambda item: (-item[1], item[0])))
    args.table.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"file_durations: {len(ordered)} files in {args.table} ({len(measured)} measured)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
