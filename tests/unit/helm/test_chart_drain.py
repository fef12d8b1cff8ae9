"""The chart's scale-down steps with replicated durability: ``drain.enabled`` makes the preStop
hook run ``skipmq drain`` (the endpoints-out sleep, then the broker's drain on its loopback HTTP
listener) inside a grace period long enough for both; off, the plain sleep stays."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.helm.conftest import CHART, NAMESPACE, RELEASE, helm_python, render

DRAIN: dict[str, Any] = {"drain": {"enabled": True}, "config": {"cluster": {"replicas": 2}}}


def test_the_default_pre_stop_hook_is_the_plain_sleep() -> None:
    container = render({}, "default").container
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]


def test_drain_runs_skipmq_drain_within_the_grace_period() -> None:
    rendered = render({**DRAIN, "config": {**DRAIN["config"], "http": {"port": 19090}}}, "drain")
    command = rendered.container["lifecycle"]["preStop"]["exec"]["command"]
    assert command == [
        "skipmq",
        "drain",
        "--sleep-s",
        "5",
        "--timeout-s",
        "45",
        "--url",
        "http://127.0.0.1:19090",
    ]
    pod = rendered.statefulset["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 5 + 45


def test_drain_refuses_a_grace_period_shorter_than_the_sleep_and_the_drain() -> None:
    values = {**DRAIN, "terminationGracePeriodSeconds": 50}  # = 5 + 45: SIGKILL could cut the drain
    with helm_python.Chart.load(CHART) as chart, pytest.raises(Exception) as caught:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert "terminationGracePeriodSeconds must exceed preStopSleepSeconds + drain.timeoutSeconds" in str(
        caught.value
    )


@pytest.mark.parametrize("drain", [{"timeoutSeconds": 0}, {"enabled": "yes"}, {"wait": True}])
def test_the_schema_refuses_bad_drain_values(drain: dict[str, Any]) -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmValuesError):
        chart.render({"drain": drain}, name=RELEASE, namespace=NAMESPACE)


def test_replicas_without_the_pre_stop_drain_leave_the_sigterm_drain_its_time() -> None:
    """SIGTERM drains a broker with replicas > 1 (cluster.drain_on_stop_s, 30 s by default): the
    grace period must leave it that long after the preStop sleep."""
    copies: dict[str, Any] = {"config": {"cluster": {"replicas": 2}}}
    container = render(copies, "sigterm-drain").container
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    for values in (
        {**copies, "terminationGracePeriodSeconds": 35},  # = 5 + 30
        {"config": {"cluster": {"replicas": 2, "drain_on_stop_s": 60}}},  # 5 + 60 >= 60
    ):
        with helm_python.Chart.load(CHART) as chart, pytest.raises(Exception) as caught:
            chart.render(values, name=RELEASE, namespace=NAMESPACE)
        assert "preStopSleepSeconds + config.cluster.drain_on_stop_s" in str(caught.value)
    render({"config": {"cluster": {"drain_on_stop_s": 60}}}, "one-copy")  # one copy: no drain, no check
