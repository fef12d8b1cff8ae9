"""What origin proofs cost per forwarded message (docs/benchmarks-cluster.md "Origin proofs").

Two parts, by hand:

* ``micro``: in this process, the sender's work (canonical bytes + one ECDSA P-256 signature per
  batch) and the receiver's (canonical bytes + one verification per batch, the certificate
  already admitted) per message, for batches of 1, 16 and 256 messages of 100 bytes.
* ``cluster``: real processes (tools.launcher, mutual TLS): 2 brokers, a paho publisher on broker 0
  and a paho subscriber on broker 1, QoS 1; rounds alternate ``cluster.origin_proofs = off`` and
  ``required`` (a new cluster per round), each publishing paced (one message at a time, every
  message its own batch: the worst case) and then in a closed loop (a window of 100: the link
  batches). CPU of each broker process (/proc) per delivered message; medians over the rounds
  and the on/off ratios, side by side.

    .venv/bin/python -m bench.origin_proof_bench --rounds 3 --json docs/origin_proof_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.adapters.transport.tls import issue_broker_cert, make_ca
from broker.cluster.messages import ForwardedMessage
from broker.cluster.origin_proof import Signer, Verifier, forwarded_bytes
from broker.core.session import Message
from tests.support.cluster import ClusterClient, probe_route, unique_id, wait_until
from tools.launcher import start_cluster
from tools.proc_stats import cpu_s


def micro(repeat: int = 200) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as root:
        make_ca(Path(root) / "ca")
        cert, key = issue_broker_cert(Path(root) / "ca", "127.0.0.1:7883", name="a")
        signer = Signer.from_pem(cert.read_bytes(), key.read_bytes())
        verifier = Verifier((Path(root) / "ca" / "ca.pem").read_bytes())
    out: dict[str, dict[str, float]] = {}
    for size in (1, 16, 256):
        batch = tuple(
            ForwardedMessage(
                "127.0.0.1:7883/abc", "=bench", n, Message("bench/t", b"x" * 100, 1, origin="a"), n
            )
            for n in range(1, size + 1)
        )
        proof = signer.sign(forwarded_bytes(batch))
        verifier.problem("127.0.0.1:7883", forwarded_bytes(batch), proof, time.time())  # admit once
        rounds = max(3, repeat // size)
        started = time.process_time()
        for _ in range(rounds):
            signer.sign(forwarded_bytes(batch))
        sign_us = (time.process_time() - started) / rounds / size * 1e6
        started = time.process_time()
        for _ in range(rounds):
            assert verifier.problem("127.0.0.1:7883", forwarded_bytes(batch), proof, time.time()) is None
        verify_us = (time.process_time() - started) / rounds / size * 1e6
        out[str(size)] = {"sign_us_per_message": sign_us, "verify_us_per_message": verify_us}
        print(
            f"batch of {size:3d}: sender {sign_us:7.1f} us/message, receiver {verify_us:7.1f} us/message",
            flush=True,
        )
    return out


def _round(mode: str, paced_messages: int, closed_messages: int, rate_per_s: float) -> dict[str, float]:
    # (the closed loop outruns a subscriber's default queue of 1,000: this measures CPU, not the limit)
    settings = {"cluster.origin_proofs": mode, "limits.max_queued_messages": str(4 * closed_messages)}
    with tempfile.TemporaryDirectory() as root:
        cluster = start_cluster(2, settings=settings, data_root=root)
        try:
            cluster.wait_ready(60.0)
            sub = ClusterClient(cluster.brokers[1].mqtt_port, client_id=unique_id("sub"))
            sub.subscribe("bench/#", qos=1)
            probe_route(cluster, 0, sub, "bench/probe")
            pub = ClusterClient(cluster.brokers[0].mqtt_port, client_id=unique_id("pub"), max_inflight=100)
            pids = [broker.pid for broker in cluster.brokers]
            result: dict[str, float] = {}
            for phase, paced, messages in (
                ("paced", True, paced_messages),
                ("closed", False, closed_messages),
            ):
                sub.drain(0.2)
                before = [cpu_s(pid) for pid in pids if pid is not None]
                started = time.monotonic()
                if paced:
                    for n in range(messages):
                        pub.publish(f"bench/{phase}", b"%d" % n, qos=1)
                        next_at = started + (n + 1) / rate_per_s
                        time.sleep(max(0.0, next_at - time.monotonic()))
                else:
                    for n in range(messages):
                        pub.publish_nowait(f"bench/{phase}", b"%d" % n, qos=1)
                received: list[Any] = []

                def all_in(count: int = messages, got: list[Any] = received) -> bool:
                    got.extend(sub.drain(0.05))
                    return len(got) >= count

                wait_until(all_in, 120.0, what=f"{messages} messages at the subscriber")
                after = [cpu_s(pid) for pid in pids if pid is not None]
                elapsed = time.monotonic() - started
                result[f"{phase}_pub_broker_us"] = (after[0] - before[0]) / messages * 1e6
                result[f"{phase}_sub_broker_us"] = (after[1] - before[1]) / messages * 1e6
                result[f"{phase}_msg_per_s"] = messages / elapsed
            signed = cluster.metrics_text(0)
            result["proofs_signed_pub_broker"] = _metric(signed, "skipmq_cluster_origin_proofs_signed_total")
            result["proofs_verified_sub_broker"] = _metric(
                cluster.metrics_text(1), "skipmq_cluster_origin_proofs_verified_total"
            )
            sub.close()
            pub.close()
            return result
        finally:
            cluster.close()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each mode, interleaved (default 3)")
    parser.add_argument(
        "--messages", type=int, default=1500, help="messages of the paced phase (default 1500)"
    )
    parser.add_argument(
        "--closed-messages",
        type=int,
        default=10000,
        help="messages of the closed-loop phase (default 10000: /proc counts CPU in 10 ms ticks)",
    )
    parser.add_argument("--rate", type=float, default=200.0, help="paced phase, messages/s (default 200)")
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    parser.add_argument("--skip-cluster", action="store_true", help="only the in-process part")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"nproc": os.cpu_count(), "load_before": os.getloadavg()}
    print("in-process (ECDSA P-256, 100-byte messages):", flush=True)
    report["micro"] = micro()
    if not args.skip_cluster:
        rounds: dict[str, list[dict[str, float]]] = {"off": [], "required": []}
        for number in range(args.rounds):
            for mode in ("off", "required"):
                outcome = _round(mode, args.messages, args.closed_messages, args.rate)
                rounds[mode].append(outcome)
                print(
                    f"round {number + 1} {mode:8s}: " + ", ".join(f"{k} {v:.1f}" for k, v in outcome.items()),
                    flush=True,
                )
        medians = {
            mode: {key: statistics.median(r[key] for r in results) for key in results[0]}
            for mode, results in rounds.items()
        }
        ratios = {
            key: medians["required"][key] / medians["off"][key]
            for key in medians["off"]
            if key.endswith("_us") and medians["off"][key]
        }
        report.update(rounds=rounds, medians=medians, ratios_on_over_off=ratios)
        print("medians:", json.dumps(medians, indent=1))
        print("ratios (proofs on / off):", json.dumps(ratios, indent=1))
    report["load_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
