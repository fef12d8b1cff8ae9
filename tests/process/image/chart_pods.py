"""Pods of the rendered helm/skipmq StatefulSet, run by podman the way the kubelet runs them.

helm/skipmq is rendered with the Helm v4 SDK (helm-python-sdk, as tests/unit/helm does). A
:class:`ChartPod` then realises one pod of the rendered StatefulSet with the image under test:

* a podman pod (its own network namespace and IP on a test network, hostname = the pod name)
  stands for the Kubernetes pod; a network alias equal to the headless peer Service's name
  (``<release>-skipmq-peers.<namespace>.svc``) on every pod makes that name resolve to every pod,
  as the Service's DNS record does (podman's aardvark-dns);
* every volume of the pod spec becomes a host directory: a ConfigMap or Secret volume holds the
  rendered object's items (Secret files root:fsGroup with ``defaultMode``), an ``emptyDir`` is
  empty, the ``data`` claim of ``volumeClaimTemplates`` is group-owned by ``fsGroup`` and outlives
  the containers (a PersistentVolume);
* each container runs with its rendered ``args``, ``env`` (``fieldRef`` metadata.name and
  status.podIP filled in, ``$(VAR)`` expanded in the arguments as Kubernetes does), volume mounts
  (``readOnly`` kept) and security context: ``runAsUser``/``runAsGroup`` as ``--user``,
  ``fsGroup`` as a supplementary group, ``readOnlyRootFilesystem`` as ``--read-only`` (no tmpfs
  added by podman: only the chart's volumes are writable), ``drop: [ALL]`` as ``--cap-drop ALL``,
  ``allowPrivilegeEscalation: false`` as ``no-new-privileges``; init containers run to completion
  first;
* stopping does what the kubelet does on pod deletion: the ``preStop`` exec hook inside the
  container, then SIGTERM, then SIGKILL when ``terminationGracePeriodSeconds`` (counted from the
  start of the hook) has run out.

Nothing here imports the broker: the containers are the system under test.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO_ROOT

CHART = REPO_ROOT / "helm" / "skipmq"
RELEASE, NAMESPACE = "mq", "brokers"
PODMAN_TIMEOUT_S = 120.0


def podman_command() -> list[str]:
    """podman, with runc where it is installed (crun refuses this machine's hybrid cgroups)."""
    return ["podman", "--runtime", "runc"] if shutil.which("runc") else ["podman"]


def podman(
    *args: str, check: bool = True, timeout_s: float = PODMAN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*podman_command(), *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} -> {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


def render_chart(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's objects for ``values`` (merged over values.yaml), as ``helm template`` gives."""
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return [
        doc
        for name, text in sorted(manifests.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def http_get(host: str, port: int, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    """GET http://host:port/path -> (status, body); connection errors raise OSError."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


class ChartPod:
    """One pod (``index``) of the rendered StatefulSet, in podman on ``network``."""

    def __init__(
        self,
        objects: list[dict[str, Any]],
        index: int,
        *,
        image: str,
        network: str,
        root: Path,
        suffix: str,
    ) -> None:
        self.objects = objects
        self.image = image
        self.network = network
        self.root = root
        self.name = f"{RELEASE}-skipmq-{index}"  # metadata.name: the hostname and the node id
        self.pod = f"{self.name}-{suffix}"  # podman's name, unique per test run
        self.statefulset = one(objects, "StatefulSet")
        self.spec: dict[str, Any] = self.statefulset["spec"]["template"]["spec"]
        self.broker_spec: dict[str, Any] = self.spec["containers"][0]
        self.volumes = {volume["name"]: volume for volume in self.spec["volumes"]}
        for claim in self.statefulset["spec"].get("volumeClaimTemplates", []):
            self.volumes[claim["metadata"]["name"]] = {"name": claim["metadata"]["name"], "claim": claim}
        self.ip = ""
        self.container = f"{self.pod}-skipmq"
        self.starts = 0
        self._made: set[str] = set()

    # ---- the pod ---------------------------------------------------------------------------
    @property
    def grace_period_s(self) -> int:
        return int(self.spec["terminationGracePeriodSeconds"])

    @property
    def fs_group(self) -> int:
        return int(self.spec["securityContext"]["fsGroup"])

    def port(self, name: str) -> int:
        """The broker container's port called ``name`` (mqtt, http, cluster)."""
        (number,) = [p["containerPort"] for p in self.broker_spec["ports"] if p["name"] == name]
        return int(number)

    def headless_service(self) -> str:
        peers = one(self.objects, "Service", f"{RELEASE}-skipmq-peers")
        return f"{peers['metadata']['name']}.{NAMESPACE}.svc"

    def create(self) -> None:
        """The pod's network namespace: an IP on the test network, the headless Service's name."""
        podman(
            "pod", "create", "--name", self.pod, "--hostname", self.name, "--network", self.network,
            "--network-alias", self.headless_service(), "--label", "skipmq-test=image",
        )  # fmt: skip
        podman("pod", "start", self.pod)
        infra = podman("pod", "inspect", "--format", "{{.InfraContainerID}}", self.pod).stdout.strip()
        networks = json.loads(
            podman("inspect", "--format", "{{json .NetworkSettings.Networks}}", infra).stdout
        )
        self.ip = networks[self.network]["IPAddress"]
        assert self.ip, networks

    def remove(self) -> None:
        podman("pod", "rm", "-f", "-t", "0", self.pod, check=False)

    # ---- volumes ---------------------------------------------------------------------------
    def volume_dir(self, name: str) -> Path:
        """The host directory standing for volume ``name``, made on first use."""
        path = self.root / "volumes" / name
        if name in self._made:
            return path
        self._made.add(name)
        volume = self.volumes[name]
        path.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            data = one(self.objects, "ConfigMap", volume["configMap"]["name"])["data"]
            for key, text in data.items():
                (path / key).write_text(text)
        elif "secret" in volume:
            secret = one(self.objects, "Secret", volume["secret"]["secretName"])
            mode = int(volume["secret"].get("defaultMode", 0o644))
            for item in volume["secret"]["items"]:
                file = path / item["path"]
                file.write_bytes(base64.b64decode(secret["data"][item["key"]]))
                os.chown(file, 0, self.fs_group)
                file.chmod(mode)
        elif "emptyDir" in volume:
            path.chmod(0o777)
        elif "claim" in volume:  # a fresh PersistentVolume with fsGroup applied
            os.chown(path, 0, self.fs_group)
            path.chmod(0o2775)
        else:
            raise AssertionError(f"volume type not modelled: {volume}")
        return path

    # ---- containers ------------------------------------------------------------------------
    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        fields = {"metadata.name": self.name, "status.podIP": self.ip}
        env: dict[str, str] = {}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = str(item["value"])
            else:
                env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        return env

    def _run_args(self, container: dict[str, Any]) -> list[str]:
        """podman run options for the container's env, mounts and security context."""
        pod_security = self.spec["securityContext"]
        security = {**pod_security, **container.get("securityContext", {})}
        options = ["--pod", self.pod, "--label", "skipmq-test=image"]
        options += ["--user", f"{security['runAsUser']}:{security['runAsGroup']}"]
        options += ["--group-add", str(pod_security["fsGroup"])]
        if security.get("readOnlyRootFilesystem"):
            options += ["--read-only", "--read-only-tmpfs=false"]
        for capability in security.get("capabilities", {}).get("drop", []):
            options += ["--cap-drop", capability]
        if security.get("allowPrivilegeEscalation") is False:
            options += ["--security-opt", "no-new-privileges"]
        for name, value in self._env(container).items():
            options += ["--env", f"{name}={value}"]
        for mount in container.get("volumeMounts", []):
            source = self.volume_dir(mount["name"])
            options += ["--volume", f"{source}:{mount['mountPath']}{':ro' if mount.get('readOnly') else ''}"]
        return options

    def _args(self, container: dict[str, Any]) -> list[str]:
        env = self._env(container)
        return [
            re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in container["args"]
        ]

    def run_init_containers(self) -> list[subprocess.CompletedProcess[str]]:
        """Every init container, in order, to completion (as the kubelet runs them)."""
        done = []
        for container in self.spec.get("initContainers", []):
            result = podman(
                "run", "--rm", "--name", f"{self.pod}-{container['name']}", *self._run_args(container),
                self.image, *self._args(container), check=False,
            )  # fmt: skip
            assert result.returncode == 0, (
                f"init container {container['name']}: {result.stderr}{result.stdout}"
            )
            done.append(result)
        return done

    def start(self) -> None:
        """A new broker container in the pod (a restart gets a new container, volumes stay)."""
        podman("rm", "-f", "-t", "0", self.container, check=False)
        podman(
            "run", "--detach", "--name", self.container, *self._run_args(self.broker_spec),
            self.image, *self._args(self.broker_spec),
        )  # fmt: skip
        self.starts += 1

    def http(self, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
        return http_get(self.ip, self.port("http"), path, timeout_s)

    def running(self) -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", self.container, check=False)
        return state.stdout.strip() == "true"

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until GET /readyz answers 200 (the startup and readiness probes' path)."""
        started = time.monotonic()
        while True:
            assert self.running(), f"{self.name} exited:\n{self.logs()[-3000:]}"
            try:
                if self.http("/readyz", timeout_s=1.0)[0] == 200:
                    return time.monotonic() - started
            except OSError:
                pass
            assert time.monotonic() - started < timeout_s, f"{self.name} not ready:\n{self.logs()[-3000:]}"
            time.sleep(0.05)

    def logs(self) -> str:
        done = podman("logs", self.container, check=False)
        return done.stdout + done.stderr

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.container, *command, check=False)

    def exit_code(self) -> int:
        return int(podman("inspect", "--format", "{{.State.ExitCode}}", self.container).stdout.strip())

    def terminate(self) -> tuple[float, int]:
        """Pod deletion as the kubelet does it: the preStop hook, SIGTERM, SIGKILL once
        terminationGracePeriodSeconds (counted from the hook's start) ran out. Returns (seconds
        from the hook's start until the container exited, its exit code)."""
        started = time.monotonic()
        hook = self.broker_spec.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        if hook:
            done = self.exec(*hook)
            assert done.returncode == 0, f"preStop {hook}: {done.stderr}"
        remaining = max(1, int(self.grace_period_s - (time.monotonic() - started)))
        podman("stop", "--time", str(remaining), self.container, timeout_s=remaining + 30)
        return time.monotonic() - started, self.exit_code()

    def kill(self) -> int:
        podman("kill", "--signal", "KILL", self.container)
        podman("wait", self.container, check=False)
        return self.exit_code()
