"""Review of issue #4: a session handed over after its client reconnected (docs/cluster.md
"Session takeover across brokers": a late session is merged, its queued messages kept;
``SessionRegistry.adopt_entries`` in broker/core/sessions.py) while QoS 2 deliveries were half-way.

A real broker and a real MQTT client: a QoS 2 message the client already acknowledged with PUBREC
on the old broker (PUBREL sent) must not be delivered again; queued and unacknowledged ones are.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.adapters.server import ThreadedBroker
from broker.core.session import (
    STATE_PUBLISH_SENT,
    STATE_PUBREL_SENT,
    Message,
    OutEntry,
    SessionSnapshot,
    SubOptions,
)
from tests.support.core import RawClient, start_broker

__all__ = ["start_broker"]  # the fixture
Start = Callable[..., ThreadedBroker]


def test_a_late_session_does_not_redeliver_a_qos2_message_the_client_already_received(
    start_broker: Start,
) -> None:
    threaded = start_broker()
    client = RawClient(threaded.ports["tcp"])
    client.connect("late-merge", clean=False)

    def message(payload: bytes, qos: int) -> Message:
        return Message("moved/t", payload, qos=qos, origin="old-broker", publisher_id="p")

    entries = [
        OutEntry(message(b"received", 2), 2, False, [], None, 11, STATE_PUBREL_SENT),
        OutEntry(message(b"unconfirmed", 2), 2, False, [], None, 12, STATE_PUBLISH_SENT),
        OutEntry(message(b"queued", 1), 1, False, []),
    ]
    broker = threaded.broker
    threaded.call(lambda: broker.registry.adopt_entries(broker.sessions["late-merge"], entries))
    got = []
    for _ in range(2):
        publish = client.expect_publish()
        got.append(publish.payload)
        client.ack(publish)
    assert got == [b"unconfirmed", b"queued"]
    client.expect_nothing()


def test_a_late_session_brings_its_subscriptions_when_the_connack_said_session_present(
    start_broker: Start,
) -> None:
    """Seeds 41 and 206 of ``--faults crash,partition,move --loss 0.05``: a CONNECT of the client
    to broker B got "no session present" (its session's broker was down or cut off) and the client
    lost that connection before its SUBSCRIBE: B kept an empty session. The client reconnected to
    B and was told "session present" - relying on its subscriptions - before the real session
    answered; when it arrived, only its messages were kept, the subscriptions dropped, and nothing
    published afterwards reached the client. They are added now (not when the CONNACK said no
    session present: the client subscribes again itself)."""
    threaded = start_broker()
    first = RawClient(threaded.ports["tcp"])
    assert not first.connect("late-subs", clean=False).session_present
    first.close()  # lost before its SUBSCRIBE: an empty stored session
    client = RawClient(threaded.ports["tcp"])
    assert client.connect("late-subs", clean=False).session_present
    broker = threaded.broker
    late = SessionSnapshot(
        "late-subs", 4, 3600, None, [SubOptions("moved/#", 1, match_filter="moved/#")], [], set()
    )
    threaded.call(lambda: broker.receive_late_session(late))
    publisher = RawClient(threaded.ports["tcp"])
    publisher.connect("late-subs-publisher")
    publisher.publish_acked("moved/t", b"after", 1)
    publish = client.expect_publish()
    assert publish.payload == b"after"
    client.ack(publish)


def test_a_late_session_does_not_bring_subscriptions_when_the_connack_said_no_session(
    start_broker: Start,
) -> None:
    threaded = start_broker()
    client = RawClient(threaded.ports["tcp"])
    assert not client.connect("late-new", clean=False).session_present
    broker = threaded.broker
    late = SessionSnapshot(
        "late-new", 4, 3600, None, [SubOptions("moved/#", 1, match_filter="moved/#")], [], set()
    )
    threaded.call(lambda: broker.receive_late_session(late))
    assert threaded.call(lambda: list(broker.sessions["late-new"].subscriptions)) == []
