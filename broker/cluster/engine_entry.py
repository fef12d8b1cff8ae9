"""The cluster engine's entry points: the ``ClusterPort`` methods the broker core calls
(``broker.core.ports``; docs/cluster.md).

:class:`EngineEntryPoints` is the part of ``broker.cluster.engine.ClusterEngine`` that the core
calls: subscriptions (``on_subscribe``, ``subscriptions_ready``, ``owns_share_group``), publishing
(``on_publish`` with the fast path, issue #11: a class's cached reach, ``QUIET_*``; the routes
``ROUTE_*``; causal groups) and connections (``before_attach``, ``on_client_connected``). It holds
no state of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.cluster.classes import topic_classes
from broker.cluster.engine_base import (
    QUIET_LOCAL,
    QUIET_LOCAL_CONNECTED,
    QUIET_NOBODY,
    QUIET_NOBODY_ALONE,
    QUIET_NOT,
    QUIET_RECHECK_S,
    ROUTE_DIRECT,
    ROUTE_HELD,
    ROUTE_OVERLAY,
    ROUTE_SKIP,
    TOPIC_CACHE_LIMIT,
    _local_only,
)
from broker.cluster.engine_receiving import EngineReceiving
from broker.cluster.interest import share_topic
from broker.cluster.messages import StreamPosition
from broker.core.ports import Completion
from overlay.keys import SUBSCRIBER, make_key

if TYPE_CHECKING:
    from broker.core.session import Message, SessionSnapshot


class EngineEntryPoints(EngineReceiving):
    """See the module docstring."""

    def class_of(self, topic_filter: str) -> str:
        return self.interest.class_of(topic_filter)

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        if _local_only(topic_filter):
            return
        self._apply_interest(self.interest.subscribe(client_id, topic_filter, share_group))
        self._note_subscribed(client_id, topic_filter, share_group)

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        if _local_only(topic_filter):
            return
        if share_group is None and self._continued_by_import(client_id, topic_filter):
            return
        self._apply_interest(self.interest.unsubscribe(client_id, topic_filter, share_group))
        self._subscribed_at.get(client_id, {}).pop(topic_filter, None)

    def subscriptions_ready(
        self, topic_filters: list[tuple[str, str | None]], client_id: str | None = None
    ) -> Completion[bool] | None:
        """A completion done once the classes of ``topic_filters`` ((filter, share group) pairs)
        are joined in the overlay (at most ``cluster.subscribe_wait_ms``), or None when they are."""
        if self.stopped or self.node is None:
            return None
        topics = set()
        for topic_filter, group in topic_filters:
            if _local_only(topic_filter):
                continue
            topics.add(self.interest.class_of(topic_filter))
            if group is not None:
                topics.add(share_topic(group, topic_filter))
        pending = [topic for topic in sorted(topics) if not self._topic_ready(topic)]
        if not pending:
            return None
        wait_id = self.subscribe_waits.add(pending, self._now())
        completion: Completion[bool] = Completion()
        self._ready_waits[wait_id] = completion
        self._arm_timer()
        return completion

    def owns_share_group(self, group: str, topic_filter: str) -> bool:
        """The head of the group's level-0 run delivers (one delivery per group per cluster)."""
        node = self.node
        if node is None or self.stopped:
            return True
        key = make_key(share_topic(group, topic_filter), SUBSCRIBER, self.peer_id)
        if key not in node.vnodes:
            return True  # still joining: deliver rather than risk losing the message
        left, _right = node.level0_neighbors(key)
        return left is None or left[0] != key[0] or left[1] != key[1]

    def on_publish(self, message: Message, from_client_id: str | None) -> Completion[bool] | None:
        """Forward ``message`` on each of its classes; the PUBACK waits only for the local commit
        (the send log joins it), never for other brokers."""
        if self.stopped or self.node is None or message.topic.startswith("$SYS"):
            return None
        sender = self.sender
        assert sender is not None
        now = self._now()
        topic = message.topic
        classes = self._classes_of.get(topic)
        if classes is None:
            if len(self._classes_of) >= TOPIC_CACHE_LIMIT:
                self._classes_of.clear()
            classes = self._classes_of[topic] = topic_classes(topic, self.interest.class_levels)
        self.class_counters.published(classes[0])
        causal = self.causal
        groups = causal.groups_of(topic) if causal is not None else ()
        if groups:
            self._publish_causal(message, classes, groups, now)
            slow = True
        else:
            slow = message.retain
            deadline = sender.next_deadline()
            quiet = self._quiet
            for cls in classes:
                state = quiet.get(cls)
                if state is not None and now < state[0]:
                    if state[1] == QUIET_NOBODY_ALONE:
                        continue
                    if state[1] == QUIET_NOBODY:  # kept for the presence grace only
                        sender.skip(cls, message, now)
                        continue
                    if state[1] == QUIET_LOCAL_CONNECTED:
                        # nobody elsewhere, every known broker connected: the local deliveries are
                        # all; QoS >= 1 is kept in the send log in memory (a partition we have not
                        # noticed yet heals: ``logged_for``), not written to the store - the PUBACK
                        # needs no commit, as on a single broker (docs/cluster.md "Fast path")
                        if message.qos:
                            sender.present(cls, now)
                            self._forward(cls, message, overlay=False, stored=False)
                        continue
                    if state[1] == QUIET_LOCAL:
                        # nobody elsewhere that we can hear: QoS >= 1 goes into the durable send
                        # log (its commit holds the PUBACK), for a receiver broker cut off before
                        # we learned of it that is back after a crash of ours
                        if message.qos:
                            sender.present(cls, now)
                            self._forward(cls, message, overlay=False)
                        continue
                    self._send_on_class(cls, message, self._route_of(cls, message, now), now)
                    slow = True
                    continue
                slow = True
                route = self._route_of(cls, message, now)
                self._send_on_class(cls, message, route, now)
                if route == ROUTE_OVERLAY:
                    if not self._reaches_only_self(cls, now):
                        reach = QUIET_NOT
                    elif self._alone():
                        # only our own subscribers, and no other broker ever talked to us: none
                        # can have a SUBACK for this class yet (``_alone``), so there is nothing
                        # to keep for anybody - a one-broker cluster's QoS 1 costs what a single
                        # broker's does (issue #11)
                        reach = QUIET_NOBODY_ALONE
                    elif self.cluster.local_qos1_in_memory and self._every_peer_connected():
                        reach = QUIET_LOCAL_CONNECTED
                    else:
                        reach = QUIET_LOCAL
                    quiet[cls] = (now + QUIET_RECHECK_S, reach)
                elif route == ROUTE_SKIP and not sender.recently_present(cls, now):
                    # (not recently present: a QoS >= 1 message would be held, ``_route_of``)
                    nobody = QUIET_NOBODY_ALONE if self._alone() else QUIET_NOBODY
                    quiet[cls] = (now + QUIET_RECHECK_S, nobody)
            slow = slow or sender.next_deadline() != deadline
        if message.retain:
            self._publish_retained(message)
        if slow and not self._outbox_armed:
            # (a flush of the outbox is scheduled - the forwarded messages of this event-loop
            # iteration - and arms the timer after it: once per batch instead of per message)
            self._arm_timer()
        return None

    def _reaches_only_self(self, cls: str, now: float) -> bool:
        """A publication on ``cls`` reaches no other broker: the overlay knows no other broker's
        subscriber of it (``OverlayNode.reaches_only_self``) and no broker announced it or
        receives our stream of it (``StreamSender.has_receivers``)."""
        node = self.node
        sender = self.sender
        assert node is not None and sender is not None
        return node.reaches_only_self(cls, now) and not sender.has_receivers(cls)

    def _alone(self) -> bool:
        """This broker founded its overlay without contacts and no other broker ever talked to it
        (or was reported down): any broker that joins later reaches us first - its first message
        empties the cache - so no subscription elsewhere can have its SUBACK before that, and a
        class nobody subscribes needs no presence-grace copies (the copies on every publish were
        most of a one-broker cluster's QoS 0 overhead, issue #11)."""
        return self._founded_alone and not self._known_peers()

    def _every_peer_connected(self) -> bool:
        """No broker we know of is reported down, and the transport has a link up to each one we
        have heard from (checked when a class's reach is cached, at most every QUIET_RECHECK_S;
        a peer reported down empties the cache)."""
        if self._down_peers:
            return False
        heard = self._heard_from
        if not heard:
            return True
        transport = self.transport
        assert transport is not None
        connected = transport.connected_peers()
        return all(peer in connected or peer == self.peer_id for peer in heard)

    def _route_of(self, cls: str, message: Message, now: float) -> int:
        """How ``message`` goes out on ``cls`` (one of the ``ROUTE_*``)."""
        node = self.node
        sender = self.sender
        assert node is not None and sender is not None
        self._publishing(cls, now)
        if node.subscriber_presence(cls) is not False:
            sender.present(cls, now)
            return ROUTE_OVERLAY
        if sender.has_receivers(cls):
            # the overlay sees no subscriber, but a receiver that crashed or is cut off still
            # expects the stream: logged, it gets it by resend when it is back
            return ROUTE_DIRECT
        if message.qos and sender.recently_present(cls, now):
            # subscribers a moment ago (one moving or restarting): logged, published when presence
            # returns
            return ROUTE_HELD
        if message.qos and self._may_miss_subscribers(now):
            # a contact we have not heard from since we started (down, or on the other side of a
            # partition) may subscribe it: logged, it gets what the log holds when it talks to us
            return ROUTE_DIRECT
        return ROUTE_SKIP  # nobody subscribes (exhaust data, seed 003 §3.2)

    def _may_miss_subscribers(self, now: float) -> bool:
        """Whether a broker may subscribe a class without this one knowing: a contact it started
        with has not talked to this incarnation yet (for at most ``DOWN_PEER_MEMORY_S``). A broker
        restarted into a partition knows none of the other side's subscriptions (the interest it
        was told of went with the crash): it published to nobody and dropped what it acknowledged
        (seed 955 of ``--faults crash,partition,move --loss 0.05 --finite-clients``)."""
        if not self._unheard_contacts:
            return False
        if now > self._unheard_until:
            self._unheard_contacts.clear()
            return False
        return True

    def _send_on_class(
        self,
        cls: str,
        message: Message,
        route: int,
        now: float,
        deps: tuple[StreamPosition, ...] | None = None,
        copies: tuple[tuple[str, int], ...] = (),
    ) -> None:
        if route == ROUTE_OVERLAY:
            self._forward(cls, message, deps=deps or (), copies=copies)
        elif route == ROUTE_DIRECT:
            self._forward(cls, message, overlay=False, deps=deps or (), copies=copies)
        elif route == ROUTE_HELD:
            self._forward(cls, message, held=True, deps=deps or (), copies=copies)
        else:
            assert self.sender is not None
            self.sender.skip(cls, message, now, deps)

    def _publish_causal(
        self, message: Message, classes: list[str], groups: tuple[int, ...], now: float
    ) -> None:
        """A message of a causal group: every copy carries the group's ACK vector (its
        dependencies) and the SEQ of every copy (``broker.cluster.causal_clock``)."""
        causal = self.causal
        sender = self.sender
        assert causal is not None and sender is not None
        routes = [(cls, self._route_of(cls, message, now)) for cls in classes]
        copies = tuple((cls, sender.position(cls)) for cls, route in routes if route != ROUTE_SKIP)
        deps = causal.stamp(groups)
        for cls, route in routes:
            self._send_on_class(cls, message, route, now, deps, copies)
        if copies:
            causal.sent(groups, sender.origin, copies)

    def _forward_causal(self, cls: str, message: Message, deps: tuple[StreamPosition, ...]) -> None:
        """A message of a causal group kept while ``cls`` had no subscriber goes out now."""
        causal = self.causal
        sender = self.sender
        assert causal is not None and sender is not None
        copies = ((cls, sender.position(cls)),)
        self._forward(cls, message, deps=deps, copies=copies)
        causal.sent(causal.groups_of(message.topic), sender.origin, copies)

    def before_attach(
        self, client_id: str, clean_start: bool, username: str | None = None
    ) -> Completion[SessionSnapshot | None] | None:
        if self.stopped or self.node is None or self.transport is None or self.takeover is None:
            return None
        peers = self.transport.connected_peers()
        wall_ns = int(self.scheduler.wall_time() * 1e9)
        # recorded even with no peer connected: it is repeated to brokers that come back (one of
        # them may hold a stored session of this client)
        claim, waits = self.takeover.claim(
            client_id,
            clean_start,
            peers,
            self._now(),
            wall_ns,
            unreachable=self._down_peers,
            username=username,
        )
        if self.takeover.pending_claim(claim.claim_id) is not None:
            # durable before it leaves: should the session be handed over and this broker go down
            # before it arrives, the restarted broker asks for it again (``Takeover.restore_pending``)
            self.store.set_pending_claim(claim.claim_id, claim)
            self._commit()
        if peers:
            self.stats.claims_sent += 1
            self._publish_control(claim)
        self._arm_timer()
        if not waits:
            return None  # nothing to wait for: the old connection is closed when the claim arrives
        completion: Completion[SessionSnapshot | None] = Completion()
        self._claim_waits[claim.claim_id] = completion
        return completion

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        if self.takeover is not None:
            self.takeover.attached(client_id, session_present)  # (``Takeover.awaits_session_from``)
        if self._now() < self._claim_grace_until:
            self._connected_since_start = self._connected_since_start | {client_id}
        positions = self._moved_positions.pop(client_id, None)
        if positions:
            self._catch_up(client_id, positions, self._moved_catch_up_filters(client_id))
        if self.takeover is not None and self.transport is not None:
            # brokers that came back while the CONNECT waited get its claim now (one may hold the
            # client's older session), repeated until they answer
            unasked = self.takeover.unasked(client_id, self.transport.connected_peers())
            if unasked is not None:
                claim, newcomers = unasked
                for peer in newcomers:
                    self._send_envelope(peer, client_id, claim.claim_id, claim)
                    self.takeover.repeat_to(peer, [claim], self._now())
        if self.takeover is not None and self.takeover.yields(client_id):
            # a newer CONNECT of this client id elsewhere was claimed while ours waited: it wins
            broker = self.broker
            assert broker is not None
            self.scheduler.call_soon(broker.kick, client_id, 0x8E)

    def on_client_disconnected(self, client_id: str) -> None:
        return None  # its claim record is dropped by the sweep once the session is gone
