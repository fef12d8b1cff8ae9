"""Formation: which peer founds the overlay when peers start together (issue 17; docs/overlay.md § Formation).

Implements SkipMQ's join-or-found rule, which the paper (seed 003) leaves open: it assumes an
overlay exists. A peer whose ``Bootstrap`` contacts list the peer itself is a *seed*; it may
found a new overlay, the others only join one. A seed with no virtual node runs formation
rounds: each round sends a SEARCH to every contact; a contact inside an overlay answers FOUND
and the seed joins through it (any overlay wins over founding). A contact outside any overlay
answers SEARCH_FAIL: it is *reachable and not joined*. At the end
of a round the seed founds if its id is lower than every such contact's, for ``rounds_needed``
rounds in a row; the others keep searching and join it. Peers that did not answer (not started,
crashed, cut off) do not count, so the lowest *reachable* seed founds.

Two seeds can still found apart (a lower seed cut off during the rounds). ``should_yield`` is
the repair: a seed alone in its overlay (no other peer's virtual node in its tables) keeps
probing its contacts; a contact in another overlay that has more than one peer, or whose id is
lower, makes it leave its lonely overlay and join that one. Two lonely seeds never yield to each
other at once: only the higher id yields.

Pure: plain data in, decisions out; no clock, no I/O (the caller owns timers and messages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PeerId = Any


@dataclass(slots=True)
class Formation:
    """The formation rounds of one seed with no virtual node (see the module docstring)."""

    rounds_needed: int
    request_id: int | None = None  # SEARCH request id of the open round (None: no round yet)
    not_joined: set[PeerId] = field(default_factory=set)  # answered "not joined" this round
    lowest_rounds: int = 0  # consecutive closed rounds in which this peer had the lowest id

    def __post_init__(self) -> None:
        if self.rounds_needed < 1:
            raise ValueError(f"rounds_needed must be >= 1, got {self.rounds_needed}")

    def start_round(self, request_id: int) -> None:
        self.request_id = request_id
        self.not_joined = set()

    def heard_not_joined(self, peer: PeerId) -> None:
        """``peer`` answered this round's SEARCH with SEARCH_FAIL: reachable, outside any overlay."""
        if self.request_id is not None:
            self.not_joined.add(peer)

    def close_round(self, self_id: PeerId) -> bool:
        """Close the open round; True: this peer founds the overlay now."""
        if self.request_id is None:
            return False
        if all(self_id < peer for peer in self.not_joined):
            self.lowest_rounds += 1
        else:
            self.lowest_rounds = 0
        self.request_id = None
        return self.lowest_rounds >= self.rounds_needed

    def reset(self) -> None:
        self.request_id = None
        self.not_joined = set()
        self.lowest_rounds = 0


def should_yield(self_id: PeerId, other: PeerId, other_peers: int) -> bool:
    """A lonely seed learned that ``other`` is in another overlay of ``other_peers`` peers
    (as ``other`` counts them, itself included): leave the lonely overlay and join that one?"""
    return other_peers > 1 or other < self_id
