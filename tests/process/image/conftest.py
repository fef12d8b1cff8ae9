"""Fixtures for the container tests: the built image, run by podman as helm/skipmq's pods.

These tests build nothing. They need the image (default ``skipmq:dev``; ``IMAGE_UNDER_TEST``
names another) built beforehand by ``bash scripts/build_image.sh``, podman able to run it (as
root: volumes are given to the chart's fsGroup with chown), and helm-python-sdk to render the
chart. Where any of these is missing every test here is skipped with a reason naming what is
missing and how to get it (shown by ``pytest -ra``); docs/operations.md "Image".

A failing test's report gets the log tail of every broker container it started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.process.image.chart_pods import ChartPod, podman, podman_command, render_chart

IMAGE = os.environ.get("IMAGE_UNDER_TEST", "skipmq:dev")
BUILD_HINT = "run bash scripts/build_image.sh"

# Every pod a test started and has not removed: failing tests get their logs.
LIVE_PODS: list[ChartPod] = []


def _unavailable() -> str | None:
    """Why the image cannot be run here, or None."""
    if shutil.which("podman") is None:
        return f"podman is not installed ({BUILD_HINT}: it installs podman and runc as root)"
    if os.geteuid() != 0:
        return "the container tests run rootful podman: run them as root"
    try:
        import helm_python  # noqa: F401
    except ImportError:
        return "helm-python-sdk is not installed (the [dev] extra): it renders the chart"
    exists = subprocess.run([*podman_command(), "image", "exists", IMAGE], capture_output=True, check=False)
    if exists.returncode != 0:
        return f"image {IMAGE} not built: {BUILD_HINT}"
    smoke = podman(
        "run", "--rm", "--no-healthcheck", "--network", "none", "--entrypoint", "python", IMAGE,
        "-c", "print('ok')", check=False, timeout_s=60,
    )  # fmt: skip
    if smoke.returncode != 0 or smoke.stdout.strip() != "ok":
        return f"podman cannot run {IMAGE} here: {smoke.stderr.strip()[-500:]}"
    return None


@pytest.fixture(scope="session")
def image() -> str:
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    return IMAGE


@pytest.fixture
def network(image: str) -> Iterator[str]:
    """A podman network of this test's own (a bridge with DNS: the headless Service's name)."""
    name = f"skipmq-test-{os.getpid()}-{len(LIVE_PODS)}-{os.urandom(2).hex()}"
    podman("network", "create", "--label", "skipmq-test=image", name)
    yield name
    for pod in list(LIVE_PODS):
        if pod.network == name:
            pod.remove()
            LIVE_PODS.remove(pod)
    podman("network", "rm", "-f", name, check=False)


PodFactory = Callable[[dict[str, Any], int], list[ChartPod]]


@pytest.fixture
def chart_pods(image: str, network: str, tmp_path: Path) -> PodFactory:
    """make(values, count): pods 0..count-1 of the chart rendered with ``values`` (not started;
    removed after the test with the network)."""
    suffix = network.removeprefix("skipmq-test-")

    def make(values: dict[str, Any], count: int) -> list[ChartPod]:
        objects = render_chart(values)
        made = []
        for index in range(count):
            pod = ChartPod(
                objects, index, image=image, network=network, root=tmp_path / f"pod{index}", suffix=suffix
            )
            LIVE_PODS.append(pod)
            made.append(pod)
        return made

    return make


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for pod in LIVE_PODS:
            report.sections.append((f"{pod.name} ({pod.container}) log tail", pod.logs()[-4000:]))
