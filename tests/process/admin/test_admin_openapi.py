"""The admin API against its OpenAPI 3 document with schemathesis, on the shared 3-broker
cluster: no 5xx, every response (status, content type, body) as documented, stateless and along
the document's links (set a user -> its ACL -> remove it; start a trace -> read it; list clients
-> one client -> disconnect it). Bounded for CI: ``MAX_EXAMPLES`` requests per operation.

Not checked: schemathesis' ignored_auth (see EXCLUDED) and positive data acceptance (a body the
schema allows may still be refused for MQTT reasons it cannot express: an invalid topic filter in
a rule, a reserved topic).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import ignored_auth, positive_data_acceptance

from broker.adapters.admin.openapi import document
from tests.process.admin.conftest import ADMIN, AdminCluster

MAX_EXAMPLES = 10
STATEFUL_EXAMPLES = 10
STATEFUL_STEPS = 4
schema = schemathesis.openapi.from_dict(document())
# ignored_auth sends wrong credentials fast; after FAILURES_PER_S refusals from one address the API
# answers 429 before hashing another password (as documented), which that check does not expect.
# Credentials are checked by test_admin_api.py::test_roles_and_credentials_are_enforced_and_refusals_logged.
EXCLUDED = [positive_data_acceptance, ignored_auth]


@pytest.fixture(scope="module")
def base_url(admin_cluster: AdminCluster) -> Iterator[str]:
    yield admin_cluster.url(0)
    # what the generated requests changed cluster-wide goes back: dynamic ACL sections (an ACL
    # section makes the ACL active for every client) and dynamic users
    for section in admin_cluster.get(0, "/admin/v1/acl")["sections"]:
        if section["source"] == "dynamic":
            path = f"users/{section['user']}" if section["kind"] == "user" else section["kind"]
            admin_cluster.call(0, "DELETE", f"/admin/v1/acl/{path}")
    for user in admin_cluster.get(0, "/admin/v1/users")["users"]:
        if user["source"] == "dynamic":
            admin_cluster.call(0, "DELETE", f"/admin/v1/users/{user['name']}")


def _headers() -> dict[str, str]:
    return {"Authorization": AdminCluster.basic(ADMIN)}  # X-Requested-By: generated from the document


def _traces_short(case: schemathesis.Case) -> None:
    if case.operation.label == "POST /admin/v1/traces" and isinstance(case.body, dict):
        case.body["duration_s"] = 1  # bounded for CI: a trace holds nothing up, but keep them short


def test_the_served_document_is_the_built_one(admin_cluster: AdminCluster) -> None:
    assert admin_cluster.get(1, "/admin/v1/openapi.json") == document()


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_admin_api_conforms_to_its_openapi_document(case: schemathesis.Case, base_url: str) -> None:
    _traces_short(case)
    case.call_and_validate(base_url=base_url, headers=_headers(), timeout=20, excluded_checks=EXCLUDED)


def test_linked_sequences_conform(base_url: str) -> None:
    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            _traces_short(case)
            return {"base_url": base_url, "headers": _headers(), "timeout": 20}

        def validate_response(
            self, response: Any, case: schemathesis.Case, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            case.validate_response(response, excluded_checks=EXCLUDED, transport_kwargs=kwargs)

    Workflow.run(
        settings=settings(
            max_examples=STATEFUL_EXAMPLES,
            stateful_step_count=STATEFUL_STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        )
    )
