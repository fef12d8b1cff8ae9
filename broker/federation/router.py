"""One broker's semantic-information router (SI-R) for one event place (seed 000 §3.7).

* Shared links (§3.7.1, §3.7.3): a router requests at most one link per event place (its
  *parent*) and accepts any number (its *children*): an open link topology, a tree, so events
  never loop. A second request while one is held or pending is refused locally; the accepting
  side refuses a requester that is already linked, is itself, is upstream of it (the link would
  close a loop) or names another place - each with a reason. On establishment the acceptor
  returns the place name, routing mode, description and the link topology (root .. acceptor).
* Event paths (§3.7.2, §3.7.4): local subscriptions and neighbours' registrations are sources
  counted per (link, key) in ``EventPaths``; only 0->1 and 1->0 transitions are sent, with a
  TTL (Fig. 16). Registrations carry no origin (anonymity).
* Events flow back along the paths: an event is sent on a link only when that link's neighbour
  registered a key matching it, never on the link it came from (and the tree has no cycle, so
  it never returns to its broker); it is delivered locally when a local key matches.
* Clustered sites (SkipMQ's addition): brokers of one cluster share ``settings.site`` and each
  links on its own. Links name their sites (``LinkRequest.site``, ``LinkAccepted.site``); a
  registration whose sources all lie in the sender's site says so (``Register.own_site``), and
  such a source is not registered toward another broker of that site (event_paths.py), nor is
  an event of a site sent to that site on a key only that site registered: a site's own events
  never go out and back.
* Leave (§3.7.3 (2)-(3)): the leaving router tells its 1-hop neighbours; its children get its
  parent (or, without one, one of its children) as replacement and re-link; nobody else moves.
* Crash (§3.7.3 (4)): each router learns its upstream entities in advance with an n-hop
  discovery event (hop attribute UPSTREAM); when its parent's link is lost it re-links to the
  nearest one still there. After any (re-)link both sides re-register what they hold.
* Custody (custody.py, SkipMQ's addition): QoS >= 1 events are acknowledged hop by hop once
  everything downstream has them, held across a broken link, and re-routed after the re-link;
  a lost link's registrations stay as ghosts meanwhile; durable through store_port.py.

* Retained writes flood the place with ``retained_place`` (retained.py), last writer wins.

Pure: events and ``now`` in, ``Action`` lists out; no I/O, no clock, no randomness.

Size: one class, the SI-R: every handler reads and changes the same links, event paths, ghosts
and custody, and splitting them would pass that state around; the parts with a job of their own
live beside it (event_paths, custody, discovery, retained, keys).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from broker.federation.custody import Custody, Entry
from broker.federation.discovery import Discovery
from broker.federation.event_paths import EventPaths, PathChange
from broker.federation.keys import RoutingMode, TopicView, key_for
from broker.federation.messages import (
    Action,
    Deliver,
    Event,
    EventAck,
    HopAttribute,
    Leave,
    LinkAccepted,
    LinkMessage,
    LinkRefused,
    LinkRequest,
    Note,
    Probe,
    ProbeReply,
    Register,
    Retained,
    Send,
    StoreRetained,
    TopologyUpdate,
    Unlink,
    Unregister,
)
from broker.federation.retained import PlaceRetained
from broker.federation.settings import LinkError, PlaceSettings, RouterStats
from broker.federation.store_port import CustodyStore

__all__ = ["FederationRouter", "LinkError", "PlaceSettings", "RouterStats"]


class FederationRouter:
    """The SI-R of broker ``name`` in one event place; see the module docstring."""

    def __init__(self, name: str, settings: PlaceSettings, *, store: CustodyStore | None = None) -> None:
        self.name = name
        self.settings = settings
        self.parent: str | None = None
        self.children: set[str] = set()
        self.topology: tuple[str, ...] = (name,)  # root .. this router
        self.stats = RouterStats()
        self._paths = EventPaths(settings.site)
        self._received: dict[str, dict[str, int]] = {}  # link -> key -> ttl the neighbour registered
        self._received_tags: dict[str, dict[str, str]] = {}  # link -> key -> its site ("" = unknown)
        self._link_sites: dict[str, str] = {}  # link -> the neighbour's site ("" = none)
        self._local: Counter[tuple[str, int]] = Counter()  # (key, ttl) -> local subscriptions
        self._local_keys: Counter[str] = Counter()
        self._one_way_links: set[str] = set()  # we register nothing toward these
        self._pending: str | None = None
        self._pending_since = 0.0
        self._pending_one_way = False
        self._upstream_target: str | None = None  # the configured upstream, retried when unlinked
        self._candidates: list[str] = []
        self._retry_at = 0.0
        self._discovery = Discovery()
        self._custody = Custody(store=store)
        self.retained = PlaceRetained(name)  # used with settings.retained_place (retained.py)
        self._event_seq = 0
        # lost link -> (its keys with their TTLs, their site tags, until)
        self._ghosts: dict[str, tuple[dict[str, int], dict[str, str], float]] = {}
        self.left = False

    # ================================================================== reading
    @property
    def place(self) -> str:
        return self.settings.place

    def links(self) -> list[str]:
        return ([self.parent] if self.parent else []) + sorted(self.children)

    def counter(self, link: str, key: str) -> int:
        return self._paths.counter(link, key)

    def counters(self) -> dict[str, dict[str, int]]:
        """Per link, per key: how many sources want the key registered toward that link."""
        return self._paths.counters()

    def registered_toward(self, link: str) -> dict[str, int]:
        """What this router registered on ``link`` (key -> TTL), i.e. told that neighbour."""
        if link in self._one_way_links:
            return {}
        return self._paths.registered(link)

    def received_from(self, link: str) -> dict[str, int]:
        """What the neighbour on ``link`` registered here (key -> TTL)."""
        return dict(self._received.get(link, {}))

    def upstream_known(self) -> dict[str, int]:
        return dict(self._discovery.upstream)

    def local_keys(self) -> set[str]:
        return {key for key, count in self._local_keys.items() if count > 0}

    def key_of(self, topic_filter: str, mode: RoutingMode | None = None) -> str:
        return key_for(topic_filter, mode or self.settings.mode, self.settings.class_levels)

    # ================================================================== local subscriptions
    def subscribe(
        self, topic_filter: str, *, mode: RoutingMode | None = None, ttl: int | None = None
    ) -> list[Action]:
        """A local subscription to ``topic_filter`` appeared (one more source of its key)."""
        key = self.key_of(topic_filter, mode)
        hops = self.settings.ttl if ttl is None else ttl
        self._local[(key, hops)] += 1
        self._local_keys[key] += 1
        return self._changes(self._paths.add_source(key, hops - 1, except_link=None, tag=self.settings.site))

    def unsubscribe(
        self, topic_filter: str, *, mode: RoutingMode | None = None, ttl: int | None = None
    ) -> list[Action]:
        """The inverse of ``subscribe`` with the same arguments (an unknown one is ignored)."""
        key = self.key_of(topic_filter, mode)
        hops = self.settings.ttl if ttl is None else ttl
        if self._local[(key, hops)] <= 0:
            return []
        self._local[(key, hops)] -= 1
        if self._local[(key, hops)] == 0:
            del self._local[(key, hops)]
        self._local_keys[key] -= 1
        if self._local_keys[key] == 0:
            del self._local_keys[key]
        return self._changes(
            self._paths.remove_source(key, hops - 1, except_link=None, tag=self.settings.site)
        )

    # ================================================================== events
    def publish(self, event: Event, now: float = 0.0, wall_ms: int = 0) -> list[Action]:
        """A local client published ``event`` (the broker already delivered it locally, and its
        cluster to the rest of its site); it leaves tagged with this router's site and, at
        QoS >= 1, with an id that puts it in custody (custody.py)."""
        if self.settings.site and event.site != self.settings.site:
            event = dataclasses.replace(event, site=self.settings.site)
        if event.qos >= 1 and not event.event_id:
            self._event_seq += 1
            event = dataclasses.replace(
                event, event_id=f"{self.settings.incarnation or self.name}/{self._event_seq}"
            )
        actions = self._forward(event, came_from=None, now=now)
        if event.retain and self.settings.retained_place:  # the place stores it too (retained.py)
            write = self.retained.local_write(event.topic, event.payload, event.qos, wall_ms)
            actions += [self._send(link, write) for link in self.links()]
        return actions

    def _on_retained(self, peer: str, write: Retained) -> list[Action]:
        if not self.settings.retained_place or not self.retained.accept(write):
            return []  # old news (or retained stays per site here): the flood stops
        return [StoreRetained(write), *(self._send(link, write) for link in self.links() if link != peer)]

    def _forward(self, event: Event, came_from: str | None, now: float) -> list[Action]:
        event_id = event.event_id
        if event_id and self._custody.seen(event_id):  # a re-routed copy: never delivered twice
            self._custody.stats.duplicates += 1
            if came_from is None:
                return []
            # this router takes over the copy's custody (it re-routes it to links that were not
            # in its first route) and acknowledges at once: two routers re-routing the same
            # event to each other must not wait for each other
            self._custody.revive(event_id, came_from, now)
            return [self._send(came_from, EventAck(event_id))]
        view = TopicView(event.topic, self.settings.class_levels)
        actions: list[Action] = []
        targets: set[str] = set()
        for link in self.links():
            if link == came_from:
                continue  # never back where it came from
            if self._link_wants(link, view, event.site):
                targets.add(link)
                actions.append(self._send(link, event))
        if came_from is not None:
            if event.site and event.site == self.settings.site:
                pass  # published in this router's own site (a cluster): the cluster delivered it there
            elif any(view.matches(key) for key in self._local_keys):
                self.stats.events_delivered += 1
                actions.append(Deliver(event, came_from))
            elif not targets:
                self.stats.events_wasted += 1
        if event_id:  # after the local delivery: an acknowledgement may go out at once
            ghostly = any(
                any(view.matches(key) for key in held)
                for peer, (held, _tags, _until) in self._ghosts.items()
                if peer != came_from
            )
            actions += self._take_custody(event_id, event, came_from, targets, now, hold=ghostly)
        return actions

    def _take_custody(
        self, event_id: str, event: Event, came_from: str | None, targets: set[str], now: float, *, hold: bool
    ) -> list[Action]:
        """Keep the event until ``targets`` acknowledge it; ``hold``: it also matches a lost
        link's ghost, so it waits (and is re-routed) for that side's re-link."""
        unlinked = came_from is None and self.parent is None and not self.left and self._relinking()
        if not targets and not hold and not unlinked:
            self._custody.finish(event_id)  # nobody to wait for (remembered against copies)
            return [self._send(came_from, EventAck(event_id))] if came_from is not None else []
        entry = Entry(
            event, came_from, waiting=targets, orphaned_since=now if hold or not targets else None, lost=hold
        )
        if came_from is not None:
            entry.ack_to.add(came_from)
        evicted = self._custody.hold(event_id, entry)
        return [] if evicted is None else [Note("federation_custody_full", (("evicted", evicted),))]

    def _relinking(self) -> bool:
        return self._pending is not None or bool(self._candidates) or self._upstream_target is not None

    def _on_event_ack(self, peer: str, ack: EventAck) -> list[Action]:
        entry = self._custody.acked(ack.event_id, peer)
        return [] if entry is None else self._complete(ack.event_id, entry)

    def _complete(self, event_id: str, entry: Entry) -> list[Action]:
        self._custody.finish(event_id, given_up=entry.missed())
        return [
            self._send(link, EventAck(event_id)) for link in sorted(entry.ack_to) if link in self._received
        ]

    def _reroute(self, now: float) -> list[Action]:
        """Events whose links broke go out on the links that match them now (the neighbours
        re-registered after the re-link); after ``custody_grace_s`` they are complete."""
        if self.parent is None and not self.left and self._relinking():
            self._custody.hold_orphans(now)  # the grace runs once linked again
        sends, complete = self._custody.reroute(now, self.settings.custody_grace_s, self.links(), self._wants)
        actions: list[Action] = [self._send(link, event) for link, event in sends]
        given_up = sum(1 for _event_id, entry in complete if entry.missed())
        for event_id, entry in complete:
            actions += self._complete(event_id, entry)
        if given_up:
            actions.append(Note("federation_custody_given_up", (("events", str(given_up)),)))
        return actions

    def _wants(self, link: str, event: Event) -> bool:
        return self._link_wants(link, TopicView(event.topic, self.settings.class_levels), event.site)

    def _link_wants(self, link: str, view: TopicView, site: str) -> bool:
        """Whether the neighbour on ``link`` registered a key matching the event - other than a
        key only the event's own site registered, when that neighbour is of that site."""
        same_site = bool(site) and self._link_sites.get(link) == site
        tags = self._received_tags.get(link, {})
        return any(
            view.matches(key) and not (same_site and tags.get(key)) for key in self._received.get(link, {})
        )

    def restore(self, now: float) -> int:
        """After a crash: take back the events the custody store kept (re-routed by ``tick``)."""
        return self._custody.restore(now)

    def custody_stats(self) -> dict[str, int]:
        return self._custody.as_dict()

    # ================================================================== links: requesting side
    def set_upstream(self, peer: str, now: float, *, one_way: bool = False) -> list[Action]:
        """Configure the entity to request the link to (retried by ``tick`` while unlinked)."""
        self._upstream_target = peer
        self._pending_one_way = one_way
        return self.request_link(peer, now)

    def request_link(self, peer: str, now: float) -> list[Action]:
        """Request the shared link of this place to ``peer``; LinkError when one is held or
        pending (at most one request per event place, §3.7.3)."""
        if self.left:
            raise LinkError(f"{self.name} left event place {self.place!r}")
        if self.parent is not None:
            raise LinkError(
                f"{self.name} already holds its link of event place {self.place!r} (to {self.parent})"
            )
        if self._pending is not None:
            raise LinkError(
                f"{self.name} already requested its link of event place {self.place!r} (to {self._pending})"
            )
        if peer == self.name or peer in self.children:
            raise LinkError(f"{self.name} cannot request a link to {peer}: it is itself or already linked")
        self._pending = peer
        self._pending_since = now
        return [
            self._send(peer, LinkRequest(self.place, self.name, self._pending_one_way, self.settings.site))
        ]

    def _on_accepted(self, peer: str, message: LinkAccepted, now: float) -> list[Action]:
        if peer != self._pending:
            return [Unlink(peer), Note("federation_unexpected_accept", (("peer", peer),))]
        self._pending = None
        reason = self._rejection(message)
        if reason is not None:
            actions: list[Action] = [Send(peer, Leave(None)), Unlink(peer)]
            actions.append(Note("federation_link_rejected", (("peer", peer), ("reason", reason))))
            return actions + self._next_candidate(now)
        self.parent = peer
        self._candidates = []
        if self._pending_one_way:
            self._one_way_links.add(peer)
        self._received[peer] = {}
        self._received_tags[peer] = {}
        self._link_sites[peer] = message.site
        actions = [Note("federation_link_up", (("peer", peer), ("role", "parent"), ("mode", message.mode)))]
        actions += self._changes(self._paths.seed_link(peer, self._sources(), message.site))
        actions += self._retained_copy(peer)
        actions += self._set_topology((*message.topology, self.name))
        actions += self._probe(now)
        return actions

    def _rejection(self, accepted: LinkAccepted) -> str | None:
        """Why this router will not keep a link the other side accepted (§3.7.1's returned
        information does not fit: a loop, another place, another routing mode)."""
        if self.name in accepted.topology:
            return "loop"
        if accepted.place != self.place:
            return f"place {accepted.place!r}"
        if accepted.mode != self.settings.mode.value:
            return (
                f"event place {self.place!r} routes {accepted.mode}, this broker {self.settings.mode.value}"
            )
        return None

    def _on_refused(self, peer: str, message: LinkRefused, now: float) -> list[Action]:
        if peer != self._pending:
            return []
        self._pending = None
        note = Note("federation_link_refused", (("peer", peer), ("reason", message.reason)))
        return [note, Unlink(peer), *self._next_candidate(now)]

    def _next_candidate(self, now: float) -> list[Action]:
        while self._candidates:
            candidate = self._candidates.pop(0)
            if candidate != self.name and candidate not in self.children:
                return self.request_link(candidate, now)
        self._retry_at = now + self.settings.retry_interval_s
        return []

    # ================================================================== links: accepting side
    def _on_request(self, peer: str, message: LinkRequest) -> list[Action]:
        reason = self._refusal(peer, message)
        if reason is not None:
            return [
                self._send(peer, LinkRefused(self.place, reason)),
                Unlink(peer),
                Note("federation_refused", (("peer", peer), ("reason", reason))),
            ]
        self.children.add(peer)
        self._received[peer] = {}
        self._received_tags[peer] = {}
        self._link_sites[peer] = message.site
        accepted = LinkAccepted(
            self.place, self.settings.mode.value, self.settings.description, self.topology, self.settings.site
        )
        actions: list[Action] = [self._send(peer, accepted)]
        actions.append(Note("federation_link_up", (("peer", peer), ("role", "child"))))
        actions += self._changes(self._paths.seed_link(peer, self._sources(), message.site))
        actions += self._retained_copy(peer)
        return actions

    def _refusal(self, peer: str, message: LinkRequest) -> str | None:
        if self.left:
            return f"{self.name} has left event place {self.place!r}"
        if message.place != self.place:
            return f"unknown event place {message.place!r} (this broker serves {self.place!r})"
        if not self.settings.accept_links:
            return f"{self.name} does not accept shared links"
        if peer == self.name or message.requester == self.name:
            return "a broker cannot link to itself"
        if peer in self.children or peer == self.parent:
            return f"{peer} already holds a shared link with {self.name} in event place {self.place!r}"
        if peer in self.topology:
            return f"{peer} is upstream of {self.name}: the link would close a loop"
        return None

    # ================================================================== messages from a link
    def on_message(self, peer: str, message: LinkMessage, now: float) -> list[Action]:
        if isinstance(message, LinkRequest):
            return self._on_request(peer, message)
        if isinstance(message, LinkAccepted):
            return self._on_accepted(peer, message, now)
        if isinstance(message, LinkRefused):
            return self._on_refused(peer, message, now)
        if peer not in self._received:
            return []  # not (or no longer) a link of ours
        if isinstance(message, Register):
            return self._on_register(peer, message)
        if isinstance(message, Unregister):
            return self._on_unregister(peer, message)
        if isinstance(message, Event):
            self.stats.events_in += 1
            return self._forward(message, came_from=peer, now=now)
        if isinstance(message, EventAck):
            return self._on_event_ack(peer, message)
        if isinstance(message, Retained):
            return self._on_retained(peer, message)
        if isinstance(message, Leave):
            return self._on_leave(peer, message, now)
        if isinstance(message, TopologyUpdate):
            if peer != self.parent:
                return []
            if self.name in message.topology:  # our parent re-linked below us: break the loop
                return self.link_lost(peer, now)
            return self._set_topology((*message.topology, self.name))
        if isinstance(message, Probe):
            return self._on_probe(peer, message)
        return self._on_probe_reply(message)

    def _on_register(self, peer: str, message: Register) -> list[Action]:
        if message.ttl - 1 < 1 and peer in self._received and message.key not in self._received[peer]:
            self.stats.registrations_stopped_by_ttl += 1  # Fig. 16: this router is the last it reaches
        held = self._received[peer]
        tags = self._received_tags.setdefault(peer, {})
        old = held.get(message.key)
        old_tag = tags.get(message.key, "")
        tag = self._link_sites.get(peer, "") if message.own_site else ""
        held[message.key] = message.ttl
        tags[message.key] = tag
        changes: list[PathChange] = []
        if old is not None:
            changes += self._paths.remove_source(message.key, old - 1, except_link=peer, tag=old_tag)
        changes += self._paths.add_source(message.key, message.ttl - 1, except_link=peer, tag=tag)
        return self._changes(_net(changes))

    def _on_unregister(self, peer: str, message: Unregister) -> list[Action]:
        old = self._received[peer].pop(message.key, None)
        tag = self._received_tags.get(peer, {}).pop(message.key, "")
        if old is None:
            return []
        return self._changes(self._paths.remove_source(message.key, old - 1, except_link=peer, tag=tag))

    # ================================================================== leave and crash (§3.7.3)
    def leave(self) -> list[Action]:
        """Leave the place: children get the parent (or, without one, one of the children) as
        replacement; the parent is told; every link closes."""
        actions: list[Action] = []
        children = sorted(self.children)
        replacement = self.parent if self.parent is not None else (children[0] if children else None)
        for child in children:
            actions.append(self._send(child, Leave(replacement)))
            actions.append(Unlink(child))
        if self.parent is not None:
            actions.append(self._send(self.parent, Leave(None)))
            actions.append(Unlink(self.parent))
        if self._pending is not None:
            actions.append(Unlink(self._pending))
        self.left = True
        self.parent = None
        self._pending = None
        self.children.clear()
        for link in list(self._received):
            self._paths.drop_link(link)
        self._received.clear()
        self._received_tags.clear()
        self._link_sites.clear()
        actions.append(Note("federation_left", (("replacement", replacement or ""),)))
        return actions

    def _on_leave(self, peer: str, message: Leave, now: float) -> list[Action]:
        was_parent = peer == self.parent
        actions: list[Action] = [Note("federation_neighbour_left", (("peer", peer),))]
        actions += self._drop(peer, now)
        if not was_parent:
            return actions
        replacement = message.replacement
        if replacement is None or replacement == self.name:
            actions += self._set_topology((self.name,))  # this router is now the root
            self._discovery.forget()
            return actions
        actions += self._set_topology((self.name,))
        self._candidates = [name for name in self._upstream_candidates(exclude=peer) if name != replacement]
        return actions + self.request_link(replacement, now)

    def link_lost(self, peer: str, now: float) -> list[Action]:
        """The link to ``peer`` broke without a Leave (crash, power or network failure)."""
        if peer == self._pending:
            self._pending = None
            return [Note("federation_link_failed", (("peer", peer),)), *self._next_candidate(now)]
        if peer != self.parent and peer not in self.children:
            return []
        was_parent = peer == self.parent
        actions: list[Action] = [Note("federation_link_lost", (("peer", peer),)), Unlink(peer)]
        actions += self._drop(peer, now)
        if was_parent:
            self._candidates = self._upstream_candidates(exclude=peer)
            if not self._candidates:  # the root died: its children elect one of them (discovery.py)
                self._candidates = self._discovery.election(self.name)
                if not self._candidates:
                    actions.append(Note("federation_new_root", (("place", self.place),)))
            if (
                self._upstream_target
                and self._upstream_target not in self._candidates
                and self._upstream_target != peer
            ):
                self._candidates.append(self._upstream_target)
            actions += self._set_topology((self.name,))
            actions += self._next_candidate(now)
        return actions

    def _upstream_candidates(self, exclude: str) -> list[str]:
        return self._discovery.candidates(exclude)

    def _drop(self, peer: str, now: float) -> list[Action]:
        """Forget the link to ``peer``. What it registered stays a *ghost* source for
        ``custody_grace_s`` (custody.py): the paths upstream stay while its side re-links, and
        QoS >= 1 events matching it are held for re-routing; then it stops counting."""
        self._custody.link_lost(peer, now)
        if peer == self.parent:
            self.parent = None
        self.children.discard(peer)
        self._one_way_links.discard(peer)
        self._paths.drop_link(peer)
        held = self._received.pop(peer, {})
        tags = self._received_tags.pop(peer, {})
        self._link_sites.pop(peer, None)
        actions = self._expire_ghost(peer)  # a previous ghost of the same peer
        if held:
            self._ghosts[peer] = (held, tags, now + self.settings.custody_grace_s)
        return actions

    def _expire_ghost(self, peer: str) -> list[Action]:
        held, tags, _until = self._ghosts.pop(peer, ({}, {}, 0.0))
        changes: list[PathChange] = []
        for key, ttl in held.items():
            changes += self._paths.remove_source(key, ttl - 1, except_link=peer, tag=tags.get(key, ""))
        return self._changes(changes)

    def _expire_ghosts(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for peer in [peer for peer, (_held, _tags, until) in self._ghosts.items() if until <= now]:
            actions += self._expire_ghost(peer)
        return actions

    # ================================================================== timers and discovery
    def tick(self, now: float) -> list[Action]:
        """Retry the upstream link while unlinked; time out a pending request; re-probe."""
        actions: list[Action] = []
        if self.left:
            return actions
        if self._pending is not None and now - self._pending_since >= self.settings.link_timeout_s:
            peer = self._pending
            actions += [Unlink(peer), *self.link_lost(peer, now)]
        if self.parent is None and self._pending is None and now >= self._retry_at:
            if not self._candidates and self.topology == (self.name,):
                refill = self._upstream_candidates(exclude="")
                if self._upstream_target is not None and self._upstream_target not in refill:
                    refill.append(self._upstream_target)
                self._candidates = refill
            if self._candidates:
                actions += self._next_candidate(now)
        if self.parent is not None and now >= self._discovery.next_at:
            actions += self._probe(now)
        actions += self._reroute(now)
        actions += self._expire_ghosts(now)
        return actions

    def _probe(self, now: float) -> list[Action]:
        settings, parent = self.settings, self.parent
        probes = self._discovery.probes(self.name, now, settings.probe_interval_s, settings.probe_hops)
        return [self._send(parent, probe) for probe in probes] if parent is not None else []

    def _on_probe(self, peer: str, probe: Probe) -> list[Action]:
        hop = len(probe.trail)
        reply = ProbeReply(probe.round, probe.attribute, self.name, hop, probe.trail[:-1])
        actions: list[Action] = [self._send(peer, reply)]
        if probe.hops_left - 1 >= 1:
            onward = Probe(probe.round, probe.hops_left - 1, probe.attribute, (*probe.trail, self.name))
            for link in self._hop_targets(probe.attribute):
                if link != peer and link not in probe.trail:
                    actions.append(self._send(link, onward))
        return actions

    def _hop_targets(self, attribute: HopAttribute) -> list[str]:
        if attribute is HopAttribute.UPSTREAM:
            return [self.parent] if self.parent else []
        if attribute is HopAttribute.DOWNSTREAM:
            return sorted(self.children)
        return self.links()

    def _on_probe_reply(self, reply: ProbeReply) -> list[Action]:
        if reply.route:
            onward = ProbeReply(reply.round, reply.attribute, reply.responder, reply.hop, reply.route[:-1])
            target = reply.route[-1]
            return [self._send(target, onward)] if target in self._received else []
        self._discovery.learned(reply)
        return []

    # ================================================================== helpers
    def _set_topology(self, topology: tuple[str, ...]) -> list[Action]:
        if topology == self.topology:
            return []
        self.topology = topology
        return [self._send(child, TopologyUpdate(topology)) for child in sorted(self.children)]

    def _retained_copy(self, peer: str) -> list[Action]:
        """After a (re-)link: everything retained this router knows goes to the new neighbour."""
        if not self.settings.retained_place:
            return []
        return [self._send(peer, write) for write in self.retained.everything()]

    def _sources(self) -> list[tuple[str, int, str | None, str]]:
        """Every source: (key, TTL left, the link it came from or None, its site tag)."""
        sources: list[tuple[str, int, str | None, str]] = []
        for (key, hops), count in self._local.items():
            sources.extend([(key, hops - 1, None, self.settings.site)] * count)
        for link, held in self._received.items():
            tags = self._received_tags.get(link, {})
            sources.extend((key, ttl - 1, link, tags.get(key, "")) for key, ttl in held.items())
        for link, (held, tags, _until) in self._ghosts.items():
            sources.extend((key, ttl - 1, link, tags.get(key, "")) for key, ttl in held.items())
        return sources

    def _changes(self, changes: list[PathChange]) -> list[Action]:
        actions: list[Action] = []
        for change in changes:
            if change.link in self._one_way_links:
                continue
            if change.ttl is None:
                actions.append(self._send(change.link, Unregister(change.key)))
            else:
                actions.append(self._send(change.link, Register(change.key, change.ttl, change.own_site)))
        return actions

    def _send(self, peer: str, message: LinkMessage) -> Send:
        self.stats.sent[type(message).__name__] += 1
        return Send(peer, message)


def _net(changes: list[PathChange]) -> list[PathChange]:
    """Collapse a remove-then-add of one (link, key) into its final state (a TTL update)."""
    final: dict[tuple[str, str], PathChange] = {}
    for change in changes:
        final[(change.link, change.key)] = change
    return list(final.values())
