"""One 3-broker cluster with the admin API for every admin process test (API, ctl, schemathesis,
browser): real broker processes started by tools.launcher with mutual-TLS links, admin users
``root`` (role admin) and ``viewer`` (role readonly). Tests share it: unique client ids, topics
and user names, and whatever a test changes cluster-wide (ACL sections) it puts back."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from broker.adapters.admin.access import set_admin_user, write_admin_users
from tests.support.cluster import LIVE_CLUSTERS
from tools.launcher import LocalCluster, start_cluster

ADMIN = ("root", "root-secret-1")
VIEWER = ("viewer", "viewer-secret-1")
READY_TIMEOUT_S = 30.0
CSRF = {"X-Requested-By": "tests"}


@dataclass
class AdminCluster:
    cluster: LocalCluster
    users_file: Path

    def url(self, index: int, path: str = "") -> str:
        broker = self.cluster.brokers[index]
        return f"http://{broker.host}:{broker.http_port}{path}"

    def call(
        self, index: int, method: str, path: str, *, auth: tuple[str, str] | None = ADMIN, **kwargs: Any
    ) -> requests.Response:
        headers = dict(CSRF)
        headers.update(kwargs.pop("headers", {}))
        return requests.request(
            method, self.url(index, path), auth=auth, headers=headers, timeout=20, **kwargs
        )

    def get(self, index: int, path: str, **kwargs: Any) -> Any:
        response = self.call(index, "GET", path, **kwargs)
        assert response.status_code == 200, response.text
        return response.json()

    @staticmethod
    def basic(user: tuple[str, str]) -> str:
        return "Basic " + base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        for number, cluster in enumerate(LIVE_CLUSTERS):
            report.sections.append(
                (f"cluster {number} broker log tails", cluster.logs_tail(40, exclude=("dial to ",)))
            )


@pytest.fixture(scope="session")
def admin_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdminCluster]:
    root = tmp_path_factory.mktemp("admin-cluster")
    users: dict[str, tuple[str, str]] = {}
    set_admin_user(users, *ADMIN[:1], "admin", ADMIN[1])
    set_admin_user(users, *VIEWER[:1], "readonly", VIEWER[1])
    users_file = root / "admins"
    write_admin_users(str(users_file), users)
    settings = {
        "admin.enabled": "true",
        "admin.users_file": str(users_file),
        "cluster.ping_interval_ms": "500",
        "cluster.failure_timeout_ms": "2000",
    }
    cluster = start_cluster(3, settings=settings, data_root=str(root / "data"))
    LIVE_CLUSTERS.append(cluster)
    try:
        cluster.wait_ready(READY_TIMEOUT_S)
        admin = AdminCluster(cluster, users_file)
        # every broker has announced its admin endpoint to every other (replicated retained records)
        from tests.support.cluster import wait_until

        for index in range(3):
            wait_until(
                lambda index=index: (
                    admin.get(index, "/admin/v1/brokers")["complete"]
                    and len(admin.get(index, "/admin/v1/brokers")["brokers"]) == 3
                ),
                20,
                what=f"broker {index} sees every admin endpoint",
            )
        yield admin
    finally:
        cluster.close()
        if cluster in LIVE_CLUSTERS:
            LIVE_CLUSTERS.remove(cluster)
