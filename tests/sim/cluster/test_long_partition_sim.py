"""A subscriber broker the publisher's broker never heard subscribe, cut off longer than
``cluster.send_log_min_retention_ms`` (issue #10, docs/cluster.md "Known limits" until now): the
messages published during the split reach it after the heal.

B's subscriber gets its SUBACK; B's ``ClassInterest`` never reaches C (lost, then the cut), and B
is cut off alone for 30 s - past the 10 s after which C declares it down and past the send log's
10 s minimum retention. C's publisher publishes meanwhile (PUBACKed); A, the other subscriber
broker, acknowledges. The send log used to free the messages 10 s later; it now keeps what was
sent since a peer went down until that peer is back, and sends it the log then.
"""

from __future__ import annotations

from dataclasses import replace

from broker.cluster.messages import ClassInterest, Envelope
from simulation.scenario import (
    LONG_PARTITION_S,
    SHORT_PARTITION_S,
    Result,
    Run,
    Scenario,
    _subscribe_once,
    random_scenario,
)


def never_heard_from_and_cut_off(seed: int = 1) -> tuple[Result, dict[str, int]]:
    run = Run(seed, Scenario(brokers=3, quiet_s=20.0, title="never heard from, cut off 30 s"))
    a, b, c = run.peer_ids
    run.start_brokers()
    run.add_client("pub", c, persistent=False)
    for client_id, home, at in (("near", a, 2.5), ("far", b, 3.0)):
        run.add_client(client_id, home, persistent=True).on_connack = _subscribe_once("nh/x")
        run.world.at(at, run.connect, client_id)
    run.world.at(2.0, run.connect, "pub")
    seen = {"interest_dropped": 0}

    def b_interest_does_not_reach_c() -> None:
        engine = run.brokers[c].engine
        on_receive = engine.on_receive

        def receive(sender: str, item: object) -> None:
            if (
                sender == b
                and isinstance(item, Envelope)
                and isinstance(item.body, ClassInterest)
                and run.world.now < 40.0
            ):
                seen["interest_dropped"] += 1
                return
            on_receive(sender, item)

        engine.on_receive = receive  # type: ignore[method-assign]

    run.world.at(1.0, b_interest_does_not_reach_c)

    def cut_b_after_its_suback(client: object, topic_filter: str) -> None:
        run.world.after(0.05, run.partition, [b])
        run.world.after(30.0, run.heal)

    run.clients["far"].on_suback = cut_b_after_its_suback  # type: ignore[assignment]
    run.publish_stream("pub", 20, 0.05, 4.0, "nh/x")
    return run.finish(end_s=70.0), seen


def test_a_receiver_never_heard_from_and_cut_off_long_gets_what_was_published_meanwhile() -> None:
    failing = []
    for seed in (1, 2):
        result, seen = never_heard_from_and_cut_off(seed)
        assert seen["interest_dropped"] >= 1, seen
        if not result.ok:
            failing.append(result.report(trace_lines=10))
    assert not failing, "\n".join(failing)


def test_a_long_partition_outlasts_the_partition_notice() -> None:
    """``--faults long-partition``: one partition of 12-40 s virtual time, longer than the 10 s
    after which a cut link is declared down (the sweeps' partitions of 1-5 s never were), with
    quiet time after the heal; the short partitions' draws are unchanged (their seeds replay)."""
    long = random_scenario(7, faults=frozenset({"long-partition"}))
    assert long.partitions == 1 and long.partition_s == LONG_PARTITION_S
    assert LONG_PARTITION_S[0] > long.network.partition_notice_s
    assert long.quiet_s / 2 >= LONG_PARTITION_S[1] + 15.0  # healed before the end's forced heal
    short = random_scenario(7, faults=frozenset({"partition"}))
    assert short.partition_s == SHORT_PARTITION_S and short.quiet_s == 15.0
    assert replace(long, partition_s=SHORT_PARTITION_S, quiet_s=15.0) == short
