"""The cluster engine's glue of interest announcements and subscribe waits (SIONet filter
propagation, seed 000; docs/cluster.md).

:class:`InterestGlue` is the part of ``broker.cluster.engine.ClusterEngine`` that carries out the
pure cores ``interest`` (which classes this broker subscribes: overlay joins and leaves),
``interest_table`` / ``InterestAnnouncer`` (which classes the others subscribe; our announcements,
repeated until acknowledged) and ``subscribe_waits`` (SUBACKs held until their classes are joined).
It holds no state of its own.
"""

from __future__ import annotations

from typing import Any

from broker.cluster.engine_origin import OriginGlue
from broker.cluster.interest import SHARE_PREFIX
from broker.cluster.messages import ClassInterest
from overlay import api
from overlay.api import Role
from overlay.keys import SUBSCRIBER, make_key


class InterestGlue(OriginGlue):
    """See the module docstring."""

    def _apply_interest(self, changes: list[Any]) -> None:
        if not changes or self.node is None or self.stopped:
            return  # before start: start() joins every counted topic
        subscribed: list[str] = []
        unsubscribed: list[str] = []
        for change in changes:
            event = api.JoinTopic if change.joined else api.LeaveTopic
            self._handle(event(change.topic, Role.SUBSCRIBER))
            if not change.topic.startswith(SHARE_PREFIX):
                (subscribed if change.joined else unsubscribed).append(change.topic)
            if not change.joined:
                # no subscriber of the class here any more: its senders stop keeping messages for us
                for positions in self.receiver.leave_class(change.topic):
                    self._send_stream(positions.peer, positions.ack)
                self._persist_positions()
        if subscribed or unsubscribed:
            self._announce_interest(ClassInterest(tuple(subscribed), tuple(unsubscribed)))
        self._arm_timer()

    def _known_peers(self) -> set[str]:
        transport = self.transport
        peers = set(self._heard_from) | set(self._down_peers)
        if transport is not None:
            peers |= transport.connected_peers()
        peers.discard(self.peer_id)
        return peers

    def _announce_interest(self, interest: ClassInterest) -> None:
        """Tell every broker we know which classes we (no longer) subscribe (filter propagation);
        repeated to each reachable one until it acknowledges (``InterestAnnouncer``). A peer reported
        down gets the whole list when it is back."""
        peers = sorted(self._known_peers())
        interest = self.announcer.stamp(interest)  # one version, whoever gets it
        for peer in peers:
            if peer in self._down_peers:
                self._send_envelope(peer, "", 0, interest)
        reachable = [peer for peer in peers if peer not in self._down_peers]
        for peer, ref, body in self.announcer.announce(interest, reachable, self._now()):
            self._send_envelope(peer, "", ref, body)

    def _on_interest(self, peer: str, interest: ClassInterest) -> None:
        sender = self.sender
        assert sender is not None
        if self.interest_table.stale(peer, interest):
            return  # older than a whole list applied (InterestTable): overtaken, changes nothing
        added, removed = self.interest_table.apply(peer, interest)
        now = self._now()
        # a whole list (a broker that comes back, or that a session moved to) registers every
        # class it names, that later news did not drop, from the log's start: a registration
        # still unconfirmed is lowered to it
        if interest.full:
            added = sorted(set(interest.subscribed) & self.interest_table.classes_of(peer))
        for cls in added:
            self._sender_actions(sender.register(peer, cls, now, from_log_start=interest.full))
        for cls in removed:
            self._sender_actions(sender.unregister(peer, cls, now))

    def _topic_ready(self, topic: str) -> bool:
        node = self.node
        if node is None:
            return True
        key = make_key(topic, SUBSCRIBER, self.peer_id)
        return key in node.vnodes and key not in node.pending

    def _finish_ready_waits(self, finished: list[tuple[int, bool]]) -> None:
        for wait_id, ready in finished:
            if not ready:
                self.stats.subscribe_waits_timed_out += 1
            completion = self._ready_waits.pop(wait_id, None)
            if completion is not None:
                self.scheduler.call_soon(completion.set_result, ready)
