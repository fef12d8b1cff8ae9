"""Renders helm/skipmq with the Helm v4 SDK (helm-python-sdk, no helm binary) once per value set.

Rendering takes milliseconds, but the value sets are shared by several test modules, so each is
rendered once per session (``rendered`` fixture) and parsed into Kubernetes objects.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests.support.paths import REPO_ROOT

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk is in the [dev] extra")

CHART = REPO_ROOT / "helm" / "skipmq"
RELEASE = "mq"
NAMESPACE = "brokers"

# PEM-shaped placeholders: the chart and the loader only need the files to exist.
FAKE_CERT = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
FAKE_KEY = "-----BEGIN PRIVATE KEY-----\nMIIBfake\n-----END PRIVATE KEY-----\n"

# The value sets CI renders: name -> values given to the chart (merged over values.yaml).
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "tls": {
        "tls": {"enabled": True, "certificate": FAKE_CERT, "key": FAKE_KEY, "ca": FAKE_CERT},
        "config": {"listeners": {"tls": {"port": 8884, "require_client_cert": True}}},
    },
    "tls-existing-secret": {
        "tls": {"enabled": True, "existingSecret": "mq-certs", "existingSecretCaKey": "client-ca.pem"},
    },
    "no-persistence": {"persistence": {"enabled": False}},
    "one-replica": {"replicaCount": 1},
    "five-replicas": {"replicaCount": 5, "podAntiAffinity": {"type": "hard"}},
    "monitoring": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
            "grafanaDashboards": {"enabled": True, "annotations": {"grafana_folder": "SkipMQ"}},
        }
    },
    "nested-config": {
        "config": {
            "listeners": {
                "tcp": {"port": 11883},
                "websocket": {"enabled": True, "port": 18080, "path": "/ws/mqtt"},
            },
            "http": {"port": 19090},
            "cluster": {
                "port": 17883,
                "class_levels": 2,
                "causal_groups": "orders/#,audit/+",
                "failure_timeout_ms": 9000,
            },
            "limits": {"max_packet_size_bytes": 2097152, "max_session_expiry_s": 4294967295},
            "store": {"synchronous": "full"},
            "sys": {"interval_s": 0},
            "auth": {"allow_anonymous": False},
        },
        "auth": {"passwordFile": "alice:$scrypt$fake\n", "aclFile": "user alice\ntopic readwrite #\n"},
        "service": {
            "type": "NodePort",
            "nodePorts": {"mqtt": 31883, "ws": 31080},
            "externalTrafficPolicy": "Local",
            "annotations": {"example.com/owner": "iot"},
        },
        "probes": {
            "liveness": {"type": "grpc", "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 6}
        },
        # the kubelet's gRPC probe cannot pass mutual TLS (test_chart_extras)
        "clusterTls": {"enabled": False},
    },
    "cluster-tls-off": {"clusterTls": {"enabled": False}},
    "cluster-tls-existing-secret": {"clusterTls": {"existingSecret": "mq-cluster-ca"}},
    "cluster-tls-cert-manager": {"clusterTls": {"certManager": {"enabled": True}}},
    "pipeline": {
        "replicaCount": 4,
        "pipeline": {"enabled": True, "window": "5 minutes", "extraArgs": ["--top-k", "5"]},
        "config": {"listeners": {"tcp": {"port": 11883}}, "http": {"port": 19090}},
    },
    "load-balancer-auth-secret": {
        "service": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0/8"]},
        "auth": {"existingSecret": "mq-users", "existingSecretAclFileKey": "acl.conf"},
    },
}


@dataclass
class Rendered:
    """One value set's rendering: the manifests by template and the parsed objects."""

    name: str
    values: dict[str, Any]
    manifests: dict[str, str]
    objects: list[dict[str, Any]] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [obj for obj in self.of_kind(kind) if name is None or obj["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.name}: expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    @property
    def statefulset(self) -> dict[str, Any]:
        return self.one("StatefulSet")

    @property
    def container(self) -> dict[str, Any]:
        containers: list[dict[str, Any]] = self.statefulset["spec"]["template"]["spec"]["containers"]
        assert len(containers) == 1
        return containers[0]

    @property
    def config_toml(self) -> str:
        text: str = self.one("ConfigMap", f"{RELEASE}-skipmq")["data"]["skipmq.toml"]
        return text

    def secret_files(self, name: str) -> dict[str, bytes]:
        secret = self.one("Secret", name)
        return {key: base64.b64decode(value) for key, value in secret.get("data", {}).items()}

    @property
    def notes(self) -> str:
        return self.manifests.get("skipmq/templates/NOTES.txt", "")


def render(values: dict[str, Any], name: str = "values") -> Rendered:
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    rendered = Rendered(name=name, values=values, manifests=manifests)
    for template, text in sorted(manifests.items()):
        if not template.endswith(".yaml"):
            continue
        for document in yaml.safe_load_all(text):
            if document:
                rendered.objects.append(document)
    return rendered


@pytest.fixture(scope="session")
def rendered_sets() -> dict[str, Rendered]:
    return {name: render(values, name) for name, values in VALUE_SETS.items()}


@pytest.fixture(params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest, rendered_sets: dict[str, Rendered]) -> Iterator[Rendered]:
    yield rendered_sets[request.param]
