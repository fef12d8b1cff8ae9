"""A slow subscriber beside a fast one on the same broker and class (docs/cluster.md "Flow
control"), default limits, no fault: the live stream is never held back for the slow one. The
fast subscriber gets every PUBACKed message; the slow one (a quarter of the publish rate) drops by
its queue policy (``queue_full_oldest``), counted by its broker, and gets the rest. Its latency
figures are a benchmark's (bench/), not a test's."""

from __future__ import annotations

from simulation.checkers import lost_acknowledged
from simulation.scenario import slow_beside_fast


def test_the_fast_one_loses_nothing_and_the_slow_one_drops_by_policy_counted() -> None:
    result, run = slow_beside_fast()
    history = result.history
    acked = [record for record in history.acked if record.acked_at is not None]
    assert len(acked) == 3000
    lost = lost_acknowledged(history)
    assert not [v for v in lost if "never reached fast" in v.detail]
    slow_lost = [v for v in lost if "never reached slow" in v.detail]
    assert slow_lost, "a subscriber at a quarter of the publish rate must overflow its queue"
    broker = run.brokers[run.peer_ids[1]].broker
    assert broker.stats.messages_dropped["queue_full_oldest"] == len(slow_lost)
    slow_got = {(r.publisher, r.epoch, r.seq) for r in history.received if r.subscriber == "slow"}
    assert len(slow_got) + len(slow_lost) == 3000
