"""A certified impostor on a crashed broker's address (docs/security.md "Who answers a dial").

One real 3-broker cluster (tools.launcher: a cluster CA, a certificate per broker, mutual TLS,
default limits, the cluster tests' faster failure detection) and paho clients: a QoS 1 stream
from a publisher on broker a and another from a publisher on broker b, each received by a
persistent subscriber on b and one on d. Broker d gets
``kill -9``; an impostor X - a process holding a certificate of the cluster's own CA for its *own*
peer id (a compromised or misconfigured member) - starts listening on d's address, says "d" in its
Hello and answers the dialers' challenge as well as it can (with its own key). a and b keep
dialing d (their streams have a subscriber there). Checked:

* a and b refuse the impostor: counted in ``skipmq_cluster_link_dial_refused_total{reason}``,
  logged as the structured event ``cluster_link_refused`` (``side`` ``dialer``) naming d; no link
  to d comes up and the impostor receives nothing;
* nothing is lost: every PUBACKed message of a's stream reaches b's subscriber, and after d
  restarts (the impostor gone) its subscriber gets every PUBACKed message of both streams.

Two checks refuse the impostor (docs/security.md "Who answers a dial"), and on the defaults the
first one fires: the default link runtime ``h2`` reads the acceptor's TLS certificate and refuses
one that does not name the dialed peer id before any Hello (reason ``certificate``, code
``DIAL_CERTIFICATE``); ``cluster.origin_proofs`` does not switch that off. The Hello challenge
(reason ``wrong_proof``) is the check on ``cluster.link_runtime = grpcio``, whose dialer sees no
certificate. ``SKIPMQ_TEST_DIAL_CHECKS`` picks the configuration, with production keys only
(nothing test-only in the broker):

* ``all`` (the default, what CI runs): the defaults; refused with reason ``certificate``;
* ``hello``: ``cluster.link_runtime = grpcio``; refused by the Hello check alone (``wrong_proof``);
* ``none`` - the control: ``cluster.link_runtime = grpcio`` and ``cluster.origin_proofs = off``,
  so nothing checks who answers a dial. The same test fails: the impostor is taken for d by a and
  b, receives d's traffic and acknowledges d's streams, and a and b count no refused dial.
  (``cluster.origin_proofs = off`` alone, on ``h2``, still refuses it by its certificate.)

``SKIPMQ_TEST_DIAL_CHECKS=none .venv/bin/python -m pytest tests/process/cluster/test_impostor.py``
runs the control.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from broker.adapters.transport import GrpcTransport
from broker.cluster.messages import (
    Envelope,
    ForwardedBatch,
    ForwardedMessage,
    StreamAck,
    StreamPosition,
    StreamResend,
)
from broker.cluster.origin_hello import LinkIdentity
from overlay import messages as om
from tests.support.cluster import (
    ClientFactory,
    ClusterFactory,
    Streamer,
    metric_total,
    numbers,
    probe_route,
    unique_id,
    wait_until,
)
from tests.support.rogue_member import HOST, RogueMember
from tools.launcher import LocalCluster
from tools.ports import free_port

# what a dial checks (the module docstring): the cluster's settings, and the refusal expected
DIAL_CHECKS = os.environ.get("SKIPMQ_TEST_DIAL_CHECKS", "all")
SETTINGS: dict[str, dict[str, str]] = {
    "all": {},
    "hello": {"cluster.link_runtime": "grpcio"},
    "none": {"cluster.link_runtime": "grpcio", "cluster.origin_proofs": "off"},
}
EXPECTED_REASON = {"all": "certificate", "hello": "wrong_proof", "none": ""}


class Impostor(RogueMember):
    """X: a GrpcTransport with X's certificate bound to d's address (so its peer id is d's),
    answering Hello challenges with X's key; it records what it receives and acknowledges every
    stream item it sees, in d's name (what a broker does for what it received)."""

    def __init__(self, cluster: LocalCluster, tmp_path: Path, address: str) -> None:
        super().__init__(cluster, tmp_path, f"{HOST}:{free_port()}", thread_name="impostor")
        self.identity = LinkIdentity("required", lambda: self.signer, lambda: self.verifier)
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.start()

    async def _start(self) -> GrpcTransport:
        transport = GrpcTransport(
            advertise_host=self.host,
            on_receive=self._on_receive,
            on_peer_down=lambda *_: None,
            tls=self.tls,
            identity=self.identity,
        )
        deadline = time.monotonic() + 10.0
        while True:  # d's port is free once the kernel closed its socket
            try:
                await transport.start(self.host, self.port)
                return transport
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    def _on_receive(self, sender: str, item: object) -> None:
        super()._on_receive(sender, item)
        messages: tuple[ForwardedMessage, ...] = ()
        if isinstance(item, om.PUB) and isinstance(item.payload, ForwardedBatch):
            messages = item.payload.messages
        elif isinstance(item, om.PUB) and isinstance(item.payload, ForwardedMessage):
            messages = (item.payload,)
        elif isinstance(item, Envelope) and isinstance(item.body, StreamResend):
            messages = item.body.messages
        if messages:  # "d got them": the origin may forget them for d
            last = max(messages, key=lambda m: m.seq)
            ack = StreamAck((StreamPosition(last.origin, last.stream, last.seq + 1),))
            self.transport.send(sender, Envelope(self.transport.self_id, sender, "", "", 0, 8, ack))


def _dial_refused(cluster: LocalCluster, index: int) -> float:
    return metric_total(cluster.metrics_text(index), "skipmq_cluster_link_dial_refused_total")


@pytest.mark.timeout(240)
def test_a_certified_impostor_on_a_crashed_brokers_address_is_refused(
    cluster_factory: ClusterFactory, client_factory: ClientFactory, tmp_path: Path
) -> None:
    cluster = cluster_factory(3, settings=SETTINGS[DIAL_CHECKS])
    d = cluster.brokers[2].peer_id
    sub_b = client_factory(cluster, 1, client_id=unique_id("imp-b"), clean=False, session_expiry_s=300)
    sub_b.subscribe("imp/#", qos=1)
    sub_d_id = unique_id("imp-d")
    sub_d = client_factory(cluster, 2, client_id=sub_d_id, clean=False, session_expiry_s=300)
    sub_d.subscribe("imp/#", qos=1)
    probe_route(cluster, 0, [sub_b], "imp/a")
    probe_route(cluster, 0, [sub_d], "imp/a")
    probe_route(cluster, 1, [sub_d], "imp/b")
    stream_a = Streamer(client_factory(cluster, 0, client_id=unique_id("pub-a")), "imp/a", b"a", 0.02)
    stream_b = Streamer(client_factory(cluster, 1, client_id=unique_id("pub-b")), "imp/b", b"b", 0.05)
    stream_a.start()
    stream_b.start()
    impostor: Impostor | None = None
    received_b: list[bytes] = []
    received_d: list[bytes] = []
    try:
        stream_a.wait_acked(20)
        cluster.kill_broker(2)
        # (got before the crash)
        received_d.extend(message.payload for message in sub_d.drain(0.05, max_s=1.0))
        sub_d.close()
        impostor = Impostor(cluster, tmp_path, d)
        refused_before = [_dial_refused(cluster, i) for i in (0, 1)]

        def both_refused() -> bool:
            return all(_dial_refused(cluster, i) > refused_before[k] for k, i in enumerate((0, 1)))

        def taken() -> bool:
            senders = {sender for sender, _item in impostor.items()}  # type: ignore[union-attr]
            return len(senders) >= 2

        try:
            wait_until(lambda: both_refused() or taken(), 60.0, what="a and b dial d's address")
        except TimeoutError:
            pass  # (the assertions below say what happened)
        stream_a.wait_acked(len(stream_a.acked_numbers()) + 50)  # the streams go on meanwhile
        time.sleep(1.0)  # a few more redials of d
        taken_by = sorted({sender for sender, _item in impostor.items()})
        harm: list[str] = []
        if taken_by:
            harm.append(
                f"the impostor was taken for d by {taken_by} ({len(impostor.items())} items received)"
            )
        for index in (0, 1):
            if d in cluster.cluster_state(index)["connected_peers"]:
                harm.append(f"broker {index} has a link to d while d is down")
        impostor.close()
        impostor = None
        received_b.extend(message.payload for message in sub_b.drain(0.05, max_s=1.0))
        cluster.restart_broker(2)
    finally:
        stream_a.stop()
        stream_b.stop()
        if impostor is not None:
            impostor.close()
    acked_a, acked_b = set(stream_a.acked_numbers()), set(stream_b.acked_numbers())
    sub_d = client_factory(cluster, 2, client_id=sub_d_id, clean=False, session_expiry_s=300)

    def everything_in() -> bool:
        received_b.extend(message.payload for message in sub_b.drain(0.05, max_s=1.0))
        received_d.extend(message.payload for message in sub_d.drain(0.05, max_s=1.0))
        return (
            acked_a <= set(numbers(received_b, b"a"))
            and acked_a <= set(numbers(received_d, b"a"))
            and (acked_b <= set(numbers(received_d, b"b")))
        )

    try:
        wait_until(everything_in, 60.0, what="every PUBACKed message at b's and d's subscribers")
    except TimeoutError:
        pass  # (named below)
    for name, acked, received, prefix in (
        ("a's stream at b", acked_a, received_b, b"a"),
        ("a's stream at d", acked_a, received_d, b"a"),
        ("b's stream at d", acked_b, received_d, b"b"),
    ):
        missing = acked - set(numbers(received, prefix))
        if missing:
            harm.append(f"{len(missing)} PUBACKed messages of {name} lost, e.g. {sorted(missing)[:5]}")
    assert not harm, "; ".join(harm)
    for index in (0, 1):
        text = cluster.metrics_text(index)
        reasons = {
            reason: metric_total(text, "skipmq_cluster_link_dial_refused_total", reason=reason)
            for reason in ("certificate", "wrong_proof", "no_proof", "wrong_peer_id")
        }
        expected = EXPECTED_REASON[DIAL_CHECKS]  # ("none": any reason; there is none)
        refused = reasons[expected] if expected else sum(reasons.values())
        assert refused >= 1 and sum(reasons.values()) == refused, (
            f"broker {index}: refused dials {reasons}, expected reason {expected or 'any'!r}"
        )
        code = {"certificate": "DIAL_CERTIFICATE", "wrong_proof": "DIAL_WRONG_PROOF"}.get(expected, "")
        refusals = [
            line
            for line in cluster.brokers[index].log_text().splitlines()
            if '"cluster_link_refused"' in line
            and '"side": "dialer"' in line
            and f'"peer": "{d}"' in line
            and f'"code": "{code}' in line
        ]
        assert refusals, f"broker {index} logged no refused dial of d ({code or 'any code'})"
