"""Writes tests/file_durations.json, the seconds each test file takes, from pytest JUnit reports.

tests/conftest.py hands the longest files to the three pytest-xdist workers first (docs/testing.md
"Where the time goes"); this keeps its table current. After a whole run with a report::

    bash scripts/test.sh --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/file_durations.py /tmp/suite.xml
    .venv/bin/python scripts/file_durations.py --groups /tmp/suite.xml  # tests and seconds per directory

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


def group_of(path: str) -> str:
    """The directory a test file is counted in: ``tests/unit/broker``, ``tests/pipeline``, ..."""
    parts = path.split("/")
    depth = 3 if len(parts) > 3 and parts[1] in ("process", "sim", "unit") else 2
    return "/".join(parts[:depth]).removesuffix(".py")


def group_costs(reports: list[Path]) -> dict[str, tuple[int, float]]:
    """Per group of ``group_of``: (tests, seconds of setup, call and teardown summed)."""
    costs: dict[str, tuple[int, float]] = {}
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            path = test_file(case.get("classname", ""))
            if path is not None:
                count, seconds = costs.get(group_of(path), (0, 0.0))
                costs[group_of(path)] = (count + 1, seconds + float(case.get("time", "0") or 0))
    return costs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reports", nargs="+", type=Path, help="JUnit XML reports (pytest --junitxml)")
    parser.add_argument(
        "--min-s", type=float, default=12.0, help="leave out files shorter than this (default 12)"
    )
    parser.add_argument("--table", type=Path, default=TABLE, help=f"the table to update (default {TABLE})")
    parser.add_argument(
        "--groups",
        action="store_true",
        help="print tests and seconds per directory instead (table untouched)",
    )
    args = parser.parse_args(argv)
    if args.groups:
        costs = group_costs(args.reports)
        for group, (count, seconds) in sorted(costs.items(), key=lambda item: -item[1][1]):
            print(f"{group:32} {count:6d} tests {seconds:9.1f} s")
        total_tests = sum(count for count, _ in costs.values())
        total_s = sum(seconds for _, seconds in costs.values())
        print(f"{'all':32} {total_tests:6d} tests {total_s:9.1f} s")
        return 0 if costs else 1
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
