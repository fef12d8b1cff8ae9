"""Review of issue #4 with two brokers: crossing session claims (broker/cluster/engine.py
``_on_claim`` and takeover.py; docs/cluster.md "Session takeover across brokers": claims are
ordered, an older claim never takes the client from a newer connection).

Two real clustered brokers in this process (real gRPC links), on the default
``cluster.takeover_wait_ms``. Broker A holds a stored session; the client reconnects to A, whose
claim waits for B's answer. Meanwhile an *older* claim of the same client id from B reaches A (the
two claims crossed in the overlay; it is delivered on A's loop right after A made its claim).
A's waiting CONNECT is the newer connection: A must keep the session, not hand it to B's losing
connection (which would leave the client without its subscriptions).
Also: the retained-store copy a (re)joining broker asks for carries deletions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.adapters.server import ThreadedBroker
from broker.cluster.engine import ClusterEngine
from broker.cluster.messages import RetainedSyncRequest, RetainedUpdate, SessionClaim
from broker.core.session import Message
from broker.mqtt.packets import MQTT_3_1_1, Connack, Connect
from tests.support.core import RawClient, start_broker

__all__ = ["start_broker"]  # the fixture
Start = Callable[..., ThreadedBroker]
WAIT_S = 10.0


def _engine(threaded: ThreadedBroker) -> ClusterEngine:
    runtime = threaded.server.runtime
    assert runtime is not None
    return runtime.engine


def _wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_waiting_newer_connect_keeps_its_session_against_an_older_crossing_claim(
    start_broker: Start, tmp_path: Path
) -> None:
    common = {"cluster__enabled": True, "cluster__port": 0, "cluster__host": "127.0.0.1"}
    broker_a = start_broker(**common)
    runtime_a = _engine(broker_a)
    broker_b = start_broker(
        data_dir=tmp_path / "b",
        cluster__join=runtime_a.peer_id,
        **common,
    )
    runtime_b = _engine(broker_b)
    _wait_for(lambda: runtime_b.peer_id in broker_a.call(_peers, runtime_a), "A linked to B")

    first = RawClient(broker_a.ports["tcp"])
    first.send(_reconnect("crossing"))
    first.expect(Connack, timeout_s=WAIT_S)
    first.subscribe("keep/#", 1)
    first.disconnect()
    _wait_for(
        lambda: broker_a.call(lambda: broker_a.broker.sessions["crossing"].connection is None),
        "the stored session",
    )

    # B's older claim reaches A while A's CONNECT still waits for its own claim's answers (on the
    # default cluster.takeover_wait_ms, 500 ms): it is delivered as the next event of A's loop
    # after A made its claim, so the crossing does not depend on how fast this thread is
    takeover = runtime_a.takeover
    assert takeover is not None
    make_claim = takeover.claim
    crossed: list[bool] = []  # whether A's claim was still waiting when B's claim arrived

    def deliver(older: SessionClaim, mine: int) -> None:
        crossed.append(mine in takeover._claims)
        runtime_a._on_claim(older)

    def claim_then_cross(client_id: str, *args: Any, **kwargs: Any) -> tuple[SessionClaim, bool]:
        claim, waits = make_claim(client_id, *args, **kwargs)
        if client_id == "crossing" and not crossed:
            # B's claim, made a millisecond earlier than ours, crossed ours in the overlay
            older = SessionClaim(runtime_b.peer_id, "crossing", claim.claim_id - 1_000_000, False)
            asyncio.get_running_loop().call_soon(deliver, older, claim.claim_id)
        return claim, waits

    broker_a.call(setattr, takeover, "claim", claim_then_cross)
    again = RawClient(broker_a.ports["tcp"])
    again.send(_reconnect("crossing"))
    connack = again.expect(Connack, timeout_s=WAIT_S)
    assert crossed == [True], "B's claim did not arrive while A's CONNECT waited"
    assert connack.session_present  # the newer connection kept the session and its subscription
    publisher = RawClient(broker_a.ports["tcp"])
    publisher.connect("keep-publisher")
    publisher.publish_acked("keep/a", b"still subscribed", qos=1)
    assert again.expect_publish().payload == b"still subscribed"


def test_a_retained_copy_carries_deletions(start_broker: Start, tmp_path: Path) -> None:
    """docs/cluster.md "Retained messages": a broker that asks for the retained store also learns
    the topics deleted while it was away (it may still hold them from its own disk)."""
    common = {"cluster__enabled": True, "cluster__port": 0, "cluster__host": "127.0.0.1"}
    broker_a = start_broker(**common)
    runtime_a = _engine(broker_a)
    broker_b = start_broker(data_dir=tmp_path / "b", cluster__join=runtime_a.peer_id, **common)
    runtime_b = _engine(broker_b)
    _wait_for(lambda: runtime_b.peer_id in broker_a.call(_peers, runtime_a), "A linked to B")
    stale = Message("gone/x", b"stale", qos=0, retain=True, origin="old")
    broker_b.call(broker_b.broker.set_retained, stale)  # B's copy from before it went down
    deleted_ms = time.time_ns() // 1_000_000
    deletion = RetainedUpdate("peer-q:1", deleted_ms, Message("gone/x", b"", qos=0, retain=True))
    broker_a.call(runtime_a._apply_retained, deletion)  # deleted cluster-wide while B was away
    request = RetainedSyncRequest(9_999)
    broker_b.call(runtime_b._send_envelope, runtime_a.peer_id, "", 9_999, request)
    _wait_for(lambda: broker_b.call(broker_b.broker.retained.get, "gone/x") is None, "the deletion on B")
    assert broker_b.call(lambda: runtime_b.retained_sync.versions["gone/x"]) == (deleted_ms, "peer-q:1")


def _reconnect(client_id: str) -> Connect:
    return Connect(
        client_id=client_id,
        protocol_level=MQTT_3_1_1,
        protocol_name="MQTT",
        clean_start=False,
        keep_alive_s=60,
    )


def _peers(engine: ClusterEngine) -> frozenset[str]:
    assert engine.transport is not None
    return engine.transport.connected_peers()
