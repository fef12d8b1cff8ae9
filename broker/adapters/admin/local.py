"""This broker's part of every admin answer: read-only views of its state, and the two actions
(disconnect a client, publish a message).

Everything here runs on the broker's event loop and only reads the core's and the cluster
engine's state (sessions, subscriptions, retained index, the overlay node's routing tables,
interest tables, per-class counters) - except ``kick`` (``BrokerApi.kick``, then ending the session
when asked) and ``publish`` (the core's router, as ``$SYS`` does). Lists are paged by a sort key
(client id, topic, ...): a page is the ``limit`` smallest keys after the cursor's, found with a
bounded heap in one pass (``heapq.nsmallest``), so a page costs O(n log limit) time and O(limit)
memory whatever the number of sessions (bench/admin_bench.py measures it).
"""

from __future__ import annotations

import base64
import heapq
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from broker import __version__
from broker.core.session import Message, Session
from broker.mqtt.packets import MQTT_3_1, MQTT_5, ReasonCode
from broker.mqtt.topics import parse_shared, topic_matches

if TYPE_CHECKING:
    from broker.adapters.server import BrokerServer
    from broker.core.broker import Broker

T = TypeVar("T")
Key = tuple[str, ...]
PREVIEW_BYTES = 256
QUEUE_PREVIEW = 20
PROTOCOLS = {MQTT_3_1: "3.1", 4: "3.1.1", MQTT_5: "5.0"}


@dataclass(slots=True)
class Page:
    """One broker's page: items in key order, their keys, and whether more follow."""

    items: list[dict[str, Any]]
    keys: list[Key]
    more: bool

    def as_json(self) -> dict[str, Any]:
        return {"items": self.items, "keys": [list(key) for key in self.keys], "more": self.more}


def page_of(
    pairs: Iterable[tuple[Key, T]], after: Key | None, limit: int, build: Callable[[T], dict[str, Any]]
) -> Page:
    """The ``limit`` smallest (key, value) pairs with key > ``after``, built into items."""
    if after is not None:
        pairs = (pair for pair in pairs if pair[0] > after)
    chosen = heapq.nsmallest(limit + 1, pairs, key=lambda pair: pair[0])
    more = len(chosen) > limit
    chosen = chosen[:limit]
    return Page([build(value) for _key, value in chosen], [key for key, _value in chosen], more)


def payload_preview(payload: bytes) -> dict[str, Any]:
    """The first bytes of a payload as text when they are UTF-8, else base64."""
    head = payload[:PREVIEW_BYTES]
    preview: dict[str, Any] = {"size": len(payload), "truncated": len(payload) > PREVIEW_BYTES}
    try:
        preview["text"] = head.decode("utf-8")
    except UnicodeDecodeError:
        preview["base64"] = base64.b64encode(head).decode()
    return preview


def filters_overlap(a: str, b: str) -> bool:
    """Whether some topic name matches both filters (the '$' rule: a wildcard first level
    matches no '$' topic)."""
    la, lb = a.split("/"), b.split("/")
    if (la[0] in ("+", "#") and lb[0].startswith("$")) or (lb[0] in ("+", "#") and la[0].startswith("$")):
        return False
    for index in range(max(len(la), len(lb))):
        x = la[index] if index < len(la) else None
        y = lb[index] if index < len(lb) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x != y and x != "+" and y != "+":
            return False
    return True


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class LocalView:
    """Read this broker's state for the admin API (see the module docstring)."""

    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self._class_sample: tuple[float, dict[str, list[int]]] | None = None
        self._class_rates: dict[str, dict[str, float]] = {}

    @property
    def broker(self) -> Broker:
        broker = self.server.broker
        assert broker is not None
        return broker

    @property
    def node_id(self) -> str:
        return self.broker.node_id

    @property
    def peer_id(self) -> str:
        runtime = self.server.runtime
        return runtime.engine.peer_id if runtime is not None else ""

    # ------------------------------------------------------------------ brokers and listeners
    def broker_info(self, admin_url: str) -> dict[str, Any]:
        broker = self.broker
        broker.refresh_stats()
        stats = broker.stats
        not_ready = None if self.server.stopping is False else "shutting_down"
        not_ready = not_ready or self.server.not_ready()
        info: dict[str, Any] = {
            "node_id": broker.node_id,
            "peer_id": self.peer_id or None,
            "version": __version__,
            "admin_url": admin_url,
            "status": "ready" if not_ready is None else "not_ready",
            "not_ready_reason": not_ready,
            "uptime_s": round(time.time() - stats.uptime_started_at, 3),
            "connections": broker.connected_count,
            "sessions": stats.sessions,
            "subscriptions": stats.subscriptions,
            "retained": stats.retained_messages,
            "queued_messages": stats.queued_messages,
            "inflight_messages": stats.inflight_messages,
            "rss_bytes": rss_bytes(),
            "clustered": self.server.runtime is not None,
            "links": self.links(),
            "virtual_nodes": 0,
        }
        runtime = self.server.runtime
        if runtime is not None and runtime.engine.node is not None:
            info["virtual_nodes"] = len(runtime.engine.node.vnodes)
        return info

    def links(self) -> list[dict[str, Any]]:
        """This broker's view of each other broker: link up, suspected, seconds silent."""
        runtime = self.server.runtime
        if runtime is None:
            return []
        engine = runtime.engine
        state = engine.state()
        connected = set(state["connected_peers"])
        figures = engine.overlay_figures()
        peers = (set(connected) | set(figures.peer_suspected)) - {engine.peer_id}
        http_ports = state.get("peer_http_ports") or {}
        return [
            {
                "peer_id": peer,
                "connected": peer in connected,
                "suspected": bool(figures.peer_suspected.get(peer, 0)),
                "silence_s": round(figures.peer_silence_s[peer], 3)
                if peer in figures.peer_silence_s
                else None,
                "http_port": http_ports.get(peer),
            }
            for peer in sorted(peers)
        ]

    def listeners(self) -> list[dict[str, Any]]:
        config = self.server.config
        ports = self.server.ports
        result = []
        rows: list[tuple[str, bool, str, int, str]] = [
            (
                "tcp",
                config.listeners.tcp.enabled,
                config.listeners.tcp.host,
                config.listeners.tcp.port,
                "mqtt",
            ),
            (
                "tls",
                config.listeners.tls.enabled,
                config.listeners.tls.host,
                config.listeners.tls.port,
                "mqtts",
            ),
            (
                "websocket",
                config.listeners.websocket.enabled,
                config.listeners.websocket.host,
                config.listeners.websocket.port,
                "ws",
            ),
            (
                "http",
                config.http.enabled,
                config.http.host,
                config.http.port,
                "https" if config.http.certfile else "http",
            ),
            ("cluster", config.cluster.enabled, config.cluster.host, config.cluster.port, "grpc"),
            ("federation", config.federation.enabled, config.federation.host, config.federation.port, "grpc"),
        ]
        connections: dict[str, int] = {}
        for conn in self.broker.connections:
            connections[conn.listener] = connections.get(conn.listener, 0) + 1
        for name, enabled, host, port, scheme in rows:
            result.append(
                {
                    "broker": self.node_id,
                    "name": name,
                    "enabled": enabled,
                    "host": host,
                    "port": ports.get(name, port) if enabled else port,
                    "scheme": scheme,
                    "connections": connections.get(name, 0) if name in ("tcp", "tls", "websocket") else None,
                }
            )
        return result

    # ------------------------------------------------------------------ clients and sessions
    def _session_item(self, session: Session) -> dict[str, Any]:
        broker = self.broker
        conn = session.connection
        item: dict[str, Any] = {
            "client_id": session.client_id,
            "broker": broker.node_id,
            "username": session.username,
            "connected": conn is not None,
            "protocol": PROTOCOLS.get(session.protocol_level, str(session.protocol_level)),
            "persistent": session.persistent,
            "expiry_interval_s": session.expiry_interval_s,
            "subscriptions": len(session.subscriptions),
            "queued": len(session.queue),
            "inflight": len(session.inflight),
            "peer": None,
            "listener": None,
            "keep_alive_s": None,
            "connected_at": None,
            "disconnected_at": session.disconnected_at,
        }
        if conn is not None:
            item["peer"] = conn.peer
            protocol = getattr(conn, "protocol", None)
            item["listener"] = getattr(conn, "listener", None)
            if protocol is not None:
                item["keep_alive_s"] = protocol.keep_alive_s
                elapsed = broker.scheduler.time() - protocol.opened_at
                item["connected_at"] = round(broker.scheduler.wall_time() - elapsed, 3)
        return item

    def sessions(
        self,
        after: Key | None,
        limit: int,
        *,
        connected: bool | None = None,
        prefix: str = "",
        username: str | None = None,
    ) -> Page:
        def pairs() -> Iterator[tuple[Key, Session]]:
            for client_id, session in self.broker.sessions.items():
                if prefix and not client_id.startswith(prefix):
                    continue
                if connected is not None and (session.connection is not None) != connected:
                    continue
                if username is not None and session.username != username:
                    continue
                yield (client_id,), session

        return page_of(pairs(), after, limit, self._session_item)

    def client(self, client_id: str) -> dict[str, Any] | None:
        session = self.broker.sessions.get(client_id)
        if session is None:
            return None
        item = self._session_item(session)
        item["subscription_list"] = [
            self._subscription_item(session, opts) for opts in session.subscriptions.values()
        ]
        item["queue_preview"] = [
            {
                "topic": entry.message.topic,
                "qos": entry.qos,
                "size": len(entry.message.payload),
                "state": entry.state,
            }
            for entry in list(session.pending_entries())[:QUEUE_PREVIEW]
        ]
        item["will_topic"] = session.will.topic if session.will is not None else None
        return item

    # ------------------------------------------------------------------ subscriptions
    def _subscription_item(self, session: Session, opts: Any) -> dict[str, Any]:
        return {
            "client_id": session.client_id,
            "broker": self.node_id,
            "filter": opts.topic_filter,
            "qos": opts.qos,
            "share_group": opts.share_group,
            "no_local": opts.no_local,
            "retain_as_published": opts.retain_as_published,
            "retain_handling": opts.retain_handling,
            "subscription_identifier": opts.subscription_identifier,
            "connected": session.connection is not None,
        }

    def subscriptions(
        self,
        after: Key | None,
        limit: int,
        *,
        client_id: str | None = None,
        topic_filter: str | None = None,
        exact: bool = False,
        topic: str | None = None,
    ) -> Page:
        """By client (``client_id``), by filter (``topic_filter``: the subscriptions that can get
        a message of a topic it matches - or with ``exact`` the same filter), or by ``topic``
        (the subscriptions a message on it reaches); keyed (filter, client id)."""

        def wanted(opts: Any) -> bool:
            match_filter = opts.match_filter or parse_shared(opts.topic_filter)[1]
            if topic_filter is not None:
                if exact:
                    return match_filter == topic_filter or opts.topic_filter == topic_filter
                if not filters_overlap(match_filter, topic_filter):
                    return False
            return topic is None or topic_matches(match_filter, topic)

        def pairs() -> Iterator[tuple[Key, tuple[Session, Any]]]:
            sessions: Iterable[Session]
            if client_id is not None:
                one = self.broker.sessions.get(client_id)
                sessions = [] if one is None else [one]
            else:
                sessions = self.broker.sessions.values()
            for session in sessions:
                for opts in session.subscriptions.values():
                    if wanted(opts):
                        yield (opts.topic_filter, session.client_id), (session, opts)

        return page_of(pairs(), after, limit, lambda pair: self._subscription_item(pair[0], pair[1]))

    # ------------------------------------------------------------------ retained
    def retained(self, after: Key | None, limit: int, topic_filter: str) -> Page:
        def item(message: Message) -> dict[str, Any]:
            return {
                "topic": message.topic,
                "qos": message.qos,
                "origin": message.origin or None,
                "expiry_at": message.expiry_at,
                "payload": payload_preview(message.payload),
            }

        pairs = (((topic,), message) for topic, message in self.broker.retained.match(topic_filter))
        return page_of(pairs, after, limit, item)

    # ------------------------------------------------------------------ topic classes and routes
    def _rates(self, by_class: dict[str, list[int]]) -> dict[str, dict[str, float]]:
        """Per-second rates of each class's counters since the previous sample (at least 1 s old)."""
        now = time.monotonic()
        sample = self._class_sample
        if sample is not None and now - sample[0] < 1.0:
            return self._class_rates
        if sample is not None:
            elapsed = now - sample[0]
            rates: dict[str, dict[str, float]] = {}
            for cls, row in by_class.items():
                before = sample[1].get(cls, [0] * len(row))
                rates[cls] = {
                    "publishes_per_s": round((row[0] - before[0]) / elapsed, 3),
                    "forwards_per_s": round((row[1] - before[1]) / elapsed, 3),
                    "received_per_s": round((row[2] - before[2]) / elapsed, 3),
                }
            self._class_rates = rates
        self._class_sample = (now, {cls: list(row) for cls, row in by_class.items()})
        return self._class_rates

    def classes(self) -> dict[str, Any]:
        """Each topic class this broker subscribes, publishes or knows a subscriber of, with its
        route from here: ``one_hop`` (the publisher virtual node's routing table holds every other
        subscriber broker: each gets the PUB directly, seed 003 §3.3), ``multi_hop`` (some are
        reached through other brokers), ``no_subscribers``."""
        runtime = self.server.runtime
        if runtime is None:
            return {"table_size": None, "classes": []}
        from broker.cluster.class_stats import COUNTER_NAMES, hop_bucket_bounds
        from broker.cluster.classes import is_wildcard_class
        from overlay.keys import PUBLISHER, SUBSCRIBER, make_key

        engine = runtime.engine
        node = engine.node
        peer = engine.peer_id
        state = engine.state()
        published = set(state["published_classes"])
        subscribed = set(state["subscribed_classes"])
        by_class = engine.class_counters.by_class
        rates = self._rates(by_class)
        names = (published | subscribed | engine.interest_table.classes() | set(by_class)) - {""}
        result = []
        for cls in sorted(names):
            if cls.startswith("!") or cls.startswith("=$"):
                continue  # the control class and $-topics (never forwarded)
            remote = sorted(set(engine.interest_table.peers_of(cls)) - {peer})
            entry: dict[str, Any] = {
                "class": cls,
                "wildcard": is_wildcard_class(cls),
                "broker": self.node_id,
                "peer_id": peer,
                "subscribed_here": cls in subscribed,
                "published_here": cls in published,
                "remote_subscribers": remote,
                "route": None,
                "direct": [],
                "via_others": [],
                "hops": None,
                "counters": None,
                "rates": rates.get(cls),
            }
            if cls in published:
                vnode = node.vnodes.get(make_key(cls, PUBLISHER, peer)) if node is not None else None
                if not remote:
                    entry["route"] = "no_subscribers"
                elif vnode is None:
                    entry["route"] = "multi_hop"
                    entry["via_others"] = remote
                else:
                    table = vnode.table
                    known = {key[2] for key in table if key[0] == cls and key[1] == SUBSCRIBER}
                    entry["direct"] = sorted(set(remote) & known)
                    entry["via_others"] = sorted(set(remote) - known)
                    entry["route"] = "one_hop" if not entry["via_others"] else "multi_hop"
            row = by_class.get(cls)
            if row is not None:
                counters = {name: row[index] for index, name in enumerate(COUNTER_NAMES)}
                entry["counters"] = counters
                buckets = row[len(COUNTER_NAMES) :]
                entry["hops"] = {
                    "bounds": hop_bucket_bounds(),
                    "counts": buckets,
                    "mean": round(counters["hop_sum"] / counters["received"], 3)
                    if counters["received"]
                    else None,
                }
            result.append(entry)
        return {"table_size": engine.cluster.table_size, "classes": result}

    # ------------------------------------------------------------------ the overlay
    def overlay(self, limit: int) -> dict[str, Any]:
        """This broker's virtual nodes: key, membership vector, routing-table entries with their
        levels (seed 003 §3.1-§3.4); at most ``limit`` virtual nodes (``truncated`` says so)."""
        runtime = self.server.runtime
        if runtime is None or runtime.engine.node is None:
            return {
                "broker": self.node_id,
                "peer_id": None,
                "mv_bits": None,
                "vnodes": [],
                "truncated": False,
            }
        node = runtime.engine.node
        mv_bits = node.config.mv_bits
        vnodes = []
        keys = sorted(node.vnodes)
        for key in keys[:limit]:
            vnode = node.vnodes[key]
            table = vnode.table
            vnodes.append(
                {
                    "topic": key[0],
                    "role": "publisher" if key[1] == 0 else "subscriber",
                    "peer": key[2],
                    "mv": format(vnode.mv, f"0{mv_bits}b")[::-1],  # digit i = bit i
                    "rendezvous": vnode.rp_present is not None,
                    "entries": [
                        {
                            "topic": entry[0],
                            "role": "publisher" if entry[1] == 0 else "subscriber",
                            "peer": entry[2],
                            "level": table.level_of(entry),
                        }
                        for entry in table
                    ],
                }
            )
        return {
            "broker": self.node_id,
            "peer_id": node.peer_id,
            "mv_bits": mv_bits,
            "table_size": node.config.table_size,
            "vnodes": vnodes,
            "truncated": len(keys) > limit,
        }

    # ------------------------------------------------------------------ actions
    def kick(self, client_id: str, discard_session: bool) -> dict[str, Any] | None:
        """Disconnect ``client_id`` here (MQTT 5: DISCONNECT 0x98 Administrative action; its will
        is published), and with ``discard_session`` end its session (subscriptions and queued
        messages go). None when this broker has no session of that id."""
        broker = self.broker
        session = broker.sessions.get(client_id)
        if session is None:
            return None
        was_connected = session.connection is not None
        if was_connected:
            broker.kick(client_id, ReasonCode.ADMINISTRATIVE_ACTION)
        ended = False
        session = broker.sessions.get(client_id)
        if discard_session and session is not None and session.connection is None:
            broker.registry.end(session)
            ended = True
        elif discard_session and session is None:
            ended = True
        broker.after_batch()
        broker.log_event(20, "admin_kick", client_id=client_id, connected=was_connected, session_ended=ended)
        return {
            "broker": self.node_id,
            "client_id": client_id,
            "was_connected": was_connected,
            "session_ended": ended,
        }

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool, properties: dict[str, Any]) -> bool:
        """Publish as the broker (no client id): routed here, forwarded by the cluster, retained
        when asked; True when a local subscription matched."""
        broker = self.broker
        message = Message(topic, payload, qos, retain, properties, None, broker.node_id, None)
        result = broker.router.publish(message, None)
        broker.after_batch()
        return result.matched
