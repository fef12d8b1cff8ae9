"""The drain of a broker that is removed for good (``cluster.replicas`` > 1; docs/operations.md,
"Scaling down without loss"): its loopback HTTP endpoint, and the steps.

``POST /drain?timeout_s=N`` (loopback clients only: the Helm chart's ``preStop`` hook runs
``skipmq drain`` in the pod) starts the drain once and answers when the broker is drained or
``timeout_s`` (default 45) passed: 200 ``{"drained": true, ...}``, 504 with ``"drained": false``
when the time ran out, 409 when ``cluster.replicas`` is 1 (nothing is kept anywhere else: there is
nothing to hand over). ``GET /drain`` tells the state without starting anything.

The steps (:meth:`Drain.start`): new CONNECTs are refused and every client is disconnected (MQTT 5:
DISCONNECT 0x8B Server shutting down; each reconnects to another broker, whose takeover claim moves
its session from here), then the replication core's ``leave``: every broker it held copies for
sends them to its next holder and answers; what it holds of brokers that are down it publishes
itself. *Drained* (the core's ``drained``): its own send log and stored sessions are on N brokers
and every broker it held copies for answered. The process then waits for SIGTERM (the chart's
next step); when its links break, its holders adopt its stored sessions and publish its unreleased
log at once (no ``cluster.replica_failover_s`` wait).

SIGTERM alone drains too (:func:`drain_on_stop`, called by ``serve_until_signal`` before the
stop): the same steps, at most ``cluster.drain_on_stop_s`` (30 s by default; 0 turns it off), cut
short by a second signal or once every other connected broker is leaving too (a whole cluster
stopping: nobody stays to take anything); skipped when no other broker is connected.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from broker.adapters.server import BrokerServer

log = logging.getLogger("skipmq.server")

DEFAULT_TIMEOUT_S = 45.0
MAX_TIMEOUT_S = 3600.0
POLL_S = 0.05


class Drain:
    """One broker process's drain (started at most once)."""

    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.started_at: float | None = None
        self.drained_at: float | None = None

    def replication(self) -> Any:
        runtime = self.server.runtime
        return None if runtime is None else runtime.replication

    def start(self) -> None:
        if self.started_at is not None:
            return
        replication = self.replication()
        broker = self.server.broker
        if replication is None or broker is None:
            return
        self.started_at = time.monotonic()
        broker.log_event(logging.WARNING, "drain_started", node_id=broker.node_id)
        broker.disconnect_all()  # refuses new CONNECTs from now on; clients move to other brokers
        replication.leave()

    def drained(self) -> bool:
        replication = self.replication()
        if replication is None or self.started_at is None or not replication.drained():
            return False
        if self.drained_at is None:
            self.drained_at = time.monotonic()
            broker = self.server.broker
            if broker is not None:
                broker.log_event(
                    logging.WARNING,
                    "drained",
                    node_id=broker.node_id,
                    seconds=round(self.drained_at - self.started_at, 3),
                )
        return True

    async def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.drained():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

    def state(self) -> dict[str, Any]:
        replication = self.replication()
        gauges = replication.gauges() if replication is not None else {}
        started = self.started_at
        return {
            "replicas": self.server.config.cluster.replicas,
            "started": started is not None,
            "drained": self.drained(),
            "seconds": round(time.monotonic() - started, 3) if started is not None else 0.0,
            "under_replicated_entries": gauges.get("under_replicated", 0),
            "under_replicated_sessions": gauges.get("under_replicated_sessions", 0),
            "held_entries": gauges.get("held_entries", 0),
            "held_sessions": gauges.get("held_sessions", 0),
        }

    # ------------------------------------------------------------------ HTTP
    def routes(self, app: web.Application) -> None:
        app.router.add_route("GET", "/drain", self._get)
        app.router.add_route("POST", "/drain", self._post)

    async def _get(self, request: web.Request) -> web.Response:
        refused = _refused(request)
        return refused if refused is not None else _json(200, self.state())

    async def _post(self, request: web.Request) -> web.Response:
        refused = _refused(request)
        if refused is not None:
            return refused
        if self.replication() is None:
            return _json(
                409,
                {
                    **self.state(),
                    "detail": "cluster.replicas is 1: nothing of this broker is kept elsewhere, "
                    "there is nothing to hand over (a plain SIGTERM stops it gracefully)",
                },
            )
        try:
            timeout_s = float(request.query.get("timeout_s", DEFAULT_TIMEOUT_S))
        except ValueError:
            return _json(400, {"detail": "timeout_s: not a number"})
        if not 0 <= timeout_s <= MAX_TIMEOUT_S:
            return _json(400, {"detail": f"timeout_s: between 0 and {MAX_TIMEOUT_S:g}"})
        self.start()
        done = await self.wait(timeout_s)
        return _json(200 if done else 504, self.state())


async def drain_on_stop(server: BrokerServer, again: asyncio.Event) -> bool | None:
    """SIGTERM/SIGINT of a broker with ``cluster.replicas`` > 1: the drain's steps before the stop,
    waiting at most ``cluster.drain_on_stop_s`` or until ``again`` is set (a second signal: stop
    now). None when no drain ran (one copy, 0 seconds configured, no drain endpoint, or no other
    broker connected: nobody to hand anything to); else whether it drained. A drain that the
    chart's preStop already finished returns True at once."""
    drain = server.drain
    timeout_s = float(server.config.cluster.drain_on_stop_s)
    if drain is None or drain.replication() is None or timeout_s <= 0:
        return None
    broker = server.broker
    runtime = server.runtime
    transport = getattr(getattr(runtime, "engine", None), "transport", None)
    peers = transport.connected_peers() if transport is not None else frozenset()
    if drain.started_at is None and not peers:
        if broker is not None:
            broker.log_event(logging.WARNING, "drain_skipped", reason="no other broker is connected")
        return None
    drain.start()
    deadline = time.monotonic() + timeout_s
    why = "timed_out"
    while not drain.drained():
        if again.is_set():
            why = "interrupted"
            break
        if time.monotonic() >= deadline:
            break
        connected = transport.connected_peers() if transport is not None else frozenset()
        if not connected - _leaving_members(drain):
            why = "abandoned"  # every other broker is leaving too (the whole cluster stops)
            break
        await asyncio.sleep(POLL_S)
    else:
        return True
    if broker is not None:
        broker.log_event(logging.WARNING, f"drain_{why}", timeout_s=timeout_s, **drain.state())
    return False


def _leaving_members(drain: Drain) -> frozenset[str]:
    replication = drain.replication()
    core = None if replication is None else replication.core
    return frozenset() if core is None else core.leaving_members()


def _refused(request: web.Request) -> web.Response | None:
    """Only a process on this host may drain the broker (no credentials: the chart's preStop)."""
    peer = request.remote or ""
    try:
        local = ipaddress.ip_address(peer.split("%")[0]).is_loopback
    except ValueError:
        local = False
    if local:
        return None
    return _json(403, {"detail": "the drain is served to loopback clients only"})


def _json(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")
