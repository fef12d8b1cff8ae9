#!/usr/bin/env bash
# Builds the SkipMQ broker image (the repository's Dockerfile) with podman, from nothing: no
# Docker daemon and no registry needed. docs/operations.md "Image".
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bash scripts/build_image.sh [options]

Builds the broker image from the repository's Dockerfile with podman, where no base image can be
pulled: the base root filesystem is made from Debian's packages instead of python:3.11-slim.

  1. base   debootstrap (minbase) Debian bookworm with python3.11 and its venv module, Debian's
            security and point-release updates applied; apt lists and caches, docs (but each
            package's copyright file), man pages and locales removed; imported with
            `podman import` as localhost/skipmq-base:bookworm. Kept for the next build
            (--rebuild-base makes it again).
  2. image  podman build --runtime runc --network host --format docker \
              --build-arg BASE_IMAGE=localhost/skipmq-base:bookworm -t skipmq:dev -t skipmq:VERSION .
            (the Dockerfile's default base stays python:3.11-slim; docker format keeps HEALTHCHECK;
            its runtime-root stage trims the base with docker/slim-root.sh: no apt, perl, pip)
  3. report the image size and what each layer costs (uncompressed, and gzip-compressed as a
            registry would store it), the largest installed packages, and start to ready: a
            container started as the chart runs it (read-only root, uid 10001, a volume on
            /var/lib/skipmq) until GET /readyz answers 200.

Options:
  --tag NAME        image name (default skipmq:dev; also tagged skipmq:<project version>)
  --base NAME       use this base image instead of making one (e.g. python:3.11-slim if it can be
                    pulled); skips step 1
  --rebuild-base    make the Debian base again even if it exists
  --start-runs N    containers started for the start-to-ready figure (default 5; 0 = none)
  --no-report       build only
  -h, --help        this text

On the host (needs root for what is missing; each change is printed):
  - installs Debian's podman, runc and debootstrap with apt-get if they are missing;
  - writes /etc/containers/containers.conf only if it does not exist, with
      [containers] default_ulimits = []
    (podman's default ulimits make runc call setrlimit, which some sandboxes refuse);
    an existing file is left as it is.
Podman keeps images under /var/lib/containers/storage (base ~130 MB, image ~126 MB); the
debootstrap download cache is /var/cache/skipmq-image/debs. Intermediate build images are removed.

Then: .venv/bin/pytest tests/process/image   (the container tests; they skip when the image is absent)
EOF
}

cd "$(dirname "$0")/.."
REPO=$(pwd)
TAG=skipmq:dev
BASE=""
BASE_DEFAULT=localhost/skipmq-base:bookworm
REBUILD_BASE=0
START_RUNS=5
REPORT=1
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) TAG=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --rebuild-base) REBUILD_BASE=1; shift ;;
    --start-runs) START_RUNS=$2; shift 2 ;;
    --no-report) REPORT=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build_image: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

T0=$(date +%s)
say() { printf '[build_image %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { echo "build_image: $*" >&2; exit 1; }

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
[ -n "$VERSION" ] || die "cannot read the project version from pyproject.toml"

# --- host prerequisites ---------------------------------------------------------------------
missing=""
command -v podman >/dev/null 2>&1 || missing="$missing podman"
command -v runc >/dev/null 2>&1 || missing="$missing runc"
if [ -z "$BASE" ]; then command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"; fi
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "host: installing Debian packages:$missing (apt-get)"
    APT_LOG=$(mktemp /var/tmp/skipmq-apt.XXXXXX.log)
    # shellcheck disable=SC2086
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing; } >"$APT_LOG" 2>&1; then
      tail -20 "$APT_LOG" >&2
      die "apt-get install$missing failed (log: $APT_LOG)"
    fi
    rm -f "$APT_LOG"
  else
    die "missing:$missing; install them (Debian: apt-get install$missing) or run as root"
  fi
fi
[ "$(id -u)" = 0 ] || say "warning: not root; rootless podman is untested here"
CONF=/etc/containers/containers.conf
if [ "$(id -u)" = 0 ] && [ ! -e "$CONF" ]; then
  say "host: writing $CONF ([containers] default_ulimits = []: no setrlimit in containers)"
  mkdir -p /etc/containers
  printf '# Written by SkipMQ scripts/build_image.sh: podman default ulimits make runc call\n# setrlimit, which this machine refuses.\n[containers]\ndefault_ulimits = []\n' >"$CONF"
elif [ -e "$CONF" ]; then
  say "host: $CONF exists, left as it is"
fi
PODMAN=(podman --runtime runc)

# --- 1. the base --------------------------------------------------------------------------
if [ -z "$BASE" ]; then
  BASE=$BASE_DEFAULT
  if [ "$REBUILD_BASE" = 0 ] && "${PODMAN[@]}" image exists "$BASE"; then
    say "base: $BASE exists (made $("${PODMAN[@]}" image inspect -f '{{.Created}}' "$BASE" | cut -d. -f1)); --rebuild-base to make it again"
  else
    [ "$(id -u)" = 0 ] || die "debootstrap needs root"
    WORK=$(mktemp -d /var/tmp/skipmq-base.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
    CACHE=/var/cache/skipmq-image/debs
    mkdir -p "$CACHE"
    say "base: debootstrap --variant=minbase bookworm + python3, python3-venv into $WORK (packages cached in $CACHE)"
    if ! debootstrap --variant=minbase --cache-dir="$CACHE" --include=python3,python3-venv \
      bookworm "$WORK/rootfs" http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1; then
      tail -20 "$WORK/debootstrap.log" >&2
      die "debootstrap failed (log above)"
    fi
    cat >"$WORK/rootfs/etc/apt/sources.list" <<'EOF'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
    say "base: applying bookworm-updates and bookworm-security (apt-get upgrade in the root)"
    chroot "$WORK/rootfs" apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive chroot "$WORK/rootfs" apt-get -y -qq -o Dpkg::Options::=--force-confold \
      upgrade >"$WORK/upgrade.log" 2>&1 || { tail -20 "$WORK/upgrade.log" >&2; die "apt-get upgrade failed"; }
    chroot "$WORK/rootfs" apt-get clean
    # What Debian's own slim images leave out: docs, man pages, translations; apt lists and logs.
    # Each package's /usr/share/doc/<package>/copyright stays (its license terms: the licenses of
    # what the image redistributes require them; Debian's slim images keep them too).
    # (ensurepip and python3-*-whl stay: the Dockerfile's build stage makes its venv with them)
    rm -rf "$WORK"/rootfs/var/lib/apt/lists/* "$WORK"/rootfs/var/cache/apt/*.bin \
      "$WORK"/rootfs/usr/share/man/* "$WORK"/rootfs/usr/share/info/* \
      "$WORK"/rootfs/usr/share/locale/* "$WORK"/rootfs/usr/share/lintian "$WORK"/rootfs/var/log/*
    find "$WORK"/rootfs/usr/share/doc -mindepth 2 \( -type f -o -type l \) ! -name copyright -delete
    find "$WORK"/rootfs/usr/share/doc -mindepth 2 -type d -empty -delete
    [ -n "$(find "$WORK"/rootfs/usr/share/doc -name copyright -print -quit)" ] \
      || die "no /usr/share/doc/*/copyright left in the base"
    printf 'path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\npath-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\npath-exclude /usr/share/locale/*\n' \
      >"$WORK/rootfs/etc/dpkg/dpkg.cfg.d/skipmq-slim"
    say "base: root filesystem $(du -sh "$WORK/rootfs" | cut -f1); podman import as $BASE"
    tar -C "$WORK/rootfs" --numeric-owner -c . | "${PODMAN[@]}" import --quiet \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
      --message "debootstrap minbase bookworm + python3.11 (SkipMQ scripts/build_image.sh)" \
      - "$BASE" >/dev/null
    rm -rf "$WORK"
    trap - EXIT
  fi
  if ! out=$("${PODMAN[@]}" run --rm --network host "$BASE" python3 -c 'import sys, venv; print(sys.version.split()[0])' 2>&1); then
    echo "$out" >&2
    die "podman cannot run a container from $BASE (above); if it is a setrlimit error, $CONF needs [containers] default_ulimits = []"
  fi
  say "base: $BASE runs (Python $out)"
fi

# --- 2. the image -------------------------------------------------------------------------
say "image: podman build (Dockerfile, BASE_IMAGE=$BASE) -> $TAG, skipmq:$VERSION"
BUILD_ARGS=(--build-arg BASE_IMAGE="$BASE")
HOST_CA=/etc/ssl/certs/ca-certificates.crt
if [ -s "$HOST_CA" ]; then
  # a TLS-intercepting proxy's CA, if the host trusts one, is in this bundle; a build secret is
  # mounted for the pip step only and is in no layer
  say "image: pip in the build trusts the host's CA bundle $HOST_CA (build secret build_ca)"
  BUILD_ARGS+=(--secret "id=build_ca,src=$HOST_CA")
fi
BUILD_LOG=$(mktemp /var/tmp/skipmq-build.XXXXXX.log)
before=$("${PODMAN[@]}" images -a -q --no-trunc | sort -u)
previous=$("${PODMAN[@]}" image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)
if ! "${PODMAN[@]}" build --network host --format docker --layers --pull=never \
  "${BUILD_ARGS[@]}" -t "$TAG" -t "skipmq:$VERSION" -f Dockerfile . 2>&1 \
  | tee "$BUILD_LOG" | grep --line-buffered -E 'STEP [0-9]+/[0-9]+|^Successfully' | sed -u 's/^/    /'; then
  :
fi
if ! "${PODMAN[@]}" image exists "$TAG"; then
  tail -30 "$BUILD_LOG" >&2
  die "podman build failed (log: $BUILD_LOG)"
fi
rm -f "$BUILD_LOG"
# the build's intermediate images (one per step, unnamed; the build stage's among them) are not
# needed once the image is committed: remove the unnamed ones this build made (not others')
after=$("${PODMAN[@]}" images -a -q --no-trunc | sort -u)
removed=0
for id in $(comm -13 <(echo "$before") <(echo "$after")) $previous; do
  if [ "$("${PODMAN[@]}" image inspect -f '{{len .RepoTags}}' "$id" 2>/dev/null)" = 0 ] \
    && "${PODMAN[@]}" rmi "$id" >/dev/null 2>&1; then
    removed=$((removed + 1))
  fi
done
say "image: removed $removed unnamed images (this build's intermediate ones; the previous $TAG if unused)"
say "image: built $TAG ($("${PODMAN[@]}" image inspect -f '{{.Id}}' "$TAG" | cut -c1-12))"

[ "$REPORT" = 1 ] || exit 0

# --- 3. report ----------------------------------------------------------------------------
say "report: sizes (podman image inspect, podman history, gzip -6 of each layer from podman save)"
REPORT_DIR=$(mktemp -d /var/tmp/skipmq-report.XXXXXX)
trap 'rm -rf "$REPORT_DIR"' EXIT
"${PODMAN[@]}" save -q --format docker-archive -o "$REPORT_DIR/image.tar" "$TAG" >/dev/null
python3 - "$REPORT_DIR/image.tar" "$TAG" <<'EOF'
import json, sys, tarfile, zlib

archive, tag = sys.argv[1], sys.argv[2]
with tarfile.open(archive) as tar:
    manifest = json.load(tar.extractfile("manifest.json"))
    config = json.load(tar.extractfile(manifest[0]["Config"]))
    # the image's history, oldest first; each entry without empty_layer made one layer
    steps = [h.get("created_by", "") for h in config.get("history", []) if not h.get("empty_layer")]
    sizes = []
    for name in manifest[0]["Layers"]:
        member = tar.extractfile(name)
        raw = compressed = 0
        packer = zlib.compressobj(6, zlib.DEFLATED, 31)
        while chunk := member.read(1 << 20):
            raw += len(chunk)
            compressed += len(packer.compress(chunk))
        compressed += len(packer.flush())
        sizes.append((raw, compressed))
print(f"  {'layer':>5}  {'size':>9}  {'gzip':>9}  step")
for index, (raw, compressed) in enumerate(sizes):
    step = steps[index] if len(steps) == len(sizes) else "?"
    step = " ".join(step.replace("/bin/sh -c ", "").split())
    print(f"  {index:>5}  {raw / 1e6:8.1f}M  {compressed / 1e6:8.1f}M  {step[:90]}")
total_raw = sum(r for r, _ in sizes)
total_gz = sum(c for _, c in sizes)
print(f"  {'total':>5}  {total_raw / 1e6:8.1f}M  {total_gz / 1e6:8.1f}M  (layer tars; `podman images` shows the same uncompressed)")
EOF
"${PODMAN[@]}" images --format '  podman images: {{.Repository}}:{{.Tag}} {{.Size}}' "$TAG"
say "report: the largest entries of /opt/skipmq (du -sk in the image)"
"${PODMAN[@]}" run --rm --network host --no-healthcheck --entrypoint sh "$TAG" -c \
  'cd /opt/skipmq/lib/python3*/site-packages && du -sk * | sort -rn | head -12 | awk "{printf \"    %6.1fM  %s\n\", \$1/1024, \$2}"; du -sk /opt/skipmq | awk "{printf \"    %6.1fM  /opt/skipmq in all\n\", \$1/1024}"'

if [ "$START_RUNS" -gt 0 ]; then
  say "report: start to ready, $START_RUNS containers (read-only root, uid 10001, volume on /var/lib/skipmq)"
  python3 - "$TAG" "$START_RUNS" <<'EOF'
import json, os, shutil, socket, statistics, subprocess, sys, tempfile, time, urllib.error, urllib.request

tag, runs = sys.argv[1], int(sys.argv[2])

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False

from_start, from_run = [], []
for run in range(runs):
    data = tempfile.mkdtemp(prefix="skipmq-start-", dir="/var/tmp")
    os.chown(data, 10001, 10001)
    mqtt, http = free_port(), free_port()
    name = f"skipmq-start-{os.getpid()}-{run}"
    args = ["podman", "--runtime", "runc", "create", "--name", name, "--network", "host", "--read-only",
            "--read-only-tmpfs=false", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt",
            "no-new-privileges", "-v", f"{data}:/var/lib/skipmq",
            "-e", f"SKIPMQ_LISTENERS_TCP_PORT={mqtt}", "-e", f"SKIPMQ_HTTP_PORT={http}", tag]
    try:
        t_run = time.monotonic()
        subprocess.run(args, check=True, capture_output=True)
        t_start = time.monotonic()
        subprocess.run(["podman", "--runtime", "runc", "start", name], check=True, capture_output=True)
        while not ready(http):
            if time.monotonic() - t_start > 60:
                raise SystemExit(f"not ready after 60 s: {subprocess.run(['podman', 'logs', name], capture_output=True, text=True).stdout[-2000:]}")
            time.sleep(0.02)
        now = time.monotonic()
        from_start.append(now - t_start)
        from_run.append(now - t_run)
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "5", name], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)

def fmt(values):
    return f"median {statistics.median(values):.2f} s, min {min(values):.2f} s, max {max(values):.2f} s"

print(f"    podman start -> /readyz 200: {fmt(from_start)}")
print(f"    podman create + start -> /readyz 200: {fmt(from_run)}")
print(f"    load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
EOF
fi
say "done: $TAG (run the container tests: .venv/bin/pytest tests/process/image)"
