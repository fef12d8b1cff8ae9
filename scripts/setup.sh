#!/usr/bin/env bash
# Installs everything SkipMQ and its tests need, from nothing: a virtualenv in .venv with the
# package and its [dev] and [spark] extras (the pipeline's tests run PySpark; Java 17+ must be
# on the machine, see docs/pipeline.md), and Debian's mosquitto clients (mosquitto_pub/sub, for the CLI
# interop tests) and mosquitto itself (mosquitto_passwd, for the password-file compatibility test),
# and Debian's prometheus for promtool (tests/unit/test_prometheus_rules.py checks and unit-tests
# deploy/prometheus/skipmq.rules.yml with it), iproute2 (`ip netns`: the netsplit, replication
# and quick-start pipeline tests, tools/netns.py) and openssl (tests/unit/transport/test_certs.py).
# On a plain Debian it also installs python3-venv first (python3 -m venv needs its ensurepip).
# Benchmark-only tools (redis-server, Node.js, valgrind, strace, py-spy) are not installed:
# bench/README.md "What the benchmarks need" says how to get them.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1 || ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: SkipMQ needs Python 3.11+: '$PY' is not (PYTHON=/path/to/python3.11 chooses another)" >&2
  exit 1
fi
new_venv=0
# a .venv without pip is what an earlier `python3 -m venv` without ensurepip left: made again
[ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1 || new_venv=1
missing=""
# Debian's python3 has no venv module (ensurepip) unless python3-venv is installed
[ "$new_venv" = 0 ] || "$PY" -c 'import ensurepip' >/dev/null 2>&1 || missing="$missing python3-venv"
command -v mosquitto_pub >/dev/null 2>&1 || missing="$missing mosquitto-clients"
command -v mosquitto_passwd >/dev/null 2>&1 || missing="$missing mosquitto"
command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
# the web console's browser test (tests/process/admin/test_console_browser.py) drives Debian's chromium
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
# Spark 4 (the pipeline, pipeline/) runs on Java 17+; pipeline/session.py finds it or says what is missing
command -v java >/dev/null 2>&1 || [ -x "${JAVA_HOME:-/nonexistent}/bin/java" ] || missing="$missing openjdk-17-jre-headless"
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian$missing (for the venv, the interop, password-file, Prometheus rules, netns and pipeline tests)"
    apt-get update -qq >/dev/null
    # an image without man directories (scripts/build_image.sh's Debian base removes them) fails
    # openjdk's post-installation script without this one (update-alternatives' java.1.gz link)
    case "$missing" in *openjdk*) mkdir -p /usr/share/man/man1 ;; esac
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "setup: missing$missing and cannot apt-get; the mosquitto / promtool / netns / pipeline tests will fail or skip" >&2
  fi
fi
if [ "$new_venv" = 1 ]; then
  "$PY" -m venv --clear .venv
fi
# One pip call, with the venv's own pip (Python 3.11's ensurepip brings pip 23.2, which installs all
# of this; upgrading it first was one more index query and install). --no-compile: pip does not
# byte-compile the ~1.7 GB it installs (pyspark alone is ~490 MB); Python compiles the modules a
# process imports on first use, a fraction of them (pip's CPU 67 s -> 45 s, docs/testing.md).
.venv/bin/python -m pip install -q --no-compile -e '.[dev,spark]'
echo "setup: ready (.venv)"
