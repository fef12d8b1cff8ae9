"""OverlayNode: one physical node (broker) of SG-TBPS with Flexible Routing Tables (seed 003 §3).

Implements ``overlay.api.OverlayCore`` (sans-I/O: events and ``now`` in, actions out; the only
randomness is the ``rng`` passed in). A physical node holds many virtual nodes keyed
``(topic, role, peer_id)`` (§3.2), each with its own routing table (``overlay.table``):

* join (§3.5.2): greedy SEARCH for the insertion position, both level-0 neighbours become
  sticky entries, REXP(level 0) to both; after ``eexp_delay_s`` an EEXP to the topic's
  subscriber range, later random-walk EEXPs while the table holds fewer than L entries;
* leave (§3.5.3): a subscriber sends UNSUB by range multicast to the publisher range; every
  virtual node unlinks with LEAVE to its level-0 neighbours;
* publish (§3.5.4): PUB by range multicast (``overlay.multicast``) to the subscriber range, plus
  an EEXP to that range while the table is short of entries;
* periodic (§3.5.5): REXP(level 0) to both level-0 neighbours every ``rexp_interval_s``;
* receipt (§3.5.6): NEW when absent from the existing-entry list, REXP level rule, EEXP
  decrement, UNSUB removal, learning of sender and forwarder (never UNSUB's sender);
* rendezvous point (§3.2): the publisher whose right level-0 neighbour is not a publisher of
  its topic watches that neighbour; when subscriber presence changes it multicasts PRESENCE
  to the publisher range, yielding ``api.SubscriberPresence`` at every publisher;
* formation (``overlay.formation``, SkipMQ's decision): a seed (a peer listed in its own
  contacts) with no virtual node probes every contact each ``formation_round_s``, joins any
  overlay that answers, and founds one as the lowest reachable seed; a seed alone in its overlay
  keeps probing and yields to another overlay (lonely-split repair);
* crashes: peers hosting level-0 neighbours are probed (PING) and declared dead after
  ``failure_timeout_s`` of silence; PUB/UNSUB delegations are acknowledged per hop and
  re-delegated on timeout or GONE; subscribers drop duplicate publications.

Everything the paper leaves open is decided in docs/overlay.md.

The class is split by concern into a chain of bases, one module each, every method a direct method
of ``OverlayNode`` (no call layer added on the per-message path; a compiled build,
bench/compiled_core.py, calls them natively):

* ``overlay.node_state``: the virtual node, pending join and publish task records, timer kinds;
* ``overlay.node_base``: the state every query shares, sending, learning and the level-0 rules,
  the range-multicast steps (PUB, UNSUB, PRESENCE, EEXP) and the rendezvous point;
* ``overlay.node_publish``: publish, PUB, end-to-end DONE, UNSUB, per-hop ACK;
* ``overlay.node_join``: bootstrap, formation, search, join, position check, leave, NEW;
* ``overlay.node_maintenance``: REXP / EEXP / LINK, periodic refresh, liveness (PING, GONE,
  ACK timeout), repair and the timers;
* this module: the driver interface (``handle``, ``receive``), inspection and the message
  dispatch.

Each base only calls methods of itself or of the bases below it (state < base < publish < join <
maintenance < node).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from overlay import messages as m
from overlay.api import (
    Action,
    Bootstrap,
    Event,
    JoinTopic,
    LeaveTopic,
    PeerId,
    PeerUnreachable,
    Publish,
    Receive,
    Shutdown,
    Tick,
)
from overlay.config import OverlayConfig
from overlay.keys import ANCHOR_TOPIC, PUBLISHER, SUBSCRIBER, Key, make_key, run_bounds
from overlay.node_maintenance import MaintenanceQueries
from overlay.node_state import PendingJoin, PublishTask, VirtualNode, check_topic
from overlay.table import RoutingTable

__all__ = ["OverlayNode", "PendingJoin", "PublishTask", "VirtualNode"]


class OverlayNode(MaintenanceQueries):
    """A physical node; see the module docstring and docs/overlay.md."""

    def __init__(self, peer_id: PeerId, *, rng: random.Random, config: OverlayConfig) -> None:
        super().__init__(peer_id, rng=rng, config=config)
        # the other kinds (NEW, EEXP, REXP, SEARCH, LINK) are called directly: _handle_message
        self._dispatch: dict[type, Callable[[PeerId, Any], None]] = {
            m.PUB: self._on_pub,
            m.UNSUB: self._on_unsub,
            m.FOUND: self._on_found,
            m.SEARCH_FAIL: self._on_search_fail,
            m.LEAVE: self._on_leave,
            m.PRESENCE: self._on_presence,
            m.PRESENCE_QUERY: self._on_presence_query,
            m.PING: self._on_ping,
            m.PONG: self._on_pong,
            m.GONE: self._on_gone,
            m.ACK: self._on_ack,
            m.DONE: self._on_done,
        }

    # ================================================================ driver interface

    def handle(self, event: Event, now: float) -> list[Action]:
        if isinstance(event, Receive):
            return self.receive(event.sender, event.message, now)
        self.now = now
        out: list[Action] = []
        self._out = out
        if isinstance(event, Tick):
            self._tick()
        elif isinstance(event, Publish):
            check_topic(event.topic)
            self._publish(event)
        elif isinstance(event, JoinTopic):
            check_topic(event.topic)
            if self.bootstrapped:
                self._join(event.topic, int(event.role))
            else:
                self.deferred.append(event)
        elif isinstance(event, LeaveTopic):
            if self.bootstrapped:
                self._leave(make_key(event.topic, int(event.role), self.peer_id))
            else:
                self.deferred.append(event)
        elif isinstance(event, Bootstrap):
            self._bootstrap(event.contacts)
        elif isinstance(event, PeerUnreachable):
            self._declare_dead(event.peer)
        elif isinstance(event, Shutdown):
            self.deferred.clear()
            for key in list(self.pending):
                self._leave(key)
            for key in sorted(self.vnodes, key=lambda k: k[0] == ANCHOR_TOPIC):
                self._leave(key)
            for task, _ in list(self.done_slots.values()):  # nobody will wait for the rest
                self._fail_task(task)
        else:
            raise TypeError(f"unknown overlay event {event!r}")
        self._drain_local()
        return out

    def receive(self, sender: PeerId, message: Any, now: float) -> list[Action]:
        """``handle(Receive(sender, message), now)`` without building the event: the simulator's
        path for the tens of millions of messages of a large sweep."""
        self.now = now
        out: list[Action] = []
        self._out = out
        self._receive(sender, message)
        self._drain_local()
        return out

    def next_deadline(self) -> float | None:
        return self.timers[0][0] if self.timers else None

    # ========================================================== inspection (read-only)

    def virtual_keys(self) -> list[Key]:
        """Keys of the joined virtual nodes of this peer, sorted."""
        return sorted(self.vnodes)

    def level0_neighbors(self, key: Key) -> tuple[Key | None, Key | None]:
        table = self.vnodes[key].table
        return table.left0(), table.right0()

    def table_entries(self, key: Key) -> list[Key]:
        return list(self.vnodes[key].table.keys)

    def sticky_entries(self, key: Key) -> list[Key]:
        return self.vnodes[key].table.sticky_keys()

    def membership_vector(self, key: Key) -> int:
        return self.vnodes[key].mv

    def entry_level(self, key: Key, entry: Key) -> int:
        """Level (common-prefix length of membership vectors) of ``entry`` in ``key``'s table."""
        return self.vnodes[key].table.level_of(entry)

    def table_of(self, key: Key) -> RoutingTable:
        """The live table object (treat as read-only)."""
        return self.vnodes[key].table

    def is_rendezvous(self, key: Key) -> bool:
        return self.vnodes[key].rp_present is not None

    def subscriber_presence(self, topic: str) -> bool | None:
        """The last presence this peer's publisher of ``topic`` was told (None: not yet)."""
        return self.presence.get(topic)

    def reaches_only_self(self, topic: str, now: float) -> bool:
        """Whether a PUB of ``topic`` from this peer would reach no other peer's subscriber: this
        peer's publisher and subscriber of ``topic`` are joined, neither's table holds another
        peer's subscriber of ``topic`` (so the range multicast of §3.5.4 ends at our own
        subscriber, and its DONE is immediate), and neither is on probation after a level-0
        neighbour moved away (subscribers may be hidden there, ``_settle_task``). Only events
        (``handle``) make it turn False; the passing of time only ends a probation."""
        me = self.peer_id
        pub = self.vnodes.get((topic, PUBLISHER, me))
        sub = self.vnodes.get((topic, SUBSCRIBER, me))
        if pub is None or sub is None:
            return False
        lo, hi = run_bounds(topic, SUBSCRIBER)
        for vnode in (pub, sub):
            if now < vnode.loose_left_until or now < vnode.loose_right_until:
                return False
            for key in vnode.table.keys_between(lo, hi):
                if key[2] != me:
                    return False
        return True

    def joining_keys(self) -> list[Key]:
        return sorted(self.pending)

    # ================================================================ message dispatch

    def _drain_local(self) -> None:
        local = self._local
        while local:
            self._handle_message(self.peer_id, local.popleft())

    def _receive(self, sender: PeerId, message: Any) -> None:
        if self.unheard:
            self.unheard.discard(sender)
        if sender in self.last_heard:
            self.last_heard[sender] = self.now
            self.probes.pop(sender, None)
        recent = self.recent_peers
        if sender not in recent:
            recent[sender] = None
            if len(recent) > 32:
                del recent[next(iter(recent))]
        if sender in self.dead:
            del self.dead[sender]
            self._exhume(sender)
        self._handle_message(sender, message)

    def _handle_message(self, sender: PeerId, message: Any) -> None:
        # the kinds that make up nearly all of the traffic (NEW, EEXP and REXP at join, SEARCH,
        # LINK) are called directly, which a compiled build (bench/compiled_core.py) turns into
        # native calls; the others through the table
        kind = type(message)
        if kind is m.NEW:
            self._on_new(sender, message)
        elif kind is m.EEXP:
            self._on_eexp(sender, message)
        elif kind is m.REXP:
            self._on_rexp(sender, message)
        elif kind is m.SEARCH:
            self._on_search(sender, message)
        elif kind is m.LINK:
            self._on_link(sender, message)
        else:
            handler = self._dispatch.get(kind)
            if handler is None:
                raise TypeError(f"not an overlay message: {message!r}")
            handler(sender, message)
