"""Retained-message index: concrete topic -> value, matched by topic filter.

Follows MQTT 3.1.1 §3.3.1.3 / MQTT 5.0 §3.3.1.3 (one retained message per topic, delivered to
new matching subscriptions) with the matching rules of §4.7 (wildcards, the '$' rule
MQTT-4.7.2-1). Topics are stored in a trie with one dict per level, and ``match`` walks the trie
*by the filter*: a literal level follows one child, '+' fans out over one level, '#' collects a
subtree. A narrow filter therefore stays cheap with 100k retained topics.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from broker.mqtt.topics import validate_topic_filter, validate_topic_name

V = TypeVar("V")

_ABSENT = object()


class _Node:
    __slots__ = ("children", "parent", "topic", "value", "word")

    def __init__(self, parent: _Node | None, word: str, topic: str) -> None:
        self.parent = parent
        self.word = word
        self.topic = topic  # the full topic this node stands for
        self.children: dict[str, _Node] = {}
        self.value: object = _ABSENT


class RetainedIndex(Generic[V]):
    """Retained values by concrete topic name."""

    def __init__(self) -> None:
        self._root = _Node(None, "", "")
        self._by_topic: dict[str, _Node] = {}

    def __len__(self) -> int:
        return len(self._by_topic)

    def __contains__(self, topic: object) -> bool:
        return topic in self._by_topic

    def set(self, topic: str, value: V) -> None:
        """Store (or replace) the retained value of ``topic``; raises ``TopicError`` for a bad name."""
        node = self._by_topic.get(topic)
        if node is None:
            validate_topic_name(topic)
            node = self._root
            for index, level in enumerate(topic.split("/")):
                child = node.children.get(level)
                if child is None:
                    prefix = level if index == 0 else node.topic + "/" + level
                    child = node.children[level] = _Node(node, level, prefix)
                node = child
            self._by_topic[topic] = node
        node.value = value

    def delete(self, topic: str) -> bool:
        """Forget the retained value of ``topic``; returns whether there was one."""
        node = self._by_topic.pop(topic, None)
        if node is None:
            return False
        node.value = _ABSENT
        while node.parent is not None and not node.children and node.value is _ABSENT:
            parent = node.parent
            del parent.children[node.word]
            node.parent = None
            node = parent
        return True

    def get(self, topic: str) -> V | None:
        node = self._by_topic.get(topic)
        return None if node is None else node.value  # type: ignore[return-value]

    def topics(self) -> Iterator[str]:
        return iter(list(self._by_topic))

    def match(self, topic_filter: str) -> Iterator[tuple[str, V]]:
        """All retained (topic, value) whose topic matches ``topic_filter``.

        The result is collected before it is returned, so the index may be changed while the
        caller iterates. Raises ``TopicError`` (0x8F) for an invalid filter.
        """
        validate_topic_filter(topic_filter)
        if "+" not in topic_filter and "#" not in topic_filter:
            node = self._by_topic.get(topic_filter)
            if node is None:
                return iter(())
            return iter([(topic_filter, node.value)])  # type: ignore[list-item]
        found: list[tuple[str, V]] = []
        levels = topic_filter.split("/")
        nodes = [self._root]
        for index, level in enumerate(levels):
            following: list[_Node] = []
            if level == "#":
                for node in nodes:
                    self._collect_subtree(node, found, skip_dollar=index == 0)
                return iter(found)
            if level == "+":
                for node in nodes:
                    if index == 0:
                        following.extend(c for w, c in node.children.items() if not w.startswith("$"))
                    else:
                        following.extend(node.children.values())
            else:
                for node in nodes:
                    child = node.children.get(level)
                    if child is not None:
                        following.append(child)
            if not following:
                return iter(found)
            nodes = following
        for node in nodes:
            if node.value is not _ABSENT:
                found.append((node.topic, node.value))  # type: ignore[arg-type]
        return iter(found)

    @staticmethod
    def _collect_subtree(start: _Node, found: list[tuple[str, V]], *, skip_dollar: bool) -> None:
        """Everything at and below ``start`` ('#' matches the parent level too)."""
        if start.parent is not None and start.value is not _ABSENT:
            found.append((start.topic, start.value))  # type: ignore[arg-type]
        if skip_dollar:
            stack = [c for w, c in start.children.items() if not w.startswith("$")]
        else:
            stack = list(start.children.values())
        while stack:
            node = stack.pop()
            if node.value is not _ABSENT:
                found.append((node.topic, node.value))  # type: ignore[arg-type]
            stack.extend(node.children.values())
