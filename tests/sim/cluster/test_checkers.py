"""The whole-cluster simulation's invariant checkers fail on histories that break them (and pass
on ones that keep them): fabricated histories, no simulation run."""

from __future__ import annotations

from simulation.checkers import (
    Acked,
    History,
    Received,
    check_all,
    lost_acknowledged,
    one_owner,
    protocol_kept,
    publisher_order,
    retained_converged,
)


def _history() -> History:
    history = History()
    history.subscribed("sub", "plant/#", at=1.0)
    history.acked.append(Acked("pub", 1, 1, "plant/a", published_at=2.0, acked_at=2.1))
    history.acked.append(Acked("pub", 1, 2, "plant/a", published_at=2.2, acked_at=2.3))
    history.received.append(Received("sub", "plant/a", "pub", 1, 1, at=2.05))
    history.received.append(Received("sub", "plant/a", "pub", 1, 2, at=2.25))
    return history


def test_a_complete_history_passes_every_checker() -> None:
    assert check_all(_history(), {"sub": ["b1"], "pub": ["b2"]}, {"b1": {"r": b"x"}, "b2": {"r": b"x"}}) == []


def test_a_lost_acknowledged_message_is_reported() -> None:
    history = _history()
    history.received.pop()  # message 2 never arrived
    violations = lost_acknowledged(history)
    assert [v.kind for v in violations] == ["lost"]
    assert "pub:1:2" in violations[0].detail


def test_messages_published_before_the_suback_or_not_matching_or_unacked_do_not_count() -> None:
    history = _history()
    history.acked.append(Acked("pub", 1, 3, "plant/b", published_at=0.5, acked_at=0.6))  # before SUBACK
    history.acked.append(Acked("pub", 1, 4, "other/x", published_at=3.0, acked_at=3.1))  # no match
    history.acked.append(Acked("pub", 1, 5, "plant/c", published_at=3.0, acked_at=None))  # no PUBACK
    assert lost_acknowledged(history) == []


def test_an_order_violation_is_reported_but_a_duplicate_is_not() -> None:
    history = _history()
    history.received.append(Received("sub", "plant/a", "pub", 1, 1, at=2.4))  # a QoS 1 duplicate
    assert publisher_order(history) == []
    history.received[0], history.received[1] = history.received[1], history.received[0]
    assert [v.kind for v in publisher_order(history)] == ["order"]


def test_order_is_per_publisher_connection() -> None:
    history = _history()
    history.received.append(Received("sub", "plant/a", "pub", 2, 1, at=3.0))  # a new connection
    assert publisher_order(history) == []


def test_order_is_per_subscriber_session() -> None:
    """A message published before the subscriber's current session began (its CONNACK said "no
    session present": the old session's broker was down) arrives when the old session is merged
    in later; it is not ordered against the new session's messages. Messages published after the
    new session began still are."""
    history = _history()
    history.new_session("sub", 0.9)  # the first connection
    history.new_session("sub", 3.0)  # reconnected elsewhere, the old session out of reach
    history.acked.append(Acked("pub", 1, 3, "plant/a", published_at=2.5, acked_at=2.6))  # old session
    history.acked.append(Acked("pub", 1, 4, "plant/a", published_at=3.5, acked_at=3.6))
    history.acked.append(Acked("pub", 1, 5, "plant/a", published_at=3.7, acked_at=3.8))
    history.received.append(Received("sub", "plant/a", "pub", 1, 4, at=3.55))
    history.received.append(Received("sub", "plant/a", "pub", 1, 3, at=5.0))  # merged in late
    assert publisher_order(history) == []
    history.received.append(Received("sub", "plant/a", "pub", 1, 5, at=3.75))
    history.received.append(Received("sub", "plant/a", "pub", 1, 4, at=3.9))  # a duplicate: fine
    assert publisher_order(history) == []
    history.received.insert(2, Received("sub", "plant/a", "pub", 1, 5, at=3.52))  # 5 before 4
    assert [v.kind for v in publisher_order(history)] == ["order"]


def test_two_owners_of_one_client_id_are_reported() -> None:
    assert one_owner({"c": ["b1"], "d": []}) == []
    assert [v.kind for v in one_owner({"c": ["b1", "b2"]})] == ["owners"]


def test_diverging_retained_values_are_reported() -> None:
    assert retained_converged({"b1": {"t": b"1"}, "b2": {"t": b"1"}}) == []
    assert [v.kind for v in retained_converged({"b1": {"t": b"1"}, "b2": {"t": b"2"}})] == ["retained"]
    assert [v.kind for v in retained_converged({"b1": {"t": b"1"}, "b2": {}})] == ["retained"]


def test_a_packet_before_the_connack_is_a_protocol_violation() -> None:
    """MQTT-3.2.0-1, seen by the simulated client itself: real bytes, a PUBLISH then the CONNACK
    on one connection (what a moved session's catch-up did, seed 361), then a clean connection."""
    from broker.mqtt import codec
    from broker.mqtt.packets import MQTT_3_1_1, Connack, Publish
    from simulation.clients import SimClient
    from simulation.world import World

    history = History()
    client = SimClient(World(1), history, "sub", clean_start=False)
    publish = codec.encode(Publish("plant/a", b"pub:1:1", qos=1, packet_id=1), MQTT_3_1_1)
    connack = codec.encode(Connack(session_present=True, reason_code=0), MQTT_3_1_1)

    class Wire:  # the client's end of a connection: what it sends back (its PUBACKs)
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def send(self, data: bytes) -> None:
            self.sent.append(data)

    for first, second in ((publish, connack), (connack, publish)):
        socket = Wire()
        client.socket = socket  # type: ignore[assignment]
        client._decoder = codec.Decoder(role="client", protocol_level=MQTT_3_1_1)
        client._connack_seen = False
        client.bytes_received(socket, first + second + publish)  # type: ignore[arg-type]
    violations = protocol_kept(history)
    assert [v.kind for v in violations] == ["protocol"]  # the first connection only, once
    assert "sub got PUBLISH before CONNACK" in violations[0].detail
    assert check_all(history, {}, {}) == violations
