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


class EventPaths:
    """The counters of one router: per link, per key, a multiset of the TTLs its sources allow."""

    def __init__(self) -> None:
        self._toward: dict[str, dict[str, Counter[int]]] = {}

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

    def add_source(self, key: str, ttl: int, *, except_link: str | None) -> list[PathChange]:
        """A source of ``key`` allowing ``ttl`` more routers appeared; it counts toward every
        link but ``except_link`` (the link it came from, or None for a local subscription)."""
        changes: list[PathChange] = []
        if ttl < 1:
            return changes
        for link, keys in self._toward.items():
            if link == except_link:
                continue
            ttls = keys.setdefault(key, Counter())
            before = max(ttls) if ttls else None
            ttls[ttl] += 1
            after = max(ttls)
            if before != after:
                changes.append(PathChange(link, key, after))
        return changes

    def remove_source(self, key: str, ttl: int, *, except_link: str | None) -> list[PathChange]:
        """The inverse of ``add_source`` with the same arguments."""
        changes: list[PathChange] = []
        if ttl < 1:
            return changes
        for link, keys in self._toward.items():
            if link == except_link:
                continue
            ttls = keys.get(key)
            if not ttls or ttls[ttl] <= 0:
                continue
            before = max(ttls)
            ttls[ttl] -= 1
            if ttls[ttl] == 0:
                del ttls[ttl]
            if not ttls:
                del keys[key]
                changes.append(PathChange(link, key, None))
            elif max(ttls) != before:
                changes.append(PathChange(link, key, max(ttls)))
        return changes

    def seed_link(self, link: str, sources: list[tuple[str, int, str | None]]) -> list[PathChange]:
        """A new link: count every existing source (key, ttl, the link it came from) toward it and
        return the registrations to send (re-registration after a (re-)link, §3.7.3)."""
        self._toward[link] = {}
        keys = self._toward[link]
        for key, ttl, origin_link in sources:
            if ttl < 1 or origin_link == link:
                continue
            keys.setdefault(key, Counter())[ttl] += 1
        return [PathChange(link, key, max(ttls)) for key, ttls in keys.items()]
