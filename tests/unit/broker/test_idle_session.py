"""An idle session holds no queue and no QoS 2 id set; both appear on first use and work as before.

The idle memory per connection (docs/benchmarks.md) depends on it: an empty ``deque`` holds a
64-slot block and an empty ``set`` its table, for every connected client.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import pytest

from broker.adapters.server import ThreadedBroker
from broker.core.session import NO_INFLIGHT
from broker.mqtt.packets import Pubcomp, Pubrec, Pubrel
from tests.support.core import RawClient, start_broker

__all__ = ["start_broker"]
Start = Callable[..., ThreadedBroker]


def _containers(broker: ThreadedBroker, client_id: str) -> tuple[type, type, int, int]:
    def read() -> tuple[type, type, int, int]:
        session = broker.broker.sessions[client_id]
        return (
            type(session.queue),
            type(session.incoming_qos2),
            len(session.queue),
            len(session.incoming_qos2),
        )

    result: tuple[type, type, int, int] = broker.call(read)
    return result


def test_idle_session_has_no_queue_until_a_message_waits(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port)
    sub.connect("idle-sub", clean=False)
    sub.subscribe("idle/t", 1)
    assert _containers(broker, "idle-sub")[:2] == (tuple, frozenset)
    sub.disconnect()
    pub = RawClient(port)
    pub.connect("idle-pub")
    for index in range(3):
        pub.publish_acked("idle/t", str(index).encode(), 1, packet_id=index + 1)
    queue_type, _ids_type, queued, _ = _containers(broker, "idle-sub")
    assert (queue_type, queued) == (deque, 3)
    back = RawClient(port)
    back.connect("idle-sub", clean=False)
    payloads = []
    for _ in range(3):
        message = back.expect_publish()
        payloads.append(message.payload)
        back.ack(message)
    back.expect_nothing(0.3)
    assert payloads == [b"0", b"1", b"2"]
    # QoS 2 from the client: the id is held between PUBREC and PUBREL, then released
    back.publish("idle/other", b"q2", qos=2, packet_id=9)
    assert back.expect(Pubrec).packet_id == 9
    _q, ids_type, _n, held = _containers(broker, "idle-sub")
    assert (ids_type, held) == (set, 1)
    back.publish("idle/other", b"q2", qos=2, packet_id=9, dup=True)  # a re-send is no new message
    assert back.expect(Pubrec).packet_id == 9
    back.send(Pubrel(9))
    assert back.expect(Pubcomp).packet_id == 9
    assert _containers(broker, "idle-sub")[3] == 0


def test_idle_session_has_no_in_flight_table_until_a_message_is_in_flight(start_broker: Start) -> None:
    """An idle connected session shares the read-only NO_INFLIGHT (its connect, SUBACK and the
    broker's statistics do not replace it, and it refuses writes); the first QoS 1 delivery gives
    the session a dict of its own, its PUBACK empties it."""
    with pytest.raises(TypeError):
        NO_INFLIGHT[1] = None  # type: ignore[assignment]
    with pytest.raises(TypeError):
        NO_INFLIGHT.setdefault(1, None)  # type: ignore[arg-type]
    assert NO_INFLIGHT == {}
    broker = start_broker()
    port = broker.ports["tcp"]
    sub = RawClient(port)
    sub.connect("idle-inflight")
    sub.subscribe("idle/inflight", 1)

    def table() -> tuple[bool, dict[int, object]]:
        session = broker.broker.sessions["idle-inflight"]
        broker.broker.refresh_stats()
        return session.inflight is NO_INFLIGHT, dict(session.inflight)

    assert broker.call(table) == (True, {})
    pub = RawClient(port)
    pub.connect("idle-inflight-pub")
    pub.publish_acked("idle/inflight", b"one", 1, packet_id=1)
    message = sub.expect_publish()
    assert message.payload == b"one"
    shared, held = broker.call(table)
    assert not shared and list(held) == [message.packet_id]
    sub.ack(message)
    sub.expect_nothing(0.2)
    assert broker.call(table) == (False, {})
    assert NO_INFLIGHT == {}
