"""Tests of the paper-experiment functions (overlay/sim/experiment.py) and the sweep CLI's helpers."""

from __future__ import annotations

import importlib.util
import random
import sys
from dataclasses import asdict, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from overlay.config import OverlayConfig
from overlay.sim.engine import SimulationError
from overlay.sim.experiment import (
    ExperimentConfig,
    PathSample,
    aggregate,
    delay_model_ms,
    make_node_factory,
    run_series,
    single_broker_delay_ms,
    system_label,
)
from overlay.sim.scribe import ScribeNode


def load_sweep() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "bench" / "paper_sweep.py"
    spec = importlib.util.spec_from_file_location("paper_sweep", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["paper_sweep"] = module
    spec.loader.exec_module(module)
    return module


def sample(system: str, size: int | None, seed: int, count: int, avg: float, top: int) -> PathSample:
    return PathSample(system, size, seed, count, avg, top, count, 0, 0.0, 0, ())


def test_delay_model_follows_section_4_1() -> None:
    # single hop: one link + 1 ms + 0.1 ms per subscriber (the publisher sends to all)
    assert delay_model_ms(1.0, 10) == pytest.approx(10 + 1 + 1.0)
    assert delay_model_ms(1.0, 80) == pytest.approx(10 + 1 + 8.0)
    # multi-hop: every hop costs 10 + 1 + 10 * 0.1 ms
    assert delay_model_ms(3.0, 5120) == pytest.approx(3 * 12.0)
    assert single_broker_delay_ms(10) == pytest.approx(2.0)
    assert single_broker_delay_ms(5120) == pytest.approx(513.0)
    # the paper's qualitative claims of Fig. 7 hold for the model itself
    assert delay_model_ms(6.0, 10) > single_broker_delay_ms(10)  # multi-hop loses at few subscribers
    assert delay_model_ms(8.0, 5120) < single_broker_delay_ms(5120)  # and wins at many


def test_aggregate_means_over_seeds() -> None:
    points = aggregate(
        [
            sample("sgtbps", None, 1, 10, 2.0, 4),
            sample("sgtbps", None, 2, 10, 3.0, 6),
            sample("proposed", 60, 1, 10, 1.0, 1),
        ]
    )
    assert [(p.system, p.subscribers, p.seeds) for p in points] == [("proposed", 10, 1), ("sgtbps", 10, 2)]
    assert points[1].avg_hops == pytest.approx(2.5) and points[1].max_hops == pytest.approx(5.0)
    assert points[1].delay_ms == pytest.approx(delay_model_ms(2.5, 10))
    assert system_label("proposed", 60) == "proposed L=60" and system_label("sgtbps", None) == "SG-TBPS"


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="subscriber_counts"):
        ExperimentConfig(nodes=100, subscriber_counts=(20, 10))
    with pytest.raises(ValueError, match=r"1\.\.nodes-1"):
        ExperimentConfig(nodes=100, subscriber_counts=(10, 100))
    with pytest.raises(ValueError, match="unknown system"):
        make_node_factory("chord", None, ExperimentConfig(nodes=100, subscriber_counts=(10,)))
    with pytest.raises(ValueError, match="table size"):
        make_node_factory("proposed", None, ExperimentConfig(nodes=100, subscriber_counts=(10,)))


def test_scribe_series_reaches_every_subscriber() -> None:
    cfg = ExperimentConfig(nodes=400, subscriber_counts=(10, 40, 160), step_settle_s=5.0, build_settle_s=20.0)
    result = run_series("scribe", None, 3, cfg)
    assert [s.subscribers for s in result.samples] == [10, 40, 160]
    for s in result.samples:
        assert s.delivered == s.subscribers and s.duplicates == 0
        assert 2.0 <= s.avg_hops <= s.max_hops <= 10
        assert 1.0 <= s.route_hops < s.avg_hops  # publisher -> root, then down the tree
    kinds = dict(result.build_messages_by_kind)
    assert kinds["JOIN"] >= 399 and kinds["SUBSCRIBE"] > 0


def test_a_series_fails_loudly_with_the_seed_when_nothing_is_delivered() -> None:
    class Deaf(ScribeNode):
        def _on_multicast(self, message: object, out: list[object]) -> None:  # type: ignore[override]
            return

    cfg = ExperimentConfig(nodes=60, subscriber_counts=(10,), step_settle_s=2.0, build_settle_s=10.0)
    with pytest.raises(SimulationError, match=r"reached no subscriber.*seed=5"):
        run_series("scribe", None, 5, cfg, factory=lambda peer, rng: Deaf(peer, rng=rng))


def test_sweep_cli_pieces(tmp_path: Path) -> None:
    sweep = load_sweep()
    tasks = sweep.build_tasks(["proposed", "sgtbps", "scribe"], [60, 120], 2)
    assert len(tasks) == 8 and tasks[0] == ("proposed", 120, 1)
    points = aggregate(
        [sample("proposed", 120, 1, c, 1.0, 1) for c in (10, 20, 40, 80)]
        + [sample("proposed", 120, 1, 160, 1.5, 3)]
        + [sample("proposed", 60, 1, c, 1.0, 1) for c in (10, 80)]
        + [sample("proposed", 60, 1, 160, 2.0, 4)]
        + [sample("sgtbps", None, 1, c, 3.6, 7) for c in (10, 80, 160)]
    )
    rows = {paper: (ours, verdict) for paper, ours, verdict in sweep.comparison(points)}
    single_hop = rows["L=120: single hop up to 80 subscribers"]
    assert single_hop == ("single hop (avg = max = 1) up to 80", "matches")
    assert rows["L=60: reduction vs SG-TBPS 63-77 % at <= 80 subscribers"][0] == "72-72 %"
    assert rows["L=60: reduction vs SG-TBPS 22-47 % at >= 160 subscribers"] == ("44-44 %", "matches")
    files = sweep.plot(tmp_path, points, " (test)")
    assert [f.name for f in files] == ["fig5_avg_path.png", "fig6_max_path.png", "fig7_delay.png"]
    assert all(f.stat().st_size > 10_000 for f in files)
    with pytest.raises(SystemExit, match="unknown"):
        sweep.main(["--systems", "chord", "--out", str(tmp_path)])
    options = sweep.parse_scribe_options(["publish_mode=tree", "leaf_half=4", "announce=false"])
    assert options == (("publish_mode", "tree"), ("leaf_half", 4), ("announce", False))
    with pytest.raises(SystemExit, match="ScribeConfig field"):
        sweep.parse_scribe_options(["fanout=3"])
    with pytest.raises(SystemExit, match="publish_mode"):
        sweep.parse_scribe_options(["publish_mode=flood"])
    assert ("join_verify_rounds", 1) in sweep.SWEEP_SGTBPS_OPTIONS
    assert "join_verify_rounds" not in dict(sweep.SWEEP_OVERLAY_OPTIONS)


def test_baseline_only_options_reach_only_the_baseline() -> None:
    cfg = ExperimentConfig(
        nodes=100,
        subscriber_counts=(10,),
        overlay_options=(("rexp_interval_s", 600.0),),
        sgtbps_overlay_options=(("join_verify_rounds", 3), ("rexp_interval_s", 5.0)),
    )
    rng = random.Random(1)
    baseline: Any = make_node_factory("sgtbps", None, cfg)(1, rng)
    proposed: Any = make_node_factory("proposed", 60, cfg)(1, rng)
    default_rounds = OverlayConfig().join_verify_rounds
    assert baseline.config.join_verify_rounds == 3 and proposed.config.join_verify_rounds == default_rounds
    assert baseline.config.rexp_interval_s == 600.0  # overlay_options (the command line) win


QUIET = (("rexp_interval_s", 600.0), ("ping_interval_s", 300.0), ("failure_timeout_s", 900.0))
PLAIN_REASONS = ("never learned", "known, reached via another node", "removed (not by filtering)")


def test_explain_accounts_for_every_subscriber_of_every_step() -> None:
    """paper_sweep --explain: per step, the publisher's table and why each subscriber that was
    not reached in one hop is not (issue #18)."""
    cfg = ExperimentConfig(
        nodes=150,
        subscriber_counts=(3, 12),
        explain=True,
        overlay_options=QUIET,
    )
    result = run_series("proposed", 6, 1, cfg)
    assert [e.subscribers for e in result.explanations] == [3, 12]
    for step, explanation in zip(result.samples, result.explanations, strict=True):
        assert explanation.one_hop + len(explanation.missing) == step.subscribers
        assert explanation.table_entries <= 6
        assert explanation.sub_entries == sum(explanation.sub_by_level)
        assert explanation.table_entries == explanation.sub_entries + sum(explanation.nonsub_by_level)
        assert explanation.known >= explanation.one_hop
        for _, why in explanation.missing:
            assert why in PLAIN_REASONS or why.startswith("evicted: "), why
    # 12 subscribers cannot all fit in a table of 6: some are evicted by a named proposition
    last = result.explanations[-1]
    assert last.missing and any(why.startswith("evicted: B") for _, why in last.missing), last.reasons()
    report = load_sweep().explain_markdown([asdict(e) for e in result.explanations])
    assert "| proposed L=6 seed 1 | 12 |" in report
    # the other systems are not traced
    assert run_series("sgtbps", None, 1, replace_subscribers(cfg, (3,))).explanations == []


def replace_subscribers(cfg: ExperimentConfig, counts: tuple[int, ...]) -> ExperimentConfig:
    return replace(cfg, subscriber_counts=counts)


def test_a_series_stops_when_a_publish_misses_a_subscriber() -> None:
    """A measured publish reaching only some subscribers is an error (the average would be over
    the reached ones only); allow_missed_deliveries reports it in ``delivered`` instead."""

    class HalfDeaf(ScribeNode):  # odd peers never deliver
        def _on_multicast(self, message: Any, out: list[Any]) -> None:  # type: ignore[override]
            if self.peer_id % 2:
                self._subscribed.discard(message.topic)
            super()._on_multicast(message, out)

    cfg = ExperimentConfig(nodes=80, subscriber_counts=(10,), step_settle_s=2.0, build_settle_s=10.0)
    factory = lambda peer, rng: HalfDeaf(peer, rng=rng)  # noqa: E731
    with pytest.raises(SimulationError, match=r"reached \d of 10 subscribers.*seed=5"):
        run_series("scribe", None, 5, cfg, factory=factory)
    result = run_series("scribe", None, 5, replace(cfg, allow_missed_deliveries=True), factory=factory)
    (step,) = result.samples
    assert 0 < step.delivered < 10


@pytest.mark.parametrize("seed", [1, 2])
def test_a_converged_sgtbps_run_is_the_idealised_model_subscriber_by_subscriber(seed: int) -> None:
    """With its periodic REXP (§3.5.5, the core's default period) the SG-TBPS baseline's tables are
    the Skip Graph's: the inspection finds no wrong level-0 link, no missing or extra in-run entry,
    and every subscriber at exactly the hops of overlay.sim.sfb_model on the run's own vectors."""
    cfg = ExperimentConfig(nodes=120, subscriber_counts=(6, 25), step_settle_s=40.0, build_settle_s=40.0)
    result = run_series("sgtbps", None, seed, cfg)
    for step in result.samples:
        assert step.delivered == step.subscribers
        assert step.level0_wrong == 0 and step.level0_wrong_measured == 0
        assert step.run_neighbours_missing == 0 and step.run_entries_extra == 0
        assert step.publisher_run_entries == step.publisher_run_neighbours >= 1
        assert step.model_agree == step.subscribers
        assert step.avg_hops == pytest.approx(step.model_avg_hops)
        assert step.max_hops == step.model_max_hops


def test_inspection_counts_a_broken_level0_list() -> None:
    """Without the join re-search and with the periodic REXP slowed down, a burst of joins leaves
    level-0 links wrong; the inspection counts them (it is not vacuous)."""
    cfg = ExperimentConfig(
        nodes=300,
        subscriber_counts=(5,),
        membership_window_s=2.0,
        build_settle_s=3.0,
        step_settle_s=5.0,
        overlay_options=(*QUIET, ("join_verify_rounds", 0)),  # the re-search is the core's default
        allow_missed_deliveries=True,
    )
    broken = run_series("sgtbps", None, 2, cfg)
    (step,) = broken.samples
    assert step.level0_wrong > 100 and step.delivered < step.subscribers
    assert broken.level0_wrong_after_build >= step.level0_wrong
    # the same burst, given time, is repaired (the count is not stuck either)
    (settled,) = run_series("sgtbps", None, 2, replace(cfg, build_settle_s=10.0, step_settle_s=10.0)).samples
    assert settled.level0_wrong == 0 and settled.delivered == settled.subscribers


def test_a_sweep_checkpoints_each_finished_run(tmp_path: Path) -> None:
    """paper_sweep keeps the runs finished so far in a file --from-raw reads (a long sweep stopped
    part-way keeps them)."""
    sweep = load_sweep()
    cfg = ExperimentConfig(nodes=120, subscriber_counts=(5,), step_settle_s=5.0, build_settle_s=10.0)
    checkpoint = tmp_path / "partial.json"
    samples, info = sweep.run_sweep([("scribe", None, 1), ("scribe", None, 2)], cfg, 1, checkpoint)
    assert len(samples) == 2 and len(info["timings"]) == 2
    saved, saved_info = sweep.load_raw([checkpoint])
    assert saved == samples and saved_info["partial"] is True
    assert sorted(t["seed"] for t in saved_info["timings"]) == [1, 2]
