"""What a forwarded QoS 0 message's in-memory send-log entry costs the publisher's broker (by hand).

A QoS 0 message is never written to the durable send log (broker/cluster/streams.py ``_forward``;
tests/process/cluster/test_qos0_send_log.py), but while its stream has receivers the sender keeps
it in memory (``StreamSender.append``: a frozen ``ForwardedMessage``, an ``_Entry``, a
``SortedDict`` insert, the retransmit timer) until every receiver acknowledged it (``acked`` ->
``_free``), so that a receiver that missed it can ask for it again (RET). Dropping that entry needs
a receiver rule for a lost QoS 0 SEQ (skip it) that the simulation checks (issue #31); this bench
says what it would save, in the sender's pure core, CPU time of this process per message:

* ``logged``: a stream with one receiver; per message ``append`` (QoS 0, kept in memory) and the
  receiver's acknowledgement of it (``acked``, which frees it): today's path at a paced rate, where
  every message is acknowledged alone;
* ``logged-batch``: the same, one acknowledgement per 50 messages (a closed loop's batches);
* ``unlogged``: a stream without receivers: ``append`` numbers the message and returns before the
  entry (the path a no-entry QoS 0 would take); the acknowledgements of such a design would still
  arrive and still be handled (``acked`` without anything to free) - ``ack-only`` times that part.

    .venv/bin/python bench/link_sendlog_bench.py
    .venv/bin/python bench/link_sendlog_bench.py --messages 200000 --rounds 7 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.cluster.messages import StreamPosition
from broker.cluster.stream_sender import StreamSender
from broker.core.session import Message

ORIGIN = "a/1"
CLS = "=bench"
RECEIVER = "b"


def _sender(receivers: list[str]) -> StreamSender:
    return StreamSender(
        ORIGIN,
        retransmit_s=1.0,
        retention_s=60.0,
        presence_grace_s=5.0,
        min_retention_s=10.0,
        receivers_of=lambda cls: receivers,
    )


def logged(messages: int, ack_every: int) -> float:
    sender = _sender([RECEIVER])
    message = Message("bench/x", b"x" * 64, 0)
    start = time.process_time()
    for n in range(messages):
        forwarded = sender.append(CLS, message, 0.0)
        if (n + 1) % ack_every == 0:
            sender.acked(RECEIVER, (StreamPosition(ORIGIN, CLS, forwarded.seq + 1),), 0.0)
    return (time.process_time() - start) * 1e6 / messages


def unlogged(messages: int) -> float:
    sender = _sender([])
    message = Message("bench/x", b"x" * 64, 0)
    start = time.process_time()
    for _ in range(messages):
        sender.append(CLS, message, 0.0)
    return (time.process_time() - start) * 1e6 / messages


def ack_only(messages: int) -> float:
    sender = _sender([RECEIVER])
    message = Message("bench/x", b"x" * 64, 0)
    sender.acked(RECEIVER, (StreamPosition(ORIGIN, CLS, 2),), 0.0)
    forwarded = sender.append(CLS, message, 0.0)  # the stream, with its receiver
    sender.acked(RECEIVER, (StreamPosition(ORIGIN, CLS, forwarded.seq + 1),), 0.0)
    start = time.process_time()
    for n in range(messages):
        sender.acked(RECEIVER, (StreamPosition(ORIGIN, CLS, forwarded.seq + 2 + n),), 0.0)
    return (time.process_time() - start) * 1e6 / messages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000, help="messages per run (default 100000)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--json", help="write the per-round figures here")
    args = parser.parse_args(argv)
    rows: dict[str, list[float]] = {"logged": [], "logged-batch": [], "unlogged": [], "ack-only": []}
    for round_index in range(args.rounds):
        rows["logged"].append(logged(args.messages, 1))
        rows["logged-batch"].append(logged(args.messages, 50))
        rows["unlogged"].append(unlogged(args.messages))
        rows["ack-only"].append(ack_only(args.messages))
        print(
            f"round {round_index + 1}/{args.rounds}: "
            + ", ".join(f"{name} {values[-1]:.2f} us" for name, values in rows.items()),
            flush=True,
        )
    print("\n| per QoS 0 message, sender core (CPU us, median of rounds) | us |\n|---|---:|")
    for name, values in rows.items():
        print(f"| `{name}` | {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}) |")
    per_round = zip(rows["logged"], rows["unlogged"], rows["ack-only"], strict=True)
    saved = statistics.median(log - (unl + ack) for log, unl, ack in per_round)
    print(f"\nthe entry itself (logged - unlogged - ack-only, median per round): {saved:.2f} us per message")
    if args.json:
        Path(args.json).write_text(json.dumps({"messages": args.messages, "rounds": rows, "entry_us": saved}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
