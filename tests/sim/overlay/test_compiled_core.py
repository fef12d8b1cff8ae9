"""``paper_sweep.py --compiled``: the overlay core compiled with mypyc (bench/compiled_core.py)
gives the same sweep, path by path, as the interpreted core, and says which core ran.

One compilation and two small sweeps, run as the user runs them, except that the C compiler
optimizes nothing (``MYPYC_OPT_LEVEL=0``, which ``python -m mypyc`` reads; the user's build is
``-O3``): what is checked is that the compiled modules run the same sweep, which the C compiler's
optimization level does not change, and gcc's ``-O3`` on mypyc's generated C is most of the
test's CPU time (docs/testing.md "Shortened tests").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SWEEP = [
    "--nodes",
    "200",
    "--seeds",
    "1",
    "--table-sizes",
    "8",
    "--systems",
    "proposed,sgtbps",
    "--subscribers",
    "5,10,20",
    "--jobs",
    "2",
]


def _sweep(out: Path, *extra: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "paper_sweep.py"), *SWEEP, *extra, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return (out / "paper_sweep_summary.md").read_text()


def test_the_compiled_core_runs_the_same_sweep(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "SKIPMQ_COMPILED_CORE"}
    env["SKIPMQ_COMPILED_CORE_CACHE"] = str(tmp_path / "cache")
    env["MYPYC_OPT_LEVEL"] = "0"  # the same C, compiled without optimization (module docstring)
    interpreted = _sweep(tmp_path / "interpreted", env=env)
    compiled = _sweep(tmp_path / "compiled", "--compiled", env=env)

    assert "core interpreted (CPython)" in interpreted
    assert "core compiled with mypyc" in compiled
    assert "overlay.node" in compiled and "overlay.sim.engine" in compiled
    assert "overlay.messages" in compiled and "overlay.api" in compiled
    # a C extension really was built and imported, not the sources beside it
    assert list((tmp_path / "cache").glob("*/overlay/node.*.so"))
    runs_interpreted = (tmp_path / "interpreted" / "paper_sweep_runs.csv").read_text()
    runs_compiled = (tmp_path / "compiled" / "paper_sweep_runs.csv").read_text()
    assert runs_interpreted.count("\n") == 1 + 2 * 3  # header, 2 systems x 3 subscriber counts
    assert runs_compiled == runs_interpreted
