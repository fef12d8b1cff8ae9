"""The Helm chart's cluster mTLS, run for real: brokers started as the chart's pods start link.

helm/skipmq is rendered with its defaults (cluster TLS on, a Helm-generated CA). Each of three
"pods" then does what the rendered StatefulSet says, with real processes:

* the init container ``cluster-cert`` runs its rendered arguments (``skipmq certs issue`` with the
  CA files of the rendered Secret, ``$(POD_IP)`` filled in) and writes the pod's certificate;
* the broker runs with the rendered ``skipmq.toml``, the container's environment (the peer id is
  the pod IP) and the files where the rendered volumes put them.

What a pod's own network namespace gives is stood in for by a loopback address per pod
(127.0.0.2-4: every listener bound there) and the headless service's DNS answer by the list of
those addresses in ``cluster.join``; nothing else is changed. Checked: every broker becomes ready
(``/readyz``) with links to both others, messages cross brokers, no broker warns of plaintext
links; and a process holding a certificate from another CA is refused (never joins).
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cluster import ClusterClient, unique_id, wait_until
from tools.launcher import http_get

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk is in the [dev] extra")

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "skipmq"
SKIPMQ = str(Path(sys.executable).with_name("skipmq"))
RELEASE, NAMESPACE = "mq", "brokers"
PODS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
READY_TIMEOUT_S = 40.0


def free_port_on_all(hosts: list[str]) -> int:
    """A port that every one of ``hosts`` can bind now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = int(probe.getsockname()[1])
        try:
            for host in hosts[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no port free on every pod address")


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for name, text in sorted(manifests.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [obj for obj in objects if obj["kind"] == kind]
    return found


class Pod:
    """One pod of the rendered StatefulSet, as processes on a loopback address."""

    def __init__(self, objects: list[dict[str, Any]], index: int, address: str, root: Path) -> None:
        self.index, self.address, self.root = index, address, root
        self.name = f"{RELEASE}-skipmq-{index}"
        sts = one(objects, "StatefulSet")
        spec = sts["spec"]["template"]["spec"]
        self.init = spec["initContainers"][0]
        self.broker = spec["containers"][0]
        self.volumes = {v["name"]: v for v in spec["volumes"]}
        self.secrets = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "Secret"}
        self.config_text: str = one(objects, "ConfigMap")["data"]["skipmq.toml"]
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = root / "broker.log"

    def _mount(self, container: dict[str, Any]) -> dict[str, Path]:
        """The container's mount paths -> directories holding what Kubernetes would put there."""
        mounts: dict[str, Path] = {}
        for mount in container["volumeMounts"]:
            volume = self.volumes.get(mount["name"])
            target = self.root / "volumes" / mount["name"]
            target.mkdir(parents=True, exist_ok=True)
            if volume is not None and "secret" in volume:
                data = self.secrets[volume["secret"]["secretName"]]["data"]
                for item in volume["secret"]["items"]:
                    path = target / item["path"]
                    path.write_bytes(base64.b64decode(data[item["key"]]))
                    path.chmod(0o440)
            mounts[mount["mountPath"]] = target
        return mounts

    def _fill(self, text: str, mounts: dict[str, Path], env: dict[str, str]) -> str:
        for name, value in env.items():
            text = text.replace(f"$({name})", value)
        # one pass, longest mount first, only where a path starts (after a quote or at the start)
        ordered = sorted(mounts, key=len, reverse=True)
        pattern = re.compile(r'(^|")(' + "|".join(re.escape(m) for m in ordered) + r")(?=/|\"|$)")
        return pattern.sub(lambda match: match.group(1) + str(mounts[match.group(2)]), text)

    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        fields = {"metadata.name": self.name, "status.podIP": self.address}
        return {
            e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
            for e in container.get("env", [])
        }

    def run_init(self) -> None:
        mounts = self._mount(self.init)
        env = self._env(self.init)
        args = [self._fill(arg, mounts, env) for arg in self.init["args"]]
        done = subprocess.run([SKIPMQ, *args], capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr.decode()

    def start(self, join: str) -> None:
        mounts = self._mount(self.broker)
        env = self._env(self.broker)
        config = self.root / "skipmq.toml"
        config.write_text(self._fill(self.config_text, mounts, env))
        config_arg = self.broker["args"][self.broker["args"].index("--config") + 1]
        assert config_arg.startswith("/etc/skipmq/config/")
        # the pod's own network namespace and the headless service's answer (module docstring)
        env.update(
            SKIPMQ_LISTENERS_TCP_HOST=self.address,
            SKIPMQ_HTTP_HOST=self.address,
            SKIPMQ_CLUSTER_HOST=self.address,
            SKIPMQ_CLUSTER_JOIN=join,
        )
        base = {k: v for k, v in os.environ.items() if not k.startswith("SKIPMQ_")}
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [SKIPMQ, "--config", str(config)], env={**base, **env}, stdout=log, stderr=subprocess.STDOUT
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[tuple[list[Pod], dict[str, Any]]]:
    ports = {name: free_port_on_all(PODS) for name in ("mqtt", "http", "cluster")}
    values = {
        "config": {
            "listeners": {"tcp": {"port": ports["mqtt"]}},
            "http": {"port": ports["http"]},
            "cluster": {"port": ports["cluster"], "ping_interval_ms": 500, "failure_timeout_ms": 2000},
        }
    }
    objects = render(values)
    made = [Pod(objects, i, address, tmp_path / f"pod{i}") for i, address in enumerate(PODS)]
    yield made, {**ports, "values": values}
    for pod in made:
        pod.stop()


def wait_ready(pods: list[Pod], http_port: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    waiting = list(pods)
    while waiting and time.monotonic() < deadline:
        for pod in list(waiting):
            assert pod.process is not None and pod.process.poll() is None, pod.log()[-3000:]
            try:
                status, _ = http_get(http_port, "/readyz", timeout_s=1.0, host=pod.address)
            except OSError:
                continue
            if status == 200:
                waiting.remove(pod)
        time.sleep(0.1)
    assert not waiting, "\n".join(f"{p.name}:\n{p.log()[-2000:]}" for p in waiting)


def test_chart_pods_link_over_mutual_tls(pods: tuple[list[Pod], dict[str, Any]], tmp_path: Path) -> None:
    members, ports = pods
    values = ports["values"]
    join = ",".join(f"{address}:{ports['cluster']}" for address in PODS)
    for pod in members:
        pod.run_init()
        cert = pod.root / "volumes" / "cluster-tls" / "broker.pem"
        assert cert.exists(), list((pod.root / "volumes").rglob("*"))
    for pod in members:
        pod.start(join)
    wait_ready(members, ports["http"])

    for pod in members:  # every broker linked to both others, by their pod-IP peer ids
        _, body = http_get(ports["http"], "/cluster", timeout_s=2.0, host=pod.address)
        state = json.loads(body)
        assert state["joined"] is True
        others = {f"{p.address}:{ports['cluster']}" for p in members if p is not pod}
        text = json.dumps(state)
        assert all(other in text for other in others), state
        assert "cluster.insecure" not in pod.log()

    topic = f"{unique_id('chart')}/t"
    subs = [ClusterClient(ports["mqtt"], host=pod.address) for pod in members]
    pub = ClusterClient(ports["mqtt"], host=members[0].address)
    try:
        for sub in subs:
            assert sub.subscribe(topic, 1) == [1]
        deadline = time.monotonic() + 20.0
        got: dict[int, list[bytes]] = {}
        number = 0
        # publish until a message reaches every subscriber (the subscriptions spread first)
        while time.monotonic() < deadline and len(got) < len(subs):
            pub.publish(topic, f"m{number}".encode(), 1)
            for index, sub in enumerate(subs):
                received = sub.wait_messages(1, timeout_s=0.3) if index not in got else []
                if received:
                    got[index] = [m.payload for m in received]
            number += 1
        assert len(got) == len(subs), f"messages reached subscribers {sorted(got)} only"
    finally:
        for client in [*subs, pub]:
            client.close()

    # A pod of another install of the chart (another generated CA) given this cluster's seeds
    # never joins: the brokers refuse its certificate in the TLS handshake.
    address = "127.0.0.5"
    outsider = Pod(render(values), 3, address, tmp_path / "outsider")
    assert outsider.secrets != members[0].secrets  # genCA made another CA
    try:
        outsider.run_init()
        outsider.start(join)

        def readyz() -> int | None:
            assert outsider.process is not None and outsider.process.poll() is None, outsider.log()
            try:
                return http_get(ports["http"], "/readyz", timeout_s=1.0, host=address)[0]
            except OSError:
                return None  # not listening yet (a loaded machine starts brokers slowly)

        wait_until(lambda: readyz() is not None, timeout_s=30, what="the outsider's HTTP listener")
        time.sleep(3.0)  # time enough to join, had its certificate been accepted
        assert readyz() == 503, outsider.log()[-2000:]
        for pod in members:
            _, body = http_get(ports["http"], "/cluster", timeout_s=2.0, host=pod.address)
            assert address not in body.decode(), body
    finally:
        outsider.stop()
