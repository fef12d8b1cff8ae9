"""The admin API's OpenAPI 3 document, served at ``GET /admin/v1/openapi.json``.

Built here (not a committed JSON file) so that each schema is written once and the route table
and the document cannot drift: ``tests/unit/admin/test_openapi.py`` checks that every route of
``routes.ROUTES`` is documented and the other way round, and the process test runs schemathesis
against a live cluster with it. ``scope=local`` and ``after`` (one broker's part of a
cluster-wide answer, asked by another broker) are internal and not documented.

Size: one schema per answer and one entry per operation, written out as data (ruff's formatting
spreads each over several lines); splitting the document would scatter its shared schemas.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from broker import __version__

NULL_STR = {"type": "string", "nullable": True}
NULL_INT = {"type": "integer", "nullable": True}
NULL_NUM = {"type": "number", "nullable": True}
STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}
NUM = {"type": "number"}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "required": list(props) if required is None else required, "properties": props}


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


COUNTS = {"type": "object", "additionalProperties": INT}
MISSING = _array(_ref("Missing"))

SCHEMAS: dict[str, Any] = {
    "Problem": {
        "type": "object",
        "required": ["type", "title", "status", "detail"],
        "properties": {"type": STR, "title": STR, "status": INT, "detail": STR, "missing": MISSING},
    },
    "Missing": {
        "type": "object",
        "required": ["broker", "reason"],
        "properties": {"broker": STR, "reason": STR, "peer_id": STR},
        "description": "a broker whose part is not in the answer, and why",
    },
    "Whoami": _obj({"user": STR, "role": {"type": "string", "enum": ["readonly", "admin"]}, "broker": STR}),
    "Link": _obj(
        {"peer_id": STR, "connected": BOOL, "suspected": BOOL, "silence_s": NULL_NUM, "http_port": NULL_INT}
    ),
    "Broker": _obj(
        {
            "node_id": STR,
            "peer_id": NULL_STR,
            "version": STR,
            "admin_url": STR,
            "status": {"type": "string", "enum": ["ready", "not_ready"]},
            "not_ready_reason": NULL_STR,
            "uptime_s": NUM,
            "connections": INT,
            "sessions": INT,
            "subscriptions": INT,
            "retained": INT,
            "queued_messages": INT,
            "inflight_messages": INT,
            "rss_bytes": NULL_INT,
            "clustered": BOOL,
            "links": _array(_ref("Link")),
            "virtual_nodes": INT,
        }
    ),
    "Brokers": _obj({"brokers": _array(_ref("Broker")), "missing": MISSING, "complete": BOOL, "asked": STR}),
    "Listener": _obj(
        {
            "broker": STR,
            "name": STR,
            "enabled": BOOL,
            "host": STR,
            "port": INT,
            "scheme": STR,
            "connections": NULL_INT,
        }
    ),
    "Listeners": _obj({"listeners": _array(_ref("Listener")), "missing": MISSING, "complete": BOOL}),
    "Session": _obj(
        {
            "client_id": STR,
            "broker": STR,
            "username": NULL_STR,
            "connected": BOOL,
            "protocol": STR,
            "persistent": BOOL,
            "expiry_interval_s": INT,
            "subscriptions": INT,
            "queued": INT,
            "inflight": INT,
            "peer": NULL_STR,
            "listener": NULL_STR,
            "keep_alive_s": NULL_INT,
            "connected_at": NULL_NUM,
            "disconnected_at": NULL_NUM,
        }
    ),
    "Subscription": _obj(
        {
            "client_id": STR,
            "broker": STR,
            "filter": STR,
            "qos": INT,
            "share_group": NULL_STR,
            "no_local": BOOL,
            "retain_as_published": BOOL,
            "retain_handling": INT,
            "subscription_identifier": NULL_INT,
            "connected": BOOL,
        }
    ),
    "QueuedPreview": _obj({"topic": STR, "qos": INT, "size": INT, "state": INT}),
    "Payload": {
        "type": "object",
        "required": ["size", "truncated"],
        "properties": {"size": INT, "truncated": BOOL, "text": STR, "base64": STR},
        "description": "the first 256 bytes: as text when UTF-8, else base64",
    },
    "Retained": _obj(
        {"topic": STR, "qos": INT, "origin": NULL_STR, "expiry_at": NULL_NUM, "payload": _ref("Payload")}
    ),
    "ClientDetail": {
        "allOf": [
            _ref("Session"),
            _obj(
                {
                    "subscription_list": _array(_ref("Subscription")),
                    "queue_preview": _array(_ref("QueuedPreview")),
                    "will_topic": NULL_STR,
                }
            ),
        ]
    },
    "ClientAnswer": _obj(
        {
            "client": _ref("ClientDetail"),
            "elsewhere": _array(_ref("ClientDetail")),
            "missing": MISSING,
            "complete": BOOL,
        }
    ),
    "KickResult": _obj({"broker": STR, "client_id": STR, "was_connected": BOOL, "session_ended": BOOL}),
    "KickAnswer": _obj(
        {"client_id": STR, "results": _array(_ref("KickResult")), "missing": MISSING, "complete": BOOL}
    ),
    "Route": _obj({"broker": STR, "route": NULL_STR, "direct": _array(STR), "via_others": _array(STR)}),
    "Hops": {
        "type": "object",
        "nullable": True,
        "required": ["bounds", "counts"],
        "properties": {"bounds": _array(STR), "counts": _array(INT)},
    },
    "TopicClass": _obj(
        {
            "class": STR,
            "wildcard": BOOL,
            "subscriber_brokers": _array(STR),
            "publisher_brokers": _array(STR),
            "routes": _array(_ref("Route")),
            "route": {"type": "string", "nullable": True, "enum": ["one_hop", "multi_hop", None]},
            "counters": COUNTS,
            "rates": {"type": "object", "additionalProperties": NUM},
            "hops": _ref("Hops"),
            "hops_mean": NULL_NUM,
        }
    ),
    "Classes": _obj(
        {
            "table_size": NULL_INT,
            "classes": _array(_ref("TopicClass")),
            "brokers": _array(STR),
            "missing": MISSING,
            "complete": BOOL,
        }
    ),
    "TableEntry": _obj({"topic": STR, "role": STR, "peer": STR, "level": INT}),
    "VirtualNode": _obj(
        {
            "topic": STR,
            "role": STR,
            "peer": STR,
            "mv": STR,
            "rendezvous": BOOL,
            "entries": _array(_ref("TableEntry")),
        }
    ),
    "BrokerOverlay": {
        "type": "object",
        "required": ["broker", "peer_id", "mv_bits", "vnodes", "truncated"],
        "properties": {
            "broker": STR,
            "peer_id": NULL_STR,
            "mv_bits": NULL_INT,
            "table_size": INT,
            "vnodes": _array(_ref("VirtualNode")),
            "truncated": BOOL,
        },
    },
    "Overlay": _obj(
        {
            "mv_bits": NULL_INT,
            "table_size": NULL_INT,
            "brokers": _array(_ref("BrokerOverlay")),
            "missing": MISSING,
            "complete": BOOL,
        }
    ),
    "Published": _obj(
        {"topic": STR, "qos": INT, "retain": BOOL, "size": INT, "broker": STR, "matched_locally": BOOL}
    ),
    "User": _obj(
        {
            "name": STR,
            "source": {"type": "string", "enum": ["file", "dynamic"]},
            "updated_at_ms": NULL_INT,
            "updated_by": NULL_STR,
        }
    ),
    "Users": _obj(
        {
            "users": _array(_ref("User")),
            "removed": _array(STR),
            "password_file": NULL_STR,
            "allow_anonymous": BOOL,
        }
    ),
    "UserSet": _obj({"name": STR, "source": STR, "created": BOOL}),
    "UserRemoved": _obj({"name": STR, "removed": BOOL}),
    "Imported": _obj({"imported": INT, "names": _array(STR)}),
    "Rule": _obj(
        {
            "access": {"type": "string", "enum": ["read", "write", "readwrite", "deny"]},
            "filter": {"type": "string", "minLength": 1},
        }
    ),
    "Rules": {
        "type": "object",
        "required": ["rules"],
        "additionalProperties": False,
        "properties": {"rules": {"type": "array", "items": _ref("Rule"), "maxItems": 1000}},
    },
    "AclSection": _obj(
        {
            "kind": {"type": "string", "enum": ["anonymous", "patterns", "user"]},
            "user": NULL_STR,
            "source": {"type": "string", "enum": ["file", "dynamic"]},
            "rules": _array(_ref("Rule")),
            "updated_at_ms": NULL_INT,
            "updated_by": NULL_STR,
        }
    ),
    "Acl": _obj({"active": BOOL, "acl_file": NULL_STR, "sections": _array(_ref("AclSection"))}),
    "AclSet": _obj({"kind": STR, "user": NULL_STR, "rules": INT}),
    "AclRemoved": _obj({"kind": STR, "user": NULL_STR, "removed": BOOL}),
    "AclImported": _obj({"sections": INT}),
    "TraceStarted": _obj(
        {
            "id": STR,
            "kind": {"type": "string", "enum": ["client", "filter"]},
            "target": STR,
            "duration_s": NUM,
            "ends_at": NUM,
            "brokers": _array(STR),
            "missing": MISSING,
        }
    ),
    "TraceSummary": _obj(
        {
            "id": STR,
            "kind": STR,
            "target": STR,
            "broker": STR,
            "by": STR,
            "started_at": NUM,
            "ends_at": NUM,
            "state": {"type": "string", "enum": ["running", "done"]},
            "connected_here": BOOL,
            "packets": {"type": "object", "additionalProperties": COUNTS},
            "bytes": COUNTS,
            "acl": COUNTS,
            "events_dropped": INT,
        }
    ),
    "Traces": _obj({"traces": _array(_ref("TraceSummary")), "broker": STR}),
    "Trace": {
        "type": "object",
        "required": [
            "id",
            "kind",
            "target",
            "state",
            "packets",
            "bytes",
            "acl",
            "topics",
            "clients",
            "events",
            "brokers",
        ],
        "properties": {
            "id": STR,
            "kind": STR,
            "target": STR,
            "by": STR,
            "started_at": NUM,
            "ends_at": NUM,
            "state": {"type": "string", "enum": ["running", "done"]},
            "connected_on": _array(STR),
            "packets": {"type": "object", "additionalProperties": COUNTS},
            "bytes": COUNTS,
            "acl": COUNTS,
            "topics": {"type": "object", "additionalProperties": COUNTS},
            "clients": {"type": "object", "additionalProperties": COUNTS},
            "events": _array({"type": "object"}),
            "events_dropped": INT,
            "brokers": _array(STR),
            "missing": MISSING,
        },
    },
}


def _page(item: str) -> dict[str, Any]:
    return _obj(
        {
            "items": _array(_ref(item)),
            "next_cursor": {
                "type": "string",
                "nullable": True,
                "description": "pass as cursor for the next page; null: this was the last",
            },
            "brokers": _array(STR),
            "missing": MISSING,
            "complete": BOOL,
        }
    )


for _name in ("Session", "Subscription", "Retained"):
    SCHEMAS[f"{_name}Page"] = _page(_name)

_PROBLEM = {"application/problem+json": {"schema": _ref("Problem")}}
_LIMIT = {
    "name": "limit",
    "in": "query",
    "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
}
_CURSOR = {"name": "cursor", "in": "query", "schema": STR, "description": "next_cursor of the previous page"}
_BROKER = {"name": "broker", "in": "query", "schema": STR, "description": "only this broker's part (node id)"}
_CSRF = {
    "name": "X-Requested-By",
    "in": "header",
    "required": True,
    "schema": {"type": "string", "minLength": 1},
    "description": "any value; required on unsafe methods (no cross-site form sends it)",
}


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema or STR, "description": description}


def _path(name: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema or {"type": "string", "minLength": 1},
    }


def _op(
    summary: str,
    ok: str | None,
    *,
    status: int = 200,
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
    text_body: bool = False,
    text_answer: bool = False,
    errors: tuple[int, ...] = (),
    admin: bool = False,
    unsafe: bool = False,
    links: dict[str, Any] | None = None,
    extra_ok: tuple[int, ...] = (),
) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    content = (
        {"text/plain": {"schema": STR}}
        if text_answer
        else {"application/json": {"schema": _ref(ok or "Problem")}}
    )
    responses[str(status)] = {"description": "OK", "content": content}
    for code in extra_ok:
        responses[str(code)] = {"description": "OK", "content": content}
    if links:
        responses[str(status)]["links"] = links
        for code in extra_ok:
            responses[str(code)]["links"] = links
    codes = {400, 401, 404, 429, *errors}
    if admin or unsafe:
        codes.add(403)
    if unsafe:
        codes.update({408, 413, 415})
    for code in sorted(codes):
        responses[str(code)] = {"description": "problem", "content": _PROBLEM}
    operation: dict[str, Any] = {"summary": summary, "parameters": list(params or []), "responses": responses}
    if unsafe:
        operation["parameters"].append(_CSRF)
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if text_body:
        operation["requestBody"] = {"required": True, "content": {"text/plain": {"schema": STR}}}
    return operation


_USERNAME = _path("username", {"type": "string", "minLength": 1, "pattern": "^[^$:/\\s][^:/\\s]*$"})
_KICK_BODY = {"type": "object", "additionalProperties": False, "properties": {"discard_session": BOOL}}
_PUBLISH_BODY = {
    "type": "object",
    "required": ["topic"],
    "additionalProperties": False,
    "properties": {
        "topic": {"type": "string", "minLength": 1},
        "payload": STR,
        "payload_base64": {"type": "string", "format": "byte"},
        "qos": {"type": "integer", "enum": [0, 1, 2]},
        "retain": BOOL,
        "content_type": STR,
        "user_properties": _array({"type": "array", "items": STR, "minItems": 2, "maxItems": 2}),
    },
}
_USER_BODY = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"password": {"type": "string", "minLength": 1}, "hash": STR},
    "description": "password (hashed with salted scrypt on the broker) or hash (a password file's)",
}
_TRACE_BODY = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "client_id": {"type": "string", "minLength": 1},
        "filter": {"type": "string", "minLength": 1},
        "duration_s": {"type": "number", "minimum": 1, "maximum": 300},
    },
}


def _paths() -> dict[str, Any]:
    user_links = {
        "DeleteUser": {"operationId": "deleteUser", "parameters": {"username": "$request.path.username"}},
        "SetUserAcl": {"operationId": "setUserAcl", "parameters": {"username": "$request.path.username"}},
    }
    client_links = {
        "GetClient": {
            "operationId": "getClient",
            "parameters": {"client_id": "$response.body#/items/0/client_id"},
        },
        "Disconnect": {
            "operationId": "disconnectClient",
            "parameters": {"client_id": "$response.body#/items/0/client_id"},
        },
    }
    return {
        "/admin/v1/whoami": {"get": _op("who the credentials are", "Whoami")},
        "/admin/v1/brokers": {"get": _op("every broker: health, counts, links", "Brokers")},
        "/admin/v1/listeners": {"get": _op("every broker's listeners", "Listeners")},
        "/admin/v1/clients": {
            "get": _op(
                "connected clients, cluster-wide, by client id",
                "SessionPage",
                params=[
                    _LIMIT,
                    _CURSOR,
                    _BROKER,
                    _query("prefix", "client ids starting with this"),
                    _query("username", "only this user's"),
                ],
                links=client_links,
                errors=(404,),
            )
        },
        "/admin/v1/clients/{client_id}": {
            "get": {
                **_op(
                    "one client wherever it is: subscriptions, queue",
                    "ClientAnswer",
                    params=[_path("client_id")],
                    errors=(404,),
                ),
                "operationId": "getClient",
            }
        },
        "/admin/v1/clients/{client_id}/disconnect": {
            "post": {
                **_op(
                    "disconnect a client wherever it is (v5: 0x98); discard_session ends its session",
                    "KickAnswer",
                    params=[_path("client_id")],
                    body=_KICK_BODY,
                    errors=(404,),
                    admin=True,
                    unsafe=True,
                ),
                "operationId": "disconnectClient",
            }
        },
        "/admin/v1/sessions": {
            "get": _op(
                "sessions (connected or stored), cluster-wide",
                "SessionPage",
                params=[
                    _LIMIT,
                    _CURSOR,
                    _BROKER,
                    _query("prefix", "client ids starting with this"),
                    _query("username", "only this user's"),
                    _query("connected", "true or false", BOOL),
                ],
                links=client_links,
                errors=(404,),
            )
        },
        "/admin/v1/subscriptions": {
            "get": _op(
                "subscriptions by client, by filter (those a message the filter matches can reach), by topic",
                "SubscriptionPage",
                params=[
                    _LIMIT,
                    _CURSOR,
                    _BROKER,
                    _query("client_id", "this client's"),
                    _query("filter", "subscriptions overlapping this filter"),
                    _query("exact", "with filter: only this very filter", BOOL),
                    _query("topic", "subscriptions a message on this topic reaches"),
                ],
                errors=(404,),
            )
        },
        "/admin/v1/retained": {
            "get": _op(
                "retained messages (replicated: the asked broker's copy, or the copy of broker)",
                "RetainedPage",
                params=[_LIMIT, _CURSOR, _BROKER, _query("filter", "topic filter, default #")],
                errors=(404,),
            ),
            "delete": _op(
                "delete a retained message everywhere",
                "RetainedDeleted",
                params=[{**_query("topic", "the topic"), "required": True}],
                errors=(404,),
                admin=True,
                unsafe=True,
            ),
        },
        "/admin/v1/classes": {
            "get": _op(
                "topic classes: subscriber brokers, each publisher broker route (one/multi hop), hops",
                "Classes",
            )
        },
        "/admin/v1/overlay": {
            "get": _op(
                "the Skip Graph: every broker's virtual nodes, membership vectors and routing tables",
                "Overlay",
                params=[
                    _query(
                        "limit",
                        "virtual nodes per broker",
                        {"type": "integer", "minimum": 1, "maximum": 5000},
                    )
                ],
            )
        },
        "/admin/v1/publish": {
            "post": _op(
                "publish a message as the broker",
                "Published",
                body=_PUBLISH_BODY,
                errors=(413,),
                admin=True,
                unsafe=True,
            )
        },
        "/admin/v1/users": {"get": _op("MQTT users (password file and dynamic)", "Users")},
        "/admin/v1/export/users": {
            "get": _op("the users as a password file (hashes)", None, text_answer=True, admin=True)
        },
        "/admin/v1/import/users": {
            "post": _op(
                "import a password file's users (they become dynamic)",
                "Imported",
                text_body=True,
                admin=True,
                unsafe=True,
            )
        },
        "/admin/v1/users/{username}": {
            "put": {
                **_op(
                    "add a user or change its password, on every broker",
                    "UserSet",
                    status=200,
                    extra_ok=(201,),
                    params=[_USERNAME],
                    body=_USER_BODY,
                    admin=True,
                    unsafe=True,
                    links=user_links,
                ),
                "operationId": "setUser",
            },
            "delete": {
                **_op(
                    "remove a user on every broker",
                    "UserRemoved",
                    params=[_USERNAME],
                    errors=(404,),
                    admin=True,
                    unsafe=True,
                ),
                "operationId": "deleteUser",
            },
        },
        "/admin/v1/acl": {"get": _op("the ACL: the file's sections and the dynamic ones", "Acl")},
        "/admin/v1/export/acl": {"get": _op("the effective ACL as an ACL file", None, text_answer=True)},
        "/admin/v1/import/acl": {
            "post": _op(
                "replace the dynamic ACL by an ACL file's sections",
                "AclImported",
                text_body=True,
                admin=True,
                unsafe=True,
            )
        },
        "/admin/v1/acl/users/{username}": {
            "put": {
                **_op(
                    "set a user's ACL rules on every broker",
                    "AclSet",
                    params=[_USERNAME],
                    body=_ref("Rules"),
                    admin=True,
                    unsafe=True,
                ),
                "operationId": "setUserAcl",
            },
            "delete": _op(
                "drop a user's dynamic ACL rules",
                "AclRemoved",
                params=[_USERNAME],
                errors=(404,),
                admin=True,
                unsafe=True,
            ),
        },
        "/admin/v1/acl/{kind}": {
            "put": _op(
                "set the anonymous or pattern rules on every broker",
                "AclSet",
                params=[_path("kind", {"type": "string", "enum": ["anonymous", "patterns"]})],
                body=_ref("Rules"),
                admin=True,
                unsafe=True,
            ),
            "delete": _op(
                "drop the dynamic anonymous or pattern rules",
                "AclRemoved",
                params=[_path("kind", {"type": "string", "enum": ["anonymous", "patterns"]})],
                errors=(404,),
                admin=True,
                unsafe=True,
            ),
        },
        "/admin/v1/traces": {
            "get": _op("this broker's recent traces", "Traces"),
            "post": _op(
                "trace a client id or a topic filter on every broker for duration_s seconds",
                "TraceStarted",
                status=201,
                body=_TRACE_BODY,
                errors=(409,),
                admin=True,
                unsafe=True,
                links={
                    "GetTrace": {"operationId": "getTrace", "parameters": {"trace_id": "$response.body#/id"}}
                },
            ),
        },
        "/admin/v1/traces/{trace_id}": {
            "get": {
                **_op(
                    "a trace's summary, merged from every broker",
                    "Trace",
                    params=[_path("trace_id")],
                    errors=(404,),
                ),
                "operationId": "getTrace",
            }
        },
    }


SCHEMAS["RetainedDeleted"] = _obj({"topic": STR, "deleted": BOOL})


@functools.cache
def _document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "SkipMQ admin API",
            "version": __version__,
            "description": (
                "Cluster-wide administration of a SkipMQ cluster from any broker (docs/operations.md). "
                "Admin users (admin.users_file) authenticate with HTTP Basic; role readonly may GET, role "
                "admin may also change things. Errors are RFC 9457 problem documents. Cluster-wide answers "
                "name the brokers that did not answer in time in `missing`."
            ),
        },
        "servers": [{"url": "/"}],
        "security": [{"basic": []}],
        "components": {"securitySchemes": {"basic": {"type": "http", "scheme": "basic"}}, "schemas": SCHEMAS},
        "paths": _paths(),
    }


def document() -> dict[str, Any]:
    return copy.deepcopy(_document())
