"""The Dockerfile (the chart's default image): ports, user, health check, build context.

These read the Dockerfile and keep it consistent with the broker's configuration and the chart;
tests/process/image runs the built image (bash scripts/build_image.sh) with podman.
"""

from __future__ import annotations

import shlex
import tomllib

import yaml

from broker.config import KEYS, load_config
from tests.support.paths import REPO_ROOT

DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()
IMAGE_CONFIG = REPO_ROOT / "docker" / "skipmq.toml"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = DOCKERFILE.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in instructions():
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def test_image_config_binds_every_listener_on_all_interfaces() -> None:
    assert image_env()["SKIPMQ_CONFIG"] == "/etc/skipmq/skipmq.toml"
    assert f"COPY docker/skipmq.toml {image_env()['SKIPMQ_CONFIG']}" in DOCKERFILE
    config = load_config(str(IMAGE_CONFIG), env={})
    assert config.http.host == "0.0.0.0"  # the broker's own default is 127.0.0.1
    assert config.cluster.host == "0.0.0.0"
    assert (
        config.listeners.tcp.host == config.listeners.tls.host == config.listeners.websocket.host == "0.0.0.0"
    )
    assert config.data_dir == "/var/lib/skipmq"
    assert 'VOLUME ["/var/lib/skipmq"]' in DOCKERFILE


def test_every_port_is_exposed() -> None:
    config = load_config(str(IMAGE_CONFIG), env={})
    exposed = {int(port) for word, rest in instructions() if word == "EXPOSE" for port in rest.split()}
    assert exposed == {
        config.listeners.tcp.port,
        config.listeners.tls.port,
        config.listeners.websocket.port,
        config.http.port,
        config.cluster.port,
    }
    assert exposed == {1883, 8883, 8080, 9090, 7883}


def test_multi_stage_non_root_with_healthcheck() -> None:
    steps = instructions()
    stages = [rest for word, rest in steps if word == "FROM"]
    # the final stage is the trimmed base root (docker/slim-root.sh, run on the base) plus the venv
    assert stages == ["${BASE_IMAGE} AS build", "${BASE_IMAGE} AS runtime-root", "scratch"]
    assert ("ARG", "BASE_IMAGE=python:3.11-slim") in steps  # the public base stays the default
    install = next(rest for word, rest in steps if word == "RUN" and "pip install" in rest)
    assert "--no-cache-dir" in install and "'.[fast]'" in install  # uvloop; not [dev] or [spark]
    assert "uninstall -y -q pip setuptools" in install and "strip --strip-unneeded" in install
    assert "--invalidation-mode unchecked-hash" in install  # bytecode valid on a read-only root
    assert ("COPY", "--from=build /opt/skipmq /opt/skipmq") in steps
    trim = next(rest for word, rest in steps if word == "RUN" and "slim-root.sh" in rest)
    assert "useradd" in trim and "rm -rf /opt/skipmq" in trim  # the venv is there for its checks only
    last_from = max(index for index, (word, _) in enumerate(steps) if word == "FROM")
    assert steps[last_from + 1] == ("COPY", "--from=runtime-root / /")
    env = image_env()
    assert env["PATH"].startswith("/opt/skipmq/bin:")
    (user,) = [rest for word, rest in steps if word == "USER"]
    uid, _, gid = user.partition(":")
    assert int(uid) != 0 and int(gid) != 0
    values = yaml.safe_load((REPO_ROOT / "helm" / "skipmq" / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == int(uid)
    assert values["podSecurityContext"]["runAsGroup"] == int(gid)
    (healthcheck,) = [rest for word, rest in steps if word == "HEALTHCHECK"]
    assert "/healthz" in healthcheck and "SKIPMQ_HTTP_PORT" in healthcheck
    assert KEYS["http.port"].env_var == "SKIPMQ_HTTP_PORT"
    assert ("ENTRYPOINT", '["skipmq"]') in steps


def test_chart_default_image_is_this_build() -> None:
    chart = yaml.safe_load((REPO_ROOT / "helm" / "skipmq" / "Chart.yaml").read_text())
    values = yaml.safe_load((REPO_ROOT / "helm" / "skipmq" / "values.yaml").read_text())
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    assert values["image"]["repository"] == "skipmq" and values["image"]["tag"] in ("", version)
    assert f"docker build -t skipmq:{version} ." in DOCKERFILE


def test_dockerignore_keeps_the_context_to_what_the_build_copies() -> None:
    lines = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"  # everything is excluded (.git, .venv, data, tests, ...) unless listed
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set()
    for word, rest in instructions():
        if word == "COPY" and "--from" not in rest:
            copied.update(rest.split()[:-1])
    assert copied == allowed, "COPY sources and .dockerignore exceptions must agree"
    assert "**/__pycache__" in lines


def test_pipeline_image_runs_skipmq_pipeline_as_the_chart_user() -> None:
    text = (REPO_ROOT / "docker" / "pipeline.Dockerfile").read_text().replace("\\\n", " ")
    steps = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert sum(step.startswith("FROM ") for step in steps) == 2
    assert any("pip wheel" in s and "'.[spark]'" in s for s in steps)
    assert any("openjdk-17-jre-headless" in s for s in steps)  # PySpark 4 needs Java 17+
    (user,) = [s.split()[1] for s in steps if s.startswith("USER ")]
    values = yaml.safe_load((REPO_ROOT / "helm" / "skipmq" / "values.yaml").read_text())
    assert int(user.partition(":")[0]) == values["podSecurityContext"]["runAsUser"]
    assert 'ENTRYPOINT ["skipmq-pipeline"]' in steps
    assert f"WORKDIR {'/var/lib/skipmq-pipeline'}" in steps
    ignore = (REPO_ROOT / "docker" / "pipeline.Dockerfile.dockerignore").read_text().split()
    assert "!pipeline/" in ignore and ignore[0] == "*"
