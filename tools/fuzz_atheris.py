"""Coverage-guided fuzzing of the MQTT codec and connection handler with atheris (issue #12).

The harness is ``tools.fuzz_mqtt.ConnectionFuzzer`` (one real broker core on the simulator's
virtual clock; each input on a fresh connection, fed in pieces): atheris (libFuzzer) mutates the
inputs and steers by the coverage of the loaded code (``broker.mqtt``, ``broker.core``, ...),
starting from the well-formed packets of ``tools.mqtt_raw``. A crash is an exception out of
``ClientConnection.receive``, a logged internal error, or an honest client that can no longer
connect, subscribe and get its QoS 1 message (checked every ``--check-every`` inputs).

atheris is not a project dependency (a by-hand tool: ``.venv/bin/pip install atheris``; wheels
exist for CPython 3.11 on x86-64 Linux). By hand (docs/security.md "Fuzzing"):

    .venv/bin/python -m tools.fuzz_atheris --runs 1000000 --corpus /tmp/mqtt-corpus

Arguments after ``--`` go to libFuzzer (e.g. ``-- -max_total_time=600``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

from tools.fuzz_mqtt import ConnectionFuzzer, seed_packets

MAX_INPUT_BYTES = 1024


class Harness:
    """libFuzzer's TestOneInput over one ConnectionFuzzer."""

    def __init__(self, check_every: int, progress_every: int) -> None:
        self.fuzzer = ConnectionFuzzer(0)
        self.check_every = check_every
        self.progress_every = progress_every
        self.inputs = 0
        self.started = time.monotonic()

    def __call__(self, data: bytes) -> None:
        fuzzer = self.fuzzer
        fuzzer.rng.seed(data[:8])  # the pieces an input is cut into depend on the input only
        crash = fuzzer.feed(data)
        if crash is not None:
            raise RuntimeError(f"the broker failed on this input: {crash}")
        self.inputs += 1
        if self.inputs % self.check_every == 0 and not fuzzer.honest_client_works():
            raise RuntimeError(f"an honest client failed after {self.inputs} inputs")
        if self.inputs % self.progress_every == 0:
            elapsed = time.monotonic() - self.started
            print(f"{self.inputs} inputs in {elapsed:.0f} s, 0 crashes", file=sys.stderr, flush=True)


def write_seed_corpus(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for index, data in enumerate(seed_packets()):
        (directory / f"seed-{index}").write_bytes(data)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m tools.fuzz_atheris", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=int, default=100_000, help="inputs to run (default 100000)")
    parser.add_argument("--corpus", type=Path, default=None, help="corpus directory (seeded if empty)")
    parser.add_argument("--seed", type=int, default=1, help="libFuzzer's seed (default 1)")
    parser.add_argument("--check-every", type=int, default=1000, help="honest-client check interval")
    parser.add_argument("--progress-every", type=int, default=50_000, help="progress line interval")
    args = parser.parse_args(argv)
    try:
        import atheris
    except ImportError:
        print("atheris is not installed: .venv/bin/pip install atheris", file=sys.stderr)
        return 2
    atheris.instrument_all()  # the broker modules are loaded already (tools.fuzz_mqtt): coverage
    logging.getLogger("skipmq").setLevel(logging.ERROR)
    logging.getLogger("skipmq").propagate = False
    harness = Harness(args.check_every, args.progress_every)
    libfuzzer_args: list[Any] = [
        sys.argv[0],
        f"-runs={args.runs}",
        f"-seed={args.seed}",
        f"-max_len={MAX_INPUT_BYTES}",
        "-print_final_stats=1",
        "-rss_limit_mb=3072",
        *extra,
    ]
    if args.corpus is not None:
        if not args.corpus.exists() or not any(args.corpus.iterdir()):
            write_seed_corpus(args.corpus)
        libfuzzer_args.append(str(args.corpus))
    atheris.Setup(libfuzzer_args, harness)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
