"""Instructions per delivered message on a broker's publish path, counted by callgrind (run by hand).

Seconds of CPU on this shared 2-core machine move by +-20 % between runs of the same code; the
number of instructions a process executes for the same work does not depend on the other jobs.
This script starts a broker (SkipMQ from a source tree, or Debian's mosquitto) under
``valgrind --tool=callgrind --instr-atstart=no`` - uninstrumented, about 5x slower, until the
measurement starts - and drives it in LOCK STEP from one asyncio process: a round writes a fixed
batch of PUBLISH packets and waits until every delivery (and, for QoS 1, every PUBACK) arrived
before the next round starts. The broker under callgrind is always the bottleneck, so each round
reaches it as one read, whatever the machine is doing; with a fixed ``PYTHONHASHSEED`` the same
revision gives the same count within about 1 % (the idle timers of the broker are the rest;
with random hash seeds dict layouts move it by up to 3-4 %). The first warm-up
rounds run uninstrumented; ``callgrind_control --instr=on`` once, then per scenario ``--zero``,
the measured rounds and ``--dump`` (turning instrumentation off and on between dumps made
callgrind's totals of the later dumps wrong). The figure is the broker's instructions (callgrind's
``Ir``) over the measured rounds divided by the deliveries in them.

Instructions are not time: a CPython interpreter and a C broker retire instructions at different
rates, so compare SkipMQ revisions with this script and SkipMQ with mosquitto in seconds
(``broker_bench.py``).

``--breakdown RUNS`` measures where the broker's CPU per delivery goes instead (no callgrind):
RUNS uninstrumented runs per scenario give the total (the broker's threads' run time from
/proc, median) and the kernel's share of it (stime); py-spy ``--native`` attached over a run of
4x the rounds gives the user-space shares (its samples grouped by stage: the decoder, the
handlers, routing, bookkeeping, encoding, the flush, the ack path, SQLite, the loop); the rows
add up to the median (py-spy samples wall-clock time, so a thread preempted inside send() would
charge its wait to the system call: the kernel's row is the measured stime instead).

``--annotate`` adds where the instructions went (the top functions of the
dump, C level: the interpreter, SQLite, uvloop, the kernel entry points), ``--keep DIR`` keeps
the dumps for ``callgrind_annotate``.

Size: one script a person runs by hand, whose probes (callgrind, strace, py-spy attached, the
CPU time from /proc) share the lock-step client, the scenarios and the broker start; the grouping
of py-spy's samples by stage is bench/cpu_stages.py.

    .venv/bin/python bench/publish_cost.py --help
    .venv/bin/python bench/publish_cost.py                         # SkipMQ of this tree
    .venv/bin/python bench/publish_cost.py --broker-root /tmp/old  # another revision's checkout
    .venv/bin/python bench/publish_cost.py --broker mosquitto --json cost.json
    .venv/bin/python bench/publish_cost.py --breakdown 5 --rounds-scale 15 \
        --scenarios 'qos0 1->1,qos1 1->1,qos1 1->1 persistent'   # where the CPU goes, by stage
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for _path in (str(REPO_ROOT), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from cpu_stages import DISK, IDLE, IN_SYSCALL, KERNEL, USER_STAGES, breakdown, print_breakdown  # noqa: E402

from tools import mqtt_raw as raw  # noqa: E402
from tools.loadclient import LoadClient  # noqa: E402
from tools.ports import free_port  # noqa: E402

HOST = "127.0.0.1"
PAYLOAD = bytes(range(64))
MOSQUITTO_BIN = "/usr/sbin/mosquitto"
START_TIMEOUT_S = 120.0  # a broker's start under valgrind (imports run ~5x slower)
ROUND_TIMEOUT_S = 60.0
PYSPY_EXTRA: list[str] = ["--native"]  # C frames too: the system calls, SQLite, uvloop


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- the lock-step client ----------------------------------------------------------------------
class StepClient(LoadClient):
    """Counts PUBLISH and PUBACK packets (a generic parser: its cost is not what is measured) and
    acknowledges QoS 1 PUBLISHes at once."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.publishes = 0
        self.pubacks = 0
        self._waiter: asyncio.Future[None] | None = None
        self._want = (0, 0)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, size = 0, len(buf)
        acks: list[bytes] = []
        while pos + 2 <= size:
            length, shift, i, complete = 0, 0, pos + 1, False
            while i < size and i < pos + 5:
                byte = buf[i]
                length |= (byte & 0x7F) << shift
                shift += 7
                i += 1
                if byte < 0x80:
                    complete = True
                    break
            if not complete or i + length > size:
                break
            ptype = buf[pos] >> 4
            if ptype == 3:
                self.publishes += 1
                if buf[pos] & 0x06:
                    at = i + 2 + ((buf[i] << 8) | buf[i + 1])
                    acks.append(b"\x40\x02" + bytes(buf[at : at + 2]))
            elif ptype == 4:
                self.pubacks += 1
            elif ptype == 2:
                self.connack_received(buf[i + 1])
            elif ptype == 9:
                self.suback_received((buf[i] << 8) | buf[i + 1], bytes(buf[i : i + length]))
            pos = i + length
        del buf[:pos]
        if acks and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(acks))
        self._check()

    def _check(self) -> None:
        waiter = self._waiter
        want_publishes, want_pubacks = self._want
        if (
            waiter is not None
            and not waiter.done()
            and self.publishes >= want_publishes
            and self.pubacks >= want_pubacks
        ):
            waiter.set_result(None)

    async def until(self, publishes: int = 0, pubacks: int = 0) -> None:
        self._want = (publishes, pubacks)
        self._waiter = asyncio.get_running_loop().create_future()
        self._check()
        await asyncio.wait_for(self._waiter, ROUND_TIMEOUT_S)


async def open_step_client(port: int, client_id: str, *, clean: bool = True) -> StepClient:
    loop = asyncio.get_running_loop()
    _transport, client = await loop.create_connection(lambda: StepClient(client_id), HOST, port)
    client.write(raw.connect_packet(client_id, clean=clean, keepalive_s=600))
    code = await asyncio.wait_for(client.connack, ROUND_TIMEOUT_S)
    if code != 0:
        raise ConnectionError(f"{client_id}: CONNACK {code}")
    return client


async def subscribe(client: StepClient, topic_filter: str, qos: int) -> None:
    fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    client.subacks[1] = fut
    client.write(raw.subscribe_packet(1, [(topic_filter, qos)]))
    await asyncio.wait_for(fut, ROUND_TIMEOUT_S)


# ---- scenarios -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    name: str
    qos: int
    n_pub: int
    n_sub: int
    batch: int  # PUBLISHes per publisher per round
    rounds: int  # measured rounds
    persistent: bool = False  # subscribers with clean session 0 (SkipMQ commits every message)


SCENARIOS = (
    Scenario("qos0 1->1", 0, 1, 1, 100, 40),
    Scenario("qos1 1->1", 1, 1, 1, 100, 30),
    Scenario("qos0 1->100", 0, 1, 100, 10, 10),
    Scenario("qos0 100->1", 0, 100, 1, 1, 30),
    Scenario("qos1 1->1 persistent", 1, 1, 1, 100, 20, persistent=True),
    # every message alone in its loop iteration (the paced latency runs): per-iteration costs
    Scenario("qos0 1->1 unbatched", 0, 1, 1, 1, 300),
    Scenario("qos1 1->1 unbatched", 1, 1, 1, 1, 300),
)
WARMUP_ROUNDS = 5


class Callgrind:
    """The broker's callgrind, driven with callgrind_control."""

    def __init__(self, pid: int, out_dir: Path) -> None:
        self.pid = pid
        self.out_dir = out_dir
        self.instrumenting = False

    def _control(self, *args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(self.pid)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )

    def start(self) -> None:
        if not self.instrumenting:
            self._control("--instr=on")
            self.instrumenting = True
        self._control("--zero")

    def stop(self) -> Path:
        """Dump what was counted since ``start`` and stop counting; the dump file."""
        before = set(self.out_dir.glob("callgrind.out*"))
        self._control("--dump")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            new = sorted(set(self.out_dir.glob("callgrind.out*")) - before)
            if new and _summary(new[-1]) is not None:
                return new[-1]
            time.sleep(0.1)
        raise RuntimeError("callgrind wrote no dump")


class _AttachedProbe:
    """A profiler attached to the broker (``-p``/``--pid``) only while the measured rounds run,
    stopped by SIGINT; each start writes a new numbered output file."""

    ATTACH_S = 1.0  # attached to every thread before the rounds start
    STOP_TIMEOUT_S = 30.0

    def __init__(self, pid: int, out_dir: Path) -> None:
        self.pid = pid
        self.out_dir = out_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.count = 0

    def path(self) -> Path:
        raise NotImplementedError

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        self.count += 1
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(self.ATTACH_S)

    def stop(self) -> Path:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=self.STOP_TIMEOUT_S)
        return self.path()


class Strace(_AttachedProbe):
    """System calls of the broker over the measured rounds (``strace -c -f -p``: attached only
    while they run). Callgrind counts user-space instructions only; a change that adds system
    calls (a write per packet instead of one per batch, a timer, a /proc read) shows here."""

    def path(self) -> Path:
        return self.out_dir / f"strace.{self.count}"

    def command(self) -> list[str]:
        return ["strace", "-c", "-f", "-p", str(self.pid), "-o", str(self.path())]


class NoProbe:
    """Nothing counted (the broker runs under py-spy, which samples the whole run)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir

    def start(self) -> None:
        pass

    def stop(self) -> Path:
        return self.out_dir / "none"


class PySpy(_AttachedProbe):
    """py-spy attached (``record --pid --native``) only while the measured rounds run: samples of
    every thread of the broker, Python and C frames, for ``--breakdown``."""

    RATE_HZ = 500
    ATTACH_S = 1.5
    STOP_TIMEOUT_S = 60.0

    def path(self) -> Path:
        return self.out_dir / f"pyspy.{self.count}.txt"

    def command(self) -> list[str]:
        return [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--pid",
            str(self.pid),
            "--native",
            "--rate",
            str(self.RATE_HZ),
            "--format",
            "raw",
            "-o",
            str(self.path()),
        ]


def _proc_cpu_s(pid: int) -> float:
    """CPU time of a process, all its threads, user and system (the scheduler's run time in ns per
    thread, ``/proc/<pid>/task/*/schedstat``: clock ticks are too coarse for a few seconds)."""
    total_ns = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total_ns += int(f.read().split()[0])
    return total_ns / 1e9


def _proc_user_system_s(pid: int) -> tuple[float, float]:
    """utime and stime of a process (all threads), seconds (clock ticks: coarse)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    return found


def strace_calls(path: Path) -> dict[str, int]:
    """System call -> calls, from an ``strace -c`` summary."""
    calls: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
            calls[parts[-1]] = int(parts[3])
    return calls


def _summary(path: Path) -> int | None:
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    return None


def top_functions(path: Path, count: int) -> list[tuple[int, str]]:
    """Self instructions per function (all objects) in a dump, largest first."""
    result = subprocess.run(
        ["callgrind_annotate", "--threshold=99", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    rows: list[tuple[int, str]] = []
    for line in result.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0].replace(",", "").isdigit() and "(" in parts[1]:
            rows.append(
                (int(parts[0].replace(",", "")), parts[1].split("(")[0].strip() + " " + parts[1][-40:])
            )
    rows.sort(reverse=True)
    return rows[:count]


async def run_scenario(
    port: int, sc: Scenario, tag: str, cg: Callgrind | Strace | NoProbe | PySpy, cpu_pid: int = 0
) -> dict[str, Any]:
    base = f"cost/{tag}/{sc.name.replace(' ', '_').replace('>', '')}"
    subs = [
        await open_step_client(port, f"{tag}-{sc.name}-s{i}".replace(" ", "_"), clean=not sc.persistent)
        for i in range(sc.n_sub)
    ]
    pubs = [await open_step_client(port, f"{tag}-{sc.name}-p{i}".replace(" ", "_")) for i in range(sc.n_pub)]
    for sub in subs:
        await subscribe(sub, f"{base}/+", sc.qos)
    blobs: list[list[bytes]] = []  # per publisher: one blob per round (packet ids cycle for QoS 1)
    next_id = 1
    for index in range(sc.n_pub):
        topic = f"{base}/{index}"
        per_round = []
        for _ in range(2):
            packets = []
            for _ in range(sc.batch):
                packets.append(
                    raw.publish_packet(topic, PAYLOAD, qos=sc.qos, packet_id=next_id if sc.qos else None)
                )
                next_id = next_id % 60000 + 1
            per_round.append(b"".join(packets))
        blobs.append(per_round)
    per_sub_per_round = sc.batch * sc.n_pub  # every publisher's batch reaches every subscriber
    delivered = 0
    acked = 0

    async def one_round(number: int) -> None:
        nonlocal delivered, acked
        for pub, per_round in zip(pubs, blobs, strict=True):
            pub.write(per_round[number % 2])
        delivered += per_sub_per_round
        acked += sc.batch
        await asyncio.gather(
            *(sub.until(publishes=delivered) for sub in subs),
            *(pub.until(pubacks=acked) for pub in pubs if sc.qos),
        )

    for number in range(WARMUP_ROUNDS):
        await one_round(number)
    await asyncio.sleep(0.3)  # the subscribers' last PUBACKs are read uninstrumented
    cg.start()
    started = time.perf_counter()
    cpu_before = _proc_cpu_s(cpu_pid) if cpu_pid else 0.0
    for number in range(sc.rounds):
        await one_round(number)
    await asyncio.sleep(0.3)  # ... and this batch's are counted
    elapsed = time.perf_counter() - started
    cpu_s = _proc_cpu_s(cpu_pid) - cpu_before if cpu_pid else 0.0
    dump = cg.stop()
    syscalls = strace_calls(dump) if isinstance(cg, Strace) else {}
    instructions = _summary(dump) or 0 if isinstance(cg, Callgrind) else 0
    deliveries = sc.rounds * per_sub_per_round * sc.n_sub
    for client in (*pubs, *subs):
        client.close()
    await asyncio.sleep(0.5)
    return {
        "scenario": sc.name,
        "instructions": instructions,
        "deliveries": deliveries,
        "published": sc.rounds * sc.batch * sc.n_pub,
        "instructions_per_delivery": instructions / deliveries,
        "cpu_us_per_delivery": cpu_s * 1e6 / deliveries,
        "syscalls_per_delivery": {name: calls / deliveries for name, calls in syscalls.items()},
        "round_batch": sc.batch,
        "wall_s": elapsed,
        "dump": str(dump),
    }


# ---- brokers -------------------------------------------------------------------------------------
def broker_command(kind: str, broker_root: Path, port: int, workdir: Path, persistence: bool) -> list[str]:
    if kind == "skipmq":
        return [
            sys.executable, "-m", "broker", "--bind", HOST, "--port", str(port),
            "--http-port", str(free_port()), "--data-dir", str(workdir / "data"),
            "--log-level", "warning", "--log-format", "json",
        ]  # fmt: skip
    conf = workdir / "mosquitto.conf"
    lines = [f"listener {port} {HOST}", "allow_anonymous true", "log_dest none", "user root"]
    if persistence:
        lines += ["persistence true", f"persistence_location {workdir}/"]
    conf.write_text("\n".join(lines) + "\n")
    return [MOSQUITTO_BIN, "-c", str(conf)]


def measure(
    kind: str,
    broker_root: Path,
    scenarios: list[Scenario],
    workdir: Path,
    persistence: bool,
    strace: bool,
    profile: str | None = None,
    breakdown_rounds: int = 0,
) -> dict[str, Any]:
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = broker_command(kind, broker_root, port, workdir, persistence)
    if profile:
        spy = str(Path(sys.executable).parent / "py-spy")
        argv = [spy, "record", "--rate", "500", "--format", "raw", *PYSPY_EXTRA, "-o", profile, "--", *argv]
    elif not strace and not breakdown_rounds:
        argv = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={workdir}/callgrind.out", *argv,
        ]  # fmt: skip
    # a fixed hash seed: dict and set layouts (and so the instructions) are the same every run
    env = dict(os.environ, PYTHONPATH=str(broker_root), PYTHONHASHSEED="0")
    err = open(workdir / "broker.log", "wb")  # noqa: SIM115 - lives as long as the process
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=err, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=workdir)
    try:
        _wait_port(port, proc)
        log(f"{kind}: started in {time.monotonic() - started:.0f} s (pid {proc.pid})")
        if breakdown_rounds:
            return {
                "broker": kind,
                "broker_root": str(broker_root),
                "scenarios": [
                    measure_breakdown(port, proc.pid, sc, workdir, breakdown_rounds) for sc in scenarios
                ],
            }
        cg: Callgrind | Strace | NoProbe
        if profile:
            cg = NoProbe(workdir)
        else:
            cg = Strace(proc.pid, workdir) if strace else Callgrind(proc.pid, workdir)
        results = []
        for sc in scenarios:
            res = asyncio.run(run_scenario(port, sc, kind[:2], cg))
            if profile:
                log(f"{kind}: {sc.name}: {res['deliveries']} deliveries in {res['wall_s']:.1f} s")
            elif strace:
                top = sorted(res["syscalls_per_delivery"].items(), key=lambda kv: -kv[1])[:6]
                log(
                    f"{kind}: {sc.name}: system calls per delivery "
                    + ", ".join(f"{k} {v:.3f}" for k, v in top)
                )
            else:
                log(
                    f"{kind}: {sc.name}: {res['instructions_per_delivery']:,.0f} instructions per delivery "
                    f"({res['deliveries']} deliveries, {res['wall_s']:.1f} s)"
                )
            results.append(res)
        return {"broker": kind, "broker_root": str(broker_root), "scenarios": results}
    finally:
        if profile:  # py-spy writes its profile on SIGINT; then stop the broker it started
            children = _children(proc.pid)
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGTERM)
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def measure_breakdown(port: int, pid: int, sc: Scenario, workdir: Path, runs: int) -> dict[str, Any]:
    """One scenario: ``runs`` uninstrumented runs (the broker's CPU per delivery from /proc, the
    median is the total), then one run of 4x the rounds with py-spy attached (the shares)."""
    cpu = []
    user0, system0 = _proc_user_system_s(pid)
    for number in range(runs):
        res = asyncio.run(run_scenario(port, sc, f"c{number}", NoProbe(workdir), pid))
        cpu.append(res["cpu_us_per_delivery"])
        log(f"{sc.name}: run {number + 1}: {res['cpu_us_per_delivery']:.2f} us CPU per delivery")
    user1, system1 = _proc_user_system_s(pid)
    system_share = (system1 - system0) / max(1e-9, (user1 - user0) + (system1 - system0))
    log(f"{sc.name}: the kernel's share of the broker's CPU (stime / (utime + stime)): {system_share:.0%}")
    spy = PySpy(pid, workdir)
    longer = dataclasses.replace(sc, rounds=sc.rounds * 4)
    res = asyncio.run(run_scenario(port, longer, "spy", spy, 0))
    samples = breakdown(spy.path())
    total_us = sorted(cpu)[len(cpu) // 2]
    # py-spy samples wall-clock time: a thread preempted inside send() (its wake-up of the peer
    # hands the core over) still shows there, so the kernel's row is the measured stime, and the
    # samples outside system calls (where preemption falls evenly) split the measured user time
    busy = sum(n for stage, n in samples.items() if stage in USER_STAGES)
    user_us = total_us * (1.0 - system_share)
    rows = {stage: user_us * samples.get(stage, 0) / busy if busy else 0.0 for stage in USER_STAGES}
    rows[KERNEL] = total_us * system_share
    rows[IN_SYSCALL] = 0.0
    log(
        f"{sc.name}: {busy} samples in user space, {samples.get(IN_SYSCALL, 0)} in system calls, "
        f"{samples.get(IDLE, 0)} idle, {samples.get(DISK, 0)} disk"
    )
    return {
        "scenario": sc.name,
        "cpu_us_per_delivery_runs": cpu,
        "cpu_us_per_delivery": total_us,
        "system_share": system_share,
        "samples": samples,
        "busy_samples": busy,
        "us_per_delivery_by_stage": rows,
        "deliveries_profiled": res["deliveries"],
        "instructions_per_delivery": 0.0,
    }


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    import socket

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"port {port} not open after {START_TIMEOUT_S} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else "",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--broker", default="skipmq", choices=("skipmq", "mosquitto"))
    parser.add_argument(
        "--broker-root", default=str(REPO_ROOT), help="SkipMQ source tree to start (default this one)"
    )
    parser.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated subset of: " + ", ".join(sc.name for sc in SCENARIOS),
    )
    parser.add_argument("--rounds-scale", type=float, default=1.0, help="multiply every scenario's rounds")
    parser.add_argument("--no-persistence", action="store_true", help="mosquitto without 'persistence true'")
    parser.add_argument(
        "--strace",
        action="store_true",
        help="count system calls per delivery (strace -c attached over the measured rounds) instead",
    )
    parser.add_argument(
        "--profile",
        default=None,
        help="run the broker under py-spy record (folded stacks to this file) instead of callgrind; "
        "use --rounds-scale to run longer",
    )
    parser.add_argument(
        "--breakdown",
        type=int,
        default=0,
        metavar="RUNS",
        help="where the broker's CPU goes, per stage: RUNS uninstrumented runs per scenario (the CPU "
        "per delivery from /proc, median), then one of 4x the rounds with py-spy --native attached "
        "(its samples grouped into decode, routing, ..., system calls); rows add up to the median",
    )
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--annotate", type=int, default=0, help="print the top N functions per scenario")
    parser.add_argument("--keep", default=None, help="keep the callgrind dumps in this directory")
    args = parser.parse_args(argv)
    if args.breakdown and not (Path(sys.executable).parent / "py-spy").exists():
        print("py-spy is needed in this environment: .venv/bin/pip install py-spy", file=sys.stderr)
        return 2
    if not args.breakdown and (shutil.which("valgrind") is None or shutil.which("callgrind_control") is None):
        print("valgrind (with callgrind_control) is needed: apt-get install valgrind", file=sys.stderr)
        return 2
    scenarios = list(SCENARIOS)
    if args.scenarios:
        wanted = [w.strip() for w in args.scenarios.split(",") if w.strip()]
        scenarios = [sc for sc in SCENARIOS if sc.name in wanted]
        if len(scenarios) != len(wanted):
            print(f"unknown scenario in {wanted}", file=sys.stderr)
            return 2
    if args.rounds_scale != 1.0:
        scenarios = [
            dataclasses.replace(sc, rounds=max(1, round(sc.rounds * args.rounds_scale))) for sc in scenarios
        ]
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="skipmq-cost-"))
    try:
        result = measure(
            args.broker,
            Path(args.broker_root).resolve(),
            scenarios,
            workdir,
            not args.no_persistence,
            args.strace,
            args.profile,
            args.breakdown,
        )
        for res in result["scenarios"]:
            if args.annotate:
                res["top_functions"] = top_functions(Path(res["dump"]), args.annotate)
        result["date_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        result["load_average"] = os.getloadavg()[0]
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.breakdown:
        print_breakdown(result)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 0
    print(f"| scenario | {args.broker}: instructions per delivery |")
    print("|---|---:|")
    for res in result["scenarios"]:
        print(f"| {res['scenario']} | {res['instructions_per_delivery']:,.0f} |")
        for instr, name in res.get("top_functions", []):
            print(f"|   {name} | {instr / res['deliveries']:,.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
