"""What the Hello challenge costs (docs/security.md "Who answers a dial"): once per link.

Two measurements, by hand (``--help``):

* **CPU of the answer and the check** (``broker.cluster.origin_hello``, in this process, with the
  keys ``skipmq certs`` makes: ECDSA P-256): the acceptor's ``answer`` (one signature), the dialer's
  ``check`` with the answering certificate already admitted (one verification: every dial after
  the first to a peer), and with a fresh verifier (the certificate's chain checked too: the first
  dial to a peer, or after the CA bundle changed). Median of ``--ops`` calls, in microseconds.
* **Link set-up time** with real grpc.aio links and mutual TLS on loopback, in one process: a new
  dialing transport per dial (so a new TLS handshake every time), to one accepting transport;
  from ``send`` to the link being up. Variants interleaved within each round: ``off`` (the dialer
  asks nothing: the Hello as before) and ``required`` (challenge, answer, check). Reported: median
  and p90 per variant and the ratio of medians.

    .venv/bin/python bench/link_hello_bench.py --rounds 40 --ops 2000

Prints the machine (``nproc``, CPU model) and the load average before and after; the machine
may be shared, so read the ratio within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from broker.adapters.transport import GrpcTransport, TransportConfig
from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert, make_ca
from broker.cluster.messages import ClassInterest, Envelope
from broker.cluster.origin_hello import CHALLENGE_BYTES, PROVEN, LinkIdentity
from broker.cluster.origin_proof import Signer, Verifier
from tools.ports import free_port

HOST = "127.0.0.1"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _keys(ca: Path, peer_id: str, name: str) -> tuple[ClusterTls, Signer, Verifier]:
    cert, key = issue_broker_cert(ca, peer_id, name=name)
    tls = ClusterTls(TlsFiles(str(ca / "ca.pem"), str(cert), str(key)))
    return tls, Signer.from_pem(cert.read_bytes(), key.read_bytes()), Verifier((ca / "ca.pem").read_bytes())


def cpu_costs(ca: Path, ops: int) -> dict[str, float]:
    _, signer_a, verifier_a = _keys(ca, "10.0.0.1:7883", "cpu-a")
    _, signer_d, _ = _keys(ca, "10.0.0.4:7883", "cpu-d")
    ca_pem = (ca / "ca.pem").read_bytes()
    dialer = LinkIdentity("required", lambda: signer_a, lambda: verifier_a)
    acceptor = LinkIdentity("required", lambda: signer_d, lambda: None)
    answers, warm, cold = [], [], []
    for _ in range(ops):
        challenge = os.urandom(CHALLENGE_BYTES)
        started = time.perf_counter_ns()
        proof = acceptor.answer(challenge, "10.0.0.1:7883", "10.0.0.4:7883")
        answers.append(time.perf_counter_ns() - started)
        started = time.perf_counter_ns()
        verdict = dialer.check(challenge, "10.0.0.1:7883", "10.0.0.4:7883", proof, time.time())
        warm.append(time.perf_counter_ns() - started)
        assert verdict.outcome == PROVEN, verdict
    for _ in range(max(1, ops // 4)):
        challenge = os.urandom(CHALLENGE_BYTES)
        proof = acceptor.answer(challenge, "10.0.0.1:7883", "10.0.0.4:7883")
        fresh = Verifier(ca_pem)
        first = LinkIdentity("required", lambda: signer_a, lambda fresh=fresh: fresh)  # type: ignore[misc]
        started = time.perf_counter_ns()
        verdict = first.check(challenge, "10.0.0.1:7883", "10.0.0.4:7883", proof, time.time())
        cold.append(time.perf_counter_ns() - started)
        assert verdict.outcome == PROVEN, verdict
    return {
        "answer_us": statistics.median(answers) / 1000,
        "check_us": statistics.median(warm) / 1000,
        "check_first_us": statistics.median(cold) / 1000,
    }


async def setup_times(ca: Path, rounds: int) -> dict[str, list[float]]:
    port_d = free_port()
    tls_d, signer_d, verifier_d = _keys(ca, f"{HOST}:{port_d}", "d")
    config = TransportConfig(connect_timeout_s=5.0)
    acceptor = GrpcTransport(
        advertise_host=HOST,
        on_receive=lambda *_: None,
        on_peer_down=lambda *_: None,
        config=config,
        tls=tls_d,
        identity=LinkIdentity("required", lambda: signer_d, lambda: verifier_d),
    )
    await acceptor.start(HOST, port_d)
    dialers = {}
    for mode in ("off", "required"):
        port = free_port()
        tls, signer, verifier = _keys(ca, f"{HOST}:{port}", f"a-{mode}")
        dialers[mode] = (port, tls, LinkIdentity(mode, lambda s=signer: s, lambda v=verifier: v))
    times: dict[str, list[float]] = {mode: [] for mode in dialers}
    try:
        for round_index in range(rounds + 1):
            order = list(dialers) if round_index % 2 == 0 else list(reversed(dialers))
            for mode in order:
                port, tls, identity = dialers[mode]
                dialer = GrpcTransport(
                    advertise_host=HOST,
                    on_receive=lambda *_: None,
                    on_peer_down=lambda *_: None,
                    config=config,
                    tls=tls,
                    identity=identity,
                )
                await dialer.start(HOST, port)
                started = time.perf_counter()
                dialer.send(
                    acceptor.self_id,
                    Envelope(dialer.self_id, acceptor.self_id, "", "", 0, 4, ClassInterest(())),
                )
                while acceptor.self_id not in dialer.connected_peers():
                    if time.perf_counter() - started > 10.0:
                        raise RuntimeError(f"no link within 10 s ({mode}): {dialer.dial_refusals}")
                    await asyncio.sleep(0.0005)
                elapsed = time.perf_counter() - started
                if round_index:  # (round 0 warms up both variants)
                    times[mode].append(elapsed * 1000)
                await dialer.stop(drain_timeout_s=0.1)
    finally:
        await acceptor.stop(drain_timeout_s=0.1)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=40, help="link set-ups per variant (interleaved)")
    parser.add_argument("--ops", type=int, default=2000, help="answer/check calls for the CPU figures")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    print(f"machine: {os.cpu_count()} CPUs, {_cpu_model()}; load average before {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="hello-bench-") as tmp:
        ca = Path(tmp) / "ca"
        make_ca(ca)
        costs = cpu_costs(ca, args.ops)
        print(
            f"CPU per link (ECDSA P-256), median of {args.ops}: "
            f"acceptor's answer {costs['answer_us']:.0f} us, "
            f"dialer's check {costs['check_us']:.0f} us (certificate known), "
            f"{costs['check_first_us']:.0f} us (first dial: chain checked too)"
        )
        times = asyncio.run(setup_times(ca, args.rounds))
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    for mode, values in times.items():
        p90 = statistics.quantiles(values, n=10)[-1]
        print(
            f"link set-up, mutual TLS, {mode:>8}: median {medians[mode]:.2f} ms, "
            f"p90 {p90:.2f} ms ({len(values)} dials)"
        )
    print(f"ratio required/off (medians): {medians['required'] / medians['off']:.3f}")
    print(f"load average after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
