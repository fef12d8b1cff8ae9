"""What federation routers tell each other over a shared link, and what a router asks of its
adapter (seed 000 §3.7). Plain frozen dataclasses: ``broker.adapters.federation`` maps them to
the ``skipmq.v1.Federation`` protobuf messages.

Anonymity (§3.7.2): a ``Register`` carries a key, a TTL and ``own_site`` - never who
subscribed, nor where; ``own_site`` says only that every source lies in the sender's own site,
which the link already names (``LinkRequest.site`` / ``LinkAccepted.site``), so that a clustered
site's filters do not draw its own events out and back.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class HopAttribute(StrEnum):
    """Which links an n-hop discovery event follows (§3.7.3 (4))."""

    UPSTREAM = "upstream"  # only toward the entities this one requested a link to
    DOWNSTREAM = "downstream"  # only toward the entities that requested a link to this one
    ALL = "all"


# ---------------------------------------------------------------- link set-up (§3.7.1)
@dataclass(frozen=True, slots=True)
class LinkRequest:
    place: str
    requester: str
    one_way: bool = False  # the requester registers no filter upstream: it only publishes
    site: str = ""  # the requester's site (a cluster's brokers share one; "" = none)


@dataclass(frozen=True, slots=True)
class LinkAccepted:
    """The accepting side's answer: event place name, routing mode, description and the link
    topology, here the path from the place's root down to the acceptor."""

    place: str
    mode: str
    description: str
    topology: tuple[str, ...]
    site: str = ""  # the acceptor's site ("" = none)


@dataclass(frozen=True, slots=True)
class LinkRefused:
    place: str
    reason: str


@dataclass(frozen=True, slots=True)
class TopologyUpdate:
    """The sender's path from the root changed (a re-link upstream): ``topology`` ends with it."""

    topology: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Leave:
    """The sender leaves the place (§3.7.3 (2)); a child gets the entity to re-link to (its own
    name: it becomes the root), the parent gets None."""

    replacement: str | None


# ---------------------------------------------------------------- event paths (§3.7.2, §3.7.4)
@dataclass(frozen=True, slots=True)
class Register:
    """``own_site``: every source of the key lies in the sender's own site (the one its link
    named); it says no more than the link already does, and keeps a clustered site's filters
    from drawing its own events out and back (router.py)."""

    key: str
    ttl: int
    own_site: bool = False


@dataclass(frozen=True, slots=True)
class Unregister:
    key: str


@dataclass(frozen=True, slots=True)
class Event:
    """An application message crossing a link (MQTT topic, payload, QoS, retain flag) and the
    site it was published in (an operator-chosen name shared by the brokers of one cluster, or
    "" for a stand-alone broker), so it is not delivered a second time inside that site."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    site: str = ""
    event_id: str = ""  # QoS >= 1: "<publishing router's incarnation>/<n>", for custody (custody.py)


@dataclass(frozen=True, slots=True)
class EventAck:
    """Every site downstream of the sender that wanted event ``event_id`` has it (custody.py)."""

    event_id: str


@dataclass(frozen=True, slots=True)
class Retained:
    """A retained write (empty payload = delete) flooded over the place with ``retained =
    "place"``; last writer wins on ``(version_ms, origin)`` (retained.py)."""

    topic: str
    payload: bytes
    qos: int
    version_ms: int
    origin: str


# ---------------------------------------------------------------- n-hop discovery (§3.7.3 (4))
@dataclass(frozen=True, slots=True)
class Probe:
    """An n-hop discovery event: ``hops_left`` more routers may see it; ``trail`` is the path
    from the prober (first) to the sender (last), for the replies to retrace."""

    round: int
    hops_left: int
    attribute: HopAttribute
    trail: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ProbeReply:
    """``responder`` is ``hop`` links from the prober; ``route`` is what is left of the trail."""

    round: int
    attribute: HopAttribute
    responder: str
    hop: int
    route: tuple[str, ...]


LinkMessage = (
    LinkRequest
    | LinkAccepted
    | LinkRefused
    | TopologyUpdate
    | Leave
    | Register
    | Unregister
    | Event
    | EventAck
    | Retained
    | Probe
    | ProbeReply
)


# ---------------------------------------------------------------- actions for the adapter
@dataclass(frozen=True, slots=True)
class Send:
    """Send ``message`` on the link to ``peer``; a ``LinkRequest`` opens that link first."""

    peer: str
    message: LinkMessage


@dataclass(frozen=True, slots=True)
class Deliver:
    """Deliver an event that came over a link to this site's local subscribers."""

    event: Event
    from_peer: str


@dataclass(frozen=True, slots=True)
class StoreRetained:
    """Store (or, with an empty payload, delete) a retained message of another site, without
    delivering it (retained.py)."""

    write: Retained


@dataclass(frozen=True, slots=True)
class Unlink:
    """Close the link to ``peer`` (after any ``Send`` to it in the same batch)."""

    peer: str


@dataclass(frozen=True, slots=True)
class Note:
    """Something an operator wants in the log (link up/down, refusals, re-links)."""

    event: str
    fields: tuple[tuple[str, str], ...] = ()


Action = Send | Deliver | StoreRetained | Unlink | Note
