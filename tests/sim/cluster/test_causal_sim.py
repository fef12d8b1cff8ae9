"""Causal groups in the whole-cluster simulation (issue #10): a conversation across five brokers
(a publisher, two responders answering what they receive, observers through two topic classes)
checked by an independent vector-clock oracle (``simulation.causal.causal_order``).

Without ``cluster.causal_groups`` the delayed links make observers see answers before what they
answer (the oracle and the scenario can fail, with every fault on too); with ``plant/#`` a causal
group, no seed does, with loss, duplication, reordering, a broker killed and a partition all at
once. By hand, more seeds: ``python -m simulation --seeds 0:1000 --conversation --loss 0.05
--faults crash,partition`` (docs/simulation.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

from simulation.causal import causal_conversation, causal_order, vector_clocks
from simulation.checkers import Acked, History, Received, lost_acknowledged
from simulation.scenario import Result

SEEDS = range(12)
ALL_FAULTS_SEEDS = range(16)


def _all_faults(seed: int, *, causal: bool = True) -> Result:
    """The conversation with every fault at once (``--loss 0.05 --faults crash,partition``)."""
    return causal_conversation(seed, causal=causal, loss=0.05, duplicate=0.05, crash=True, partition=True)


def _publish(history: History, record: Acked) -> None:
    history.published.append(record)
    if record.acked_at is not None:
        history.acked.append(record)


def _conversation() -> History:
    """pub's 1 reaches ans, which answers with its 1; obs gets both."""
    history = History()
    _publish(history, Acked("pub", 1, 1, "plant/q", published_at=1.0, acked_at=1.1))
    history.received.append(Received("ans", "plant/q", "pub", 1, 1, at=1.2, connection=1))
    _publish(history, Acked("ans", 1, 1, "plant/a", published_at=1.3, acked_at=1.4))
    return history


def test_the_oracle_accepts_causal_order_and_reports_an_answer_seen_before_its_question() -> None:
    good = _conversation()
    good.received.append(Received("obs", "plant/q", "pub", 1, 1, at=1.5))
    good.received.append(Received("obs", "plant/a", "ans", 1, 1, at=1.6))
    assert causal_order(good) == []
    bad = _conversation()
    bad.received.append(Received("obs", "plant/a", "ans", 1, 1, at=1.5))
    bad.received.append(Received("obs", "plant/q", "pub", 1, 1, at=1.6))
    violations = causal_order(bad)
    assert [v.kind for v in violations] == ["causal"]
    assert "obs got ans:1:1 before pub:1:1" in violations[0].detail
    # transitively: ans's answer precedes what a second responder answers to it
    bad.received.append(Received("ans2", "plant/a", "ans", 1, 1, at=1.7, connection=1))
    _publish(bad, Acked("ans2", 1, 1, "plant/b", published_at=1.8, acked_at=1.9))
    bad.received.append(Received("obs2", "plant/b", "ans2", 1, 1, at=2.0))
    bad.received.append(Received("obs2", "plant/q", "pub", 1, 1, at=2.1))
    assert any("obs2 got ans2:1:1 before pub:1:1" in v.detail for v in causal_order(bad))
    # outside the group, or another connection of the responder: no order asked
    assert causal_order(bad, group_filters=("other/#",)) == []


def test_the_oracle_orders_by_what_the_clients_did_unacknowledged_publishes_and_ties_included() -> None:
    # ans's answer lost its PUBACK (its broker crashed): still published after pub's 1 was seen
    history = History()
    _publish(history, Acked("pub", 1, 1, "plant/q", published_at=1.0, acked_at=1.1, step=1))
    history.received.append(Received("ans", "plant/q", "pub", 1, 1, at=1.2, connection=1, step=2))
    _publish(history, Acked("ans", 1, 1, "plant/a", published_at=1.2, acked_at=None, step=3))
    assert vector_clocks(history)[("ans", 1, 1)] == {("pub", 1): 1}
    history.received.append(Received("obs", "plant/a", "ans", 1, 1, at=1.5, step=4))
    history.received.append(Received("obs", "plant/q", "pub", 1, 1, at=1.6, step=5))
    assert [v.kind for v in causal_order(history)] == ["causal"]
    # the same instant, but the publish came first (its step): nothing precedes it
    history.received[0] = replace(history.received[0], step=4)
    assert vector_clocks(history)[("ans", 1, 1)] == {}
    assert causal_order(history) == []
    # a receipt on an older connection of the responder orders nothing on its next one
    history.received[0] = replace(history.received[0], connection=0, step=2)
    assert causal_order(history) == []


def test_without_causal_groups_the_conversation_breaks_causal_order() -> None:
    results = [causal_conversation(seed, causal=False) for seed in range(3)]
    assert all(any(v.kind == "causal" for v in r.violations) for r in results)
    assert not [v for r in results for v in r.violations if v.kind != "causal"]


def test_without_causal_groups_the_oracle_reports_violations_with_every_fault_on() -> None:
    results = [_all_faults(seed, causal=False) for seed in range(3)]
    assert all(any(v.kind == "causal" for v in r.violations) for r in results)


def test_the_command_fails_naming_causal_violations_without_the_group() -> None:
    command = [sys.executable, "-m", "simulation", "--seed", "0", "--conversation", "--no-causal-groups"]
    command += ["--loss", "0.05", "--faults", "crash,partition", "--trace", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "  causal: " in done.stdout
    assert "--duplicate 0.05 --reorder 0.3 --faults crash,partition --no-causal-groups" in done.stdout


def test_a_causal_group_keeps_causal_order_at_every_observer() -> None:
    results = [causal_conversation(seed) for seed in SEEDS]
    assert [r.report(0) for r in results if r.violations] == []
    assert sum(len(r.history.received) for r in results) > 3000


def test_a_causal_group_loses_nothing_and_keeps_causal_order_with_every_fault_at_once() -> None:
    """Loss 5 %, duplication 5 %, reordering 30 % on every link, a broker killed and restarted
    and two brokers cut off and healed, in every run."""
    results = [_all_faults(seed) for seed in ALL_FAULTS_SEEDS]
    assert [r.report(0) for r in results if r.violations] == []
    for r in results:  # every fault did happen
        assert r.network is not None
        assert min(r.network.lost, r.network.duplicated, r.network.reordered, r.network.partitioned) > 0
        kinds = {event[1] for event in r.history.events}
        assert {"crash", "partition", "heal"} <= kinds
    assert sum(1 for r in results for a in r.history.acked) >= 16 * 60


def test_the_checks_are_live_on_a_real_conversation() -> None:
    """On a real run's history: one acknowledged message taken from an observer is reported
    lost, and two of its receipts swapped are reported as a causal violation."""
    history = _all_faults(2).history
    assert lost_acknowledged(history) == [] and causal_order(history) == []
    answer = next(a for a in history.acked if a.publisher == "answer1")
    question = vector_clocks(history)[(answer.publisher, answer.epoch, answer.seq)]
    assert question  # the answer follows a question
    mine = [r for r in history.received if r.subscriber == "watch-exact"]
    got_answer = next(
        r for r in mine if (r.publisher, r.epoch, r.seq) == (answer.publisher, answer.epoch, answer.seq)
    )
    got_question = next(r for r in mine if r.seq <= question.get((r.publisher, r.epoch), 0))
    dropped = replace(history, received=[r for r in history.received if r is not got_answer])
    assert [v.kind for v in lost_acknowledged(dropped)] == ["lost"]
    swapped = [
        replace(r, at=got_answer.at, step=got_answer.step)
        if r is got_question
        else replace(r, at=got_question.at, step=got_question.step)
        if r is got_answer
        else r
        for r in history.received
    ]
    assert any(
        "watch-exact got answer1" in v.detail for v in causal_order(replace(history, received=swapped))
    )
