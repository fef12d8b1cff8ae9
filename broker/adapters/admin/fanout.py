"""Cluster-wide admin answers: which brokers there are, and asking each for its part over HTTP.

**Directory.** A broker serving the admin API announces where: a retained message on
``$skipmq/admin/brokers/<node id>`` (a reserved topic, ``broker.core.reserved``) with its node id,
peer id and admin URL. The cluster replicates it to every broker like any retained message (and
a broker that joins gets it with the retained copy), so every broker knows every other broker's
admin endpoint without a message kind of its own. A broker stopping gracefully withdraws it.

**Fan-out.** A cluster-wide request asks this broker's part directly and every other broker
that is announced *and* linked to this one (the overlay's view of the members: a broker that is
announced but not linked, or linked but not announced, is named in ``missing`` with the reason)
over HTTP, all at once, each with the deadline ``admin.fanout_timeout_ms``. A broker that does
not answer in time (or answers an error) is named in ``missing``; the others' parts are used.
The call is signed with this broker's cluster key (``access.BrokerSigner``), or carries the
caller's own credentials when the cluster links are insecure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from broker import __version__
from broker.adapters.admin.access import canonical_target
from broker.core.reserved import RESERVED_PREFIX
from broker.core.session import Message

if TYPE_CHECKING:
    from aiohttp import ClientSession

    from broker.adapters.admin.access import BrokerSigner, Principal
    from broker.adapters.server import BrokerServer
    from broker.core.broker import Broker

log = logging.getLogger("skipmq.admin")

DIRECTORY_PREFIX = RESERVED_PREFIX + "admin/brokers/"
CSRF_HEADER = "X-Requested-By"  # unsafe methods need it (no cross-site form can set it)


def directory_topic(node_id: str) -> str:
    return DIRECTORY_PREFIX + quote(node_id, safe="")


def default_admin_url(server: BrokerServer, http_port: int) -> str:
    """``admin.advertise_url``, else the HTTP listener's address (a wildcard bind is replaced by
    the cluster's advertised host or this host's name)."""
    config = server.config
    if config.admin.advertise_url:
        return config.admin.advertise_url.rstrip("/")
    host = config.http.host
    if host in ("0.0.0.0", "::", ""):
        host = config.cluster.advertise_host or socket.gethostname()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    scheme = "https" if config.http.certfile else "http"
    return f"{scheme}://{host}:{http_port}"


@dataclass(frozen=True, slots=True)
class Endpoint:
    node_id: str
    peer_id: str
    url: str
    version: str = ""


class Directory:
    """The admin endpoints announced in the retained store."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.own: Endpoint | None = None

    def announce(self, endpoint: Endpoint) -> None:
        self.own = endpoint
        payload = json.dumps(
            {
                "v": 1,
                "node_id": endpoint.node_id,
                "peer_id": endpoint.peer_id,
                "url": endpoint.url,
                "version": endpoint.version or __version__,
                "at_ms": int(time.time() * 1000),
            },
            separators=(",", ":"),
        ).encode()
        self._publish(directory_topic(endpoint.node_id), payload)

    def withdraw(self) -> None:
        if self.own is not None:
            self._publish(directory_topic(self.own.node_id), b"")
            self.own = None

    def _publish(self, topic: str, payload: bytes) -> None:
        broker = self.broker
        broker.router.publish(Message(topic, payload, 1, True, {}, None, broker.node_id, None), None)
        broker.after_batch()

    def entries(self) -> list[Endpoint]:
        found = []
        for _topic, message in self.broker.retained.match(DIRECTORY_PREFIX + "+"):
            try:
                body = json.loads(message.payload)
                found.append(
                    Endpoint(
                        str(body["node_id"]),
                        str(body.get("peer_id") or ""),
                        str(body["url"]),
                        str(body.get("version", "")),
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue
        return found


@dataclass(slots=True)
class Gathered:
    """The parts of a cluster-wide answer: node id -> body, and who is missing and why."""

    parts: dict[str, Any] = field(default_factory=dict)
    missing: list[dict[str, str]] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)


class Fanout:
    def __init__(self, server: BrokerServer, directory: Directory, signer: BrokerSigner | None) -> None:
        self.server = server
        self.directory = directory
        self.signer = signer
        self.timeout_s = server.config.admin.fanout_timeout_ms / 1000.0
        self._session: ClientSession | None = None
        cafile = server.config.admin.peer_cafile or None
        self._ssl = ssl.create_default_context(cafile=cafile)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> ClientSession:
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, ssl=self._ssl), raise_for_status=False
            )
        return self._session

    def targets(self, only: str | None = None) -> tuple[list[Endpoint], list[dict[str, str]]]:
        """The other brokers to ask (announced and linked), and the members that cannot be."""
        own = self.directory.own
        runtime = self.server.runtime
        if runtime is None:
            return [], []
        engine = runtime.engine
        connected = set(engine.state()["connected_peers"]) - {engine.peer_id}
        targets, missing = [], []
        announced_peers = set()
        own_node = own.node_id if own is not None else self.server.config.node_id
        for endpoint in sorted(self.directory.entries(), key=lambda e: e.node_id):
            if endpoint.node_id == own_node or endpoint.peer_id == engine.peer_id:
                continue
            announced_peers.add(endpoint.peer_id)
            if only is not None and only not in (endpoint.node_id, endpoint.peer_id):
                continue
            if endpoint.peer_id in connected:
                targets.append(endpoint)
            else:
                missing.append(
                    {
                        "broker": endpoint.node_id,
                        "peer_id": endpoint.peer_id,
                        "reason": "not linked to this broker",
                    }
                )
        for peer in sorted(connected - announced_peers):
            if only is None or only == peer:
                missing.append(
                    {
                        "broker": peer,
                        "peer_id": peer,
                        "reason": "no admin endpoint announced (admin.enabled off?)",
                    }
                )
        return targets, missing

    async def gather(
        self,
        method: str,
        path: str,
        query: dict[str, str] | Callable[[str], dict[str, str] | None],
        principal: Principal,
        local: Callable[[], Awaitable[Any]] | None,
        *,
        authorization: str | None = None,
        body: bytes = b"",
        only: str | None = None,
    ) -> Gathered:
        """This broker's part (``local``, when given) and every other broker's, asked with
        ``method path?query&scope=local`` (``query`` may be a function of the node id, None: do
        not ask that broker); answers other than 2xx count as missing."""
        gathered = Gathered()
        targets, missing = self.targets(only)
        gathered.missing.extend(missing)
        own = self.directory.own
        own_node = own.node_id if own is not None else self.server.config.node_id
        tasks: list[tuple[str, asyncio.Task[tuple[int, Any]]]] = []
        for endpoint in targets:
            asked = query(endpoint.node_id) if callable(query) else query
            if asked is None:
                continue
            task = asyncio.ensure_future(
                self._ask(endpoint, method, path, {**asked, "scope": "local"}, principal, authorization, body)
            )
            tasks.append((endpoint.node_id, task))
        if local is not None:
            gathered.parts[own_node] = await local()
            gathered.statuses[own_node] = 200
        for node_id, task in tasks:
            try:
                status, answer = await task
            except TimeoutError:
                gathered.missing.append(
                    {
                        "broker": node_id,
                        "reason": f"no answer within admin.fanout_timeout_ms = {int(self.timeout_s * 1000)}",
                    }
                )
                continue
            except Exception as exc:
                gathered.missing.append({"broker": node_id, "reason": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            gathered.statuses[node_id] = status
            if 200 <= status < 300:
                gathered.parts[node_id] = answer
            elif status == 404 and isinstance(answer, dict) and answer.get("type") == "about:blank#not-here":
                continue  # the resource is not on that broker: not a failure
            else:
                detail = answer.get("detail") if isinstance(answer, dict) else str(answer)[:200]
                gathered.missing.append({"broker": node_id, "reason": f"HTTP {status}: {detail}"})
        return gathered

    async def _ask(
        self,
        endpoint: Endpoint,
        method: str,
        path: str,
        query: dict[str, str],
        principal: Principal,
        authorization: str | None,
        body: bytes,
    ) -> tuple[int, Any]:
        target = path + "?" + urlencode(sorted(query.items()))
        headers = {CSRF_HEADER: "skipmq-broker", "Content-Type": "application/json"}
        if self.signer is not None:
            headers.update(self.signer.headers(method, canonical_target(path, query), principal, body))
        elif authorization is not None:
            headers["Authorization"] = authorization
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with asyncio.timeout(self.timeout_s):
            async with self._client().request(
                method, endpoint.url + target, data=body or None, headers=headers, timeout=timeout
            ) as response:
                text = await response.read()
                try:
                    answer = json.loads(text) if text else None
                except ValueError:
                    answer = text.decode(errors="replace")[:200]
                return response.status, answer
