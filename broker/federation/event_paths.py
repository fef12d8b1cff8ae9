"""Event-path caching: counters per (link, key) forwarding only 0->1 and 1->0 (seed 000 §3.7.4).

For every shared link L of a router and every routing key, the counter is the number of
*sources* that want the key registered toward L: each local subscription of the key, and each
other link L' (L' != L) on which the neighbour registered the key with a TTL that still allows
one more hop. That is Table 1's counter of SI-R(self, L): how many times the router was asked
to register the filter. Only the transitions reach the wire: 0->1 registers the key on L,
1->0 unregisters it; 1->2 and 2->1 only count.

TTL (seed 000 §3.7.2, Fig. 16): a registration carries the number of routers it may still
reach, counting the one that receives it; a local subscription starts with the place's TTL ``T``
and a router passes a registration it received with ``t`` on with ``t - 1`` when ``t - 1 >= 1``.
So ``T = 2`` reaches the 1-hop neighbours only (Fig. 16 (a): entity 2 reaches 1, 3 and 4) and
``T = 1`` keeps a filter inside its site. When sources of one key arrive with different TTLs,
the link carries the largest; a change of that maximum is re-sent as a registration (an update,
not a new count).

Sites (SkipMQ's clustered sites): a source may carry a *tag*, the site it lies in (a local
subscription: this router's site; a neighbour's registration marked ``own_site``: that
neighbour's site). A tagged source does not count toward a link whose neighbour is of the same
site - that site's cluster already serves it, so registering it there would draw the site's
own events out and back. A link's registration is marked ``own_site`` when every source counted
toward it carries this router's own site.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PathChange:
    """What must be told to the neighbour on ``link``: register ``key`` with ``ttl`` (a 0->1
    transition or a larger/smaller maximum TTL), or unregister it (``ttl`` None, 1->0)."""

    link: str
    key: str
    ttl: int | None
    own_site: bool = False  # every source counted toward ``link`` lies in this router's site


class EventPaths:
    """The counters of one router: per link, per key, a multiset of the TTLs its sources allow."""

    def __init__(self, site: str = "") -> None:
        self.site = site  # this router's site ("" = none)
        self._toward: dict[str, dict[str, Counter[int]]] = {}
        self._tags: dict[str, dict[str, Counter[str]]] = {}  # link -> key -> sources' sites
        self._sites: dict[str, str] = {}  # link -> its neighbour's site

    # ------------------------------------------------------------------ reading
    def links(self) -> list[str]:
        return list(self._toward)

    def counter(self, link: str, key: str) -> int:
        """Table 1's counter: how many sources want ``key`` registered toward ``link``."""
        ttls = self._toward.get(link, {}).get(key)
        return sum(ttls.values()) if ttls else 0

    def registered(self, link: str) -> dict[str, int]:
        """The keys registered toward ``link`` with the TTL each carries."""
        return {key: max(ttls) for key, ttls in self._toward.get(link, {}).items() if ttls}

    def own_site(self, link: str, key: str) -> bool:
        """Whether every source of ``key`` counted toward ``link`` lies in this router's site."""
        tags = self._tags.get(link, {}).get(key)
        return bool(self.site) and tags is not None and set(tags) == {self.site}

    def _skips(self, link: str, tag: str) -> bool:
        return bool(tag) and self._sites.get(link) == tag

    def counters(self) -> dict[str, dict[str, int]]:
        return {
            link: {key: sum(t.values()) for key, t in keys.items()} for link, keys in self._toward.items()
        }

    # ------------------------------------------------------------------ changing
    def add_link(self, link: str) -> None:
        self._toward.setdefault(link, {})

    def drop_link(self, link: str) -> None:
        """Forget what was registered toward ``link`` (the link is gone: nothing to tell it)."""
        self._toward.pop(link, None)
        self._tags.pop(link, None)
        self._sites.pop(link, None)

    def add_source(self, key: str, ttl: int, *, except_link: str | None, tag: str = "") -> list[PathChange]:
        """A source of ``key`` allowing ``ttl`` more routers appeared, lying in site ``tag`` ("" =
        unknown or several); it counts toward every link but ``except_link`` (the link it came
        from, or None for a local subscription) and the links to brokers of its own site."""
        changes: list[PathChange] = []
        if ttl < 1:
            return changes
        for link, keys in self._toward.items():
            if link == except_link or self._skips(link, tag):
                continue
            ttls = keys.setdefault(key, Counter())
            before = (max(ttls), self.own_site(link, key)) if ttls else None
            ttls[ttl] += 1
            self._tags.setdefault(link, {}).setdefault(key, Counter())[tag] += 1
            after = (max(ttls), self.own_site(link, key))
            if before != after:
                changes.append(PathChange(link, key, after[0], after[1]))
        return changes

    def remove_source(
        self, key: str, ttl: int, *, except_link: str | None, tag: str = ""
    ) -> list[PathChange]:
        """The inverse of ``add_source`` with the same arguments."""
        changes: list[PathChange] = []
        if ttl < 1:
            return changes
        for link, keys in self._toward.items():
            if link == except_link or self._skips(link, tag):
                continue
            ttls = keys.get(key)
            if not ttls or ttls[ttl] <= 0:
                continue
            before = (max(ttls), self.own_site(link, key))
            ttls[ttl] -= 1
            if ttls[ttl] == 0:
                del ttls[ttl]
            tags = self._tags.get(link, {}).get(key)
            if tags is not None and tags[tag] > 0:
                tags[tag] -= 1
                if tags[tag] == 0:
                    del tags[tag]
            if not ttls:
                del keys[key]
                self._tags.get(link, {}).pop(key, None)
                changes.append(PathChange(link, key, None))
            elif (max(ttls), self.own_site(link, key)) != before:
                changes.append(PathChange(link, key, max(ttls), self.own_site(link, key)))
        return changes

    def seed_link(
        self, link: str, sources: list[tuple[str, int, str | None, str]], site: str = ""
    ) -> list[PathChange]:
        """A new link to a broker of ``site``: count every existing source (key, ttl, the link it
        came from, its site tag) toward it and return the registrations to send (re-registration
        after a (re-)link, §3.7.3)."""
        self._toward[link] = {}
        self._tags[link] = {}
        self._sites[link] = site
        keys = self._toward[link]
        for key, ttl, origin_link, tag in sources:
            if ttl < 1 or origin_link == link or self._skips(link, tag):
                continue
            keys.setdefault(key, Counter())[ttl] += 1
            self._tags[link].setdefault(key, Counter())[tag] += 1
        return [PathChange(link, key, max(ttls), self.own_site(link, key)) for key, ttls in keys.items()]
