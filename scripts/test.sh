#!/usr/bin/env bash
# The project's test command (the README's second quick-start command; .ci/run runs it).
# Sets up from nothing, runs lint and type checks, then the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check broker overlay simulation tools pipeline tests bench dashboards
.venv/bin/ruff format --check -q broker overlay simulation tools pipeline tests bench dashboards
.venv/bin/mypy
.venv/bin/lint-imports --no-cache  # the import contracts of pyproject.toml [tool.importlinter]
set +e
# Three worker processes (pytest-xdist) on 2 cores: most process and pipeline tests wait on
# brokers, clients and the Spark JVM, so a third worker fills the cores (2026-11-28, fresh clones:
# 711 s with 2 workers, 595 s with 3; docs/testing.md); --dist loadfile keeps a module's tests (and
# its module-scoped cluster, and the one Spark session of tests/pipeline/test_pipeline_job.py) on
# one worker. SKIPMQ_TEST_WORKERS=0 runs everything in this process (docs/testing.md).
# --no-loadscope-reorder: the files go out in the order tests/conftest.py gives them, the longest
# first (tests/file_durations.json), so that no long file starts last while the other worker idles.
.venv/bin/python -m pytest -q -n "${SKIPMQ_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
rc=$?
set -e
# pytest exits 5 when it collected no test: that is a failure for this project, not a pass.
if [ "$rc" = 5 ]; then echo "test: no tests collected" >&2; exit 1; fi
exit "$rc"
