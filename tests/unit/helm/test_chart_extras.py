"""helm/skipmq: cluster mTLS (issue 12's Helm part), the PrometheusRule and the pipeline Deployment.

The rendered objects are checked against the broker's own loader and certificate code; that the
rendered pods really link over mTLS is tests/process/cluster/test_chart_cluster_tls.py.
"""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from broker.adapters.transport.tls import split_peer_id
from broker.certs import build_parser
from tests.support.paths import REPO_ROOT
from tests.unit.helm.conftest import CHART, NAMESPACE, RELEASE, VALUE_SETS, Rendered, helm_python, render

FULLNAME = f"{RELEASE}-skipmq"
CA_SECRET = f"{FULLNAME}-cluster-ca"


def pod_spec(rendered: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = rendered.statefulset["spec"]["template"]["spec"]
    return spec


def env_sources(container: dict[str, Any]) -> dict[str, str]:
    return {
        e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"] for e in container.get("env", [])
    }


# --- cluster mTLS ----------------------------------------------------------------------------------


def test_cluster_links_use_mutual_tls_by_default(rendered_sets: dict[str, Rendered]) -> None:
    rendered = rendered_sets["default"]
    cluster = tomllib.loads(rendered.config_toml)["cluster"]
    assert "insecure" not in cluster
    mounts = {m["name"]: m["mountPath"] for m in rendered.container["volumeMounts"]}
    assert cluster["tls_ca_file"] == f"{mounts['cluster-ca']}/ca.pem"
    assert cluster["tls_cert_file"] == f"{mounts['cluster-tls']}/broker.pem"
    assert cluster["tls_key_file"] == f"{mounts['cluster-tls']}/broker.key"
    assert "cluster-ca-key" not in mounts  # the broker never sees the CA's key

    (init,) = pod_spec(rendered)["initContainers"]
    init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert init_mounts == {"cluster-ca-key": "/etc/skipmq/cluster-ca", "cluster-tls": mounts["cluster-tls"]}
    assert init["image"] == rendered.container["image"]
    args = build_parser().parse_args(init["args"][1:])  # the image's entrypoint is `skipmq`
    assert init["args"][0] == "certs" and args.command == "issue"
    assert args.dir == init_mounts["cluster-ca-key"] and args.out == mounts["cluster-tls"]
    assert args.name == "broker" and args.days == 365
    # The certificate names the peer id the broker claims: <pod IP>:<cluster port>.
    host, port = split_peer_id(args.peer_id)
    assert host == "$(POD_IP)" and port == cluster["port"]
    assert env_sources(init)["POD_IP"] == "status.podIP"
    assert env_sources(rendered.container)["SKIPMQ_CLUSTER_ADVERTISE_HOST"] == "status.podIP"
    assert init["securityContext"] == rendered.container["securityContext"]

    volumes = {v["name"]: v for v in pod_spec(rendered)["volumes"]}
    assert volumes["cluster-ca"]["secret"] == {
        "secretName": CA_SECRET,
        "defaultMode": 0o440,
        "items": [{"key": "tls.crt", "path": "ca.pem"}],
    }
    assert {"key": "tls.key", "path": "ca.key"} in volumes["cluster-ca-key"]["secret"]["items"]
    assert volumes["cluster-tls"]["emptyDir"]["medium"] == "Memory"


def test_generated_ca_is_a_ca_kept_on_uninstall(rendered_sets: dict[str, Rendered]) -> None:
    rendered = rendered_sets["default"]
    secret = rendered.one("Secret", CA_SECRET)
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    files = rendered.secret_files(CA_SECRET)
    ca = x509.load_pem_x509_certificate(files["tls.crt"])
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert f"{NAMESPACE}/{FULLNAME}" in ca.subject.rfc4514_string()
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(files["tls.key"], password=None)
    assert key.public_key().public_numbers() == ca.public_key().public_numbers()  # type: ignore[union-attr]


def test_a_new_ca_at_each_render_does_not_roll_the_pods() -> None:
    first, second = render({}), render({})
    assert first.secret_files(CA_SECRET) != second.secret_files(CA_SECRET)  # genCA, no cluster to look up
    annotations = [r.statefulset["spec"]["template"]["metadata"]["annotations"] for r in (first, second)]
    assert annotations[0] == annotations[1]


def test_insecure_links_only_when_set_explicitly(rendered_sets: dict[str, Rendered]) -> None:
    off = rendered_sets["cluster-tls-off"]
    cluster = tomllib.loads(off.config_toml)["cluster"]
    assert cluster["insecure"] is True and not any(k.startswith("tls_") for k in cluster)
    assert "initContainers" not in pod_spec(off)
    assert not off.of_kind("Secret")
    for name, rendered in rendered_sets.items():
        if rendered.values.get("clusterTls", {}).get("enabled") is False:
            continue
        assert "insecure" not in tomllib.loads(rendered.config_toml).get("cluster", {}), name
        assert "SKIPMQ_CLUSTER_INSECURE" not in env_sources(rendered.container), name
    assert "WARNING: clusterTls.enabled=false" in off.notes
    assert f"Secret {CA_SECRET}" in rendered_sets["default"].notes


def test_a_single_broker_needs_no_cluster_ca(rendered_sets: dict[str, Rendered]) -> None:
    single = rendered_sets["one-replica"]
    assert "initContainers" not in pod_spec(single)
    assert not single.of_kind("Secret")
    assert "tls_ca_file" not in tomllib.loads(single.config_toml)["cluster"]


def test_ca_from_an_existing_secret(rendered_sets: dict[str, Rendered]) -> None:
    existing = rendered_sets["cluster-tls-existing-secret"]
    assert not existing.of_kind("Secret")
    volumes = {v["name"]: v for v in pod_spec(existing)["volumes"]}
    assert volumes["cluster-ca"]["secret"]["secretName"] == "mq-cluster-ca"
    assert volumes["cluster-ca-key"]["secret"]["secretName"] == "mq-cluster-ca"


def test_ca_from_cert_manager(rendered_sets: dict[str, Rendered]) -> None:
    cm = rendered_sets["cluster-tls-cert-manager"]
    assert not cm.of_kind("Secret")
    issuer = cm.one("Issuer")
    certificate = cm.one("Certificate")
    assert issuer["spec"] == {"selfSigned": {}}
    assert certificate["spec"]["isCA"] is True
    assert certificate["spec"]["secretName"] == CA_SECRET
    assert certificate["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    volumes = {v["name"]: v for v in pod_spec(cm)["volumes"]}
    assert volumes["cluster-ca"]["secret"]["secretName"] == CA_SECRET


def test_grpc_liveness_probe_refused_with_cluster_tls(tmp_path: Path) -> None:
    """The kubelet's gRPC probe speaks plaintext: against the mTLS cluster port it fails (shown
    here with a real transport), so the chart refuses that combination with a clear message."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from broker.adapters.transport.link import GrpcTransport
    from broker.adapters.transport.tls import ClusterTls, TlsFiles, issue_broker_cert, make_ca

    ca, _ = make_ca(tmp_path)
    cert, key = issue_broker_cert(tmp_path, "127.0.0.1:1")

    async def check() -> str:
        transport = GrpcTransport(
            advertise_host="127.0.0.1",
            on_receive=lambda _p, _i: None,
            on_peer_down=lambda _p: None,
            tls=ClusterTls(TlsFiles(str(ca), str(cert), str(key))),
        )
        port = await transport.start("127.0.0.1", 0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                try:
                    await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
                except grpc.aio.AioRpcError as exc:
                    return exc.code().name
                return "SERVING"
        finally:
            await transport.stop()

    assert asyncio.run(check()) != "SERVING"
    grpc_probe = {"liveness": {**VALUE_SETS["nested-config"]["probes"]["liveness"]}}
    with helm_python.Chart.load(CHART) as chart, pytest.raises(Exception) as caught:
        chart.render({"probes": grpc_probe}, name=RELEASE, namespace=NAMESPACE)
    message = "probes.liveness.type=grpc cannot check a cluster port that requires mutual TLS"
    assert message in str(caught.value)


# --- PrometheusRule --------------------------------------------------------------------------------------


def test_prometheus_rule_carries_the_rules_file(rendered_sets: dict[str, Rendered]) -> None:
    link = CHART / "files" / "skipmq.rules.yml"
    assert link.is_symlink(), "helm/skipmq/files/skipmq.rules.yml must link to the rules file"
    assert link.resolve() == (REPO_ROOT / "deploy" / "prometheus" / "skipmq.rules.yml").resolve()
    rules = yaml.safe_load(link.read_text())
    rule = rendered_sets["monitoring"].one("PrometheusRule")
    assert rule["spec"]["groups"] == rules["groups"]
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    # the alerts' job selector matches the ServiceMonitor's job (the peers Service's name)
    assert "skipmq" in f"{FULLNAME}-peers"
    assert not rendered_sets["default"].of_kind("PrometheusRule")


# --- the pipeline Deployment -------------------------------------------------------------------------------


def test_pipeline_deployment_reads_every_broker(rendered_sets: dict[str, Rendered]) -> None:
    rendered = rendered_sets["pipeline"]
    deployment = rendered.one("Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # one writer per checkpoint
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "skipmq-pipeline:0.1.0"

    from pipeline.cli import parser as pipeline_parser

    args = pipeline_parser().parse_args(container["args"])
    assert args.master == "local[2]" and args.window == "5 minutes" and args.top_k == 5
    peers = f"{FULLNAME}-peers.{NAMESPACE}.svc"
    assert args.mqtt.split(",") == [f"{FULLNAME}-{i}.{peers}:11883" for i in range(4)]
    assert args.http == f"http://{FULLNAME}-0.{peers}:19090"
    assert args.metrics_port == 9108  # the job's own /metrics, on the container port named so
    assert {"name": "metrics", "containerPort": 9108} in container["ports"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts[args.out] == "out"
    claim = rendered.one("PersistentVolumeClaim")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["out"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True and "/tmp" in mounts
    for name, other in rendered_sets.items():
        if name != "pipeline":
            assert not other.of_kind("Deployment"), name


# --- values.schema.json: the new keys ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"cluster": {"insecure": True}}}, "additional properties 'insecure' not allowed"),
        ({"config": {"cluster": {"tls_ca_file": "/ca.pem"}}}, "additional properties 'tls_ca_file'"),
        ({"clusterTls": {"enabled": "no"}}, "/clusterTls/enabled': got string, want boolean"),
        ({"clusterTls": {"certDays": 0}}, "/clusterTls/certDays': minimum: got 0, want 1"),
        ({"clusterTls": {"certManager": {"duration": "10y"}}}, "/clusterTls/certManager/duration"),
        ({"metrics": {"prometheusRule": {"enabled": 1}}}, "/metrics/prometheusRule/enabled"),
        ({"pipeline": {"master": "spark://x:7077"}}, "/pipeline/master"),
        ({"pipeline": {"window": "1 min"}}, "/pipeline/window"),
        ({"pipeline": {"persistence": {"size": "5 GB"}}}, "/pipeline/persistence/size"),
    ],
)
def test_schema_rejects_bad_new_values(values: dict[str, Any], message: str) -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmValuesError) as caught:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(caught.value)
