"""The records of an overlay node (seed 003 §3.2): a virtual node with its routing table, a
pending join, an end-to-end publish task; the timer kinds; two small checks.

Part of ``overlay.node.OverlayNode`` (the module docstring there says how the class is split).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from overlay import messages as m
from overlay.api import PeerId
from overlay.config import OverlayConfig
from overlay.keys import ANCHOR_TOPIC, Key, NodeRef
from overlay.table import RoutingTable

# timer kinds (``NodeBase.timers``: (at, seq, kind, arg)); ``MaintenanceQueries._tick`` runs them
T_REXP = 0
T_EEXP_RANGE = 1
T_EEXP_RANDOM = 2
T_SEARCH = 3
T_PING = 4
T_ACK = 5
T_LINK = 6
T_NOTICE = 7
T_DONE = 8
T_DONE_RETRY = 9
T_VERIFY = 10


class VirtualNode:
    """One (topic, role, peer) member of the Skip Graph with its routing table."""

    __slots__ = (
        "confirmed",
        "key",
        "last_publish_eexp",
        "left0",
        "link_tries",
        "loose_left_from",
        "loose_left_until",
        "loose_right_from",
        "loose_right_until",
        "mv",
        "random_rounds",
        "ref",
        "right0",
        "rp_present",
        "seen",
        "table",
        "verify_rounds",
    )

    def __init__(self, key: Key, mv: int, config: OverlayConfig) -> None:
        self.key = key
        self.mv = mv
        self.ref: NodeRef = (key, mv)
        self.table = RoutingTable(
            key, mv, capacity=config.table_size, frt_enabled=config.frt_enabled, mv_bits=config.mv_bits
        )
        self.left0: Key | None = None
        self.right0: Key | None = None
        self.confirmed: set[Key] = set()  # level-0 neighbours that answered our LINK/REXP
        self.link_tries = 0
        # until then a level-0 neighbour that moved farther away (crash, give-up, GONE; not a
        # graceful LEAVE, which names the replacement) may hide live nodes in between: the
        # nodes behind a crashed one re-link only after their own failure detection
        # (ends early when a neighbour at least as near as the lost one, ``*_from``, is back)
        self.loose_left_until = float("-inf")
        self.loose_right_until = float("-inf")
        self.loose_left_from: Key | None = None
        self.loose_right_from: Key | None = None
        self.rp_present: bool | None = None  # None: not the rendezvous point
        self.seen: dict[tuple[Key, int], None] = {}
        self.random_rounds = 0
        self.verify_rounds = 0  # position checks done (see OverlayNode._verify_position)
        self.last_publish_eexp = float("-inf")


class PendingJoin:
    __slots__ = ("first_hop", "key", "mv", "request_id", "waiting")

    def __init__(self, key: Key, mv: int, request_id: int) -> None:
        self.key = key
        self.mv = mv
        self.request_id = request_id
        self.waiting = False  # held back while another join of this peer runs the formation rounds
        self.first_hop: Key | None = None  # where this peer's own vnode sent the current search


class PublishTask:
    """End-to-end completion of one PUB handled here (``publish_done_enabled``).

    ``upstream`` is (peer, ack id) of the delegation to answer with DONE, or None for this
    peer's own ``Publish`` (answered with ``api.PublishDone``); ``also`` holds the ack ids of
    retransmissions of the same delegation, answered together. ``waiting`` maps each open
    delegation (slot = its first ack id) to its forwarding virtual node, its latest PUB and all
    ack ids it was sent with (retransmissions get new ones). ``ident`` names the delegation
    received (virtual node, publisher key, publication id, lo, hi)."""

    __slots__ = (
        "also",
        "finished",
        "ident",
        "publication_id",
        "reached",
        "succeeded",
        "topic",
        "upstream",
        "waiting",
    )

    def __init__(
        self, upstream: tuple[PeerId, int] | None, topic: str, publication_id: int, ident: Any = None
    ) -> None:
        self.upstream = upstream
        self.also: list[tuple[PeerId, int]] = []
        self.topic = topic
        self.publication_id = publication_id
        self.ident = ident
        self.waiting: dict[int, tuple[VirtualNode, m.PUB, list[int]]] = {}
        self.finished = False
        self.succeeded = False
        self.reached = False  # a delegation of it went to another peer (``PublishDone.reached``)


def check_topic(topic: object) -> None:
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, got {type(topic).__name__}")
    if topic == ANCHOR_TOPIC:
        raise ValueError("topic must be non-empty (the empty topic is reserved for the per-peer anchor)")


def listed(existing: tuple[Key, ...], key: Key) -> bool:
    """Whether ``key`` is in an existing-entry list (§3.5.6). The list is a table's keys, ascending
    (``tuple(table.keys)``): a binary search instead of a scan of up to L+1 keys, on every REXP and
    EEXP received (the scan was about 4 s of a 138-s profiled N = 1,000, L = 120 series). A list
    that is not ascending (a faulty peer) costs at most a NEW too many or too few."""
    index = bisect_left(existing, key)
    return index < len(existing) and existing[index] == key
