"""The evaluation of seed 003 §4 (Banno & Shudo) as functions returning data.

Setup (§4): N physical nodes (10,000 in the paper), each taking part in about 5 topics as
publisher or subscriber; one measured topic with 1 publisher and 10..5120 subscribers; table
sizes L = 60 and 120; 3 runs averaged; systems: the proposed SG-TBPS + FRT
(``OverlayNode``), SG-TBPS (``OverlayConfig(frt_enabled=False)``) and Scribe (``scribe``).
Outputs: average and maximum path length per subscriber count (Fig. 5, Fig. 6) and the simple
delay model of §4.1 (Fig. 7).

How a series is run (``run_series``), for one (system, L, seed): the background overlay is built
once by the protocol itself (every physical node bootstraps, then joins its background topics;
nothing is computed by an oracle), then the measured topic's publisher joins and subscribers are
added incrementally (10 -> 20 -> 40 ...), and after each step the simulation runs
``step_settle_s`` of virtual time before publishes are injected and every ``Deliver.hops`` is
recorded. Decisions where the paper is silent (background topic count, roles, timing) are
parameters of ``ExperimentConfig`` and documented in docs/overlay-reproduction.md.

This module is pure like the rest of ``overlay``: no clocks or I/O (bench/paper_sweep.py adds
wall-clock timing, processes and files).

Size: the whole measured experiment of §4 in one place - its configuration, the series runner
for each measured order, the per-step overlay inspection and the aggregation the sweep plots.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from statistics import fmean, stdev
from typing import Any

from overlay.api import Deliver, Event, JoinTopic, OverlayCore, PeerId, Publish, Role
from overlay.sim.engine import NetworkConfig, SimulationError, Simulator, derive_seed
from overlay.sim.scribe import ScribeConfig, ScribeNode
from overlay.sim.sfb_model import sfb_depths

__all__ = [
    "PAPER_SUBSCRIBER_COUNTS",
    "SYSTEMS",
    "AggregatePoint",
    "ExperimentConfig",
    "PathSample",
    "SeriesResult",
    "StepExplanation",
    "aggregate",
    "delay_model_ms",
    "make_node_factory",
    "run_series",
    "single_broker_delay_ms",
    "system_label",
]

SYSTEMS = ("proposed", "sgtbps", "scribe")
PAPER_SUBSCRIBER_COUNTS = (10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120)

NodeFactory = Callable[[PeerId, random.Random], OverlayCore]
Progress = Callable[[str, int, int], None]  # (stage, done, total)


MEASURED_ORDERS = ("incremental", "with_background", "fresh")


@dataclass(frozen=True, slots=True)
class ExperimentConfig:
    """Parameters of one reproduction run (defaults follow §4 where it says something)."""

    nodes: int = 10_000
    topics_per_node: float = 5.0  # mean background memberships per physical node (§4: "about 5")
    background_topics: int | None = None  # None: nodes (so ~5 members per background topic)
    publisher_fraction: float = 0.5  # share of background memberships that are publishers
    subscriber_counts: tuple[int, ...] = PAPER_SUBSCRIBER_COUNTS
    peer_spacing_s: float = 0.002  # virtual time between successive physical-node bootstraps
    membership_window_s: float = 20.0  # background JoinTopic events spread over this window
    build_settle_s: float = 30.0  # quiet time after the background build
    subscriber_spacing_s: float = 0.002  # virtual time between the joins of one step's subscribers
    step_settle_s: float = 30.0  # virtual time between a step's last join and its publishes
    warmup_publishes: int = 1  # publishes whose paths are not recorded (tables may still learn)
    measure_publishes: int = 2
    publish_gap_s: float = 3.0  # virtual time between publishes (every delivery lands in between)
    # How the measured topic grows (docs/overlay-reproduction.md, "The measured topic"):
    # "incremental": one topic, the publisher first, subscribers added 10 -> 20 -> 40 ...;
    # "with_background": the same, but the publisher and the first count join during the
    #   background build (as in a from-scratch run), later counts incremental;
    # "fresh": every subscriber count is its own measured topic whose subscribers join first and
    #   whose publisher joins after them (independent measurements per count)
    measured_order: str = "incremental"
    overlay_options: tuple[tuple[str, Any], ...] = ()  # extra OverlayConfig fields (timers)
    # extra OverlayConfig fields for the SG-TBPS baseline only, overridden by overlay_options
    # (paper_sweep: join_verify_rounds=1, without which concurrent joins split its level-0 list)
    sgtbps_overlay_options: tuple[tuple[str, Any], ...] = ()
    scribe_options: tuple[tuple[str, Any], ...] = ()  # extra ScribeConfig fields
    explain: bool = False  # trace the publisher's table: StepExplanation per step (proposed system)
    # A measured publish that misses a subscriber stops the run (SimulationError naming the seed):
    # the path average would otherwise be taken over the subscribers reached, which are the ones
    # near the publisher (issue #18: the SG-TBPS baseline's split level-0 list reached 3 of 10).
    # True only to reproduce such a run and see its delivered counts (paper_sweep --allow-misses).
    allow_missed_deliveries: bool = False
    # Per step, compare the overlay with the Skip Graph it should be (PathSample.level0_wrong,
    # publisher_run_entries, run_neighbours_missing, model_*; proposed and SG-TBPS only)
    inspect_overlay: bool = True
    network: NetworkConfig = field(default_factory=NetworkConfig)

    def __post_init__(self) -> None:
        if self.nodes < 2:
            raise ValueError(f"ExperimentConfig.nodes must be >= 2, got {self.nodes}")
        if not self.subscriber_counts or list(self.subscriber_counts) != sorted(set(self.subscriber_counts)):
            raise ValueError(
                f"subscriber_counts must be increasing and non-empty, got {self.subscriber_counts}"
            )
        if self.subscriber_counts[0] < 1 or self.subscriber_counts[-1] > self.nodes - 1:
            raise ValueError(
                f"subscriber_counts must lie in 1..nodes-1={self.nodes - 1}, got {self.subscriber_counts}"
            )
        if self.measured_order not in MEASURED_ORDERS:
            raise ValueError(f"measured_order must be one of {MEASURED_ORDERS}, got {self.measured_order!r}")
        if self.measure_publishes < 1:
            raise ValueError("measure_publishes must be >= 1")
        if not 0.0 <= self.publisher_fraction <= 1.0:
            raise ValueError(f"publisher_fraction must be within [0, 1], got {self.publisher_fraction}")
        if self.topics_per_node < 0:
            raise ValueError(f"topics_per_node must be >= 0, got {self.topics_per_node}")


@dataclass(frozen=True, slots=True)
class PathSample:
    """Path lengths of the measured topic at one subscriber count in one run."""

    system: str
    table_size: int | None
    seed: int
    subscribers: int
    avg_hops: float
    max_hops: int
    delivered: int  # distinct subscribers reached, the fewest over the measured publishes
    duplicates: int  # deliveries beyond the first per subscriber and publish (must be 0)
    virtual_time_s: float
    messages_sent: int  # all messages so far in this run
    messages_by_kind: tuple[tuple[str, int], ...]  # during this step (joins, settle, publishes)
    route_hops: float = 0.0  # Scribe only: publisher -> root hops included in every path
    # ExperimentConfig.inspect_overlay (proposed and SG-TBPS; -1 / 0.0 when not inspected):
    # live virtual nodes whose level-0 neighbours are not their neighbours in key order
    level0_wrong: int = -1
    level0_wrong_measured: int = -1  # the same, among the measured topic's virtual nodes
    # subscribers the publisher's table holds (the delegates of its first multicast step), and
    # how many of them a Skip Graph over the same membership vectors would give it (its
    # neighbours inside the run, sfb_model.right_neighbours)
    publisher_run_entries: int = -1
    publisher_run_neighbours: int = -1
    # over the publisher and every subscriber: Skip Graph right neighbours inside the run that
    # the table lacks, and in-run right entries that are not such neighbours
    run_neighbours_missing: int = -1
    run_entries_extra: int = -1
    # the idealised model (overlay.sim.sfb_model.sfb_depths) on this run's membership vectors,
    # and how many subscribers the last measured publish reached in exactly the model's hops
    model_avg_hops: float = 0.0
    model_max_hops: int = 0
    model_agree: int = -1


@dataclass(frozen=True, slots=True)
class StepExplanation:
    """The publisher's table at one step (``ExperimentConfig.explain``), after its publishes.

    ``missing`` names every subscriber not reached in one hop by the last measured publish and
    why: "never learned" (never an entry of the publisher's table), "evicted: <proposition>"
    (removed by ≤FRT filtering; the first proposition by which the table without it beat the
    best alternative, ``frt.eviction_reason``), "known, reached via another node" (an entry
    now, learned after the publish or not used as a delegate).
    """

    system: str
    table_size: int | None
    seed: int
    subscribers: int
    table_entries: int
    sticky_entries: int
    sub_entries: int  # same-topic subscriber entries (|SUB(E)|)
    nonsub_by_level: tuple[int, ...]  # non-subscriber entries per level 0..l_max
    sub_by_level: tuple[int, ...]
    known: int  # subscribers that are entries of the publisher's table now
    one_hop: int  # subscribers reached at 1 hop by the last measured publish
    ever_learned: int  # subscribers the table ever held
    missing: tuple[tuple[str, str], ...]  # (subscriber key as text, why), sorted by key

    def reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, why in self.missing:
            counts[why] = counts.get(why, 0) + 1
        return counts


@dataclass(frozen=True, slots=True)
class SeriesResult:
    """One (system, L, seed) run: the samples plus what building the background cost."""

    samples: list[PathSample]
    build_messages_by_kind: tuple[tuple[str, int], ...]
    build_virtual_time_s: float
    virtual_nodes: int  # after the build (0 for Scribe, which has no virtual nodes)
    explanations: list[StepExplanation] = field(default_factory=list)
    # inspect_overlay: virtual nodes with a wrong level-0 neighbour when the build ends (-1: not inspected)
    level0_wrong_after_build: int = -1


@dataclass(frozen=True, slots=True)
class AggregatePoint:
    """Mean over seeds of one (system, L, subscriber count)."""

    system: str
    table_size: int | None
    subscribers: int
    seeds: int
    avg_hops: float
    max_hops: float
    min_delivered_fraction: float
    delay_ms: float
    route_hops: float = 0.0  # Scribe: mean publisher -> root hops (tree depth = hops - route_hops)
    avg_hops_sd: float = 0.0  # sample standard deviation of avg_hops over the seeds (0 for one seed)
    max_hops_sd: float = 0.0  # the same for max_hops
    # the idealised SG-TBPS model on each run's own membership vectors, mean over the seeds
    # (0.0 when the runs were not inspected: Scribe, or inspect_overlay off)
    model_avg_hops: float = 0.0
    model_max_hops: float = 0.0
    level0_wrong: float = 0.0  # mean over the seeds of PathSample.level0_wrong (when inspected)


def system_label(system: str, table_size: int | None) -> str:
    """Display name of a series: 'proposed L=60', 'SG-TBPS', 'Scribe'."""
    if system == "proposed":
        return f"proposed L={table_size}"
    return {"sgtbps": "SG-TBPS", "scribe": "Scribe"}.get(system, system)


def make_node_factory(system: str, table_size: int | None, cfg: ExperimentConfig) -> NodeFactory:
    """Constructor of the physical nodes of ``system`` (imports the core lazily)."""
    if system == "scribe":
        scribe_config = ScribeConfig(**dict(cfg.scribe_options))

        def scribe_node(peer: PeerId, rng: random.Random) -> OverlayCore:
            return ScribeNode(peer, rng=rng, config=scribe_config)

        return scribe_node
    if system not in ("proposed", "sgtbps"):
        raise ValueError(f"unknown system {system!r}; expected one of {SYSTEMS}")
    from overlay.config import OverlayConfig
    from overlay.node import OverlayNode

    options: dict[str, Any] = dict(cfg.sgtbps_overlay_options) if system == "sgtbps" else {}
    options.update(cfg.overlay_options)
    if system == "proposed":
        if table_size is None:
            raise ValueError("the proposed system needs a table size L")
        options["table_size"] = table_size
        options["frt_enabled"] = True
    else:
        options["frt_enabled"] = False
    overlay_config = OverlayConfig(**options)

    def overlay_node(peer: PeerId, rng: random.Random) -> OverlayCore:
        return OverlayNode(peer, rng=rng, config=overlay_config)

    return overlay_node


class _DeliveryRecorder:
    """Observer collecting ``Deliver`` actions of one topic (attached only while measuring)."""

    __slots__ = ("deliveries", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.deliveries: dict[int, list[tuple[PeerId, int]]] = {}

    def __call__(self, sim: Simulator, peer: PeerId, event: Event, actions: list[Any]) -> None:
        for action in actions:
            if type(action) is Deliver and action.topic == self.topic:
                self.deliveries.setdefault(action.publication_id, []).append((peer, action.hops))


class _TableTracer:
    """Observer attaching a ``TableTrace`` to the publisher's table of the measured topic as
    soon as it exists (subscriber entries already present count as learned)."""

    __slots__ = ("key", "peer", "table")

    def __init__(self, peer: PeerId, topic: str) -> None:
        self.peer = peer
        self.key = (topic, int(Role.PUBLISHER), peer)
        self.table: Any = None

    def __call__(self, sim: Simulator, peer: PeerId, event: Event, actions: list[Any]) -> None:
        if peer != self.peer or self.table is not None:
            return
        node: Any = sim.nodes.get(peer)
        if node is None or self.key not in getattr(node, "vnodes", {}):
            return
        from overlay.table import TableTrace

        table = node.table_of(self.key)
        table.trace = TableTrace()
        table.trace.learned.update(key for key in table.keys if table.is_sub(key))
        self.table = table


def _explain_step(
    system: str,
    table_size: int | None,
    seed: int,
    count: int,
    tracer: _TableTracer,
    recorder: _DeliveryRecorder,
    last_id: int,
    subscribers: Sequence[PeerId],
    topic: str,
) -> StepExplanation:
    table = tracer.table
    if table is None or table.trace is None:
        message = f"the publisher's table was never traced at {count} subscribers"
        raise SimulationError(message, seed=seed, now_s=-1.0)
    hops = dict(recorder.deliveries.get(last_id, []))
    levels = len(table.level_counts)
    sub_by_level = [0] * levels
    for key in table.keys:
        if table.is_sub(key):
            sub_by_level[table.level_of(key)] += 1
    nonsub = tuple(table.nonsub_counts)
    missing: list[tuple[str, str]] = []
    one_hop = 0
    known = 0
    for peer in sorted(subscribers):
        key = (topic, int(Role.SUBSCRIBER), peer)
        in_table = key in table
        known += in_table
        if hops.get(peer) == 1:
            one_hop += 1
            continue
        if in_table:
            why = "known, reached via another node"
        elif key in table.trace.evicted:
            why = f"evicted: {table.trace.evicted[key]}"
        elif key in table.trace.learned:
            why = "removed (not by filtering)"
        else:
            why = "never learned"
        missing.append((repr(key), why))
    return StepExplanation(
        system=system,
        table_size=table_size,
        seed=seed,
        subscribers=count,
        table_entries=len(table),
        sticky_entries=len(table.sticky_keys()),
        sub_entries=table.sub_count,
        nonsub_by_level=nonsub,
        sub_by_level=tuple(sub_by_level),
        known=known,
        one_hop=one_hop,
        ever_learned=len(table.trace.learned),
        missing=tuple(missing),
    )


def _background_memberships(cfg: ExperimentConfig, rng: random.Random) -> list[tuple[int, str, Role]]:
    """(peer, topic, role) triples: each peer joins ~topics_per_node distinct background topics."""
    topic_count = cfg.background_topics if cfg.background_topics is not None else cfg.nodes
    whole = int(cfg.topics_per_node)
    fraction = cfg.topics_per_node - whole
    memberships: list[tuple[int, str, Role]] = []
    for peer in range(cfg.nodes):
        count = whole + (1 if rng.random() < fraction else 0)
        count = min(count, topic_count)
        for topic_index in rng.sample(range(topic_count), count):
            role = Role.PUBLISHER if rng.random() < cfg.publisher_fraction else Role.SUBSCRIBER
            memberships.append((peer, f"t{topic_index:06d}", role))
    return memberships


def run_series(
    system: str,
    table_size: int | None,
    seed: int,
    cfg: ExperimentConfig,
    progress: Progress | None = None,
    factory: NodeFactory | None = None,
) -> SeriesResult:
    """Build one overlay and measure the measured topic at every subscriber count.

    ``factory`` overrides the node constructor (tests use it for deliberately broken nodes).
    Raises ``SimulationError`` (naming the seed) when a measured publish reaches a subscriber
    twice or reaches nobody.
    """
    make_node = factory if factory is not None else make_node_factory(system, table_size, cfg)
    explain = cfg.explain and system == "proposed"
    tracer: _TableTracer | None = None
    plan_rng = random.Random(derive_seed(seed, "experiment-plan", cfg.nodes))
    sim = Simulator(seed, cfg.network, count_per_peer=False)

    memberships = _background_memberships(cfg, plan_rng)
    total_steps = len(cfg.subscriber_counts)
    report = progress if progress is not None else (lambda stage, done, total: None)

    # 1. physical nodes bootstrap one after another, each through an earlier node
    for peer in range(cfg.nodes):
        contacts: tuple[int, ...] = () if peer == 0 else (plan_rng.randrange(peer),)
        sim.add_node(make_node(peer, sim.node_rng(peer)), contacts, at=peer * cfg.peer_spacing_s)
    bootstrap_end_s = cfg.nodes * cfg.peer_spacing_s
    # 2. background topic memberships spread over a window
    for peer, topic, role in memberships:
        at = bootstrap_end_s + plan_rng.random() * cfg.membership_window_s
        sim.inject(peer, JoinTopic(topic, role), at=at)
    topic_count = cfg.background_topics if cfg.background_topics is not None else cfg.nodes
    subscribed = 0
    if cfg.measured_order == "with_background":  # the first members join amid the background
        side_rng = random.Random(derive_seed(seed, "measured-with-background", cfg.nodes))
        measured_topic = f"t{side_rng.randrange(max(topic_count, 1)):06d}~measured"
        order = list(range(cfg.nodes))
        side_rng.shuffle(order)
        publisher, candidates = order[0], order[1:]
        subscribed = cfg.subscriber_counts[0]
        if explain:
            tracer = _TableTracer(publisher, measured_topic)
            sim.observers.append(tracer)
        sim.inject(publisher, JoinTopic(measured_topic, Role.PUBLISHER), at=bootstrap_end_s)
        for peer in candidates[:subscribed]:
            at = bootstrap_end_s + side_rng.random() * cfg.membership_window_s
            sim.inject(peer, JoinTopic(measured_topic, Role.SUBSCRIBER), at=at)
    build_end_s = bootstrap_end_s + cfg.membership_window_s + cfg.build_settle_s
    chunks = 20
    for chunk in range(1, chunks + 1):
        sim.run_until(build_end_s * chunk / chunks)
        report("build", chunk, chunks)

    build_by_kind = tuple(sorted(sim.stats.sent_by_kind.items()))
    build_time_s = sim.now
    virtual_nodes = sum(len(getattr(node, "virtual_keys", list)()) for node in sim.nodes.values())
    after_build = _level0_wrong(sim)[0] if cfg.inspect_overlay and system != "scribe" else -1

    # 3. the measured topic: one publisher, subscribers added incrementally (or a fresh topic per count)
    if cfg.measured_order == "incremental":
        measured_topic = f"t{plan_rng.randrange(max(topic_count, 1)):06d}~measured"  # mid key space
        order = list(range(cfg.nodes))
        plan_rng.shuffle(order)
        publisher, candidates = order[0], order[1:]
        tracer = _TableTracer(publisher, measured_topic) if explain else None
        if tracer is not None:
            sim.observers.append(tracer)
        sim.inject(publisher, JoinTopic(measured_topic, Role.PUBLISHER))
        sim.run_for(cfg.step_settle_s)

    samples: list[PathSample] = []
    explanations: list[StepExplanation] = []
    publication_id = 0
    fresh = cfg.measured_order == "fresh"
    for step, count in enumerate(cfg.subscriber_counts, start=1):
        before = dict(sim.stats.sent_by_kind)
        if fresh:  # a new topic per count: its subscribers first, then its publisher
            measured_topic = f"t{plan_rng.randrange(max(topic_count, 1)):06d}~measured{count:05d}"
            order = list(range(cfg.nodes))
            plan_rng.shuffle(order)
            publisher, joining = order[0], order[1 : count + 1]
            if explain:
                if tracer is not None:
                    sim.observers.remove(tracer)
                tracer = _TableTracer(publisher, measured_topic)
                sim.observers.append(tracer)
        else:
            joining = candidates[subscribed:count]
        for index, peer in enumerate(joining):
            at = sim.now + index * cfg.subscriber_spacing_s
            sim.inject(peer, JoinTopic(measured_topic, Role.SUBSCRIBER), at=at)
        subscribed = count
        sim.run_for(len(joining) * cfg.subscriber_spacing_s + cfg.step_settle_s)
        if fresh:
            sim.inject(publisher, JoinTopic(measured_topic, Role.PUBLISHER))
            sim.run_for(cfg.step_settle_s)
        recorder = _DeliveryRecorder(measured_topic)
        sim.observers.append(recorder)
        measured_ids: list[int] = []
        route_sends = 0
        for publish_index in range(cfg.warmup_publishes + cfg.measure_publishes):
            publication_id += 1
            routed_before = sim.stats.sent_by_kind["PUBLISH"]
            sim.inject(publisher, Publish(measured_topic, b"m", publication_id))
            if publish_index >= cfg.warmup_publishes:
                measured_ids.append(publication_id)
            sim.run_for(cfg.publish_gap_s)
            if publish_index >= cfg.warmup_publishes:
                route_sends += sim.stats.sent_by_kind["PUBLISH"] - routed_before
        sim.observers.remove(recorder)
        sample = _summarise(sim, system, table_size, seed, count, recorder, measured_ids, before)
        if not cfg.allow_missed_deliveries and sample.delivered < count:
            message = f"a measured publish reached {sample.delivered} of {count} subscribers"
            raise SimulationError(message, seed=seed, now_s=sim.now)
        if cfg.inspect_overlay and system != "scribe":
            last_hops = dict(recorder.deliveries.get(measured_ids[-1], []))
            sample = replace(sample, **_inspect_overlay(sim, publisher, measured_topic, last_hops))
        if tracer is not None:
            members = list(joining) if fresh else candidates[:count]
            last_id = measured_ids[-1]
            where = (system, table_size, seed, count)
            explanations.append(_explain_step(*where, tracer, recorder, last_id, members, measured_topic))
        samples.append(replace(sample, route_hops=route_sends / len(measured_ids)))
        report("subscribers", step, total_steps)
    if tracer is not None:
        sim.observers.remove(tracer)
    return SeriesResult(samples, build_by_kind, build_time_s, virtual_nodes, explanations, after_build)


def _level0_wrong(sim: Simulator, topic: str = "") -> tuple[int, int, dict[Any, Any], list[Any]]:
    """Live virtual nodes whose level-0 neighbours are not their neighbours in key order (all,
    and those of ``topic``), with the owner of every key and the sorted keys."""
    owner: dict[Any, Any] = {}
    for node in sim.nodes.values():
        for key in node.virtual_keys():  # type: ignore[attr-defined]
            owner[key] = node
    keys = sorted(owner)
    wrong = wrong_topic = 0
    for index, key in enumerate(keys):
        expected = (keys[index - 1] if index else None, keys[index + 1] if index + 1 < len(keys) else None)
        if tuple(owner[key].level0_neighbors(key)) != expected:
            wrong += 1
            wrong_topic += key[0] == topic
    return wrong, wrong_topic, owner, keys


def _inspect_overlay(
    sim: Simulator, publisher: PeerId, topic: str, hops: dict[PeerId, int]
) -> dict[str, Any]:
    """The overlay against the Skip Graph it should be, for ``PathSample`` (inspect_overlay).

    Uses the core's read-only inspection API (virtual_keys, level0_neighbors, table_entries,
    membership_vector). ``hops``: subscriber peer -> hops of the last measured publish.
    """
    wrong, wrong_measured, owner, keys = _level0_wrong(sim, topic)
    pub_key = (topic, int(Role.PUBLISHER), publisher)
    lo, hi = (topic, int(Role.SUBSCRIBER)), (topic, int(Role.SUBSCRIBER) + 1)
    run = [key for key in keys if lo <= key < hi]
    members = [pub_key, *run]  # the publisher is the run's left neighbour (its only publisher)
    mvs = [owner[key].membership_vector(key) for key in members]
    mv_bits = owner[pub_key].config.mv_bits
    # Skip Graph right neighbours inside the run of every member, from the right end leftwards:
    # the level-i neighbour is the nearest member to the right sharing i leading digits
    nearest: dict[tuple[int, int], int] = {}
    neighbours: list[set[Any]] = [set() for _ in members]
    for position in range(len(members) - 1, -1, -1):
        mv = mvs[position]
        found = neighbours[position]
        for level in range(mv_bits + 1):
            prefix = (level, mv & ((1 << level) - 1))
            other = nearest.get(prefix)
            if other is not None:
                found.add(members[other])
            nearest[prefix] = position
    missing = extra = 0
    held_by_publisher = 0
    for position, key in enumerate(members):
        entries = owner[key].table_entries(key)
        start = lo if position == 0 else key
        in_run = {entry for entry in entries if start <= entry < hi and entry != key}
        if position == 0:
            held_by_publisher = len(in_run)
        missing += len(neighbours[position] - in_run)
        extra += len(in_run - neighbours[position])
    depths = sfb_depths(mvs[0], mvs[1:], mv_bits) if run else []
    agree = sum(1 for key, depth in zip(run, depths, strict=True) if hops.get(key[2]) == depth)
    return {
        "level0_wrong": wrong,
        "level0_wrong_measured": wrong_measured,
        "publisher_run_entries": held_by_publisher,
        "publisher_run_neighbours": len(neighbours[0]),
        "run_neighbours_missing": missing,
        "run_entries_extra": extra,
        "model_avg_hops": fmean(depths) if depths else 0.0,
        "model_max_hops": max(depths, default=0),
        "model_agree": agree,
    }


def _summarise(
    sim: Simulator,
    system: str,
    table_size: int | None,
    seed: int,
    count: int,
    recorder: _DeliveryRecorder,
    measured_ids: Sequence[int],
    before: dict[str, int],
) -> PathSample:
    averages: list[float] = []
    maximum = 0
    duplicates = 0
    delivered = 0
    for ident in measured_ids:
        records = recorder.deliveries.get(ident, [])
        if not records:
            raise SimulationError(
                f"publication {ident} reached no subscriber ({count} subscribed)", seed=seed, now_s=sim.now
            )
        first: dict[PeerId, int] = {}
        for peer, hops in records:
            if peer in first:
                duplicates += 1
            else:
                first[peer] = hops
        averages.append(fmean(first.values()))
        maximum = max(maximum, max(first.values()))
        delivered = len(first) if ident == measured_ids[0] else min(delivered, len(first))
    if duplicates:
        message = f"{duplicates} duplicate deliveries at {count} subscribers"
        raise SimulationError(message, seed=seed, now_s=sim.now)
    by_kind = tuple(
        sorted((kind, total - before.get(kind, 0)) for kind, total in sim.stats.sent_by_kind.items())
    )
    return PathSample(
        system=system,
        table_size=table_size,
        seed=seed,
        subscribers=count,
        avg_hops=fmean(averages),
        max_hops=maximum,
        delivered=delivered,
        duplicates=duplicates,
        virtual_time_s=sim.now,
        messages_sent=sim.stats.sent,
        messages_by_kind=by_kind,
    )


# ------------------------------------------------------------------ aggregation and the delay model


def delay_model_ms(
    avg_hops: float,
    subscribers: int,
    *,
    processing_ms: float = 1.0,
    link_ms: float = 10.0,
    children: int = 10,
    per_child_ms: float = 0.1,
) -> float:
    """§4.1 / Fig. 7: estimated delivery delay from the average path length.

    Each hop costs a link (10 ms), the fixed processing of the forwarding node (1 ms) and 0.1 ms
    per child it sends to. In multi-hop delivery a node has ``children`` (10) children; when the
    delivery is single hop (average path 1) the publisher's node sends to all ``subscribers``.
    """
    fan_out = subscribers if avg_hops <= 1.0 else children
    return avg_hops * (link_ms + processing_ms + fan_out * per_child_ms)


def single_broker_delay_ms(
    subscribers: int, *, processing_ms: float = 1.0, per_child_ms: float = 0.1
) -> float:
    """§4.1 reference curve: one broker whose child count is the subscriber count (no broker links)."""
    return processing_ms + subscribers * per_child_ms


def aggregate(samples: Sequence[PathSample]) -> list[AggregatePoint]:
    """Average the runs (seeds) of each (system, L, subscriber count), as §4 does over 3 runs."""
    groups: dict[tuple[str, int | None, int], list[PathSample]] = {}
    for sample in samples:
        groups.setdefault((sample.system, sample.table_size, sample.subscribers), []).append(sample)
    points: list[AggregatePoint] = []
    for (system, table_size, subscribers), runs in sorted(
        groups.items(), key=lambda item: (item[0][0], item[0][1] or 0, item[0][2])
    ):
        avg_hops = fmean(run.avg_hops for run in runs)
        points.append(
            AggregatePoint(
                system=system,
                table_size=table_size,
                subscribers=subscribers,
                seeds=len(runs),
                avg_hops=avg_hops,
                max_hops=fmean(run.max_hops for run in runs),
                min_delivered_fraction=min(run.delivered / run.subscribers for run in runs),
                delay_ms=delay_model_ms(avg_hops, subscribers),
                route_hops=fmean(run.route_hops for run in runs),
                avg_hops_sd=stdev(run.avg_hops for run in runs) if len(runs) > 1 else 0.0,
                max_hops_sd=stdev(run.max_hops for run in runs) if len(runs) > 1 else 0.0,
                model_avg_hops=fmean(run.model_avg_hops for run in runs),
                model_max_hops=fmean(run.model_max_hops for run in runs),
                level0_wrong=fmean(max(run.level0_wrong, 0) for run in runs),
            )
        )
    return points
