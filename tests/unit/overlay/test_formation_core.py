"""overlay.formation: the join-or-found rule and the lonely seed's yield rule (issue 17)."""

from __future__ import annotations

import pytest

from overlay.formation import Formation, should_yield


def test_founds_after_the_needed_rounds_as_lowest_answerer() -> None:
    formation = Formation(rounds_needed=2)
    assert not formation.close_round("b")  # no round open yet: nothing to judge
    formation.start_round(1)
    formation.heard_not_joined("c")
    assert not formation.close_round("b")  # lowest once
    formation.start_round(2)
    formation.heard_not_joined("c")
    formation.heard_not_joined("d")
    assert formation.close_round("b")  # lowest twice in a row: found


def test_a_lower_answerer_resets_the_count() -> None:
    formation = Formation(rounds_needed=2)
    formation.start_round(1)
    assert not formation.close_round("b")  # nobody answered: lowest reachable
    formation.start_round(2)
    formation.heard_not_joined("a")
    assert not formation.close_round("b")
    assert formation.lowest_rounds == 0
    formation.start_round(3)
    assert not formation.close_round("b")  # "a" went silent: counting starts again
    formation.start_round(4)
    assert formation.close_round("b")


def test_answers_outside_a_round_are_ignored_and_reset_forgets() -> None:
    formation = Formation(rounds_needed=1)
    formation.heard_not_joined("a")
    formation.start_round(1)
    assert formation.not_joined == set()
    formation.heard_not_joined("a")
    formation.reset()
    assert formation.request_id is None and formation.lowest_rounds == 0 and not formation.not_joined
    with pytest.raises(ValueError, match="rounds_needed"):
        Formation(rounds_needed=0)


def test_lonely_seed_yields_to_bigger_overlays_or_lower_ids_only() -> None:
    assert should_yield("b", "c", other_peers=2)  # a cluster of several wins
    assert should_yield("b", "a", other_peers=1)  # two lonely seeds: the higher one yields
    assert not should_yield("b", "c", other_peers=1)  # ... and the lower one stays
