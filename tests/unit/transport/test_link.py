"""The gRPC transport (broker/transport/link.py) with real grpc.aio servers in this process.

FIFO of 1,000 items, batching under load and no latency timer when idle, the simultaneous-dial
tie-break, reconnect after the peer restarts on the same port (items queued meanwhile arrive in
order), peer-down callback on a refused dial, the bounded send queue, backpressure from a peer
that stops reading, malformed frames and Hellos from a raw client, and the standard gRPC health
service.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.adapters.transport import GrpcTransport, TransportConfig, WireError, wire
from broker.cluster.messages import Envelope, RetainedSyncRequest, RetainedUpdate
from broker.core.session import Message
from overlay import messages as om
from tools.ports import free_port

HOST = "127.0.0.1"
FAST = TransportConfig(connect_timeout_s=2.0, reconnect_backoff_initial_s=0.02, reconnect_backoff_max_s=0.2)


class Node:
    """A transport plus what its callbacks saw."""

    def __init__(self, config: TransportConfig = FAST, echo: bool = False) -> None:
        self.received: list[tuple[str, object]] = []
        self.downs: list[str] = []
        self.echo = echo
        self.transport = GrpcTransport(
            advertise_host=HOST, on_receive=self._on_receive, on_peer_down=self.downs.append, config=config
        )

    def _on_receive(self, sender: str, item: object) -> None:
        self.received.append((sender, item))
        if self.echo:
            self.transport.send(sender, item)

    async def start(self, port: int = 0) -> Node:
        await self.transport.start(HOST, port)
        return self

    @property
    def id(self) -> str:
        return self.transport.self_id

    def nonces(self, sender: str | None = None) -> list[int]:
        return [
            item.nonce for who, item in self.received if isinstance(item, om.PING) and sender in (None, who)
        ]


def run(test: Callable[[], Awaitable[None]], timeout_s: float = 60.0) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout_s))


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


def _last_nonce_is(node: Node, nonce: int) -> Callable[[], bool]:
    return lambda: node.nonces()[-1:] == [nonce]


def _both_received(x: Node, y: Node, count: int) -> Callable[[], bool]:
    return lambda: len(x.received) == count and len(y.received) == count


def _linked_only_to_each_other(x: Node, y: Node) -> Callable[[], bool]:
    return lambda: x.transport.connected_peers() == {y.id} and y.transport.connected_peers() == {x.id}


async def health_status(port: int) -> int:
    async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        return int(reply.status)


def test_fifo_of_1000_items_in_both_directions_over_one_stream() -> None:
    async def scenario() -> None:
        a, b = await Node().start(), await Node().start()
        for n in range(1000):
            a.transport.send(b.id, om.PING(n))
            b.transport.send(a.id, om.PONG(n))
            if n % 97 == 0:
                await asyncio.sleep(0)  # let frames go out while more are queued
        await wait_until(
            lambda: len(b.received) == 1000 and len(a.received) == 1000, what="1,000 items each way"
        )
        assert b.nonces(a.id) == list(range(1000))
        assert [item.nonce for _, item in a.received if isinstance(item, om.PONG)] == list(range(1000))
        assert {sender for sender, _ in b.received} == {a.id}  # sender id from the Hello
        assert a.transport.connected_peers() == frozenset({b.id})
        assert b.transport.connected_peers() == frozenset({a.id})
        assert a.transport.stats.items_sent == 1000 and b.transport.stats.items_received == 1000
        assert a.transport.stats.bytes_sent == b.transport.stats.bytes_received > 0
        assert a.transport.queued(b.id) == 0
        await a.transport.stop()
        await b.transport.stop()
        assert a.downs == []  # the stopper reports nothing; b saw a's link end: a is down for b
        assert b.downs == [a.id]

    run(scenario)


def test_batching_under_load_and_single_items_go_out_at_once() -> None:
    async def scenario() -> None:
        config = TransportConfig(max_batch_items=100, connect_timeout_s=2.0)
        a, b = await Node(config).start(), await Node(config).start()
        for n in range(1000):  # all queued before the drain task runs once
            a.transport.send(b.id, om.PING(n))
        assert a.transport.queued(b.id) == 1000
        await wait_until(lambda: len(b.received) == 1000, what="the burst")
        assert b.nonces() == list(range(1000))
        assert a.transport.stats.frames_sent == 10  # full batches of max_batch_items
        assert b.transport.stats.frames_received == 10
        loop = asyncio.get_running_loop()
        for n in range(1000, 1005):  # idle link: each single item leaves immediately, alone
            started = loop.time()
            a.transport.send(b.id, om.PING(n))
            await wait_until(_last_nonce_is(b, n), timeout_s=2.0, what=f"item {n}")
            assert loop.time() - started < 0.5
        assert a.transport.stats.frames_sent == 15
        await a.transport.stop()
        await b.transport.stop()

    run(scenario)


def test_simultaneous_dials_keep_the_stream_of_the_smaller_id_and_lose_nothing() -> None:
    async def scenario() -> None:
        for _round in range(3):
            a, b = await Node().start(), await Node().start()
            for n in range(200):  # both sides dial at once
                a.transport.send(b.id, om.PING(n))
                b.transport.send(a.id, om.PING(n))
            await wait_until(_both_received(a, b, 200), what="both")
            assert a.nonces() == list(range(200)) and b.nonces() == list(range(200))
            smaller = a if a.id < b.id else b
            larger = b if smaller is a else a
            await wait_until(_linked_only_to_each_other(smaller, larger), what="one link")
            assert smaller.transport._peers[larger.id].link.dialed  # type: ignore[union-attr]
            assert not larger.transport._peers[smaller.id].link.dialed  # type: ignore[union-attr]
            assert a.downs == [] and b.downs == []  # a rejected duplicate is not an outage
            await a.transport.stop()
            await b.transport.stop()

    run(scenario)


def test_reconnect_after_the_peer_restarts_on_the_same_port() -> None:
    async def scenario() -> None:
        a, b = await Node().start(), await Node().start()
        b_port = int(b.id.rsplit(":", 1)[1])
        a.transport.send(b.id, om.PING(0))
        await wait_until(lambda: b.nonces() == [0], what="first item")
        await b.transport.stop(drain_timeout_s=0.5)
        await wait_until(lambda: a.downs == [b.id], what="peer-down after the link broke")
        for n in range(1, 51):  # queued while the peer is down
            a.transport.send(b.id, om.PING(n))
        await asyncio.sleep(0.3)  # several failed redials
        assert a.downs == [b.id]  # once per outage
        assert a.transport.queued(b.id) == 50
        assert b.id not in a.transport.connected_peers()
        b2 = await Node().start(b_port)
        assert b2.id == b.id
        await wait_until(lambda: len(b2.received) == 50, what="items queued during the outage")
        assert b2.nonces(a.id) == list(range(1, 51))
        assert a.transport.stats.reconnects == 1
        await b2.transport.stop(drain_timeout_s=0.5)  # second outage: reported again
        await wait_until(lambda: a.downs == [b.id, b.id], what="second peer-down")
        assert a.transport.stats.peer_down_events == 2
        await a.transport.stop(drain_timeout_s=0.2)

    run(scenario)


def test_peer_down_once_on_a_refused_dial_while_redials_continue() -> None:
    async def scenario() -> None:
        a = await Node().start()
        nobody = f"{HOST}:{free_port()}"
        a.transport.send(nobody, om.PING(1))
        a.transport.send(nobody, om.PING(2))
        await wait_until(lambda: a.downs == [nobody], timeout_s=5.0, what="peer-down on a refused dial")
        await asyncio.sleep(0.5)  # backoff 0.02..0.2 s: several more refused dials
        assert a.downs == [nobody]
        assert a.transport.queued(nobody) == 2  # nothing lost while the peer is down
        assert a.transport.connected_peers() == frozenset()
        await a.transport.stop(drain_timeout_s=0.2)
        assert a.transport.stats.items_dropped == 2  # unsent at stop, counted

    run(scenario)


def test_a_full_send_queue_drops_the_oldest_items() -> None:
    async def scenario() -> None:
        config = TransportConfig(
            send_queue_limit=10, reconnect_backoff_initial_s=0.5, reconnect_backoff_max_s=1.0
        )
        a = await Node(config).start()
        port = free_port()
        peer = f"{HOST}:{port}"
        for n in range(25):
            a.transport.send(peer, om.PING(n))
        assert a.transport.queued(peer) == 10
        assert a.transport.stats.items_dropped == 15
        b = await Node(config).start(port)  # the newest ten arrive, in order
        await wait_until(lambda: len(b.received) == 10, what="the surviving items")
        assert b.nonces() == list(range(15, 25))
        await a.transport.stop()
        await b.transport.stop()

    run(scenario)


def test_envelopes_and_overlay_messages_share_the_order() -> None:
    async def scenario() -> None:
        a, b = await Node().start(), await Node(echo=True).start()
        items: list[object] = []
        for n in range(100):
            items.append(om.PING(n) if n % 2 else Envelope(a.id, b.id, "", "", n, 3, RetainedSyncRequest(n)))
        for item in items:
            a.transport.send(b.id, item)
        await wait_until(lambda: len(a.received) == 100, what="echoes")
        assert [item for _, item in a.received] == items
        assert [item for _, item in b.received] == items
        await a.transport.stop()
        await b.transport.stop()

    run(scenario)


def test_send_rejects_bad_items_and_peer_ids_and_loops_back_to_itself() -> None:
    async def scenario() -> None:
        a = await Node().start()
        with pytest.raises(WireError, match=r"PING\.nonce"):
            a.transport.send(f"{HOST}:1", om.PING(-5))
        with pytest.raises(ValueError, match="peer id must be 'host:port'"):
            a.transport.send("no-port", om.PING(1))
        a.transport.send(a.id, om.PING(9))
        await wait_until(lambda: a.received == [(a.id, om.PING(9))], what="loopback")
        await a.transport.stop()
        with pytest.raises(RuntimeError, match="not stopped"):
            a.transport.send(a.id, om.PING(1))

    run(scenario)


async def _raw_open(port: int) -> tuple[grpc.aio.Channel, Any]:
    channel = grpc.aio.insecure_channel(f"{HOST}:{port}")
    call = channel.stream_stream(wire.PEER_LINK_OPEN_METHOD)()
    return channel, call


def test_malformed_frames_and_hellos_from_a_raw_client() -> None:
    async def scenario() -> None:
        b = await Node().start()
        port = int(b.id.rsplit(":", 1)[1])
        # not a Hello first: INVALID_ARGUMENT naming the problem
        channel, call = await _raw_open(port)
        await call.write(wire.encode_frame([om.PING(1)]))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "must hold a Hello" in (info.value.details() or "")
        await channel.close()
        # a newer schema: FAILED_PRECONDITION
        channel, call = await _raw_open(port)
        hello = wire.pb.Frame(hello=wire.pb.Hello(peer_id=f"{HOST}:1", schema_version=99))
        await call.write(hello.SerializeToString())
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        await channel.close()
        # a good Hello, one good frame, then garbage: the good item arrives, the link closes
        raw_peer = f"{HOST}:{free_port()}"
        channel, call = await _raw_open(port)
        await call.write(wire.encode_hello(raw_peer, 8))
        reply = wire.decode_hello(await call.read())
        assert reply.peer_id == b.id and reply.schema_version == wire.SCHEMA_VERSION
        await call.write(wire.encode_frame([om.PING(7)]))
        await wait_until(lambda: b.received == [(raw_peer, om.PING(7))], what="the good item")
        # an item of a newer schema (only an unknown field 99) between two good ones: skipped
        newer = wire.encode_frame_from_items(
            [wire.encode_item(om.PING(8)), b"\x98\x06\x01", wire.encode_item(om.PING(9))]
        )
        await call.write(newer)
        await wait_until(lambda: len(b.received) == 3, what="the items around the unknown one")
        assert [item for _, item in b.received] == [om.PING(7), om.PING(8), om.PING(9)]
        assert b.transport.stats.items_malformed == 1
        await call.write(b"\x12\x09\x0a")  # an item claiming 9 bytes with 1 present
        assert await call.read() is grpc.aio.EOF  # the broker ended the stream
        await wait_until(lambda: raw_peer not in b.transport.connected_peers(), what="link closed")
        assert len(b.received) == 3
        await channel.close()
        await b.transport.stop(drain_timeout_s=0.2)

    run(scenario)


def test_health_service_serving_after_start_and_not_serving_while_stopping() -> None:
    async def scenario() -> None:
        config = TransportConfig(connect_timeout_s=3.0)
        a = await Node(config).start()
        port = int(a.id.rsplit(":", 1)[1])
        assert await health_status(port) == health_pb2.HealthCheckResponse.SERVING
        # a peer that accepts TCP but never speaks: the drain waits on its dial during stop()
        silent = socket.socket()
        silent.bind((HOST, 0))
        silent.listen()
        try:
            a.transport.send(f"{HOST}:{silent.getsockname()[1]}", om.PING(1))
            await asyncio.sleep(0.1)
            stopping = asyncio.create_task(a.transport.stop(drain_timeout_s=1.5))
            await asyncio.sleep(0.2)
            assert not stopping.done()
            assert await health_status(port) == health_pb2.HealthCheckResponse.NOT_SERVING
            loop = asyncio.get_running_loop()
            started = loop.time()
            await stopping
            assert loop.time() - started < 2.5  # bounded by drain_timeout_s
        finally:
            silent.close()

    run(scenario)


def test_a_peer_that_stops_reading_holds_the_drain_task_and_send_only_queues() -> None:
    async def scenario() -> None:
        b = await Node(TransportConfig(max_batch_items=8)).start()
        port = int(b.id.rsplit(":", 1)[1])
        raw_peer = f"{HOST}:{free_port()}"
        channel = grpc.aio.insecure_channel(
            f"{HOST}:{port}", options=[("grpc.max_receive_message_length", -1)]
        )
        call = channel.stream_stream(wire.PEER_LINK_OPEN_METHOD)()
        await call.write(wire.encode_hello(raw_peer, 8))
        assert wire.decode_hello(await call.read()).peer_id == b.id
        await wait_until(lambda: raw_peer in b.transport.connected_peers(), what="the raw link")
        blob = b"x" * 65_536
        count = 400  # 26 MB: far beyond HTTP/2 windows and socket buffers
        for n in range(count):
            b.transport.send(raw_peer, Envelope(b.id, raw_peer, "", "", n, 1, RetainedSyncRequest(n)))
            b.transport.send(
                raw_peer,
                om.PUB(
                    ("t", 1, raw_peer),
                    (("t", 0, b.id), 1),
                    "t",
                    _retained(blob),
                    n,
                    (("t", 0, b.id), 1),
                    1,
                    (),
                    (),
                    0,
                ),
            )
        await asyncio.sleep(1.0)  # the raw peer reads nothing
        stalled_sent = b.transport.stats.items_sent
        assert b.transport.queued(raw_peer) > 0  # send() kept queueing; the write is awaiting the window
        assert stalled_sent < 2 * count
        await asyncio.sleep(0.3)
        assert b.transport.stats.items_sent == stalled_sent  # still held
        received: list[object] = []
        while len(received) < 2 * count:  # now read: everything arrives, in order
            data = await asyncio.wait_for(call.read(), 10.0)
            assert data is not grpc.aio.EOF
            received.extend(wire.decode_frame(data))
        assert [item.ref for item in received[0::2]] == list(range(count))  # type: ignore[attr-defined]
        assert [item.publication_id for item in received[1::2]] == list(range(count))  # type: ignore[attr-defined]
        assert b.transport.queued(raw_peer) == 0
        call.cancel()
        await channel.close()
        await b.transport.stop(drain_timeout_s=0.2)

    run(scenario)


def _retained(payload: bytes) -> RetainedUpdate:
    return RetainedUpdate("x:1", 1, Message("t", payload, retain=True))


def test_binding_a_port_in_use_is_a_clear_error() -> None:
    async def scenario() -> None:
        a = await Node().start()
        port = int(a.id.rsplit(":", 1)[1])
        other = Node()
        with pytest.raises(OSError, match=f"transport cannot bind {HOST}:{port}"):
            await other.start(port)
        await a.transport.stop(drain_timeout_s=0.1)

    run(scenario)


def test_refused_handshakes_are_counted_by_code_and_logged_as_structured_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The accepting side of every refused PeerLink handshake writes a ``cluster_link_refused``
    event (who, the id claimed, the status, why) and counts it per gRPC status code; a stream
    that becomes a link, and the tie-break's ALREADY_EXISTS, are not refusals."""

    async def refused_code(port: int, first: bytes) -> grpc.StatusCode:
        channel, call = await _raw_open(port)
        try:
            await call.write(first)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            return info.value.code()
        finally:
            await channel.close()

    async def scenario() -> None:
        b = await Node().start()
        port = int(b.id.rsplit(":", 1)[1])
        newer = wire.pb.Frame(hello=wire.pb.Hello(peer_id=f"{HOST}:7", schema_version=99))
        assert await refused_code(port, newer.SerializeToString()) == grpc.StatusCode.FAILED_PRECONDITION
        assert await refused_code(port, wire.encode_hello("no-port", 8)) == grpc.StatusCode.INVALID_ARGUMENT
        assert await refused_code(port, wire.encode_frame([om.PING(1)])) == grpc.StatusCode.INVALID_ARGUMENT
        a = await Node().start()  # a real peer links: no refusal
        a.transport.send(b.id, om.PING(1))
        await wait_until(lambda: b.nonces() == [1], what="the real link")
        assert b.transport.refusals == {"FAILED_PRECONDITION": 1, "INVALID_ARGUMENT": 2}
        assert b.transport.stats.links_refused == 3
        await a.transport.stop(drain_timeout_s=0.2)
        await b.transport.stop(drain_timeout_s=0.2)

    with caplog.at_level("WARNING", logger="skipmq.transport"):
        run(scenario)
    events = [record for record in caplog.records if record.getMessage() == "cluster_link_refused"]
    fields = [record.skipmq_fields for record in events]  # type: ignore[attr-defined]
    assert [field["code"] for field in fields] == [
        "FAILED_PRECONDITION",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
    ]
    assert fields[0]["claimed"] == f"{HOST}:7" and "schema version 99" in fields[0]["reason"]
    assert fields[1]["claimed"] == "no-port" and fields[1]["peer"].startswith("ipv4:127.0.0.1:")
    assert "must hold a Hello" in fields[2]["reason"]


def test_frames_leave_from_the_loop_in_one_turn_and_keep_their_order_past_a_frame_that_must_wait() -> None:
    """h2: what is sent in one loop turn leaves as one frame in the next (written by a flush the
    loop runs, link.py ``_flush``); a frame too big for one HTTP/2 DATA frame goes through the
    drain task (split, awaited) and what is sent meanwhile, by either path, stays behind it."""

    async def scenario() -> None:
        a, b = await Node().start(), await Node().start()
        a.transport.send(b.id, om.PING(0))
        await wait_until(_last_nonce_is(b, 0), what="the link")
        frames = a.transport.stats.frames_sent
        for n in range(1, 6):
            a.transport.send(b.id, om.PING(n))
        await asyncio.sleep(0)  # one loop turn: the flush ran, the frame is written
        assert a.transport.stats.frames_sent == frames + 1
        assert a.transport.queued(b.id) == 0
        await wait_until(_last_nonce_is(b, 5), what="the turn's frame")
        ref = (("t", 1, a.id), 5)  # a PUB of a 2 MiB retained message: > SETTINGS_MAX_FRAME_SIZE
        big = om.PUB(ref[0], ref, "t", _retained(b"x" * (2 * 1024 * 1024)), 1, ref, 1, ("t", 1), ("t", 2), 0)
        a.transport.send(b.id, om.PING(6))
        a.transport.send(b.id, big)
        await asyncio.sleep(0)
        for n in range(7, 200):
            a.transport.send(b.id, om.PING(n))
            if n % 10 == 0:
                await asyncio.sleep(0)
        await wait_until(_last_nonce_is(b, 199), what="everything after the big frame")
        kinds = [item.nonce if isinstance(item, om.PING) else "big" for _, item in b.received]
        assert kinds == [*range(7), "big", *range(7, 200)]
        await a.transport.stop()
        await b.transport.stop()

    run(scenario)
