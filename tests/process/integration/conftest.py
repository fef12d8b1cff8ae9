"""Fixtures for the black-box interop suite: a real broker process and real clients.

`broker` is shared by a test module (tests there must use unique topics/client ids);
`fresh_broker` is per test; `broker_factory(BrokerOptions(...))` starts brokers with options.
SKIPMQ_TEST_TARGET=mosquitto runs the same tests against Debian's mosquitto 2.0.11.
A failing test's report gets the stderr tail of every live broker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.interop_broker import LIVE_BROKERS, TARGET, BrokerOptions, BrokerProcess
from tests.support.interop_clients import PahoClient


def pytest_report_header(config: pytest.Config) -> str:
    return f"interop target: {TARGET} (set SKIPMQ_TEST_TARGET=mosquitto|skipmq)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for index, live in enumerate(LIVE_BROKERS):
            report.sections.append((f"broker {index} ({TARGET}) stderr tail", live.stderr_tail(60)))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("broker")).start()
    yield proc
    proc.close()


@pytest.fixture
def fresh_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "broker").start()
    yield proc
    proc.close()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[[BrokerOptions], BrokerProcess]]:
    started: list[BrokerProcess] = []

    def make(opts: BrokerOptions) -> BrokerProcess:
        proc = BrokerProcess(tmp_path / f"broker{len(started)}", opts)
        started.append(proc)
        return proc.start()

    yield make
    for proc in started:
        proc.close()


@pytest.fixture
def paho_factory() -> Iterator[Callable[..., PahoClient]]:
    """make(broker, **PahoClient kwargs) -> a connected client, closed at teardown."""
    made: list[PahoClient] = []

    def make(target: BrokerProcess, port: int | None = None, **kwargs: Any) -> PahoClient:
        client = PahoClient(target.host, port if port is not None else target.port, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        try:
            client.close()
        except Exception:
            pass
