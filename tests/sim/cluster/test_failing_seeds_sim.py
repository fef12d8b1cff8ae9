"""Seeds the 1,000-seed sweep with finite clients once failed, kept as regression tests.

``python -m simulation --seeds 0:1000 --faults crash,partition,move --loss 0.05 --finite-clients``
(docs/simulation.md; the default limits: queue 1,000 per session). Each seed runs a few seconds.
Replay one with ``python -m simulation --seed N --faults crash,partition,move --loss 0.05
--finite-clients``; its cause is in docs/notes/recovery.md.
"""

from __future__ import annotations

from simulation.scenario import run_seed

COMBINED = frozenset({"crash", "partition", "move"})


def _run(seed: int):  # type: ignore[no-untyped-def]
    result = run_seed(seed, faults=COMBINED, loss=0.05, finite_clients=True)
    assert result.scenario.drain_per_s, "the subscribers drain at a finite rate"
    return result


def test_seed_166_a_session_replaced_by_one_handed_over_loses_nothing() -> None:
    """sub1 leaves A for C (cut off: a new session there), then comes back to A, whose session
    (offline 3 s, 716 queued) is replaced by C's (473 queued). Before: the import ended A's
    subscriptions, so A left the class and forgot its position in C's stream (held back by the
    paced catch-up) - 114 messages published on C before sub1 subscribed there were never
    delivered; the catch-up from A's own log delivered again what A's session had queued; and
    merging A's queue behind C's dropped 209 by the queue limit."""
    result = _run(166)
    assert result.ok, result.report(trace_lines=20)
    assert len(result.scenario.drain_per_s) == 2


def test_seed_332_order_holds_when_a_session_is_replaced_by_one_handed_over() -> None:
    """Before: sub1 got pub0..2 messages 329-374 again after 374 (per-publisher order): merging the
    replaced session's queue behind the handed-over one dropped 161 of the oldest by the queue
    limit, and what a catch-up brought of them again came behind newer ones."""
    result = _run(332)
    assert result.ok, result.report(trace_lines=20)


def test_seed_955_a_broker_restarted_into_a_partition_keeps_what_it_acknowledged() -> None:
    """Broker 1 restarts on the side of a partition with no subscriber (broker 2 down, 3 cut
    off); pub0 reconnects to it and publishes 51 QoS 1 messages. Before: the restarted broker knew
    no subscriber of their classes (the interest it had been told of went with the crash), skipped
    them as exhaust data (kept 2 s in memory) and, after the heal, delivered none - 65 lost for the
    two subscribers. Now, while a contact it started with has not talked to it, it logs them."""
    result = _run(955)
    assert result.ok, result.report(trace_lines=20)


def test_seed_381_a_position_a_moved_session_brought_survives_a_crash() -> None:
    """sub1's session moves to broker 2, which starts the publisher's stream at the position the
    session brought (``adopt``), paced; nothing is delivered on it before broker 2 is killed.
    Before: the adopted position was never written (positions went to the store only with a
    delivery), so the restarted broker began the stream at its next message and the two messages
    in between came later, from the catch-up an old claim's answer started - after 385 (order)."""
    result = _run(381)
    assert result.ok, result.report(trace_lines=20)


def test_seed_361_a_moved_session_gets_its_connack_and_its_in_flight_messages_first() -> None:
    """sub1's broker (4) is killed with pub2:7 and pub0:7 in flight to it; restarted, it hands the
    session (those two in flight, packet ids 14 and 15) to broker 3, pub0's own broker, where the
    client moved. Broker 3's classes were joined already, so it imported the session and attached
    the connection in one step, and the engine's ``on_client_connected`` caught the session up
    from its own send log inside the attach: 18 PUBLISHes (pub0 8-28, up to the window of 20) went
    out before the CONNACK (MQTT-3.2.0-1) and before the re-sent in-flight pub0:7 - order broken
    (pub0:7 after :28). Now the core tells the cluster a client connected once its CONNACK and
    re-sends are out."""
    result = _run(361)
    assert result.ok, result.report(trace_lines=20)
    moved = [r for r in result.history.received if r.subscriber == "sub1" and r.publisher == "pub0"]
    assert len({r.seq for r in moved}) > 150, "sub1 got pub0's stream after its move"
