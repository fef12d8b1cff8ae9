"""MQTT topic names, topic filters, shared-subscription names and a fast subscription trie.

Follows MQTT 3.1.1 §4.7 and MQTT 5.0 §4.7 (topic names and filters, wildcards, the '$' rule
MQTT-4.7.2-1) and MQTT 5.0 §4.8.2 (shared subscriptions "$share/{ShareName}/{filter}").

``SubscriptionTrie`` keeps one dict per topic level, so matching a topic costs O(levels x
matching wildcard branches), independent of the number of unrelated subscriptions. Match results
are cached per concrete topic as the list of *subscriber dicts* that match (not copies of the
entries), so adding/removing a subscriber of a filter that has a dict never invalidates the cache;
creating a filter that did not exist before does (an exact filter evicts one cached topic, a
wildcard filter clears the cache), and so does any change to a filter's single subscriber, which
is held as a (key, value) tuple instead of a one-entry dict (56 bytes instead of 184 per filter).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Generic, TypeVar

from broker.mqtt.packets import ReasonCode

K = TypeVar("K")
V = TypeVar("V")

MAX_TOPIC_LENGTH_BYTES = 65535
SHARE_PREFIX = "$share/"


class TopicError(ValueError):
    """An invalid topic name or topic filter. ``reason_code`` is the MQTT 5 reason code to use."""

    def __init__(self, message: str, reason_code: int) -> None:
        super().__init__(message)
        self.reason_code = int(reason_code)


def _check_common(text: str, what: str, reason_code: int) -> None:
    if not isinstance(text, str):
        raise TopicError(f"{what} must be a str, got {type(text).__name__}", reason_code)
    if not text:
        raise TopicError(f"{what} must not be empty (MQTT-4.7.3-1)", reason_code)
    if "\x00" in text:
        raise TopicError(f"{what} {text!r} contains the null character U+0000 (MQTT-1.5.3-2)", reason_code)
    if len(text) * 4 > MAX_TOPIC_LENGTH_BYTES and len(text.encode("utf-8")) > MAX_TOPIC_LENGTH_BYTES:
        raise TopicError(f"{what} is longer than {MAX_TOPIC_LENGTH_BYTES} bytes of UTF-8", reason_code)


def validate_topic_name(name: str) -> None:
    """Raise ``TopicError`` (0x90 TOPIC_NAME_INVALID) unless ``name`` is a valid PUBLISH topic name."""
    code = ReasonCode.TOPIC_NAME_INVALID
    _check_common(name, "topic name", code)
    if "+" in name or "#" in name:
        raise TopicError(f"topic name {name!r} must not contain wildcards '+' or '#' (MQTT-3.3.2-2)", code)


def validate_topic_filter(topic_filter: str) -> None:
    """Raise ``TopicError`` (0x8F TOPIC_FILTER_INVALID) unless ``topic_filter`` is a valid filter.

    '#' must be the last character and alone in its level (MQTT-4.7.1-2); '+' must occupy a
    whole level (MQTT-4.7.1-3). Shared filters are syntactically ordinary filters here; use
    ``parse_shared`` to check the share name.
    """
    code = ReasonCode.TOPIC_FILTER_INVALID
    _check_common(topic_filter, "topic filter", code)
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != last):
            raise TopicError(
                f"topic filter {topic_filter!r}: '#' must be alone in the last level (MQTT-4.7.1-2)", code
            )
        if "+" in level and level != "+":
            raise TopicError(
                f"topic filter {topic_filter!r}: '+' must occupy a whole level (MQTT-4.7.1-3)", code
            )


def parse_shared(topic_filter: str) -> tuple[str | None, str]:
    """Split a shared subscription "$share/group/filter" into ("group", "filter") (MQTT 5 §4.8.2).

    A non-shared filter returns (None, topic_filter) unchanged. The share name must be non-empty
    and contain no '/', '+' or '#'; the filter after it must be a valid, non-empty topic filter.
    Raises ``TopicError`` with reason code 0x8F otherwise.
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        return None, topic_filter
    code = ReasonCode.TOPIC_FILTER_INVALID
    rest = topic_filter[len(SHARE_PREFIX) :]
    group, slash, inner = rest.partition("/")
    if not group:
        raise TopicError(f"shared subscription {topic_filter!r} has an empty share name (MQTT-4.8.2-1)", code)
    if "+" in group or "#" in group:
        raise TopicError(
            f"shared subscription {topic_filter!r}: share name {group!r} must not contain '+' or '#' "
            "(MQTT-4.8.2-2)",
            code,
        )
    if not slash or not inner:
        raise TopicError(
            f"shared subscription {topic_filter!r} has no topic filter after the share name (MQTT-4.8.2-2)",
            code,
        )
    validate_topic_filter(inner)
    return group, inner


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Reference (slow, obviously correct) matcher: does ``topic_filter`` match concrete ``topic``?"""
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    if topic.startswith("$") and filter_levels[0] in ("+", "#"):
        return False  # MQTT-4.7.2-1
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True  # matches the parent level and everything below
        if index >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[index]:
            return False
    return len(filter_levels) == len(topic_levels)


def filter_covers(wide_filter: str, narrow_filter: str) -> bool:
    """True if every topic matched by ``narrow_filter`` is also matched by ``wide_filter``.

    "a/#" covers "a/b/+", "a" and "a/#"; "a/+" covers "a/b" but not "a/#" nor "a"; "#" does not
    cover "$SYS/x" (the '$' rule).
    """
    wide = wide_filter.split("/")
    narrow = narrow_filter.split("/")
    if narrow[0].startswith("$") and wide[0] in ("+", "#"):
        return False
    for index, level in enumerate(wide):
        if level == "#":
            return True
        if index >= len(narrow):
            return False
        other = narrow[index]
        if other == "#":
            # "P/#" matches the topic P itself and everything below it; "P/+/#" everything below
            # P only. They match the same topics when P is the empty topic, which no topic is
            # (MQTT-4.7.3-1): "#" and "+/#", "/#" and "/+/#".
            return wide[index:] == ["+", "#"] and "/".join(narrow[:index]) == ""
        if level == "+":
            continue
        if other == "+" or other != level:
            return False
    return len(wide) == len(narrow)


class _Node(Generic[K, V]):
    """One trie level. ``exact`` holds subscribers whose filter ends here; ``multi`` those of
    "<this prefix>/#"; ``single`` is the '+' child. Dicts (``children`` too) are created lazily
    and never reused once detached, so the match cache may hold references to them safely.

    ``exact_filter`` / ``multi_filter`` (the full filter strings of the match results) are set
    when the bucket is created, to the subscriber's own filter string: a node that only leads
    further holds neither, and the strings are shared with the sessions' subscription records
    (each client's own filter costs two nodes; idle memory: docs/benchmarks.md).

    ``children`` is the only child node itself while there is one (most nodes below a device's
    own level: "<device>/status"), a dict by word from the second child on: a one-entry dict
    costs 184 bytes per node.

    ``exact`` / ``multi`` hold a single subscriber as a ``(key, value)`` tuple (56 bytes, where a
    one-entry dict costs 184: most filters are one device's own), and a dict by key from the
    second subscriber on. A tuple is replaced, never changed, so the trie drops the cached
    results of its filter whenever it replaces or removes one (``SubscriptionTrie._put``)."""

    __slots__ = ("children", "exact", "exact_filter", "multi", "multi_filter", "parent", "single", "word")

    def __init__(self, parent: _Node[K, V] | None, word: str) -> None:
        self.parent = parent
        self.word = word
        self.children: dict[str, _Node[K, V]] | _Node[K, V] | None = None
        self.single: _Node[K, V] | None = None
        self.exact: _Subscribers[K, V] | None = None
        self.multi: _Subscribers[K, V] | None = None
        self.exact_filter = ""
        self.multi_filter = ""

    def is_empty(self) -> bool:
        return not self.children and self.single is None and self.exact is None and self.multi is None

    def child(self, word: str) -> _Node[K, V] | None:
        children = self.children
        if children is None:
            return None
        if children.__class__ is _Node:
            return children if children.word == word else None
        return children.get(word)  # type: ignore[union-attr]

    def child_nodes(self) -> list[_Node[K, V]]:
        children = self.children
        if children is None:
            return []
        if isinstance(children, _Node):
            return [children]
        return list(children.values())


# A word is interned (one string for every node of that word) where its level is narrow: below a
# level with this many children the words are identifiers (device ids, one each), and interning
# them would only grow the interpreter's table of interned strings.
INTERN_BELOW_CHILDREN = 16


# the subscribers of one filter: one as (key, value), two or more as a dict by key
_Subscribers = dict[K, V] | tuple[K, V]
_Bucket = tuple[str, dict | tuple]  # (filter, subscribers) as stored in the match cache


class SubscriptionTrie(Generic[K, V]):
    """Subscriptions keyed by (topic filter, key) with O(levels) matching of concrete topics.

    ``key`` is typically a client id (or a (share group, client id) pair); ``value`` the
    subscription options. Filters are validated on ``add`` (``TopicError`` 0x8F).
    """

    def __init__(self, *, cache_size: int = 4096) -> None:
        self._root: _Node[K, V] = _Node(None, "")
        # the (filter, key) entries held; a plain attribute, so that the publish path reads it
        # without a call (``len`` calls ``__len__``)
        self.count = 0
        self._cache: dict[str, list[_Bucket]] = {}
        self._cache_size = cache_size
        self.cache_hits = 0
        self.cache_misses = 0
        # bumped by every add and remove: a caller's own per-topic results built from ``match``
        # (the router's delivery plans) are valid while it is unchanged
        self.version = 0

    def __len__(self) -> int:
        return self.count

    # -- lookup helpers -------------------------------------------------------------------------

    def _find(self, topic_filter: str) -> tuple[_Node[K, V] | None, bool]:
        """Node owning ``topic_filter`` and whether the filter ends with '#'."""
        levels = topic_filter.split("/")
        multi = levels[-1] == "#"
        if multi:
            levels.pop()
        node: _Node[K, V] | None = self._root
        for level in levels:
            assert node is not None
            node = node.single if level == "+" else node.child(level)
            if node is None:
                return None, multi
        return node, multi

    # -- mutation -------------------------------------------------------------------------------

    def add(self, topic_filter: str, key: K, value: V) -> V | None:
        """Add or replace the subscription (topic_filter, key); returns the previous value or None."""
        validate_topic_filter(topic_filter)
        self.version += 1
        levels = topic_filter.split("/")
        multi = levels[-1] == "#"
        if multi:
            levels.pop()
        node = self._root
        for level in levels:
            if level == "+":
                nxt = node.single
                if nxt is None:
                    nxt = node.single = _Node(node, "+")
            else:
                nxt = node.child(level)
                if nxt is None:
                    children = node.children
                    if (
                        children is None
                        or isinstance(children, _Node)
                        or len(children) < INTERN_BELOW_CHILDREN
                    ):
                        level = sys.intern(level)  # one string per word ("status" of 10,000 devices)
                    nxt = _Node(node, level)
                    if children is None:
                        node.children = nxt
                    elif isinstance(children, _Node):
                        node.children = {children.word: children, level: nxt}
                    else:
                        children[level] = nxt
            node = nxt
        if multi:
            if node.multi is None:
                node.multi_filter = topic_filter
            node.multi, previous = self._put(node.multi, topic_filter, key, value)
        else:
            if node.exact is None:
                node.exact_filter = topic_filter
            node.exact, previous = self._put(node.exact, topic_filter, key, value)
        return previous

    def _put(
        self, bucket: _Subscribers[K, V] | None, topic_filter: str, key: K, value: V
    ) -> tuple[_Subscribers[K, V], V | None]:
        """``bucket`` with (key, value) in it, and the value it replaced (None if new)."""
        if bucket is None:
            self._invalidate(topic_filter)
            self.count += 1
            return (key, value), None
        if isinstance(bucket, tuple):
            # the match cache holds the tuple itself: its filter's cached results go
            self._invalidate(topic_filter)
            old_key, old_value = bucket
            if old_key == key:
                return (key, value), old_value
            self.count += 1
            return {old_key: old_value, key: value}, None
        previous = bucket.get(key)
        if previous is None and key not in bucket:
            self.count += 1
        bucket[key] = value
        return bucket, previous

    def remove(self, topic_filter: str, key: K) -> V | None:
        """Remove (topic_filter, key); returns its value, or None if it was not there."""
        node, multi = self._find(topic_filter)
        if node is None:
            return None
        bucket = node.multi if multi else node.exact
        if bucket is None:
            return None
        if isinstance(bucket, tuple):
            if bucket[0] != key:
                return None
            value = bucket[1]
            self._invalidate(topic_filter)  # the cache holds the tuple itself
            bucket = None
        else:
            if key not in bucket:
                return None
            value = bucket.pop(key)
        self.count -= 1
        self.version += 1
        if not bucket:
            # Detach the empty dict (cached buckets keep referencing it harmlessly: it stays
            # empty forever) and prune nodes that no longer lead anywhere.
            if multi:
                node.multi = None
            else:
                node.exact = None
            self._prune(node)
        return value

    def _prune(self, node: _Node[K, V]) -> None:
        while node.parent is not None and node.is_empty():
            parent = node.parent
            if node.word == "+" and parent.single is node:
                parent.single = None
            else:
                children = parent.children
                if children is node:
                    parent.children = None
                elif isinstance(children, dict):
                    children.pop(node.word, None)
                    if len(children) == 1:
                        parent.children = next(iter(children.values()))
                    elif not children:
                        parent.children = None
            node.parent = None
            node = parent

    def _invalidate(self, topic_filter: str) -> None:
        """A new (previously absent) filter appeared, or the single-subscriber tuple of one was
        replaced: drop cached results it could change."""
        if not self._cache:
            return
        if "+" in topic_filter or "#" in topic_filter:
            self._cache.clear()
        else:
            self._cache.pop(topic_filter, None)

    def clear_cache(self) -> None:
        self._cache.clear()

    # -- queries --------------------------------------------------------------------------------

    def get(self, topic_filter: str, key: K) -> V | None:
        node, multi = self._find(topic_filter)
        if node is None:
            return None
        bucket = node.multi if multi else node.exact
        if bucket is None:
            return None
        if isinstance(bucket, tuple):
            return bucket[1] if bucket[0] == key else None
        return bucket.get(key)

    def _buckets(self, topic: str) -> list[_Bucket]:
        buckets: list[_Bucket] = []
        nodes = [self._root]
        dollar = topic.startswith("$")
        for level in topic.split("/"):
            following: list[_Node[K, V]] = []
            for node in nodes:
                if node.multi is not None and not (dollar and node is self._root):
                    buckets.append((node.multi_filter, node.multi))
                children = node.children
                if children is not None:
                    if children.__class__ is _Node:
                        if children.word == level:
                            following.append(children)
                    else:
                        child = children.get(level)  # type: ignore[union-attr]
                        if child is not None:
                            following.append(child)
                if node.single is not None and not (dollar and node is self._root):
                    following.append(node.single)
            if not following:
                return buckets
            nodes = following
        for node in nodes:
            if node.exact is not None:
                buckets.append((node.exact_filter, node.exact))
            if node.multi is not None:  # "sport/#" matches "sport"
                buckets.append((node.multi_filter, node.multi))
        return buckets

    def match(self, topic: str) -> list[tuple[str, K, V]]:
        """Every subscription whose filter matches the concrete ``topic``: (filter, key, value)."""
        buckets = self._cache.get(topic)
        if buckets is None:
            self.cache_misses += 1
            buckets = self._buckets(topic)
            cache = self._cache
            if len(cache) >= self._cache_size:
                del cache[next(iter(cache))]  # evict the oldest entry
            cache[topic] = buckets
        else:
            self.cache_hits += 1
        matches: list[tuple[str, K, V]] = []
        for flt, bucket in buckets:
            if isinstance(bucket, tuple):
                matches.append((flt, bucket[0], bucket[1]))
            else:
                matches.extend([(flt, key, value) for key, value in bucket.items()])
        return matches

    def has_match(self, topic: str) -> bool:
        """True if at least one subscription matches ``topic`` (cheaper than ``match``)."""
        buckets = self._cache.get(topic)
        if buckets is None:
            return bool(self.match(topic))
        return any(bucket for _f, bucket in buckets)

    def filters(self) -> Iterator[str]:
        """Every topic filter that currently has at least one subscription."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.exact:
                yield node.exact_filter
            if node.multi:
                yield node.multi_filter
            if node.children is not None:
                stack.extend(node.child_nodes())
            if node.single is not None:
                stack.append(node.single)

    def items(self) -> Iterator[tuple[str, K, V]]:
        """Every (filter, key, value) in the trie."""
        for topic_filter in list(self.filters()):
            node, multi = self._find(topic_filter)
            if node is None:
                continue
            bucket = node.multi if multi else node.exact
            if isinstance(bucket, tuple):
                yield topic_filter, bucket[0], bucket[1]
                continue
            for key, value in list((bucket or {}).items()):
                yield topic_filter, key, value
