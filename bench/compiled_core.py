"""The overlay core compiled with mypyc, for long simulator sweeps (``paper_sweep.py --compiled``).

The sweep at N = 10,000 spends its time in pure-Python protocol code (``overlay/node*.py``,
``table.py``, ``frt.py``) and the simulator's event loop (``overlay/sim/engine.py``). mypyc, the
compiler that ships with mypy (already a dev dependency; mypy and black are built with it),
turns those type-annotated modules into C extensions without changing a line of them. We
prefer it to rewriting hot paths by hand: the code that runs compiled is the code the tests
check, and ``tests/sim/overlay/test_compiled_core.py`` checks that a compiled sweep gives the
same results as the interpreted one.

``build()`` copies the ``overlay`` package into ``<cache>/<digest>/`` (the digest covers every
source file of the package, the mypy version and the list of compiled modules, so an edit means a
new build), compiles the
modules of ``COMPILED_MODULES`` there, and returns the directory to put first on ``sys.path``.
The repository's own ``overlay/`` is never touched: tests and brokers always import the
interpreted sources. The messages and the API's events and actions are compiled too: their
``__init__`` is written out (``overlay/messages.py`` says why), so a compiled caller builds one in
C. With the ``__init__`` that ``dataclasses`` generates, a compiled dataclass is built by
interpreted code, more slowly than an interpreted one: an earlier build that compiled them so
ran 25 % slower. Left interpreted: the simulator's experiment driver, reports and checkers, and
the Scribe baseline (not hot, or short runs).

Usage: ``python bench/compiled_core.py [--cache DIR]`` builds and prints the directory;
``python bench/paper_sweep.py --compiled ...`` builds (or reuses) it and runs on it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# where builds are kept; a test points it at its own directory
DEFAULT_CACHE = Path(os.environ.get("SKIPMQ_COMPILED_CORE_CACHE") or ROOT / "build" / "compiled-core")
ENV_VAR = "SKIPMQ_COMPILED_CORE"  # the built directory, set for a process that runs on it

COMPILED_MODULES = (
    "overlay/api.py",
    "overlay/messages.py",
    "overlay/keys.py",
    "overlay/config.py",
    "overlay/skipgraph.py",
    "overlay/multicast.py",
    "overlay/formation.py",
    "overlay/frt.py",
    "overlay/table.py",
    "overlay/node_state.py",
    "overlay/node_base.py",
    "overlay/node_publish.py",
    "overlay/node_join.py",
    "overlay/node_maintenance.py",
    "overlay/node.py",
    "overlay/sim/engine.py",
    "overlay/sim/scribe.py",
)


def _mypy_version() -> str:
    import mypy.version

    return str(mypy.version.__version__)


def source_digest() -> str:
    """Digest of the overlay package's sources, the compiler version and the compiled modules."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(_mypy_version().encode())
    digest.update(sys.version.encode())
    digest.update("\0".join(COMPILED_MODULES).encode())  # which modules a build compiles
    for path in sorted((ROOT / "overlay").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build(cache: Path = DEFAULT_CACHE) -> Path:
    """Compile the overlay core (or reuse an earlier build of the same sources); return the
    directory holding the compiled ``overlay`` package."""
    target = cache / source_digest()
    if (target / ".complete").exists():
        return target
    staging = cache / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(
        ROOT / "overlay", staging / "overlay", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
    )
    started = time.monotonic()
    print(f"compiled core: mypyc on {len(COMPILED_MODULES)} modules in {staging} ...", file=sys.stderr)
    result = subprocess.run(
        [sys.executable, "-m", "mypyc", *COMPILED_MODULES],
        cwd=staging,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        output = f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        hint = "is the dev environment (mypy) installed?"
        raise RuntimeError(f"mypyc failed (exit {result.returncode}); {hint}\n{output}")
    shutil.rmtree(staging / "build", ignore_errors=True)  # C sources and objects; the .so files stay
    built_s = time.monotonic() - started
    (staging / ".complete").write_text(f"mypy {_mypy_version()}, built in {built_s:.0f} s\n")
    if target.exists():  # a concurrent build finished first
        shutil.rmtree(staging, ignore_errors=True)
    else:
        staging.rename(target)
    print(f"compiled core: {target} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return target


def compiled_modules_loaded() -> list[str]:
    """The overlay modules of ``COMPILED_MODULES`` imported in this process from a C extension."""
    loaded = []
    for path in COMPILED_MODULES:
        name = path.removesuffix(".py").replace("/", ".")
        module = sys.modules.get(name)
        if module is not None and str(getattr(module, "__file__", "")).endswith(".so"):
            loaded.append(name)
    return loaded


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="where builds go (default build/compiled-core)"
    )
    args = parser.parse_args(argv)
    print(build(args.cache))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
