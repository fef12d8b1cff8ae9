"""Custody of QoS >= 1 events across shared links: chained acknowledgements, re-routing after a
re-link, duplicates suppressed (SkipMQ's addition to seed 000 §3.7.3; docs/federation.md).

An event a router forwards on links F stays in its custody until every link in F acknowledged
it; a router acknowledges an event to the link it came from only once it delivered it locally
and every link it forwarded it on acknowledged it - so an acknowledgement means "every site
downstream of this link that wanted it has it". When a link in F breaks (its broker died), the
event is re-routed on the links that match it after the re-link (the neighbours re-registered);
the same event id arriving twice is never delivered twice; a copy re-routed to a router that
already had the event is acknowledged at once and makes that router re-route it too, for
``grace_s``, to links that were not in its first route (a crashed neighbour's children that
re-linked to it): custody passes to it. The
router keeps a lost link's registrations as *ghosts* for ``grace_s`` (router.py): paths are not
torn down upstream while the orphaned sites re-link, and an event matching a ghost is held and
re-routed once they registered again. Events published while the router has no link at all
(between a crash and the re-link) are held likewise. An entry is complete ``grace_s`` after it
lost its links: ``completed`` when nothing was lost on the way (or a re-route reached a
neighbour again), ``given_up`` when a link it waited for broke (or it matched a lost link's
ghost, or it was restored after a crash) and no re-route was acknowledged: the sites behind
that link may not have it.

While the router has no parent and is re-linking (its configured upstream or a re-link target
is still to be reached), the grace of its orphaned entries does not run: they wait for the
link (``hold_orphans``), bounded by ``limit`` (the oldest is given up).

Durable custody: every entry is also written to a ``CustodyStore`` (store_port.py; in a broker
the SQLite store, in the transaction its publisher's PUBACK waits for) and removed when it
completes. A router restarted after a crash ``restore``s them as orphaned entries: they are
re-routed once the re-linked neighbours registered again, and their ids count as seen. A
restored entry does not remember which links had acknowledged it: a neighbour that had the
event gets a copy, which it acknowledges without delivering it again (its own ids), unless it
restarted too (then at least once: docs/federation.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from broker.federation.messages import Event
from broker.federation.store_port import CustodyStore, MemoryCustodyStore


@dataclass(slots=True)
class Entry:
    event: Event
    came_from: str | None  # None: published here
    waiting: set[str] = field(default_factory=set)
    acked: set[str] = field(default_factory=set)
    ack_to: set[str] = field(default_factory=set)  # links to acknowledge once complete
    orphaned_since: float | None = None  # lost (some of) its links; re-routed by tick
    lost: bool = False  # a link it waited for broke, it matched a ghost, or it was restored
    rerouted_to: set[str] = field(default_factory=set)

    def missed(self) -> bool:
        """Some sites that wanted it may not have it: lost on the way and no re-route acknowledged."""
        return self.lost and not (self.rerouted_to & self.acked)


@dataclass(slots=True)
class CustodyStats:
    held: int = 0
    completed: int = 0
    rerouted: int = 0
    duplicates: int = 0
    given_up: int = 0
    evicted: int = 0
    restored: int = 0


class Custody:
    """The entries of one router and the ids it completed recently (duplicate suppression)."""

    def __init__(
        self,
        *,
        limit: int = 100_000,
        remember: int = 200_000,
        recent: int = 10_000,
        store: CustodyStore | None = None,
    ) -> None:
        self.store: CustodyStore = store if store is not None else MemoryCustodyStore()
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self._done: OrderedDict[str, None] = OrderedDict()
        self._recent: OrderedDict[str, Entry] = OrderedDict()  # finished, kept to re-route copies
        self._limit = limit
        self._remember = remember
        self._recent_limit = recent
        self.stats = CustodyStats()

    def seen(self, event_id: str) -> bool:
        return event_id in self.entries or event_id in self._done

    def pending(self, event_id: str) -> Entry | None:
        return self.entries.get(event_id)

    def hold(self, event_id: str, entry: Entry) -> str | None:
        """Keep ``entry``; the id of an evicted oldest entry (given up) when over the limit."""
        self.entries[event_id] = entry
        self.store.put(entry.event, entry.came_from)
        self.stats.held += 1
        if len(self.entries) > self._limit:
            old_id = next(iter(self.entries))  # the oldest: given up
            self.stats.evicted += 1
            self.finish(old_id, given_up=True)
            return old_id
        return None

    def finish(self, event_id: str, *, given_up: bool = False) -> Entry | None:
        """The entry leaves custody: ``completed``, or ``given_up`` (dropped while some site may
        still miss it: the grace ended after a loss, or the limit evicted it)."""
        entry = self.entries.pop(event_id, None)
        self._done[event_id] = None
        if len(self._done) > self._remember:
            self._done.popitem(last=False)
        if entry is not None:
            self.store.forget(event_id)
            if given_up:
                self.stats.given_up += 1
            else:
                self.stats.completed += 1
            self._recent[event_id] = entry
            if len(self._recent) > self._recent_limit:
                self._recent.popitem(last=False)
        return entry

    def revive(self, event_id: str, link: str, now: float) -> Entry | None:
        """A copy of a known event came (re-routed) over ``link`` and was acknowledged at once:
        the entry now also re-routes to new links until its grace ends; None when the event is
        too old to re-route."""
        entry = self.entries.get(event_id)
        if entry is None:
            old = self._recent.pop(event_id, None)
            if old is None:
                return None
            entry = Entry(old.event, old.came_from, acked=old.acked | old.waiting)
            self.entries[event_id] = entry
            self.store.put(entry.event, entry.came_from)
        entry.acked.add(link)
        if entry.orphaned_since is None:
            entry.orphaned_since = now
        return entry

    def acked(self, event_id: str, link: str) -> Entry | None:
        """``link`` acknowledged: the entry when it is now complete, else None."""
        entry = self.entries.get(event_id)
        if entry is None or link not in entry.waiting:
            return None
        entry.waiting.discard(link)
        entry.acked.add(link)
        if entry.waiting or entry.orphaned_since is not None:
            return None
        return entry

    def link_lost(self, link: str, now: float) -> None:
        for entry in self.entries.values():
            entry.ack_to.discard(link)
            if link in entry.waiting:
                entry.waiting.discard(link)
                entry.lost = True
                if entry.orphaned_since is None:
                    entry.orphaned_since = now

    def restore(self, now: float) -> int:
        """Take back what the store kept from before a crash: orphaned entries (their links are
        gone), re-routed by ``reroute``; returns how many."""
        restored = 0
        for event, came_from in self.store.load():
            if event.event_id and event.event_id not in self.entries:
                self.entries[event.event_id] = Entry(event, came_from, orphaned_since=now, lost=True)
                restored += 1
        self.stats.restored += restored
        return restored

    def hold_orphans(self, now: float) -> None:
        """The router is unlinked and re-linking: the orphaned entries' grace starts anew."""
        for entry in self.entries.values():
            if entry.orphaned_since is not None:
                entry.orphaned_since = now

    def orphans(self) -> list[tuple[str, Entry]]:
        return [
            (event_id, entry) for event_id, entry in self.entries.items() if entry.orphaned_since is not None
        ]

    def reroute(
        self, now: float, grace_s: float, links: list[str], wants: Callable[[str, Event], bool]
    ) -> tuple[list[tuple[str, Event]], list[tuple[str, Entry]]]:
        """For every orphaned entry: the (link, event) sends to the links that want it now and
        were not in its route yet, and the entries complete (no wait left, grace over)."""
        sends: list[tuple[str, Event]] = []
        complete: list[tuple[str, Entry]] = []
        for event_id, entry in self.orphans():
            for link in links:
                if link in entry.acked or link in entry.waiting or link == entry.came_from:
                    continue
                if wants(link, entry.event):
                    entry.waiting.add(link)
                    entry.rerouted_to.add(link)
                    self.stats.rerouted += 1
                    sends.append((link, entry.event))
            since = entry.orphaned_since
            if not entry.waiting and since is not None and now - since >= grace_s:
                entry.orphaned_since = None
                complete.append((event_id, entry))
        return sends, complete

    def as_dict(self) -> dict[str, int]:
        return {"in_custody": len(self.entries), **asdict(self.stats)}
