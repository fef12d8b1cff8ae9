"""The idealised SG-TBPS delivery model: SFB range multicast over a plain Skip Graph.

Seed 003 §3.1-§3.2 and §3.5.1: in SG-TBPS a topic's subscribers form one run at level 0, and the
rendezvous point (here the topic's only publisher) sits right before it, at the run's left edge.
A publish is a range multicast over the run (SFB): a node responsible for the key interval
[lo, hi) splits it at its table entries inside it and hands [p_j, p_{j+1}) to p_j.

This module computes what that gives when every table holds *exactly* the node's Skip Graph
neighbours (for each level i, the nearest node on each side whose membership vector shares at
least i leading digits with the node's own), i.e. the Skip Graph the protocol should converge
to. Only the run's membership vectors matter: entries outside [lo, hi) are never delegates, and
the publisher's right level-0 neighbour is the run's first node, so the publisher reaches the
run directly. Inside the run, a node's right neighbours are the *strict records* of the level
(common-prefix length with it) walking right; a delegate p_j gets [p_j, p_{j+1}), whose in-range
entries are its right records before p_{j+1}.

``sfb_depths`` gives the hop count of every subscriber for given membership vectors (to compare
one simulated run against the ideal on the very same vectors); ``expected_path_lengths`` averages
the average and maximum over i.i.d. uniformly random vectors (the idealised figure for a count).

Pure: no I/O, randomness only from the ``random.Random`` passed in.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean, pstdev

from overlay.keys import common_prefix_length

__all__ = [
    "ModelPoint",
    "expected_path_lengths",
    "right_neighbours",
    "sfb_depths",
]


def right_neighbours(mvs: Sequence[int], index: int, stop: int, mv_bits: int) -> list[int]:
    """Positions of ``index``'s Skip Graph right neighbours among positions index+1 .. stop-1.

    Position j is a neighbour iff its level (common-prefix length with ``index``) exceeds the
    level of every position between them: it is then the nearest node of level >= i on that side
    for some i. The result is ascending (nearest first) with strictly increasing levels.
    """
    own = mvs[index]
    out: list[int] = []
    best = -1
    for position in range(index + 1, stop):
        level = common_prefix_length(own, mvs[position], mv_bits)
        if level > best:
            best = level
            out.append(position)
            if level >= mv_bits:  # nothing can exceed a full match
                break
    return out


def sfb_depths(publisher_mv: int, run_mvs: Sequence[int], mv_bits: int = 32) -> list[int]:
    """Hops from the publisher to each node of the run (in key order) under ideal SFB.

    The publisher stands just left of the run; every node's table holds exactly its Skip Graph
    neighbours. The publisher delegates to each of its neighbours inside the run; each delegate
    p_j, responsible for [p_j, p_{j+1}) (the run's end for the last), does the same inside its
    sub-range. Returns one hop count (>= 1) per run node.
    """
    mvs = [publisher_mv, *run_mvs]
    end = len(mvs)
    depth = [0] * end
    stack = [(0, end, 0)]  # (node position, exclusive end of its sub-range, hops to it)
    while stack:
        node, stop, hops = stack.pop()
        points = right_neighbours(mvs, node, stop, mv_bits)
        for rank, point in enumerate(points):
            depth[point] = hops + 1
            stack.append((point, points[rank + 1] if rank + 1 < len(points) else stop, hops + 1))
    return depth[1:]


@dataclass(frozen=True, slots=True)
class ModelPoint:
    """The idealised model at one subscriber count, over ``trials`` random draws."""

    subscribers: int
    trials: int
    avg_hops: float  # mean over draws of the per-draw average hops
    avg_hops_sd: float  # standard deviation of the per-draw average over draws
    max_hops: float  # mean over draws of the per-draw maximum
    max_hops_sd: float


def expected_path_lengths(
    counts: Sequence[int], trials: int, rng: random.Random, mv_bits: int = 32
) -> list[ModelPoint]:
    """The model's average and maximum path per count, over i.i.d. uniform membership vectors."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    points: list[ModelPoint] = []
    for count in counts:
        if count < 1:
            raise ValueError(f"subscriber counts must be >= 1, got {count}")
        averages: list[float] = []
        maxima: list[int] = []
        for _ in range(trials):
            publisher = rng.getrandbits(mv_bits)
            depths = sfb_depths(publisher, [rng.getrandbits(mv_bits) for _ in range(count)], mv_bits)
            averages.append(fmean(depths))
            maxima.append(max(depths))
        points.append(
            ModelPoint(
                subscribers=count,
                trials=trials,
                avg_hops=fmean(averages),
                avg_hops_sd=pstdev(averages),
                max_hops=fmean(maxima),
                max_hops_sd=pstdev(maxima),
            )
        )
    return points
