"""Dynamic users and ACL: the records the admin API writes, carried as retained messages.

A user or an ACL section changed through the admin API (docs/operations.md "Users and ACL at run
time") is one retained message on a reserved topic (``broker.core.reserved``: no MQTT client can
read or write there). The cluster replicates retained messages to every broker with last writer
wins per topic and anti-entropy after a partition (docs/cluster.md "Retained messages"), so every
broker converges to the same records without a message kind of its own; each broker applies them
to its authenticator and ACL (``broker.auth``) as they arrive.

Topics and payloads (JSON, UTF-8)::

    $skipmq/auth/users/<name>          {"v": 1, "hash": "$scrypt$...", "at_ms": ..., "by": ...}
                                        {"v": 1, "deleted": true, "at_ms": ..., "by": ...}
    $skipmq/auth/acl/users/<name>      {"v": 1, "rules": [{"access": "read", "filter": "a/#"}], ...}
    $skipmq/auth/acl/anonymous         the same, for clients without a user name
    $skipmq/auth/acl/patterns          the same, ``pattern`` rules (%c, %u)

``<name>`` is the user name percent-encoded (``/``, ``+``, ``#`` and ``%`` cannot appear raw in a
topic level). Passwords travel and rest only as the password file's salted hashes (``$scrypt$``;
mosquitto's ``$7$``/``$6$`` are accepted on import). A record replaces the password file's entry
or ACL section of the same name; a ``deleted`` user record hides a password-file user of that
name. An empty retained payload (a deletion) removes the record, and the files apply again.

Pure: parsing and validation only; the adapter (``broker.adapters.admin.dynamic``) applies them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from broker.auth.acl import ACCESS_NAMES, AclRule, parse_acl_rule
from broker.auth.password_hashes import check_encoded
from broker.auth.users import check_username
from broker.core.reserved import RESERVED_PREFIX

AUTH_PREFIX = RESERVED_PREFIX + "auth/"
USERS_PREFIX = AUTH_PREFIX + "users/"
ACL_PREFIX = AUTH_PREFIX + "acl/"
ACL_USERS_PREFIX = ACL_PREFIX + "users/"
ACL_ANONYMOUS = ACL_PREFIX + "anonymous"
ACL_PATTERNS = ACL_PREFIX + "patterns"
RECORD_VERSION = 1
MAX_RULES = 1000

# ACL section keys: ("user", name), ("anonymous", ""), ("patterns", "")
SectionKey = tuple[str, str]


class RecordError(ValueError):
    """A dynamic record that cannot be used (the message says why)."""


def encode_name(name: str) -> str:
    return quote(name, safe="")


def user_topic(name: str) -> str:
    return USERS_PREFIX + encode_name(name)


def acl_topic(section: SectionKey) -> str:
    kind, name = section
    if kind == "user":
        return ACL_USERS_PREFIX + encode_name(name)
    if kind == "anonymous":
        return ACL_ANONYMOUS
    if kind == "patterns":
        return ACL_PATTERNS
    raise RecordError(f"unknown ACL section kind {kind!r}")


def check_admin_username(name: str) -> None:
    """A user name the admin API may create: a password-file name that is not reserved."""
    check_username(name)
    if name.startswith("$"):
        raise ValueError(f"user name {name!r} must not start with '$' (reserved for the brokers)")
    if len(name.encode()) > 256:
        raise ValueError("user name is longer than 256 bytes")


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    encoded: str | None  # the password hash; None: deleted (hides a password-file user)
    at_ms: int = 0
    by: str = ""


@dataclass(frozen=True, slots=True)
class AclRecord:
    section: SectionKey
    rules: tuple[AclRule, ...]
    at_ms: int = 0
    by: str = ""


def user_payload(encoded: str | None, at_ms: int, by: str) -> bytes:
    body: dict[str, Any] = {"v": RECORD_VERSION, "at_ms": at_ms, "by": by}
    if encoded is None:
        body["deleted"] = True
    else:
        check_encoded(encoded)
        body["hash"] = encoded
    return json.dumps(body, separators=(",", ":")).encode()


def acl_payload(rules: list[AclRule], at_ms: int, by: str) -> bytes:
    body = {
        "v": RECORD_VERSION,
        "at_ms": at_ms,
        "by": by,
        "rules": [{"access": ACCESS_NAMES[rule.access], "filter": rule.topic_filter} for rule in rules],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def parse_rules(items: object, *, pattern: bool) -> list[AclRule]:
    """Rules from JSON (``[{"access": "read", "filter": "a/#"}, ...]``); RecordError naming the
    bad rule."""
    if not isinstance(items, list):
        raise RecordError("rules must be a list")
    if len(items) > MAX_RULES:
        raise RecordError(f"at most {MAX_RULES} rules per section")
    rules: list[AclRule] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or set(item) - {"access", "filter"}:
            raise RecordError(f"rule {index}: expected {{'access': ..., 'filter': ...}}")
        access = item.get("access")
        topic_filter = item.get("filter")
        if access not in ACCESS_NAMES.values():
            raise RecordError(f"rule {index}: access must be one of {sorted(set(ACCESS_NAMES.values()))}")
        if not isinstance(topic_filter, str):
            raise RecordError(f"rule {index}: filter must be a string")
        try:
            rules.append(parse_acl_rule("pattern" if pattern else "topic", f"{access} {topic_filter}"))
        except ValueError as exc:
            raise RecordError(f"rule {index}: {exc}") from None
    return rules


def _payload_json(payload: bytes) -> dict[str, Any]:
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordError(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("v") != RECORD_VERSION:
        raise RecordError(f"not a version {RECORD_VERSION} record")
    return body


def parse_record(topic: str, payload: bytes) -> UserRecord | AclRecord | SectionKey | str | None:
    """What the retained message (``topic``, ``payload``) says.

    A record when the payload is one; on an empty payload (a deletion) the name of the user
    (``str``) or the ACL section (``SectionKey``) whose record is gone; None for a topic outside
    the dynamic auth records. Raises RecordError for a malformed record."""
    if topic.startswith(USERS_PREFIX):
        name = unquote(topic[len(USERS_PREFIX) :])
        if not payload:
            return name
        body = _payload_json(payload)
        at_ms, by = int(body.get("at_ms", 0) or 0), str(body.get("by", ""))
        if body.get("deleted") is True:
            return UserRecord(name, None, at_ms, by)
        encoded = body.get("hash")
        if not isinstance(encoded, str):
            raise RecordError("a user record needs 'hash' or 'deleted'")
        try:
            check_encoded(encoded)
        except ValueError as exc:
            raise RecordError(str(exc)) from None
        return UserRecord(name, encoded, at_ms, by)
    section: SectionKey | None = None
    if topic.startswith(ACL_USERS_PREFIX):
        section = ("user", unquote(topic[len(ACL_USERS_PREFIX) :]))
    elif topic == ACL_ANONYMOUS:
        section = ("anonymous", "")
    elif topic == ACL_PATTERNS:
        section = ("patterns", "")
    if section is None:
        return None
    if not payload:
        return section
    body = _payload_json(payload)
    rules = parse_rules(body.get("rules"), pattern=section[0] == "patterns")
    return AclRecord(section, tuple(rules), int(body.get("at_ms", 0) or 0), str(body.get("by", "")))


def parse_password_file_text(text: str) -> list[tuple[str, str]]:
    """(user, hash) pairs of a password file's text (``skipmq passwd``'s format; mosquitto's
    ``$7$``/``$6$`` hashes too), for import; RecordError naming the line."""
    users: list[tuple[str, str]] = []
    seen: set[str] = set()
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, colon, encoded = line.partition(":")
        if not colon or not name or not encoded:
            raise RecordError(f"line {line_no}: expected 'username:password-hash'")
        try:
            check_admin_username(name)
            check_encoded(encoded)
        except ValueError as exc:
            raise RecordError(f"line {line_no}: {exc}") from None
        if name in seen:
            raise RecordError(f"line {line_no}: user {name!r} appears twice")
        seen.add(name)
        users.append((name, encoded))
    return users
