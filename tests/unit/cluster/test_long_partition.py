"""Long partitions (longer than the 10 s after which a cut link is declared down) combined with
crashes: scripted tests of the causes ``python -m simulation --faults crash,long-partition
--loss 0.05`` found (issue #10), each naming the seed that showed it."""

from __future__ import annotations

from broker.cluster.messages import StreamPosition
from broker.cluster.store_port import MemoryClusterStore
from broker.cluster.stream_sender import Forget, ReceiverAt, Republish, StreamSender
from broker.core.session import Message


def _sender(origin: str, subscribers: dict[str, list[str]]) -> StreamSender:
    return StreamSender(
        origin,
        retransmit_s=1.0,
        retention_s=3600.0,
        presence_grace_s=2.0,
        min_retention_s=10.0,
        receivers_of=lambda cls: subscribers.get(cls, []),
    )


def test_a_new_streams_receivers_survive_a_restart_of_the_sender() -> None:
    """Seed 59 (crash,long-partition): B subscribed "=plant" and was then cut off alone; C's
    publishers published (PUBACKed), and C started its stream with B as a receiver it knew of by
    interest only - in memory. C crashed and restarted: its restored log had A alone as a receiver,
    A acknowledged, and 10 s later the messages were freed while B was still cut off; after the
    heal (24 s later) B never got them. The receivers a stream starts with are now written with
    its first message, so the restarted sender keeps the log for B."""
    store = MemoryClusterStore()
    c = _sender("c:1/one", {"=plant": ["a:1", "b:1"]})
    for index in range(3):
        forwarded = c.append("=plant", Message("plant/a/temp", b"%d" % index, qos=1), now=4.0)
        store.log_append(forwarded)
        for action in c.take_new_receivers():  # what the engine writes in the same commit
            assert isinstance(action, ReceiverAt)
            store.set_receiver(action.key, action.peer, action.next_seq)
    key = ("c:1/one", "=plant")
    assert store.load_receivers() == [(key, "a:1", 1), (key, "b:1", 1)]
    assert c.take_new_receivers() == []  # once

    # kill -9 and restart: a new incarnation, which has heard of nobody's interest yet
    restarted = _sender("c:1/two", {})
    restarted.restore(store.load_log(), store.load_receivers(), now=7.0)
    # its log is published again through the overlay (A's half), which completes it; A acknowledges
    republished = [a for a in restarted.tick(now=7.5) if isinstance(a, Republish)]
    assert [a.forwarded.seq for a in republished] == [1, 2, 3]
    actions: list[object] = []
    for publication_id, action in enumerate(republished):
        restarted.published(publication_id, action.forwarded)
        actions += restarted.done(publication_id, True, now=7.6)
    actions += restarted.acked("a:1", (StreamPosition(*key, 4),), now=8.0)
    assert not [a for a in actions if isinstance(a, Forget)]
    restarted.tick(now=30.0)  # long after min_retention_s: still kept for B
    messages, kept_from = restarted.logged_from(key, 1)
    assert [m.seq for m in messages] == [1, 2, 3] and kept_from == 1
    # B is back after the heal and acknowledges: now they go
    freed = restarted.acked("b:1", (StreamPosition(*key, 4),), now=40.0)
    assert ReceiverAt(key, "b:1", 4) in freed and Forget(key, 4) in freed


def test_the_log_is_kept_for_a_broker_that_is_cut_off_until_it_is_back() -> None:
    """A subscriber broker B the sender never heard subscribe (its ClassInterest was lost with the
    cut) is cut off longer than ``min_retention_s``: the log used to be freed once the reachable
    receivers acknowledged and 10 s passed, and B, back after the heal, never got the messages of
    the split (docs/cluster.md, the Known limit "receiver never heard from"). While a known peer
    is reported down the log keeps what was sent since; B gets it when it is back."""
    down: dict[str, float] = {}
    sender = StreamSender(
        "c:1/one",
        retransmit_s=1.0,
        retention_s=3600.0,
        presence_grace_s=2.0,
        min_retention_s=10.0,
        receivers_of=lambda cls: ["a:1"],
        absent_since=lambda: min(down.values()) if down else None,
    )
    down["b:1"] = 14.0  # cut at 4.0, declared down after the 10 s keep-alive
    key = ("c:1/one", "=plant")
    for index in range(3):
        forwarded = sender.append("=plant", Message("plant/a/temp", b"%d" % index, qos=1), now=15.0)
        sender.published(index, forwarded)
        sender.done(index, True, now=15.1)
    assert not [a for a in sender.acked("a:1", (StreamPosition(*key, 4),), now=16.0) if isinstance(a, Forget)]
    assert not [a for a in sender.tick(now=60.0) if isinstance(a, Forget)]  # 45 s later: kept
    # the heal: B is back, gets the log directly (it was never a receiver of the stream)
    del down["b:1"]
    resent = sender.logged_for("b:1")
    assert [m.seq for a in resent for m in a.resend.messages] == [1, 2, 3]  # type: ignore[attr-defined]
    assert Forget(key, 4) in sender.tick(now=61.0)  # nobody is absent: freed (A has them all)
