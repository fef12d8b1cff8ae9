"""Topic-class mapping (broker/cluster/classes.py): every matching filter's class is one of the
classes the topic is published on, for any class granularity."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.cluster.classes import filter_class, is_wildcard_class, topic_classes
from broker.mqtt.topics import topic_matches

LEVEL = st.sampled_from(["a", "b", "c", "", "sensors", "$x"])
TOPIC = st.lists(LEVEL, min_size=1, max_size=5).map("/".join)


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from(["a", "b", "c", "", "+", "sensors"]), min_size=1, max_size=5))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


@settings(max_examples=3000, deadline=None)
@given(topic=TOPIC, topic_filter=filters(), class_levels=st.integers(1, 4))
def test_a_matching_filter_subscribes_a_class_the_topic_is_published_on(
    topic: str, topic_filter: str, class_levels: int
) -> None:
    if topic_matches(topic_filter, topic):
        assert filter_class(topic_filter, class_levels) in topic_classes(topic, class_levels)


def test_examples_at_one_level() -> None:
    assert filter_class("sensors/+/temp", 1) == "=sensors"
    assert filter_class("+/temp", 1) == "*0:"
    assert filter_class("#", 1) == "*0:"
    assert topic_classes("sensors/room1/temp", 1) == ["=sensors", "*0:"]
    assert is_wildcard_class("*0:") and not is_wildcard_class("=sensors")


def test_examples_at_two_levels() -> None:
    assert filter_class("a/b/#", 2) == "=a/b"
    assert filter_class("a/#", 2) == "*1:a"
    assert filter_class("a", 2) == "=a"
    assert topic_classes("a", 2) == ["=a", "*0:", "*1:a"]
    assert topic_classes("a/b/c", 2) == ["=a/b", "*0:", "*1:a"]
