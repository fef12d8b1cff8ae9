"""Coalesced replies (issue #11, ``broker/cluster/replies.py``, docs/cluster.md "Replies travel
together"): in the whole-cluster simulation, a subscriber broker answers a paced stream of
forwarded messages with the overlay's per-hop ACK and DONE held for ``cluster.ack_delay_ms`` and
sent together - a handful of sending instants instead of one per message - and nothing the
publisher's broker acknowledged is lost (the simulation's checkers), also with message loss.

The network's ``transmit`` is wrapped to record what each broker hands to it and when (virtual
time); the brokers, cores, overlay and SQLite stores are the real ones.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from overlay.messages import ACK, DONE, PUB
from simulation.network import NetworkConfig
from simulation.scenario import Run, Scenario, SimClient, _subscribe_once

MESSAGES = 100
INTERVAL_S = 0.005  # 200 msg/s: each forwarded message goes out alone (no batch)


def _run(seed: int, settings: dict[str, Any], loss: float = 0.0) -> tuple[Run, dict[str, list[float]], Any]:
    network = NetworkConfig(loss_rate=loss)
    scenario = Scenario(
        brokers=2, quiet_s=8.0, network=network, settings=tuple(settings.items()), title="paced stream A -> B"
    )
    run = Run(seed, scenario)
    a, b = run.peer_ids
    sent: dict[str, list[float]] = defaultdict(list)  # kind -> virtual times B sent it to A
    transmit = run.network.transmit

    def recording(src: Any, dest: str, item: object) -> None:
        if src.peer_id == b and dest == a and isinstance(item, ACK | DONE | PUB):
            sent[type(item).__name__].append(run.world.now)
        elif src.peer_id == a and dest == b and isinstance(item, PUB):
            sent["PUB to B"].append(run.world.now)
        transmit(src, dest, item)

    run.network.transmit = recording  # type: ignore[method-assign]
    run.start_brokers()
    run.add_client("pub", a, persistent=False)
    subscriber = run.add_client("sub", b, persistent=True)
    subscriber.on_connack = _subscribe_once("paced/x")

    def on_suback(_client: SimClient, _filter: str) -> None:
        run.publish_stream("pub", MESSAGES, INTERVAL_S, run.world.now + 0.5, "paced/x")

    subscriber.on_suback = on_suback
    run.world.at(2.0, run.connect, "pub")
    run.world.at(3.0, run.connect, "sub")
    result = run.finish(end_s=15.0)
    return run, sent, result


@pytest.mark.parametrize("loss", [0.0, 0.05])
def test_a_subscriber_broker_answers_a_paced_stream_in_a_few_batches_and_loses_nothing(loss: float) -> None:
    _, sent, result = _run(1, {}, loss)
    assert result.ok, result.report(trace_lines=10)
    forwarded = len(sent["PUB to B"])
    assert forwarded >= MESSAGES * 0.9, f"only {forwarded} PUBs reached the overlay for {MESSAGES} messages"
    replies = sent["ACK"] + sent["DONE"]
    assert len(replies) >= forwarded  # every PUB answered (ACK and DONE each)
    instants = len(set(replies))
    # 100 messages over 0.5 s, replies held 20 ms: about 25 sending instants (the per-hop ACKs of the
    # 1 in 64 PUBs whose round trip is timed go at once); one per message before the change
    assert instants <= forwarded // 2, f"replies left at {instants} instants for {forwarded} PUBs"


def test_with_ack_delay_0_every_reply_goes_at_once() -> None:
    """``cluster.ack_delay_ms = 0`` keeps the old behaviour: the counter-check that the bound
    above measures the hold."""
    _, sent, result = _run(1, {"cluster.ack_delay_ms": 0})
    assert result.ok, result.report(trace_lines=10)
    forwarded = len(sent["PUB to B"])
    assert len(set(sent["ACK"] + sent["DONE"])) >= forwarded * 0.9
