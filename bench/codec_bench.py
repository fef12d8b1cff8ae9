"""Micro-benchmark of the MQTT codec's hot path (broker/mqtt/codec.py); run by hand.

    .venv/bin/python bench/codec_bench.py [--repeat 7] [--number 20000]

Prints µs per operation (best of ``--repeat`` runs of ``--number`` operations each, so other
load on the machine inflates the figures as little as possible) for:
  * decoding one QoS 0 PUBLISH (64-byte payload, short topic) per ``feed`` call, MQTT 3.1.1 and 5;
  * decoding 1,000 / 10,000 / 100,000 back-to-back PUBLISHes in one buffer (µs per packet; equal
    figures mean linear cost: no O(n²) buffer slicing);
  * ``encode_publish`` QoS 0 / QoS 1 and the generic ``encode`` of a Publish object.
Targets from the codec brief: decode well under 3 µs, ``encode_publish`` under 2 µs (Python 3.11).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from broker.mqtt.codec import Decoder, encode, encode_publish  # noqa: E402
from broker.mqtt.packets import Publish  # noqa: E402

TOPIC = "sensors/42/temp"
PAYLOAD = bytes(range(64))


def best_us(func: Callable[[], object], number: int, repeat: int) -> float:
    """Best time per call in µs over ``repeat`` runs of ``number`` calls."""
    return min(timeit.repeat(func, number=number, repeat=repeat)) / number * 1e6


def bench_single_decode(level: int, qos: int, number: int, repeat: int) -> float:
    packet_id = 7 if qos else None
    wire = encode_publish(TOPIC, PAYLOAD, qos, False, False, packet_id, None, level)
    decoder = Decoder(protocol_level=level, handshake_done=True)
    assert decoder.feed(wire) == [Publish(TOPIC, PAYLOAD, qos, packet_id=packet_id)]
    feed = decoder.feed
    return best_us(lambda: feed(wire), number, repeat)


def bench_batch_decode(level: int, count: int, repeat: int) -> float:
    wire = encode_publish(TOPIC, PAYLOAD, 0, False, False, None, None, level) * count
    decoder = Decoder(protocol_level=level, handshake_done=True)
    assert len(decoder.feed(wire)) == count
    runs = max(1, 100_000 // count)
    return best_us(lambda: decoder.feed(wire), runs, repeat) / count


def bench_encode_publish(level: int, qos: int, number: int, repeat: int) -> float:
    packet_id = 7 if qos else None
    return best_us(
        lambda: encode_publish(TOPIC, PAYLOAD, qos, False, False, packet_id, None, level), number, repeat
    )


def bench_generic_encode(level: int, number: int, repeat: int) -> float:
    packet = Publish(TOPIC, PAYLOAD)
    return best_us(lambda: encode(packet, level), number, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--number", type=int, default=20_000, help="operations per timing run")
    parser.add_argument("--repeat", type=int, default=7, help="timing runs (the best one is reported)")
    args = parser.parse_args()
    number, repeat = args.number, args.repeat

    print(f"machine: {platform.machine()}, nproc={os.cpu_count()}, Python {platform.python_version()}")
    print(f"PUBLISH: topic {TOPIC!r}, {len(PAYLOAD)}-byte payload; best of {repeat} x {number}\n")
    rows: list[tuple[str, float]] = []
    for level in (4, 5):
        version = "3.1.1" if level == 4 else "5.0"
        rows.append(
            (f"decode QoS0 PUBLISH, 1 per feed ({version})", bench_single_decode(level, 0, number, repeat))
        )
        rows.append(
            (f"decode QoS1 PUBLISH, 1 per feed ({version})", bench_single_decode(level, 1, number, repeat))
        )
        for count in (1_000, 10_000, 100_000):
            rows.append(
                (
                    f"decode {count:>7,} back-to-back, per packet ({version})",
                    bench_batch_decode(level, count, 3),
                )
            )
        rows.append((f"encode_publish QoS0 ({version})", bench_encode_publish(level, 0, number, repeat)))
        rows.append((f"encode_publish QoS1 ({version})", bench_encode_publish(level, 1, number, repeat)))
        rows.append((f"encode(Publish) QoS0 ({version})", bench_generic_encode(level, number, repeat)))
    width = max(len(name) for name, _ in rows)
    for name, micros in rows:
        print(f"{name:<{width}}  {micros:7.3f} µs")


if __name__ == "__main__":
    main()
