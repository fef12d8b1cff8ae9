"""Review of issue #4, the cluster engine in a real broker (broker/cluster/engine.py; docs/cluster.md
"Forwarding, order and duplicates", clean shutdown).

A real clustered broker (real gRPC listener, no peers) with real MQTT clients; the tests hand the
engine what the overlay would (forwarded messages, Deliver actions). The protocol decisions
themselves (retained versions, claim order, relayed replies) are scripted against the pure cores
in test_cores_scripted.py.

* the first message of a stream that arrives is not necessarily its earliest: an earlier one that
  arrives after it is delivered, not dropped as a duplicate.
* nothing is delivered by the engine after ``stop()`` (reorder-hold deadlines are dropped).
* an action that fails does not drop the actions after it (a DONE or a delivery behind it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from broker.adapters.server import ThreadedBroker
from broker.cluster.engine import ClusterEngine
from broker.cluster.messages import ForwardedMessage
from broker.core.session import Message
from overlay import api
from tests.support.core import RawClient, start_broker

__all__ = ["start_broker"]  # the fixture
Start = Callable[..., ThreadedBroker]


def _clustered(start: Start, hold_ms: int = 10_000) -> ThreadedBroker:
    return start(
        cluster__enabled=True, cluster__port=0, cluster__host="127.0.0.1", cluster__reorder_hold_ms=hold_ms
    )


def _engine(threaded: ThreadedBroker) -> ClusterEngine:
    runtime = threaded.server.runtime
    assert runtime is not None
    return runtime.engine


def _forward(threaded: ThreadedBroker, origin: str, seqs: list[int], stream: str = "=order") -> None:
    engine = _engine(threaded)
    for seq in seqs:
        message = Message("order/t", str(seq).encode(), qos=1, origin="elsewhere", publisher_id="p")
        threaded.call(engine.receive_forwarded, ForwardedMessage(origin, stream, seq, message), 1)


def _received(client: RawClient, count: int) -> list[int]:
    got = []
    for _ in range(count):
        packet = client.expect_publish()
        got.append(int(packet.payload))
        client.ack(packet)
    return got


def test_an_earlier_message_still_unconfirmed_when_the_first_was_sent_is_delivered_first(
    start_broker: Start,
) -> None:
    """Review #4, issue #10: the first message of a stream seen here is not necessarily its earliest
    (it overtook one on a one-hop / multi-hop switch). It carries ``low``, the earliest SEQ its
    sender had not confirmed yet, so the receiver starts there and waits for the earlier one:
    delivered first, in order, not late."""
    threaded = _clustered(start_broker)
    client = RawClient(threaded.ports["tcp"])
    client.connect("late-first")
    client.subscribe("order/#", 1)
    engine = _engine(threaded)
    message = Message("order/t", b"5", qos=1, origin="elsewhere", publisher_id="p")
    threaded.call(engine.receive_forwarded, ForwardedMessage("127.0.0.1:1/1", "=order", 5, message, 4), 1)
    client.expect_nothing(0.3)  # held: 4 is on its way
    _forward(threaded, "127.0.0.1:1/1", [4])
    _forward(threaded, "127.0.0.1:1/1", [4, 5])  # retransmissions: dropped
    _forward(threaded, "127.0.0.1:1/1", [6])
    assert _received(client, 3) == [4, 5, 6]
    client.expect_nothing()
    assert engine.stats.duplicates_dropped == 2


def test_nothing_is_delivered_after_stop(start_broker: Start) -> None:
    threaded = _clustered(start_broker, hold_ms=300)
    client = RawClient(threaded.ports["tcp"])
    client.connect("after-stop")
    client.subscribe("order/#", 1)
    _forward(threaded, "127.0.0.2:1/1", [1, 3])  # 3 waits for 2
    assert _received(client, 1) == [1]
    runtime = threaded.server.runtime
    assert runtime is not None
    asyncio.run_coroutine_threadsafe(runtime.stop(), threaded.loop).result(10)
    time.sleep(0.6)  # twice the hold time
    client.expect_nothing()
    engine = _engine(threaded)
    assert engine.stats.received == 1
    assert engine.stats.gaps_skipped == 0


def test_a_failing_action_does_not_drop_the_actions_after_it(start_broker: Start) -> None:
    threaded = _clustered(start_broker)
    client = RawClient(threaded.ports["tcp"])
    client.connect("robust")
    client.subscribe("order/#", 1)
    engine = _engine(threaded)
    broken = ForwardedMessage("127.0.0.3:1/1", "=order", 1, None)  # type: ignore[arg-type]
    good = ForwardedMessage("127.0.0.4:1/1", "=order", 1, Message("order/t", b"7", qos=1, origin="x"))
    actions = [
        api.Deliver("=order", broken, 1, "127.0.0.3:1", 1),
        api.Deliver("=order", good, 2, "127.0.0.4:1", 1),
    ]
    threaded.call(engine._carry_out, actions)
    assert _received(client, 1) == [7]


def test_a_sys_subscription_joins_no_class_in_the_overlay(start_broker: Start) -> None:
    """$SYS topics are each broker's own (never forwarded): subscribing to them joins no class in
    the overlay and announces nothing to peers, and the SUBACK does not wait for the overlay."""
    threaded = _clustered(start_broker)
    engine = _engine(threaded)
    client = RawClient(threaded.ports["tcp"])
    client.connect("sys-watcher")
    started = time.monotonic()
    client.subscribe("$SYS/#", 0)
    client.subscribe("$SYS/skipmq/+/classes", 1)
    assert time.monotonic() - started < 2.0  # cluster.subscribe_wait_ms is longer
    client.subscribe("plant/#", 1)  # an ordinary filter still joins its class
    classes = threaded.call(lambda: engine.state()["subscribed_classes"])
    assert not [cls for cls in classes if "$SYS" in cls], classes
    assert classes, "plant/# should have joined its class"
    node = engine.node
    assert node is not None
    topics = threaded.call(lambda: {str(key[0]) for key in node.vnodes})
    assert not [t for t in topics if "$SYS" in t], topics
