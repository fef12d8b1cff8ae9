"""CPU of one forwarded message through a broker link, both ends in one process (run by hand).

Two ``GrpcTransport``s (the cluster's link, mutual TLS with a throwaway CA, the default runtime) on
one event loop, on loopback. The sender hands the transport a PUB carrying a ForwardedBatch of one
64-byte message (what a paced publisher's broker sends each subscriber broker), the receiver's
``on_receive`` takes it and the next one is sent from there: one message in flight, each alone in
its frames and loop turns, so every per-message cost of the link counts once (encode, the drain,
the HTTP/2 and TLS framing, the socket write and read, decode, delivery). Reports the process's
CPU time per message (``time.process_time``), best of ``--repeat`` runs (best-of: other load on
the machine inflates every run, the best run least).

``--root DIR`` imports SkipMQ from DIR instead of this checkout, so that
``bench/compare_revisions.py`` can run this script against a revision that does not have it:

    .venv/bin/python bench/link_cost_bench.py
    .venv/bin/python bench/compare_revisions.py --before main --after HEAD --rounds 5 \\
        --bench "$PWD/bench/link_cost_bench.py --root . --json {json}"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

TOPIC = "bench/cluster/temperature"


async def run(args: argparse.Namespace) -> dict[str, float]:
    from broker.adapters.transport import GrpcTransport
    from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert, make_ca
    from broker.cluster.messages import ForwardedBatch, ForwardedMessage
    from broker.core.session import Message
    from overlay import messages as om
    from tools.ports import free_ports

    logging.getLogger("skipmq.transport").setLevel(logging.ERROR)
    tmp = Path(tempfile.mkdtemp(prefix="skipmq-link-cost-"))
    make_ca(tmp)
    received: asyncio.Queue[object] = asyncio.Queue()
    state = {"left": 0}
    sender_box: list[GrpcTransport] = []
    target: list[str] = []
    items: list[om.PUB] = []

    def on_receive(_peer: str, item: object) -> None:
        if state["left"] > 0:
            state["left"] -= 1
            sender_box[0].send(target[0], items[state["left"] % len(items)])
        else:
            received.put_nowait(item)

    transports = []
    for port, callback in zip(free_ports(2), (lambda _p, _i: None, on_receive), strict=True):
        cert, cert_key = issue_broker_cert(tmp, f"127.0.0.1:{port}")
        tls = ClusterTls(TlsFiles(str(tmp / "ca.pem"), str(cert), str(cert_key)))
        transport = GrpcTransport(
            advertise_host="127.0.0.1", on_receive=callback, on_peer_down=lambda _p: None, tls=tls
        )
        await transport.start("127.0.0.1", port)
        transports.append(transport)
    sender, receiver = transports
    sender_box.append(sender)
    target.append(receiver.self_id)
    key = (TOPIC, 1, sender.self_id)
    for seq in range(1, 1001):
        message = Message(TOPIC, os.urandom(64), 0, False, {}, None, sender.self_id, "pub-1")
        batch = ForwardedBatch((ForwardedMessage(sender.self_id + "/1", TOPIC, seq, message),))
        ref = (key, 0xDEAD_BEEF_CAFE_F00D)
        dest = (TOPIC, 1, receiver.self_id)
        items.append(om.PUB(dest, ref, TOPIC, batch, seq, ref, 1, (TOPIC, 1), (TOPIC, 2), 0))
    sender.send(receiver.self_id, items[0])  # the link comes up
    await asyncio.wait_for(received.get(), 10)
    best = float("inf")
    for _ in range(args.repeat):
        state["left"] = args.messages
        start = time.process_time()
        sender.send(receiver.self_id, items[0])
        await asyncio.wait_for(received.get(), 60)
        best = min(best, (time.process_time() - start) / (args.messages + 1) * 1e6)
    for transport in transports:
        await transport.stop(drain_timeout_s=0.5)
    return {"cpu_us_per_message": best}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--messages", type=int, default=3000, help="messages per timing run")
    parser.add_argument("--repeat", type=int, default=5, help="timing runs (the best one is reported)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.root.resolve()))
    try:
        import uvloop

        results = uvloop.run(run(args))
    except ImportError:
        results = asyncio.run(run(args))
    print(f"link, both ends: {results['cpu_us_per_message']:.1f} us CPU per message")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
