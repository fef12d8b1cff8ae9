"""Mutual TLS between brokers and inbound validation (issue #12; docs/security.md "Cluster links").

A real 2-broker cluster started by the launcher (which makes a cluster CA and one certificate per
broker into its data directory) is attacked from this test process over real gRPC:

* a process without a certificate, or with one from another CA, is refused in the handshake;
* a process with a certificate of the cluster CA for its own peer id, claiming another broker's
  peer id in its Hello, is refused (PERMISSION_DENIED);
* the same certified process, speaking for itself, sends the forged messages of the issue - a
  ClaimReply injecting a message into a client's session, an unsolicited retained-store copy, a
  RetainedSyncRequest addressed to an address it wants dialled, an envelope claiming another
  origin: each is rejected (counted, logged) and changes nothing a client can see.

The tests share one 2-broker cluster (``cluster2``, module scope, tests/process/cluster/conftest.py;
each reads only its own lines of the brokers' logs); the malformed-frames test (its own
``cluster.max_frame_bytes``) and the graceful-leave test (3 brokers, one stopped) start their own.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from broker.adapters.transport import GrpcTransport, wire
from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert, make_ca
from broker.cluster.messages import (
    ClaimReply,
    ClassInterest,
    Envelope,
    RetainedSyncReply,
    RetainedSyncRequest,
    RetainedUpdate,
)
from broker.cluster.origin_checks import OriginChecks
from broker.cluster.origin_proof import Signer, Verifier
from broker.core.session import Message, OutEntry, SessionSnapshot
from tests.support.cluster import (
    ClientFactory,
    ClusterFactory,
    metric_total,
    probe_route,
    unique_id,
    wait_until,
)
from tools.launcher import LocalCluster
from tools.ports import free_port

HOST = "127.0.0.1"


def _certs_dir(cluster: LocalCluster) -> Path:
    return Path(cluster.data_root) / "certs"


def _rejected(cluster: LocalCluster, index: int) -> float:
    return metric_total(cluster.metrics_text(index), "skipmq_cluster_inbound_rejected_total")


async def _open_and_hello(target: str, credentials: grpc.ChannelCredentials | None, claimed: str) -> Any:
    """Open PeerLink/Open, send a Hello claiming ``claimed``; the acceptor's answer or the error."""
    if credentials is None:
        channel = grpc.aio.insecure_channel(target)
    else:
        channel = grpc.aio.secure_channel(target, credentials)
    try:
        call = channel.stream_stream(wire.PEER_LINK_OPEN_METHOD)()
        async with asyncio.timeout(5.0):
            await call.write(wire.encode_hello(claimed, 16))
            return await call.read()
    except grpc.aio.AioRpcError as exc:
        return exc
    finally:
        await channel.close()


def _rogue_credentials(cluster: LocalCluster, tmp_path: Path, peer_id: str) -> ClusterTls:
    """A certificate of the cluster's own CA for ``peer_id`` (a certified, but rogue, broker)."""
    certs = _certs_dir(cluster)
    cert, key = issue_broker_cert(certs, peer_id, out_dir=tmp_path, name="rogue")
    return ClusterTls(TlsFiles(str(certs / "ca.pem"), str(cert), str(key)))


def test_an_uncertified_process_cannot_open_a_link(cluster2: LocalCluster, tmp_path: Path) -> None:
    target = cluster2.brokers[0].peer_id
    claimed = f"{HOST}:{free_port()}"
    plain = asyncio.run(_open_and_hello(target, None, claimed))
    assert isinstance(plain, grpc.aio.AioRpcError) and plain.code() == grpc.StatusCode.UNAVAILABLE, plain
    # a certificate for the right peer id, signed by another CA: refused in the handshake too
    other_ca = tmp_path / "other-ca"
    make_ca(other_ca)
    cert, key = issue_broker_cert(other_ca, claimed)
    foreign = ClusterTls(TlsFiles(str(other_ca / "ca.pem"), str(cert), str(key)))
    # (trusting the cluster's CA for the server side, so only the client certificate is wrong)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=(_certs_dir(cluster2) / "ca.pem").read_bytes(),
        private_key=Path(foreign.files.key_file).read_bytes(),
        certificate_chain=Path(foreign.files.cert_file).read_bytes(),
    )
    refused = asyncio.run(_open_and_hello(target, credentials, claimed))
    assert isinstance(refused, grpc.aio.AioRpcError) and refused.code() == grpc.StatusCode.UNAVAILABLE, (
        refused
    )
    assert claimed not in cluster2.cluster_state(0)["connected_peers"]


def test_a_certified_process_claiming_another_brokers_id_is_refused(
    cluster2: LocalCluster, tmp_path: Path
) -> None:
    own_id = f"{HOST}:{free_port()}"
    tls = _rogue_credentials(cluster2, tmp_path, own_id)
    victim = cluster2.brokers[1].peer_id
    answer = asyncio.run(_open_and_hello(cluster2.brokers[0].peer_id, tls.channel_credentials(), victim))
    assert isinstance(answer, grpc.aio.AioRpcError), answer
    assert answer.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "certificate names" in (answer.details() or "")
    # and speaking for itself it is let in (the certificate is the cluster's)
    hello = asyncio.run(_open_and_hello(cluster2.brokers[0].peer_id, tls.channel_credentials(), own_id))
    assert not isinstance(hello, grpc.aio.AioRpcError), hello
    assert wire.decode_hello(bytes(hello)).peer_id == cluster2.brokers[0].peer_id


class _Listener:
    """A TCP port that records whether anything connected to it (the SSRF target)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind((HOST, 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.sock.close()


def test_forged_cluster_messages_are_rejected(
    cluster2: LocalCluster, client_factory: ClientFactory, tmp_path: Path
) -> None:
    victim_broker = cluster2.brokers[0]
    log_start = len(victim_broker.log_text())  # the shared cluster's log: this test's lines only
    other = cluster2.brokers[1].peer_id
    # a client with a persistent session and a subscription on broker 0
    victim_id = unique_id("victim")
    victim = client_factory(cluster2, 0, client_id=victim_id, clean=False, session_expiry_s=300)
    victim.subscribe("forged/#", qos=1)
    before = _rejected(cluster2, 0)
    listener = _Listener()
    port = free_port()
    own_id = f"{HOST}:{port}"
    tls = _rogue_credentials(cluster2, tmp_path, own_id)
    forged_message = Message("forged/x", b"injected", qos=1, origin="rogue")
    snapshot = SessionSnapshot(
        client_id=victim_id,
        protocol_level=5,
        expiry_interval_s=300,
        username=None,
        subscriptions=[],
        pending=[OutEntry(forged_message, 1, False, [])],
        incoming_qos2=set(),
        next_packet_id=1,
    )
    dest = victim_broker.peer_id
    forged = [
        # a ClaimReply for a claim broker 0 never made: would inject the message into the session
        Envelope(own_id, dest, "", victim_id, 424242, 4, ClaimReply(424242, victim_id, True, snapshot)),
        # the same, claiming to come from the real other broker
        Envelope(other, dest, "", victim_id, 424243, 4, ClaimReply(424243, victim_id, True, snapshot)),
        # a retained-store copy nobody asked for: would plant a retained message
        Envelope(
            own_id,
            dest,
            "",
            "",
            7,
            4,
            RetainedSyncReply(
                7, (RetainedUpdate(other, 2**50, Message("forged/r", b"planted", retain=True)),), True
            ),
        ),
        # a RetainedSyncRequest addressed to another address: would make broker 0 dial it (SSRF)
        Envelope(own_id, f"{HOST}:{listener.port}", "", "", 0, 4, RetainedSyncRequest(9)),
    ]

    # a certified member signs what it sends with its own key (its origin proof holds): these are
    # refused for what they say, not for a missing proof
    signer = Signer.from_pem(Path(tls.files.cert_file).read_bytes(), Path(tls.files.key_file).read_bytes())
    verifier = Verifier(Path(tls.files.ca_file).read_bytes())
    checks = OriginChecks("required", lambda: signer, lambda: verifier)

    async def send_all() -> None:
        transport = GrpcTransport(
            advertise_host=HOST, on_receive=lambda *_: None, on_peer_down=lambda *_: None, tls=tls
        )
        await transport.start(HOST, port)
        try:
            for envelope in forged:
                transport.send(dest, checks.sign_envelope(envelope))
            async with asyncio.timeout(10.0):
                while transport.queued(dest) or dest not in transport.connected_peers():
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
        finally:
            await transport.stop(drain_timeout_s=1.0)

    try:
        asyncio.run(send_all())
        wait_until(
            lambda: _rejected(cluster2, 0) - before >= len(forged),
            10.0,
            what=f"broker 0 rejected the {len(forged)} forged messages",
        )
        victim.assert_no_message(1.0)  # nothing injected into the live session
        victim.drop()
        fresh = client_factory(cluster2, 0, client_id=unique_id("reader"))
        fresh.subscribe("forged/#", qos=1)
        fresh.assert_no_message(1.0)  # no planted retained message
        assert listener.connections == 0, "broker 0 dialled an address named by a forged envelope"
        log = victim_broker.log_text()[log_start:]
        assert log.count("cluster_message_rejected") >= len(forged)
    finally:
        listener.close()


async def _hostile_stream(
    target: str, credentials: grpc.ChannelCredentials, own_id: str, frame: bytes
) -> Any:
    """A certified link (own id) whose first data frame is ``frame``; how the acceptor ends it."""
    channel = grpc.aio.secure_channel(target, credentials)
    try:
        call = channel.stream_stream(wire.PEER_LINK_OPEN_METHOD)()
        async with asyncio.timeout(10.0):
            await call.write(wire.encode_hello(own_id, 16))
            await call.read()  # the acceptor's Hello
            await call.write(frame)
            while True:
                answer = await call.read()
                if answer is grpc.aio.EOF:
                    return "EOF"
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    except TimeoutError:
        return "still open"
    finally:
        await channel.close()


def test_malformed_frames_close_only_their_own_stream(
    cluster_factory: ClusterFactory, client_factory: ClientFactory, tmp_path: Path
) -> None:
    cluster2 = cluster_factory(2, settings={"cluster.max_frame_bytes": "65536"})
    own_id = f"{HOST}:{free_port()}"
    tls = _rogue_credentials(cluster2, tmp_path, own_id)
    target = cluster2.brokers[0].peer_id
    subscriber = client_factory(cluster2, 0)
    subscriber.subscribe("frames/#", qos=1)
    probe_route(cluster2, 1, subscriber, "frames/probe")
    interest = wire.encode_item(Envelope(own_id, target, "", "", 0, 4, ClassInterest(())))
    classes = tuple(f"class-{n}" for n in range(10_000))  # a well-formed item of ~110 KB
    big = wire.encode_item(Envelope(own_id, target, "", "", 0, 4, ClassInterest(classes)))
    assert len(big) > 65_536
    hostile = {
        "not a Frame": b"\xff\xff\xff\xff garbage",
        "too many items": wire.encode_frame_from_items([interest] * 300),
        "a Hello again": wire.encode_hello(own_id, 16),
        "a frame over cluster.max_frame_bytes": wire.encode_frame_from_items([big]),
    }
    for what, frame in hostile.items():
        ended = asyncio.run(_hostile_stream(target, tls.channel_credentials(), own_id, frame))
        assert ended != "still open", f"{what}: the stream stayed open"
        if "max_frame_bytes" in what:
            assert ended == grpc.StatusCode.RESOURCE_EXHAUSTED, ended
    # nothing else was lost: the brokers' own link carries a QoS 1 message as before
    publisher = client_factory(cluster2, 1)
    publisher.publish("frames/after", b"still delivered", qos=1)
    message = subscriber.wait_message()
    assert (message.topic, message.payload) == ("frames/after", b"still delivered")
    assert cluster2.brokers[1].peer_id in cluster2.cluster_state(0)["connected_peers"]
    assert "malformed frame from" in cluster2.brokers[0].log_text()


async def _send_hostile_items(
    target: str, credentials: grpc.ChannelCredentials, own_id: str, frames: list[bytes]
) -> int:
    """Send each of ``frames`` on its own certified link (own id): Hello, the frame, end of
    writing; returns how many of these streams the acceptor ended with an error."""
    ended = 0
    for frame in frames:
        channel = grpc.aio.secure_channel(target, credentials)
        try:
            call = channel.stream_stream(wire.PEER_LINK_OPEN_METHOD)()
            async with asyncio.timeout(10.0):
                await call.write(wire.encode_hello(own_id, 16))
                await call.read()  # the acceptor's Hello
                await call.write(frame)
                await call.done_writing()
                while await call.read() is not grpc.aio.EOF:
                    pass
                if await call.code() != grpc.StatusCode.OK:
                    ended += 1
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            ended += 1
        finally:
            await channel.close()
    return ended


def test_mutated_items_close_at_most_their_own_stream(
    cluster2: LocalCluster, client_factory: ClientFactory, tmp_path: Path
) -> None:
    """Seeded mutations (tools.fuzz_mqtt.mutate: wrong wire types, hostile lengths and counts,
    truncations, splices) of well-encoded items of every overlay kind and of the cluster
    envelopes - addressed from the rogue's own id to the broker, so that what decodes reaches
    the inbound validation and the overlay engine - in frames of five, each on its own
    certified link. The broker skips or rejects them (a malformed frame ends that stream only),
    logs no handler error, and the brokers' own link still carries a QoS 1 message."""
    import random

    from tests.unit.transport.test_wire_hostile import _seeds
    from tools.fuzz_mqtt import mutate

    log_start = len(cluster2.brokers[0].log_text())  # the shared cluster's log: this test's lines only
    own_id = f"{HOST}:{free_port()}"
    tls = _rogue_credentials(cluster2, tmp_path, own_id)
    target = cluster2.brokers[0].peer_id
    subscriber = client_factory(cluster2, 0)
    subscriber.subscribe("mutated/#", qos=1)
    probe_route(cluster2, 1, subscriber, "mutated/probe")
    addressed = [
        wire.encode_item(Envelope(own_id, target, "", "", 1, 4, RetainedSyncRequest(3))),
        wire.encode_item(Envelope(own_id, target, "", "", 0, 4, ClassInterest(("a", "b")))),
    ]
    seeds = [*_seeds(), *addressed]
    rng = random.Random(12)
    parsing: list[bytes] = []  # well-formed protobuf, hostile content: reach the item decoder
    broken: list[bytes] = []  # not even protobuf: end their frame's stream
    while len(parsing) < 150 or len(broken) < 20:
        data = mutate(rng.choice(seeds), rng, seeds)
        try:
            wire.decode_frame_items(wire.encode_frame_from_items([data]))
        except wire.WireError:
            if len(broken) < 20:
                broken.append(data)
            continue
        if len(parsing) < 150:
            parsing.append(data)
    frames = [wire.encode_frame_from_items(parsing[i : i + 5]) for i in range(0, len(parsing), 5)]
    frames += [wire.encode_frame_from_items(broken[i : i + 5]) for i in range(0, len(broken), 5)]
    asyncio.run(_send_hostile_items(target, tls.channel_credentials(), own_id, frames))
    publisher = client_factory(cluster2, 1)
    publisher.publish("mutated/after", b"still delivered", qos=1)
    message = subscriber.wait_message()
    assert (message.topic, message.payload) == ("mutated/after", b"still delivered")
    assert cluster2.brokers[0].alive()
    log = cluster2.brokers[0].log_text()[log_start:]
    assert "on_receive raised" not in log and "Traceback" not in log and "internal_error" not in log
    # both kinds arrived: frames that are not protobuf ended their streams, items that decode to
    # nothing valid were skipped, and some decoded ones were rejected by the inbound validation
    assert "malformed frame from" in log and "skipping a malformed item" in log
    assert "cluster_message_rejected" in log


def test_brokers_stop_dialing_a_broker_that_left_gracefully(cluster_factory: ClusterFactory) -> None:
    """SIGTERM: the leaving broker tells its peers (``ClassInterest.leaving``, with its origin
    proof); they keep what it misses in their send logs (it may be restarting) but stop probing,
    resending to and dialing its address until it talks to them again. A broker that comes back
    is taken back (its first message) and linked again."""
    cluster = cluster_factory(3)
    departed = cluster.brokers[2].peer_id
    assert cluster.stop_broker(2) == 0

    def dials() -> int:
        return sum(cluster.brokers[i].log_text().count(f"dial to {departed}") for i in (0, 1))

    wait_until(
        lambda: "cluster_peer_left" in cluster.brokers[0].log_text(), 10.0, what="broker 0 saw it leave"
    )
    time.sleep(1.0)  # (a dial already under way when the announcement came may still fail)
    before = dials()
    time.sleep(5.0)  # more than two probe periods (2 x cluster.retransmit_ms) and resend periods
    assert dials() == before, f"{dials() - before} dials to {departed} after it left"
    cluster.restart_broker(2)
    wait_until(
        lambda: (
            departed in cluster.cluster_state(0)["connected_peers"]
            and departed in cluster.cluster_state(1)["connected_peers"]
        ),
        30.0,
        what="the restarted broker linked again",
    )
