"""CO protocol core (seed 004, broker/cluster/causal.py) vs group size n: run by hand, never in CI.

For each n, n members (pure ``CausalGroup`` cores) exchange data in a deterministic discrete-event
simulation: every link delays each message by exactly R = 1 time unit (FIFO, no loss: the seed's
§4 setting), every member sends ``--messages`` data messages, one each ``--interval`` R, and the
idle ACK goes ``--ack-delay`` R after something new was accepted. Measured:

* processing time per received message (wall-clock ``perf_counter`` around every core call:
  ``send``, ``receive``, ``tick``; total / messages received) -- the seed's T_co (Fig. 7, O(n));
* header bytes per message: CID, SRC, SEQ, ACK_1..ACK_n, BUF as unsigned LEB128 varints (the
  protobuf encoding of the project's wire; CID and SRC as indices agreed at group establishment,
  no field tags), averaged over every message sent; and with fixed 4-byte fields for comparison;
* delivery latency: send -> ARL at each member in R (the seed: 2R after acceptance, so 3R after
  the send with R per hop), and the messages a member received between receiving p and
  delivering p (the seed: 2nW until acknowledgement).

    .venv/bin/python bench/co_bench.py --help
    .venv/bin/python bench/co_bench.py                  # n = 2,4,8,16,32; ~1 min
    .venv/bin/python bench/co_bench.py --sizes 2,4 --no-plot
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.cluster.causal import Broadcast, CausalGroup, CoMessage, Deliver, Ret, SendTo

ROOT = Path(__file__).resolve().parents[1]


def varint_bytes(value: int) -> int:
    length = 1
    while value >= 0x80:
        value >>= 7
        length += 1
    return length


def header_bytes(message: CoMessage, index: dict[str, int]) -> int:
    fields = (0, index[message.src], message.seq, *message.ack.values(), message.buf)
    return sum(varint_bytes(value) for value in fields)


@dataclass
class Row:
    n: int
    messages_received: int
    processing_us: float
    header_varint: float
    header_fixed: int
    latency_r_median: float
    latency_r_p99: float
    received_until_ack: float
    idle_acks_per_data: float


def run(n: int, *, messages: int, interval: float, window: int, ack_delay: float) -> Row:
    names = [f"broker-{index:02d}" for index in range(n)]
    index = {name: position for position, name in enumerate(names)}
    entities = {
        name: CausalGroup(name, names, window=window, ack_delay_s=ack_delay, retransmit_timeout_s=50.0)
        for name in names
    }
    events: list[tuple[float, int, str, str, CoMessage | Ret | None]] = []  # (at, order, kind, member, msg)
    order = 0
    for position, name in enumerate(names):
        for count in range(messages):
            order += 1
            at = count * interval + position * interval / n
            events.append((at, order, "send", name, None))
    heapq.heapify(events)
    busy_s = 0.0
    received = 0
    headers: list[int] = []
    sent_at: dict[bytes, float] = {}
    first_seen: dict[tuple[str, bytes], int] = {}
    received_by: dict[str, int] = dict.fromkeys(names, 0)
    latencies: list[float] = []
    until_ack: list[int] = []
    scheduled: dict[str, float] = {}

    def route(member: str, actions: list, now: float) -> None:  # type: ignore[type-arg]
        nonlocal order
        for action in actions:
            if isinstance(action, Broadcast):
                headers.append(header_bytes(action.message, index))
                for other in names:
                    if other != member:
                        order += 1
                        heapq.heappush(events, (now + 1.0, order, "receive", other, action.message))
            elif isinstance(action, SendTo):
                order += 1
                heapq.heappush(events, (now + 1.0, order, "receive", action.member, action.message))
            elif isinstance(action, Deliver):
                data = action.message.data
                assert data is not None
                latencies.append(now - sent_at[data])
                until_ack.append(received_by[member] - first_seen[(member, data)])
        deadline = entities[member].next_deadline()
        if deadline is not None and scheduled.get(member) != deadline:
            scheduled[member] = deadline
            order += 1
            heapq.heappush(events, (deadline, order, "tick", member, None))

    while events:
        now, _order, kind, member, message = heapq.heappop(events)
        entity = entities[member]
        if kind == "send":
            data = f"{member}:{_order}".encode()
            sent_at[data] = now
            first_seen[(member, data)] = received_by[member]
            started = time.perf_counter()
            actions = entity.send(data, now)
        elif kind == "receive":
            assert message is not None
            if isinstance(message, CoMessage):
                received += 1
                received_by[member] += 1
                if message.data is not None:
                    first_seen.setdefault((member, message.data), received_by[member])
            started = time.perf_counter()
            actions = entity.receive(message, now)
        else:
            if scheduled.get(member) != now:
                continue
            del scheduled[member]
            started = time.perf_counter()
            actions = entity.tick(now)
        busy_s += time.perf_counter() - started
        route(member, actions, now)
    assert len(latencies) == n * n * messages, "not everything was delivered"
    idle = sum(entity.stats.idle_acks_sent for entity in entities.values())
    latencies.sort()
    return Row(
        n=n,
        messages_received=received,
        processing_us=busy_s / received * 1e6,
        header_varint=statistics.fmean(headers),
        header_fixed=4 * (4 + n),
        latency_r_median=statistics.median(latencies),
        latency_r_p99=latencies[int(0.99 * (len(latencies) - 1))],
        received_until_ack=statistics.median(until_ack),
        idle_acks_per_data=idle / (n * messages),
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| n | messages received | µs / received message | header B (varint) | header B (4-byte) "
        "| latency send→ARL (R, median / p99) | received between receipt and ARL (median) "
        "| idle ACKs per data message |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.n} | {row.messages_received} | {row.processing_us:.1f} | {row.header_varint:.1f} "
            f"| {row.header_fixed} | {row.latency_r_median:.2f} / {row.latency_r_p99:.2f} "
            f"| {row.received_until_ack:.0f} | {row.idle_acks_per_data:.2f} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [row.n for row in rows]
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].plot(sizes, [row.processing_us for row in rows], "o-")
    axes[0].set(title="processing time per received message", xlabel="n", ylabel="µs")
    axes[1].plot(sizes, [row.header_varint for row in rows], "o-", label="varint")
    axes[1].plot(sizes, [row.header_fixed for row in rows], "s--", label="4-byte fields")
    axes[1].set(title="header bytes per message", xlabel="n", ylabel="bytes")
    axes[1].legend()
    axes[2].plot(sizes, [row.latency_r_median for row in rows], "o-", label="median")
    axes[2].plot(sizes, [row.latency_r_p99 for row in rows], "s--", label="p99")
    axes[2].set(title="send → delivery (ARL)", xlabel="n", ylabel="link delays R")
    axes[2].legend()
    for axis in axes:
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="2,4,8,16,32", help="group sizes n (comma separated)")
    parser.add_argument("--messages", type=int, default=20, help="data messages sent by each member")
    parser.add_argument("--interval", type=float, default=0.5, help="R between a member's sends")
    parser.add_argument("--window", type=int, default=8, help="W of the flow condition")
    parser.add_argument("--ack-delay", type=float, default=0.1, help="R before an idle ACK")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "co_bench.png")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()
    rows = []
    for n in (int(size) for size in args.sizes.split(",")):
        rows.append(
            run(
                n,
                messages=args.messages,
                interval=args.interval,
                window=args.window,
                ack_delay=args.ack_delay,
            )
        )
        print(f"n={n} done", file=sys.stderr)
    print(table(rows))
    if not args.no_plot:
        plot(rows, args.out)
        print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
