"""An event place as one router runs it (seed 000 §3.7.5), the router's message counts, and
the error of a link request the open link topology forbids (§3.7.3)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from broker.federation.keys import RoutingMode


class LinkError(Exception):
    """A link request this router refuses to make (it already holds or awaits one, §3.7.3)."""


@dataclass(frozen=True, slots=True)
class PlaceSettings:
    """An event place as this router runs it (§3.7.5)."""

    place: str
    mode: RoutingMode = RoutingMode.FULL_FILTER
    description: str = ""
    ttl: int = 16  # routers a local filter reaches, counting this one (1 = stays in the site)
    class_levels: int = 1  # topic levels of an event type (type-only mode)
    accept_links: bool = True
    site: str = ""  # brokers of one cluster share it: an event of their site is not delivered twice
    probe_hops: int = 3  # n of the n-hop upstream discovery
    probe_interval_s: float = 10.0
    retry_interval_s: float = 2.0
    link_timeout_s: float = 5.0
    custody_grace_s: float = 10.0  # how long an event whose links broke waits for new ones
    incarnation: str = ""  # prefix of this router's event ids ("" = its name); new at each start
    retained_place: bool = False  # retained writes flood the place, last writer wins (retained.py)


@dataclass(slots=True)
class RouterStats:
    """Messages this router sent, by kind (the set-up cost and the events of the two modes)."""

    sent: Counter[str] = field(default_factory=Counter)
    events_in: int = 0
    events_delivered: int = 0
    events_wasted: int = 0  # came over a link, matched no local key and went nowhere else
    registrations_stopped_by_ttl: int = 0  # received with TTL 1: counted here, passed on nowhere
