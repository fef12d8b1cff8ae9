"""The pull gateway against its OpenAPI 3 document, with schemathesis (property-based requests
from the committed document, at a real broker process): no 5xx, every response (status, content
type, headers, body) as the document says, bodies the document calls invalid refused with 4xx,
and bodies the document calls valid accepted (schemathesis' positive data acceptance: no 400 for
them; the document expresses the MQTT rules - topic names and filters, no NUL, payload xor
payload_base64). Bounded for CI: ``MAX_EXAMPLES`` requests per operation and long-polls of at most
1 s. The broker runs without a password file or ACL (those refusals are 401/403, which the
check allows).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from broker.adapters.http_pull import OPENAPI_PATH
from tests.support.interop_broker import IS_MOSQUITTO, BrokerOptions, BrokerProcess

pytestmark = pytest.mark.skipif(IS_MOSQUITTO, reason="the pull gateway is SkipMQ's")

MAX_EXAMPLES = 12
STATEFUL_EXAMPLES = 15
STATEFUL_STEPS = 5
schema = schemathesis.openapi.from_path(OPENAPI_PATH)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    options = BrokerOptions(
        skipmq_extra={
            "pull": {
                "enabled": True,
                "max_wait_s": 1,
                "requests_per_s": 100000,
                "failures_per_s": 100000,
                "lease_s": 2,
            }
        }
    )
    proc = BrokerProcess(tmp_path_factory.mktemp("pull-openapi"), options).start()
    yield proc
    proc.close()


def test_the_served_document_is_the_committed_one(gateway: BrokerProcess) -> None:
    url = f"http://127.0.0.1:{gateway.http_port}/v1/openapi.json"
    with urllib.request.urlopen(url, timeout=10) as response:
        served = json.loads(response.read())
    assert served == json.loads(Path(OPENAPI_PATH).read_text())
    assert served["openapi"].startswith("3.")


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_gateway_conforms_to_its_openapi_document(case: schemathesis.Case, gateway: BrokerProcess) -> None:
    case.call_and_validate(
        base_url=f"http://127.0.0.1:{gateway.http_port}",
        timeout=15,
    )


def test_open_pull_close_sequences_conform(gateway: BrokerProcess) -> None:
    """Stateful: the document's links chain open → pull → pull → close (and open → publish /
    list / close) on the session the first call opened; every response as documented, no 5xx.
    Bounded for CI: ``STATEFUL_EXAMPLES`` sequences of at most ``STATEFUL_STEPS`` calls."""
    base_url = f"http://127.0.0.1:{gateway.http_port}"
    chained_pulls: list[str] = []

    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"base_url": base_url, "timeout": 15}

        def after_call(self, response: Any, case: schemathesis.Case) -> None:
            if case.operation.label == "POST /v1/pull" and response.status_code == 200:
                answer = response.json()
                if answer["session_present"] and answer["acks_applied"]:
                    chained_pulls.append(answer["client_id"])

        def validate_response(
            self, response: Any, case: schemathesis.Case, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            case.validate_response(response, transport_kwargs=kwargs)

    Workflow.run(
        settings=settings(
            max_examples=STATEFUL_EXAMPLES,
            stateful_step_count=STATEFUL_STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        )
    )
    # the links did their job: pulls reached a session an earlier call of the sequence opened
    assert chained_pulls, "no pull of a sequence found the session its open call made"
