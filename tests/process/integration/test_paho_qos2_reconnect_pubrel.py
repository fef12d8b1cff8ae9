"""paho-mqtt 2.2 as a QoS 2 publisher across a broker restart: the client behaviour behind the
duplicates that tests/process/integration/test_qos2_exactly_once_kill9.py saw, shown against a
scripted MQTT 5 server (no broker at all).

MQTT-4.3.3: once the sender has sent PUBREL it must not send the PUBLISH again; on a resumed
session it sends the PUBREL again (MQTT-4.4.0-1), and the receiver, which released the packet id
at the first PUBREL, answers PUBCOMP. paho resets its unacknowledged messages at every reconnect
attempt (``Client.reconnect`` calls ``_messages_reconnect_reset_out`` before it opens the socket):
"waiting for PUBCOMP" becomes "re-send PUBREL", which the CONNACK handler sends. When an attempt
fails (the broker is still restarting after kill -9) and the next one resets again, "re-send
PUBREL" is not "waiting for PUBCOMP" any more and falls into the branch for messages never
acknowledged: paho sends the PUBLISH again, with DUP=0, under a packet id the receiver has
released. To the receiver (any broker) that is a new message, and it routes it a second time.

Checked here, so that a paho release that fixes it makes this test fail (then the kill -9 test's
publisher, tests/support/paho_qos2.py ``PahoQos2Publisher``, can be plain paho again): one
reconnect straight away re-sends the PUBREL (right); one failed attempt before it re-sends the
PUBLISH, DUP=0; ``PahoQos2Publisher`` re-sends the PUBREL after the failed attempt too.
"""

from __future__ import annotations

import threading
import time

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.paho_qos2 import PahoQos2Publisher
from tests.support.scripted_mqtt import PUBLISH, PUBREL, WAIT_S, ScriptedServer


def after_restart(failed_attempts: int, cls: type[paho.Client] = paho.Client) -> tuple[int, bytes]:
    """paho publishes one QoS 2 message, gets PUBREC, sends PUBREL; the server goes away before
    PUBCOMP and refuses ``failed_attempts`` reconnects; the first packet paho sends after the
    CONNACK (session present) of the next one: (first byte, body)."""
    server = ScriptedServer()
    client = cls(
        callback_api_version=CallbackAPIVersion.VERSION2, client_id="paho-q2-pubrel", protocol=paho.MQTTv5
    )
    client.reconnect_delay_set(0.05, 0.2)
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 600
    accepted = threading.Thread(target=server.accept, kwargs={"session_present": False})
    accepted.start()
    client.connect("127.0.0.1", server.port, keepalive=30, clean_start=False, properties=props)
    client.loop_start()
    try:
        accepted.join(WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while not client.is_connected():
            assert time.monotonic() < deadline, "paho did not connect"
            time.sleep(0.01)
        mid = client.publish("t", b"m", 2).mid
        kind, body = server.read()
        assert (kind >> 4, kind & 0x08, body[3:5]) == (PUBLISH, 0, mid.to_bytes(2, "big")), body.hex()
        server.pubrec(mid)
        kind, body = server.read()
        assert (kind >> 4, body[:2]) == (PUBREL, mid.to_bytes(2, "big")), (hex(kind), body.hex())
        server.drop()  # no PUBCOMP
        for _ in range(failed_attempts):
            server.refuse_once()
        server.accept(session_present=True)
        kind, body = server.read()
        return kind, body
    finally:
        client.disconnect()
        client.loop_stop()
        server.close()


def test_paho_resends_the_pubrel_on_a_reconnect_that_succeeds_at_once() -> None:
    kind, body = after_restart(failed_attempts=0)
    assert kind >> 4 == PUBREL and body[:2] == b"\x00\x01", (hex(kind), body.hex())


def test_paho_resends_the_publish_with_dup_0_after_a_failed_reconnect_attempt() -> None:
    """The client fault (MQTT-4.3.3): the PUBLISH again, DUP=0, same packet id, after its PUBREL."""
    kind, body = after_restart(failed_attempts=1)
    assert kind >> 4 == PUBLISH, f"paho sent {kind:#x}, not a PUBLISH (fixed? see the module doc)"
    assert kind & 0x08 == 0, "DUP=1"
    assert body[3:5] == b"\x00\x01", body.hex()  # topic "t" (2+1 bytes), then the packet id


def test_the_kill9_tests_publisher_resends_the_pubrel_after_a_failed_attempt() -> None:
    kind, body = after_restart(failed_attempts=2, cls=PahoQos2Publisher)
    assert kind >> 4 == PUBREL and body[:2] == b"\x00\x01", (hex(kind), body.hex())
