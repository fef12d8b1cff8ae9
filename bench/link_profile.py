"""Where a forwarded message's time goes: sums py-spy collapsed-stack files (``py-spy record -f raw``,
as ``bench/cluster_bench.py --profile DIR`` writes them, one per broker and round) into the parts
of the cluster path, per broker (run by hand; docs/benchmarks-cluster.md).

Each sample is given to one part, by the innermost frame of the stack that belongs to a part
(leaf first): so protobuf's own frames count under the wire codec that called them, and ``h2``'s
under the runtime. The parts:

* ``socket writes``: samples whose innermost frame is a socket write (h2_runtime.py's DATA frame
  write, the MQTT connections' flush, ``SSLObject``): uvloop, TLS and the system call below it;
* ``wire``: the codec (broker/adapters/transport/wire*.py, forwarded_codec.py, protobuf);
* ``h2 runtime``: SkipMQ's HTTP/2 framing (h2_runtime.py) and the ``h2``/``hpack`` library;
* ``link``: the link above the runtime (link.py: the drain task, frame assembly, delivery);
* ``cluster engine``: broker/cluster/ (streams, ordering, routing of forwarded messages);
* ``mqtt + core``: broker/mqtt/, broker/core/ (the subscribers' PUBLISH, the session queues);
* ``asyncio``: the event loop's Python (asyncio/, tasks, events, uvloop's Python parts);
* ``loop (C)``: samples whose innermost Python frame is the loop's run call (uvloop's C code:
  socket reads and writes, TLS records, epoll); left out of the shares, which are of the Python
  samples (perf below splits the C part);
* ``other``: the rest (metrics, logging, sqlite, ...).

    .venv/bin/python bench/cluster_bench.py --no-standalone --brokers 3 --skip-small-l \\
        --kinds latency --latency-rate 1000 --latency-s 8 --rounds 2 --profile /tmp/prof
    .venv/bin/python bench/cluster_bench.py ... --profile /tmp/perf --profile-tool perf
    .venv/bin/python bench/link_profile.py /tmp/perf --perf --cpu-us 220,150,150
    .venv/bin/python bench/link_profile.py /tmp/prof

With ``--profile-tool perf`` (``perf record -g``, native stacks, the kernel included) the files are
``*.data``; ``--perf`` sums them by shared object instead: the interpreter, the kernel (system
calls, loopback TCP), the origin proofs' ECDSA (the ``cryptography`` package's Rust/OpenSSL),
protobuf, TLS (libssl/libcrypto), uvloop. That split is CPU time; py-spy's samples are taken
whenever a thread is runnable, so on a loaded machine they also count the time a thread waits for
a CPU (most after a write that wakes another process) and only their Python split is used.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

PARTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("wire", re.compile(r"transport/(wire\w*|forwarded_codec)\.py|google/protobuf")),
    ("h2 runtime", re.compile(r"transport/h2_runtime\.py|transport/h2_health\.py|/h2/|/hpack/")),
    ("link", re.compile(r"transport/link\.py")),
    ("cluster engine", re.compile(r"broker/cluster/|broker/adapters/cluster")),
    ("mqtt + core", re.compile(r"broker/mqtt/|broker/core/|broker/adapters/listeners")),
    ("asyncio", re.compile(r"asyncio/|uvloop/")),
)
LOOP_C = "loop (C)"
OTHER = "other"
SOCKET = "socket writes"
# innermost frames whose time is the C below them: a socket write (uvloop, TLS, the system call)
SOCKET_WRITE = re.compile(r"(_Stream\.(try_write|write|_write_slowly)|ClientBase\.flush|SSLObject\.\w+) \(")
ORDER = [SOCKET] + [name for name, _ in PARTS] + [LOOP_C, OTHER]
_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def part_of(stack: str) -> str:
    frames = stack.split(";")
    runner = next((i for i, frame in enumerate(frames) if "asyncio/runners.py" in frame), -1)
    frames = frames[runner + 1 :]  # the frames below the event loop's run call
    if not frames:
        return LOOP_C
    if SOCKET_WRITE.match(frames[-1].strip()):
        return SOCKET
    for frame in reversed(frames):
        match = _FRAME.match(frame.strip())
        where = match.group("file") if match else frame
        for name, pattern in PARTS:
            if pattern.search(where):
                return name
    return OTHER


DSO_PARTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("Python interpreter", re.compile(r"libpython|^python")),
    ("kernel", re.compile(r"kernel")),
    ("origin-proof ECDSA (cryptography)", re.compile(r"_rust\.abi3")),
    ("protobuf (upb)", re.compile(r"_message\.abi3|_upb")),
    ("TLS (libssl, libcrypto)", re.compile(r"libssl|libcrypto")),
    ("uvloop", re.compile(r"^loop\.cpython")),
    ("libc", re.compile(r"^libc\.")),
)


def read_perf(path: Path) -> defaultdict[str, float]:
    """Percent of ``path``'s samples per part (perf report, self time by shared object)."""
    out = subprocess.run(
        ["perf", "report", "-i", str(path), "--no-children", "--sort", "dso", "-g", "none", "--stdio"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    parts: defaultdict[str, float] = defaultdict(float)
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2 or not fields[0].endswith("%") or line.lstrip().startswith("#"):
            continue
        dso = fields[1]
        name = next((part for part, pattern in DSO_PARTS if pattern.search(dso)), OTHER)
        parts[name] += float(fields[0].rstrip("%"))
    return parts


def perf_main(directory: Path, cpu: list[float]) -> int:
    per_broker: dict[str, list[defaultdict[str, float]]] = {}
    for path in sorted(directory.glob("*-broker*.data")):
        per_broker.setdefault(path.stem.rsplit("-", 1)[-1], []).append(read_perf(path))
    if not per_broker:
        print(f"no *-broker*.data files in {directory}", file=sys.stderr)
        return 1
    brokers = sorted(per_broker)
    unit = " (us per message)" if cpu else ""
    print(f"| CPU by shared object{unit} | " + " | ".join(brokers) + " |")
    print("|---|" + "---:|" * len(brokers))
    for part in [name for name, _ in DSO_PARTS] + [OTHER]:
        cells = []
        for index, broker in enumerate(brokers):
            runs = per_broker[broker]
            share = sum(run[part] for run in runs) / len(runs) / 100
            cells.append(
                f"{share * 100:.1f} %" + (f" ({share * cpu[index]:.1f})" if index < len(cpu) else "")
            )
        print(f"| {part} | " + " | ".join(cells) + " |")
    return 0


def read_samples(path: Path) -> Counter[str]:
    parts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            parts[part_of(stack)] += int(count)
    return parts


_PROJECT_FILE = re.compile(r"(?:^|/)((?:broker|overlay)/[\w/]+\.py)$")


def module_of(stack: str) -> str | None:
    """The innermost SkipMQ module (broker/..., overlay/...) of a Python sample below the event
    loop's run call; socket writes and the loop's C have their own names; None for the rest."""
    part = part_of(stack)
    if part in (LOOP_C, SOCKET):
        return part
    for frame in reversed(stack.split(";")):
        match = _FRAME.match(frame.strip())
        if match:
            found = _PROJECT_FILE.search(match.group("file"))
            if found:
                return found.group(1)
    return part


def top_main(directory: Path, top: int) -> int:
    """``--top N``: the N SkipMQ modules with the most Python samples per broker (innermost
    SkipMQ frame; library frames count under the module that called them)."""
    per_broker: dict[str, Counter[str]] = {}
    for path in sorted(directory.glob("*-broker*.txt")):
        counts = per_broker.setdefault(path.stem.rsplit("-", 1)[-1], Counter())
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                module = module_of(stack)
                if module is not None and module != LOOP_C:
                    counts[module] += int(count)
    if not per_broker:
        print(f"no *-broker*.txt files in {directory}", file=sys.stderr)
        return 1
    for broker, counts in sorted(per_broker.items()):
        total = sum(counts.values())
        print(f"\n| {broker}: module (innermost SkipMQ frame) | share of {total} Python samples |")
        print("|---|---:|")
        for module, samples in counts.most_common(top):
            print(f"| {module} | {samples / max(1, total) * 100:.1f} % |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="the --profile directory of cluster_bench.py")
    parser.add_argument("--perf", action="store_true", help="sum perf record files (*.data) by shared object")
    parser.add_argument(
        "--cpu-us",
        help="with --perf: CPU per published message of each broker, comma-separated (us; utime +"
        " stime from /proc in the same runs): the shares also in us per message",
    )
    parser.add_argument(
        "--top", type=int, metavar="N", help="the N SkipMQ modules with the most samples, per broker"
    )
    args = parser.parse_args(argv)
    if args.top:
        return top_main(args.directory, args.top)
    cpu = [float(x) for x in args.cpu_us.split(",")] if args.cpu_us else []
    if args.perf:
        return perf_main(args.directory, cpu)
    per_broker: dict[str, Counter[str]] = {}
    for path in sorted(args.directory.glob("*-broker*.txt")):
        broker = path.stem.rsplit("-", 1)[-1]
        per_broker.setdefault(broker, Counter()).update(read_samples(path))
    if not per_broker:
        print(f"no *-broker*.txt files in {args.directory}", file=sys.stderr)
        return 1
    brokers = sorted(per_broker)
    python_parts = [part for part in ORDER if part != LOOP_C]
    print("| part (share of the Python samples) | " + " | ".join(brokers) + " |")
    print("|---|" + "---:|" * len(brokers))
    for part in python_parts:
        cells = []
        for broker in brokers:
            counts = per_broker[broker]
            total = sum(counts[name] for name in python_parts)
            cells.append(f"{counts[part] / max(1, total) * 100:.1f} %")
        print(f"| {part} | " + " | ".join(cells) + " |")
    samples = [str(sum(per_broker[b][name] for name in python_parts)) for b in brokers]
    print("| Python samples | " + " | ".join(samples) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
