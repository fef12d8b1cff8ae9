"""Routing keys of the two SIONet routing modes (seed 000 §3.7.2).

* **type only** ("vocabulary-concept routing"): a router registers only the event *type* of a
  filter upstream - here the filter's topic class (``broker.cluster.classes``) - and the exact
  match happens at the destination. Cheap set-up (many filters share one class), some wasted
  events (a class carries topics no filter at the destination matches).
* **full filter** ("vocabulary routing"): a router registers the filter itself, so every router
  filters completely: no wasted event, one set-up message per distinct filter.

A key is ``"t:" + class`` or ``"f:" + filter``, so both modes can coexist in one event place
(the mode is chosen per place, or per filter when it is registered).
"""

from __future__ import annotations

from enum import StrEnum

from broker.cluster.classes import filter_class, topic_classes
from broker.mqtt.topics import topic_matches


class RoutingMode(StrEnum):
    TYPE_ONLY = "type_only"
    FULL_FILTER = "full_filter"


TYPE_PREFIX = "t:"
FILTER_PREFIX = "f:"


def key_for(topic_filter: str, mode: RoutingMode, class_levels: int) -> str:
    """The routing key a (validated, non-shared) filter registers in ``mode``."""
    if mode is RoutingMode.TYPE_ONLY:
        return TYPE_PREFIX + filter_class(topic_filter, class_levels)
    return FILTER_PREFIX + topic_filter


class TopicView:
    """One event's topic, with its classes computed once for matching many keys."""

    __slots__ = ("_class_keys", "topic")

    def __init__(self, topic: str, class_levels: int) -> None:
        self.topic = topic
        self._class_keys = {TYPE_PREFIX + name for name in topic_classes(topic, class_levels)}

    def matches(self, key: str) -> bool:
        if key.startswith(TYPE_PREFIX):
            return key in self._class_keys
        return topic_matches(key[len(FILTER_PREFIX) :], self.topic)
