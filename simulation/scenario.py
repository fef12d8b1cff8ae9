"""Scenarios of the whole-cluster simulation: brokers, clients, faults, and the run that checks them.

A :class:`Run` is one seeded world: N :class:`~simulation.process.SimBroker` processes joined into
one cluster on a :class:`~simulation.network.Network`, :class:`~simulation.clients.SimClient`
subscribers (persistent sessions, QoS 1) and publishers (numbered QoS 1 messages, some retained on a
topic every publisher writes), and faults at seeded times: broker crashes (``kill -9``) with restart
on the same data directory, network partitions and heals, sessions moving to another broker.
After the last publish the run goes quiet long enough for every retry and timeout to play out, then
``simulation.checkers`` look at what the clients saw. Everything random comes from the seed.

:func:`random_scenario` draws a scenario from a seed (what the sweep runs); the ``known_*``
functions script the three faults the issue "Broker architecture" asks the simulation to reproduce
(they are fixed by the reliable-delivery issue, not here).

Size: the scenario data, its seeded drawing and the run that plays it share one set of fields
(brokers, clients, faults, timings); split, each part would re-import the others' internals.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

from simulation.checkers import History, Violation, check_all
from simulation.clients import SimClient
from simulation.network import Network, NetworkConfig, NetworkStats
from simulation.process import SimBroker
from simulation.world import SimulationFailure, World

FAULTS = ("crash", "partition", "long-partition", "move")
# a partition of the sweeps lasts 1-5 s: below the network's ``partition_notice_s`` (10 s), so
# nobody is declared down. A long one (``long-partition``) outlasts it: the peer-down path runs
# (links cut, peers probed, claims, interest and send logs re-sent when they are back).
SHORT_PARTITION_S = (1.0, 5.0)
LONG_PARTITION_S = (12.0, 40.0)
RETAINED_TOPIC = "cfg/shared"


@dataclass(frozen=True)
class Scenario:
    brokers: int = 3
    publishers: int = 2
    subscribers: int = 3
    messages: int = 20  # per publisher
    publish_interval_s: float = 0.05
    network: NetworkConfig = field(default_factory=NetworkConfig)
    crashes: int = 0
    partitions: int = 0
    partition_s: tuple[float, float] = SHORT_PARTITION_S  # how long a partition lasts (virtual s)
    moves: int = 0
    join_s: float = 2.0  # brokers join, then subscribers connect
    settle_s: float = 4.0  # subscriptions settle, then publishers start
    quiet_s: float = 15.0  # after the last publish, before the checkers look
    topics: tuple[str, ...] = ("plant/a/temp", "plant/b/temp", "plant/b/load")
    filters: tuple[str, ...] = ("plant/#", "plant/a/temp", "plant/+/temp", "plant/b/#")
    settings: tuple[tuple[str, Any], ...] = ()
    title: str = ""  # a scripted scenario's name (its script, not the random one, runs)
    # each subscriber's drain rate (messages/s, ``SimClient(drain_per_s=)``; empty: it takes every
    # message at once): ``random_scenario(finite_clients=True)``
    drain_per_s: tuple[float, ...] = ()

    def describe(self) -> str:
        if self.title:
            return f"{self.title} ({self.brokers} brokers, scripted)"
        net = self.network
        return (
            f"{self.brokers} brokers, {self.publishers} pub x {self.messages} msgs, {self.subscribers} subs; "
            f"loss {net.loss_rate:.0%} dup {net.duplicate_rate:.0%} reorder {net.reorder_rate:.0%}; "
            f"crashes {self.crashes} partitions {self.partitions}"
            + (f" ({self.partition_s[0]:g}-{self.partition_s[1]:g} s)" if self.partitions else "")
            + f" moves {self.moves}"
            + (
                f"; {1 / self.publish_interval_s:.0f} msg/s per publisher, subscribers drain "
                + "/".join(f"{rate:.0f}" for rate in self.drain_per_s)
                + " msg/s"
                if self.drain_per_s
                else ""
            )
        )


def random_scenario(
    seed: int,
    *,
    brokers: tuple[int, int] = (3, 5),
    loss: float = 0.0,
    duplicate: float = 0.05,
    reorder: float = 0.05,
    faults: frozenset[str] = frozenset(),
    finite_clients: bool = False,
) -> Scenario:
    """The scenario of ``seed``: sizes, network fault rates and fault counts drawn from it.
    ``finite_clients``: a stream that matters to the default queue limit (1,000) - each publisher
    sends 200-600 messages at 125-500 msg/s - and subscribers that drain at a finite rate, 1.5-4
    times the publishers' total rate (faster than the live stream: a subscriber slower than that
    drops by its queue policy, as on one broker, which is not a cluster loss). Drawn after
    everything else, so the rest of the seed's scenario is the same with or without."""
    rng = random.Random(f"scenario/{seed}")
    network = NetworkConfig(
        latency_s=rng.uniform(0.0005, 0.005),
        jitter_s=rng.uniform(0.0, 0.002),
        loss_rate=loss * rng.random(),
        duplicate_rate=duplicate * rng.random(),
        reorder_rate=reorder * rng.random(),
        reorder_delay_s=0.02,
    )
    long_partition = "long-partition" in faults
    scenario = Scenario(
        brokers=rng.randint(*brokers),
        publishers=rng.randint(1, 3),
        subscribers=rng.randint(1, 4),
        messages=rng.randint(10, 30),
        network=network,
        crashes=rng.randint(1, 2) if "crash" in faults else 0,
        partitions=1 if "partition" in faults or long_partition else 0,
        moves=rng.randint(1, 2) if "move" in faults else 0,
    )
    if long_partition:
        # the heal comes before the end's forced heal (at half the quiet time), with the usual
        # 15 s of quiet still after it for the peers declared down to come back and catch up
        longest = LONG_PARTITION_S[1]
        scenario = replace(scenario, partition_s=LONG_PARTITION_S, quiet_s=2 * (longest + 15.0))
    if finite_clients:
        interval_s = rng.uniform(0.002, 0.008)
        total_per_s = scenario.publishers / interval_s
        scenario = replace(
            scenario,
            messages=rng.randint(200, 600),
            publish_interval_s=interval_s,
            drain_per_s=tuple(rng.uniform(1.5, 4.0) * total_per_s for _ in range(scenario.subscribers)),
        )
    return scenario


@dataclass
class Result:
    seed: int
    scenario: Scenario
    violations: list[Violation]
    digest: str
    events: int
    history: History
    replay: str = ""  # the command that replays this run
    network: NetworkStats | None = None  # what the network did to the brokers' items

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def duplicates(self) -> int:
        """Receipts beyond the first of one message by one subscriber (QoS 1 allows them)."""
        received = self.history.received
        return len(received) - len({(r.subscriber, r.publisher, r.epoch, r.seq) for r in received})

    def report(self, trace_lines: int = 40) -> str:
        lines = [f"seed {self.seed}: {self.scenario.describe()}"]
        lines += [f"  {v.kind}: {v.detail}" for v in self.violations[:20]]
        if len(self.violations) > 20:
            lines.append(f"  ... and {len(self.violations) - 20} more")
        if self.violations and trace_lines:
            lines.append(f"  last {trace_lines} client events (virtual s, event, ...):")
            lines += [f"    {event}" for event in self.history.events[-trace_lines:]]
        replay = self.replay or "python -m simulation --known"
        lines.append(f"  replay: {replay} (digest {self.digest})")
        return "\n".join(lines)


class Run:
    """One seeded simulation. Build it, script it (or call :meth:`script_random`), :meth:`finish`."""

    def __init__(self, seed: int, scenario: Scenario, workdir: str | None = None) -> None:
        self.seed = seed
        self.scenario = scenario
        self.world = World(seed)
        self.rng = self.world.rng_for("scenario")
        self.network = Network(self.world, scenario.network)
        self.history = History(clock=lambda: self.world.now)
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix=f"skipmq-sim-{seed}-")
        self.peer_ids = [f"10.0.0.{index + 1}:7883" for index in range(scenario.brokers)]
        self.brokers: dict[str, SimBroker] = {}
        self._incarnations: dict[str, int] = {}
        self.clients: dict[str, SimClient] = {}
        self.home: dict[str, str] = {}  # client id -> the broker it (re)connects to
        self.last_publish_s = scenario.settle_s

    # ------------------------------------------------------------------ brokers
    def start_broker(self, peer_id: str) -> SimBroker:
        incarnation = self._incarnations.get(peer_id, 0) + 1
        self._incarnations[peer_id] = incarnation
        sim = self.new_broker(peer_id, incarnation)
        contacts = [p for p, b in self.brokers.items() if b.alive and p != peer_id]
        self.brokers[peer_id] = sim
        sim.start(contacts)
        self.history.trace("broker_start", peer_id, incarnation)
        return sim

    def data_dir(self, peer_id: str) -> str:
        return os.path.join(self.workdir, peer_id.replace(":", "_"))

    def new_broker(self, peer_id: str, incarnation: int) -> SimBroker:
        """The process of ``peer_id``'s ``incarnation`` (a subclass may build another kind:
        ``simulation.replication``)."""
        return SimBroker(
            self.world,
            self.network,
            peer_id,
            self.data_dir(peer_id),
            incarnation=incarnation,
            settings=dict(self.scenario.settings),
            clock_offset_s=self.rng.uniform(-0.05, 0.05),
        )

    def start_brokers(self, step_s: float = 0.2) -> None:
        """Start the brokers at virtual times 0, ``step_s``, 2 ``step_s``... (each joins through those up)."""
        for index, peer_id in enumerate(self.peer_ids):
            self.world.at(step_s * index, self.start_broker, peer_id)

    def crash(self, peer_id: str) -> None:
        sim = self.brokers[peer_id]
        if sim.alive:
            self.history.trace("crash", peer_id)
            sim.crash()

    def restart(self, peer_id: str) -> None:
        if not self.brokers[peer_id].alive:
            self.start_broker(peer_id)

    def partition(self, group: list[str]) -> None:
        self.history.trace("partition", tuple(group))
        self.network.partition([group])

    def heal(self) -> None:
        self.history.trace("heal")
        self.network.heal()

    # ------------------------------------------------------------------ clients
    def add_client(self, client_id: str, home: str, *, persistent: bool) -> SimClient:
        client = SimClient(self.world, self.history, client_id, clean_start=not persistent)
        client.on_lost = self._reconnect_later
        self.clients[client_id] = client
        self.home[client_id] = home
        return client

    def connect(self, client_id: str, broker: str | None = None) -> None:
        client = self.clients[client_id]
        if broker is not None:
            self.home[client_id] = broker
        target = self.brokers.get(self.home[client_id])
        if target is None or not target.alive or not client.connect(target):
            self._reconnect_later(client)

    def _reconnect_later(self, client: SimClient) -> None:
        self.world.after(0.5, self._reconnect, client.client_id)

    def _reconnect(self, client_id: str) -> None:
        client = self.clients[client_id]
        if client.socket is not None:
            return
        if not client.clean_start:
            self.connect(client_id)  # a persistent session waits for its broker
            return
        live = [p for p in self.peer_ids if p in self.brokers and self.brokers[p].alive]
        if live:
            self.connect(client_id, self.rng.choice(live))

    def publish_stream(
        self, client_id: str, count: int, interval_s: float, start_s: float, topic: str | None = None
    ) -> None:
        """``count`` QoS 1 publishes from ``start_s`` on: on ``topic``, or on the scenario's topics
        with every seventh one retained on the topic every publisher writes."""
        client = self.clients[client_id]
        topics = self.scenario.topics
        for index in range(count):
            at = start_s + index * interval_s
            retain = topic is None and index % 7 == 3
            if topic is not None:
                chosen = topic
            else:
                chosen = RETAINED_TOPIC if retain else topics[self.rng.randrange(len(topics))]
            self.world.at(at, client.publish, chosen, retain)
            self.last_publish_s = max(self.last_publish_s, at)

    # ------------------------------------------------------------------ the random script
    def script_random(self) -> None:
        scenario = self.scenario
        rng = self.rng
        world = self.world
        for index, peer_id in enumerate(self.peer_ids):
            world.at(0.2 * index, self.start_broker, peer_id)
        for index in range(scenario.subscribers):
            client_id = f"sub{index}"
            client = self.add_client(client_id, rng.choice(self.peer_ids), persistent=True)
            if scenario.drain_per_s:
                client.drain_per_s = scenario.drain_per_s[index]
            topic_filter = rng.choice(scenario.filters)
            self.clients[client_id].on_connack = _subscribe_once(topic_filter)
            world.at(scenario.join_s + 0.05 * index, self.connect, client_id)
        for index in range(scenario.publishers):
            client_id = f"pub{index}"
            self.add_client(client_id, rng.choice(self.peer_ids), persistent=False)
            world.at(scenario.settle_s - 0.5, self.connect, client_id)
            self.publish_stream(client_id, scenario.messages, scenario.publish_interval_s, scenario.settle_s)
        window = (scenario.settle_s, max(self.last_publish_s, scenario.settle_s + 1.0))
        for _ in range(scenario.crashes):
            peer_id = rng.choice(self.peer_ids)
            at = rng.uniform(*window)
            world.at(at, self.crash, peer_id)
            world.at(at + rng.uniform(0.5, 3.0), self.restart, peer_id)
        for _ in range(scenario.partitions):
            group = rng.sample(self.peer_ids, max(1, len(self.peer_ids) // 2))
            at = rng.uniform(*window)
            world.at(at, self.partition, group)
            world.at(at + rng.uniform(*scenario.partition_s), self.heal)
        for _ in range(scenario.moves):
            subscriber = f"sub{rng.randrange(scenario.subscribers)}"
            world.at(rng.uniform(*window), self._move, subscriber)

    def _move(self, client_id: str) -> None:
        client = self.clients[client_id]
        others = [p for p in self.peer_ids if p != self.home[client_id]]
        client.disconnect()
        self.world.after(0.05, self.connect, client_id, self.rng.choice(others))

    # ------------------------------------------------------------------ the end
    def finish(self, *, end_s: float | None = None) -> Result:
        end = end_s if end_s is not None else self.last_publish_s + self.scenario.quiet_s
        for peer_id in self.peer_ids:  # every broker is up for the end state
            self.world.at(end - self.scenario.quiet_s / 2, self.restart, peer_id)
        self.world.at(end - self.scenario.quiet_s / 2, self.heal)
        try:
            self.world.run_until(end)
            live = {p: b for p, b in self.brokers.items() if b.alive}
            connected = {cid: [p for p, b in live.items() if b.connected(cid)] for cid in self.clients}
            retained = {p: b.retained() for p, b in live.items()}
            violations = check_all(self.history, connected, retained)
        except SimulationFailure as exc:
            violations = [Violation("stuck", str(exc))]
        finally:
            for sim in self.brokers.values():
                if sim.alive:
                    sim.crash()  # releases the SQLite file; the run is over
            if self._own_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
        return Result(
            self.seed,
            self.scenario,
            violations,
            self.history.digest(),
            self.world.events,
            self.history,
            network=self.network.stats,
        )


def _subscribe_once(topic_filter: str) -> Any:
    def on_connack(client: SimClient, session_present: bool) -> None:
        if not session_present:
            client.subscribe(topic_filter)

    return on_connack


def run_seed(seed: int, scenario: Scenario | None = None, **random_options: Any) -> Result:
    """Run the random script of ``seed`` (its own scenario unless one is given)."""
    run = Run(seed, scenario if scenario is not None else random_scenario(seed, **random_options))
    run.script_random()
    result = run.finish()
    result.replay = replay_command(seed, **random_options)
    return result


def replay_command(seed: int, **options: Any) -> str:
    words = ["python -m simulation", f"--seed {seed}"]
    faults = options.get("faults")
    if faults:
        words.append("--faults " + ",".join(sorted(faults)))
    if options.get("finite_clients"):
        words.append("--finite-clients")
    for name in ("loss", "duplicate", "reorder"):
        if name in options:
            words.append(f"--{name} {options[name]}")
    if "brokers" in options:
        low, high = options["brokers"]
        if low == high:
            words.append(f"--brokers {low}")
    return " ".join(words)


# ====================================================================== the three known faults
def known_suback_then_publish(seed: int = 1) -> Result:
    """A subscriber gets SUBACK on broker B for a fresh topic class; a publisher on broker A
    publishes QoS 1 right after it: the first messages are acknowledged and never delivered."""
    run = Run(seed, Scenario(brokers=3, quiet_s=8.0, title="SUBACK on B, then publish on A"))
    a, b, _c = run.peer_ids
    run.start_brokers()
    run.add_client("pub", a, persistent=False)
    subscriber = run.add_client("sub", b, persistent=True)
    subscriber.on_connack = _subscribe_once("fresh/x")

    def on_suback(client: SimClient, topic_filter: str) -> None:
        run.publish_stream("pub", 10, 0.01, run.world.now, "fresh/x")  # right after the SUBACK

    subscriber.on_suback = on_suback
    run.world.at(2.0, run.connect, "pub")
    run.world.at(3.0, run.connect, "sub")
    return run.finish(end_s=15.0)


def known_publish_after_session_move(seed: int = 1) -> Result:
    """A persistent session on A reconnects to B (session present); a QoS 1 message published from
    C right after the CONNACK is acknowledged and never delivered."""
    run = Run(seed, Scenario(brokers=3, quiet_s=8.0, title="session moves A -> B, publish from C"))
    a, b, c = run.peer_ids
    run.start_brokers()
    run.add_client("pub", c, persistent=False)
    subscriber = run.add_client("sub", a, persistent=True)
    moved = {"done": False}

    def on_connack(client: SimClient, session_present: bool) -> None:
        if not session_present:
            client.subscribe("move/x")
        elif not moved["done"]:
            moved["done"] = True
            run.publish_stream("pub", 5, 0.01, run.world.now, "move/x")  # right after the CONNACK on B

    subscriber.on_connack = on_connack
    run.world.at(2.0, run.connect, "pub")
    run.world.at(2.5, run.connect, "sub")
    run.world.at(6.0, subscriber.disconnect)
    run.world.at(6.1, run.connect, "sub", b)
    return run.finish(end_s=20.0)


def known_kill_subscriber_broker(seed: int = 1) -> Result:
    """kill -9 of the subscriber's broker during a QoS 1 stream, restart on its data directory:
    messages acknowledged to the publisher while the broker was down or dying are lost."""
    run = Run(seed, Scenario(brokers=3, quiet_s=10.0, title="kill -9 of the subscriber's broker"))
    a, b, _c = run.peer_ids
    run.start_brokers()
    run.add_client("pub", a, persistent=False)
    subscriber = run.add_client("sub", b, persistent=True)
    subscriber.on_connack = _subscribe_once("kill/x")
    run.world.at(2.0, run.connect, "sub")
    run.world.at(2.5, run.connect, "pub")
    run.publish_stream("pub", 400, 0.005, 4.0, "kill/x")
    run.world.at(4.5, run.crash, b)
    run.world.at(6.0, run.restart, b)
    return run.finish(end_s=25.0)


def known_restart_under_a_fast_stream(
    seed: int = 1, *, messages: int = 6000, interval_s: float = 0.0005, drain_per_s: float = 4000.0
) -> Result:
    """kill -9 of the subscriber's broker under a stream of 2,000 msg/s that goes on after its
    restart, with the default limits and a subscriber that drains 4,000 msg/s: the backlog the
    publisher's send log kept (1.5 s of stream) must reach the session no faster than it drains.
    Before the flow control of catch-up the receiver released everything it had held behind the
    gap at once into the session queue (limit 1,000, drop oldest) and PUBACKed messages were lost."""
    title = "kill -9 of the subscriber's broker under a fast stream (default limits)"
    run = Run(seed, Scenario(brokers=3, quiet_s=10.0, title=title))
    a, b, _c = run.peer_ids
    run.start_brokers()
    run.add_client("pub", a, persistent=False)
    subscriber = run.add_client("sub", b, persistent=True)
    subscriber.drain_per_s = drain_per_s
    subscriber.on_connack = _subscribe_once("fast/x")
    run.world.at(2.0, run.connect, "sub")
    run.world.at(2.5, run.connect, "pub")
    run.publish_stream("pub", messages, interval_s, 4.0, "fast/x")
    run.world.at(4.3, run.crash, b)
    run.world.at(5.8, run.restart, b)
    return run.finish(end_s=4.0 + messages * interval_s + 25.0)


def slow_beside_fast(
    seed: int = 1, *, messages: int = 3000, interval_s: float = 0.001, drain_per_s: float = 4000.0
) -> tuple[Result, Run]:
    """A slow subscriber (draining a quarter of the publish rate) beside a fast one on the same
    broker and topic class, default limits, no fault: the fast one gets every message, the slow
    one drops by its queue policy (the live stream is never held back for it). The run is returned
    too, for its brokers' drop counters."""
    title = "slow subscriber beside a fast one (default limits)"
    run = Run(seed, Scenario(brokers=3, quiet_s=10.0, title=title))
    a, b, _c = run.peer_ids
    run.start_brokers()
    run.add_client("pub", a, persistent=False)
    rate = 1.0 / interval_s
    for client_id, drain in (("fast", drain_per_s), ("slow", rate / 4)):
        client = run.add_client(client_id, b, persistent=True)
        client.drain_per_s = drain
        client.on_connack = _subscribe_once("slow/#")
        run.world.at(2.0, run.connect, client_id)
    run.world.at(2.5, run.connect, "pub")
    run.publish_stream("pub", messages, interval_s, 4.0, "slow/x")
    return run.finish(end_s=4.0 + messages * interval_s + 10.0), run


def late_session_under_a_stream(
    seed: int = 1,
    *,
    messages: int = 1500,
    interval_s: float = 0.002,
    drain_per_s: float = 2000.0,
    down_s: float = 2.0,
) -> Result:
    """kill -9 of the subscriber's broker B under a 500 msg/s stream from A; the subscriber
    reconnects to C 0.3 s later (a new session: B is down) and subscribes again, as a device does;
    B restarts ``down_s`` after the kill and hands the old session to C, late, with its stream
    positions (the chaos soak's session moves). Default limits. Before the late session's catch-up
    stopped where C's own session had begun to get the stream, C delivered again all the stream
    since B's positions (about 1,000 duplicates here)."""
    run = Run(seed, Scenario(brokers=3, quiet_s=10.0, title="late session under a stream (default limits)"))
    a, b, c = run.peer_ids
    run.start_brokers()
    run.add_client("pub", a, persistent=False)
    subscriber = run.add_client("sub", b, persistent=True)
    subscriber.drain_per_s = drain_per_s
    subscriber.on_connack = lambda client, _present: client.subscribe("late/x")
    run.world.at(2.0, run.connect, "sub")
    run.world.at(2.5, run.connect, "pub")
    run.publish_stream("pub", messages, interval_s, 4.0, "late/x")
    kill_at = 4.0 + messages * interval_s / 3
    run.world.at(kill_at, run.crash, b)
    run.world.at(kill_at + 0.3, run.connect, "sub", c)
    run.world.at(kill_at + down_s, run.restart, b)
    return run.finish(end_s=4.0 + messages * interval_s + 25.0)


def absent_beside_fast_across_a_restart(
    seed: int = 1,
    *,
    with_absent: bool = True,
    away_s: float = 8.0,
    messages: int = 6000,
    interval_s: float = 0.001,
    drain_per_s: float = 4000.0,
) -> tuple[Result, Run]:
    """An absent persistent session beside a connected one on the same broker and class, across a
    catch-up, default limits: ``messages`` QoS 1 at 1/``interval_s`` from A; on B ``fast``
    (``drain_per_s``) and, with ``with_absent``, ``away`` (the same drain rate), same class;
    ``away``'s client disconnects 0.3 s into the stream and reconnects ``away_s`` later; B is
    killed 0.5 s into the stream and restarted 1.5 s later, so that B's stream from A catches up
    from A's send log while ``away`` is absent. The run is returned too, for its counters."""
    title = "absent session beside a connected one across a restart (default limits)"
    run = Run(seed, Scenario(brokers=3, quiet_s=10.0, title=title))
    a, b, _c = run.peer_ids
    run.start_brokers()
    run.add_client("pub", a, persistent=False)
    for client_id in ("fast", "away") if with_absent else ("fast",):
        client = run.add_client(client_id, b, persistent=True)
        client.drain_per_s = drain_per_s
        client.on_connack = _subscribe_once("absent/#")
        run.world.at(2.0, run.connect, client_id)
    run.world.at(2.5, run.connect, "pub")
    run.publish_stream("pub", messages, interval_s, 4.0, "absent/x")
    if with_absent:
        away = run.clients["away"]
        run.world.at(4.3, away.disconnect)
        run.world.at(4.3 + away_s, run.connect, "away")
    run.world.at(4.5, run.crash, b)
    run.world.at(6.0, run.restart, b)
    return run.finish(end_s=4.0 + messages * interval_s + away_s + 20.0), run


def session_move_under_a_fast_stream(
    seed: int = 1,
    *,
    messages: int = 8000,
    interval_s: float = 0.0005,
    drain_per_s: float = 2500.0,
    away_s: float = 3.0,
    to_publishers_broker: bool = False,
) -> tuple[Result, Run]:
    """A persistent subscriber on B, the only session of its class there, disconnects halfway
    through a 2,000 msg/s QoS 1 stream from A and connects to C ``away_s`` later (session present:
    its session moves), default limits (queue 1,000, drop oldest), draining ``drain_per_s``. Before
    a live stream was held for sessions that are all away, B queued the stream into the offline
    session and dropped the oldest beyond the queue limit: 3,004 of 8,000 PUBACKed messages lost
    (3 s away); now B stops taking the stream once the session's queue is half full, the senders'
    logs keep the rest, and C fetches it from where B stood, paced by the session's drain. The run
    is returned too, for its brokers' drop counters. ``to_publishers_broker``: the client connects
    to A, the publisher's broker, instead of C (A catches the session up from its own send log)."""
    title = "session move under a fast stream (default limits)"
    run = Run(seed, Scenario(brokers=3, quiet_s=10.0, title=title))
    a, b, c = run.peer_ids
    run.start_brokers()
    run.add_client("pub", a, persistent=False)
    subscriber = run.add_client("sub", b, persistent=True)
    subscriber.drain_per_s = drain_per_s
    subscriber.on_connack = _subscribe_once("move/fast")
    run.world.at(2.0, run.connect, "sub")
    run.world.at(2.5, run.connect, "pub")
    run.publish_stream("pub", messages, interval_s, 4.0, "move/fast")
    away_at = 4.0 + messages * interval_s / 2
    run.world.at(away_at, subscriber.disconnect)
    run.world.at(away_at + away_s, run.connect, "sub", a if to_publishers_broker else c)
    return run.finish(end_s=4.0 + messages * interval_s + away_s + 25.0), run


def away_beside_connected(
    seed: int = 1,
    *,
    with_away: bool = True,
    away_s: float = 4.0,
    messages: int = 6000,
    interval_s: float = 0.0005,
    drain_per_s: float = 4000.0,
) -> tuple[Result, Run]:
    """No fault: a 2,000 msg/s QoS 1 stream from A to ``fast`` on B and, with ``with_away``,
    ``away`` (same class, same drain rate), whose client disconnects 0.3 s into the stream and
    reconnects to B ``away_s`` later. A live stream is held for away sessions only when no session
    of its class is connected on the broker: here ``fast`` is, so nothing is held for ``away`` (no
    head-of-line blocking) and ``away`` drops by its queue policy beyond 1,000, as on one broker.
    The run is returned too, for its counters."""
    run = Run(seed, Scenario(brokers=3, quiet_s=10.0, title="away session beside a connected one"))
    a, b, _c = run.peer_ids
    run.start_brokers()
    run.add_client("pub", a, persistent=False)
    for client_id in ("fast", "away") if with_away else ("fast",):
        client = run.add_client(client_id, b, persistent=True)
        client.drain_per_s = drain_per_s
        client.on_connack = _subscribe_once("away/#")
        run.world.at(2.0, run.connect, client_id)
    run.world.at(2.5, run.connect, "pub")
    run.publish_stream("pub", messages, interval_s, 4.0, "away/x")
    if with_away:
        away = run.clients["away"]
        run.world.at(4.3, away.disconnect)
        run.world.at(4.3 + away_s, run.connect, "away")
    return run.finish(end_s=4.0 + messages * interval_s + away_s + 20.0), run
