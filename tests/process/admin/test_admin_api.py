"""The admin API on a real 3-broker cluster (docs/operations.md "Admin API"): every endpoint
answers cluster-wide from any broker, a disconnect closes the connection wherever it is, a user
added on one broker connects on another within the stated time, roles and credentials are
enforced (and refusals logged), the reserved $skipmq/ topics are closed to MQTT clients, and
`skipmq ctl` renders the same answers and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from tests.process.admin.conftest import ADMIN, VIEWER, AdminCluster
from tests.support.cluster import ClusterClient, wait_until
from tests.support.paths import REPO_ROOT

USER_CONVERGENCE_S = 5.0  # docs/operations.md: a user added on one broker logs in on every broker within 5 s


def _client(admin: AdminCluster, index: int, **kwargs: Any) -> ClusterClient:
    return ClusterClient(admin.cluster.brokers[index].mqtt_port, **kwargs)


def _mqtt_login(port: int, username: str, password: str) -> int:
    """CONNECT with user name and password (MQTT 5); the CONNACK reason code."""
    result: dict[str, int] = {}
    client = paho.Client(
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id=f"login-{uuid.uuid4().hex[:8]}",
        protocol=paho.MQTTv5,
    )
    client.username_pw_set(username, password)
    client.on_connect = lambda c, u, flags, reason, props: result.setdefault("code", reason.value)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        wait_until(lambda: "code" in result, 10, what="CONNACK")
    finally:
        client.disconnect()
        client.loop_stop()
    return result["code"]


def test_every_endpoint_answers_cluster_wide(admin_cluster: AdminCluster) -> None:
    admin = admin_cluster
    tag = uuid.uuid4().hex[:6]
    on1 = _client(admin, 1, client_id=f"a-{tag}-on1", session_expiry_s=300)
    on2 = _client(admin, 2, client_id=f"b-{tag}-on2")
    try:
        on1.subscribe(f"plant7-{tag}/+/temp", 1)
        on2.subscribe(f"plant7-{tag}/#", 1)
        publisher = _client(admin, 2)
        publisher.publish(f"plant7-{tag}/a/temp", b"21.5", 1, retain=True)
        publisher.close()
        nodes = [b.node_id for b in admin.cluster.brokers]

        brokers = admin.get(0, "/admin/v1/brokers")
        assert sorted(b["node_id"] for b in brokers["brokers"]) == nodes and brokers["complete"]
        assert all(len([link for link in b["links"] if link["connected"]]) == 2 for b in brokers["brokers"])
        listeners = admin.get(1, "/admin/v1/listeners")["listeners"]
        assert {row["broker"] for row in listeners if row["name"] == "tcp"} == set(nodes)

        clients = admin.get(0, "/admin/v1/clients", params={"prefix": f"a-{tag}"})["items"]
        assert [(c["client_id"], c["broker"]) for c in clients] == [(f"a-{tag}-on1", nodes[1])]
        detail = admin.get(0, f"/admin/v1/clients/b-{tag}-on2")["client"]
        assert detail["broker"] == nodes[2] and detail["subscription_list"][0]["filter"] == f"plant7-{tag}/#"
        assert admin.call(0, "GET", "/admin/v1/clients/nobody-here").status_code == 404

        # who subscribes plant7/#: both subscriptions, on two other brokers
        subs = admin.get(0, "/admin/v1/subscriptions", params={"filter": f"plant7-{tag}/#"})["items"]
        assert sorted((s["client_id"], s["broker"]) for s in subs) == [
            (f"a-{tag}-on1", nodes[1]),
            (f"b-{tag}-on2", nodes[2]),
        ]
        exact = admin.get(
            0, "/admin/v1/subscriptions", params={"filter": f"plant7-{tag}/#", "exact": "true"}
        )["items"]
        assert [s["client_id"] for s in exact] == [f"b-{tag}-on2"]
        by_topic = admin.get(2, "/admin/v1/subscriptions", params={"topic": f"plant7-{tag}/x/hum"})["items"]
        assert [s["client_id"] for s in by_topic] == [f"b-{tag}-on2"]

        # retained: published on broker 2, replicated, visible on broker 0's copy
        retained = wait_until(
            lambda: admin.get(0, "/admin/v1/retained", params={"filter": f"plant7-{tag}/#"})["items"],
            10,
            what="retained",
        )
        assert retained[0]["payload"]["text"] == "21.5" and retained[0]["origin"] == nodes[2]

        # the topic class: subscribed on brokers 1 and 2, published from broker 2 in one hop
        classes = {c["class"]: c for c in admin.get(0, "/admin/v1/classes")["classes"]}
        row = classes[f"=plant7-{tag}"]
        assert sorted(row["subscriber_brokers"]) == [nodes[1], nodes[2]]
        assert [(r["broker"], r["route"]) for r in row["routes"]] == [(nodes[2], "one_hop")]

        overlay = admin.get(1, "/admin/v1/overlay")
        assert sorted(part["broker"] for part in overlay["brokers"]) == nodes and overlay["mv_bits"]
        vnodes = [v for part in overlay["brokers"] for v in part["vnodes"] if v["topic"] == f"=plant7-{tag}"]
        assert {(v["role"], v["peer"]) for v in vnodes} >= {("subscriber", admin.cluster.brokers[1].peer_id)}

        sessions = admin.get(2, "/admin/v1/sessions", params={"prefix": f"a-{tag}"})["items"]
        assert sessions[0]["persistent"] and sessions[0]["broker"] == nodes[1]
        assert admin.get(0, "/admin/v1/whoami") == {"user": ADMIN[0], "role": "admin", "broker": nodes[0]}
        assert "users" in admin.get(0, "/admin/v1/users") and "sections" in admin.get(0, "/admin/v1/acl")
    finally:
        on1.close()
        on2.close()


def test_pages_cover_every_broker_once(admin_cluster: AdminCluster) -> None:
    admin = admin_cluster
    tag = uuid.uuid4().hex[:6]
    made = [_client(admin, i % 3, client_id=f"page-{tag}-{i:02d}") for i in range(7)]
    try:
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params = {"prefix": f"page-{tag}", "limit": "2", **({"cursor": cursor} if cursor else {})}
            page = admin.get(pages % 3, "/admin/v1/clients", params=params)
            seen += [c["client_id"] for c in page["items"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
            assert pages < 10
        assert seen == sorted(c.client_id for c in made)  # each once, in client-id order
        assert pages == 4
    finally:
        for client in made:
            client.close()


def test_disconnect_closes_the_connection_wherever_it_is(admin_cluster: AdminCluster) -> None:
    admin = admin_cluster
    victim = _client(admin, 2, client_id=f"victim-{uuid.uuid4().hex[:6]}", session_expiry_s=300)
    victim.subscribe("victim/x", 1)
    answer = admin.call(0, "POST", f"/admin/v1/clients/{victim.client_id}/disconnect", json={})
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"] == [
        {
            "broker": admin.cluster.brokers[2].node_id,
            "client_id": victim.client_id,
            "was_connected": True,
            "session_ended": False,
        }
    ]
    reason = victim.wait_disconnected(10)
    assert getattr(reason, "value", reason) == 0x98  # Administrative action
    victim.close()
    # its session stays (persistent) until asked to go
    assert admin.get(1, f"/admin/v1/clients/{victim.client_id}")["client"]["connected"] is False
    ended = admin.call(
        1, "POST", f"/admin/v1/clients/{victim.client_id}/disconnect", json={"discard_session": True}
    )
    assert ended.json()["results"][0]["session_ended"] is True
    assert admin.call(0, "GET", f"/admin/v1/clients/{victim.client_id}").status_code == 404


def test_a_user_added_on_one_broker_logs_in_on_another(admin_cluster: AdminCluster) -> None:
    admin = admin_cluster
    name, password = f"dev-{uuid.uuid4().hex[:6]}", "s3cret-pw"
    port2 = admin.cluster.brokers[2].mqtt_port
    assert _mqtt_login(port2, name, password) == 0  # no users yet anywhere: names are not checked
    added_at = time.monotonic()
    assert admin.call(0, "PUT", f"/admin/v1/users/{name}", json={"password": password}).status_code == 201
    wait_until(
        lambda: _mqtt_login(port2, name, "wrong") == 0x86, USER_CONVERGENCE_S, what="broker 2 knows the user"
    )
    took_s = time.monotonic() - added_at
    assert _mqtt_login(port2, name, password) == 0
    assert took_s < USER_CONVERGENCE_S
    listed = admin.get(1, "/admin/v1/users")["users"]
    assert {"name": name, "source": "dynamic", "updated_by": ADMIN[0]}.items() <= next(
        u for u in listed if u["name"] == name
    ).items()
    # the hash is the password file's salted scrypt, never the password
    exported = admin.call(2, "GET", "/admin/v1/export/users").text
    line = next(line for line in exported.splitlines() if line.startswith(name + ":"))
    assert line.split(":", 1)[1].startswith("$scrypt$") and password not in exported
    # removed on broker 1: refused on broker 0
    assert admin.call(1, "DELETE", f"/admin/v1/users/{name}").status_code == 200
    wait_until(
        lambda: _mqtt_login(admin.cluster.brokers[0].mqtt_port, name, password) == 0x86,
        USER_CONVERGENCE_S,
        what="broker 0 refuses the removed user",
    )


def test_acl_rules_set_on_one_broker_apply_on_another(admin_cluster: AdminCluster) -> None:
    admin = admin_cluster
    try:
        rules = {
            "rules": [{"access": "readwrite", "filter": "#"}, {"access": "deny", "filter": "forbidden/#"}]
        }
        assert admin.call(0, "PUT", "/admin/v1/acl/anonymous", json=rules).status_code == 200
        client = _client(admin, 1)
        try:
            wait_until(
                lambda: client.subscribe("forbidden/x", 1) == [0x87],
                USER_CONVERGENCE_S,
                what="ACL on broker 1",
            )
            assert client.subscribe("allowed/x", 1) == [1]
        finally:
            client.close()
        # broker 2 converges on its own time, as broker 1 did (the rules reach it as a control message)
        wait_until(
            lambda: "topic deny forbidden/#" in admin.call(2, "GET", "/admin/v1/export/acl").text,
            USER_CONVERGENCE_S,
            what="ACL exported by broker 2",
        )
    finally:
        admin.call(0, "DELETE", "/admin/v1/acl/anonymous")
    client = _client(admin, 1)
    try:
        wait_until(
            lambda: client.subscribe("forbidden/y", 1) == [1], USER_CONVERGENCE_S, what="ACL gone on broker 1"
        )
    finally:
        client.close()


def test_roles_and_credentials_are_enforced_and_refusals_logged(admin_cluster: AdminCluster) -> None:
    admin = admin_cluster
    assert admin.call(0, "GET", "/admin/v1/brokers", auth=None).status_code == 401
    missing = admin.call(0, "GET", "/admin/v1/brokers", auth=None)
    assert missing.headers["Content-Type"].startswith("application/problem+json")
    assert missing.headers["WWW-Authenticate"].startswith("Basic")
    assert admin.call(1, "GET", "/admin/v1/clients", auth=(ADMIN[0], "wrong")).status_code == 401
    assert admin.call(1, "GET", "/admin/v1/clients", auth=VIEWER).status_code == 200
    refused = admin.call(1, "POST", "/admin/v1/clients/anyone/disconnect", auth=VIEWER, json={})
    assert refused.status_code == 403 and "role readonly" in refused.json()["detail"]
    assert admin.call(1, "GET", "/admin/v1/export/users", auth=VIEWER).status_code == 403
    no_header = admin.call(
        0, "POST", "/admin/v1/publish", json={"topic": "x"}, headers={"X-Requested-By": ""}
    )
    assert no_header.status_code == 403
    records = admin.cluster.brokers[1].log_records()
    reasons = [r for r in records if r.get("event") == "admin_refused"]
    assert {r["status"] for r in reasons} >= {401, 403}
    assert any(r.get("user") == VIEWER[0] and r["status"] == 403 for r in reasons)


def test_reserved_topics_are_closed_to_mqtt_clients(admin_cluster: AdminCluster) -> None:
    admin = admin_cluster
    attacker = _client(admin, 0)
    try:
        assert attacker.subscribe("$skipmq/#", 1) == [0x87]
        assert attacker.subscribe("$share/g/$skipmq/auth/#", 1) == [0x87]
        record = b'{"v":1,"hash":"$scrypt$n=16384,r=8,p=1$c2FsdA==$aGFzaA=="}'
        info = attacker.publish_nowait("$skipmq/auth/users/mallory", record, 1, retain=True)
        info.wait_for_publish(10)
        wait_until(lambda: record in attacker.failed_payloads, 10, what="PUBACK 0x87")
        attacker.subscribe("#", 1)  # '#' never matches a $ topic: no record leaks through it
        assert not [m.topic for m in attacker.drain(0.5) if m.topic.startswith("$")]
    finally:
        attacker.close()
    assert "mallory" not in [u["name"] for u in admin.get(1, "/admin/v1/users")["users"]]
    refused = admin.call(
        0, "POST", "/admin/v1/publish", json={"topic": "$skipmq/admin/brokers/x", "payload": "x"}
    )
    assert refused.status_code == 403


def _ctl(admin: AdminCluster, *args: str, user: tuple[str, str] = ADMIN) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SKIPMQ_ADMIN_USER": user[0], "SKIPMQ_ADMIN_PASSWORD": user[1]}
    return subprocess.run(
        [sys.executable, "-m", "broker", "ctl", "--url", admin.url(0), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=REPO_ROOT,
    )


def test_ctl_tables_json_and_errors(admin_cluster: AdminCluster) -> None:
    admin = admin_cluster
    table = _ctl(admin, "brokers")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["NODE_ID", "PEER_ID", "STATUS"]
    assert all(b.node_id in table.stdout for b in admin.cluster.brokers)
    as_json = _ctl(admin, "--json", "classes")
    assert as_json.returncode == 0 and "classes" in json.loads(as_json.stdout)
    refused = _ctl(admin, "disconnect", "someone", user=VIEWER)
    assert refused.returncode == 1
    assert refused.stderr.startswith(
        "skipmq ctl: error: 403 Forbidden: admin user 'viewer' has role readonly"
    )
    gone = _ctl(admin, "client", "no-such-client")
    assert gone.returncode == 1 and "404 Not Found: no broker has a session" in gone.stderr
    unreachable = subprocess.run(
        [sys.executable, "-m", "broker", "ctl", "--url", "http://127.0.0.1:9", "--user", "x", "brokers"],
        capture_output=True,
        text=True,
        env={**os.environ, "SKIPMQ_ADMIN_PASSWORD": "x"},
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert unreachable.returncode == 3
    published = _ctl(admin, "publish", "ctl/topic", "hello", "--qos", "1")
    assert published.returncode == 0 and "published 5 bytes to ctl/topic" in published.stdout
    helptext = _ctl(admin, "--help").stdout
    for command in (
        "brokers",
        "clients",
        "sessions",
        "subscriptions",
        "retained",
        "classes",
        "overlay",
        "disconnect",
        "publish",
        "trace",
        "users",
        "acl",
        "admin-user",
    ):
        assert f"\n  {command}" in helptext, command


def test_a_trace_summarises_a_clients_packets_on_its_broker(admin_cluster: AdminCluster) -> None:
    admin = admin_cluster
    watched = _client(admin, 2, client_id=f"traced-{uuid.uuid4().hex[:6]}")
    watched.subscribe("traced/#", 1)
    try:
        started = admin.call(
            0, "POST", "/admin/v1/traces", json={"client_id": watched.client_id, "duration_s": 2}
        )
        assert started.status_code == 201, started.text
        trace_id = started.json()["id"]
        time.sleep(0.6)  # the broker wraps the connection within 0.2 s of the start
        for n in range(3):
            watched.publish("traced/x", f"m{n}".encode(), 1)
        watched.wait_messages(3)
        trace = wait_until(
            lambda: (t := admin.get(1, f"/admin/v1/traces/{trace_id}")) and t["state"] == "done" and t,
            10,
            what="trace done",
        )
        assert trace["connected_on"] == [admin.cluster.brokers[2].node_id]
        assert trace["packets"]["in"]["PUBLISH"] == 3 and trace["packets"]["out"]["PUBLISH"] == 3
        assert trace["packets"]["out"]["PUBACK"] == 3 and trace["topics"]["traced/x"]["publish"] == 3
    finally:
        watched.close()


def test_a_broker_that_does_not_answer_is_named(admin_cluster: AdminCluster) -> None:
    """SIGSTOP one broker: the others still answer, naming it as missing, within about
    admin.fanout_timeout_ms (3 s, the default); after SIGCONT the answers are whole again."""
    admin = admin_cluster
    frozen = admin.cluster.brokers[2].node_id
    admin.cluster.freeze_broker(2)
    try:
        started = time.monotonic()
        answer = admin.get(0, "/admin/v1/brokers")
        took_s = time.monotonic() - started
        assert [b["node_id"] for b in answer["brokers"]] == [b.node_id for b in admin.cluster.brokers[:2]]
        assert answer["complete"] is False and [m["broker"] for m in answer["missing"]] == [frozen]
        assert took_s < 3.0 + 2.0  # the deadline, plus the answer's own time on a loaded machine
        clients = admin.get(1, "/admin/v1/clients")
        assert frozen in [m["broker"] for m in clients["missing"]] and clients["complete"] is False
    finally:
        admin.cluster.thaw_broker(2)
    wait_until(
        lambda: (
            admin.get(0, "/admin/v1/brokers")["complete"]
            and len(admin.get(0, "/admin/v1/brokers")["brokers"]) == 3
        ),
        30,
        what="every broker answers again",
    )
