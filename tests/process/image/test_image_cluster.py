"""Three pods of helm/skipmq with its default values, as containers: one cluster over mutual TLS.

The chart is rendered with its defaults (3 replicas, cluster TLS with a Helm-generated CA). Each
pod (chart_pods.py) runs the rendered init container ``cluster-cert`` - the image's own ``skipmq
certs issue`` with the CA Secret's files, for ``$(POD_IP):<cluster port>`` - and then the broker
with the rendered ConfigMap, environment (node id = pod name, peer id = pod IP) and volumes. The
pods have their own IPs on a bridge network and the rendered ``cluster.join``, the headless peer
Service's name, resolves to all three (a network alias on each pod), so nothing of the rendered
configuration is changed. Checked: every broker becomes ready, each links to both others by
their pod-IP peer ids over mutual TLS (no plaintext warning), and messages cross brokers.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.process.image.conftest import PodFactory
from tests.support.cluster import ClusterClient, unique_id

pytestmark = pytest.mark.image

READY_TIMEOUT_S = 90.0  # three brokers starting at once on a shared 2-core machine


def test_three_pods_form_one_cluster_and_deliver_across_brokers(chart_pods: PodFactory) -> None:
    pods = chart_pods({}, 3)
    assert [c["name"] for c in pods[0].spec["initContainers"]] == ["cluster-cert"]
    for pod in pods:  # the pods' network namespaces first: the Service name resolves to all
        pod.create()
    for pod in pods:
        pod.run_init_containers()
        issued = sorted(p.name for p in pod.volume_dir("cluster-tls").iterdir())
        assert issued == ["broker.key", "broker.pem"], issued
    for pod in pods:  # podManagementPolicy: Parallel
        pod.start()
    for pod in pods:
        pod.wait_ready(READY_TIMEOUT_S)

    cluster_port = pods[0].port("cluster")
    for pod in pods:
        status, body = pod.http("/cluster")
        assert status == 200, body
        state = json.loads(body)
        assert state["joined"] is True, state
        text = json.dumps(state)
        others = [f"{other.ip}:{cluster_port}" for other in pods if other is not pod]
        assert all(peer in text for peer in others), (others, state)
        logs = pod.logs()
        assert "cluster.insecure" not in logs, logs[-2000:]

    topic = f"{unique_id('image-cluster')}/t"
    mqtt = pods[0].port("mqtt")
    subs = [ClusterClient(mqtt, host=pod.ip) for pod in pods]
    pub = ClusterClient(mqtt, host=pods[0].ip)
    try:
        for sub in subs:
            assert sub.subscribe(topic, 1) == [1]
        # publish until a message reaches every subscriber (the subscriptions spread first)
        got: set[int] = set()
        deadline = time.monotonic() + 30.0
        number = 0
        while time.monotonic() < deadline and len(got) < len(subs):
            pub.publish(topic, f"m{number}".encode(), 1)
            for index, sub in enumerate(subs):
                if index not in got and sub.drain(settle_s=0.2):
                    got.add(index)
            number += 1
        assert got == {0, 1, 2}, f"messages from {pods[0].name} reached the subscribers on {sorted(got)} only"
    finally:
        for client in [*subs, pub]:
            client.close()
