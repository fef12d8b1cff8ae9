"""Tests of the idealised SG-TBPS model (overlay/sim/sfb_model.py)."""

from __future__ import annotations

import random

import pytest

from overlay.multicast import plan_delegation
from overlay.sim.sfb_model import expected_path_lengths, right_neighbours, sfb_depths
from overlay.table import RoutingTable


def test_right_neighbours_are_the_strict_level_records() -> None:
    # mv_bits=3; levels seen from position 0 (mv 000): 001 -> 0, 011 -> 0, 010 -> 1, 101 -> 0, 100 -> 2
    mvs = [0b000, 0b001, 0b011, 0b010, 0b101, 0b100]
    assert right_neighbours(mvs, 0, len(mvs), 3) == [1, 3, 5]
    assert right_neighbours(mvs, 0, 5, 3) == [1, 3]  # the sub-range ends before position 5
    assert right_neighbours(mvs, 1, 3, 3) == [2]  # 001 vs 011: level 1
    assert right_neighbours(mvs, 5, len(mvs), 3) == []


def test_depths_worked_by_hand() -> None:
    # publisher 000 delegates to 001 [001, 010), 010 [010, 100) and 100 [100, end);
    # 001 then reaches 011 (level 1), 010 reaches 101 (level 0): depths 1, 2, 1, 2, 1
    assert sfb_depths(0b000, [0b001, 0b011, 0b010, 0b101, 0b100], 3) == [1, 2, 1, 2, 1]
    # mv_bits=2: publisher 00 sees 01 (0), 10 (1), 11 (0), 00 (2): 10 covers [10, 00) and reaches 11
    assert sfb_depths(0b00, [0b01, 0b10, 0b11, 0b00], 2) == [1, 1, 2, 1]


def test_identical_vectors_make_a_chain() -> None:
    # every run node matches the next one fully, so each reaches only its level-0 neighbour
    assert sfb_depths(0b0, [0b1] * 5, 2) == [1, 2, 3, 4, 5]
    assert sfb_depths(0b1, [0b1] * 4, 2) == [1, 2, 3, 4]


def test_one_subscriber_is_one_hop() -> None:
    assert sfb_depths(7, [12345], 32) == [1]


def test_model_equals_the_core_planner_on_ideal_tables() -> None:
    """The same delivery tree as overlay.multicast.plan_delegation over plain Skip Graph tables
    holding every node (pruned to the neighbours by RoutingTable itself), with other topics'
    nodes on both sides of the run."""
    rng = random.Random(5)
    for trial in range(30):
        count = rng.randrange(1, 60)
        topic = "m"
        keys = [("a", 1, peer) for peer in range(rng.randrange(0, 20))]
        publisher = (topic, 0, 1000)
        run = [(topic, 1, peer) for peer in range(count)]
        keys += [publisher, *run, *[("z", 0, peer) for peer in range(rng.randrange(0, 20))]]
        mvs = {key: rng.getrandbits(32) for key in keys}
        tables = {}
        for key in keys:
            table = RoutingTable(key, mvs[key], capacity=2, frt_enabled=False, mv_bits=32)
            for other in keys:
                if other != key:
                    table.add((other, mvs[other]))
            tables[key] = table
        hops: dict[tuple[object, ...], int] = {}
        stack = [(publisher, (topic, 1), (topic, 2), 0)]
        while stack:
            node, lo, hi, depth = stack.pop()
            for dest, sub_lo, sub_hi in plan_delegation(tables[node], node, lo, hi):
                assert dest not in hops, f"trial {trial}: {dest} reached twice"
                hops[dest] = depth + 1
                stack.append((dest, sub_lo, sub_hi, depth + 1))
        expected = sfb_depths(mvs[publisher], [mvs[key] for key in run], 32)
        assert [hops[key] for key in run] == expected


def test_two_subscribers_average_four_thirds() -> None:
    # the second subscriber is one hop iff its level above the publisher exceeds the first's:
    # P(X > Y) = (1 - P(X = Y)) / 2 = (1 - 1/3) / 2 = 1/3 for i.i.d. Geometric(1/2) levels,
    # so the average is (1 + 1/3 + 2 * 2/3) / 2 = 4/3
    (point,) = expected_path_lengths([2], 20_000, random.Random(1))
    assert point.avg_hops == pytest.approx(4 / 3, abs=0.01)
    assert point.max_hops == pytest.approx(5 / 3, abs=0.015)


def test_expected_lengths_grow_logarithmically() -> None:
    points = expected_path_lengths([10, 40, 160], 400, random.Random(2))
    averages = [point.avg_hops for point in points]
    assert averages == sorted(averages)
    assert 2.4 < averages[0] < 2.8  # the figure quoted in docs/overlay-reproduction.md (about 2.6)
    # each 4x more subscribers adds about 1.6 hops (log2(4) x ~0.8)
    assert 1.2 < averages[1] - averages[0] < 2.0 and 1.2 < averages[2] - averages[1] < 2.0
    assert all(point.max_hops >= point.avg_hops for point in points)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="trials"):
        expected_path_lengths([10], 0, random.Random(1))
    with pytest.raises(ValueError, match="counts"):
        expected_path_lengths([0], 5, random.Random(1))
