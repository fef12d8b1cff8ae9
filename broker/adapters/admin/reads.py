"""The admin API's read endpoints (``GET /admin/v1/...``): each answers from every broker of the
cluster (``AdminApi.gather`` / ``paged``) unless ``scope=local`` asks for this broker's part only.

Users and ACL are answered from this broker's copy of the dynamic records, which the cluster
replicates to every broker (``broker.auth.dynamic_auth``), composed with this broker's files.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.adapters.admin.responses import PROBLEM_JSON, ApiError, json_response
from broker.auth.acl import ACCESS_NAMES
from broker.auth.users import Authenticator
from broker.mqtt.topics import TopicError, validate_topic_filter, validate_topic_name

if TYPE_CHECKING:
    from broker.adapters.admin.access import Principal
    from broker.adapters.admin.api import AdminApi


async def whoami(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    return json_response({"user": principal.user, "role": principal.role, "broker": api.node_id})


async def brokers(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    async def local() -> dict[str, Any]:
        return api.view.broker_info(api.url)

    if api.is_local(request):
        return json_response(await local())
    gathered = await api.gather(request, principal, local)
    answered = [gathered.parts[node] for node in sorted(gathered.parts)]
    return json_response(
        {
            "brokers": answered,
            "missing": gathered.missing,
            "complete": not gathered.missing,
            "asked": api.node_id,
        }
    )


async def listeners(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    async def local() -> dict[str, Any]:
        return {"listeners": api.view.listeners()}

    if api.is_local(request):
        return json_response(await local())
    gathered = await api.gather(request, principal, local)
    rows = [row for node in sorted(gathered.parts) for row in gathered.parts[node].get("listeners", [])]
    return json_response({"listeners": rows, "missing": gathered.missing, "complete": not gathered.missing})


def _prefix_and_user(request: web.Request) -> tuple[str, str | None]:
    prefix = request.query.get("prefix", "")
    username = request.query.get("username")
    return prefix, username


async def clients(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    prefix, username = _prefix_and_user(request)
    return await api.paged(
        request,
        principal,
        lambda after, limit: api.view.sessions(
            after, limit, connected=True, prefix=prefix, username=username
        ),
        only=request.query.get("broker"),
    )


async def sessions(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    prefix, username = _prefix_and_user(request)
    connected = api.bool_param(request, "connected")
    return await api.paged(
        request,
        principal,
        lambda after, limit: api.view.sessions(
            after, limit, connected=connected, prefix=prefix, username=username
        ),
        only=request.query.get("broker"),
    )


async def client(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    client_id = request.match_info["client_id"]

    async def local() -> dict[str, Any] | None:
        return api.view.client(client_id)

    if api.is_local(request):
        found = await local()
        if found is None:
            return not_here(f"no session of client id {client_id!r} on {api.node_id}")
        return json_response(found)
    gathered = await api.gather(request, principal, local)
    holders = [part for part in gathered.parts.values() if part]
    if not holders:
        detail = f"no broker has a session of client id {client_id!r}"
        if gathered.missing:
            detail += f" (not asked or not answering: {', '.join(m['broker'] for m in gathered.missing)})"
        raise ApiError(404, detail, missing=gathered.missing)
    holders.sort(key=lambda item: (not item["connected"], item["broker"]))
    return json_response(
        {
            "client": holders[0],
            "elsewhere": holders[1:],
            "missing": gathered.missing,
            "complete": not gathered.missing,
        }
    )


def not_here(detail: str) -> web.Response:
    """A broker without the resource, answering another broker's fan-out: a 404 whose type says
    so (the asking broker does not count it as a failure)."""
    body = {"type": "about:blank#not-here", "title": "Not Found", "status": 404, "detail": detail}
    return web.Response(status=404, text=json.dumps(body), content_type=PROBLEM_JSON)


def _filter_param(request: web.Request, name: str) -> str | None:
    value = request.query.get(name)
    if value is None:
        return None
    try:
        validate_topic_filter(value)
    except TopicError as exc:
        raise ApiError(400, f"{name}: {exc}") from None
    return value


async def subscriptions(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    topic_filter = _filter_param(request, "filter")
    topic = request.query.get("topic")
    if topic is not None:
        try:
            validate_topic_name(topic)
        except TopicError as exc:
            raise ApiError(400, f"topic: {exc}") from None
    exact = bool(api.bool_param(request, "exact"))
    client_id = request.query.get("client_id")
    return await api.paged(
        request,
        principal,
        lambda after, limit: api.view.subscriptions(
            after, limit, client_id=client_id, topic_filter=topic_filter, exact=exact, topic=topic
        ),
        only=request.query.get("broker"),
    )


async def retained(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    """Retained messages are replicated to every broker: the asked broker's copy answers, or
    the copy of ``broker`` (to compare two brokers' copies)."""
    topic_filter = _filter_param(request, "filter") or "#"
    only = request.query.get("broker") or api.node_id
    return await api.paged(
        request, principal, lambda after, limit: api.view.retained(after, limit, topic_filter), only=only
    )


async def classes(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    """Every topic class with its route from each broker that publishes it."""

    async def local() -> dict[str, Any]:
        return api.view.classes()

    if api.is_local(request):
        return json_response(await local())
    gathered = await api.gather(request, principal, local)
    peers = {
        node: part.get("classes", [{}])[0].get("peer_id")
        for node, part in gathered.parts.items()
        if part.get("classes")
    }
    node_of = {peer: node for node, peer in peers.items() if peer}
    for endpoint in api.directory.entries():
        node_of.setdefault(endpoint.peer_id, endpoint.node_id)
    merged: dict[str, dict[str, Any]] = {}
    table_size = None
    for node in sorted(gathered.parts):
        part = gathered.parts[node]
        table_size = part.get("table_size") or table_size
        for entry in part.get("classes", []):
            cls = entry["class"]
            row = merged.setdefault(
                cls,
                {
                    "class": cls,
                    "wildcard": entry["wildcard"],
                    "subscriber_brokers": [],
                    "publisher_brokers": [],
                    "routes": [],
                    "counters": {},
                    "rates": {},
                    "hops": None,
                },
            )
            if entry["subscribed_here"]:
                row["subscriber_brokers"].append(node)
            if entry["published_here"]:
                row["publisher_brokers"].append(node)
                row["routes"].append(
                    {
                        "broker": node,
                        "route": entry["route"],
                        "direct": [node_of.get(p, p) for p in entry["direct"]],
                        "via_others": [node_of.get(p, p) for p in entry["via_others"]],
                    }
                )
            for name, value in (entry.get("counters") or {}).items():
                row["counters"][name] = row["counters"].get(name, 0) + value
            for name, value in (entry.get("rates") or {}).items():
                row["rates"][name] = round(row["rates"].get(name, 0.0) + value, 3)
            hops = entry.get("hops")
            if hops:
                if row["hops"] is None:
                    row["hops"] = {"bounds": hops["bounds"], "counts": [0] * len(hops["counts"])}
                row["hops"]["counts"] = [
                    a + b for a, b in zip(row["hops"]["counts"], hops["counts"], strict=False)
                ]
    for row in merged.values():
        received = row["counters"].get("received", 0)
        row["hops_mean"] = round(row["counters"].get("hop_sum", 0) / received, 3) if received else None
        routes = {route["route"] for route in row["routes"]}
        row["route"] = "multi_hop" if "multi_hop" in routes else ("one_hop" if "one_hop" in routes else None)
    return json_response(
        {
            "table_size": table_size,
            "classes": [merged[cls] for cls in sorted(merged)],
            "brokers": sorted(gathered.parts),
            "missing": gathered.missing,
            "complete": not gathered.missing,
        }
    )


async def overlay(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    """Every broker's virtual nodes with their membership vectors and routing tables: the Skip
    Graph's levels are the lists of virtual nodes sharing a membership-vector prefix."""
    limit = api.int_param(request, "limit", 500, 1, 5000)

    async def local() -> dict[str, Any]:
        return api.view.overlay(limit)

    if api.is_local(request):
        return json_response(await local())
    gathered = await api.gather(request, principal, local)
    parts = [gathered.parts[node] for node in sorted(gathered.parts)]
    mv_bits = next((part.get("mv_bits") for part in parts if part.get("mv_bits")), None)
    table_size = next((part.get("table_size") for part in parts if part.get("table_size")), None)
    return json_response(
        {
            "mv_bits": mv_bits,
            "table_size": table_size,
            "brokers": parts,
            "missing": gathered.missing,
            "complete": not gathered.missing,
        }
    )


# ---------------------------------------------------------------------- users and ACL
def _authenticator(api: AdminApi) -> Authenticator:
    authenticator = api.broker.authenticator
    if not isinstance(authenticator, Authenticator):
        raise ApiError(503, "this broker's authenticator does not support dynamic users")
    return authenticator


async def users(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    authenticator = _authenticator(api)
    records = api.dynamic.users
    rows = []
    for name, source in sorted(authenticator.users().items()):
        record = records.get(name)
        rows.append(
            {
                "name": name,
                "source": source,
                "updated_at_ms": record.at_ms if record is not None and source == "dynamic" else None,
                "updated_by": record.by if record is not None and source == "dynamic" else None,
            }
        )
    removed = sorted(name for name, record in records.items() if record.encoded is None)
    return json_response(
        {
            "users": rows,
            "removed": removed,
            "password_file": api.config.auth.password_file or None,
            "allow_anonymous": api.config.auth.allow_anonymous,
        }
    )


async def users_export(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    authenticator = _authenticator(api)
    lines = []
    for name in sorted(authenticator.users()):
        encoded = authenticator.encoded_of(name)
        if encoded is not None:
            lines.append(f"{name}:{encoded}")
    return web.Response(text="".join(line + "\n" for line in lines), content_type="text/plain")


def _rules_json(rules: Any) -> list[dict[str, str]]:
    return [{"access": ACCESS_NAMES[rule.access], "filter": rule.topic_filter} for rule in rules]


async def acl(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    base = api.dynamic.base_acl.sections() if api.dynamic.base_acl is not None else {}
    sections = []
    keys = sorted(
        set(base) | set(api.dynamic.sections),
        key=lambda key: ({"anonymous": 0, "patterns": 1}.get(key[0], 2), key[1]),
    )
    for key in keys:
        record = api.dynamic.sections.get(key)
        dynamic = record is not None
        rules = record.rules if record is not None else base[key]
        sections.append(
            {
                "kind": key[0],
                "user": key[1] if key[0] == "user" else None,
                "source": "dynamic" if dynamic else "file",
                "rules": _rules_json(rules),
                "updated_at_ms": record.at_ms if record is not None else None,
                "updated_by": record.by if record is not None else None,
            }
        )
    effective = api.dynamic.effective_acl()
    return json_response(
        {"active": effective is not None, "acl_file": api.config.auth.acl_file or None, "sections": sections}
    )


async def acl_export(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    effective = api.dynamic.effective_acl()
    text = (
        effective.to_text()
        if effective is not None
        else "# no ACL: every client may publish and subscribe anywhere\n"
    )
    return web.Response(text=text, content_type="text/plain")
