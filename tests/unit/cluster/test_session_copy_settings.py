"""A persistent session's SUBACK and UNSUBACK with ``cluster.replicas`` = 2 under every durability
setting (docs/cluster.md, Replicas): the broker core (``broker.core.broker.Broker``) on the real
SQLite store (``Store``), observed by the replication as in a broker process
(``broker.adapters.replication.observe_session_writes``), its cluster port the real
``ReplicatedClusterPort``, and a replica holder (``EngineReplication``) behind a scripted link; one
deterministic loop (the simulation's virtual time) drives them and an MQTT 5 client of raw packets.

The SUBACK waits for the session's state *as the SUBSCRIBE's commit made it*: a commit that gave
the replication nothing new would leave it waiting for an older state (early: without the
subscription) or for nothing (the whole ``cluster.subscribe_wait_ms``). Settings: SQLite
``synchronous`` normal / full, ``checkpoint`` inline / background, the COMMIT on the loop (a
cluster broker) or on the store's commit thread (``Store.post``: a stand-alone broker's; its
background COMMIT does not pass through ``Store.commit``), lazy commits off / 5 ms. In each:

* SUBSCRIBE -> the SUBACK leaves once the holder has the state with the subscription, well inside
  the bound; an identical SUBSCRIBE again (no new state) -> the SUBACK at once, no wait;
* UNSUBSCRIBE -> the UNSUBACK leaves once the holder has the state without it (before, the UNSUBACK
  did not wait: the holder's copy still had the subscription, and a disk loss of the home gave the
  client a session with what it had unsubscribed from);
* a holder that does not answer -> the SUBACK after ``subscribe_wait_ms``, counted
  (``acks_uncopied["timed_out"]``, ``skipmq_cluster_replication_session_acks_uncopied_total``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.adapters.replication import observe_session_writes
from broker.adapters.sqlite_store import Store
from broker.auth.from_config import build_access
from broker.cluster.engine_replication import EngineReplication, ReplicatedClusterPort
from broker.config import load_config
from broker.config.schema import ClusterConfig
from broker.core.broker import Broker
from broker.core.messages import SessionSnapshot
from broker.mqtt import codec
from broker.mqtt.packets import (
    MQTT_5,
    Connack,
    Connect,
    Packet,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
)
from simulation.world import ProcessScheduler
from tests.unit.cluster.test_engine_replication import _Engine, _Store
from tests.unit.cluster.test_engine_replication_sessions import _SessionBroker
from tests.unit.core.test_qos2_outbound_durable import Loop

LINK_S = 0.001  # one way between the brokers
CLIENT_S = 0.0005  # one way between the client and its broker
WAIT_S = ClusterConfig().subscribe_wait_ms / 1000.0  # the default


class _Link:
    """The cluster link of one broker: items reach the other side after ``LINK_S`` (none while
    ``cut``)."""

    def __init__(self, loop: Loop, peer_id: str) -> None:
        self.loop = loop
        self.peer_id = peer_id
        self.other: EngineReplication | None = None
        self.cut = False

    def send(self, peer: str, item: object) -> None:
        if not self.cut and self.other is not None:
            self.loop.after(LINK_S, self._arrive, item)

    def _arrive(self, item: object) -> None:
        if not self.cut and self.other is not None:
            self.other.on_receive(self.peer_id, item)

    def connected_peers(self) -> frozenset[str]:
        return frozenset()


class _ClusterEngine(_Engine):
    """What the replication and its port read of the cluster engine (the overlay is not in this
    test: every class counts as joined)."""

    def __init__(self, loop: Loop, peer_id: str) -> None:
        super().__init__(peer_id, ProcessScheduler(loop))  # type: ignore[arg-type]
        self.transport = _Link(loop, peer_id)  # type: ignore[assignment]
        self.broker = _SessionBroker(self.events)
        self.takeover = None
        self.stopped = False
        self._moved_positions: dict[str, Any] = {}

    def _receiver_actions(self, actions: list[Any]) -> None:
        return None

    def subscriptions_ready(self, topic_filters: list[tuple[str, str | None]]) -> None:
        return None

    def before_attach(self, client_id: str, clean_start: bool, username: str | None = None) -> None:
        return None

    def on_subscribe(self, *args: Any) -> None:
        return None

    def on_unsubscribe(self, *args: Any) -> None:
        return None

    def on_client_connected(self, *args: Any) -> None:
        return None

    def on_client_disconnected(self, *args: Any) -> None:
        return None


class _Client:
    """An MQTT 5 client with a persistent session; ``at[kind]`` is when each answer arrived."""

    def __init__(self, loop: Loop, broker: Broker) -> None:
        self.loop = loop
        self.decoder = codec.Decoder(role="client", protocol_level=MQTT_5)
        self.conn = broker.new_client(self, "tcp", peer="test:dev")
        self.open = True
        self.answers: list[tuple[float, Packet]] = []

    # the broker's side (ClientTransport)
    def write(self, data: bytes) -> None:
        self.loop.after(CLIENT_S, self._received, data)

    def close(self) -> None:
        self.open = False

    def is_closing(self) -> bool:
        return not self.open

    def get_write_buffer_size(self) -> int:
        return 0

    # the client's side
    def send(self, packet: Packet) -> None:
        data = codec.encode(packet, MQTT_5)
        self.loop.after(CLIENT_S, self.conn.receive, data)  # type: ignore[union-attr]

    def _received(self, data: bytes) -> None:
        for packet in self.decoder.feed(data):
            self.answers.append((self.loop.now, packet))

    def ask(self, packet: Packet, answer: type, within_s: float) -> float:
        """Send ``packet``, run until its ``answer`` arrives; the seconds it took."""
        sent_at, seen = self.loop.now, len(self.answers)
        self.send(packet)
        deadline = sent_at + within_s
        while not any(type(p) is answer for _at, p in self.answers[seen:]):
            assert self.loop.now < deadline and self.loop.step(), f"no {answer.__name__} within {within_s} s"
        at = next(at for at, p in self.answers[seen:] if type(p) is answer)
        return at - sent_at


class _Cluster:
    def __init__(
        self, tmp_path: Path, *, synchronous: str, checkpoint: str, commits: str, lazy_s: float
    ) -> None:
        self.loop = loop = Loop()
        self.home_engine = _ClusterEngine(loop, "a:1")
        self.holder_engine = _ClusterEngine(loop, "b:1")
        self.home = EngineReplication(self.home_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
        self.holder = EngineReplication(self.holder_engine, started_empty=False, failover_after_s=30.0)  # type: ignore[arg-type]
        self.home_engine.transport.other = self.holder  # type: ignore[attr-defined]
        self.holder_engine.transport.other = self.home  # type: ignore[attr-defined]
        self.holder.store = _Store(self.holder_engine.broker)
        self.store = Store(str(tmp_path / "skipmq.db"), synchronous=synchronous, checkpoint=checkpoint)
        if commits == "thread":  # the COMMIT on the store's thread (a stand-alone broker's)
            self.store.post = loop.post
            self.store.background_commits = "always"
            loop.store = self.store
        config = load_config(None, env={}, overrides={"sys.interval_s": 0, "cluster.replicas": 2})
        authenticator, acl = build_access(config.auth)
        port = ReplicatedClusterPort(self.home_engine, self.home)  # type: ignore[arg-type]
        self.broker = Broker(
            config,
            self.home_engine.scheduler,  # type: ignore[arg-type]
            authenticator=authenticator,
            acl=acl,
            store=self.store,
            cluster=port,  # type: ignore[arg-type]
        )
        self.broker.durability.lazy_commit_s = lazy_s
        self.broker.start()
        self.home_engine.broker = self.broker  # type: ignore[assignment]
        self.home.store = _Store(self.holder_engine.broker)  # (it holds nothing in this test)
        observe_session_writes(self.store, self.home)
        self.home.gate_acks()
        self.home.start(["b:1"])
        self.holder.start(["a:1"])
        loop.run_until(0.05)  # the hellos

    def held_filters(self) -> list[str] | None:
        """The subscriptions of the holder's copy of ``dev`` (None: no copy)."""
        copies: list[SessionSnapshot] = [
            snapshot for _key, snapshot, _positions in self.holder.store.load_sessions()
        ]
        if not copies:
            return None
        (copy,) = copies
        return sorted(sub.topic_filter for sub in copy.subscriptions)

    def close(self) -> None:
        self.loop.store = None
        self.store.abandon()


SETTINGS = [
    pytest.param("normal", "inline", "loop", 0.0, id="cluster-broker"),
    pytest.param("full", "background", "loop", 0.0, id="full-background-checkpoint"),
    pytest.param("normal", "inline", "loop", 0.005, id="lazy"),
    pytest.param("normal", "background", "thread", 0.005, id="commit-thread-lazy"),
    pytest.param("full", "inline", "thread", 0.0, id="full-commit-thread"),
]


@pytest.mark.parametrize(("synchronous", "checkpoint", "commits", "lazy_s"), SETTINGS)
def test_suback_and_unsuback_wait_for_the_state_they_acknowledge_on_n_brokers(
    tmp_path: Path, synchronous: str, checkpoint: str, commits: str, lazy_s: float
) -> None:
    cluster = _Cluster(
        tmp_path, synchronous=synchronous, checkpoint=checkpoint, commits=commits, lazy_s=lazy_s
    )
    try:
        home, loop = cluster.home, cluster.loop
        client = _Client(loop, cluster.broker)
        connect = Connect(
            client_id="dev",
            protocol_level=MQTT_5,
            clean_start=False,
            properties={"session_expiry_interval": 300},
        )
        client.ask(connect, Connack, WAIT_S)
        loop.run_until(loop.now + 0.5)  # the session's first copy (the flush), no SUBACK involved
        waits = home.copy_waits_total

        took = client.ask(Subscribe(1, [Subscription("t/#", 1)]), Suback, WAIT_S)
        assert cluster.held_filters() == ["t/#"], "the SUBACK left before the holder had the subscription"
        assert home.copy_waits_total == waits + 1 and took < WAIT_S / 10, took
        # the same subscription again: nothing new to copy, no wait
        took = client.ask(Subscribe(2, [Subscription("t/#", 1)]), Suback, WAIT_S)
        assert home.copy_waits_total == waits + 1 and took < 4 * CLIENT_S, took

        took = client.ask(Unsubscribe(3, ["t/#"]), Unsuback, WAIT_S)
        assert cluster.held_filters() == [], (
            "the UNSUBACK left before the holder's copy lost the subscription"
        )
        assert home.copy_waits_total == waits + 2 and took < WAIT_S / 10, took
        # nothing to unsubscribe: no new state, no wait (reason code 0x11)
        client.ask(Unsubscribe(4, ["t/#"]), Unsuback, WAIT_S)
        assert home.copy_waits_total == waits + 2
        assert home.acks_uncopied == {"timed_out": 0, "fewer_than_n_live": 0, "stopping": 0}

        # a holder that does not answer (and is not reported down): the SUBACK after the bound
        cluster.home_engine.transport.cut = True  # type: ignore[attr-defined]
        took = client.ask(Subscribe(5, [Subscription("a/#", 1)]), Suback, 2 * WAIT_S)
        assert WAIT_S <= took < WAIT_S + 0.1, took
        assert home.acks_uncopied["timed_out"] == 1 and home.suback_waits_timed_out == 1
        assert cluster.held_filters() == []
    finally:
        cluster.close()
