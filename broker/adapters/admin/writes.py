"""The admin API's changing endpoints (role ``admin``): disconnect a client, publish, delete a
retained message, and change the dynamic users and ACL.

A disconnect is asked of every broker (the client's session lives on one); users, ACL and retained
deletions are written once, on the asked broker, as retained messages the cluster replicates to
every broker (``broker.auth.dynamic_auth``, docs/cluster.md "Retained messages").
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.adapters.admin.reads import not_here
from broker.adapters.admin.responses import ApiError, json_response
from broker.auth.acl import Acl
from broker.auth.dynamic_auth import (
    RecordError,
    SectionKey,
    check_admin_username,
    parse_password_file_text,
    parse_rules,
)
from broker.auth.files import AuthFileError
from broker.auth.password_hashes import hash_password
from broker.core.reserved import is_reserved_topic
from broker.mqtt.topics import TopicError, validate_topic_name

if TYPE_CHECKING:
    from broker.adapters.admin.access import Principal
    from broker.adapters.admin.api import AdminApi

MAX_PUBLISH_BYTES = 256 * 1024


async def kick(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    """POST /admin/v1/clients/{client_id}/disconnect: wherever the client is connected."""
    client_id = request.match_info["client_id"]
    body = api.json_body(request)
    discard = body.get("discard_session", False)
    if not isinstance(discard, bool) or set(body) - {"discard_session"}:
        raise ApiError(400, 'the body is {"discard_session": true|false}')

    async def local() -> dict[str, Any] | None:
        return api.view.kick(client_id, discard)

    if api.is_local(request):
        result = await local()
        if result is None:
            return not_here(f"no session of client id {client_id!r} on {api.node_id}")
        return json_response(result)
    gathered = await api.gather(request, principal, local)
    done = [part for part in gathered.parts.values() if part]
    if not done:
        detail = f"no broker has a session of client id {client_id!r}"
        if gathered.missing:
            detail += f" (not answering: {', '.join(m['broker'] for m in gathered.missing)})"
        raise ApiError(404, detail, missing=gathered.missing)
    return json_response(
        {
            "client_id": client_id,
            "results": done,
            "missing": gathered.missing,
            "complete": not gathered.missing,
        }
    )


def _payload(body: dict[str, Any]) -> bytes:
    text, encoded = body.get("payload"), body.get("payload_base64")
    if text is not None and encoded is not None:
        raise ApiError(400, "give payload or payload_base64, not both")
    if encoded is not None:
        if not isinstance(encoded, str):
            raise ApiError(400, "payload_base64: must be a string")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "payload_base64: not base64") from None
    elif text is not None:
        if not isinstance(text, str):
            raise ApiError(400, "payload: must be a string")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, "payload: must be valid UTF-8 text") from None
    else:
        data = b""
    if len(data) > MAX_PUBLISH_BYTES:
        raise ApiError(413, f"the payload is larger than {MAX_PUBLISH_BYTES} bytes")
    return data


def _topic(value: object, name: str = "topic") -> str:
    if not isinstance(value, str):
        raise ApiError(400, f"{name}: a topic name is required")
    try:
        value.encode("utf-8")
        validate_topic_name(value)
    except (TopicError, UnicodeEncodeError) as exc:
        raise ApiError(400, f"{name}: {exc}") from None
    if is_reserved_topic(value):
        raise ApiError(403, f"{name}: {value!r} is reserved for the brokers ($skipmq/)")
    return value


async def publish(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    """POST /admin/v1/publish: publish as the broker (forwarded by the cluster like any message)."""
    body = api.json_body(request)
    unknown = set(body) - {
        "topic",
        "payload",
        "payload_base64",
        "qos",
        "retain",
        "user_properties",
        "content_type",
    }
    if unknown:
        raise ApiError(400, f"unknown fields: {', '.join(sorted(unknown))}")
    topic = _topic(body.get("topic"))
    payload = _payload(body)
    qos = body.get("qos", 0)
    retain = body.get("retain", False)
    if not isinstance(qos, int) or isinstance(qos, bool) or qos not in (0, 1, 2):
        raise ApiError(400, "qos: must be 0, 1 or 2")
    if not isinstance(retain, bool):
        raise ApiError(400, "retain: must be true or false")
    properties: dict[str, Any] = {}
    user_properties = body.get("user_properties")
    if user_properties is not None:
        if not isinstance(user_properties, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
            for pair in user_properties
        ):
            raise ApiError(400, "user_properties: a list of [name, value] string pairs")
        properties["user_property"] = [(name, value) for name, value in user_properties]
    content_type = body.get("content_type")
    if content_type is not None:
        if not isinstance(content_type, str):
            raise ApiError(400, "content_type: must be a string")
        properties["content_type"] = content_type
    matched = api.view.publish(topic, payload, qos, retain, properties)
    api.broker.log_event(
        20, "admin_publish", topic=topic, qos=qos, retain=retain, size=len(payload), user=principal.user
    )
    return json_response(
        {
            "topic": topic,
            "qos": qos,
            "retain": retain,
            "size": len(payload),
            "broker": api.node_id,
            "matched_locally": matched,
        }
    )


async def retained_delete(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    """DELETE /admin/v1/retained?topic=...: everywhere (an empty retained publish)."""
    topic = _topic(request.query.get("topic"))
    if api.broker.retained.get(topic) is None:
        raise ApiError(404, f"no retained message on {topic!r} on {api.node_id}")
    api.view.publish(topic, b"", 0, True, {})
    api.broker.log_event(20, "admin_retained_deleted", topic=topic, user=principal.user)
    return json_response({"topic": topic, "deleted": True})


# ---------------------------------------------------------------------- users
def _username(request: web.Request) -> str:
    name = request.match_info["username"]
    try:
        check_admin_username(name)
    except ValueError as exc:
        raise ApiError(400, f"username: {exc}") from None
    return name


async def user_put(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    """PUT /admin/v1/users/{username}: add the user or change its password (every broker)."""
    name = _username(request)
    body = api.json_body(request)
    password, encoded = body.get("password"), body.get("hash")
    if set(body) - {"password", "hash"} or (password is None) == (encoded is None):
        raise ApiError(400, 'the body is {"password": "..."} or {"hash": "$scrypt$..."}')
    if password is not None:
        if not isinstance(password, str) or not password:
            raise ApiError(400, "password: a non-empty string")
        try:
            password.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, "password: must be valid UTF-8 text") from None
        encoded = await asyncio.to_thread(hash_password, password)  # scrypt: off the event loop
    if not isinstance(encoded, str):
        raise ApiError(400, "hash: a password hash ($scrypt$, $7$ or $6$)")
    try:
        parse_password_file_text(f"{name}:{encoded}")
    except RecordError as exc:
        raise ApiError(400, f"hash: {exc}") from None
    created = name not in _known_users(api)
    api.dynamic.write_user(name, encoded, principal.user)
    api.broker.log_event(20, "admin_user_set", name=name, created=created, user=principal.user)
    return json_response({"name": name, "source": "dynamic", "created": created}, 201 if created else 200)


def _known_users(api: AdminApi) -> dict[str, str]:
    users = getattr(api.broker.authenticator, "users", None)
    return users() if callable(users) else {}


async def user_delete(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    name = _username(request)
    if name not in _known_users(api):
        raise ApiError(404, f"no user {name!r}")
    api.dynamic.write_user(name, None, principal.user)
    api.broker.log_event(20, "admin_user_removed", name=name, user=principal.user)
    return json_response({"name": name, "removed": True})


async def users_import(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    """POST /admin/v1/import/users: a password file's text; every user in it becomes dynamic."""
    try:
        pairs = parse_password_file_text(api.text_body(request))
    except RecordError as exc:
        raise ApiError(400, f"password file: {exc}") from None
    for name, encoded in pairs:
        api.dynamic.write_user(name, encoded, principal.user)
    api.broker.log_event(20, "admin_users_imported", count=len(pairs), user=principal.user)
    return json_response({"imported": len(pairs), "names": [name for name, _hash in pairs]})


# ---------------------------------------------------------------------- ACL
def _section(request: web.Request) -> SectionKey:
    kind = request.match_info.get("kind", "user")
    if kind == "user":
        return ("user", _username(request))
    return (kind, "")


async def acl_put(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    """PUT /admin/v1/acl/users/{username}, /acl/anonymous, /acl/patterns: replace the rules."""
    section = _section(request)
    body = api.json_body(request)
    if set(body) != {"rules"}:
        raise ApiError(
            400, 'the body is {"rules": [{"access": "read|write|readwrite|deny", "filter": "..."}]}'
        )
    try:
        rules = parse_rules(body["rules"], pattern=section[0] == "patterns")
    except RecordError as exc:
        raise ApiError(400, f"rules: {exc}") from None
    api.dynamic.write_section(section, rules, principal.user)
    api.broker.log_event(
        20, "admin_acl_set", section=":".join(section), rules=len(rules), user=principal.user
    )
    return json_response({"kind": section[0], "user": section[1] or None, "rules": len(rules)})


async def acl_delete(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    section = _section(request)
    if not api.dynamic.drop_section(section):
        raise ApiError(404, f"no dynamic ACL section {':'.join(part for part in section if part)}")
    api.broker.log_event(20, "admin_acl_removed", section=":".join(section), user=principal.user)
    return json_response({"kind": section[0], "user": section[1] or None, "removed": True})


async def acl_import(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    """POST /admin/v1/import/acl: an ACL file's text replaces every dynamic section."""
    text = api.text_body(request)
    try:
        parsed = Acl.parse(text.splitlines(), path="ACL file")
    except AuthFileError as exc:
        raise ApiError(400, str(exc)) from None
    sections = parsed.sections()
    for key in sections:
        if key[0] == "user":
            try:
                check_admin_username(key[1])
            except ValueError as exc:
                raise ApiError(400, f"ACL file: {exc}") from None
    for key in list(api.dynamic.sections):
        if key not in sections:
            api.dynamic.drop_section(key)
    for key, rules in sections.items():
        api.dynamic.write_section(key, rules, principal.user)
    api.broker.log_event(20, "admin_acl_imported", sections=len(sections), user=principal.user)
    return json_response({"sections": len(sections)})
