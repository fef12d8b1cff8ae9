"""The pull gateway's HTTP API on aiohttp (seed 001 §4; docs/pull.md; the OpenAPI 3 document is
``broker/adapters/pull_openapi.json``, served at ``GET /v1/openapi.json``).

Thin handlers: read a bounded JSON body, parse with ``broker.core.pull``, drive the client id's
:class:`broker.adapters.pull_sessions.PullLink`, answer JSON. Errors are RFC 9457
``application/problem+json`` documents whose ``detail`` says what was wrong and whose ``limit``
names the limit that refused the request (``pull.max_body_bytes``, ``acks_per_request``,
``pull.max_wait_s``, ``pull.requests_per_s``, ``pull.failures_per_s``).

Two rate limits, so that nobody can slow a device down by naming its client id: a request is
counted against its client id (``pull.requests_per_s``) only once its credentials checked out; a
refused one (bad or missing credentials, a malformed body) is counted against its source address
(``pull.failures_per_s``), and an address over that limit gets 429 before its credentials are
checked again (no password hashing for a flood).

Credentials are the MQTT ones (the broker's password file and ACL): HTTP Basic
(``Authorization: Basic base64(user:password)``) or ``username`` / ``password`` fields in the body.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.adapters.pull_sessions import PullError, PullGateway, PullLink
from broker.core.pull import (
    MAX_MESSAGES,
    Problem,
    RateLimiter,
    bad_request,
    parse_open,
    parse_publish,
    parse_pull,
)
from broker.mqtt.packets import Publish

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.core.broker import Broker

log = logging.getLogger("skipmq.pull")

OPENAPI_PATH = Path(__file__).with_name("pull_openapi.json")
PROBLEM_JSON = "application/problem+json"


def problem_response(problem: Problem, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=problem.status,
        text=json.dumps(problem.body()),
        content_type=PROBLEM_JSON,
        headers=headers,
    )


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


class PullHttpApi:
    """The /v1 routes of one broker."""

    def __init__(self, broker: Broker, config: BrokerConfig) -> None:
        self.broker = broker
        self.pull = config.pull
        self.gateway = PullGateway(broker, config)
        self.rate = RateLimiter(config.pull.requests_per_s)
        self.failures = RateLimiter(config.pull.failures_per_s)
        self.body_timeout_s = config.http.header_timeout_s
        self._openapi: bytes | None = None

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/openapi.json", self.openapi)
        app.router.add_post("/v1/pull", self.pull_messages)
        app.router.add_post("/v1/publish", self.publish)
        app.router.add_post("/v1/sessions/open", self.open_session)
        app.router.add_post("/v1/sessions/close", self.close_session)
        app.router.add_post("/v1/sessions/subscriptions", self.subscriptions)
        app.on_shutdown.append(self._shutdown)

    async def _shutdown(self, _app: web.Application) -> None:
        self.gateway.close_all()

    async def openapi(self, _request: web.Request) -> web.Response:
        if self._openapi is None:
            self._openapi = OPENAPI_PATH.read_bytes()
        return web.Response(body=self._openapi, content_type="application/json")

    # ---------------------------------------------------------------- request plumbing
    async def _body(self, request: web.Request) -> dict[str, Any] | Problem:
        limit = self.pull.max_body_bytes
        too_large = Problem(
            413,
            "Content Too Large",
            f"the body is larger than pull.max_body_bytes = {limit} bytes",
            "pull.max_body_bytes",
        )
        if request.content_length is not None and request.content_length > limit:
            return too_large
        data = bytearray()
        try:
            async with asyncio.timeout(self.body_timeout_s):  # a body trickled byte by byte
                while True:
                    chunk = await request.content.read(limit + 1 - len(data))
                    if not chunk:
                        break
                    data += chunk
                    if len(data) > limit:
                        return too_large
        except TimeoutError:
            return Problem(
                408,
                "Request Timeout",
                f"the body did not arrive within http.header_timeout_s = {self.body_timeout_s} s",
                "http.header_timeout_s",
            )
        try:
            body = json.loads(data or b"{}")
        except (ValueError, UnicodeDecodeError) as exc:
            return bad_request(f"the body is not JSON: {exc}")
        if not isinstance(body, dict):
            return bad_request("the body must be a JSON object")
        return body

    def _credentials(
        self, request: web.Request, body: dict[str, Any]
    ) -> tuple[str | None, str | None] | Problem:
        """HTTP Basic, else the body's ``username`` / ``password`` (whose types are checked
        either way: a malformed body is refused even when a header carries the credentials)."""
        body_user = body.get("username")
        body_password = body.get("password")
        if (body_user is not None and not isinstance(body_user, str)) or (
            body_password is not None and not isinstance(body_password, str)
        ):
            return bad_request("username and password are strings")
        for text in (body_user, body_password):
            if text is not None and not _encodable(text):
                return bad_request("username and password must be valid UTF-8 text")
        if body_user is not None and "\x00" in body_user:
            return bad_request("username: no NUL (an MQTT user name is UTF-8 text without NUL)")
        header = request.headers.get("Authorization")
        if header is None:
            return body_user, body_password
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return Problem(401, "Unauthorized", "only HTTP Basic authentication is supported")
        try:
            user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            return Problem(401, "Unauthorized", "the Authorization header is not valid Basic credentials")
        if not sep:
            return Problem(401, "Unauthorized", "Basic credentials need user:password")
        if "\x00" in user:
            return Problem(401, "Unauthorized", "the Basic user name holds a NUL")
        return user, password

    @staticmethod
    def _source(request: web.Request) -> str:
        """The peer address the failures are counted against (not X-Forwarded-For: a client
        could name any address there)."""
        return request.remote or ""

    def _failed(self, request: web.Request) -> None:
        """Count one refused request against its source address."""
        self.failures.allow(self._source(request), self.broker.scheduler.time())

    async def _prepare(
        self, request: web.Request, parse: Any
    ) -> tuple[Any, str | None, str | None] | web.Response:
        source = self._source(request)
        if self.failures.exhausted(source, self.broker.scheduler.time()):
            return problem_response(
                Problem(
                    429,
                    "Too Many Requests",
                    f"more than pull.failures_per_s = {self.failures.rate_per_s} refused requests "
                    f"per second from {source}",
                    "pull.failures_per_s",
                ),
                {"Retry-After": "1"},
            )
        body = await self._body(request)
        if isinstance(body, Problem):
            self._failed(request)
            return problem_response(body)
        parsed = parse(body)
        if isinstance(parsed, Problem):
            self._failed(request)
            return problem_response(parsed)
        credentials = self._credentials(request, body)
        if isinstance(credentials, Problem):
            self._failed(request)
            headers = {"WWW-Authenticate": 'Basic realm="skipmq"'} if credentials.status == 401 else None
            return problem_response(credentials, headers)
        return parsed, credentials[0], credentials[1]

    async def _attach(
        self,
        request: web.Request,
        parsed: Any,
        username: str | None,
        password: str | None,
        **kwargs: Any,
    ) -> PullLink:
        """The client id's link once the credentials check out, then its rate
        (``pull.requests_per_s``): only a request that authenticated as the client id counts."""
        if self.broker.shutting_down:
            raise PullError(503, "the broker is shutting down")
        try:
            link = await self.gateway.attach(parsed.client_id, username, password, **kwargs)
        except PullError as exc:
            if exc.status == 401:
                self._failed(request)
            raise
        if not self.rate.allow(parsed.client_id, self.broker.scheduler.time()):
            raise PullError(
                429,
                f"more than pull.requests_per_s = {self.rate.rate_per_s} requests per second "
                f"for client id {parsed.client_id!r}",
                "pull.requests_per_s",
            )
        return link

    @contextlib.contextmanager
    def _in_use(self, link: PullLink) -> Iterator[PullLink]:
        """Mark the link busy for one request (the lease does not expire under it) and renew its
        lease when the request ends, however it ends."""
        link.busy += 1
        try:
            yield link
        finally:
            link.busy -= 1
            link.renew_lease(self.gateway.lease_s)

    @staticmethod
    def _error(exc: PullError) -> web.Response:
        titles = {
            401: "Unauthorized",
            403: "Forbidden",
            409: "Conflict",
            410: "Gone",
            429: "Too Many Requests",
            503: "Service Unavailable",
        }
        headers = {"WWW-Authenticate": 'Basic realm="skipmq"'} if exc.status == 401 else None
        if exc.status == 429:
            headers = {"Retry-After": "1"}
        return problem_response(
            Problem(exc.status, titles.get(exc.status, "Error"), exc.detail, exc.limit), headers
        )

    # ---------------------------------------------------------------- endpoints
    async def pull_messages(self, request: web.Request) -> web.Response:
        """POST /v1/pull: delete the acknowledged numbers, answer up to 16 messages (seed 001 §4.6)."""
        prepared = await self._prepare(
            request, lambda body: parse_pull(body, max_wait_s=self.pull.max_wait_s)
        )
        if isinstance(prepared, web.Response):
            return prepared
        req, username, password = prepared
        try:
            link = await self._attach(request, req, username, password, expiry_s=req.session_expiry_s)
            with self._in_use(link):
                applied = link.session_present and req.epoch in (None, link.epoch)
                if applied:
                    link.acknowledge(req.acks)
                self.gateway.commit()
                if not len(link.buffer):
                    await link.wait_for_messages(req.wait_s)
                    self.gateway.commit()
                if link.closed:
                    raise link.closed_error()
                messages, remaining = link.buffer.take(min(req.max_messages, MAX_MESSAGES))
                session = self.broker.sessions.get(req.client_id)
                if session is not None and session.queue:
                    remaining = True
                body = {
                    "client_id": req.client_id,
                    "epoch": link.epoch,
                    "session_present": link.session_present,
                    "acks_applied": applied,
                    "messages": [message.as_json() for message in messages],
                    "remaining": remaining,
                }
        except PullError as exc:
            return self._error(exc)
        return _json(body)

    async def publish(self, request: web.Request) -> web.Response:
        """POST /v1/publish: the response is the PUBACK (after the commit, as for MQTT)."""
        prepared = await self._prepare(request, parse_publish)
        if isinstance(prepared, web.Response):
            return prepared
        req, username, password = prepared
        try:
            link = await self._attach(request, req, username, password)
            with self._in_use(link):
                code = await link.publish(
                    Publish(req.topic, req.payload, req.qos, req.retain, False, None, dict(req.properties))
                )
        except PullError as exc:
            return self._error(exc)
        if code == 0x87:
            return self._error(PullError(403, f"not authorized to publish to {req.topic!r} (ACL)"))
        if code >= 0x80:
            return self._error(
                PullError(503, f"the broker refused the message (MQTT reason code 0x{code:02X})")
            )
        return _json(
            {"client_id": req.client_id, "topic": req.topic, "qos": req.qos, "matched": code != 0x10}
        )

    async def open_session(self, request: web.Request) -> web.Response:
        """POST /v1/sessions/open: attach (clean start or resume) and subscribe."""
        prepared = await self._prepare(request, parse_open)
        if isinstance(prepared, web.Response):
            return prepared
        req, username, password = prepared
        try:
            link = await self._attach(
                request, req, username, password, clean_start=req.clean_start, expiry_s=req.session_expiry_s
            )
            with self._in_use(link):
                codes = await link.subscribe(list(req.subscriptions)) if req.subscriptions else []
                self.gateway.commit()
        except PullError as exc:
            return self._error(exc)
        invalid = [f for (f, _q), code in zip(req.subscriptions, codes, strict=True) if code == 0x8F]
        if invalid:
            return problem_response(bad_request(f"invalid topic filter: {', '.join(invalid)}"))
        refused = [f for (f, _q), code in zip(req.subscriptions, codes, strict=True) if code >= 0x80]
        if refused:
            return self._error(PullError(403, f"not authorized to subscribe to {', '.join(refused)} (ACL)"))
        return _json(
            {
                "client_id": req.client_id,
                "session_present": link.session_present,
                "epoch": link.epoch,
                "subscriptions": [
                    {"filter": f, "qos": code} for (f, _q), code in zip(req.subscriptions, codes, strict=True)
                ],
            }
        )

    async def close_session(self, request: web.Request) -> web.Response:
        """POST /v1/sessions/close: end the session (its queue and subscriptions go)."""
        prepared = await self._prepare(request, _client_only)
        if isinstance(prepared, web.Response):
            return prepared
        req, username, password = prepared
        try:
            link = await self._attach(request, req, username, password)
            link.ended_by_close = True  # a long-poll waiting on it answers 410, not "retry"
            link.disconnect(expiry_s=0)
            self.gateway.commit()
        except PullError as exc:
            return self._error(exc)
        return _json({"client_id": req.client_id, "closed": True})

    async def subscriptions(self, request: web.Request) -> web.Response:
        """POST /v1/sessions/subscriptions: the session's subscriptions."""
        prepared = await self._prepare(request, _client_only)
        if isinstance(prepared, web.Response):
            return prepared
        req, username, password = prepared
        try:
            link = await self._attach(request, req, username, password)
            link.renew_lease(self.gateway.lease_s)
        except PullError as exc:
            return self._error(exc)
        session = self.broker.sessions.get(req.client_id)
        subs = (
            []
            if session is None
            else [{"filter": opts.topic_filter, "qos": opts.qos} for opts in session.subscriptions.values()]
        )
        return _json(
            {"client_id": req.client_id, "session_present": link.session_present, "subscriptions": subs}
        )


def gateway_off(app: web.Application) -> None:
    """The /v1 routes of a broker whose gateway is off (``pull.enabled`` false): a 404 problem
    document that says so, for every method."""

    async def off(request: web.Request) -> web.Response:
        return problem_response(
            Problem(
                404,
                "Not Found",
                f"{request.method} {request.path}: the HTTP pull gateway is off on this broker "
                "(pull.enabled = false; docs/pull.md)",
                "pull.enabled",
            )
        )

    for path in ("/v1/openapi.json", "/v1/pull", "/v1/publish", "/v1/sessions/{tail:.*}"):
        app.router.add_route("*", path, off)


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class _ClientOnly:
    __slots__ = ("client_id",)

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id


def _client_only(body: dict[str, Any]) -> _ClientOnly | Problem:
    for name in ("client_id", "username", "password"):
        if name in body and body[name] is None:
            return bad_request(f"{name}: null is not allowed (leave the field out)")
    client_id = body.get("client_id")
    if (
        not isinstance(client_id, str)
        or not client_id
        or "\x00" in client_id
        or len(client_id.encode()) > 65535
    ):
        return bad_request("client_id: a non-empty string is required")
    return _ClientOnly(client_id)
