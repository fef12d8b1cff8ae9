"""Topic classes: the overlay's routing unit for MQTT topics and wildcard filters.

The overlay of seed 003 routes flat topic names; MQTT topics have levels and filters have
wildcards. SkipMQ routes on a *topic class* and every broker does the exact MQTT match locally,
SIONet's vocabulary-concept routing (seed 000: route by event type, match at the destination;
design.md "Overlay"). With ``k`` = ``cluster.class_levels``:

* **exact class** ``"=" + first k levels`` of a topic (all levels when it has fewer). A filter
  whose first k levels hold no wildcard belongs to the exact class of those levels.
* **wildcard class** ``"*<j>:" + first j levels`` for a filter whose first wildcard (``+`` or
  ``#``) is at level ``j < k``. A topic is published on its exact class and on the wildcard
  classes of its prefixes ``j = 0 .. min(levels, k - 1)``, but the overlay forwards nothing on
  a class nobody subscribes (rendezvous point, §3.2), so the extra classes cost a virtual node
  and nothing per message until a wildcard subscriber exists.

Every local subscription belongs to exactly one class, and a message received on class ``c``
is delivered only to the local subscriptions of class ``c`` (``filter_class(f) == c``): a broker
holding subscriptions of two classes that both match a topic still delivers each subscription
one copy. Wasted forwards are the messages of a class that match no filter of the receiving
broker (e.g. ``=sensors`` carries ``sensors/a`` to a broker subscribed to ``sensors/b`` only);
a larger ``k`` makes classes narrower (fewer wasted forwards) at the price of more classes and
of filters with wildcards in their first k levels falling into wildcard classes.

Class names never start with ``$``, never equal the overlay anchor topic ``""`` and cannot
collide with the cluster's own control topics (which start with ``!``).
"""

from __future__ import annotations

EXACT_PREFIX = "="
WILDCARD_PREFIX = "*"


def _wildcard_class(depth: int, levels: list[str]) -> str:
    return f"{WILDCARD_PREFIX}{depth}:" + "/".join(levels[:depth])


def filter_class(topic_filter: str, class_levels: int) -> str:
    """The class a (validated, non-shared) MQTT filter subscribes to."""
    levels = topic_filter.split("/")
    for depth, level in enumerate(levels[:class_levels]):
        if level in ("+", "#"):
            return _wildcard_class(depth, levels)
    return EXACT_PREFIX + "/".join(levels[:class_levels])


def topic_classes(topic: str, class_levels: int) -> list[str]:
    """Every class a message on ``topic`` is published on: the exact class first, then the
    wildcard classes of its prefixes (from the shortest)."""
    levels = topic.split("/")
    classes = [EXACT_PREFIX + "/".join(levels[:class_levels])]
    for depth in range(min(len(levels), class_levels - 1) + 1):
        classes.append(_wildcard_class(depth, levels))
    return classes


def is_wildcard_class(name: str) -> bool:
    return name.startswith(WILDCARD_PREFIX)
