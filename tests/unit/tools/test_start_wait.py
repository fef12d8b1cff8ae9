"""tools/start_wait.py: the harnesses' start bound grows with the load, and a broker that does
not become ready is reported with how long, why, the load and its last log lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.federation import Sites
from tools import start_wait


def test_the_bound_scales_with_the_load_per_cpu_and_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(start_wait.ENV, raising=False)
    monkeypatch.setattr(start_wait.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(start_wait.os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    assert start_wait.start_timeout_s(10.0) == 10.0  # idle: the base
    monkeypatch.setattr(start_wait.os, "getloadavg", lambda: (5.0, 1.0, 1.0))
    assert start_wait.start_timeout_s(10.0) == 25.0  # 2.5 runnable per CPU
    monkeypatch.setattr(start_wait.os, "getloadavg", lambda: (28.0, 1.0, 1.0))
    assert start_wait.start_timeout_s(10.0) == 10.0 * start_wait.MAX_FACTOR  # capped
    monkeypatch.setenv(start_wait.ENV, "7")
    assert start_wait.start_timeout_s(10.0) == 7.0


def test_a_broker_that_cannot_start_is_reported_with_its_last_log_lines(tmp_path: Path) -> None:
    sites = Sites(tmp_path)
    try:
        with pytest.raises(RuntimeError) as failure:
            sites.start("broken", args=("--set", "federation.retry_ms=-1"))
    finally:
        sites.close()
    message = str(failure.value)
    assert "broken not ready within" in message and "exited with status 2" in message, message
    assert "load average" in message and start_wait.ENV in message
    assert "federation.retry_ms" in message  # the broker's own error, from its log
