"""Seeds of the crash + partition sweep (``--faults crash,partition --loss 0.05``, no session
moves) that broke an invariant, each replayed as a cheap regression of the cause it found
(docs/simulation.md). Replay one with ``python -m simulation --seed N --faults crash,partition
--loss 0.05``.
"""

from __future__ import annotations

import logging

import pytest

from simulation.causal import causal_conversation
from simulation.scenario import run_seed

CRASH_PARTITION = frozenset({"crash", "partition"})


@pytest.mark.parametrize(
    "seed",
    [
        # the first message of a publisher broker's stream, published while every subscriber broker
        # of its class was down or cut off (the rendezvous point reported none): skipped as exhaust
        # data although filter propagation had named the subscriber brokers
        79,
        232,
        # a retained write accepted on a broker cut off by a partition, which then crashed: restarted
        # without the write's version, its anti-entropy digest equalled that of the brokers that
        # never got the write, and the retained values never converged
        117,
        948,
        # the first case again, where the publisher broker had not heard the subscriber broker's
        # ClassInterest (lost) before the partition: announcements are now repeated until answered
        925,
    ],
)
def test_crash_and_partition_seed_keeps_every_invariant(seed: int) -> None:
    result = run_seed(seed, faults=CRASH_PARTITION, loss=0.05)
    assert result.ok, result.report(trace_lines=20)


def test_conversation_seed_311_delivers_what_was_published_after_the_suback() -> None:
    """``python -m simulation --seed 311 --conversation --loss 0.05 --faults crash``: the observer
    broker's ``ClassInterest`` to the responder's broker was lost and the overlay did not reach
    its new subscriber node yet; announcements are now repeated until acknowledged."""
    result = causal_conversation(311, causal=True, loss=0.05, crash=True)
    assert result.ok, result.report(trace_lines=20)


@pytest.mark.parametrize(
    "seed",
    [
        # a broker restarted while cut off from a subscriber broker: its new stream's first message
        # was completed by the overlay's half without it and the second went out with low = 2, so
        # the subscriber dropped the first as stale (the previous incarnation's receivers now count)
        122,
        521,
        # after a heal, republications the unrepaired overlay could not complete held back the
        # direct resend to a receiver that had acknowledged its position (4.5 s, past the quiet)
        24,
        551,
        # a broker's whole interest list (empty, sent when it came back) reached a sender after
        # its later "I subscribe *0:" and erased it: the burst on *0: during the partition was
        # freed without it. Announcements are now ordered ((epoch, version), interest_table)
        50,
    ],
)
def test_conversation_seed_with_every_fault_loses_nothing(seed: int) -> None:
    """``python -m simulation --seed N --conversation --loss 0.05 --faults crash,partition``
    (duplication 5 %, reordering 30 %): failed before the fixes in ``stream_sender`` (seed 50:
    ``interest_table``)."""
    result = causal_conversation(seed, loss=0.05, duplicate=0.05, crash=True, partition=True)
    assert result.ok, result.report(trace_lines=20)


CRASH_LONG_PARTITION = frozenset({"crash", "long-partition"})


@pytest.mark.parametrize(
    "seed",
    [
        # partitions of 12-40 s (subscriber brokers declared down): a publisher broker crashed
        # while a subscriber broker was cut off; the receivers its stream had started with (known
        # by interest only, in memory) were gone after the restart, and the log was freed once the
        # reachable receivers acknowledged, before the heal (lost 11 / 1 / 6 PUBACKed messages)
        59,
        79,
        98,
        # a subscriber broker cut off 12-40 s that the publisher's broker had not heard subscribe
        # the class: the log was freed 10 s after the reachable receivers acknowledged (it is now
        # kept while a peer is reported down)
        818,
    ],
)
def test_crash_and_long_partition_seed_keeps_every_invariant(seed: int) -> None:
    """``python -m simulation --seed N --faults crash,long-partition --loss 0.05``."""
    result = run_seed(seed, faults=CRASH_LONG_PARTITION, loss=0.05)
    assert result.ok, result.report(trace_lines=20)


def test_a_restarted_broker_batches_each_of_its_streams_apart(caplog: pytest.LogCaptureFixture) -> None:
    """Conversation seed 192: after its restart a broker republished its previous incarnation's
    stream beside its new one on the same class in one event-loop iteration; one ForwardedBatch
    held both, and every receiver rejected it (``cluster_message_rejected``; the messages came
    back by RET, late). The outbox now batches per (origin, class)."""
    with caplog.at_level(logging.WARNING):
        result = causal_conversation(192, loss=0.05, duplicate=0.05, crash=True, partition=True)
    assert result.ok, result.report(trace_lines=20)
    mixed = [r.getMessage() for r in caplog.records if "more than one stream" in r.getMessage()]
    assert mixed == []


def test_a_broker_restarted_during_a_partition_loses_no_message_its_overlay_reached_nobody_with() -> None:
    """Conversation seed 145 (found with issue #11's coalesced replies): a broker restarted during
    a partition published a message its overlay view reached nobody with (the publication
    completed), then held the next ones; after the heal they reached a subscriber broker before
    the log's resend of the first, and it was dropped as stale. ``StreamSender._low`` keeps such
    a blind confirmation down while no receiver of the stream is known."""
    result = causal_conversation(145, loss=0.05, duplicate=0.05, crash=True, partition=True)
    assert result.ok, result.report(trace_lines=20)
