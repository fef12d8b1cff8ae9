"""Tests for broker/mqtt/retained.py: set/delete/get, filter matching incl. wildcards and the '$'
rule (MQTT 5.0 §4.7.2), and agreement with a brute-force scan (hypothesis)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO_ROOT = Path(__file__).resolve().parents[3]
from broker.mqtt.retained import RetainedIndex  # noqa: E402
from broker.mqtt.topics import TopicError, topic_matches  # noqa: E402

TOPICS = [
    "sport",
    "sport/",
    "sport/tennis",
    "sport/tennis/player1",
    "sport/tennis/player1/ranking",
    "sport/football",
    "/finance",
    "/",
    "a//b",
    "$SYS/broker/uptime",
    "$SYS",
    "weather/$x",
]


@pytest.fixture
def index() -> RetainedIndex[str]:
    retained: RetainedIndex[str] = RetainedIndex()
    for topic in TOPICS:
        retained.set(topic, f"v:{topic}")
    return retained


def test_set_get_replace_delete() -> None:
    retained: RetainedIndex[bytes] = RetainedIndex()
    assert len(retained) == 0
    assert retained.get("a/b") is None
    retained.set("a/b", b"1")
    retained.set("a/b", b"2")
    assert len(retained) == 1
    assert retained.get("a/b") == b"2"
    assert retained.get("a") is None  # an inner node is not a retained topic
    assert "a/b" in retained
    assert retained.delete("a/b") is True
    assert retained.delete("a/b") is False
    assert retained.delete("never") is False
    assert len(retained) == 0
    assert list(retained.match("#")) == []
    assert retained._root.children == {}  # pruned back to the root


def test_delete_keeps_relatives() -> None:
    retained: RetainedIndex[int] = RetainedIndex()
    retained.set("a", 1)
    retained.set("a/b", 2)
    retained.set("a/b/c", 3)
    assert retained.delete("a/b")
    assert sorted(retained.match("a/#")) == [("a", 1), ("a/b/c", 3)]
    assert retained.delete("a/b/c")
    assert sorted(retained.match("#")) == [("a", 1)]
    assert retained.get("a") == 1


def test_set_rejects_invalid_topic_names() -> None:
    retained: RetainedIndex[int] = RetainedIndex()
    for bad in ["", "a/+", "a/#"]:
        with pytest.raises(TopicError) as info:
            retained.set(bad, 1)
        assert info.value.reason_code == 0x90
    assert len(retained) == 0


def test_match_rejects_invalid_filters(index: RetainedIndex[str]) -> None:
    with pytest.raises(TopicError) as info:
        list(index.match("a/#/b"))
    assert info.value.reason_code == 0x8F


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("sport", ["sport"]),
        ("sport/#", ["sport", "sport/", "sport/football", "sport/tennis", "sport/tennis/player1",
                     "sport/tennis/player1/ranking"]),
        ("sport/+", ["sport/", "sport/football", "sport/tennis"]),
        ("sport/tennis/+", ["sport/tennis/player1"]),
        ("+", ["sport"]),
        ("+/+", ["/", "/finance", "sport/", "sport/football", "sport/tennis", "weather/$x"]),
        ("/+", ["/", "/finance"]),
        ("+/#", [t for t in TOPICS if not t.startswith("$")]),
        ("#", [t for t in TOPICS if not t.startswith("$")]),
        ("$SYS/#", ["$SYS", "$SYS/broker/uptime"]),
        ("$SYS/+/uptime", ["$SYS/broker/uptime"]),
        ("+/broker/uptime", []),  # '$' rule
        ("weather/+", ["weather/$x"]),  # '$' only matters in the first level
        ("a/+/b", ["a//b"]),
        ("nothing/#", []),
        ("sport/tennis/player1/ranking/deeper", []),
    ],
)  # fmt: skip
def test_match_examples(index: RetainedIndex[str], topic_filter: str, expected: list[str]) -> None:
    got = sorted(index.match(topic_filter))
    assert got == sorted((t, f"v:{t}") for t in expected)


def test_match_result_survives_changes_during_iteration(index: RetainedIndex[str]) -> None:
    seen = []
    for topic, _value in index.match("sport/#"):
        seen.append(topic)
        index.delete(topic)  # the broker may change retained state while it sends them out
        index.set(topic + "/new", "x")
    assert len(seen) == 6


def test_narrow_filter_is_cheap_with_many_retained_topics() -> None:
    retained: RetainedIndex[int] = RetainedIndex()
    for index in range(100_000):
        retained.set(f"fleet/{index % 1000}/sensor/{index}", index)
    started = time.perf_counter()
    for _ in range(100):
        got = list(retained.match("fleet/7/sensor/+"))
    elapsed_per_match_s = (time.perf_counter() - started) / 100
    assert sorted(v for _t, v in got) == list(range(7, 100_000, 1000))
    # a full scan of 100k topics takes tens of ms in Python; the trie walk touches ~100 nodes
    assert elapsed_per_match_s < 0.005, elapsed_per_match_s


# -- hypothesis: agreement with a brute-force scan -------------------------------------------------

LEVELS = ["a", "b", "", "$x"]
topics = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=4).map("/".join).filter(bool)


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
    operations=st.lists(st.tuples(st.booleans(), topics, st.integers(0, 9)), max_size=40),
    probes=st.lists(topic_filters(), min_size=1, max_size=8),
)
def test_match_agrees_with_brute_force(operations: list[tuple[bool, str, int]], probes: list[str]) -> None:
    retained: RetainedIndex[int] = RetainedIndex()
    model: dict[str, int] = {}
    for is_set, topic, value in operations:
        if is_set:
            retained.set(topic, value)
            model[topic] = value
        else:
            assert retained.delete(topic) == (topic in model)
            model.pop(topic, None)
    assert len(retained) == len(model)
    for topic, value in model.items():
        assert retained.get(topic) == value
    for topic_filter in probes:
        expected = sorted((t, v) for t, v in model.items() if topic_matches(topic_filter, t))
        assert sorted(retained.match(topic_filter)) == expected
