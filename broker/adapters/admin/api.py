"""The admin API on the broker's HTTP listener: ``/admin/v1/*`` (aiohttp, as the pull gateway),
its OpenAPI 3 document at ``/admin/v1/openapi.json`` and the web console at ``/console/``.

This module is the plumbing every endpoint shares: authentication (admin users with HTTP Basic,
or a request signed by another broker: ``access``), roles (``readonly`` reads, ``admin`` also
changes), a custom header required on every unsafe method (``X-Requested-By``: no cross-site
form can send it, so a browser that remembered Basic credentials cannot be made to act),
RFC 9457 ``application/problem+json`` errors, every refusal logged as an ``admin_refused`` line,
too many refused requests from one address answered 429 before any password is hashed, and the
cluster-wide paging (``paged``): a cursor holds each broker's position, a page merges every
broker's next items in key order. The endpoints themselves are in ``reads``, ``writes`` and
``traces``; the route table is ``routes.ROUTES``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import json
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.adapters.admin.access import (
    CERT_HEADER,
    SIGNATURE_HEADER,
    AdminUsers,
    BrokerSigner,
    BrokerVerifier,
    Principal,
    basic_credentials,
    canonical_target,
)
from broker.adapters.admin.fanout import CSRF_HEADER, Directory, Endpoint, Fanout, Gathered, default_admin_url
from broker.adapters.admin.local import Key, LocalView, Page
from broker.adapters.admin.responses import ApiError, Route, json_response, problem
from broker.core.pull import RateLimiter
from broker.logs import log_event

if TYPE_CHECKING:
    from broker.adapters.admin.dynamic import DynamicAuth
    from broker.adapters.admin.traces import Traces
    from broker.adapters.server import BrokerServer

log = logging.getLogger("skipmq.admin")

CONSOLE_DIR = Path(__file__).with_name("console")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
FAILURES_PER_S = 5  # wrong passwords or signatures per second and source address before 429
CONSOLE_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


INTERNAL_QUERY = frozenset({"scope", "after"})  # one broker's part, asked by another (not documented)


@functools.cache
def route_query_names(route: Route) -> frozenset[str]:
    """The query parameters the OpenAPI document lists for ``route``."""
    from broker.adapters.admin.openapi import document

    path = re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.path)
    operation = document()["paths"].get(path, {}).get(route.method.lower(), {})
    return frozenset(p["name"] for p in operation.get("parameters", []) if p["in"] == "query")


def encode_cursor(after: dict[str, list[str] | None]) -> str:
    raw = json.dumps({"v": 1, "after": after}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str | None) -> dict[str, Key | None] | None:
    """node id -> the last key seen there (None: that broker is done); None without a cursor."""
    if not text:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        body = json.loads(raw)
        after = body["after"]
        if body.get("v") != 1 or not isinstance(after, dict):
            raise ValueError
        result: dict[str, Key | None] = {}
        for node, key in after.items():
            if key is None:
                result[str(node)] = None
            elif isinstance(key, list) and all(isinstance(part, str) for part in key):
                result[str(node)] = tuple(key)
            else:
                raise ValueError
        return result
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ApiError(400, "cursor: not a cursor this API returned") from None


def decode_after(text: str | None) -> Key | None:
    if not text:
        return None
    try:
        key = json.loads(text)
    except ValueError:
        raise ApiError(400, "after: must be a JSON list of strings") from None
    if not isinstance(key, list) or not all(isinstance(part, str) for part in key):
        raise ApiError(400, "after: must be a JSON list of strings")
    return tuple(key)


class AdminApi:
    """The admin API of one broker process."""

    def __init__(self, server: BrokerServer, dynamic: DynamicAuth) -> None:
        from broker.adapters.admin.traces import Traces

        self.server = server
        self.config = server.config
        self.dynamic = dynamic
        self.view = LocalView(server)
        self.users = AdminUsers(self.config.admin.users_file)
        broker = server.broker
        assert broker is not None
        self.broker = broker
        self.directory = Directory(broker)
        cluster = self.config.cluster
        secure = cluster.enabled and not cluster.insecure
        self.signer: BrokerSigner | None = None
        self.verifier = BrokerVerifier(cluster.tls_ca_file) if secure and cluster.tls_ca_file else None
        self.fanout = Fanout(server, self.directory, None)
        self.failures = RateLimiter(FAILURES_PER_S)
        self.traces: Traces = Traces(self)
        self.url = ""

    @property
    def node_id(self) -> str:
        return self.broker.node_id

    # ------------------------------------------------------------------ life cycle
    def routes(self, app: web.Application) -> None:
        from broker.adapters.admin.routes import ROUTES

        for route in ROUTES:
            app.router.add_route(route.method, route.path, self._guarded(route))
        app.router.add_get("/admin/v1/openapi.json", self._openapi)
        if self.config.admin.console:
            app.router.add_get("/console", self._console_redirect)
            app.router.add_get("/console/", self._console_file)
            app.router.add_get("/console/{name}", self._console_file)
        app.on_shutdown.append(self._shutdown)

    async def _shutdown(self, _app: web.Application) -> None:
        await self.close()

    def started(self, http_port: int) -> None:
        """The HTTP listener is bound: announce this broker's admin endpoint to the cluster."""
        self.url = default_admin_url(self.server, http_port)
        runtime = self.server.runtime
        peer_id = runtime.engine.peer_id if runtime is not None else ""
        cluster = self.config.cluster
        if runtime is not None and not cluster.insecure and cluster.tls_cert_file:
            self.signer = BrokerSigner(peer_id, cluster.tls_cert_file, cluster.tls_key_file)
            self.fanout.signer = self.signer
        self.directory.announce(Endpoint(self.node_id, peer_id, self.url))
        log_event(log, logging.INFO, "admin_listening", url=self.url, console=self.config.admin.console)

    def withdraw(self) -> None:
        """Graceful stop: take this broker's admin endpoint out of the directory."""
        self.directory.withdraw()

    async def close(self) -> None:
        self.traces.stop_all()
        await self.fanout.close()

    # ------------------------------------------------------------------ access
    def refused(self, request: web.Request, status: int, reason: str, user: str | None = None) -> None:
        log_event(
            log,
            logging.WARNING,
            "admin_refused",
            status=status,
            reason=reason,
            user=user,
            method=request.method,
            path=request.path,
            remote=request.remote,
        )

    async def authenticate(self, request: web.Request, body: bytes) -> Principal | web.Response:
        source = request.remote or ""
        loop_time = asyncio.get_running_loop().time()
        if self.failures.exhausted(source, loop_time):
            self.refused(request, 429, "too many refused requests from this address")
            return problem(429, f"more than {FAILURES_PER_S} refused admin requests per second from {source}",
                           {"Retry-After": "1"})  # fmt: skip
        signature = request.headers.get(SIGNATURE_HEADER)
        if signature is not None:
            if self.verifier is None:
                return self._unauthorized(
                    request, "signed broker requests need cluster TLS (cluster.tls_ca_file)"
                )
            try:
                target = canonical_target(request.path, request.query)
                now_s = self.broker.scheduler.wall_time()
                return self.verifier.verify(
                    request.method, target, signature, request.headers.get(CERT_HEADER, ""), body, now_s
                )
            except (ValueError, OSError) as exc:
                return self._unauthorized(request, f"broker signature refused: {exc}")
        credentials = basic_credentials(request.headers.get("Authorization"))
        if isinstance(credentials, str):  # cheap to refuse: not counted against the address
            return self._unauthorized(request, credentials, counted=False)
        user, password = credentials
        self.users.refresh()
        principal = await asyncio.to_thread(self.users.check, user, password)
        if principal is None:
            return self._unauthorized(request, "wrong admin user name or password", user)
        return principal

    def _unauthorized(
        self, request: web.Request, reason: str, user: str | None = None, *, counted: bool = True
    ) -> web.Response:
        """401; a wrong password or signature counts against the source address (FAILURES_PER_S
        a second, then 429 before any more hashing)."""
        if counted:
            self.failures.allow(request.remote or "", asyncio.get_running_loop().time())
        self.refused(request, 401, reason, user)
        headers = {"WWW-Authenticate": 'Basic realm="skipmq-admin", charset="UTF-8"'}
        if request.headers.get("X-SkipMQ-Console"):  # the console's fetches: no browser dialog
            headers = {}
        return problem(401, reason, headers)

    def _guarded(self, route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                body = await self.read_body(request)
            except ApiError as exc:
                return problem(exc.status, exc.detail, **exc.extra)
            principal = await self.authenticate(request, body)
            if isinstance(principal, web.Response):
                return principal
            if route.role == "admin" and not principal.is_admin:
                self.refused(request, 403, f"role {principal.role} may not do this", principal.user)
                return problem(
                    403, f"admin user {principal.user!r} has role {principal.role}; this needs role admin"
                )
            unknown = set(request.query) - route_query_names(route) - INTERNAL_QUERY
            if unknown:
                return problem(400, f"unknown query parameters: {', '.join(sorted(unknown))}")
            if request.method not in ("GET", "HEAD") and not request.headers.get(CSRF_HEADER):
                self.refused(request, 403, f"missing {CSRF_HEADER} header", principal.user)
                return problem(403, f"a {request.method} request needs the {CSRF_HEADER} header (any value)")
            try:
                return await route.handler(self, request, principal)
            except ApiError as exc:
                if exc.status in (401, 403):
                    self.refused(request, exc.status, exc.detail, principal.user)
                return problem(exc.status, exc.detail, **exc.extra)

        return handle

    async def read_body(self, request: web.Request) -> bytes:
        if request.method in ("GET", "HEAD"):
            return b""
        limit = 1 << 20
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, f"the body is larger than {limit} bytes")
        try:
            async with asyncio.timeout(self.config.http.header_timeout_s):
                data = await request.content.read(limit + 1)
                while len(data) <= limit:
                    more = await request.content.read(limit + 1 - len(data))
                    if not more:
                        break
                    data += more
        except TimeoutError:
            raise ApiError(408, "the body did not arrive within http.header_timeout_s") from None
        if len(data) > limit:
            raise ApiError(413, f"the body is larger than {limit} bytes")
        request["admin_body"] = data
        return data

    @staticmethod
    def json_body(request: web.Request) -> dict[str, Any]:
        data = request.get("admin_body", b"")
        if not data:
            raise ApiError(400, "a JSON object body is required")
        if request.content_type not in ("application/json", "application/octet-stream", ""):
            raise ApiError(415, f"the body must be application/json, not {request.content_type}")
        try:
            body = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        for name, value in body.items():
            if value is None:
                raise ApiError(400, f"{name}: null is not allowed (leave the field out)")
        return body

    @staticmethod
    def text_body(request: web.Request) -> str:
        if not request.get("admin_body"):
            raise ApiError(400, "a text body is required (the file's content)")
        try:
            return bytes(request.get("admin_body", b"")).decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "the body must be UTF-8 text") from None

    # ------------------------------------------------------------------ query parameters
    @staticmethod
    def int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
        text = request.query.get(name)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            raise ApiError(400, f"{name}: must be an integer in {low}..{high}") from None
        if not low <= value <= high:
            raise ApiError(400, f"{name}: must be an integer in {low}..{high}, got {value}")
        return value

    @staticmethod
    def bool_param(request: web.Request, name: str) -> bool | None:
        text = request.query.get(name)
        if text is None:
            return None
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ApiError(400, f"{name}: must be true or false")

    @staticmethod
    def is_local(request: web.Request) -> bool:
        scope = request.query.get("scope", "cluster")
        if scope not in ("cluster", "local"):
            raise ApiError(400, "scope: must be cluster or local")
        return scope == "local"

    # ------------------------------------------------------------------ cluster-wide
    async def gather(
        self,
        request: web.Request,
        principal: Principal,
        local: Callable[[], Awaitable[Any]] | None,
        *,
        query: dict[str, str] | Callable[[str], dict[str, str] | None] | None = None,
        only: str | None = None,
    ) -> Gathered:
        if query is None:
            query = {k: v for k, v in request.query.items() if k != "scope"}
        return await self.fanout.gather(
            request.method,
            request.path,
            query,
            principal,
            local,
            authorization=request.headers.get("Authorization"),
            body=request.get("admin_body", b""),
            only=only,
        )

    async def paged(
        self,
        request: web.Request,
        principal: Principal,
        local_page: Callable[[Key | None, int], Page],
        *,
        only: str | None = None,
    ) -> web.Response:
        """A cluster-wide page of ``local_page``'s items (see the module docstring)."""
        limit = self.int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        if self.is_local(request):
            return json_response(local_page(decode_after(request.query.get("after")), limit).as_json())
        cursor = decode_cursor(request.query.get("cursor"))
        base = {
            k: v for k, v in request.query.items() if k not in ("cursor", "scope", "after", "limit", "broker")
        }
        base["limit"] = str(limit)
        own = self.node_id
        only_local = only is not None and only in (own, self.view.peer_id)

        def query_for(node: str) -> dict[str, str] | None:
            if cursor is not None and node in cursor and cursor[node] is None:
                return None
            after = cursor.get(node) if cursor is not None else None
            return {**base, **({"after": json.dumps(list(after))} if after is not None else {})}

        async def local() -> dict[str, Any]:
            after = cursor.get(own) if cursor is not None else None
            return local_page(after, limit).as_json()

        own_done = cursor is not None and own in cursor and cursor[own] is None
        run_local = None if own_done or (only is not None and not only_local) else local
        if only_local:
            gathered = Gathered()
            gathered.parts[own] = (
                await local() if run_local is not None else {"items": [], "keys": [], "more": False}
            )
        else:
            gathered = await self.gather(request, principal, run_local, query=query_for, only=only)
            if only is not None and not gathered.parts and not gathered.missing:
                raise ApiError(404, f"broker: no broker {only!r} in the cluster")
        merged: list[tuple[Key, str, dict[str, Any]]] = []
        more: dict[str, bool] = {}
        for node, part in gathered.parts.items():
            if not isinstance(part, dict) or "items" not in part:
                continue
            more[node] = bool(part.get("more"))
            for key, item in zip(part.get("keys", []), part["items"], strict=False):
                merged.append((tuple(key), node, item))
        merged.sort(key=lambda entry: (entry[0], entry[1]))
        taken = merged[:limit]
        after: dict[str, list[str] | None] = {}  # None: that broker is done
        if cursor is not None:
            after.update({node: (list(key) if key is not None else None) for node, key in cursor.items()})
        last: dict[str, Key] = {}
        for key, node, _item in taken:
            last[node] = key
        counts = {node: sum(1 for _k, n, _i in merged if n == node) for node in gathered.parts}
        for node in gathered.parts:
            taken_here = sum(1 for _k, n, _i in taken if n == node)
            if node in last:
                after[node] = list(last[node])
            if taken_here == counts.get(node, 0) and not more.get(node, False):
                after[node] = None  # that broker has nothing more
        pending = [node for node, key in after.items() if key is not None]
        return json_response(
            {
                "items": [item for _key, _node, item in taken],
                "next_cursor": encode_cursor(after) if pending else None,
                "brokers": sorted(gathered.parts),
                "missing": gathered.missing,
                "complete": not gathered.missing,
            }
        )

    # ------------------------------------------------------------------ documents and files
    async def _openapi(self, request: web.Request) -> web.Response:
        from broker.adapters.admin.openapi import document

        return json_response(document())

    async def _console_redirect(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/console/")

    async def _console_file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info.get("name", "index.html") or "index.html"
        path = CONSOLE_DIR / name
        if "/" in name or name.startswith(".") or path.suffix not in CONSOLE_TYPES or not path.is_file():
            return web.Response(status=404, text="not found\n")
        headers = dict(SECURITY_HEADERS)
        headers["Cache-Control"] = "no-cache"
        return web.Response(body=path.read_bytes(), content_type=CONSOLE_TYPES[path.suffix], headers=headers)
