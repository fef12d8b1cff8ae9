"""Review of issue #4: the cluster runtime (broker/cluster/runtime.py; docs/cluster.md "Forwarding,
order and duplicates", "Retained messages", clean shutdown).

A real clustered broker (real gRPC listener, no peers) with real MQTT clients; the tests hand the
runtime what the overlay would (Deliver actions, forwarded messages, retained updates).

* the first message of a stream that arrives is not necessarily its earliest: an earlier one that
  arrives after it is delivered, not dropped as a duplicate.
* a local retained publish after a remote update stamped by a clock running ahead still wins
  everywhere (its version is above every version this broker has seen for the topic).
* nothing is delivered by the runtime after ``stop()`` (reorder-hold timers are cancelled).
* an action that fails does not drop the actions after it (a DONE or a delivery behind it).
* a ClaimReply counts for the broker that wrote it (envelope orig), not the link it came over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from tests.support.core import RawClient, start_broker

from broker.cluster.messages import ClaimReply, Envelope, ForwardedMessage, RetainedUpdate
from broker.cluster.runtime import _Claim
from broker.mqtt.session import Message
from broker.server import ThreadedBroker
from overlay import api

__all__ = ["start_broker"]  # the fixture
Start = Callable[..., ThreadedBroker]


def _clustered(start: Start, hold_ms: int = 10_000) -> ThreadedBroker:
    return start(
        cluster__enabled=True, cluster__port=0, cluster__host="127.0.0.1", cluster__reorder_hold_ms=hold_ms
    )


def _forward(threaded: ThreadedBroker, origin: str, seqs: list[int], stream: str = "=order") -> None:
    runtime = threaded.server.cluster
    for seq in seqs:
        message = Message("order/t", str(seq).encode(), qos=1, origin="elsewhere", publisher_id="p")
        threaded.call(runtime._receive_forwarded, ForwardedMessage(origin, stream, seq, message), 1)


def _received(client: RawClient, count: int) -> list[int]:
    got = []
    for _ in range(count):
        packet = client.expect_publish()
        got.append(int(packet.payload))
        client.ack(packet)
    return got


def test_an_earlier_message_arriving_after_the_first_of_its_stream_is_delivered(start_broker: Start) -> None:
    threaded = _clustered(start_broker)
    client = RawClient(threaded.ports["tcp"])
    client.connect("late-first")
    client.subscribe("order/#", 1)
    _forward(threaded, "peer-a/1", [5])  # overtook 4 (a one-hop / multi-hop switch)
    _forward(threaded, "peer-a/1", [4])
    _forward(threaded, "peer-a/1", [4, 5])  # retransmissions: dropped
    _forward(threaded, "peer-a/1", [6])
    assert _received(client, 3) == [5, 4, 6]
    client.expect_nothing()
    assert threaded.server.cluster.stats.duplicates_dropped == 2


def test_a_local_retained_publish_wins_over_a_remote_one_from_a_clock_ahead(start_broker: Start) -> None:
    threaded = _clustered(start_broker)
    runtime = threaded.server.cluster
    ahead_ms = time.time_ns() // 1_000_000 + 60_000  # the other broker's clock runs a minute ahead
    remote = Message("cfg/x", b"remote", qos=0, retain=True, origin="elsewhere")
    threaded.call(runtime._apply_retained, RetainedUpdate("peer-z:1", ahead_ms, remote))
    publisher = RawClient(threaded.ports["tcp"])
    publisher.connect("retainer")
    publisher.publish_acked("cfg/x", b"local", qos=1, retain=True)
    # this broker now holds "local"; the update it sent must beat "remote" on every other broker
    version = threaded.call(lambda: runtime._retained_versions["cfg/x"])
    assert version > (ahead_ms, "peer-z:1")
    assert version[1] == runtime.peer_id
    stored = threaded.call(lambda: threaded.broker.retained.get("cfg/x"))
    assert stored is not None and stored.payload == b"local"


def test_two_retained_publishes_in_one_millisecond_get_increasing_versions(start_broker: Start) -> None:
    """The earlier write is stamped with a millisecond that has not passed yet (as when a set and a
    delete happen within one millisecond): the later write must still get a higher version, or
    other brokers would keep "set" after the delete. Deterministic: no reliance on timing."""
    threaded = _clustered(start_broker)
    runtime = threaded.server.cluster

    def publish_after_a_write_in_this_millisecond() -> tuple[tuple[int, str], tuple[int, str]]:
        earlier = (time.time_ns() // 1_000_000 + 5, runtime.peer_id)
        runtime._retained_versions["fast/x"] = earlier
        runtime._publish_retained(Message("fast/x", b"", qos=0, retain=True))
        return earlier, runtime._retained_versions["fast/x"]

    earlier, later = threaded.call(publish_after_a_write_in_this_millisecond)
    assert later > earlier


def test_nothing_is_delivered_after_stop(start_broker: Start) -> None:
    threaded = _clustered(start_broker, hold_ms=300)
    client = RawClient(threaded.ports["tcp"])
    client.connect("after-stop")
    client.subscribe("order/#", 1)
    _forward(threaded, "peer-b/1", [1, 3])  # 3 waits for 2
    assert _received(client, 1) == [1]
    runtime = threaded.server.cluster
    asyncio.run_coroutine_threadsafe(runtime.stop(), threaded.loop).result(10)
    time.sleep(0.6)  # twice the hold time
    client.expect_nothing()
    assert runtime.stats.received == 1
    assert runtime.stats.gaps_skipped == 0


def test_a_failing_action_does_not_drop_the_actions_after_it(start_broker: Start) -> None:
    threaded = _clustered(start_broker)
    client = RawClient(threaded.ports["tcp"])
    client.connect("robust")
    client.subscribe("order/#", 1)
    runtime = threaded.server.cluster
    broken = ForwardedMessage("peer-c/1", "=order", 1, None)  # type: ignore[arg-type]
    good = ForwardedMessage("peer-d/1", "=order", 1, Message("order/t", b"7", qos=1, origin="x"))
    actions = [
        api.Deliver("=order", broken, 1, "peer-c:1", 1),
        api.Deliver("=order", good, 2, "peer-d:1", 1),
    ]
    threaded.call(runtime._carry_out, actions)
    assert _received(client, 1) == [7]


def test_a_relayed_claim_reply_counts_for_the_broker_that_answered(start_broker: Start) -> None:
    threaded = _clustered(start_broker)
    runtime = threaded.server.cluster

    def wait_for_two() -> asyncio.Future[Any]:
        claim = _Claim(threaded.loop.create_future(), {"peer-x:1", "peer-y:1"})
        runtime._claims[42] = claim
        return claim.future

    future = threaded.call(wait_for_two)
    for answering in ("peer-x:1", "peer-y:1"):
        reply = Envelope(answering, runtime.peer_id, "", "c", 42, 8, ClaimReply(42, "c", False, None))
        threaded.call(runtime._on_envelope, "relay:1", reply)  # both came through one relay
    assert threaded.call(future.done)  # both brokers answered: no wait for takeover_wait_ms
