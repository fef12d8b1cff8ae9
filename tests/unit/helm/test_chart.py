"""helm/skipmq: lint, render, validate against Kubernetes' schemas, and check the rendered objects.

Every value set of conftest.VALUE_SETS is rendered with the Helm v4 SDK; each manifest is
validated with kubernetes-validate (strict: unknown fields are errors) for every Kubernetes
version from 1.30 to the newest it knows; the rendered skipmq.toml is loaded by the broker's own
loader (broker.config.load_config), and the container ports, Services and probes are checked
against what that loader returns.
"""

from __future__ import annotations

import asyncio
import functools
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.config import BrokerConfig, load_config
from tests.support.paths import REPO_ROOT
from tests.unit.helm.conftest import CHART, NAMESPACE, RELEASE, VALUE_SETS, Rendered, helm_python, render

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in [dev]")
from kubernetes_validate import utils as kv_utils  # noqa: E402

FULLNAME = f"{RELEASE}-skipmq"
PEERS = f"{FULLNAME}-peers"
MIN_KUBERNETES = (1, 30)
# Custom resources kubernetes-validate has no schema for; checked by hand below.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule", "Issuer", "Certificate"}


@pytest.fixture(scope="module", autouse=True)
def _schemas_read_once() -> Iterator[None]:
    """kubernetes-validate reads and parses its JSON schemas (the definitions file is megabytes)
    and lists its version directories on every call: ~1,000 calls here. Read once, the same
    schemas validate the same objects (about 0.5 s -> 0.07 s of CPU per value set)."""
    patch = pytest.MonkeyPatch()
    patch.setattr(kv_utils, "schema_contents", functools.cache(kv_utils.schema_contents))
    patch.setattr(kv_utils, "all_versions", functools.cache(kv_utils.all_versions))
    yield
    patch.undo()


def kubernetes_versions() -> list[str]:
    versions = sorted(
        {v for v in kv_utils.all_versions() if tuple(int(p) for p in v.split(".")[:2]) >= MIN_KUBERNETES},
        key=lambda v: tuple(int(p) for p in v.split(".")),
    )
    assert versions, "kubernetes-validate knows no version >= 1.30"
    return versions


# --- lint and Kubernetes schemas -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_strict_is_clean(name: str) -> None:
    report = helm_python.lint(CHART, VALUE_SETS[name], strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, (report["errors"], problems)


def test_every_manifest_is_valid_kubernetes(rendered: Rendered) -> None:
    versions = kubernetes_versions()
    assert versions[0] == "1.30.0"
    for obj in rendered.objects:
        if obj["kind"] in CUSTOM_KINDS:
            with pytest.raises(kv_utils.SchemaNotFoundError):
                kv_utils.validate(obj, versions[-1], strict=True)
            continue
        for version in versions:
            try:
                kv_utils.validate(obj, version, strict=True)
            except kv_utils.ValidationError as exc:
                pytest.fail(f"{rendered.name}: {obj['kind']} {obj['metadata']['name']} on {version}: {exc}")


def test_every_object_is_namespaced_and_labelled(rendered: Rendered) -> None:
    for obj in rendered.objects:
        meta = obj["metadata"]
        assert meta["namespace"] == NAMESPACE, (obj["kind"], meta["name"])
        assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"


# --- the broker configuration ------------------------------------------------------------------------


def load_rendered_config(rendered: Rendered, tmp_path: Path) -> BrokerConfig:
    """Load the rendered skipmq.toml with the broker's loader, as the pod would see it: the files
    of the mounted Secrets under the paths the config names, the pod's environment."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    text = rendered.config_toml
    sts = rendered.statefulset
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in rendered.container["volumeMounts"]}
    for volume in ("tls", "auth", "cluster-ca"):
        if volume not in volumes:
            continue
        source = volumes[volume]["secret"]
        secret = [s for s in rendered.of_kind("Secret") if s["metadata"]["name"] == source["secretName"]]
        files = rendered.secret_files(source["secretName"]) if secret else {}
        target = tmp_path / volume
        target.mkdir()
        for item in source["items"]:
            # A Secret the chart does not make (existingSecret) is stood in for by placeholder files.
            (target / item["path"]).write_bytes(files.get(item["key"], b"placeholder\n"))
            if secret:
                assert item["key"] in files, f"{volume} volume wants key {item['key']} the Secret lacks"
        text = text.replace(f'"{mounts[volume]}/', f'"{target}/')
    path = tmp_path / "skipmq.toml"
    path.write_text(text)
    # The container's SKIPMQ_* variables, with what Kubernetes would fill in for fieldRefs; an
    # unknown name would show up in config.warnings.
    field_values = {"metadata.name": f"{FULLNAME}-0", "status.podIP": "10.1.2.3"}
    env = {
        e["name"]: e["value"] if "value" in e else field_values[e["valueFrom"]["fieldRef"]["fieldPath"]]
        for e in rendered.container.get("env", [])
    }
    config = load_config(str(path), env=env)
    assert not config.warnings, config.warnings
    return config


def test_rendered_config_is_valid_toml_and_loads(rendered: Rendered, tmp_path: Path) -> None:
    tomllib.loads(rendered.config_toml)  # raises on a table declared twice, etc.
    config = load_rendered_config(rendered, tmp_path)
    assert config.data_dir == "/var/lib/skipmq"
    assert config.http.enabled and config.http.host == "0.0.0.0"
    mounts = {m["mountPath"] for m in rendered.container["volumeMounts"]}
    assert config.data_dir in mounts


def test_nested_config_values_arrive_in_the_broker_config(
    rendered_sets: dict[str, Rendered], tmp_path: Path
) -> None:
    config = load_rendered_config(rendered_sets["nested-config"], tmp_path)
    assert config.listeners.websocket.enabled
    assert (config.listeners.websocket.port, config.listeners.websocket.path) == (18080, "/ws/mqtt")
    assert config.listeners.tcp.port == 11883 and config.http.port == 19090
    assert config.cluster.port == 17883 and config.cluster.class_levels == 2
    assert config.cluster.causal_groups == "orders/#,audit/+"
    assert config.cluster.failure_timeout_ms == 9000
    assert config.cluster.table_size == 60  # values.yaml default kept beside the override
    assert config.limits.max_packet_size_bytes == 2097152  # not 2.097152e+06
    assert config.limits.max_session_expiry_s == 4294967295
    assert config.store.synchronous == "full" and config.sys.interval_s == 0
    assert not config.auth.allow_anonymous
    assert config.auth.password_file.endswith("/auth/passwd") and config.auth.acl_file.endswith("/auth/acl")
    assert config.cluster.join == f"{PEERS}.{NAMESPACE}.svc:17883"


def test_clustering_follows_the_replica_count(rendered_sets: dict[str, Rendered], tmp_path: Path) -> None:
    single = load_rendered_config(rendered_sets["one-replica"], tmp_path / "one")
    assert not single.cluster.enabled
    assert rendered_sets["one-replica"].statefulset["spec"]["replicas"] == 1
    five = rendered_sets["five-replicas"]
    assert five.statefulset["spec"]["replicas"] == 5
    config = load_rendered_config(five, tmp_path / "five")
    assert config.cluster.enabled and config.cluster.host == "0.0.0.0"
    assert config.cluster.join == f"{PEERS}.{NAMESPACE}.svc:7883"
    assert config.cluster.advertise_host == "10.1.2.3"  # from status.podIP
    env = {e["name"]: e for e in five.container["env"]}
    assert env["SKIPMQ_CLUSTER_ADVERTISE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["SKIPMQ_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_tls_files_come_from_the_secret(rendered_sets: dict[str, Rendered], tmp_path: Path) -> None:
    tls = rendered_sets["tls"]
    config = load_rendered_config(tls, tmp_path)
    assert config.listeners.tls.enabled and config.listeners.tls.port == 8884
    assert config.listeners.tls.require_client_cert
    assert Path(config.listeners.tls.certfile).read_text() == VALUE_SETS["tls"]["tls"]["certificate"]
    assert Path(config.listeners.tls.keyfile).read_text() == VALUE_SETS["tls"]["tls"]["key"]
    assert Path(config.listeners.tls.cafile).read_text() == VALUE_SETS["tls"]["tls"]["ca"]
    assert tls.one("Secret", f"{FULLNAME}-tls")["type"] == "kubernetes.io/tls"
    existing = rendered_sets["tls-existing-secret"]
    assert [s["metadata"]["name"] for s in existing.of_kind("Secret")] == [f"{FULLNAME}-cluster-ca"]
    volume = next(
        v for v in existing.statefulset["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"
    )
    assert volume["secret"]["secretName"] == "mq-certs"
    assert {"key": "client-ca.pem", "path": "ca.crt"} in volume["secret"]["items"]


def test_auth_files_from_an_existing_secret(rendered_sets: dict[str, Rendered], tmp_path: Path) -> None:
    rendered = rendered_sets["load-balancer-auth-secret"]
    config = load_rendered_config(rendered, tmp_path)
    assert config.auth.password_file and config.auth.acl_file
    assert [s["metadata"]["name"] for s in rendered.of_kind("Secret")] == [f"{FULLNAME}-cluster-ca"]
    volume = next(
        v for v in rendered.statefulset["spec"]["template"]["spec"]["volumes"] if v["name"] == "auth"
    )
    assert volume["secret"]["secretName"] == "mq-users"
    assert volume["secret"]["items"] == [
        {"key": "passwd", "path": "passwd"},
        {"key": "acl.conf", "path": "acl"},
    ]


# --- ports, Services, probes ---------------------------------------------------------------------


def expected_container_ports(config: BrokerConfig) -> dict[str, int]:
    listeners = config.listeners
    ports = {"http": config.http.port}
    if listeners.tcp.enabled:
        ports["mqtt"] = listeners.tcp.port
    if listeners.tls.enabled:
        ports["mqtts"] = listeners.tls.port
    if listeners.websocket.enabled:
        ports["ws"] = listeners.websocket.port
    if config.cluster.enabled:
        ports["cluster"] = config.cluster.port
    return ports


def test_container_ports_match_the_broker_config(rendered: Rendered, tmp_path: Path) -> None:
    config = load_rendered_config(rendered, tmp_path)
    ports = {p["name"]: p["containerPort"] for p in rendered.container["ports"]}
    assert ports == expected_container_ports(config)


def test_services_target_the_container_ports(rendered: Rendered) -> None:
    container_ports = {p["name"] for p in rendered.container["ports"]}
    selector = rendered.statefulset["spec"]["selector"]["matchLabels"]
    pod_labels = rendered.statefulset["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    for service in rendered.of_kind("Service"):
        assert service["spec"]["selector"] == selector
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in container_ports, (service["metadata"]["name"], port)
    clients = rendered.one("Service", FULLNAME)
    client_ports = {p["name"] for p in clients["spec"]["ports"]}
    assert client_ports == container_ports & {"mqtt", "mqtts", "ws"}


def test_peer_service_is_headless_and_publishes_not_ready_pods(rendered: Rendered) -> None:
    peers = rendered.one("Service", PEERS)
    assert peers["spec"]["clusterIP"] == "None"
    assert peers["spec"]["publishNotReadyAddresses"] is True
    assert rendered.statefulset["spec"]["serviceName"] == PEERS
    names = {p["name"] for p in peers["spec"]["ports"]}
    clustered = any(p["name"] == "cluster" for p in rendered.container["ports"])
    assert ("cluster" in names) == clustered
    assert "http" in names


def test_client_service_options(rendered_sets: dict[str, Rendered]) -> None:
    nested = rendered_sets["nested-config"].one("Service", FULLNAME)
    assert nested["spec"]["type"] == "NodePort"
    assert nested["spec"]["externalTrafficPolicy"] == "Local"
    assert nested["metadata"]["annotations"] == {"example.com/owner": "iot"}
    node_ports = {p["name"]: p.get("nodePort") for p in nested["spec"]["ports"]}
    assert node_ports == {"mqtt": 31883, "ws": 31080}
    default = rendered_sets["default"].one("Service", FULLNAME)
    assert default["spec"]["type"] == "ClusterIP"
    assert "externalTrafficPolicy" not in default["spec"]
    lb = rendered_sets["load-balancer-auth-secret"].one("Service", FULLNAME)
    assert lb["spec"]["type"] == "LoadBalancer"
    assert lb["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    tls = rendered_sets["tls"].one("Service", FULLNAME)
    assert {p["name"]: p["port"] for p in tls["spec"]["ports"]} == {"mqtt": 1883, "mqtts": 8883}


class _StubBroker:
    node_id = "b"
    shutting_down = False
    connected_count = 0
    sessions: dict[str, object] = {}
    stats = SimpleNamespace(uptime_started_at=0.0)


def _broker_answer(path: str) -> int:
    from broker.adapters.http import HttpEndpoint

    endpoint = HttpEndpoint(_StubBroker(), stopping=lambda: False)  # type: ignore[arg-type]
    status, _content_type, _body = endpoint.respond("GET", path)
    return status


def test_probes_use_the_http_port_and_real_paths(rendered: Rendered, tmp_path: Path) -> None:
    config = load_rendered_config(rendered, tmp_path)
    container = rendered.container
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    liveness = container["livenessProbe"]
    if "grpc" in liveness:
        assert liveness["grpc"]["port"] == config.cluster.port and config.cluster.enabled
    else:
        assert liveness["httpGet"] == {"path": "/healthz", "port": "http"}
    assert ports["http"] == config.http.port
    assert _broker_answer("/healthz") == 200


def test_readiness_path_is_served_by_the_broker() -> None:
    assert _broker_answer("/readyz") == 200  # clustering off: ready once listening


def test_grpc_liveness_probe_finds_the_health_service_on_the_cluster_port() -> None:
    """The gRPC probe (probes.liveness.type=grpc) asks grpc.health.v1 for service "" on the
    cluster port: the broker's transport serves it there."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from broker.adapters.transport.link import GrpcTransport

    async def check() -> int:
        transport = GrpcTransport(
            advertise_host="127.0.0.1", on_receive=lambda _p, _i: None, on_peer_down=lambda _p: None
        )
        port = await transport.start("127.0.0.1", 0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                return int(reply.status)
        finally:
            await transport.stop()

    assert asyncio.run(check()) == health_pb2.HealthCheckResponse.SERVING
    liveness = VALUE_SETS["nested-config"]["probes"]["liveness"]
    assert liveness["type"] == "grpc"


def test_grpc_liveness_needs_the_cluster(rendered_sets: dict[str, Rendered]) -> None:
    single = render({"replicaCount": 1, "probes": VALUE_SETS["nested-config"]["probes"]}, "grpc-single")
    assert single.container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "grpc" in rendered_sets["nested-config"].container["livenessProbe"]


# --- pod spec: security, placement, lifecycle, storage ----------------------------------------------


def test_every_volume_mount_has_a_volume(rendered: Rendered) -> None:
    spec = rendered.statefulset["spec"]
    volumes = {v["name"] for v in spec["template"]["spec"]["volumes"]}
    claims = {c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])}
    assert not volumes & claims
    pod = spec["template"]["spec"]
    mounted: set[str] = set()
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        mounts = [m["name"] for m in container["volumeMounts"]]
        assert len(mounts) == len(set(mounts))
        assert set(mounts) <= volumes | claims, container["name"]
        mounted |= set(mounts)
    assert mounted == volumes | claims


def test_pod_security(rendered: Rendered) -> None:
    pod = rendered.statefulset["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    sc = rendered.container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    writable = {m["mountPath"] for m in rendered.container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/skipmq", "/tmp"}


def test_placement_and_disruption_budget(rendered_sets: dict[str, Rendered]) -> None:
    default = rendered_sets["default"]
    pod = default.statefulset["spec"]["template"]["spec"]
    selector = default.statefulset["spec"]["selector"]["matchLabels"]
    soft = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert soft[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert soft[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    spread = pod["topologySpreadConstraints"][0]
    assert spread["labelSelector"]["matchLabels"] == selector
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    hard = rendered_sets["five-replicas"].statefulset["spec"]["template"]["spec"]["affinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in hard["podAntiAffinity"]
    pdb = default.one("PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    custom = render({"affinity": {"nodeAffinity": {}}, "podAntiAffinity": {"type": "none"}}, "affinity")
    assert custom.statefulset["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": {}}
    none = render({"podAntiAffinity": {"type": "none"}, "podDisruptionBudget": {"minAvailable": 2}}, "none")
    assert "affinity" not in none.statefulset["spec"]["template"]["spec"]
    assert none.one("PodDisruptionBudget")["spec"]["minAvailable"] == 2


def test_updates_replace_one_pod_at_a_time_and_stop_gracefully(rendered: Rendered) -> None:
    spec = rendered.statefulset["spec"]
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}  # one pod at a time, ready first
    assert spec["podManagementPolicy"] == "Parallel"
    pod = spec["template"]["spec"]
    sleep = rendered.container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and int(sleep[1]) > 0
    assert pod["terminationGracePeriodSeconds"] > int(sleep[1])
    annotations = spec["template"]["metadata"]["annotations"]
    assert {"checksum/config", "checksum/secrets"} <= annotations.keys()


def test_config_change_rolls_the_pods(rendered_sets: dict[str, Rendered]) -> None:
    checksums = {
        name: r.statefulset["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for name, r in rendered_sets.items()
    }
    assert checksums["default"] != checksums["nested-config"]
    assert checksums["default"] != checksums["one-replica"]


def test_persistence(rendered_sets: dict[str, Rendered]) -> None:
    claims = rendered_sets["default"].statefulset["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data"]
    assert claims[0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
    off = rendered_sets["no-persistence"].statefulset["spec"]
    assert "volumeClaimTemplates" not in off
    data = next(v for v in off["template"]["spec"]["volumes"] if v["name"] == "data")
    assert data == {"name": "data", "emptyDir": {}}
    assert "WARNING: persistence.enabled=false" in rendered_sets["no-persistence"].notes


def test_resources(rendered: Rendered) -> None:
    resources = rendered.container["resources"]
    assert resources["requests"]["cpu"] and resources["limits"]["memory"]


# --- monitoring --------------------------------------------------------------------------------------


def test_service_monitor_scrapes_the_peer_service(rendered_sets: dict[str, Rendered]) -> None:
    assert not rendered_sets["default"].of_kind("ServiceMonitor")
    monitoring = rendered_sets["monitoring"]
    monitor = monitoring.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selected = [
        s
        for s in monitoring.of_kind("Service")
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in selected] == [PEERS]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_grafana_dashboards_config_map(rendered_sets: dict[str, Rendered]) -> None:
    assert len(rendered_sets["default"].of_kind("ConfigMap")) == 1
    dashboards = rendered_sets["monitoring"].one("ConfigMap", f"{FULLNAME}-dashboards")
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboards["metadata"]["annotations"] == {"grafana_folder": "SkipMQ"}
    shipped = sorted(p.name for p in (REPO_ROOT / "dashboards").glob("*.json"))
    assert sorted(dashboards["data"]) == shipped
    for name in shipped:
        assert json.loads(dashboards["data"][name]) == json.loads(
            (REPO_ROOT / "dashboards" / name).read_text()
        )


def test_chart_dashboards_are_the_generated_ones() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "dashboards_generate", REPO_ROOT / "dashboards" / "generate.py"
    )
    assert spec is not None and spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    for name in generate.DASHBOARDS:
        committed = (CHART / "dashboards" / name).read_text()
        assert committed == generate.render(name), f"run: python dashboards/generate.py ({name} is stale)"


# --- NOTES.txt ------------------------------------------------------------------------------------------


def test_notes_say_how_to_connect(rendered_sets: dict[str, Rendered]) -> None:
    default = rendered_sets["default"].notes
    assert f"kubectl -n {NAMESPACE} port-forward service/{FULLNAME} 1883:1883" in default
    assert 'mosquitto_sub -h "$HOST" -p 1883 ' in default
    nested = rendered_sets["nested-config"].notes
    assert "nodePort" in nested and "-u USER -P PASSWORD" in nested and "/ws/mqtt" in nested
    assert "MQTT over TLS" in rendered_sets["tls"].notes
    assert "loadBalancer.ingress" in rendered_sets["load-balancer-auth-secret"].notes


# --- values.schema.json ---------------------------------------------------------------------------------


def test_schema_is_generated_from_the_broker_keys() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gen_chart_schema", REPO_ROOT / "scripts" / "gen_chart_schema.py"
    )
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (CHART / "values.schema.json").read_text() == gen.render(), "run scripts/gen_chart_schema.py"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": 0}, "/replicaCount': minimum: got 0, want 1"),
        ({"config": {"limits": {"max_queue_messages": 5}}}, "additional properties 'max_queue_messages'"),
        ({"config": {"listeners": {"tcp": {"port": 70000}}}}, "/config/listeners/tcp/port': maximum"),
        ({"config": {"listeners": {"websocket": {"port": "8080"}}}}, "/config/listeners/websocket/port"),
        ({"config": {"limits": {"queue_overflow": "drop_all"}}}, "/config/limits/queue_overflow"),
        ({"config": {"data_dir": "/elsewhere"}}, "additional properties 'data_dir' not allowed"),
        ({"config": {"cluster": {"join": "a:1"}}}, "additional properties 'join' not allowed"),
        ({"tls": {"enabled": True}}, "/tls/certificate': minLength"),
        ({"service": {"type": "Nodeport"}}, "/service/type': value must be one of"),
        ({"service": {"externalTrafficPolicy": "local"}}, "/service/externalTrafficPolicy"),
        ({"service": {"nodePorts": {"mqtt": 0}}}, "/service/nodePorts/mqtt"),
        ({"persistence": {"size": "1 GB"}}, "/persistence/size"),
        ({"podAntiAffinity": {"type": "preferred"}}, "/podAntiAffinity/type"),
        ({"probes": {"liveness": {"type": "tcp"}}}, "/probes/liveness/type"),
        ({"replicas": 3}, "additional properties 'replicas' not allowed"),
    ],
)
def test_schema_rejects_bad_values_naming_the_key(values: dict[str, Any], message: str) -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmValuesError) as caught:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(caught.value)


def test_schema_accepts_every_value_set() -> None:
    with helm_python.Chart.load(CHART) as chart:
        for values in VALUE_SETS.values():
            chart.validate_schema(chart.merge_values(values))
