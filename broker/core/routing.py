"""Routing: from an accepted PUBLISH to every matching local subscription (MQTT §3.3, §4.7, §4.8).

The hot path is ``publish -> route -> _deliver_to``: one trie lookup (cached per topic), one
encoded PUBLISH per distinct (protocol family, retain) reused for every QoS 0 subscriber, plain
int counters, no per-message tasks, logging or Prometheus calls. Overlapping subscriptions of
one client give it one copy at the highest QoS with every subscription identifier (MQTT 5
§3.3.4); ``no_local`` skips the publisher (§3.8.3.1); retained messages are kept per topic
(§3.3.1.3); a shared subscription group (``$share/g/f``, §4.8.2) gets one copy, round robin over
its connected members (queued for a persistent member when none is connected); in a cluster only
the broker the cluster names for a group delivers its copy (``ClusterPort.owns_share_group``).

:meth:`Router.publish` returns a :class:`PublishResult` - whether a local subscription matched
and what the cluster wants the publisher's acknowledgement to wait for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from broker.core.drops import ACL_DENIED
from broker.core.ports import MATCHED, UNMATCHED, NullCluster, PublishResult
from broker.core.reserved import is_broker_only_topic
from broker.core.session import STATE_QUEUED, Message, OutEntry, Session, SubOptions
from broker.mqtt.retained import RetainedIndex

if TYPE_CHECKING:
    from broker.core.durability import Durability
    from broker.core.outbound import Outbound
    from broker.core.ports import AclPort, ClusterPort, Scheduler
    from broker.core.stats import BrokerStats
    from broker.core.subscriptions import Subscriptions
    from broker.mqtt.packets import Will

_NO_IDS: list[int] = []
PLAN_CACHE_SIZE = 4096  # topics whose delivery plan is kept (all dropped when full)


class Router:
    """Delivers accepted messages to local subscriptions and keeps the retained messages."""

    __slots__ = (
        "_cluster",
        "_durability",
        "_outbound",
        "_plans",
        "_scheduler",
        "_share_rr",
        "_standalone",
        "_subscriptions",
        "acl",
        "node_id",
        "retained",
        "sessions",
        "stats",
    )

    def __init__(
        self,
        *,
        node_id: str,
        sessions: dict[str, Session],
        subscriptions: Subscriptions,
        retained: RetainedIndex[Message],
        outbound: Outbound,
        durability: Durability,
        cluster: ClusterPort,
        acl: AclPort | None,
        stats: BrokerStats,
        scheduler: Scheduler,
    ) -> None:
        self.node_id = node_id
        self.sessions = sessions
        self._subscriptions = subscriptions
        self.retained = retained
        self._outbound = outbound
        self._durability = durability
        self._cluster = cluster
        # NullCluster itself (not a subclass, which may override on_publish): nothing to call
        self._standalone = type(cluster) is NullCluster
        self.acl = acl
        self.stats = stats
        self._scheduler = scheduler
        self._share_rr: dict[tuple[str, str], int] = {}
        # topic -> (trie version, deliveries): see _plan
        self._plans: dict[str, tuple[int, list[tuple[str, int, bool, list[int]]] | None]] = {}

    # ================================================================== entry points
    def publish(self, message: Message, from_client_id: str | None) -> PublishResult:
        """Accept a message from a local client (or a will, or $SYS): retain, route, tell the cluster."""
        if message.retain:
            self.retain(message)
        matched = self.route(message, from_client_id)
        if self._standalone:  # NullCluster.on_publish: nothing to tell, nothing to wait for
            return MATCHED if matched else UNMATCHED
        wait = self._cluster.on_publish(message, from_client_id)
        if wait is not None:
            return PublishResult(matched, wait)
        return MATCHED if matched else UNMATCHED

    def publish_will(self, session: Session, will: Will) -> None:
        acl = self.acl
        if (
            acl is not None and not acl.can_publish(session.client_id, session.username, will.topic)
        ) or is_broker_only_topic(will.topic):
            self.stats.count_drop("acl_denied")
            return
        props = {k: v for k, v in will.properties.items() if k != "will_delay_interval"}
        expiry_s = props.get("message_expiry_interval")
        expiry_at = self._scheduler.wall_time() + expiry_s if expiry_s is not None else None
        message = Message(
            will.topic, will.payload, will.qos, will.retain, props, expiry_at, self.node_id, session.client_id
        )
        self.stats.messages_received[will.qos] += 1
        self.publish(message, session.client_id)

    def deliver_remote(
        self,
        message: Message,
        accept_filter: Callable[[str], bool] | None = None,
        only_client: str | None = None,
        except_clients: Collection[str] = (),
        memo: dict[str, list[Any]] | None = None,
    ) -> bool:
        """Deliver a message accepted by another broker to local subscribers (no re-forwarding);
        ``accept_filter(match_filter)`` restricts it to the subscriptions whose filter it accepts,
        ``only_client`` to one client's (a session that moved here catching up), and
        ``except_clients`` leaves those clients out (their copy waits for a catch-up).

        ``memo``: topic -> its matching subscriptions, kept by the caller for the messages of one
        batch that share ``accept_filter`` and no ``only_client`` / ``except_clients`` (the
        subscriptions do not change while a batch is delivered): a batch of one stream is usually
        many messages of one topic (issue #11)."""
        return self.route(message, message.publisher_id, accept_filter, only_client, except_clients, memo)

    def retain(self, message: Message) -> None:
        """Store (or, with an empty payload, delete) the retained message of its topic."""
        topic = message.topic
        if not message.payload:
            if self.retained.delete(topic):
                self._durability.delete_retained(topic)
        else:
            self.retained.set(topic, message)
            self._durability.set_retained(message)

    # ================================================================== matching
    def route(
        self,
        message: Message,
        publisher: str | None,
        accept_filter: Callable[[str], bool] | None = None,
        only_client: str | None = None,
        except_clients: Collection[str] = (),
        memo: dict[str, list[Any]] | None = None,
    ) -> bool:
        """Deliver to every matching subscription; True when some subscriber matched (even if its
        copy was then dropped: queue full, ACL, too large, expired, slow consumer)."""
        if memo is None and accept_filter is None and only_client is None and not except_clients:
            plan = self._plans.get(message.topic)
            trie = self._subscriptions.trie
            if plan is None or plan[0] != trie.version:
                plan = self._plan(message.topic, trie.version)
            planned = plan[1]
            if planned is not None:  # the hot path, inlined here (one Python call less a message)
                encoded: dict[Any, bytes] = {}
                deliver = self._deliver_to
                for client_id, qos, rap, sids in planned:
                    deliver(client_id, message, qos, rap, sids, encoded)
                if self._subscriptions.shared_trie.count and self._route_shared(message, encoded, None):
                    return True
                if not planned and not message.topic.startswith("$SYS/"):
                    self.stats.count_drop("no_subscribers")
                return bool(planned)
        matches = memo.get(message.topic) if memo is not None else None
        if matches is None:
            matches = self._subscriptions.trie.match(message.topic)
            if accept_filter is not None and matches:
                matches = [match for match in matches if accept_filter(match[0])]
            if only_client is not None:
                matches = [match for match in matches if match[1] == only_client]
            if except_clients and matches:
                matches = [match for match in matches if match[1] not in except_clients]
            if memo is not None:
                memo[message.topic] = matches
        matched = False
        cache: dict[Any, bytes] = {}
        if matches:
            if len(matches) == 1:
                _flt, client_id, opts = matches[0]
                if not (opts.no_local and client_id == publisher):
                    matched = True
                    sid = opts.subscription_identifier
                    self._deliver_to(
                        client_id,
                        message,
                        opts.qos,
                        opts.retain_as_published,
                        [sid] if sid else _NO_IDS,
                        cache,
                    )
            else:
                per_client: dict[str, list[Any]] = {}
                for _flt, client_id, opts in matches:
                    if opts.no_local and client_id == publisher:
                        continue
                    sid = opts.subscription_identifier
                    current = per_client.get(client_id)
                    if current is None:
                        per_client[client_id] = [opts.qos, [sid] if sid else [], opts.retain_as_published]
                    else:
                        if opts.qos > current[0]:
                            current[0] = opts.qos
                        if sid:
                            current[1].append(sid)
                        current[2] = current[2] or opts.retain_as_published
                matched = bool(per_client)
                for client_id, (qos, sids, rap) in per_client.items():
                    self._deliver_to(client_id, message, qos, rap, sids, cache)
        if (
            only_client is None
            and self._subscriptions.shared_trie.count
            and self._route_shared(message, cache, accept_filter)
        ):
            matched = True
        if not matched and not message.topic.startswith("$SYS/"):
            self.stats.count_drop("no_subscribers")
        return matched

    def _plan(self, topic: str, version: int) -> tuple[int, list[tuple[str, int, bool, list[int]]] | None]:
        """The deliveries of a local publish to ``topic`` (one per client: the highest QoS, every
        subscription identifier, retain-as-published if any), kept until the trie changes; None
        when a matching subscription has no_local (the publisher decides then)."""
        per_client: dict[str, list[Any]] = {}
        plan: list[tuple[str, int, bool, list[int]]] | None = []
        for _flt, client_id, opts in self._subscriptions.trie.match(topic):
            if opts.no_local:
                plan = None
                break
            sid = opts.subscription_identifier
            current = per_client.get(client_id)
            if current is None:
                per_client[client_id] = [opts.qos, [sid] if sid else _NO_IDS, opts.retain_as_published]
            else:
                if opts.qos > current[0]:
                    current[0] = opts.qos
                if sid:
                    current[1] = [*current[1], sid]
                current[2] = current[2] or opts.retain_as_published
        if plan is not None:
            plan = [(client_id, qos, rap, sids) for client_id, (qos, sids, rap) in per_client.items()]
        plans = self._plans
        if len(plans) >= PLAN_CACHE_SIZE:
            plans.clear()
        entry = plans[topic] = (version, plan)
        return entry

    def _route_shared(
        self, message: Message, cache: dict[Any, bytes], accept_filter: Callable[[str], bool] | None
    ) -> bool:
        """One delivery per matching share group this broker owns; False when no shared
        subscription matched."""
        groups: dict[tuple[str, str], list[tuple[str, SubOptions]]] = {}
        for flt, (group, client_id), opts in self._subscriptions.shared_trie.match(message.topic):
            if accept_filter is not None and not accept_filter(flt):
                continue
            groups.setdefault((group, flt), []).append((client_id, opts))
        if not groups:
            return False
        owns = self._cluster.owns_share_group
        for key, members in groups.items():
            if owns(key[0], key[1]):
                self._deliver_to_group(key, members, message, cache)
        return True

    def _deliver_to_group(
        self,
        key: tuple[str, str],
        members: list[tuple[str, SubOptions]],
        message: Message,
        cache: dict[Any, bytes],
    ) -> int:
        """Deliver to one member of share group ``key`` = (group, filter): round robin over the
        connected members; if all are offline, QoS>0 is queued for one persistent member."""
        sessions = self.sessions
        members.sort(key=lambda member: member[0])
        count = len(members)
        start = self._share_rr.get(key, 0) % count
        chosen: tuple[str, SubOptions] | None = None
        for step in range(count):
            index = (start + step) % count
            session = sessions.get(members[index][0])
            if session is not None and session.connection is not None:
                chosen = members[index]
                self._share_rr[key] = index + 1
                break
        if chosen is None and message.qos > 0:
            # every member offline: queue for one persistent member (round robin)
            for step in range(count):
                index = (start + step) % count
                session = sessions.get(members[index][0])
                if session is not None and session.expiry_interval_s > 0:
                    chosen = members[index]
                    self._share_rr[key] = index + 1
                    break
        if chosen is None:  # no member connected (QoS 0) / none connected or persistent (QoS>0)
            self.stats.count_drop("no_subscribers")
            return 0
        client_id, opts = chosen
        sid = opts.subscription_identifier
        return self._deliver_to(
            client_id, message, opts.qos, opts.retain_as_published, [sid] if sid else _NO_IDS, cache, key
        )

    def redistribute_shared(self, entries: list[OutEntry]) -> None:
        """Messages a leaving member of a share group had not completed go to another member of
        the group (MQTT 5 §4.8.2: "the Server SHOULD send the Application Message to another
        Client that is subscribed to the same Shared Subscription")."""
        for entry in entries:
            key = entry.share_key
            assert key is not None
            message = entry.message
            members = self._subscriptions.share_group_members(message.topic, key[0], key[1])
            if members:
                self._deliver_to_group(key, members, message, {})
            else:
                self.stats.count_drop("no_subscribers")

    @staticmethod
    def shared_leftovers(session: Session) -> list[OutEntry]:
        """A session ends: its share-group messages another member should get. QoS 1 in flight and
        anything still queued go; a QoS 2 message whose delivery started MUST NOT be sent to any
        other member (MQTT-4.8.2-5)."""
        return [
            entry
            for entry in session.pending_entries()
            if entry.share_key is not None and (entry.qos == 1 or entry.state == STATE_QUEUED)
        ]

    def _deliver_to(
        self,
        client_id: str,
        message: Message,
        sub_qos: int,
        retain_as_published: bool,
        sub_ids: list[int],
        cache: dict[Any, bytes],
        share_key: tuple[str, str] | None = None,
    ) -> int:
        session = self.sessions.get(client_id)
        if session is None:
            return 0
        acl = self.acl
        if acl is not None and not acl.can_receive(client_id, session.username, message.topic):
            self._outbound.drops.dropped(client_id, ACL_DENIED)
            return 0
        qos = message.qos if message.qos < sub_qos else sub_qos
        retain = message.retain and retain_as_published
        if qos:
            return self._outbound.enqueue(
                session, OutEntry(message, qos, retain, sub_ids, share_key=share_key)
            )
        return self._outbound.send_qos0(session, message, retain, sub_ids, cache)

    def withhold_unreadable(self, session: Session) -> int:
        """Before a session resumes: drop the queued messages its user may not read (the ACL
        changed since they were queued, or the session was handed over from another broker);
        every delivery is checked against the receiving user's read ACL. Returns the count."""
        acl = self.acl
        if acl is None or not session.queue:
            return 0
        client_id, username = session.client_id, session.username
        kept = []
        denied = 0
        for entry in session.queue:
            if acl.can_receive(client_id, username, entry.message.topic):
                kept.append(entry)
            else:
                denied += 1
                self._durability.ack(session, entry)  # gone from the store too
        if denied:
            session.set_queue(kept)
            self._outbound.drops.dropped(client_id, ACL_DENIED, denied)
        return denied

    # ================================================================== retained on subscribe
    def deliver_retained(self, session: Session, retained: list[tuple[SubOptions, Message]]) -> None:
        """Send retained messages to one new subscription (retain flag set, MQTT-3.3.1-8)."""
        now = self._scheduler.wall_time()
        outbound = self._outbound
        for opts, message in retained:
            if message.expiry_at is not None and message.expiry_at <= now:
                self.retained.delete(message.topic)
                self._durability.delete_retained(message.topic)
                continue
            acl = self.acl
            if acl is not None and not acl.can_receive(session.client_id, session.username, message.topic):
                outbound.drops.dropped(session.client_id, ACL_DENIED)
                continue
            sid = opts.subscription_identifier
            sub_ids = [sid] if sid else _NO_IDS
            qos = min(message.qos, opts.qos)
            if qos:
                outbound.enqueue(session, OutEntry(message, qos, True, sub_ids))
            elif session.connection is not None:
                data = outbound.encode_for(session, message, 0, True, False, None, sub_ids)
                if data is not None:
                    session.connection.write(data)
                    self.stats.messages_sent[0] += 1
