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
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
# pytest exits 5 when it collected no test: that is a failure for this project, not a pass.
if [ "$rc" = 5 ]; then echo "test: no tests collected" >&2; exit 1; fi
exit "$rc"
