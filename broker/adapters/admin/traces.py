"""Traces: watch a client id or a topic filter for N seconds, on every broker, and summarise.

* **Client trace.** On the broker where the client is connected (checked every 0.2 s, so a client
  that connects or moves during the trace is caught), its connection's byte streams are watched:
  the transport the core writes to is wrapped (every packet out), and for TCP/TLS the listener's
  receiver too (every packet in). Packets are framed by their fixed header only (type, size, and a
  PUBLISH's topic), nothing is decoded twice and nothing changes on the wire. Wrappers are taken
  off when the trace ends.
* **Filter trace.** While it runs, the ACL checks the core makes anyway are watched
  (``DynamicAuth.acl_wrappers``): every PUBLISH a local client makes to a matching topic (allowed
  or refused), every delivery of a matching topic to a local client, every SUBSCRIBE to an
  overlapping filter. Each broker records its own clients; the answer merges every broker's.

Both are bounded: at most ``MAX_EVENTS`` events kept per broker (the counts keep counting), at
most ``MAX_KEYS`` topics and clients counted, at most ``MAX_TRACES`` traces remembered.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.adapters.admin.local import filters_overlap
from broker.adapters.admin.responses import ApiError, json_response
from broker.mqtt.topics import TopicError, parse_shared, topic_matches, validate_topic_filter

if TYPE_CHECKING:
    from broker.adapters.admin.access import Principal
    from broker.adapters.admin.api import AdminApi
    from broker.core.ports import AclPort

MAX_EVENTS = 500
MAX_KEYS = 200
MAX_TRACES = 20
MAX_DURATION_S = 300
POLL_S = 0.2
PACKET_NAMES = {
    1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 5: "PUBREC", 6: "PUBREL", 7: "PUBCOMP",
    8: "SUBSCRIBE", 9: "SUBACK", 10: "UNSUBSCRIBE", 11: "UNSUBACK", 12: "PINGREQ", 13: "PINGRESP",
    14: "DISCONNECT", 15: "AUTH",
}  # fmt: skip


class PacketFramer:
    """Splits one direction of an MQTT byte stream into packets by their fixed header."""

    __slots__ = ("_buffer", "_skip")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._skip = 0

    def feed(self, data: bytes) -> list[tuple[str, int, str | None]]:
        """(packet type, size, PUBLISH topic) of every packet completed by ``data``."""
        packets: list[tuple[str, int, str | None]] = []
        if self._skip:
            taken = min(self._skip, len(data))
            self._skip -= taken
            data = data[taken:]
        buffer = self._buffer
        buffer += data
        while buffer:
            length, multiplier, index = 0, 1, 1
            while True:
                if index >= len(buffer):
                    return packets
                byte = buffer[index]
                length += (byte & 0x7F) * multiplier
                multiplier *= 128
                index += 1
                if not byte & 0x80 or index > 4:
                    break
            ptype = buffer[0] >> 4
            size = index + length
            topic = None
            if ptype == 3:
                if len(buffer) < index + 2 and len(buffer) < size:
                    return packets
                topic_len = (
                    int.from_bytes(buffer[index : index + 2], "big") if len(buffer) >= index + 2 else 0
                )
                if len(buffer) < min(size, index + 2 + topic_len):
                    return packets
                topic = bytes(buffer[index + 2 : index + 2 + topic_len]).decode("utf-8", "replace")
            packets.append((PACKET_NAMES.get(ptype, f"TYPE{ptype}"), size, topic))
            if len(buffer) >= size:
                del buffer[:size]
            else:
                self._skip = size - len(buffer)
                buffer.clear()
        return packets


class Trace:
    """One broker's part of a trace."""

    def __init__(
        self, trace_id: str, kind: str, target: str, duration_s: float, broker: str, by: str
    ) -> None:
        self.id = trace_id
        self.kind = kind  # "client" or "filter"
        self.target = target
        self.broker = broker
        self.by = by
        self.started_at = time.time()
        self.ends_at = self.started_at + duration_s
        self.events: list[dict[str, Any]] = []
        self.dropped = 0
        self.packets: dict[str, dict[str, int]] = {"in": {}, "out": {}}
        self.bytes = {"in": 0, "out": 0}
        self.topics: dict[str, dict[str, int]] = {}
        self.clients: dict[str, dict[str, int]] = {}
        self.acl = {"allowed": 0, "denied": 0}
        self.connected_here = False
        self.task: asyncio.Task[None] | None = None
        self.undo: list[Any] = []

    @property
    def running(self) -> bool:
        return time.time() < self.ends_at and self.task is not None and not self.task.done()

    def _count(self, table: dict[str, dict[str, int]], key: str, what: str) -> None:
        row = table.get(key)
        if row is None:
            if len(table) >= MAX_KEYS:
                return
            row = table[key] = {}
        row[what] = row.get(what, 0) + 1

    def event(self, **fields: Any) -> None:
        if len(self.events) >= MAX_EVENTS:
            self.dropped += 1
            return
        fields["t"] = round(time.time(), 4)
        fields["broker"] = self.broker
        self.events.append(fields)

    def packet(self, direction: str, ptype: str, size: int, topic: str | None) -> None:
        counts = self.packets[direction]
        counts[ptype] = counts.get(ptype, 0) + 1
        self.bytes[direction] += size
        if topic is not None:
            self._count(self.topics, topic, "publish_in" if direction == "in" else "publish_out")
        self.event(kind="packet", dir=direction, type=ptype, size=size, topic=topic)

    def decision(self, what: str, client_id: str, topic: str, allowed: bool) -> None:
        self.acl["allowed" if allowed else "denied"] += 1
        self._count(self.clients, client_id, what if allowed else f"{what}_denied")
        self._count(self.topics, topic, what if allowed else f"{what}_denied")
        self.event(kind=what, client_id=client_id, topic=topic, allowed=allowed)

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "target": self.target,
            "broker": self.broker,
            "by": self.by,
            "started_at": round(self.started_at, 3),
            "ends_at": round(self.ends_at, 3),
            "state": "running" if self.running else "done",
            "connected_here": self.connected_here,
            "packets": self.packets,
            "bytes": self.bytes,
            "topics": self.topics,
            "clients": self.clients,
            "acl": self.acl,
            "events": self.events,
            "events_dropped": self.dropped,
        }


class _TracedTransport:
    """The client's transport as the core sees it during a trace: records what is written."""

    def __init__(self, inner: Any, trace: Trace) -> None:
        self._inner = inner
        self._trace = trace
        self._framer = PacketFramer()

    def write(self, data: bytes) -> None:
        if self._trace.running:
            for ptype, size, topic in self._framer.feed(bytes(data)):
                self._trace.packet("out", ptype, size, topic)
        self._inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _TracedReceiver:
    """The listener's view of the connection during a trace: records what is received."""

    def __init__(self, conn: Any, trace: Trace) -> None:
        self._conn = conn
        self._trace = trace
        self._framer = PacketFramer()

    def receive(self, data: bytes) -> None:
        if self._trace.running:
            for ptype, size, topic in self._framer.feed(bytes(data)):
                self._trace.packet("in", ptype, size, topic)
        self._conn.receive(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _TracingAcl:
    """Watches the core's ACL checks for the filter traces and client traces running."""

    def __init__(self, inner: AclPort | None, traces: Traces) -> None:
        self._inner = inner
        self._traces = traces

    def _record(
        self, what: str, client_id: str, topic: str, allowed: bool, *, is_filter: bool = False
    ) -> None:
        for trace in self._traces.running():
            if trace.kind == "client":
                if trace.target == client_id:
                    trace.decision(what, client_id, topic, allowed)
            elif filters_overlap(trace.target, topic) if is_filter else topic_matches(trace.target, topic):
                trace.decision(what, client_id, topic, allowed)

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        inner = self._inner
        allowed = inner is None or inner.can_publish(client_id, username, topic)
        self._record("publish", client_id, topic, allowed)
        return allowed

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        inner = self._inner
        allowed = inner is None or inner.can_subscribe(client_id, username, topic_filter)
        try:
            match_filter = parse_shared(topic_filter)[1]
        except TopicError:
            match_filter = topic_filter
        self._record("subscribe", client_id, match_filter, allowed, is_filter=True)
        return allowed

    def can_receive(self, client_id: str, username: str | None, topic: str) -> bool:
        inner = self._inner
        allowed = inner is None or inner.can_receive(client_id, username, topic)
        self._record("deliver", client_id, topic, allowed)
        return allowed


class Traces:
    """The traces of one broker."""

    def __init__(self, api: AdminApi) -> None:
        self.api = api
        self.by_id: OrderedDict[str, Trace] = OrderedDict()
        self._wrapper_installed = False

    def running(self) -> list[Trace]:
        return [trace for trace in self.by_id.values() if trace.running]

    def _wrap(self, acl: AclPort | None) -> AclPort | None:
        return _TracingAcl(acl, self)

    def start(self, trace: Trace, duration_s: float) -> None:
        self.by_id[trace.id] = trace
        while len(self.by_id) > MAX_TRACES:
            _old_id, old = self.by_id.popitem(last=False)
            if old.task is not None:
                old.task.cancel()
        trace.task = asyncio.get_running_loop().create_task(self._run(trace, duration_s))
        if not self._wrapper_installed:
            self._wrapper_installed = True
            self.api.dynamic.acl_wrappers.append(self._wrap)
            self.api.dynamic.install_acl()

    async def _run(self, trace: Trace, duration_s: float) -> None:
        try:
            deadline = time.monotonic() + duration_s
            while time.monotonic() < deadline:
                if trace.kind == "client":
                    self._attach(trace)
                await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        finally:
            for undo in reversed(trace.undo):
                with contextlib.suppress(Exception):
                    undo()
            trace.undo.clear()
            trace.ends_at = min(trace.ends_at, time.time())
            if not any(
                t.task is not None and not t.task.done() and t is not trace for t in self.by_id.values()
            ):
                self._remove_wrapper()

    def _remove_wrapper(self) -> None:
        if self._wrapper_installed:
            self._wrapper_installed = False
            with contextlib.suppress(ValueError):
                self.api.dynamic.acl_wrappers.remove(self._wrap)
            self.api.dynamic.install_acl()

    def _attach(self, trace: Trace) -> None:
        from broker.adapters.listeners import MqttProtocol

        session = self.api.broker.sessions.get(trace.target)
        conn = session.connection if session is not None else None
        if conn is None:
            return
        trace.connected_here = True
        transport = conn.transport
        if isinstance(transport, _TracedTransport):
            return
        traced = _TracedTransport(transport, trace)
        conn.transport = traced
        trace.event(kind="attached", client_id=trace.target, peer=conn.peer)

        def undo_transport() -> None:
            if conn.transport is traced:
                conn.transport = transport

        trace.undo.append(undo_transport)
        get_protocol = getattr(transport, "get_protocol", None)
        protocol = get_protocol() if get_protocol is not None else None
        if isinstance(protocol, MqttProtocol) and protocol.client is conn:
            receiver = _TracedReceiver(conn, trace)
            protocol.client = receiver  # type: ignore[assignment]

            def undo_receiver() -> None:
                if protocol.client is receiver:
                    protocol.client = conn

            trace.undo.append(undo_receiver)

    def stop_all(self) -> None:
        for trace in self.by_id.values():
            if trace.task is not None:
                trace.task.cancel()


# ---------------------------------------------------------------------- endpoints
def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    first = parts[0]
    merged: dict[str, Any] = {
        key: first[key] for key in ("id", "kind", "target", "by", "started_at", "ends_at")
    }
    merged["state"] = "running" if any(part["state"] == "running" for part in parts) else "done"
    merged["connected_on"] = [part["broker"] for part in parts if part.get("connected_here")]
    packets: dict[str, dict[str, int]] = {"in": {}, "out": {}}
    totals = {"in": 0, "out": 0}
    acl = {"allowed": 0, "denied": 0}
    topics: dict[str, dict[str, int]] = {}
    clients: dict[str, dict[str, int]] = {}
    for part in parts:
        for direction in ("in", "out"):
            for name, count in part["packets"][direction].items():
                packets[direction][name] = packets[direction].get(name, 0) + count
            totals[direction] += part["bytes"][direction]
        for name in acl:
            acl[name] += part["acl"][name]
        for table, into in ((part["topics"], topics), (part["clients"], clients)):
            for key, row in table.items():
                target = into.setdefault(key, {})
                for what, count in row.items():
                    target[what] = target.get(what, 0) + count
    events = sorted((event for part in parts for event in part["events"]), key=lambda event: event["t"])
    merged.update(
        {
            "packets": packets,
            "bytes": totals,
            "acl": acl,
            "topics": topics,
            "clients": clients,
            "events": events[:MAX_EVENTS],
            "events_dropped": sum(part["events_dropped"] for part in parts)
            + max(0, len(events) - MAX_EVENTS),
        }
    )
    return merged


async def trace_start(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    """POST /admin/v1/traces {"client_id": ...} or {"filter": ...}, "duration_s": 1..300."""
    body = api.json_body(request)
    if set(body) - {"client_id", "filter", "duration_s", "id"}:
        raise ApiError(400, 'the body is {"client_id" or "filter": ..., "duration_s": 1..300}')
    client_id, topic_filter = body.get("client_id"), body.get("filter")
    if (client_id is None) == (topic_filter is None):
        raise ApiError(400, "give client_id or filter (one of them)")
    duration = body.get("duration_s", 10)
    if (
        isinstance(duration, bool)
        or not isinstance(duration, int | float)
        or not 1 <= duration <= MAX_DURATION_S
    ):
        raise ApiError(400, f"duration_s: a number of seconds in 1..{MAX_DURATION_S}")
    if client_id is not None:
        if not isinstance(client_id, str) or not client_id or "\x00" in client_id:
            raise ApiError(400, "client_id: a non-empty string")
        kind, target = "client", client_id
    else:
        if not isinstance(topic_filter, str):
            raise ApiError(400, "filter: a topic filter")
        try:
            validate_topic_filter(topic_filter)
        except TopicError as exc:
            raise ApiError(400, f"filter: {exc}") from None
        kind, target = "filter", topic_filter
    trace_id = body.get("id") if api.is_local(request) else None
    if trace_id is not None and (
        not isinstance(trace_id, str) or not trace_id.isalnum() or len(trace_id) > 64
    ):
        raise ApiError(400, "id: letters and digits")
    trace_id = trace_id or secrets.token_hex(8)
    if trace_id in api.traces.by_id:
        raise ApiError(409, f"trace {trace_id} exists")
    trace = Trace(trace_id, kind, target, float(duration), api.node_id, principal.user)
    api.traces.start(trace, float(duration))
    if api.is_local(request):
        return json_response({"id": trace_id, "broker": api.node_id}, 201)
    import json

    request["admin_body"] = json.dumps(
        {kind if kind == "filter" else "client_id": target, "duration_s": duration, "id": trace_id}
    ).encode()
    gathered = await api.gather(request, principal, None)
    api.broker.log_event(
        20,
        "admin_trace_started",
        id=trace_id,
        kind=kind,
        target=target,
        duration_s=duration,
        user=principal.user,
    )
    return json_response(
        {
            "id": trace_id,
            "kind": kind,
            "target": target,
            "duration_s": duration,
            "ends_at": round(trace.ends_at, 3),
            "brokers": sorted([api.node_id, *gathered.parts]),
            "missing": gathered.missing,
        },
        201,
    )


async def trace_get(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    trace_id = request.match_info["trace_id"]

    async def local() -> dict[str, Any] | None:
        trace = api.traces.by_id.get(trace_id)
        return trace.as_json() if trace is not None else None

    if api.is_local(request):
        found = await local()
        if found is None:
            from broker.adapters.admin.reads import not_here

            return not_here(f"no trace {trace_id} on {api.node_id}")
        return json_response(found)
    gathered = await api.gather(request, principal, local)
    parts = [part for part in gathered.parts.values() if part]
    if not parts:
        raise ApiError(404, f"no trace {trace_id}")
    merged = _merge(parts)
    merged["brokers"] = sorted(part["broker"] for part in parts)
    merged["missing"] = gathered.missing
    return json_response(merged)


async def traces_list(api: AdminApi, request: web.Request, principal: Principal) -> web.Response:
    rows = [
        {key: value for key, value in trace.as_json().items() if key not in ("events", "topics", "clients")}
        for trace in reversed(api.traces.by_id.values())
    ]
    return json_response({"traces": rows, "broker": api.node_id})
