#!/usr/bin/env bash
# Installs everything SkipMQ and its tests need, from nothing: a virtualenv in .venv with the
# package and its [dev] and [spark] extras (the pipeline's tests run PySpark; Java 17+ must be
# on the machine, see docs/pipeline.md), and Debian's mosquitto clients (mosquitto_pub/sub, for the CLI
# interop tests) and mosquitto itself (mosquitto_passwd, for the password-file compatibility test),
# and Debian's prometheus for promtool (tests/unit/test_prometheus_rules.py checks and unit-tests
# deploy/prometheus/skipmq.rules.yml with it).
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev,spark]'
missing=""
command -v mosquitto_pub >/dev/null 2>&1 || missing="$missing mosquitto-clients"
command -v mosquitto_passwd >/dev/null 2>&1 || missing="$missing mosquitto"
command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
# the web console's browser test (tests/process/admin/test_console_browser.py) drives Debian's chromium
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
# Spark 4 (the pipeline, pipeline/) runs on Java 17+; pipeline/session.py finds it or says what is missing
command -v java >/dev/null 2>&1 || [ -x "${JAVA_HOME:-/nonexistent}/bin/java" ] || missing="$missing openjdk-17-jre-headless"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian$missing (for the interop, password-file, Prometheus rules and pipeline tests)"
    apt-get update -qq >/dev/null
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "setup: missing$missing and cannot apt-get; the mosquitto / promtool / pipeline tests will fail" >&2
  fi
fi
echo "setup: ready (.venv)"
