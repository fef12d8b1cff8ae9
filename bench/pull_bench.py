"""HTTP pull gateway vs MQTT delivery, side by side in one run (by hand, not in CI).

For each device count N (default 1 and 100; add 1000 with ``--devices 1,100,1000``), one SkipMQ
broker process (``python -m broker``, store on, ``pull.enabled``) gets:

1. **pull**: N pull sessions (``POST /v1/sessions/open``, QoS 1 filter ``pb/<i>``); a publisher
   queues M messages (QoS 1, 64-byte payloads, round-robin over the devices) while no device
   pulls; then N concurrent devices (aiohttp, one keep-alive connection each) drain their queues
   with ``POST /v1/pull`` (16 per response, the received numbers acknowledged in the next
   request) until every message arrived and its number was acknowledged;
2. **mqtt**: the same with N persistent MQTT 3.1.1 sessions (QoS 1, ``mb/<i>``): queued while
   disconnected, then N clients reconnect and drain (PUBACK per message).

Measured over each drain: delivered messages/s, and broker CPU (``utime+stime`` of the broker
process from ``/proc/<pid>/stat``) per delivered message. The clients run in this process; the
machine is shared (2 cores), so compare the ratio within one run, not absolute numbers across runs.

    .venv/bin/python bench/pull_bench.py --help
    .venv/bin/python bench/pull_bench.py                         # N = 1, 100; M = 4000 (~1 min)
    .venv/bin/python bench/pull_bench.py --devices 1,100,1000 --messages 8000 --json docs/pull_bench.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.mqtt import codec  # noqa: E402
from broker.mqtt.packets import Connack, Connect, Puback, Publish, Suback, Subscribe, Subscription  # noqa: E402
from tools.ports import free_port  # noqa: E402
from tools.proc_stats import cpu_s  # noqa: E402

HOST = "127.0.0.1"
PAYLOAD = b"x" * 64


def start_broker(workdir: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    port, http_port = free_port(), free_port()
    command = [
        sys.executable, "-m", "broker", "--bind", HOST, "--port", str(port), "--http-port", str(http_port),
        "--data-dir", str(workdir), "--log-level", "warning",
        "--set", "pull.enabled=true", "--set", "pull.requests_per_s=100000",
        "--set", "limits.max_queued_messages=100000",
    ]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((HOST, http_port), timeout=0.5):
                return proc, port, http_port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("broker did not start")


class MqttClient(asyncio.Protocol):
    """A small QoS 1 MQTT 3.1.1 client on the broker's own codec (acks every PUBLISH)."""

    def __init__(self) -> None:
        self.decoder = codec.Decoder(role="client", protocol_level=4)
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.connack: asyncio.Future[Connack] = loop.create_future()
        self.acks: dict[int, asyncio.Future[Any]] = {}
        self.received = 0
        self.all_received = asyncio.Event()
        self.expect = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        out: list[bytes] = []
        for packet in self.decoder.feed(data):
            if isinstance(packet, Publish):
                self.received += 1
                if packet.packet_id is not None:
                    out.append(codec.encode(Puback(packet.packet_id), 4))
                if self.expect and self.received >= self.expect:
                    self.all_received.set()
            elif isinstance(packet, Connack):
                self.connack.set_result(packet)
            elif isinstance(packet, (Puback, Suback)):
                future = self.acks.pop(packet.packet_id, None)
                if future is not None:
                    future.set_result(packet)
        if out:
            self.transport.write(b"".join(out))

    def send(self, packet: Any) -> None:
        assert self.transport is not None
        self.transport.write(codec.encode(packet, 4))

    def ack_future(self, packet_id: int) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.acks[packet_id] = future
        return future


async def mqtt_connect(port: int, client_id: str, *, clean: bool) -> MqttClient:
    loop = asyncio.get_running_loop()
    _t, client = await loop.create_connection(MqttClient, HOST, port)
    client.send(Connect(client_id=client_id, protocol_level=4, clean_start=clean, keep_alive_s=600))
    await asyncio.wait_for(client.connack, 30)
    return client


async def publish_all(port: int, topics: list[str], total: int, window: int = 200) -> None:
    publisher = await mqtt_connect(port, f"pub-{os.getpid()}-{time.monotonic_ns()}", clean=True)
    pending: list[asyncio.Future[Any]] = []
    for n in range(total):
        packet_id = n % 65535 + 1
        pending.append(publisher.ack_future(packet_id))
        publisher.send(Publish(topics[n % len(topics)], PAYLOAD, 1, False, False, packet_id))
        if len(pending) >= window:
            await asyncio.wait_for(asyncio.gather(*pending), 60)
            pending = []
    await asyncio.wait_for(asyncio.gather(*pending), 60)
    assert publisher.transport is not None
    publisher.transport.close()


async def run_pull(http_port: int, port: int, devices: int, total: int, pid: int) -> dict[str, Any]:
    url = f"http://{HOST}:{http_port}"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def post(path: str, body: dict[str, Any], session: aiohttp.ClientSession = http) -> Any:
            async with session.post(url + path, json=body) as response:
                assert response.status == 200, await response.text()
                return await response.json()

        sem = asyncio.Semaphore(50)

        async def open_one(i: int) -> None:
            async with sem:
                await post(
                    "/v1/sessions/open",
                    {"client_id": f"pd{i}", "subscriptions": [{"filter": f"pb/{i}", "qos": 1}]},
                )

        await asyncio.gather(*(open_one(i) for i in range(devices)))
        await asyncio.sleep(max(3.0, devices * 0.002))  # the opening links' leases: let them detach
        await publish_all(port, [f"pb/{i}" for i in range(devices)], total)
        per_device = [total // devices + (1 if i < total % devices else 0) for i in range(devices)]

        async def drain(i: int) -> int:
            got = 0
            acks: list[int] = []
            epoch = None
            while got < per_device[i] or acks:
                body: dict[str, Any] = {
                    "client_id": f"pd{i}",
                    "acks": acks,
                    "wait_s": 1 if got < per_device[i] else 0,
                }
                if epoch is not None:
                    body["epoch"] = epoch
                answer = await post("/v1/pull", body)
                epoch = answer["epoch"]
                acks = [m["seq"] for m in answer["messages"]]
                got += len(acks)
            return got

        cpu0, t0 = cpu_s(pid), time.perf_counter()
        got = sum(await asyncio.gather(*(drain(i) for i in range(devices))))
        elapsed, cpu = time.perf_counter() - t0, cpu_s(pid) - cpu0
    assert got == total, (got, total)
    return {"transport": "pull", "devices": devices, "messages": total, "seconds": elapsed,
            "msgs_per_s": total / elapsed, "cpu_us_per_msg": cpu / total * 1e6}  # fmt: skip


async def run_mqtt(port: int, devices: int, total: int, pid: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(50)

    async def subscribe_one(i: int) -> None:
        async with sem:
            client = await mqtt_connect(port, f"md{i}", clean=False)
            future = client.ack_future(1)
            client.send(Subscribe(packet_id=1, subscriptions=[Subscription(f"mb/{i}", 1)]))
            await asyncio.wait_for(future, 30)
            assert client.transport is not None
            client.transport.close()

    await asyncio.gather(*(subscribe_one(i) for i in range(devices)))
    await asyncio.sleep(1.0)
    await publish_all(port, [f"mb/{i}" for i in range(devices)], total)
    per_device = [total // devices + (1 if i < total % devices else 0) for i in range(devices)]
    cpu0, t0 = cpu_s(pid), time.perf_counter()

    async def drain(i: int) -> MqttClient:
        async with sem:
            client = await mqtt_connect(port, f"md{i}", clean=False)
        client.expect = per_device[i]
        if client.received < client.expect:
            await asyncio.wait_for(client.all_received.wait(), 300)
        return client

    clients = await asyncio.gather(*(drain(i) for i in range(devices)))
    elapsed, cpu = time.perf_counter() - t0, cpu_s(pid) - cpu0
    got = sum(c.received for c in clients)
    for client in clients:
        assert client.transport is not None
        client.transport.close()
    assert got >= total, (got, total)
    return {"transport": "mqtt", "devices": devices, "messages": total, "seconds": elapsed,
            "msgs_per_s": total / elapsed, "cpu_us_per_msg": cpu / total * 1e6}  # fmt: skip


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for devices in [int(d) for d in args.devices.split(",")]:
        total = max(args.messages, devices)
        for transport in ("pull", "mqtt"):
            with tempfile.TemporaryDirectory(prefix="pull-bench-") as workdir:
                proc, port, http_port = start_broker(Path(workdir))
                try:
                    print(f"{transport}: {devices} devices, {total} messages ...", flush=True)
                    if transport == "pull":
                        row = await run_pull(http_port, port, devices, total, proc.pid)
                    else:
                        row = await run_mqtt(port, devices, total, proc.pid)
                finally:
                    proc.terminate()
                    proc.wait(10)
            print(
                f"  {row['msgs_per_s']:.0f} msgs/s, {row['cpu_us_per_msg']:.0f} µs broker CPU per message",
                flush=True,
            )
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| devices | messages | pull msgs/s | MQTT msgs/s | pull CPU µs/msg | MQTT CPU µs/msg "
        "| CPU ratio pull/MQTT |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r["transport"], r["devices"]): r for r in rows}
    for devices in sorted({r["devices"] for r in rows}):
        p, m = by[("pull", devices)], by[("mqtt", devices)]
        lines.append(
            f"| {devices} | {p['messages']} | {p['msgs_per_s']:.0f} | {m['msgs_per_s']:.0f} | "
            f"{p['cpu_us_per_msg']:.0f} | {m['cpu_us_per_msg']:.0f} | "
            f"{p['cpu_us_per_msg'] / m['cpu_us_per_msg']:.1f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devices", default="1,100", help="comma-separated device counts (default 1,100)")
    parser.add_argument("--messages", type=int, default=4000, help="messages per device count (default 4000)")
    parser.add_argument("--json", help="write the rows to this JSON file")
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    print(table(rows))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"machine": os.uname().nodename, "cpus": os.cpu_count(), "rows": rows}, indent=1)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
