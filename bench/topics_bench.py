"""Micro-benchmark of topic matching, retained lookup and ACL checks (broker/mqtt/topics.py,
broker/mqtt/retained.py, broker/auth/acl.py).

The point (design brief; amqtt fell to ~110 msg/s with 10k unrelated subscriptions because its
matching was linear): µs per match must not grow with the number of unrelated subscriptions.

    .venv/bin/python bench/topics_bench.py            # ~20 s
    .venv/bin/python bench/topics_bench.py --quick    # ~5 s
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from broker.auth.acl import Acl  # noqa: E402
from broker.mqtt.retained import RetainedIndex  # noqa: E402
from broker.mqtt.topics import SubscriptionTrie, topic_matches  # noqa: E402

PROBE_TOPIC = "sensors/kitchen/temp"
RELATED_FILTERS = ["sensors/+/temp", "sensors/#", "sensors/kitchen/temp", "+/kitchen/+"]


def unrelated_filter(index: int) -> str:
    """A mix of exact and wildcard filters that never match the probe topics."""
    kind = index % 4
    if kind == 0:
        return f"tenant{index % 97}/device{index}/+/status"
    if kind == 1:
        return f"tenant{index % 97}/device{index}/#"
    if kind == 2:
        return f"fleet/{index}/gps"
    return f"+/device{index}/cmd"


def time_per_call_us(function: Callable[[], object], *, min_time_s: float) -> float:
    calls = 0
    started = time.perf_counter()
    elapsed = 0.0
    while elapsed < min_time_s:
        for _ in range(200):
            function()
        calls += 200
        elapsed = time.perf_counter() - started
    return elapsed / calls * 1e6


def build_trie(unrelated: int) -> SubscriptionTrie[str, int]:
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    for index in range(unrelated):
        trie.add(unrelated_filter(index), f"client{index}", 1)
    for index, topic_filter in enumerate(RELATED_FILTERS):
        trie.add(topic_filter, f"probe{index}", 1)
    return trie


def _distinct_topics_matcher(trie: SubscriptionTrie[str, int]) -> Callable[[], object]:
    """Match a different topic every call (100k of them: the 4096-entry cache always misses)."""
    distinct = [f"sensors/room{index}/temp" for index in range(100_000)]
    position = [0]

    def distinct_topics() -> object:
        position[0] = (position[0] + 1) % len(distinct)
        return trie.match(distinct[position[0]])

    return distinct_topics


def _churning_matcher(trie: SubscriptionTrie[str, int], every: int, kind: str) -> Callable[[], object]:
    """Match hot topics; every ``every`` matches subscribe and unsubscribe once."""
    hot = [f"sensors/room{index}/temp" for index in range(100)]
    counter = [0]

    def step() -> object:
        counter[0] += 1
        n = counter[0]
        if n % every == 0:
            if kind.startswith("new key"):
                trie.add("sensors/+/temp", f"churn{n}", 1)
                trie.remove("sensors/+/temp", f"churn{n}")
            else:
                trie.add(f"churn/{n}/#", "c", 1)
                trie.remove(f"churn/{n}/#", "c")
        return trie.match(hot[n % len(hot)])

    return step


def bench_matching(sizes: list[int], min_time_s: float) -> None:
    print("SubscriptionTrie.match: 4 matching subscriptions + N unrelated ones")
    print(
        f"{'unrelated':>10} {'cached µs':>10} {'uncached µs':>12} {'distinct topics µs':>19} {'matches':>8}"
    )
    for size in sizes:
        trie = build_trie(size)
        assert len(trie.match(PROBE_TOPIC)) == len(RELATED_FILTERS)
        cached_us = time_per_call_us(lambda t=trie: t.match(PROBE_TOPIC), min_time_s=min_time_s)  # type: ignore[misc]

        def uncached(t: SubscriptionTrie[str, int] = trie) -> object:
            t.clear_cache()
            return t.match(PROBE_TOPIC)

        uncached_us = time_per_call_us(uncached, min_time_s=min_time_s)
        distinct_us = time_per_call_us(_distinct_topics_matcher(trie), min_time_s=min_time_s)
        row = f"{size:>10} {cached_us:>10.2f} {uncached_us:>12.2f} {distinct_us:>19.2f}"
        print(f"{row} {len(RELATED_FILTERS):>8}")
    filters = [unrelated_filter(index) for index in range(10_000)] + RELATED_FILTERS
    linear_us = time_per_call_us(
        lambda: [f for f in filters if topic_matches(f, PROBE_TOPIC)], min_time_s=min_time_s
    )
    print(f"  for comparison, a linear scan of 10k filters: {linear_us:.0f} µs per match")


def bench_churn(min_time_s: float) -> None:
    print("match under subscription churn (10k unrelated subscriptions, 100 hot topics)")
    trie = build_trie(10_000)
    for every in (1000, 100, 10, 1):
        for kind in ("new key, existing filter", "new wildcard filter"):
            step = _churning_matcher(trie, every, kind)
            per_us = time_per_call_us(step, min_time_s=min_time_s)
            print(
                f"  1 subscribe+unsubscribe per {every:>4} matches ({kind:<24}): {per_us:6.2f} µs per match"
            )


def bench_retained(min_time_s: float, count: int) -> None:
    print(f"RetainedIndex.match with {count} retained topics")
    retained: RetainedIndex[int] = RetainedIndex()
    for index in range(count):
        retained.set(f"fleet/{index % 1000}/sensor/{index}", index)
    for topic_filter in ("fleet/7/sensor/1007", "fleet/7/sensor/+", "fleet/+/sensor/1007", "fleet/7/#"):
        found = len(list(retained.match(topic_filter)))
        per_us = time_per_call_us(lambda f=topic_filter: list(retained.match(f)), min_time_s=min_time_s)  # type: ignore[misc]
        print(f"  {topic_filter:<24} {found:>6} results {per_us:10.1f} µs")


def bench_acl(min_time_s: float) -> None:
    print("Acl checks (file with 3 users, a deny and 2 patterns)")
    acl = Acl.parse(
        [
            "topic read public/#",
            "user alice",
            "topic readwrite alice/#",
            "topic deny alice/private/#",
            "user bob",
            "topic bob/#",
            "pattern readwrite devices/%c/#",
            "pattern read users/%u/inbox/#",
        ]
    )
    assert acl.can_publish("c1", "alice", "alice/room/1")
    cached_us = time_per_call_us(
        lambda: acl.can_publish("c1", "alice", "alice/room/1"), min_time_s=min_time_s
    )
    counter = [0]

    def miss() -> object:
        counter[0] += 1
        return acl.can_publish("c1", "alice", f"alice/new/{counter[0]}")

    miss_us = time_per_call_us(miss, min_time_s=min_time_s)
    sub_us = time_per_call_us(lambda: acl.can_subscribe("c1", "alice", "alice/+/x"), min_time_s=min_time_s)
    print(f"  can_publish allowed, repeated topic: {cached_us:.2f} µs; new topic each time: {miss_us:.2f} µs")
    print(f"  can_subscribe: {sub_us:.2f} µs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="shorter timings, smaller sizes")
    args = parser.parse_args(argv)
    min_time_s = 0.1 if args.quick else 0.4
    bench_matching([1, 10_000] if args.quick else [1, 10_000, 100_000], min_time_s)
    bench_churn(min_time_s / 2)
    bench_retained(min_time_s, 10_000 if args.quick else 100_000)
    bench_acl(min_time_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
