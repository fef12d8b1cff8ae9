"""Catch-up paced by the subscribers (docs/cluster.md "Flow control"), in the whole-cluster
simulation with the default limits and a subscriber that drains at a finite rate.

kill -9 of the subscriber's broker under a 2,000 msg/s QoS 1 stream that goes on after the
restart; the subscriber drains 4,000 msg/s; ``limits.max_queued_messages`` is the default (1,000,
drop oldest). Before the flow control the restarted broker released everything it had held behind
the gap at once into the session queue: 1,363 of 6,000 PUBACKed messages lost (this scenario on the
code before the change, 2026-11-28). Now none.
"""

from __future__ import annotations

import collections

from simulation.scenario import known_restart_under_a_fast_stream, session_move_under_a_fast_stream


def test_a_restart_under_a_fast_stream_loses_nothing_with_the_default_queue_limit() -> None:
    result = known_restart_under_a_fast_stream()
    history = result.history
    assert len([record for record in history.acked if record.acked_at is not None]) == 6000
    assert result.ok, result.report()
    received = collections.Counter((r.publisher, r.epoch, r.seq) for r in history.received)
    assert len(received) == 6000
    # QoS 1 may repeat what was in flight at the crash, not the backlog
    assert sum(count - 1 for count in received.values()) <= 100


def test_a_session_that_moves_under_a_fast_stream_loses_nothing_with_the_default_queue_limit() -> None:
    """The subscriber is away 3 s (6,000 messages at 2,000 msg/s, six times its queue limit) while
    its session moves from B to C. Before B held the live stream for its session (all its sessions
    of the class away), B dropped 3,004 of 8,000 by queue policy while the client was away; now
    nothing is dropped anywhere and nothing is lost; QoS 1 may repeat what was in flight only."""
    result, run = session_move_under_a_fast_stream()
    history = result.history
    acked = {(r.publisher, r.epoch, r.seq) for r in history.acked if r.acked_at is not None}
    assert len(acked) == 8000
    assert result.ok, result.report()
    received = collections.Counter((r.publisher, r.epoch, r.seq) for r in history.received)
    assert acked <= set(received)
    assert sum(count - 1 for count in received.values()) <= 100
    for peer_id, sim_broker in run.brokers.items():
        assert sim_broker.broker.stats.messages_dropped["queue_full_oldest"] == 0, peer_id


def test_a_session_that_moves_to_the_publishers_broker_after_a_long_absence_loses_nothing() -> None:
    """The same move, but to A, the publisher's broker, with the stream going on while the client
    is away (2,000 msg/s, 4,000 messages, away 3 s): A catches the session up from its own send
    log at once. Before, they entered a queue of 1,000 (drop oldest): 988 of 4,000 lost, all
    counted ``queue_full_oldest`` on A (2,988 of 8,000 with the stream above); now the session
    takes them whole, as a merged session's queue (``BrokerApi.allow_backlog``): 0 lost, no
    queue-policy drop anywhere."""
    result, run = session_move_under_a_fast_stream(messages=4000, to_publishers_broker=True)
    history = result.history
    acked = {(r.publisher, r.epoch, r.seq) for r in history.acked if r.acked_at is not None}
    assert len(acked) == 4000
    assert result.ok, result.report()
    received = collections.Counter((r.publisher, r.epoch, r.seq) for r in history.received)
    assert acked <= set(received)
    assert sum(count - 1 for count in received.values()) <= 100
    for peer_id, sim_broker in run.brokers.items():
        assert sim_broker.broker.stats.messages_dropped["queue_full_oldest"] == 0, peer_id
