"""An outgoing QoS 2 PUBLISH leaves only once its packet id is durable (MQTT-4.3.3, MQTT-4.4.0-1).

The broker core (``broker.core.broker.Broker``) on the real SQLite store (``Store``), driven by a
deterministic loop of this test's: a persistent publisher streams QoS 2 messages (a window of all
of them) to a persistent QoS 2 subscriber on the same broker, and the broker is killed (``kill -9``:
nothing more runs, the open transaction is rolled back, ``Store.abandon``; what it had written to
a socket still reaches the client, as the kernel sends a dead process's socket buffers) after
``k`` loop events, for every ``k`` of the run. A new broker starts on the same file; both clients
reconnect with their sessions (the publisher re-sends what it holds, MQTT-4.4.0-1).

The subscriber is the receiver of MQTT's Figure 4.3 "Method B": it delivers a message when the
PUBLISH arrives and keeps its packet id until the PUBREL, answering a PUBLISH of an id it holds
with PUBREC only (this is also what SkipMQ's own inbound side does). Such a receiver delivers a
message twice if a broker, after a restart, sends a message it had sent before under another
packet id: it cannot know it is the same message. The broker must therefore never let a QoS 2
PUBLISH out before the commit that records its packet id (``Outbound._send_entry``,
``Durability.write_after_commit``): each message is delivered exactly once, whatever ``k``.

(Clients that deliver at the PUBREL, "Method A" - paho, libmosquitto, MQTT.js, amqtt - do not show
the difference: their second copy waits for a PUBREL that never comes.)
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.adapters.sqlite_store import Store
from broker.auth.from_config import build_access
from broker.config import load_config
from broker.core.broker import Broker
from broker.mqtt import codec
from broker.mqtt.packets import (
    MQTT_5,
    Connack,
    Connect,
    Packet,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
)
from simulation.world import ProcessScheduler, World

LATENCY_S = 0.0005
# delivered and completed before the stream: the subscriber's next packet id is no longer 1, as
# on a broker that has been serving it (a restarted broker starts again at 1)
WARM_UP = [b"w1", b"w2", b"w3"]
STREAM = [b"m1", b"m2", b"m3", b"m4"]
TOPIC = "q2/t"


class Loop(World):
    """The simulation's virtual time and event queue (``simulation.world.World``), one event at a
    time (``step``), for the brokers and the clients.

    A store's background COMMIT (``Store.post``) returns through ``posted``: the loop waits for the
    commit thread and runs its callback as the next event, so that every run replays exactly."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self._posted: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self.store: Store | None = None  # the live broker's store (its COMMIT thread is awaited)
        self._awaited = 0  # the last background COMMIT (generation) whose return was queued

    def post(self, callback: Callable[[], None]) -> None:  # from the commit thread
        with self._lock:
            self._posted.append(callback)

    def _settle_background(self) -> None:
        store = self.store
        if store is None or not store._bg_running or store._bg_generation == self._awaited:
            return
        self._awaited = store._bg_generation
        deadline = time.monotonic() + 10.0
        while True:
            with self._lock:
                posted, self._posted = self._posted, []
            if posted:
                for callback in posted:
                    self.at(self.now, callback)
                return
            assert time.monotonic() < deadline, "the commit thread never returned"
            time.sleep(0.0001)

    def step(self) -> bool:
        """Run the next event (after the commit thread's return, if one is due); False if none."""
        self._settle_background()
        queue = self._queue
        while queue:
            when, _seq, handle, callback, args = heapq.heappop(queue)
            if handle.cancelled:
                continue
            self.now = when
            self.events += 1
            callback(*args)
            return True
        return False

    def run_until(self, end_s: float, *, stop_after: int | None = None) -> bool:  # type: ignore[override]
        """Run events up to virtual time ``end_s``; False if it stopped after ``stop_after`` events."""
        while True:
            self._settle_background()
            if not self._queue or self._queue[0][0] > end_s:
                break
            if stop_after is not None and self.events >= stop_after:
                return False
            self.step()
        self.now = max(self.now, end_s)
        return True


class BrokerProcess:
    """One incarnation of a broker on the database file ``path``."""

    def __init__(self, loop: Loop, path: Path, commits: str) -> None:
        self.loop = loop
        self.scheduler = ProcessScheduler(loop)  # simulation.world's: nothing runs after kill()
        config = load_config(None, env={}, overrides={"sys.interval_s": 0, "uvloop": False})
        self.store = Store(str(path))
        if commits == "thread":  # a single broker's process: the COMMIT on the store's thread
            self.store.post = loop.post
            self.store.background_commits = "always"
        loop.store = self.store
        authenticator, acl = build_access(config.auth)
        self.broker = Broker(config, self.scheduler, authenticator=authenticator, acl=acl, store=self.store)
        self.broker.durability.lazy_commit_s = 0.005  # as broker.adapters.server sets it
        self.broker.start()
        self.sockets: list[Socket] = []

    def kill(self) -> None:
        self.scheduler.kill()
        self.store.abandon()  # no COMMIT: SQLite rolls the open transaction back
        for sock in self.sockets:
            sock.reset()


class Socket:
    """A TCP connection: bytes each way after ``LATENCY_S``; a killed broker's written bytes still
    arrive (the kernel sends them), then the client sees the connection end."""

    def __init__(self, loop: Loop, process: BrokerProcess, client: Client) -> None:
        self.loop = loop
        self.process = process
        self.client = client
        self.open = True
        process.sockets.append(self)
        self.conn = process.broker.new_client(self, "tcp", peer=f"sim:{client.client_id}")
        assert self.conn is not None

    # the broker's side (ClientTransport)
    def write(self, data: bytes) -> None:
        if self.open:
            self.loop.at(self.loop.now + LATENCY_S, self.client.received, self, data)

    def close(self) -> None:
        if self.open:
            self.open = False
            self.process.scheduler.call_soon(self.conn.lost)  # type: ignore[union-attr]
            self.loop.at(self.loop.now + LATENCY_S, self.client.lost, self)

    def is_closing(self) -> bool:
        return not self.open

    def get_write_buffer_size(self) -> int:
        return 0

    # the client's side
    def send(self, data: bytes) -> None:
        if self.open:
            self.loop.at(self.loop.now + LATENCY_S, self._to_broker, data)

    def _to_broker(self, data: bytes) -> None:
        if self.open and self.process.scheduler.alive:
            self.conn.receive(data)  # type: ignore[union-attr]

    def reset(self) -> None:
        if self.open:
            self.open = False
            self.loop.at(self.loop.now + LATENCY_S, self.client.lost, self)


class Client:
    """An MQTT 5 client with a persistent session (clean start 0, session expiry 300 s)."""

    def __init__(self, loop: Loop, client_id: str) -> None:
        self.loop = loop
        self.client_id = client_id
        self.sock: Socket | None = None
        self.decoder = codec.Decoder(role="client", protocol_level=MQTT_5)
        self.connected = False

    def connect(self, process: BrokerProcess) -> None:
        self.decoder = codec.Decoder(role="client", protocol_level=MQTT_5)
        self.sock = Socket(self.loop, process, self)
        self.send(
            Connect(
                client_id=self.client_id,
                protocol_level=MQTT_5,
                clean_start=False,
                properties={"session_expiry_interval": 300},
            )
        )

    def send(self, packet: Packet) -> None:
        assert self.sock is not None
        self.sock.send(codec.encode(packet, MQTT_5))

    def received(self, sock: Socket, data: bytes) -> None:
        if sock is not self.sock:
            return
        for packet in self.decoder.feed(data):
            if isinstance(packet, Connack):
                assert packet.reason_code == 0
                self.connected = True
            self.handle(packet)

    def lost(self, sock: Socket) -> None:
        if sock is self.sock:
            self.connected = False
            self.sock = None

    def handle(self, packet: Packet) -> None:
        raise NotImplementedError


class MethodBSubscriber(Client):
    """Delivers at the PUBLISH, keeps the packet id until the PUBREL (MQTT Figure 4.3, Method B)."""

    def __init__(self, loop: Loop, client_id: str) -> None:
        super().__init__(loop, client_id)
        self.held: set[int] = set()
        self.delivered: list[bytes] = []
        self.subscribed = False

    def handle(self, packet: Packet) -> None:
        if isinstance(packet, Connack):
            if not packet.session_present:
                self.held.clear()  # MQTT-4.1.0-1: a new session
                self.send(Subscribe(1, [Subscription(TOPIC, 2)]))
        elif isinstance(packet, Suback):
            assert packet.reason_codes == [2]
            self.subscribed = True
        elif isinstance(packet, Publish):
            assert packet.qos == 2 and packet.packet_id is not None
            if packet.packet_id not in self.held:
                self.held.add(packet.packet_id)
                self.delivered.append(packet.payload)
            self.send(Pubrec(packet.packet_id))
        elif isinstance(packet, Pubrel):
            self.held.discard(packet.packet_id)
            self.send(Pubcomp(packet.packet_id))


class Publisher(Client):
    """Publishes every message at once at QoS 2; on a reconnect re-sends (DUP=1) what got no
    PUBREC and the PUBRELs of what got no PUBCOMP (MQTT-4.4.0-1)."""

    def __init__(self, loop: Loop, client_id: str) -> None:
        super().__init__(loop, client_id)
        self.unrecorded: dict[int, bytes] = {}  # sent, no PUBREC yet
        self.released: set[int] = set()  # PUBREL sent, no PUBCOMP yet
        self.completed: list[int] = []
        self.started = False

    def publish(self, payloads: list[bytes]) -> None:
        for payload in payloads:
            packet_id = len(self.completed) + len(self.unrecorded) + len(self.released) + 1
            self.unrecorded[packet_id] = payload
            self.send(Publish(TOPIC, payload, 2, packet_id=packet_id))

    def handle(self, packet: Packet) -> None:
        if isinstance(packet, Connack):
            if not self.started:
                self.started = True
                self.publish(WARM_UP)
                return
            if not packet.session_present:
                # killed before its session was committed: then no PUBREC can have left either
                assert not self.released and len(self.unrecorded) == len(STREAM)
            for packet_id, payload in self.unrecorded.items():
                self.send(Publish(TOPIC, payload, 2, dup=packet.session_present, packet_id=packet_id))
            for packet_id in sorted(self.released):
                self.send(Pubrel(packet_id))
        elif isinstance(packet, Pubrec):
            assert packet.reason_code < 0x80, packet
            self.unrecorded.pop(packet.packet_id, None)
            self.released.add(packet.packet_id)
            self.send(Pubrel(packet.packet_id))
        elif isinstance(packet, Pubcomp) and packet.packet_id in self.released:
            self.released.discard(packet.packet_id)
            self.completed.append(packet.packet_id)


def run(tmp_path: Path, commits: str, crash_after: int | None) -> tuple[MethodBSubscriber, Publisher, int]:
    """The scenario with a kill -9 ``crash_after`` loop events into the stream (None: no crash);
    returns the clients and the events the stream took before the crash (all of them without one)."""
    loop = Loop()
    path = tmp_path / f"skipmq-{commits}-{crash_after}.db"
    process = BrokerProcess(loop, path, commits)
    sub, pub = MethodBSubscriber(loop, "sub"), Publisher(loop, "pub")
    sub.connect(process)
    assert loop.run_until(0.05) and sub.subscribed
    pub.connect(process)
    loop.run_until(0.1)
    assert sub.delivered == WARM_UP and len(pub.completed) == len(WARM_UP)
    start = loop.events
    pub.publish(STREAM)
    finished = loop.run_until(1.0, stop_after=None if crash_after is None else start + crash_after)
    events = loop.events - start
    if not finished:
        process.kill()
        loop.store = None
        loop.run_until(loop.now + 0.01)  # what was written arrives; the clients see the reset
        process = BrokerProcess(loop, path, commits)
        sub.connect(process)
        pub.connect(process)
        loop.run_until(loop.now + 1.0)
    assert sub.connected and pub.connected
    process.kill()  # the end (a kill -9 leaves no threads behind; its writes are done)
    return sub, pub, events


@pytest.mark.parametrize("commits", ["loop", "thread"])
def test_each_qos2_message_is_delivered_once_whenever_the_broker_is_killed(
    tmp_path: Path, commits: str
) -> None:
    sub, pub, total = run(tmp_path, commits, None)
    assert sub.delivered[len(WARM_UP) :] == STREAM and len(pub.completed) == len(WARM_UP) + len(STREAM)
    twice: dict[int, list[bytes]] = {}
    for crash_after in range(total + 1):
        sub, pub, _ = run(tmp_path, commits, crash_after)
        stream = sub.delivered[len(WARM_UP) :]
        assert sorted(set(stream)) == STREAM, f"lost with a kill after {crash_after} events: {stream}"
        assert len(pub.completed) == len(WARM_UP) + len(STREAM)
        if len(stream) != len(STREAM):
            twice[crash_after] = stream
    assert not twice, f"delivered twice (kill after k events of the stream: what it got): {twice}"
