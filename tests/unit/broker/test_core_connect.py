"""Broker core: CONNECT handling, auth, keep alive, sessions, takeover, wills, protocol errors.

MQTT 3.1.1 §3.1/§3.2/§4.1, MQTT 5 §3.1/§3.2/§3.14/§4.13; real broker, real sockets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.adapters.server import ThreadedBroker
from broker.auth.users import PasswordFile
from broker.logs import record_fields
from broker.mqtt import codec
from broker.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingresp,
    Puback,
    Publish,
    ReasonCode,
    Suback,
    Subscribe,
    Subscription,
    Will,
)
from tests.support.core import (
    MQTT_5,
    PahoClient,
    RawClient,
    start_broker,
)

__all__ = ["start_broker"]
Start = Callable[..., ThreadedBroker]


def test_mqtt311_and_mqtt31_are_accepted(start_broker: Start) -> None:
    broker = start_broker()
    client = RawClient(broker.ports["tcp"])
    connack = client.connect("v311")
    assert connack.reason_code == 0 and connack.session_present is False
    client.disconnect()
    legacy = RawClient(broker.ports["tcp"], protocol_level=3)
    legacy.send(Connect(client_id="v31", protocol_level=3, protocol_name="MQIsdp"))
    assert legacy.expect(Connack).reason_code == 0
    legacy.subscribe("legacy/t", 1)
    legacy.publish_acked("legacy/t", b"x", 1)
    assert legacy.expect_publish().payload == b"x"
    legacy.close()


def test_unknown_protocol_level_gets_connack_1_and_close(start_broker: Start) -> None:
    broker = start_broker()
    client = RawClient(broker.ports["tcp"])
    body = b"\x00\x04MQTT\x07\x02\x00\x3c\x00\x01a"
    client.send_bytes(bytes((0x10, len(body))) + body)
    data = client.sock.recv(16)
    assert data == b"\x20\x02\x00\x01"  # unacceptable protocol version
    assert client.sock.recv(16) == b""


def test_empty_client_id_rules(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    v3_clean = RawClient(port)
    assert v3_clean.connect("", clean=True).reason_code == 0
    v3_persistent = RawClient(port)
    v3_persistent.send(Connect(client_id="", clean_start=False))
    packets = v3_persistent.read_until_closed()
    assert packets and packets[0].reason_code == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID  # type: ignore[union-attr]
    v5 = RawClient(port, MQTT_5)
    connack = v5.connect("")
    assert connack.reason_code == 0
    assigned = connack.properties["assigned_client_identifier"]
    assert assigned and assigned.startswith("skipmq-")
    assert broker.call(lambda: assigned in broker.broker.sessions)
    v3_clean.close()
    v5.close()


def test_connect_timeout_closes_silent_connection(start_broker: Start) -> None:
    broker = start_broker(limits__connect_timeout_s=1)
    client = RawClient(broker.ports["tcp"])
    started = time.monotonic()
    assert client.read_until_closed(timeout_s=4) == []
    assert 0.8 <= time.monotonic() - started <= 3.5


def test_authentication_codes(start_broker: Start, tmp_path: Path) -> None:
    passwords = PasswordFile()
    passwords.set("alice", "secret")
    password_path = tmp_path / "passwd"
    passwords.save(str(password_path))
    broker = start_broker(auth__allow_anonymous=False, auth__password_file=str(password_path))
    port = broker.ports["tcp"]
    good = RawClient(port)
    assert good.connect("a1", username="alice", password=b"secret").reason_code == 0
    wrong = RawClient(port)
    wrong.send(Connect(client_id="a2", username="alice", password=b"nope"))
    assert wrong.read_until_closed()[0].reason_code == ReasonCode.BAD_USER_NAME_OR_PASSWORD  # type: ignore[union-attr]
    wrong_v5 = RawClient(port, MQTT_5)
    wrong_v5.send(Connect(client_id="a3", protocol_level=5, username="alice", password=b"nope"))
    assert wrong_v5.read_until_closed()[0].reason_code == 0x86  # type: ignore[union-attr]
    anonymous = RawClient(port)
    anonymous.send(Connect(client_id="a4"))
    assert anonymous.read_until_closed()[0].reason_code in (0x86, 0x87)  # type: ignore[union-attr]
    good.close()


def test_pipelined_packets_wait_for_the_password_check(start_broker: Start, tmp_path: Path) -> None:
    """The scrypt check runs in a worker thread; packets sent right behind CONNECT in the same
    write are held and handled after the CONNACK, in order, and a wrong password drops them."""
    passwords = PasswordFile()
    passwords.set("bob", "hunter2")
    password_path = tmp_path / "passwd"
    passwords.save(str(password_path))
    broker = start_broker(auth__allow_anonymous=False, auth__password_file=str(password_path))
    port = broker.ports["tcp"]
    client = RawClient(port)
    client.send_bytes(
        codec.encode(Connect(client_id="pipe", username="bob", password=b"hunter2"), 4)
        + codec.encode(Subscribe(packet_id=7, subscriptions=[Subscription("pipe/t", qos=1)]), 4)
        + codec.encode(Publish(topic="pipe/t", payload=b"m", qos=1, packet_id=8), 4)
    )
    assert isinstance(client.recv(), Connack)
    assert client.take(Suback).packet_id == 7
    assert client.take(Puback).packet_id == 8
    assert client.expect_publish().payload == b"m"
    client.close()
    intruder = RawClient(port)
    intruder.send_bytes(
        codec.encode(Connect(client_id="pipe2", username="bob", password=b"wrong"), 4)
        + codec.encode(Publish(topic="pipe/t", payload=b"x", qos=0), 4)
    )
    packets = intruder.read_until_closed()
    assert len(packets) == 1 and packets[0].reason_code == ReasonCode.BAD_USER_NAME_OR_PASSWORD  # type: ignore[union-attr]


def test_enhanced_auth_is_refused(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    client = RawClient(port, MQTT_5)
    client.send(
        Connect(client_id="e1", protocol_level=5, properties={"authentication_method": "SCRAM-SHA-1"})
    )
    packets = client.read_until_closed()
    assert packets[0].reason_code == ReasonCode.BAD_AUTHENTICATION_METHOD  # type: ignore[union-attr]
    later = RawClient(port, MQTT_5)
    later.connect("e2")
    later.send(Auth(reason_code=0x19, properties={"authentication_method": "SCRAM-SHA-1"}))
    packets = later.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.PROTOCOL_ERROR


def test_keepalive_timeout_closes_fires_will_and_server_keep_alive(start_broker: Start) -> None:
    broker = start_broker(limits__max_keepalive_s=30)
    port = broker.ports["tcp"]
    watcher = RawClient(port)
    watcher.connect("watcher")
    watcher.subscribe("wills/#", 0)
    sleepy = RawClient(port, MQTT_5)
    connack = sleepy.connect("sleepy", keep_alive_s=1, will=Will("wills/sleepy", b"gone"))
    assert "server_keep_alive" not in connack.properties
    started = time.monotonic()
    packets = sleepy.read_until_closed(timeout_s=5)
    elapsed = time.monotonic() - started
    assert 1.4 <= elapsed <= 3.5, elapsed
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT
    assert watcher.expect_publish().payload == b"gone"
    capped = RawClient(port, MQTT_5)
    assert capped.connect("capped", keep_alive_s=0).properties["server_keep_alive"] == 30
    capped2 = RawClient(port, MQTT_5)
    assert capped2.connect("capped2", keep_alive_s=100).properties["server_keep_alive"] == 30
    pinger = RawClient(port)
    pinger.connect("pinger", keep_alive_s=1)
    for _ in range(4):  # PINGREQ keeps it alive past 1.5 x keep alive
        time.sleep(0.5)
        pinger.send_bytes(b"\xc0\x00")
        pinger.expect(Pingresp)
    assert not pinger.closed


def test_takeover_closes_old_connection_with_0x8e_and_keeps_session(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    first = RawClient(port, MQTT_5)
    first.connect("dup", clean=False, properties={"session_expiry_interval": 60})
    first.subscribe("dup/t", 1)
    second = RawClient(port, MQTT_5)
    connack = second.connect("dup", clean=False, properties={"session_expiry_interval": 60})
    assert connack.session_present is True
    packets = first.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.SESSION_TAKEN_OVER
    publisher = RawClient(port)
    publisher.connect("dup-pub")
    publisher.publish_acked("dup/t", b"after", 1)
    assert second.expect_publish().payload == b"after"


def test_takeover_v311_publishes_old_will(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    watcher = RawClient(port)
    watcher.connect("w")
    watcher.subscribe("will/t")
    first = RawClient(port)
    first.connect("same", will=Will("will/t", b"old-will"))
    second = RawClient(port)
    second.connect("same")
    assert watcher.expect_publish().payload == b"old-will"
    first.read_until_closed()


def test_will_on_abnormal_close_not_on_disconnect_and_on_0x04(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    watcher = RawClient(port)
    watcher.connect("watch")
    watcher.subscribe("will/#", 1)
    polite = RawClient(port)
    polite.connect("polite", will=Will("will/polite", b"p", qos=1))
    polite.disconnect()
    rude = RawClient(port)
    rude.connect("rude", will=Will("will/rude", b"r", qos=1, retain=True))
    rude.close()
    message = watcher.expect_publish()
    assert (message.topic, message.payload, message.qos) == ("will/rude", b"r", 1)
    watcher.ack(message)
    v5 = RawClient(port, MQTT_5)
    v5.connect("v5will", will=Will("will/v5", b"with-will"))
    v5.disconnect(ReasonCode.DISCONNECT_WITH_WILL)
    assert watcher.expect_publish().payload == b"with-will"
    watcher.expect_nothing(0.3)  # the polite client's will never came
    late = RawClient(port)
    late.connect("late")
    late.subscribe("will/rude")
    retained = late.expect_publish()
    assert retained.retain is True and retained.payload == b"r"


def test_will_delay_cancelled_by_reconnect_and_sent_after_delay(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    watcher = RawClient(port)
    watcher.connect("wd-watch")
    watcher.subscribe("wd/#")
    props = {"session_expiry_interval": 60}
    delayed = Will("wd/a", b"a", properties={"will_delay_interval": 1})
    a = RawClient(port, MQTT_5)
    a.connect("wd-a", clean=False, will=delayed, properties=props)
    a.close()
    time.sleep(0.3)
    a2 = RawClient(port, MQTT_5)
    assert a2.connect("wd-a", clean=False, properties=props).session_present is True
    b = RawClient(port, MQTT_5)
    b.connect(
        "wd-b", clean=False, will=Will("wd/b", b"b", properties={"will_delay_interval": 1}), properties=props
    )
    started = time.monotonic()
    b.close()
    message = watcher.expect_publish(timeout_s=4)
    assert message.topic == "wd/b"
    assert time.monotonic() - started >= 0.8
    watcher.expect_nothing(1.0)  # a's will was cancelled by the reconnect


def test_will_sent_at_session_end_when_sooner_than_delay(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    watcher = RawClient(port)
    watcher.connect("se-watch")
    watcher.subscribe("se/#")
    client = RawClient(port, MQTT_5)
    will = Will("se/w", b"w", properties={"will_delay_interval": 30})
    client.connect("se", will=will, properties={"session_expiry_interval": 1})
    started = time.monotonic()
    client.close()
    assert watcher.expect_publish(timeout_s=4).payload == b"w"
    assert 0.8 <= time.monotonic() - started <= 3.0


def test_persistent_session_present_and_expiry(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    v3 = RawClient(port)
    assert v3.connect("p3", clean=False).session_present is False
    v3.subscribe("p3/t", 1)
    v3.disconnect()
    publisher = RawClient(port)
    publisher.connect("p3-pub")
    publisher.publish_acked("p3/t", b"queued", 1)
    again = RawClient(port)
    assert again.connect("p3", clean=False).session_present is True
    message = again.expect_publish()
    assert message.payload == b"queued" and message.retain is False
    again.ack(message)
    again.disconnect()
    clean = RawClient(port)
    assert clean.connect("p3", clean=True).session_present is False
    clean.disconnect()
    v5 = RawClient(port, MQTT_5)
    v5.connect("p5", properties={"session_expiry_interval": 1})
    v5.disconnect()
    back = RawClient(port, MQTT_5)
    assert back.connect("p5", clean=False, properties={"session_expiry_interval": 1}).session_present is True
    back.disconnect()
    time.sleep(1.6)
    late = RawClient(port, MQTT_5)
    assert late.connect("p5", clean=False).session_present is False
    zero = RawClient(port, MQTT_5)
    zero.connect("p0")
    zero.disconnect()
    assert RawClient(port, MQTT_5).connect("p0", clean=False).session_present is False


def test_disconnect_setting_expiry_after_zero_is_protocol_error(start_broker: Start) -> None:
    broker = start_broker()
    client = RawClient(broker.ports["tcp"], MQTT_5)
    client.connect("exp0")
    client.send(Disconnect(0, {"session_expiry_interval": 30}))
    packets = client.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.PROTOCOL_ERROR


def test_protocol_error_logged_disconnected_others_unaffected(
    start_broker: Start, caplog: pytest.LogCaptureFixture
) -> None:
    broker = start_broker(limits__max_packet_size_bytes=1000)
    port = broker.ports["tcp"]
    bystander = RawClient(port)
    bystander.connect("bystander")
    bystander.subscribe("ok/#")
    caplog.set_level(logging.INFO)
    bad = RawClient(port, MQTT_5)
    bad.connect("bad")
    bad.send_bytes(b"\x36\x05\x00\x01ab\x00")  # PUBLISH with QoS 3
    packets = bad.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.MALFORMED_PACKET
    big = RawClient(port, MQTT_5)
    big.connect("big")
    big.publish("ok/big", b"x" * 2000)
    packets = big.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.PACKET_TOO_LARGE
    v3 = RawClient(port)
    v3.connect("bad3")
    v3.send_bytes(b"\x30\x03\x00\x01+")  # wildcard in a topic name
    assert v3.read_until_closed() == []
    records = [record_fields(r) for r in caplog.records]
    errors = [fields for fields in records if fields.get("event") == "protocol_error"]
    assert len(errors) >= 3
    assert {fields["client_id"] for fields in errors} >= {"bad", "big", "bad3"}
    assert all(fields["reason_code"] and fields["message"] and "peer" in fields for fields in errors)
    other = RawClient(port)
    other.connect("other")
    other.publish("ok/fine", b"still works")
    assert bystander.expect_publish().payload == b"still works"
    assert broker.call(lambda: sum(broker.broker.stats.packet_errors.values())) >= 3


def test_second_connect_is_protocol_error(start_broker: Start) -> None:
    broker = start_broker()
    client = RawClient(broker.ports["tcp"], MQTT_5)
    client.connect("twice")
    client.send(Connect(client_id="twice", protocol_level=5))
    packets = client.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].reason_code == ReasonCode.PROTOCOL_ERROR


def test_paho_v311_and_v5_clients_connect(start_broker: Start) -> None:
    broker = start_broker()
    port = broker.ports["tcp"]
    v3 = PahoClient(port, "paho3").start()
    v5 = PahoClient(port, "paho5", v5=True).start()
    assert v3.connack is not None and not v3.connack[1].is_failure
    assert v5.connack is not None and not v5.connack[1].is_failure
    v5.subscribe("paho/#", 1)
    v3.publish("paho/x", b"hello", 1)
    assert v5.get().payload == b"hello"
    v3.stop()
    v5.stop()


def test_will_is_acl_checked_and_errors_carry_reason_strings(start_broker: Start, tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite w/#\ntopic read secret/#\n")
    broker = start_broker(auth__acl_file=str(acl))
    port = broker.ports["tcp"]
    watcher = RawClient(port)
    watcher.connect("acl-watch")
    watcher.subscribe("secret/#")
    watcher.subscribe("w/#", packet_id=2)
    denied = RawClient(port)
    denied.connect("acl-will", will=Will("secret/will", b"must not appear"))
    denied.close()
    allowed = RawClient(port)
    allowed.connect("acl-will-ok", will=Will("w/will", b"fine"))
    allowed.close()
    assert watcher.expect_publish().topic == "w/will"
    watcher.expect_nothing(0.3)
    v5 = RawClient(port, MQTT_5)
    v5.connect("reasons")
    v5.send(Disconnect(0, {"session_expiry_interval": 5}))  # after 0 on CONNECT: protocol error
    packets = v5.read_until_closed()
    assert isinstance(packets[-1], Disconnect) and packets[-1].properties.get("reason_string")
