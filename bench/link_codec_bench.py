"""Micro-benchmark of a broker link's codec on the forwarded-message path (run by hand).

What one cluster frame costs to encode on the publisher's broker and to decode on a subscriber's
broker (broker/adapters/transport/wire*.py), for a PUB carrying a ForwardedBatch of 1 message (a
paced publisher: every message alone in its frame) and of 50 (a closed loop), with an origin
proof, 64-byte payloads; the process's CPU time (not the wall clock: a loaded machine takes the
CPU away between calls), best of ``--repeat`` timing runs, us per frame and per message.

``--root DIR`` imports SkipMQ from DIR instead of this checkout, so that
``bench/compare_revisions.py`` can run this script against a revision that does not have it:

    .venv/bin/python bench/link_codec_bench.py
    .venv/bin/python bench/compare_revisions.py --before main --after HEAD --rounds 3 \\
        --bench "$PWD/bench/link_codec_bench.py --root . --json {json}"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import timeit
from pathlib import Path

TOPIC = "bench/cluster/temperature"
A = "127.0.0.1:40001"
B = "127.0.0.1:40002"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--number", type=int, default=2000, help="frames per timing run")
    parser.add_argument("--repeat", type=int, default=7, help="timing runs (the best one is reported)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.root.resolve()))
    from broker.adapters.transport import wire
    from broker.cluster.messages import ForwardedBatch, ForwardedMessage, OriginProof
    from broker.core.session import Message
    from overlay import messages as om

    key = (TOPIC, 1, A)
    proof = OriginProof(os.urandom(72), os.urandom(600))

    def pub(size: int, first: int) -> om.PUB:
        messages = tuple(
            ForwardedMessage(
                A, TOPIC, first + i, Message(TOPIC, os.urandom(64), 0, False, {}, None, A, "pub-1")
            )
            for i in range(size)
        )
        ref = (key, 0xDEAD_BEEF_CAFE_F00D)
        return om.PUB(
            key,
            ((TOPIC, 0, B), 7),
            TOPIC,
            ForwardedBatch(messages, proof),
            1,
            ref,
            1,
            (TOPIC, 1),
            (TOPIC, 2),
            0,
        )

    results: dict[str, float] = {}
    for size in (1, 50):
        items = [pub(size, k * size + 1) for k in range(args.number)]
        frames = [wire.encode_frame([item]) for item in items]
        cursor = iter(range(10**12))

        def encode(items: list[om.PUB] = items, cursor: object = cursor) -> None:
            item = items[next(cursor) % len(items)]  # type: ignore[call-overload]
            wire.encode_frame_from_items([wire.encode_item(item)])

        def decode(frames: list[bytes] = frames, cursor: object = cursor) -> None:
            for raw in wire.decode_frame_items(frames[next(cursor) % len(frames)]):  # type: ignore[call-overload]
                wire.item_from_proto(raw)

        for name, func in (("encode", encode), ("decode", decode)):
            best = min(timeit.repeat(func, number=args.number, repeat=args.repeat, timer=time.process_time))
            best = best / args.number * 1e6
            results[f"{name}_batch{size}_us_per_frame"] = best
            results[f"{name}_batch{size}_us_per_message"] = best / size
            print(f"{name} batch of {size:2d}: {best:7.2f} us per frame, {best / size:6.2f} us per message")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
