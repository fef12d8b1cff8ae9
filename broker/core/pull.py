"""The pull protocol (seed 001 §4.1, §4.4, §4.6): acknowledgement by sequence number over HTTP.

A device that cannot hold a connection asks for its messages with HTTP requests; the broker cannot
know whether a response arrived, so the device carries, in its next request, the sequence numbers
of the messages it received (0 to :data:`MAX_ACKS` of them, §4.6) and the broker deletes exactly
those from the session's durable queue (§4.1). A response carries 0 to :data:`MAX_MESSAGES`
messages with their numbers and a ``remaining`` flag: more are queued (§4.6). Nothing is deleted
before its number comes back, so a lost response only means the same messages, with the same
numbers, come again; the device drops a number it already has (QoS 2: once per number).

This module is the protocol with no I/O, three parts:

* :func:`parse_pull` / :func:`parse_publish` / :func:`parse_open` - a request body (decoded JSON)
  to a request, or a :class:`Problem` naming the field or limit;
* :class:`PullBuffer` - broker side (seed 001's PullResponder): the messages handed to a pull
  session and not yet acknowledged, in delivery order, by number; an acknowledgement turns into
  the MQTT acknowledgements (PUBACK, PUBREC, PUBCOMP) the session's core connection expects;
* :class:`PullReceiver` - device side (seed 001's PullRequester and its ``messagelist`` table):
  which numbers to acknowledge next, and duplicate suppression by number;

and :class:`RateLimiter`, a token bucket per key (``now`` passed in): per client id for
authenticated requests, per source address for failed ones.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MAX_ACKS = 1024  # seed 001 §4.6: 0 to 1,024 received sequence numbers in a request
MAX_MESSAGES = 16  # seed 001 §4.6: 0 to 16 messages in a response
MAX_FILTERS = 64
MAX_SEQ = 2**63 - 1

# MQTT acknowledgements a pull acknowledgement stands for (kind, packet id)
PUBACK = "puback"
PUBREC = "pubrec"
PUBCOMP = "pubcomp"


@dataclass(frozen=True, slots=True)
class Problem:
    """An RFC 9457 problem: ``status``, a short ``title`` and a ``detail`` naming the field/limit."""

    status: int
    title: str
    detail: str
    limit: str | None = None  # the limit that refused the request (its config key or protocol name)

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": "about:blank",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.limit is not None:
            body["limit"] = self.limit
        return body


def bad_request(detail: str, limit: str | None = None) -> Problem:
    return Problem(400, "Bad Request", detail, limit)


def _shown(value: Any) -> str:
    """A request's value as the client wrote it (JSON: ``true``, ``"x"``, ``null``), not as
    Python prints it; long values cut."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = str(value)
    return text if len(text) <= 64 else text[:61] + "..."


# ====================================================================== requests
@dataclass(frozen=True, slots=True)
class PullRequest:
    client_id: str
    acks: tuple[int, ...]
    epoch: str | None  # the epoch the acknowledged numbers were received under (None: the current)
    wait_s: float
    max_messages: int
    session_expiry_s: int | None


@dataclass(frozen=True, slots=True)
class PublishRequest:
    client_id: str
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[str, Any]


@dataclass(frozen=True, slots=True)
class OpenRequest:
    client_id: str
    subscriptions: tuple[tuple[str, int], ...]  # (filter, QoS)
    clean_start: bool
    session_expiry_s: int | None


CREDENTIALS = ("username", "password")
PULL_FIELDS = ("client_id", "acks", "epoch", "wait_s", "max_messages", "session_expiry_s", *CREDENTIALS)
OPEN_FIELDS = ("client_id", "subscriptions", "clean_start", "session_expiry_s", *CREDENTIALS)
PUBLISH_FIELDS = (
    "client_id",
    "topic",
    "payload",
    "payload_base64",
    "qos",
    "retain",
    "properties",
    *CREDENTIALS,
)


def _object(body: Any, fields: tuple[str, ...] = ()) -> dict[str, Any] | Problem:
    """The body as an object; a field of ``fields`` given as null is refused (unknown fields are
    ignored, so newer clients work with older brokers)."""
    if not isinstance(body, dict):
        return bad_request("the body must be a JSON object")
    for name in fields:
        if name in body and body[name] is None:
            return bad_request(f"{name}: null is not allowed (leave the field out)")
    return body


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate (JSON allows the escape, UTF-8 does not)
        return False
    return "\x00" not in text


def _client_id(body: dict[str, Any]) -> str | Problem:
    client_id = body.get("client_id")
    if not isinstance(client_id, str) or not client_id:
        return bad_request("client_id: a non-empty string is required")
    if not _utf8(client_id) or len(client_id.encode()) > 65535:
        return bad_request("client_id: at most 65,535 UTF-8 bytes, no NUL")
    return client_id


def _int(body: dict[str, Any], name: str, default: int | None, low: int, high: int) -> int | Problem | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return bad_request(f"{name}: an integer in {low}..{high} is required, got {_shown(value)}")
    return value


def parse_pull(body: Any, *, max_wait_s: int) -> PullRequest | Problem:
    """A ``POST /v1/pull`` body: ``client_id``, ``acks`` (0..1,024 received numbers), ``epoch``,
    ``wait_s`` (long-poll; more than ``max_wait_s`` waits ``max_wait_s``), ``max_messages``
    (at least 1; more than 16 answers 16, seed 001 §4.6), ``session_expiry_s``."""
    obj = _object(body, PULL_FIELDS)
    if isinstance(obj, Problem):
        return obj
    client_id = _client_id(obj)
    if isinstance(client_id, Problem):
        return client_id
    acks = obj.get("acks", [])
    if not isinstance(acks, list):
        return bad_request("acks: a list of sequence numbers is required")
    if len(acks) > MAX_ACKS:
        return bad_request(
            f"acks: at most {MAX_ACKS} sequence numbers per request (seed 001 §4.6), got {len(acks)}",
            "acks_per_request",
        )
    for seq in acks:
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= MAX_SEQ:
            return bad_request(f"acks: each sequence number is an integer in 1..{MAX_SEQ}, got {_shown(seq)}")
    epoch = obj.get("epoch")
    if epoch is not None and not isinstance(epoch, str):
        return bad_request("epoch: a string (from an earlier response) is required")
    wait = obj.get("wait_s", 0)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
        return bad_request(f"wait_s: a number of seconds >= 0 is required, got {_shown(wait)}")
    wait = min(wait, max_wait_s)  # bounded by the broker (pull.max_wait_s)
    max_messages = _int(obj, "max_messages", MAX_MESSAGES, 1, MAX_SEQ)
    if isinstance(max_messages, Problem):
        return max_messages
    max_messages = min(max_messages, MAX_MESSAGES) if max_messages is not None else None  # capped
    expiry = _int(obj, "session_expiry_s", None, 1, 0xFFFFFFFF)
    if isinstance(expiry, Problem):
        return expiry
    assert max_messages is not None
    return PullRequest(client_id, tuple(dict.fromkeys(acks)), epoch, float(wait), max_messages, expiry)


def parse_open(body: Any) -> OpenRequest | Problem:
    """A ``POST /v1/sessions/open`` body: ``client_id``, ``subscriptions`` ([{"filter", "qos"}]),
    ``clean_start``, ``session_expiry_s``."""
    obj = _object(body, OPEN_FIELDS)
    if isinstance(obj, Problem):
        return obj
    client_id = _client_id(obj)
    if isinstance(client_id, Problem):
        return client_id
    subs = obj.get("subscriptions", [])
    if not isinstance(subs, list) or len(subs) > MAX_FILTERS:
        return bad_request(f"subscriptions: a list of at most {MAX_FILTERS} objects is required")
    parsed: list[tuple[str, int]] = []
    for sub in subs:
        if (
            not isinstance(sub, dict)
            or not isinstance(sub.get("filter"), str)
            or not sub["filter"]
            or not _utf8(sub["filter"])
        ):
            return bad_request('subscriptions: each is {"filter": "<topic filter>", "qos": 0|1|2}')
        qos = sub.get("qos", 1)
        if isinstance(qos, bool) or qos not in (0, 1, 2):
            return bad_request(f"subscriptions: qos must be 0, 1 or 2, got {_shown(qos)}")
        parsed.append((sub["filter"], qos))
    clean = obj.get("clean_start", False)
    if not isinstance(clean, bool):
        return bad_request("clean_start: true or false")
    expiry = _int(obj, "session_expiry_s", None, 1, 0xFFFFFFFF)
    if isinstance(expiry, Problem):
        return expiry
    return OpenRequest(client_id, tuple(parsed), clean, expiry)


def decode_payload(obj: dict[str, Any]) -> bytes | Problem:
    """``payload`` (text, sent as UTF-8) or ``payload_base64`` (bytes); neither is an empty payload."""
    text = obj.get("payload")
    b64 = obj.get("payload_base64")
    if text is not None and b64 is not None:
        return bad_request("give payload or payload_base64, not both")
    if b64 is not None:
        if not isinstance(b64, str):
            return bad_request("payload_base64: a base64 string is required")
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            return bad_request("payload_base64: not valid base64")
    if text is None:
        return b""
    if not isinstance(text, str):
        return bad_request("payload: a string is required (use payload_base64 for bytes)")
    try:
        return text.encode()
    except UnicodeEncodeError:
        return bad_request("payload: not encodable as UTF-8 (a lone surrogate); use payload_base64")


def parse_publish(body: Any) -> PublishRequest | Problem:
    """A ``POST /v1/publish`` body: ``client_id``, ``topic``, ``payload`` | ``payload_base64``,
    ``qos``, ``retain``, ``properties`` ({"content_type", "response_topic", "user_properties",
    "message_expiry_interval"})."""
    obj = _object(body, PUBLISH_FIELDS)
    if isinstance(obj, Problem):
        return obj
    client_id = _client_id(obj)
    if isinstance(client_id, Problem):
        return client_id
    topic = obj.get("topic")
    if not isinstance(topic, str) or not topic or "+" in topic or "#" in topic or not _utf8(topic):
        return bad_request("topic: a topic name is required (no wildcards, no NUL)")
    payload = decode_payload(obj)
    if isinstance(payload, Problem):
        return payload
    qos = obj.get("qos", 0)
    if isinstance(qos, bool) or qos not in (0, 1, 2):
        return bad_request(f"qos: 0, 1 or 2, got {_shown(qos)}")
    retain = obj.get("retain", False)
    if not isinstance(retain, bool):
        return bad_request("retain: true or false")
    props = obj.get("properties", {})
    properties = parse_properties(props)
    if isinstance(properties, Problem):
        return properties
    return PublishRequest(client_id, topic, payload, qos, retain, properties)


def parse_properties(props: Any) -> dict[str, Any] | Problem:
    if not isinstance(props, dict):
        return bad_request("properties: an object is required")
    out: dict[str, Any] = {}
    for name, value in props.items():
        if name in ("content_type", "response_topic"):
            if not isinstance(value, str) or not _utf8(value):
                return bad_request(f"properties.{name}: a string is required")
            if name == "response_topic" and (not value or "+" in value or "#" in value):
                return bad_request("properties.response_topic: a topic name is required")
            out[name] = value
        elif name == "message_expiry_interval":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 0xFFFFFFFF:
                return bad_request("properties.message_expiry_interval: seconds in 1..4294967295")
            out[name] = value
        elif name == "user_properties":
            if not isinstance(value, list) or not all(
                isinstance(pair, list)
                and len(pair) == 2
                and all(isinstance(part, str) and _utf8(part) for part in pair)
                for pair in value
            ):
                return bad_request('properties.user_properties: a list of ["name", "value"] pairs')
            if value:
                out["user_property"] = [(pair[0], pair[1]) for pair in value]  # the codec's name
        else:
            return bad_request(
                f"properties.{name}: unknown (content_type, response_topic, "
                "message_expiry_interval, user_properties)"
            )
    return out


# ====================================================================== broker side
@dataclass(slots=True)
class PulledMessage:
    """A message handed to a pull session: ``seq`` is its number in the session's durable queue
    (None for QoS 0, which is not queued and needs no acknowledgement)."""

    seq: int | None
    packet_id: int | None
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        item: dict[str, Any] = {"seq": self.seq, "topic": self.topic, "qos": self.qos, "retain": self.retain}
        try:
            item["payload"] = self.payload.decode()
        except UnicodeDecodeError:
            item["payload_base64"] = base64.b64encode(self.payload).decode()
        props = properties_json(self.properties)
        if props:
            item["properties"] = props
        return item


def properties_json(props: dict[str, Any]) -> dict[str, Any]:
    """The publish properties a device sees (the ones that describe the message, JSON-friendly)."""
    out: dict[str, Any] = {}
    for name in ("content_type", "response_topic", "message_expiry_interval"):
        if name in props:
            out[name] = props[name]
    if "correlation_data" in props:
        out["correlation_data_base64"] = base64.b64encode(bytes(props["correlation_data"])).decode()
    if props.get("user_property"):
        out["user_properties"] = [[str(k), str(v)] for k, v in props["user_property"]]
    if props.get("subscription_identifier"):
        ids = props["subscription_identifier"]
        out["subscription_identifiers"] = list(ids) if isinstance(ids, (list, tuple)) else [ids]
    return out


class PullBuffer:
    """Messages delivered to one pull session, not yet acknowledged by number (delivery order).

    :meth:`delivered` takes each PUBLISH the session's core connection sends (a re-sent one, same
    number, replaces the earlier copy: still one entry); :meth:`acknowledge` takes the numbers a
    request brings back and returns the MQTT acknowledgements to feed to the core connection
    (which deletes them from the durable queue); :meth:`take` answers a request. A QoS 2 message
    stays until its PUBREL is answered with PUBCOMP (:meth:`released`).
    """

    __slots__ = ("_by_seq", "_qos0", "_released")

    def __init__(self) -> None:
        self._by_seq: OrderedDict[int, PulledMessage] = OrderedDict()
        self._qos0: deque[PulledMessage] = deque()
        self._released: set[int] = set()  # QoS 2 packet ids whose PUBREC was sent

    def __len__(self) -> int:
        return len(self._by_seq) + len(self._qos0)

    def delivered(self, message: PulledMessage) -> None:
        if message.seq is None:
            self._qos0.append(message)
            return
        self._by_seq[message.seq] = message

    def acknowledge(self, seqs: Iterable[int]) -> list[tuple[str, int]]:
        """The device received these numbers: the MQTT acks that complete them (unknown: none)."""
        actions: list[tuple[str, int]] = []
        for seq in seqs:
            message = self._by_seq.pop(seq, None)
            if message is None or message.packet_id is None:
                continue
            if message.qos == 2:
                self._released.add(message.packet_id)
                actions.append((PUBREC, message.packet_id))
            else:
                actions.append((PUBACK, message.packet_id))
        return actions

    def released(self, packet_id: int) -> list[tuple[str, int]]:
        """The core sent PUBREL for ``packet_id``: answer PUBCOMP (also after a restart re-sent it)."""
        self._released.discard(packet_id)
        return [(PUBCOMP, packet_id)]

    def take(self, limit: int = MAX_MESSAGES) -> tuple[list[PulledMessage], bool]:
        """Up to ``limit`` (≤ 16) messages, oldest first, and whether more are waiting. QoS 0
        messages go out once (nothing acknowledges them); numbered ones stay until acknowledged."""
        limit = min(limit, MAX_MESSAGES)
        out: list[PulledMessage] = []
        for message in self._by_seq.values():
            if len(out) >= limit:
                break
            out.append(message)
        while self._qos0 and len(out) < limit:
            out.append(self._qos0.popleft())
        remaining = len(self._by_seq) > sum(1 for m in out if m.seq is not None) or bool(self._qos0)
        return out, remaining

    def numbers(self) -> list[int]:
        return list(self._by_seq)

    def clear(self) -> None:
        self._by_seq.clear()
        self._qos0.clear()
        self._released.clear()


# ====================================================================== device side
class PullReceiver:
    """The device side of seed 001 §4.4/§4.5 (its ``messagelist`` table): the numbers received and
    not yet confirmed deleted, carried in every request until a response confirms them.

    :meth:`next_acks` gives the numbers (and their epoch) for the next request; :meth:`accept`
    takes a response: the acknowledgements it carried are confirmed (forgotten), and each
    message whose number is new is returned for the application - a number still in the table
    is a re-delivery of a message the application has (dropped: once per number). A new epoch
    (the session was renumbered on another broker, or started anew) makes the old numbers
    meaningless: they are forgotten.
    """

    __slots__ = ("_epoch", "_unconfirmed")

    def __init__(self) -> None:
        self._unconfirmed: dict[int, None] = {}
        self._epoch: str | None = None

    def next_acks(self) -> tuple[list[int], str | None]:
        return list(self._unconfirmed)[:MAX_ACKS], self._epoch

    def accept(self, sent_acks: list[int], response: dict[str, Any]) -> list[dict[str, Any]]:
        """``response`` is a 200 body of POST /v1/pull answering a request that carried ``sent_acks``."""
        epoch = response.get("epoch")
        if epoch != self._epoch or not response.get("session_present", True):
            self._unconfirmed.clear()
            self._epoch = epoch if isinstance(epoch, str) else None
        else:
            for seq in sent_acks:
                self._unconfirmed.pop(seq, None)
        fresh: list[dict[str, Any]] = []
        for message in response.get("messages", []):
            seq = message.get("seq")
            if seq is None:
                fresh.append(message)
            elif seq not in self._unconfirmed:
                self._unconfirmed[seq] = None
                fresh.append(message)
        return fresh

    @property
    def pending(self) -> int:
        return len(self._unconfirmed)


# ====================================================================== rate limit
class RateLimiter:
    """A token bucket per key: ``rate_per_s`` tokens a second, at most ``rate_per_s`` saved."""

    __slots__ = ("_buckets", "_max_keys", "rate_per_s")

    def __init__(self, rate_per_s: int, *, max_keys: int = 100_000) -> None:
        self.rate_per_s = rate_per_s
        self._buckets: dict[str, tuple[float, float]] = {}
        self._max_keys = max_keys

    def exhausted(self, key: str, now: float) -> bool:
        """Whether ``key`` has no token left (nothing is taken)."""
        entry = self._buckets.get(key)
        if entry is None:
            return False
        tokens, last = entry
        return min(float(self.rate_per_s), tokens + (now - last) * self.rate_per_s) < 1.0

    def allow(self, key: str, now: float) -> bool:
        tokens, last = self._buckets.get(key, (float(self.rate_per_s), now))
        tokens = min(float(self.rate_per_s), tokens + (now - last) * self.rate_per_s)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        if len(self._buckets) >= self._max_keys and key not in self._buckets:
            self._buckets.clear()  # bounded memory under a flood of client ids
        self._buckets[key] = (tokens - 1.0, now)
        return True
