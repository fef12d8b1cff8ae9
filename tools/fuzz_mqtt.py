"""Fuzz the MQTT codec and the broker's connection handler with hostile bytes (issue #12).

Each input is fed, in random pieces, to a fresh client connection of one real broker core
(``broker.core.broker.Broker``: codec, CONNECT handling, sessions, routing) on the simulator's
virtual clock, then the socket closes. An input *crashes* when an exception escapes
``ClientConnection.receive`` or the broker logs an internal error (a handler bug caught by the
connection's safety net). After every ``check_every`` inputs an honest client must still connect,
subscribe and get its QoS 1 message: a bad packet closes only its own connection.

Inputs are mutations (bit flips, byte insertions/deletions, truncations, length-field changes,
splices) of well-formed packets from ``tools.mqtt_raw`` (written from the specifications, not from
the broker's codec), plus random bytes. Seeded: the same seed gives the same inputs.

    .venv/bin/python -m tools.fuzz_mqtt --inputs 1000000 --seed 1     # by hand (docs/security.md)

The CI runs a bounded number (tests/unit/broker/test_fuzz_connection.py).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from broker.auth.users import Authenticator
from broker.config import load_config
from broker.core.broker import Broker
from simulation.world import ProcessScheduler, World
from tools.mqtt_raw import (
    PUBACK,
    PUBLISH,
    SUBACK,
    ack_packet,
    connect_packet,
    disconnect_packet,
    publish_packet,
    subscribe_packet,
)


class SinkTransport:
    """Where the broker writes a fuzzed connection's output (the bytes are counted, not parsed)."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.out += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


class _ErrorCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def seed_packets() -> list[bytes]:
    """Well-formed packets of both protocol versions, and short conversations."""
    v4 = connect_packet("fuzz", level=4, username="u", password=b"p", will=("w/t", b"bye", 1, False))
    v5 = connect_packet("fuzz5", level=5, props=[(0x11, 60), (0x21, 10)], will=("w/5", b"x", 2, True))
    after = [
        publish_packet("a/b", b"payload", qos=1, packet_id=7),
        publish_packet("a/b", b"p2", qos=2, packet_id=8, retain=True),
        subscribe_packet(3, [("a/#", 1), ("$share/g/x", 2)]),
        ack_packet(PUBACK, 7),
        bytes((0xC0, 0)),  # PINGREQ
        disconnect_packet(),
    ]
    after5 = [
        publish_packet("a/b", b"payload", qos=1, packet_id=7, level=5, props=[(0x23, 3), (0x01, 1)]),
        subscribe_packet(3, [("a/#", 1)], level=5),
        disconnect_packet(level=5, reason_code=0x04),
    ]
    return [v4, v5, v4 + b"".join(after), v5 + b"".join(after5), *after, *after5]


def mutate(data: bytes, rng: random.Random, corpus: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(7)
        if choice == 0 and buf:  # flip bits
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif choice == 1:  # insert bytes
            i = rng.randrange(len(buf) + 1)
            buf[i:i] = rng.randbytes(rng.randint(1, 8))
        elif choice == 2 and buf:  # delete bytes
            i = rng.randrange(len(buf))
            del buf[i : i + rng.randint(1, 8)]
        elif choice == 3 and buf:  # truncate
            del buf[rng.randrange(len(buf)) :]
        elif choice == 4 and len(buf) > 1:  # a hostile remaining length / 16-bit length
            i = rng.randrange(len(buf) - 1)
            buf[i : i + 2] = rng.choice((b"\xff\xff", b"\x00\x00", b"\xff\x7f", b"\x80\x80"))
        elif choice == 5:  # splice another packet in
            other = rng.choice(corpus)
            i = rng.randrange(len(buf) + 1)
            buf[i:i] = other[: rng.randint(0, len(other))]
        else:  # an interesting byte
            if buf:
                buf[rng.randrange(len(buf))] = rng.choice((0, 0x7F, 0x80, 0xFF, 0x30, 0x10, 0x82))
    return bytes(buf)


def inputs(seed: int, count: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    corpus = seed_packets()
    for _ in range(count):
        if rng.random() < 0.1:
            yield rng.randbytes(rng.randint(0, 64))
        else:
            yield mutate(rng.choice(corpus), rng, corpus)


@dataclass
class FuzzResult:
    inputs: int = 0
    crashes: list[tuple[bytes, str]] = field(default_factory=list)
    health_checks: int = 0


class ConnectionFuzzer:
    """One broker core on a virtual clock; :meth:`feed` runs one input on a fresh connection."""

    def __init__(self, seed: int = 0) -> None:
        self.world = World(seed)
        self.scheduler = ProcessScheduler(self.world)
        config = load_config(
            None, env={}, overrides={"sys.interval_s": 0, "store.persistence": False, "uvloop": False}
        )
        self.broker = Broker(
            config, self.scheduler, authenticator=Authenticator(allow_anonymous=True, password_file=None)
        )
        self.broker.start()
        self.rng = random.Random(seed)
        self.errors = _ErrorCounter()
        logging.getLogger("skipmq").addHandler(self.errors)
        self._checks = 0

    def close(self) -> None:
        logging.getLogger("skipmq").removeHandler(self.errors)

    def feed(self, data: bytes) -> str | None:
        """Feed ``data`` in random pieces to a new connection; a crash description, or None."""
        before = len(self.errors.records)
        sink = SinkTransport()
        conn = self.broker.new_client(sink, "tcp", peer="192.0.2.1:40000")
        assert conn is not None
        try:
            pos = 0
            while pos < len(data) and not sink.closed:
                step = self.rng.randint(1, max(1, len(data) - pos))
                conn.receive(data[pos : pos + step])
                pos += step
                self.world.run_for(0.001)
            conn.lost()
            self.world.run_for(0.001)
        except Exception as exc:  # the thing a fuzzer looks for
            return f"{type(exc).__name__}: {exc}"
        if len(self.errors.records) > before:
            return "; ".join(r.getMessage() for r in self.errors.records[before:])
        return None

    def honest_client_works(self) -> bool:
        """A well-formed client connects, subscribes and gets its own QoS 1 message back."""
        self._checks += 1
        sink = SinkTransport()
        conn = self.broker.new_client(sink, "tcp", peer="198.51.100.1:50000")
        assert conn is not None
        topic = f"health/{self._checks}"
        conn.receive(connect_packet(f"honest-{self._checks}", level=4))
        conn.receive(subscribe_packet(1, [(topic, 1)]))
        conn.receive(publish_packet(topic, b"ok", qos=1, packet_id=2))
        self.world.run_for(0.01)
        out = bytes(sink.out)
        ok = out[:1] == b"\x20" and bytes((SUBACK << 4,)) in out and bytes((PUBLISH << 4 | 2,)) in out
        conn.receive(disconnect_packet())
        conn.lost()
        self.world.run_for(0.001)
        return ok


def run(seed: int, count: int, *, check_every: int = 1000, progress: bool = False) -> FuzzResult:
    fuzzer = ConnectionFuzzer(seed)
    result = FuzzResult()
    started = time.monotonic()
    try:
        for data in inputs(seed, count):
            crash = fuzzer.feed(data)
            result.inputs += 1
            if crash is not None:
                result.crashes.append((data, crash))
            if result.inputs % check_every == 0:
                if not fuzzer.honest_client_works():
                    result.crashes.append((b"", f"an honest client failed after {result.inputs} inputs"))
                result.health_checks += 1
                if progress and result.inputs % (check_every * 50) == 0:
                    rate = result.inputs / max(1e-9, time.monotonic() - started)
                    print(f"{result.inputs} inputs, {len(result.crashes)} crashes, {rate:.0f}/s", flush=True)
    finally:
        fuzzer.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fuzz_mqtt", description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="how many inputs (default 100000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the inputs (default 1)")
    args = parser.parse_args(argv)
    logging.getLogger("skipmq").setLevel(logging.ERROR)
    logging.getLogger("skipmq").propagate = False
    started = time.monotonic()
    result = run(args.seed, args.inputs, progress=True)
    elapsed = time.monotonic() - started
    print(
        f"{result.inputs} inputs in {elapsed:.0f} s ({result.inputs / max(elapsed, 1e-9):.0f}/s), "
        f"{len(result.crashes)} crashes, {result.health_checks} honest-client checks, seed {args.seed}"
    )
    for data, crash in result.crashes[:10]:
        print(f"  crash {crash!r} on {data.hex()}")
    return 1 if result.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
