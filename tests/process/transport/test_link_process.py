"""Two real processes talking over the gRPC transport (broker/transport/link.py).

The child is a small Python program that runs a GrpcTransport and echoes every item back to
its sender; the parent sends overlay messages and envelopes (seed 003 queries, seed 002
envelope with a session snapshot) and checks they come back equal and in order, then kills
the child and sees the peer-down callback. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from broker.adapters.transport import GrpcTransport, TransportConfig
from broker.cluster.messages import ClaimReply, Envelope, ForwardedMessage
from broker.core.session import Message, OutEntry, SessionSnapshot, SubOptions
from overlay import messages as om

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from broker.adapters.transport import GrpcTransport, TransportConfig

    async def main() -> None:
        transport: GrpcTransport
        def echo(sender: str, item: object) -> None:
            transport.send(sender, item)
        transport = GrpcTransport(
            advertise_host="127.0.0.1", on_receive=echo, on_peer_down=lambda peer: None,
            config=TransportConfig(connect_timeout_s=2.0),
        )
        port = await transport.start("127.0.0.1", 0)
        print(f"PORT {port}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes
        await transport.stop(drain_timeout_s=1.0)
        print("STOPPED", flush=True)

    asyncio.run(main())
    """
)
STARTUP_TIMEOUT_S = 20.0


def _items(count: int) -> list[object]:
    key = ("plant/7/temp", 1, "127.0.0.1:1")
    ref = (key, 12345)
    message = Message(
        "plant/7/temp", b"21.5", 1, False, {"user_property": [("unit", "C")]}, None, "x:1", "dev"
    )
    snapshot = SessionSnapshot(
        "dev", 5, 60, "user", [SubOptions("plant/#", 1)], [OutEntry(message, 1, False, [])], {4}
    )
    items: list[object] = []
    for n in range(count):
        if n % 3 == 0:
            items.append(
                om.PUB(
                    key,
                    ref,
                    "plant/7/temp",
                    ForwardedMessage("x:1", "plant", n, message),
                    n,
                    ref,
                    1,
                    (),
                    (),
                    n,
                )
            )
        elif n % 3 == 1:
            items.append(Envelope("a:1", "b:2", "dev", "", n, 8, ClaimReply(n, "dev", True, snapshot)))
        else:
            items.append(om.PING(n))
    return items


async def _read_port(process: asyncio.subprocess.Process) -> int:
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), STARTUP_TIMEOUT_S)
    text = line.decode().strip()
    assert text.startswith("PORT "), f"child printed {text!r} instead of its port"
    return int(text.split()[1])


def test_two_processes_echo_in_order_and_a_killed_child_is_reported_down() -> None:
    async def scenario() -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=REPO
        )
        received: list[tuple[str, object]] = []
        downs: list[str] = []
        parent = GrpcTransport(
            advertise_host="127.0.0.1",
            on_receive=lambda sender, item: received.append((sender, item)),
            on_peer_down=downs.append,
            config=TransportConfig(connect_timeout_s=2.0, reconnect_backoff_max_s=0.2),
        )
        try:
            port = await _read_port(child)
            await parent.start("127.0.0.1", 0)
            peer = f"127.0.0.1:{port}"
            items = _items(600)
            for item in items:
                parent.send(peer, item)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30.0
            while len(received) < len(items) and loop.time() < deadline:
                await asyncio.sleep(0.02)
            assert [item for _, item in received] == items
            assert {sender for sender, _ in received} == {peer}
            assert parent.connected_peers() == frozenset({peer})
            assert downs == []
            child.kill()
            await asyncio.wait_for(child.wait(), 10.0)
            deadline = loop.time() + 10.0
            while not downs and loop.time() < deadline:
                await asyncio.sleep(0.02)
            assert downs == [peer]
            assert peer not in parent.connected_peers()
        finally:
            if child.returncode is None:
                child.kill()
                await asyncio.wait_for(child.wait(), 10.0)
            await parent.stop(drain_timeout_s=0.5)

    asyncio.run(asyncio.wait_for(scenario(), 90.0))


def test_a_child_that_stops_gracefully_drains_its_echoes_first() -> None:
    async def scenario() -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=REPO
        )
        received: list[object] = []
        downs: list[str] = []
        parent = GrpcTransport(
            advertise_host="127.0.0.1",
            on_receive=lambda sender, item: received.append(item),
            on_peer_down=downs.append,
        )
        try:
            port = await _read_port(child)
            await parent.start("127.0.0.1", 0)
            peer = f"127.0.0.1:{port}"
            for n in range(300):
                parent.send(peer, om.PING(n))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30.0
            while len(received) < 300 and loop.time() < deadline:
                await asyncio.sleep(0.02)
            assert received == [om.PING(n) for n in range(300)]
            assert child.stdin is not None and child.stdout is not None
            child.stdin.close()  # graceful stop
            line = await asyncio.wait_for(child.stdout.readline(), 15.0)
            assert line.decode().strip() == "STOPPED"
            assert await asyncio.wait_for(child.wait(), 10.0) == 0
            deadline = loop.time() + 10.0
            while not downs and loop.time() < deadline:
                await asyncio.sleep(0.02)
            assert downs == [peer]  # its end of stream is an outage for us
        finally:
            if child.returncode is None:
                child.kill()
                await asyncio.wait_for(child.wait(), 10.0)
            await parent.stop(drain_timeout_s=0.5)

    asyncio.run(asyncio.wait_for(scenario(), 90.0))
