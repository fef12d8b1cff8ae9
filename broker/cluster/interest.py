"""Interest: which overlay topics this broker subscribes, from its local subscriptions (pure core).

SIONet-style aggregation (seed 000, event-path caching with per-event-type counters): local
subscriptions are counted per topic class (``broker.cluster.classes``); only the first local
subscriber of a class (count 0 -> 1) joins the class in the overlay as a subscriber (seed 003
§3.5.2) and only the last one leaving (1 -> 0) leaves it with UNSUB (§3.5.3). Members of a shared
subscription ``$share/g/f`` also count towards the group's own topic ``!share/g/f``, the run of
brokers that have members of the group (the head of that run delivers the group's copy).

Events in (a subscription added or removed), overlay topics to join or leave out. No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.cluster.classes import filter_class

SHARE_PREFIX = "!share/"  # "!share/<group>/<filter>": the run of brokers with members of a group


def share_topic(group: str, topic_filter: str) -> str:
    return f"{SHARE_PREFIX}{group}/{topic_filter}"


@dataclass(frozen=True, slots=True)
class InterestChange:
    """Join (``joined`` True) or leave the overlay topic ``topic`` as a subscriber."""

    topic: str
    joined: bool


class Interest:
    """Counts local subscriptions per topic class and per share group."""

    __slots__ = (
        "_class_clients",
        "_class_counts",
        "_filter_classes",
        "_share_counts",
        "_subscriptions",
        "class_levels",
    )

    def __init__(self, class_levels: int) -> None:
        self.class_levels = class_levels
        # (client, group, filter) -> its class: a replaced subscription counts once
        self._subscriptions: dict[tuple[str, str | None, str], str] = {}
        self._class_counts: dict[str, int] = {}
        self._share_counts: dict[str, int] = {}
        self._filter_classes: dict[str, str] = {}
        self._class_clients: dict[str, dict[str, int]] = {}  # class -> client -> its subscriptions

    def class_of(self, topic_filter: str) -> str:
        cls = self._filter_classes.get(topic_filter)
        if cls is None:
            cls = self._filter_classes[topic_filter] = filter_class(topic_filter, self.class_levels)
        return cls

    def subscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> list[InterestChange]:
        key = (client_id, share_group, topic_filter)
        if key in self._subscriptions:
            return []  # a replaced subscription: same class
        cls = self.class_of(topic_filter)
        self._subscriptions[key] = cls
        clients = self._class_clients.setdefault(cls, {})
        clients[client_id] = clients.get(client_id, 0) + 1
        changes = _count_up(self._class_counts, cls)
        if share_group is not None:
            changes += _count_up(self._share_counts, share_topic(share_group, topic_filter))
        return changes

    def unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> list[InterestChange]:
        cls = self._subscriptions.pop((client_id, share_group, topic_filter), None)
        if cls is None:
            return []
        clients = self._class_clients.get(cls, {})
        left = clients.get(client_id, 0) - 1
        if left > 0:
            clients[client_id] = left
        else:
            clients.pop(client_id, None)
            if not clients:
                self._class_clients.pop(cls, None)
        changes = _count_down(self._class_counts, cls)
        if share_group is not None:
            changes += _count_down(self._share_counts, share_topic(share_group, topic_filter))
        return changes

    def topics(self) -> list[str]:
        """Every overlay topic this broker subscribes (classes, then share groups)."""
        return [*self._class_counts, *self._share_counts]

    def classes(self) -> list[str]:
        return sorted(self._class_counts)

    def subscribed_by_others(self, cls: str, client_id: str) -> bool:
        """Whether a local client other than ``client_id`` subscribes a filter of class ``cls``."""
        return any(c == cls and key[0] != client_id for key, c in self._subscriptions.items())

    def clients_of(self, cls: str) -> list[str]:
        """The local clients with a subscription of class ``cls`` (shared ones included)."""
        return list(self._class_clients.get(cls, ()))

    def subscribes(self, cls: str) -> bool:
        """Whether some local subscription belongs to class ``cls``."""
        return cls in self._class_counts


def _count_up(counts: dict[str, int], topic: str) -> list[InterestChange]:
    """Only the first local subscriber joins the overlay topic."""
    counts[topic] = counts.get(topic, 0) + 1
    return [InterestChange(topic, True)] if counts[topic] == 1 else []


def _count_down(counts: dict[str, int], topic: str) -> list[InterestChange]:
    """... and only the last one leaving sends UNSUB (seed 003 §3.5.3)."""
    left = counts.get(topic, 0) - 1
    if left > 0:
        counts[topic] = left
        return []
    counts.pop(topic, None)
    return [InterestChange(topic, False)]
