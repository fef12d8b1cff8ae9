"""Topic authorization in the shape of mosquitto's ``acl_file`` (MQTT 5.0 §5.4.2).

The ACL file's format and its rules (``Acl.parse``, ``parse_acl_rule``), the per-client compiled
rules with their decision caches, and the sections the admin API composes with the file's
(``sections``, ``compose``, ``to_text`` for export).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.auth.files import AuthFileError, read_lines
from broker.mqtt.topics import (
    SubscriptionTrie,
    TopicError,
    filter_covers,
    parse_shared,
    validate_topic_filter,
)

_READ = 1
_WRITE = 2
_DENY = 4
_ACCESS = {"read": _READ, "write": _WRITE, "readwrite": _READ | _WRITE, "deny": _DENY}
ACCESS_NAMES = {value: name for name, value in _ACCESS.items()}  # access bits -> the file's word
_UNSAFE_SUBSTITUTION = ("+", "#", "/")
_CLIENT_CACHE_SIZE = 10_000
_DECISION_CACHE_SIZE = 1024


@dataclass(frozen=True, slots=True)
class _Rule:
    access: int
    topic_filter: str


class _FilterSet:
    """A set of topic filters answering "does any filter match this topic / cover this filter"."""

    __slots__ = ("_filters", "_trie")

    def __init__(self, filters: list[str]) -> None:
        self._filters = list(dict.fromkeys(filters))
        self._trie: SubscriptionTrie[int, None] = SubscriptionTrie(cache_size=256)
        for topic_filter in self._filters:
            self._trie.add(topic_filter, 0, None)

    def matches(self, topic: str) -> bool:
        return bool(self._filters) and self._trie.has_match(topic)

    def covers(self, topic_filter: str) -> bool:
        return any(filter_covers(rule, topic_filter) for rule in self._filters)


class _ClientRules:
    """The rules of one (client id, user name), compiled, with small per-topic decision caches."""

    __slots__ = ("_deny", "_publish_cache", "_read", "_receive_cache", "_write", "deny_all")

    def __init__(self, rules: list[_Rule], *, deny_all: bool = False) -> None:
        self.deny_all = deny_all
        self._read = _FilterSet([r.topic_filter for r in rules if r.access & _READ])
        self._write = _FilterSet([r.topic_filter for r in rules if r.access & _WRITE])
        self._deny = _FilterSet([r.topic_filter for r in rules if r.access & _DENY])
        self._publish_cache: dict[str, bool] = {}
        self._receive_cache: dict[str, bool] = {}

    def can_publish(self, topic: str) -> bool:
        decision = self._publish_cache.get(topic)
        if decision is None:
            decision = self._decide(self._publish_cache, self._write, topic)
        return decision

    def can_receive(self, topic: str) -> bool:
        decision = self._receive_cache.get(topic)
        if decision is None:
            decision = self._decide(self._receive_cache, self._read, topic)
        return decision

    def _decide(self, cache: dict[str, bool], granted: _FilterSet, topic: str) -> bool:
        """The decision for ``topic`` when ``granted`` holds the grants, remembered in ``cache``."""
        decision = not self.deny_all and granted.matches(topic) and not self._deny.matches(topic)
        if len(cache) >= _DECISION_CACHE_SIZE:
            cache.clear()
        cache[topic] = decision
        return decision

    def can_subscribe(self, topic_filter: str) -> bool:
        return not self.deny_all and self._read.covers(topic_filter) and not self._deny.covers(topic_filter)


class Acl:
    """Topic authorization in the shape of mosquitto's ``acl_file``.

    ``topic [read|write|readwrite|deny] <filter>`` lines before any ``user`` line apply to
    anonymous clients; ``user <name>`` starts that user's section; ``pattern [access] <filter>``
    lines (anywhere) apply to every client with %c -> client id and %u -> user name (a pattern
    using %u never applies to an anonymous client). The access defaults to readwrite. Anything
    not granted is denied; ``deny`` wins over grants. As in mosquitto, '#' and '+' filters do not
    match '$' topics unless the rule starts with '$'.

    Like mosquitto (CVE-2017-7650), a client whose id or user name contains '+', '#' (or, stricter,
    '/') is denied everything when a pattern would substitute that value: it could otherwise widen
    a pattern into another client's topics.

    Subscribing to a filter needs a read rule whose filter covers it ("a/#" covers "a/b/+",
    "a/+" does not cover "a/#") and no deny rule covering it; a subscription partly overlapping
    a deny rule is allowed and ``can_receive`` then withholds the denied topics.
    """

    def __init__(
        self,
        *,
        anonymous_rules: list[_Rule] | None = None,
        user_rules: dict[str, list[_Rule]] | None = None,
        pattern_rules: list[_Rule] | None = None,
        allow_everything: bool = False,
    ) -> None:
        self._allow_everything = allow_everything
        self._anonymous_rules = anonymous_rules or []
        self._user_rules = user_rules or {}
        self._pattern_rules = pattern_rules or []
        self._clients: dict[tuple[str, str | None], _ClientRules] = {}

    @classmethod
    def allow_all(cls) -> Acl:
        return cls(allow_everything=True)

    @classmethod
    def load(cls, path: str) -> Acl:
        return cls.parse(read_lines(path, "ACL file"), path=path)

    @classmethod
    def parse(cls, lines: list[str], *, path: str = "<acl>") -> Acl:
        anonymous: list[_Rule] = []
        users: dict[str, list[_Rule]] = {}
        patterns: list[_Rule] = []
        current = anonymous
        for line_no, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            keyword, _, rest = line.partition(" ")
            if "\t" in keyword:
                keyword, _, more = keyword.partition("\t")
                rest = more + " " + rest
            rest = rest.strip()
            if keyword == "user":
                if not rest:
                    raise AuthFileError(path, line_no, "expected a user name after 'user'")
                current = users.setdefault(rest, [])
            elif keyword in ("topic", "pattern"):
                rule = _parse_rule(keyword, rest, path, line_no)
                (patterns if keyword == "pattern" else current).append(rule)
            else:
                raise AuthFileError(path, line_no, f"expected 'topic', 'user' or 'pattern', got {keyword!r}")
        return cls(anonymous_rules=anonymous, user_rules=users, pattern_rules=patterns)

    def _rules_for(self, client_id: str, username: str | None) -> _ClientRules:
        key = (client_id, username)
        compiled = self._clients.get(key)
        if compiled is None:
            compiled = self._compile(client_id, username)
            if len(self._clients) >= _CLIENT_CACHE_SIZE:
                del self._clients[next(iter(self._clients))]
            self._clients[key] = compiled
        return compiled

    def _compile(self, client_id: str, username: str | None) -> _ClientRules:
        rules = list(self._anonymous_rules if username is None else self._user_rules.get(username, ()))
        for pattern in self._pattern_rules:
            text = pattern.topic_filter
            if "%u" in text:
                if username is None:
                    continue
                if any(ch in username for ch in _UNSAFE_SUBSTITUTION):
                    return _ClientRules([], deny_all=True)
                text = text.replace("%u", username)
            if "%c" in text:
                if any(ch in client_id for ch in _UNSAFE_SUBSTITUTION):
                    return _ClientRules([], deny_all=True)
                text = text.replace("%c", client_id)
            try:
                validate_topic_filter(text)
            except TopicError:
                return _ClientRules([], deny_all=True)  # e.g. NUL in an id: refuse rather than guess
            rules.append(_Rule(pattern.access, text))
        return _ClientRules(rules)

    # ------------------------------------------------------------ sections (admin API)
    def sections(self) -> dict[tuple[str, str], list[_Rule]]:
        """The rules by section: ("anonymous", ""), ("user", name), ("patterns", "")."""
        result: dict[tuple[str, str], list[_Rule]] = {}
        if self._anonymous_rules:
            result[("anonymous", "")] = list(self._anonymous_rules)
        for name, rules in self._user_rules.items():
            result[("user", name)] = list(rules)
        if self._pattern_rules:
            result[("patterns", "")] = list(self._pattern_rules)
        return result

    @classmethod
    def from_sections(cls, sections: dict[tuple[str, str], list[_Rule]]) -> Acl:
        return cls(
            anonymous_rules=list(sections.get(("anonymous", ""), ())),
            user_rules={name: list(rules) for (kind, name), rules in sections.items() if kind == "user"},
            pattern_rules=list(sections.get(("patterns", ""), ())),
        )

    @classmethod
    def compose(cls, base: Acl | None, overrides: dict[tuple[str, str], list[_Rule]]) -> Acl | None:
        """``base`` (the ACL file's, None without one) with ``overrides`` (the admin API's
        sections) replacing its sections of the same key. None when neither has any rule: without
        an ACL file and dynamic rules every client may do everything, as before."""
        if base is None and not overrides:
            return None
        sections = base.sections() if base is not None else {}
        sections.update(overrides)
        return cls.from_sections(sections)

    def to_text(self) -> str:
        """The rules in the ACL file's format (export); ``Acl.parse`` reads it back."""
        lines: list[str] = []
        for rule in self._anonymous_rules:
            lines.append(f"topic {ACCESS_NAMES[rule.access]} {rule.topic_filter}")
        for rule in self._pattern_rules:
            lines.append(f"pattern {ACCESS_NAMES[rule.access]} {rule.topic_filter}")
        for name, rules in self._user_rules.items():
            lines.append("")
            lines.append(f"user {name}")
            lines.extend(f"topic {ACCESS_NAMES[rule.access]} {rule.topic_filter}" for rule in rules)
        return "\n".join(lines).lstrip("\n") + "\n"

    def forget(self, client_id: str, username: str | None) -> None:
        """Drop the compiled rules of a client (e.g. when its session ends)."""
        self._clients.pop((client_id, username), None)

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        if self._allow_everything:
            return True
        return self._rules_for(client_id, username).can_publish(topic)

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        """May the client subscribe to ``topic_filter`` ("$share/group/filter" checks the filter)?"""
        if self._allow_everything:
            return True
        try:
            _group, inner = parse_shared(topic_filter)
        except TopicError:
            return False
        return self._rules_for(client_id, username).can_subscribe(inner)

    def can_receive(self, client_id: str, username: str | None, topic: str) -> bool:
        if self._allow_everything:
            return True
        return self._rules_for(client_id, username).can_receive(topic)


def _parse_rule(keyword: str, rest: str, path: str, line_no: int) -> _Rule:
    expected = f"expected '{keyword} [read|write|readwrite|deny] <topic filter>'"
    if not rest:
        raise AuthFileError(path, line_no, expected)
    first, _, remainder = rest.partition(" ")
    if "\t" in first:
        first, _, more = first.partition("\t")
        remainder = more + " " + remainder
    if first in _ACCESS:
        access = _ACCESS[first]
        topic_filter = remainder.strip()
        if not topic_filter:
            raise AuthFileError(path, line_no, f"expected a topic filter after '{keyword} {first}'")
    else:
        access = _READ | _WRITE
        topic_filter = rest
    try:
        validate_topic_filter(topic_filter)
    except TopicError as exc:
        raise AuthFileError(path, line_no, f"invalid topic filter: {exc}")
    return _Rule(access, topic_filter)


AclRule = _Rule


def parse_acl_rule(keyword: str, rest: str) -> _Rule:
    """One rule as an ACL file line after its keyword (``topic`` or ``pattern``) states it, e.g.
    ``parse_acl_rule("topic", "read a/#")``; ValueError naming what is wrong."""
    try:
        return _parse_rule(keyword, rest, "rule", 0)
    except AuthFileError as exc:
        raise ValueError(exc.problem) from None
