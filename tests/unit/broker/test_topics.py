"""Tests for broker/mqtt/topics.py: validation, shared names, the reference matcher and the trie.

Examples follow MQTT 3.1.1 §4.7 / MQTT 5.0 §4.7 (non-normative examples) and §4.8.2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parents[3]
from broker.mqtt.packets import ReasonCode  # noqa: E402
from broker.mqtt.topics import (  # noqa: E402
    SubscriptionTrie,
    TopicError,
    filter_covers,
    parse_shared,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "a/b", "/", "/a", "a/", "a//b", "$SYS/x", " ", "ü/ß", "x" * 65535])
def test_valid_topic_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "empty"),
        ("a/+", "wildcards"),
        ("a/#", "wildcards"),
        ("a+b", "wildcards"),
        ("a\x00b", "null"),
        ("x" * 65536, "65535"),
        ("é" * 40000, "65535"),  # 80000 bytes of UTF-8
    ],
)
def test_invalid_topic_names(name: str, fragment: str) -> None:
    with pytest.raises(TopicError) as info:
        validate_topic_name(name)
    assert info.value.reason_code == ReasonCode.TOPIC_NAME_INVALID == 0x90
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "topic_filter", ["#", "+", "a/#", "a/+/b", "+/+", "/+", "+/", "sport/tennis/#", "$share/g/a", "a//#"]
)
def test_valid_topic_filters(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    ("topic_filter", "fragment"),
    [
        ("", "empty"),
        ("sport/tennis#", "'#'"),  # §4.7.1.2 non-normative: not valid
        ("sport/tennis/#/ranking", "'#'"),  # §4.7.1.2 non-normative: not valid
        ("#/a", "'#'"),
        ("a/##", "'#'"),
        ("sport+", "'+'"),  # §4.7.1.3 non-normative: not valid
        ("a/b+/c", "'+'"),
        ("a\x00", "null"),
    ],
)
def test_invalid_topic_filters(topic_filter: str, fragment: str) -> None:
    with pytest.raises(TopicError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID == 0x8F
    assert fragment in str(info.value)


def test_topic_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        validate_topic_name("")


# -- shared subscriptions (MQTT 5 §4.8.2) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("$share/group/a/b", ("group", "a/b")),
        ("$share/consumer1/sport/tennis/+", ("consumer1", "sport/tennis/+")),
        ("$share/g/#", ("g", "#")),
        ("$share/g//a", ("g", "/a")),
        ("a/b", (None, "a/b")),
        ("$SYS/#", (None, "$SYS/#")),
        ("$shared/g/a", (None, "$shared/g/a")),
    ],
)
def test_parse_shared(topic_filter: str, expected: tuple[str | None, str]) -> None:
    assert parse_shared(topic_filter) == expected


@pytest.mark.parametrize(
    ("topic_filter", "fragment"),
    [
        ("$share/g", "no topic filter"),
        ("$share/g/", "no topic filter"),
        ("$share//a", "empty share name"),
        ("$share/", "empty share name"),
        ("$share/g+/a", "share name"),
        ("$share/#/a", "share name"),
        ("$share/g/a/#/b", "'#'"),
    ],
)
def test_parse_shared_errors(topic_filter: str, fragment: str) -> None:
    with pytest.raises(TopicError) as info:
        parse_shared(topic_filter)
    assert info.value.reason_code == 0x8F
    assert fragment in str(info.value)


# -- matching: spec examples ----------------------------------------------------------------------

SPEC_CASES = [
    # §4.7.1.2 multi-level wildcard
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    # §4.7.1.3 single-level wildcard
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+", "", True),
    # empty levels
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    ("a/+", "a/", True),
    ("+/a", "/a", True),
    ("a/#", "a/", True),
    ("a/b", "a/b/", False),
    # §4.7.2 topics beginning with $
    ("#", "$SYS/broker/clients", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
    ("+", "$", False),
    ("a/#", "a/$b", True),
    ("a/+", "a/$b", True),
    # case sensitivity and exactness
    ("ACCOUNTS", "Accounts", False),
    ("a/b", "a/b", True),
    ("a/b", "a", False),
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), SPEC_CASES)
def test_reference_matcher_spec_examples(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), SPEC_CASES)
def test_trie_spec_examples(topic_filter: str, topic: str, expected: bool) -> None:
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    trie.add(topic_filter, "client", 1)
    expected_result = [(topic_filter, "client", 1)] if expected else []
    assert trie.match(topic) == expected_result
    assert trie.match(topic) == expected_result  # again, now from the cache


def test_trie_returns_every_matching_subscription() -> None:
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    for index, topic_filter in enumerate(["#", "a/#", "a/+", "a/b", "+/b", "+/+", "a/b/#", "b/#", "a/c"]):
        trie.add(topic_filter, f"c{index}", index)
    trie.add("a/b", "other", 99)
    got = sorted(trie.match("a/b"))
    assert got == sorted(
        [
            ("#", "c0", 0),
            ("a/#", "c1", 1),
            ("a/+", "c2", 2),
            ("a/b", "c3", 3),
            ("a/b", "other", 99),
            ("+/b", "c4", 4),
            ("+/+", "c5", 5),
            ("a/b/#", "c6", 6),
        ]
    )
    assert sorted(trie.match("$x/b")) == []


# -- trie bookkeeping -------------------------------------------------------------------------------


def test_add_get_remove_bookkeeping() -> None:
    trie: SubscriptionTrie[str, str] = SubscriptionTrie()
    assert len(trie) == 0
    assert trie.add("a/+", "c1", "qos0") is None
    assert trie.add("a/+", "c1", "qos1") == "qos0"  # replacement returns the previous value
    assert len(trie) == 1
    assert trie.add("a/+", "c2", "qos2") is None
    assert trie.add("a/#", "c1", "x") is None
    assert len(trie) == 3
    assert trie.get("a/+", "c1") == "qos1"
    assert trie.get("a/+", "nobody") is None
    assert trie.get("a/b", "c1") is None
    assert trie.get("zz/#", "c1") is None
    assert sorted(trie.filters()) == ["a/#", "a/+"]
    assert trie.remove("a/+", "c1") == "qos1"
    assert trie.remove("a/+", "c1") is None
    assert trie.remove("never/seen", "c1") is None
    assert len(trie) == 2
    assert sorted(trie.match("a/z")) == [("a/#", "c1", "x"), ("a/+", "c2", "qos2")]
    assert trie.remove("a/+", "c2") == "qos2"
    assert trie.remove("a/#", "c1") == "x"
    assert len(trie) == 0
    assert list(trie.filters()) == []
    assert trie.match("a/z") == []
    # the trie pruned itself back to an empty root
    assert trie._root.is_empty()


def test_add_rejects_invalid_filter_and_keeps_state() -> None:
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    trie.add("ok", "c", 1)
    with pytest.raises(TopicError) as info:
        trie.add("a/#/b", "c", 1)
    assert info.value.reason_code == 0x8F
    assert len(trie) == 1
    assert list(trie.filters()) == ["ok"]


def test_value_none_is_a_real_subscription() -> None:
    trie: SubscriptionTrie[str, None] = SubscriptionTrie()
    trie.add("a", "c", None)
    trie.add("a", "c", None)
    assert len(trie) == 1
    assert trie.match("a") == [("a", "c", None)]
    trie.remove("a", "c")
    assert len(trie) == 0


def test_cache_sees_adds_and_removes() -> None:
    """Every kind of change after a topic was cached must show up in the next match."""
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    assert trie.match("a/b/c") == []
    trie.add("a/b/c", "exact", 1)  # new exact filter for the cached topic
    assert trie.match("a/b/c") == [("a/b/c", "exact", 1)]
    trie.add("a/+/c", "plus", 2)  # new wildcard filter
    assert sorted(trie.match("a/b/c")) == [("a/+/c", "plus", 2), ("a/b/c", "exact", 1)]
    trie.add("a/b/c", "exact", 3)  # value change of an existing subscription
    trie.add("a/b/c", "second", 4)  # new key on an existing filter
    assert sorted(trie.match("a/b/c")) == [
        ("a/+/c", "plus", 2),
        ("a/b/c", "exact", 3),
        ("a/b/c", "second", 4),
    ]
    trie.remove("a/b/c", "exact")
    trie.remove("a/b/c", "second")  # filter disappears entirely, node pruned
    assert trie.match("a/b/c") == [("a/+/c", "plus", 2)]
    trie.add("a/b/c", "back", 5)  # re-created after pruning
    assert sorted(trie.match("a/b/c")) == [("a/+/c", "plus", 2), ("a/b/c", "back", 5)]
    trie.remove("a/+/c", "plus")
    trie.add("#", "all", 6)
    assert sorted(trie.match("a/b/c")) == [("#", "all", 6), ("a/b/c", "back", 5)]
    assert trie.cache_hits > 0


def test_cache_is_bounded() -> None:
    trie: SubscriptionTrie[str, int] = SubscriptionTrie(cache_size=8)
    trie.add("#", "c", 1)
    for index in range(100):
        assert trie.match(f"t/{index}") == [("#", "c", 1)]
    assert len(trie._cache) <= 8


def test_has_match() -> None:
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    trie.add("a/+", "c", 1)
    assert trie.has_match("a/b")
    assert trie.has_match("a/b")  # cached
    assert not trie.has_match("b/a")
    trie.remove("a/+", "c")
    assert not trie.has_match("a/b")


def test_match_is_independent_of_unrelated_subscriptions() -> None:
    trie: SubscriptionTrie[int, int] = SubscriptionTrie()
    for index in range(20_000):
        trie.add(f"unrelated/{index}/+/x", index, index)
    trie.add("sensors/+/temp", -1, -1)
    assert trie.match("sensors/kitchen/temp") == [("sensors/+/temp", -1, -1)]
    assert len(trie) == 20_001


def test_items_lists_everything() -> None:
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    entries = {("a/+", "x", 1), ("a/+", "y", 2), ("#", "x", 3), ("/", "z", 4)}
    for topic_filter, key, value in entries:
        trie.add(topic_filter, key, value)
    assert set(trie.items()) == entries


# -- hypothesis: the trie agrees with the reference matcher --------------------------------------

LEVELS = ["a", "b", "", "$x"]
topic_levels = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=4)
topics = topic_levels.map("/".join).filter(bool)


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from([*LEVELS, "+"]), min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    if levels == [""]:
        levels = ["#"]
    return "/".join(levels)


@settings(max_examples=300, deadline=None)
@given(
    subscriptions=st.lists(st.tuples(topic_filters(), st.integers(0, 3)), max_size=25),
    removals=st.lists(st.tuples(topic_filters(), st.integers(0, 3)), max_size=10),
    probe_topics=st.lists(topics, min_size=1, max_size=10),
)
def test_trie_agrees_with_reference(
    subscriptions: list[tuple[str, int]], removals: list[tuple[str, int]], probe_topics: list[str]
) -> None:
    trie: SubscriptionTrie[int, str] = SubscriptionTrie(cache_size=4)
    model: dict[tuple[str, int], str] = {}
    for topic in probe_topics:  # warm the cache before the changes
        trie.match(topic)
    for topic_filter, key in subscriptions:
        value = f"{topic_filter}|{key}"
        assert trie.add(topic_filter, key, value) == model.get((topic_filter, key))
        model[(topic_filter, key)] = value
    for topic_filter, key in removals:
        assert trie.remove(topic_filter, key) == model.pop((topic_filter, key), None)
    assert len(trie) == len(model)
    assert set(trie.filters()) == {f for f, _k in model}
    for topic in probe_topics:
        expected = sorted((f, k, v) for (f, k), v in model.items() if topic_matches(f, topic))
        assert sorted(trie.match(topic)) == expected
        assert sorted(trie.match(topic)) == expected


@settings(max_examples=300, deadline=None)
@given(wide=topic_filters(), narrow=topic_filters(), probes=st.lists(topics, min_size=1, max_size=20))
def test_filter_covers_is_sound(wide: str, narrow: str, probes: list[str]) -> None:
    if filter_covers(wide, narrow):
        for topic in probes:
            if topic_matches(narrow, topic):
                assert topic_matches(wide, topic)


def _all_topics(max_levels: int) -> list[str]:
    result: list[list[str]] = [[]]
    out: list[str] = []
    for _ in range(max_levels):
        result = [[*prefix, level] for prefix in result for level in LEVELS]
        out.extend("/".join(levels) for levels in result)
    return [t for t in out if t]


ALL_TOPICS = _all_topics(5)


@settings(max_examples=200, deadline=None)
@given(wide=topic_filters(), narrow=topic_filters())
def test_filter_covers_is_exact_on_a_small_universe(wide: str, narrow: str) -> None:
    """Over every topic of up to 5 levels from the alphabet, 'covers' is exactly set inclusion."""
    narrow_set = {t for t in ALL_TOPICS if topic_matches(narrow, t)}
    wide_set = {t for t in ALL_TOPICS if topic_matches(wide, t)}
    # filters have at most 5 levels, so 5-level topics distinguish every case but "#"-tails, which
    # the universe also covers because a '#' filter of <=5 levels matches some 5-level topic.
    assert filter_covers(wide, narrow) == (narrow_set <= wide_set)


@pytest.mark.parametrize(
    ("wide", "narrow", "expected"),
    [
        ("a/#", "a/b/+", True),
        ("a/#", "a", True),
        ("a/#", "a/#", True),
        ("a/+", "a/#", False),
        ("a/+", "a", False),
        ("a/+", "a/b", True),
        ("a/+", "a/+", True),
        ("a/b", "a/+", False),
        ("#", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("+/x", "$a/x", False),
        ("#", "+/x", True),
        ("+/#", "#", True),
        ("/+/#", "/#", True),  # hypothesis found this one: "/#" matches no topic "/+/#" misses
        ("a/+/#", "a/#", False),  # "a/#" matches "a"
        ("//+/#", "//#", False),  # "//#" matches "/"
    ],
)
def test_filter_covers_examples(wide: str, narrow: str, expected: bool) -> None:
    assert filter_covers(wide, narrow) is expected


operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), topic_filters(), st.integers(0, 2)),
        st.tuples(st.just("remove"), topic_filters(), st.integers(0, 2)),
        st.tuples(st.just("match"), topics, st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=operations, cache_size=st.sampled_from([1, 3, 4096]))
def test_trie_interleaved_operations_keep_cache_coherent(
    ops: list[tuple[str, str, int]], cache_size: int
) -> None:
    trie: SubscriptionTrie[int, int] = SubscriptionTrie(cache_size=cache_size)
    model: dict[tuple[str, int], int] = {}
    for step, (operation, text, key) in enumerate(ops):
        if operation == "add":
            assert trie.add(text, key, step) == model.get((text, key))
            model[(text, key)] = step
        elif operation == "remove":
            assert trie.remove(text, key) == model.pop((text, key), None)
        else:
            expected = sorted((f, k, v) for (f, k), v in model.items() if topic_matches(f, text))
            assert sorted(trie.match(text)) == expected
            assert trie.has_match(text) == bool(expected)
        assert len(trie) == len(model)


def test_single_child_nodes_hold_the_child_itself_and_match_through_every_shape() -> None:
    """A node with one child keeps that node, not a one-entry dict (idle memory per device); the
    trie matches the same through the switch to a dict, the prune back and the removal."""
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    trie.add("dev/1/status", "c1", 1)
    device = trie._find("dev/1")[0]
    assert device is not None and isinstance(device.children, type(device))  # the "status" node
    trie.add("dev/1/temp", "c2", 2)
    assert isinstance(device.children, dict) and set(device.children) == {"status", "temp"}
    assert trie.match("dev/1/status") == [("dev/1/status", "c1", 1)]
    assert trie.match("dev/1/temp") == [("dev/1/temp", "c2", 2)]
    assert sorted(trie.filters()) == ["dev/1/status", "dev/1/temp"]
    trie.remove("dev/1/status", "c1")
    assert isinstance(device.children, type(device)) and device.children.word == "temp"
    assert trie.match("dev/1/status") == [] and trie.match("dev/1/temp") == [("dev/1/temp", "c2", 2)]
    trie.remove("dev/1/temp", "c2")
    assert trie._root.children is None and len(trie) == 0 and list(trie.filters()) == []
    # words below a wide level (identifiers) are not interned; words below a narrow one are
    for n in range(40):
        trie.add(f"wide/{n}x/status", f"c{n}", n)
    wide = trie._find("wide")[0]
    assert wide is not None and isinstance(wide.children, dict)
    ids = list(wide.children)
    assert sys.intern(ids[0]) is ids[0]  # below 16 children: interned
    assert all(isinstance(node.children, type(wide)) for node in wide.children.values())
    statuses = {id(node.children.word) for node in wide.children.values()}
    assert len(statuses) == 1  # one "status" string for every device
    assert trie.match("wide/39x/status") == [("wide/39x/status", "c39", 39)]


def test_single_subscriber_buckets_are_tuples_and_the_cache_follows_every_change() -> None:
    """One subscriber of a filter is a (key, value) tuple (idle memory per device), a dict from
    the second on; replacing, upgrading and removing it never leaves a cached match stale."""
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    for flt, topic in (("dev/1/status", "dev/1/status"), ("dev/2/#", "dev/2/x"), ("dev/+/y", "dev/3/y")):
        assert trie.add(flt, "c1", 1) is None
        node, multi = trie._find(flt)
        assert node is not None
        assert (node.multi if multi else node.exact) == ("c1", 1)
        assert trie.match(topic) == [(flt, "c1", 1)]  # now cached
        assert trie.add(flt, "c1", 2) == 1  # replaced: the cached match must follow
        assert trie.match(topic) == [(flt, "c1", 2)] and trie.get(flt, "c1") == 2
        assert trie.add(flt, "c2", 3) is None  # second subscriber: a dict
        assert isinstance(node.multi if multi else node.exact, dict)
        assert sorted(trie.match(topic)) == [(flt, "c1", 2), (flt, "c2", 3)]
        assert trie.remove(flt, "c1") == 2 and trie.remove(flt, "c2") == 3
        assert trie.match(topic) == [] and not trie.has_match(topic)
        trie.add(flt, "c3", 4)
        assert trie.match(topic) == [(flt, "c3", 4)]
        assert trie.remove(flt, "other") is None and trie.get(flt, "other") is None
        assert trie.remove(flt, "c3") == 4  # removed while cached
        assert trie.match(topic) == [] and len(trie) == 0
    trie.add("a/b", "k", 0)
    assert list(trie.items()) == [("a/b", "k", 0)] and list(trie.filters()) == ["a/b"]
