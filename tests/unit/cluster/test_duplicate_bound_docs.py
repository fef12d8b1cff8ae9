"""The QoS 1 duplicate bounds that docs/cluster.md cites are the ones the tests assert, computed
from the code's defaults (tests/support/in_flight.py): a change of the outgoing window's default
(``limits.max_inflight_messages``) or of ``stream_sender.RESEND_BATCH`` changes the bounds of
the duplicate tests and fails here until the docs say the new figures."""

from __future__ import annotations

import re

from broker.cluster.stream_sender import RESEND_BATCH
from broker.config.schema import LimitsConfig
from tests.support.in_flight import INFLIGHT_DEFAULT, SENDER_BATCH, duplicate_bound
from tests.support.paths import REPO_ROOT
from tests.support.recovery_cells import CellParams

PAGE = REPO_ROOT / "docs" / "cluster.md"
ZERO_LOSS_WINDOW = 100  # test_zero_loss.py's WINDOW (SKIPMQ_ZL_WINDOW's default)
MATRIX_WINDOW = CellParams().window  # the recovery matrix's publisher window


def _figure(text: str) -> int:
    return int(text.replace(",", ""))


def _text() -> str:
    return re.sub(r"\s+", " ", PAGE.read_text())


def test_the_bound_is_read_from_the_code() -> None:
    assert LimitsConfig().max_inflight_messages == INFLIGHT_DEFAULT
    assert SENDER_BATCH == RESEND_BATCH
    assert duplicate_bound(3, 2, 7) == 2 * (INFLIGHT_DEFAULT + 2 * SENDER_BATCH) + 7
    assert duplicate_bound(5, 1, 0) == INFLIGHT_DEFAULT + 4 * SENDER_BATCH


def test_docs_cite_the_bounds_the_tests_assert() -> None:
    text = _text()
    # the kill -9 duplicates test (tests/process/cluster/test_zero_loss.py): 3 brokers, 2 faults
    match = re.search(
        r"per fault the window of (\d+) plus a (\d+)-message batch per other broker, and the"
        r" publisher's window: ([\d,]+)\)",
        text,
    )
    assert match, "docs/cluster.md no longer states the kill -9 duplicates test's bound"
    window, batch, bound = int(match[1]), int(match[2]), _figure(match[3])
    assert (window, batch) == (INFLIGHT_DEFAULT, SENDER_BATCH)
    assert bound == duplicate_bound(3, 2, ZERO_LOSS_WINDOW)
    # the recovery matrix (one fault per cell), stated twice
    cited = [_figure(m) for m in re.findall(r"publisher's window: ([\d,]+), read from the code", text)]
    cited += [_figure(m) for m in re.findall(r"against the bound of ([\d,]+)", text)]
    assert len(cited) == 2, cited
    assert set(cited) == {duplicate_bound(3, 1, MATRIX_WINDOW)}
