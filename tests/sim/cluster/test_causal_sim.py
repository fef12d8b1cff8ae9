"""Causal groups in the whole-cluster simulation (issue #10): a conversation across five brokers
(a publisher, two responders answering what they receive, observers through two topic classes)
checked by an independent vector-clock oracle (``simulation.causal.causal_order``).

Without ``cluster.causal_groups`` the delayed links make observers see answers before what they
answer (the oracle and the scenario can fail); with ``plant/#`` a causal group, no seed does, with
loss and a broker killed mid-conversation too. By hand, more seeds:
``python -c "from simulation.causal import causal_conversation as c; ..."`` (docs/causal.md).
"""

from __future__ import annotations

from simulation.causal import causal_conversation, causal_order
from simulation.checkers import Acked, History, Received

SEEDS = range(12)


def _conversation() -> History:
    """pub's 1 reaches ans, which answers with its 1; obs gets both."""
    history = History()
    history.acked.append(Acked("pub", 1, 1, "plant/q", published_at=1.0, acked_at=1.1))
    history.received.append(Received("ans", "plant/q", "pub", 1, 1, at=1.2, connection=1))
    history.acked.append(Acked("ans", 1, 1, "plant/a", published_at=1.3, acked_at=1.4))
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
    bad.acked.append(Acked("ans2", 1, 1, "plant/b", published_at=1.8, acked_at=1.9))
    bad.received.append(Received("obs2", "plant/b", "ans2", 1, 1, at=2.0))
    bad.received.append(Received("obs2", "plant/q", "pub", 1, 1, at=2.1))
    assert any("obs2 got ans2:1:1 before pub:1:1" in v.detail for v in causal_order(bad))
    # outside the group, or another connection of the responder: no order asked
    assert causal_order(bad, group_filters=("other/#",)) == []


def test_without_causal_groups_the_conversation_breaks_causal_order() -> None:
    results = [causal_conversation(seed, causal=False) for seed in range(3)]
    assert all(any(v.kind == "causal" for v in r.violations) for r in results)
    assert not [v for r in results for v in r.violations if v.kind != "causal"]


def test_a_causal_group_keeps_causal_order_at_every_observer() -> None:
    results = [causal_conversation(seed) for seed in SEEDS]
    assert [r.report(0) for r in results if r.violations] == []
    assert sum(len(r.history.received) for r in results) > 3000


def test_a_causal_group_keeps_causal_order_with_loss_and_a_broker_killed() -> None:
    results = [causal_conversation(seed, loss=0.05, crash=True) for seed in SEEDS]
    assert [r.report(0) for r in results if r.violations] == []
