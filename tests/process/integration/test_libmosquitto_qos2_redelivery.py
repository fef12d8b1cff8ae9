"""libmosquitto 2.0.11 (Debian's mosquitto_sub) and a re-sent QoS 2 PUBLISH: the client limit that
docs/cluster.md "Known limits" states, shown against a scripted MQTT 5 server (no broker at all).

A broker restarted after kill -9 re-sends every QoS 2 PUBLISH whose PUBREC it had not yet recorded
(MQTT-4.4.0-1: unacknowledged PUBLISHes again, DUP=1, the same packet id). If the client had sent
that PUBREC before the crash, it still holds the packet id ("waiting for PUBREL"). MQTT-4.3.3
has the receiver answer such a PUBLISH with PUBREC and not deliver it twice; libmosquitto 2.0.11
queues it a second time (handle__publish appends to msgs_in without looking for the id) and
takes one more Receive Maximum slot for it. What follows, checked here:

* the PUBREL completes the first copy (delivered once, right); the second stays held. At the
  id's next use the PUBREL completes the stale copy: the old message is delivered a second time
  and the new one is held in its place;
* with as many ids held as its Receive Maximum (20), the re-sent PUBLISH is a protocol error to
  it: it closes the connection and mosquitto_sub exits with 2 (MOSQ_ERR_PROTOCOL).

No server can tell, after a crash, whether a PUBREC it never recorded was sent; SkipMQ re-sends the
PUBRELs it knows of first (broker/core/outbound.py ``resume``), which gives such a client its
completed slots back before any re-sent PUBLISH. The recovery matrix's QoS 2 cell across a kill of
the subscriber's broker uses paho (which keys the held message by packet id) for this reason.
If a newer libmosquitto fixes this, these tests fail, and the limit can go from the docs.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.scripted_mqtt import WAIT_S, ScriptedServer

pytestmark = pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto_sub not installed")

RECEIVE_MAXIMUM = 20  # libmosquitto's default, sent in its CONNECT (checked below)


class MosquittoSub:
    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            ["stdbuf", "-oL", "mosquitto_sub", "-V", "mqttv5", "-c", "-x", "600", "-i", "lm-q2",
             "-h", "127.0.0.1", "-p", str(port), "-q", "2", "-t", "t", "-F", "%p"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.lines: list[bytes] = []
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append(line.rstrip(b"\n"))

    def wait_lines(self, count: int) -> list[bytes]:
        deadline = time.monotonic() + WAIT_S
        while len(self.lines) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return list(self.lines)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT_S)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    made = ScriptedServer()
    yield made
    made.close()


@pytest.fixture
def client(server: ScriptedServer) -> Iterator[MosquittoSub]:
    made = MosquittoSub(server.port)
    yield made
    made.close()


def test_a_resent_publish_of_a_held_id_is_queued_twice_and_delivered_again_at_its_next_use(
    server: ScriptedServer, client: MosquittoSub
) -> None:
    connect = server.accept(session_present=False, suback=True)
    assert b"\x21" + RECEIVE_MAXIMUM.to_bytes(2, "big") in connect  # its Receive Maximum property
    server.publish_qos2(1, b"old")
    server.expect(0x50, 1)  # PUBREC: it holds id 1, waiting for PUBREL
    server.drop()  # the broker dies before it recorded that PUBREC
    server.accept(session_present=True, suback=True)
    server.publish_qos2(1, b"old", dup=True)  # what a restarted broker must send (MQTT-4.4.0-1)
    server.expect(0x50, 1)
    server.pubrel(1)
    server.expect(0x70, 1)
    assert client.wait_lines(1) == [b"old"]  # once, so far right
    server.publish_qos2(1, b"new")  # the id's next use
    server.expect(0x50, 1)
    server.pubrel(1)
    server.expect(0x70, 1)
    # the stale second copy of "old" is what that PUBREL completed; "new" is held instead
    assert client.wait_lines(2) == [b"old", b"old"]


def test_with_its_receive_maximum_held_a_resent_publish_ends_the_connection(
    server: ScriptedServer, client: MosquittoSub
) -> None:
    server.accept(session_present=False, suback=True)
    for packet_id in range(1, RECEIVE_MAXIMUM + 1):
        server.publish_qos2(packet_id, b"m%d" % packet_id)
    for packet_id in range(1, RECEIVE_MAXIMUM + 1):
        server.expect(0x50, packet_id)
    server.drop()
    server.accept(session_present=True, suback=True)
    server.publish_qos2(1, b"m1", dup=True)
    with pytest.raises((ConnectionError, OSError)):
        server.read()
    assert client.proc.wait(WAIT_S) == 2  # MOSQ_ERR_PROTOCOL: mosquitto_sub gives up
    assert client.lines == []  # nothing was delivered: no PUBREL ever came
