"""A forwarded batch is decoded and routed once on the receiving broker (issue #31, "less work per
message"; broker/adapters/transport/wire.py, broker/cluster/engine_receiving.py ``_on_deliver``,
broker/cluster/streams.py ``_deliver`` with ``_route_memos``).

The publisher's broker publishes the messages of one stream forwarded in an event-loop iteration as
one ``ForwardedBatch`` (one PUB per hop). The receiving broker decodes that PUB once (one item, the
whole batch) and matches each (class, topic) of the batch once against its subscriptions: 50
messages of one topic cost one match of the subscription trie, not 50. The control: the same 50
messages handed over one by one cost one match each.

A real clustered broker (real gRPC listener, no peers, real SQLite store) and a real MQTT client;
the test hands the engine what the overlay would (a Deliver action with the decoded PUB's payload)
and counts the calls of the broker's subscription trie's ``match``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.adapters.server import ThreadedBroker
from broker.adapters.transport import wire
from broker.cluster.engine import ClusterEngine
from broker.cluster.messages import ForwardedBatch, ForwardedMessage
from broker.core.session import Message
from overlay import api
from overlay import messages as om
from tests.support.core import RawClient, start_broker

__all__ = ["start_broker"]  # the fixture
Start = Callable[..., ThreadedBroker]
BATCH = 50


class _CountingTrie:
    """The broker's subscription trie, its ``match`` calls counted."""

    def __init__(self, trie: Any) -> None:
        self._trie = trie
        self.matches = 0

    def match(self, topic: str) -> Any:
        self.matches += 1
        return self._trie.match(topic)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trie, name)

    def __len__(self) -> int:
        return len(self._trie)


def _engine(threaded: ThreadedBroker) -> ClusterEngine:
    runtime = threaded.server.runtime
    assert runtime is not None
    return runtime.engine


def _count_matches(threaded: ThreadedBroker) -> _CountingTrie:
    broker = threaded.server.broker
    assert broker is not None
    subscriptions = broker.router._subscriptions
    counting = _CountingTrie(subscriptions.trie)
    subscriptions.trie = counting  # type: ignore[assignment]
    return counting


def _messages(origin: str, first_seq: int) -> list[ForwardedMessage]:
    return [
        ForwardedMessage(
            origin,
            "=batch",
            first_seq + n,
            Message("batch/t", str(first_seq + n).encode(), qos=0, origin="elsewhere", publisher_id="p"),
        )
        for n in range(BATCH)
    ]


def _received(client: RawClient, count: int) -> list[int]:
    return [int(client.expect_publish().payload) for _ in range(count)]


def test_a_forwarded_batch_is_decoded_once_and_its_topic_matched_once(start_broker: Start) -> None:
    threaded = start_broker(cluster__enabled=True, cluster__port=0, cluster__host="127.0.0.1")
    client = RawClient(threaded.ports["tcp"])
    client.connect("batch-sub")
    client.subscribe("batch/#", 0)
    engine = _engine(threaded)
    counting = _count_matches(threaded)

    # the PUB as the link carries it: encoded once, decoded once into one item holding the batch
    batch = ForwardedBatch(tuple(_messages("127.0.0.9:1/1", 1)))
    key = ("=batch", 1, "127.0.0.9:1")
    pub = om.PUB(key, (key, 1), "=batch", batch, 1, (key, 1), 1, key, key, 0)
    decoded = wire.decode_frame(wire.encode_frame([pub]))
    assert len(decoded) == 1 and isinstance(decoded[0], om.PUB)
    assert decoded[0].payload == batch
    threaded.call(engine._carry_out, [api.Deliver("=batch", decoded[0].payload, 1, "127.0.0.9:1", 1)])
    assert _received(client, BATCH) == list(range(1, BATCH + 1))
    assert counting.matches == 1, f"{counting.matches} trie matches for one batch of {BATCH} on one topic"

    # the control: the same messages one at a time are matched once each
    counting.matches = 0
    for forwarded in _messages("127.0.0.9:1/1", BATCH + 1):
        threaded.call(engine.receive_forwarded, forwarded, 1)
    assert _received(client, BATCH) == list(range(BATCH + 1, 2 * BATCH + 1))
    assert counting.matches == BATCH
    client.expect_nothing()
