#!/usr/bin/env bash
# Installs everything SkipMQ and its tests need, from nothing: a virtualenv in .venv with the
# package and its [dev] extra, and Debian's mosquitto clients for the CLI interop tests.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
if ! command -v mosquitto_pub >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian mosquitto-clients (for the CLI interop tests)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto-clients >/dev/null
  else
    echo "setup: mosquitto_pub not found and cannot apt-get; the mosquitto CLI tests will fail" >&2
  fi
fi
echo "setup: ready (.venv)"
