"""What the admin API's handlers share: the error they raise, the problem documents and JSON
answers they return, and the route record (kept apart from ``api`` so that handlers and the API
plumbing do not import each other)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from broker.adapters.admin.access import Principal
    from broker.adapters.admin.api import AdminApi

PROBLEM_JSON = "application/problem+json"
TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    429: "Too Many Requests",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class ApiError(Exception):
    """A request the API refuses: becomes a problem document."""

    def __init__(self, status: int, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = extra


def problem(status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any) -> web.Response:
    body = {"type": "about:blank", "title": TITLES.get(status, "Error"), "status": status, "detail": detail}
    body.update(extra)
    return web.Response(status=status, text=json.dumps(body), content_type=PROBLEM_JSON, headers=headers)


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(body),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


Handler = Callable[["AdminApi", web.Request, "Principal"], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    role: str = "readonly"  # the least role that may call it
