#!/bin/sh
# Trims the base image's root filesystem to what the broker needs at run time. Run by the
# Dockerfile's `runtime-root` stage (as root, in a throwaway stage whose files the final stage
# copies); docs/operations.md "Image" lists what goes and why. Works on python:3.11-slim (Python
# in /usr/local) and on the Debian base of scripts/build_image.sh (Debian's python3.11).
#
#   1. Debian packages that only install or administer software: apt and its TLS/crypto stack,
#      perl and debconf, the user tools (after the Dockerfile made the skipmq user), the venv and
#      pip wheels, filesystem and mount tools. Purged with dpkg, so /var/lib/dpkg/status stays a
#      true list of what the image holds (scanners read it); dpkg itself stays. Their maintainer
#      scripts are skipped: they update debconf, systemd and alternatives, none of which the
#      container has or needs.
#   2. Python's standard library parts nothing imports at run time (tests, IDLE, Tk, turtle,
#      ensurepip, lib2to3, distutils, pydoc's topic index) and a base's own pip/setuptools/wheel;
#      bytecode without its source.
#   3. glibc's gconv (iconv charset modules: Python has its own codecs), logs and caches.
#   4. Every remaining stdlib module compiled to bytecode (unchecked-hash: the root is read-only,
#      the files never change; python:3.11-slim ships none), so a start compiles nothing.
#   5. Checks: every ELF file left (and /opt/skipmq's, if present) finds its libraries, and the
#      broker imports. Any failure fails the build.
set -eu

say() { echo "slim-root: $*"; }

# --- 1. packages ---------------------------------------------------------------------------
DROP="apt libapt-pkg6.0 gpgv debian-archive-keyring libgnutls30 libp11-kit0 libtasn1-6 libidn2-0
libunistring2 libnettle8 libhogweed6 libgcrypt20 libgpg-error0 libsystemd0 liblz4-1 libxxhash0
libudev1 perl-base perl-modules-5.36 libperl5.36 perl debconf adduser passwd login
libpam-modules libpam-modules-bin libpam-runtime libpam0g libsemanage2 libsemanage-common
libsepol2 libaudit1 libaudit-common libcap-ng0 libcap2 e2fsprogs libext2fs2 libss2 logsave
util-linux util-linux-extra mount libmount1 libblkid1 libsmartcols1 libfdisk1 bsdutils
sysvinit-utils init-system-helpers python3-pip-whl python3-setuptools-whl python3.11-venv
python3-venv python3-distutils python3-lib2to3"
purge=""
for package in $DROP; do
  if dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q ' installed$'; then
    purge="$purge $package"
    rm -f /var/lib/dpkg/info/"$package".prerm /var/lib/dpkg/info/"$package".postrm \
      /var/lib/dpkg/info/"$package":*.prerm /var/lib/dpkg/info/"$package":*.postrm
  fi
done
if [ -n "$purge" ]; then
  say "dpkg --purge$purge"
  # shellcheck disable=SC2086
  dpkg --purge --force-remove-essential --force-depends $purge >/tmp/dpkg.log 2>&1 \
    || { cat /tmp/dpkg.log; exit 1; }
  rm -f /tmp/dpkg.log
fi

# --- 2. the standard library -------------------------------------------------------------
PYTHON=$(command -v python3)
STDLIB=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
PURELIB=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
say "stdlib $STDLIB: removing test, idlelib, tkinter, turtle, ensurepip, lib2to3, distutils, pydoc_data"
for name in test idlelib tkinter turtledemo turtle.py ensurepip lib2to3 distutils pydoc_data; do
  rm -rf "${STDLIB:?}/$name"
done
rm -f "$STDLIB"/lib-dynload/_tkinter.* "$STDLIB"/lib-dynload/_test*.so "$STDLIB"/lib-dynload/xxlimited*.so
for dir in "$PURELIB" /usr/lib/python3/dist-packages; do
  [ -d "$dir" ] || continue
  rm -rf "$dir"/pip "$dir"/pip-* "$dir"/setuptools "$dir"/setuptools-* "$dir"/wheel "$dir"/wheel-* \
    "$dir"/pkg_resources "$dir"/_distutils_hack "$dir"/distutils-precedence.pth
done
rm -f /usr/local/bin/pip /usr/local/bin/pip3* /usr/local/bin/wheel /usr/local/bin/idle* \
  /usr/local/bin/2to3* /usr/local/bin/pydoc*
# bytecode whose source is gone (Debian compiles at install time and removes in prerm)
"$PYTHON" - "$STDLIB" /usr/lib/python3 <<'EOF'
import pathlib, sys
for top in sys.argv[1:]:
    for pyc in pathlib.Path(top).rglob("__pycache__/*.pyc"):
        if not (pyc.parent.parent / (pyc.name.split(".")[0] + ".py")).exists():
            pyc.unlink()
    for cache in sorted(pathlib.Path(top).rglob("__pycache__"), reverse=True):
        if cache.is_dir() and not any(cache.iterdir()):
            cache.rmdir()
EOF

# --- 3. gconv, logs, caches ----------------------------------------------------------------
find /usr/lib /usr/lib64 -maxdepth 2 -type d -name gconv -prune -exec rm -rf {} + 2>/dev/null || true
rm -rf /var/log/* /var/cache/debconf /var/cache/apt /var/lib/apt /etc/apt /var/cache/ldconfig/* \
  /tmp/* /root/.cache
ldconfig

# --- 4. stdlib bytecode ----------------------------------------------------------------------
say "compiling $STDLIB (unchecked-hash)"
"$PYTHON" -m compileall -q -j 0 --invalidation-mode unchecked-hash -x '/site-packages/|/dist-packages/' \
  "$STDLIB" >/dev/null

# --- 5. checks -----------------------------------------------------------------------------
missing=$(find / -xdev -type f \( -perm -u+x -o -name '*.so' -o -name '*.so.*' \) 2>/dev/null \
  | while read -r file; do
      out=$(ldd "$file" 2>/dev/null | grep 'not found') && echo "$file: $out"
    done || true)
if [ -n "$missing" ]; then
  echo "slim-root: libraries missing after the trim:" >&2
  echo "$missing" >&2
  exit 1
fi
if [ -x /opt/skipmq/bin/python ]; then
  /opt/skipmq/bin/python -c '
import importlib, importlib.util, pathlib
import broker.__main__, grpc, cryptography.hazmat.bindings._rust, uvloop, aiohttp, ssl, sqlite3
assert importlib.util.find_spec("pyspark") is None, "pyspark is in the broker image"
site = pathlib.Path(grpc.__file__).parents[1]
for so in site.rglob("*.so"):
    if ".cpython-" in so.name or ".abi3." in so.name:
        importlib.import_module(".".join(so.relative_to(site).with_suffix("").with_suffix("").parts))
'
  /opt/skipmq/bin/skipmq --help >/dev/null
  say "checks passed: all ELF files link, the broker and every extension module import"
fi
say "root filesystem now $(du -sxk / 2>/dev/null | cut -f1) KiB"
