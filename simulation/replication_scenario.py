"""Disk-loss faults and the replication runs of the whole-cluster simulation (``cluster.replicas``).

Two new faults, beside ``simulation.scenario``'s crash (``kill -9`` and a restart on the same
data directory):

* **crash with disk loss** (:meth:`ReplicationRun.crash_with_disk_loss`): ``kill -9``, then the
  broker's data directory is deleted; it starts again empty (a new incarnation with no store) at
  the same address - an operator replacing a machine, a pod whose node took its local volume;
* **removed for good** (:meth:`ReplicationRun.remove`): ``kill -9`` and the data directory
  deleted, never started again (a scale-down that did not drain).

:func:`replication_scenario` draws a run from a seed: 3-5 brokers, persistent QoS 1 subscribers on
some brokers, publishers on the others, and one fault at a time in the publishing window: a disk
loss (or, with ``remove``, a removal) of a broker that hosts no subscriber, each preceded by a
partition that cuts the victim off from the subscribers' brokers for 1-3 s (so that its send log
holds PUBACKed messages nobody else has when its disk goes), optional ordinary crashes of any
broker, and up to ``loss`` of the items on every link. Sessions are not replicated yet
(docs/notes/replication.md): a subscriber's own broker never loses its disk here.

Invariants (:func:`replication_violations`): the usual ones of ``simulation.checkers`` (no PUBACKed
message lost, order, owners, retained) and **N copies back**: at the end every live broker's
replication log is durable on N (nothing under-replicated) and no broker still holds a gone
incarnation's entries.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass, replace
from typing import Any

from broker.mqtt.packets import Will
from simulation.checkers import Violation
from simulation.network import Network, NetworkConfig
from simulation.process import SimBroker
from simulation.replication import ReplicatedSimBroker
from simulation.scenario import Result, Run, Scenario, _subscribe_once

FAILOVER_AFTER_S = 3.0  # a broker down this long is gone for good (the simulation's setting)
# each fault has a slot this long to itself: cut (0-0.5 s in), down 0.3-1.5 s later, back 0.5-2 s
# after that (a removed broker: taken over FAILOVER_AFTER_S after it went down), and the rest of
# the slot for the copies to be restored before the next fault
FAULT_SLOT_S = 7.0
PUBLISH_INTERVAL_S = 0.1  # each publisher's QoS 1 stream: 10 msg/s
GRACE_PERIOD_S = 5.0  # a draining broker exits at the latest this long after its drain began
DRAIN_POLL_S = 0.1


@dataclass(frozen=True)
class ReplicationOptions:
    replicas: int = 2
    disk_losses: int = 1
    removals: int = 0
    crashes: int = 0
    loss: float = 0.0
    graceful: int = 0  # brokers removed for good gracefully (drained first)
    # the victims of disk losses and removals may be the subscribers' brokers too: their
    # persistent subscribers reconnect to another broker and must find their session there
    sessions: bool = False


class ReplicationRun(Run):
    """A :class:`~simulation.scenario.Run` whose brokers replicate (``replicas`` > 1) and that has
    the disk-loss faults. With ``replicas`` 1 the brokers are plain :class:`SimBroker` processes."""

    def __init__(
        self, seed: int, scenario: Scenario, replicas: int, workdir: str | None = None, *, move: bool = False
    ) -> None:
        super().__init__(seed, scenario, workdir)
        self.replicas = replicas
        # a persistent client whose broker is down reconnects to another live broker
        self.move = move
        # (when, broker, its persistent clients then): a disk loss or removal of their broker
        self.homes_lost: list[tuple[float, str, list[str]]] = []
        self.members = list(self.peer_ids)
        # the replication records are not in protos/ yet: carried as they are (no wire codec)
        self.replica_network = Network(self.world, replace(scenario.network, wire=False))
        self.replica_network.rng = self.world.rng_for("replica-network")
        self.removed: list[str] = []
        # peer -> [(replication log incarnation, started empty)] in start order
        self.started: dict[str, list[tuple[str, bool]]] = {}

    def start_broker(self, peer_id: str) -> SimBroker:
        sim = super().start_broker(peer_id)
        if isinstance(sim, ReplicatedSimBroker):
            core = sim.replication.core
            self.started.setdefault(peer_id, []).append((core.incarnation, core.started_empty))
        return sim

    def new_broker(self, peer_id: str, incarnation: int) -> SimBroker:
        if self.replicas <= 1:
            return super().new_broker(peer_id, incarnation)
        return ReplicatedSimBroker(
            self.world,
            self.network,
            peer_id,
            self.data_dir(peer_id),
            replica_network=self.replica_network,
            members=self.members,
            failover_after_s=FAILOVER_AFTER_S,
            history_note=self.history.trace,
            incarnation=incarnation,
            settings={**dict(self.scenario.settings), "cluster.replicas": self.replicas},
            clock_offset_s=self.rng.uniform(-0.05, 0.05),
        )

    # ------------------------------------------------------------------ faults
    def crash_with_disk_loss(self, peer_id: str) -> None:
        sim = self.brokers[peer_id]
        if not sim.alive:
            return
        self.history.trace("crash_disk_loss", peer_id)
        persistent = [cid for cid, client in self.clients.items() if not client.clean_start]
        homed = [cid for cid in persistent if self.home.get(cid) == peer_id]
        self.homes_lost.append((self.world.now, peer_id, homed))
        sim.crash()
        shutil.rmtree(self.data_dir(peer_id), ignore_errors=True)

    def remove(self, peer_id: str) -> None:
        """Removed for good: disk gone, never started again (the end's restarts skip it)."""
        self.crash_with_disk_loss(peer_id)
        self.history.trace("removed", peer_id)
        self.removed.append(peer_id)
        if peer_id in self.peer_ids:
            self.peer_ids.remove(peer_id)

    def remove_gracefully(self, peer_id: str) -> None:
        """Removed for good after a drain (SIGTERM, the Helm chart's scale-down): the broker stops
        taking clients, hands its sessions and log over, and exits once drained - or when the
        grace period ends (then it is a removal like :meth:`remove`); its disk goes with it."""
        sim = self.brokers[peer_id]
        if not sim.alive or not isinstance(sim, ReplicatedSimBroker):
            self.remove(peer_id)
            return
        self.history.trace("drain", peer_id)
        if peer_id in self.peer_ids:
            self.peer_ids.remove(peer_id)  # clients reconnect elsewhere
        sim.drain()
        deadline = self.world.now + GRACE_PERIOD_S

        def check() -> None:
            if not sim.alive:
                return
            if sim.drained() or self.world.now >= deadline:
                self.history.trace("drained" if sim.drained() else "grace_period_over", peer_id)
                self.remove(peer_id)
            else:
                self.world.after(DRAIN_POLL_S, check)

        self.world.after(DRAIN_POLL_S, check)

    def restart(self, peer_id: str) -> None:
        if peer_id not in self.removed:
            super().restart(peer_id)

    def _reconnect(self, client_id: str) -> None:
        client = self.clients[client_id]
        home = self.brokers.get(self.home[client_id])
        gone = home is None or not home.alive or getattr(home, "leaving", False)
        if self.move and not client.clean_start and client.socket is None and gone:
            live = [p for p in self.peer_ids if p in self.brokers and self.brokers[p].alive]
            if live:
                self.connect(client_id, self.rng.choice(live))
                return
        super()._reconnect(client_id)

    def partition(self, group: list[str]) -> None:
        super().partition(group)
        self.replica_network.partition([group])

    def heal(self) -> None:
        super().heal()
        self.replica_network.heal()

    # ------------------------------------------------------------------ the end state
    def finish(self, *, end_s: float | None = None) -> Result:
        """The usual end, plus :func:`copies_restored` on the brokers' state just before it."""
        end = end_s if end_s is not None else self.last_publish_s + self.scenario.quiet_s
        figures: dict[str, tuple[int, int]] = {}
        self.world.at(end - 0.001, lambda: figures.update(self.replication_figures()))
        result = super().finish(end_s=end)
        if self.replicas > 1:
            result.violations += copies_restored(figures)
        result.violations += sessions_present(self.homes_lost, result.history.events)
        return result

    def replication_figures(self) -> dict[str, tuple[int, int]]:
        """Live broker -> (entries of its log not durable on N, entries it holds of gone logs)."""
        figures: dict[str, tuple[int, int]] = {}
        gone = self.gone_logs()
        for peer_id, sim in self.brokers.items():
            if sim.alive and isinstance(sim, ReplicatedSimBroker):
                node = sim.replication
                stale = sum(count for key, count in node.core.held_logs().items() if key in gone)
                figures[peer_id] = (node.core.under_replicated(), stale)
        return figures

    def gone_logs(self) -> set[tuple[str, str]]:
        """The logs whose origin can no longer deliver them: every incarnation of a removed broker,
        and each one followed by an incarnation that started empty (its disk lost). (A log whose
        origin restarted on its disk is delivered by that origin; holders keep it until the send
        log's retention: docs/notes/replication.md.)"""
        gone = set()
        for peer, incarnations in self.started.items():
            for index, (incarnation, _empty) in enumerate(incarnations):
                later_empty = any(empty for _inc, empty in incarnations[index + 1 :])
                if peer in self.removed or later_empty:
                    gone.add((peer, incarnation))
        return gone


def sessions_present(
    homes_lost: list[tuple[float, str, list[str]]], events: list[tuple[object, ...]]
) -> list[Violation]:
    """Every persistent session present after failover: a client whose broker lost its disk (or
    was removed) gets ``session present`` on its first CONNACK after that, wherever it reconnects."""
    violations = []
    for at, peer, clients in homes_lost:
        for client_id in clients:
            first = next(
                (e for e in events if e[1] == "connack" and e[2] == client_id and float(str(e[0])) > at),
                None,
            )
            if first is None:
                violations.append(
                    Violation("session", f"{client_id} never reconnected after {peer} lost its disk")
                )
            elif first[3] is not True:
                violations.append(
                    Violation(
                        "session",
                        f"{client_id}: no session present at {first[0]}"
                        f" after {peer} lost its disk at {at:.3f}",
                    )
                )
    return violations


def copies_restored(figures: dict[str, tuple[int, int]]) -> list[Violation]:
    violations = []
    for peer_id, (under, stale) in sorted(figures.items()):
        if under:
            violations.append(
                Violation("replicas", f"{peer_id}: {under} entries not durable on N at the end")
            )
        if stale:
            violations.append(
                Violation("replicas", f"{peer_id}: holds {stale} entries of a gone incarnation")
            )
    return violations


def replication_scenario(seed: int, options: ReplicationOptions) -> tuple[Scenario, dict[str, Any]]:
    """The sizes and fault times of ``seed`` (drawn here, not by the run, so that replicas 1 and 2
    of one seed face the same faults at the same times)."""
    rng = random.Random(f"replication/{seed}")
    brokers = rng.randint(3, 5)
    network = NetworkConfig(
        latency_s=rng.uniform(0.0005, 0.005),
        jitter_s=rng.uniform(0.0, 0.002),
        loss_rate=options.loss * rng.random(),
        duplicate_rate=0.05 * rng.random(),
        reorder_rate=0.05 * rng.random(),
        reorder_delay_s=0.02,
    )
    faults = options.disk_losses + options.removals + options.crashes + options.graceful
    # the publishers go on through every fault's slot (FAULT_SLOT_S each: one fault at a time)
    messages = max(rng.randint(20, 40), int(faults * FAULT_SLOT_S / PUBLISH_INTERVAL_S))
    scenario = Scenario(
        brokers=brokers,
        publishers=rng.randint(1, 2),
        subscribers=rng.randint(1, 3),
        messages=messages,
        publish_interval_s=PUBLISH_INTERVAL_S,
        network=network,
        quiet_s=20.0,
        title=f"replication seed {seed}",
    )
    return scenario, {"sub_brokers": rng.randint(1, brokers - 2)}


def run_replication_seed(seed: int, options: ReplicationOptions, *, workdir: str | None = None) -> Result:
    """One seed with ``options.replicas``: the script of :func:`replication_scenario`."""
    scenario, plan = replication_scenario(seed, options)
    run = ReplicationRun(seed, scenario, options.replicas, workdir, move=options.sessions)
    rng = random.Random(f"replication-script/{seed}")
    world = run.world
    peers = list(run.peer_ids)
    sub_homes = peers[: plan["sub_brokers"]]
    others = peers[plan["sub_brokers"] :]
    run.start_brokers()
    for index in range(scenario.subscribers):
        client_id = f"sub{index}"
        run.add_client(client_id, rng.choice(sub_homes), persistent=True)
        run.clients[client_id].on_connack = _subscribe_once(rng.choice(scenario.filters))
        world.at(scenario.join_s + 0.05 * index, run.connect, client_id)
    for index in range(scenario.publishers):
        client_id = f"pub{index}"
        run.add_client(client_id, rng.choice(others), persistent=False)
        world.at(scenario.settle_s - 0.5, run.connect, client_id)
        run.publish_stream(client_id, scenario.messages, scenario.publish_interval_s, scenario.settle_s)
    # one fault at a time: each in its own slot of the publishing window
    faults = ["disk"] * options.disk_losses + ["remove"] * options.removals + ["crash"] * options.crashes
    faults += ["graceful"] * options.graceful
    rng.shuffle(faults)
    victims = list(peers) if options.sessions else list(others)
    for index, fault in enumerate(faults):
        start = scenario.settle_s + index * FAULT_SLOT_S
        if fault == "crash":
            victim = rng.choice(peers)
            at = start + rng.uniform(0.0, 1.0)
            world.at(at, run.crash, victim)
            world.at(at + rng.uniform(0.5, 3.0), run.restart, victim)
            continue
        if not victims:
            continue
        victim = rng.choice(victims)
        if fault in ("remove", "graceful"):
            victims.remove(victim)  # gone for good: no later fault picks it
        if fault == "graceful":
            world.at(start + rng.uniform(0.0, 1.0), run.remove_gracefully, victim)
            continue
        cut_at = start + rng.uniform(0.0, 0.5)
        down_at = cut_at + rng.uniform(0.3, 1.5)
        # the subscribers' brokers cut off: the victim's log holds PUBACKed messages only it has
        world.at(cut_at, run.partition, list(others))
        if fault == "remove":
            world.at(down_at, run.remove, victim)
        else:
            world.at(down_at, run.crash_with_disk_loss, victim)
            world.at(down_at + rng.uniform(0.5, 2.0), run.restart, victim)
        world.at(down_at + 0.05, run.heal)
    result = run.finish()
    result.replay = (
        f"python -m simulation.replication_scenario --seed {seed} --replicas {options.replicas}"
        f" --disk-losses {options.disk_losses} --removals {options.removals}"
        f" --crashes {options.crashes} --loss {options.loss}"
        + (f" --graceful {options.graceful}" if options.graceful else "")
        + (" --sessions" if options.sessions else "")
    )
    return result


def will_after_disk_loss(seed: int, *, back_at_s: float) -> Result:
    """The will in the session copy (docs/cluster.md, Replicas): a persistent MQTT 3.1.1 device
    with a will (QoS 1, no delay: 3.1.1 has none) on broker A, a watcher of the will's topic on C;
    A crashes with its disk at 6 s (and comes back empty at the end). The device comes back, to B,
    at ``back_at_s``: after A's holder adopted its session (A down ``FAILOVER_AFTER_S``), the
    adopter published the will once; before (0.2 s after the loss), the device has its session
    and no will is published. Either way it gets ``session present`` (``sessions_present``)."""
    run = ReplicationRun(seed, Scenario(brokers=3, quiet_s=6.0, title="will after a disk loss"), 2)
    a, b, c = run.peer_ids
    run.start_brokers()
    device = run.add_client("dev", a, persistent=True)
    device.will = Will("will/dev", b"dev-will:0:1", 1, False)
    device.on_lost = lambda client: None  # it comes back when the script says
    watcher = run.add_client("watch", c, persistent=True)
    watcher.on_connack = _subscribe_once("will/#")
    run.world.at(2.0, run.connect, "watch")
    run.world.at(2.5, run.connect, "dev")
    run.world.at(6.0, run.crash_with_disk_loss, a)
    run.world.at(back_at_s, run.connect, "dev", b)
    return run.finish(end_s=max(back_at_s, 6.0 + 3 * FAILOVER_AFTER_S) + 6.0)


def takeovers(result: Result) -> int:
    """Entries published again by a holder for a gone origin in ``result``'s run."""
    return sum(int(str(event[3])) for event in result.history.events if event[1] == "take_over")


def main(argv: list[str] | None = None) -> int:
    """``python -m simulation.replication_scenario``: re-executes itself with ``PYTHONHASHSEED=0``
    (as ``python -m simulation`` does), so that a seed replays exactly across processes."""
    import argparse
    import os
    import sys

    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        module = "simulation.replication_scenario"
        os.execv(sys.executable, [sys.executable, "-m", module, *(argv or sys.argv[1:])])

    parser = argparse.ArgumentParser(
        prog="python -m simulation.replication_scenario",
        description="Replication runs of the whole-cluster simulation: disk-loss faults (a broker "
        "killed and its data directory deleted), removals, crashes, loss; exit 1 naming failing seeds.",
    )
    parser.add_argument("--seed", type=int, help="run one seed and print its report")
    parser.add_argument("--seeds", default="0:20", help="a range START:END of seeds (default 0:20)")
    parser.add_argument("--replicas", type=int, default=2, help="cluster.replicas (default 2)")
    parser.add_argument("--disk-losses", type=int, default=1, help="disk losses per run (default 1)")
    parser.add_argument("--removals", type=int, default=0, help="brokers removed for good per run")
    parser.add_argument("--crashes", type=int, default=0, help="kill -9 with restart on the same disk")
    parser.add_argument("--loss", type=float, default=0.0, help="maximum share of items lost per link")
    parser.add_argument(
        "--graceful", type=int, default=0, help="brokers removed for good after a drain (SIGTERM), per run"
    )
    parser.add_argument(
        "--sessions",
        action="store_true",
        help="disk losses and removals may hit the subscribers' brokers too; their persistent "
        "subscribers reconnect to another broker and must get their session (session present)",
    )
    args = parser.parse_args(argv)
    options = ReplicationOptions(
        args.replicas,
        args.disk_losses,
        args.removals,
        args.crashes,
        args.loss,
        graceful=args.graceful,
        sessions=args.sessions,
    )
    if args.seed is not None:
        seeds = [args.seed]
    else:
        low, high = (int(part) for part in args.seeds.split(":"))
        seeds = list(range(low, high))
    failing = []
    for seed in seeds:
        result = run_replication_seed(seed, options)
        if args.seed is not None or not result.ok:
            print(result.report())
        if not result.ok:
            failing.append(seed)
    print(f"{len(seeds)} seeds, {len(failing)} failing" + (f": {failing}" if failing else ""))
    return 1 if failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
