"""Fixture of the federation process tests: ``sites``, the broker processes of one test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.federation import Sites


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[Sites]:
    group = Sites(tmp_path)
    yield group
    group.close()
    print(group.tails())  # pytest shows it for a failing test only
