"""``overlay.keys.random_index`` stands in for ``random.Random.randrange(n)`` on the overlay's
hot paths: it must draw the very same values from the same generator state, or every seeded
simulation (and the reproduced figures) would change. Compared here on the interpreter that runs
the tests, so a Python whose ``randrange`` draws differently fails here first."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from overlay.keys import random_index


@given(seed=st.integers(0, 2**64 - 1), sizes=st.lists(st.integers(1, 2**40), min_size=1, max_size=50))
def test_random_index_draws_what_randrange_draws(seed: int, sizes: list[int]) -> None:
    ours = random.Random(seed)
    theirs = random.Random(seed)
    for n in sizes:
        assert random_index(ours, n) == theirs.randrange(n)
    assert ours.getstate() == theirs.getstate()  # the generator moved on by as much


def test_random_index_over_every_small_size() -> None:
    ours = random.Random(7)
    theirs = random.Random(7)
    for n in list(range(1, 300)) * 20:
        value = random_index(ours, n)
        assert value == theirs.randrange(n) and 0 <= value < n
