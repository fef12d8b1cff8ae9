"""bench/cluster_bench.py --update-docs: the report goes between the page's markers, below the
hand-written summary table of docs/benchmarks-cluster.md, and the rest of the page is kept."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.support.paths import REPO_ROOT


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cluster_bench", REPO_ROOT / "bench" / "cluster_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("cluster_bench", module)
    spec.loader.exec_module(module)
    return module


def test_report_goes_between_the_markers_below_the_summary_table() -> None:
    bench = load_bench()
    page = (REPO_ROOT / "docs" / "benchmarks-cluster.md").read_text()
    assert page.count(bench.REPORT_BEGIN) == page.count(bench.REPORT_END) == 1
    first = bench.with_report(page, "## The last full run\n\nreport one\n")
    second = bench.with_report(first, "## The last full run\n\nreport two\n")
    for written, report, stale in ((first, "report one", None), (second, "report two", "report one")):
        assert written.startswith("# Cluster benchmarks")
        # the summary table stays first: above the report, and nothing of the page is lost
        assert written.index("## Today's figures") < written.index(report) < written.index("## Throughput")
        before, _, rest = page.partition(bench.REPORT_BEGIN)
        after = rest.partition(bench.REPORT_END)[2]
        assert written.startswith(before) and written.endswith(after)
        assert stale is None or stale not in written
    assert bench.with_report(second, "## The last full run\n\nreport two\n") == second


def test_page_without_markers_gets_the_report_at_its_end() -> None:
    bench = load_bench()
    page = "# Cluster benchmarks\n\n## Today's figures\n\n| a | b |\n"
    written = bench.with_report(page, "## The last full run\n")
    assert written.startswith(page) and written.rstrip().endswith(bench.REPORT_END)
    assert bench.with_report(written, "## The last full run\n") == written
