"""The pull gateway against its OpenAPI 3 document, with schemathesis (property-based requests
from the committed document, at a real broker process): no 5xx, every response (status, content
type, headers, body) as the document says, bodies the document calls invalid refused with 4xx.
Bounded for CI: ``MAX_EXAMPLES`` requests per operation and long-polls of at most 1 s.

Not checked: that every body the document allows is accepted (schemathesis' positive data
acceptance): the broker may refuse valid JSON for MQTT reasons the document cannot express (an
invalid topic filter, a client id the ACL refuses, both payload fields at once).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from broker.adapters.http_pull import OPENAPI_PATH
from tests.support.interop_broker import IS_MOSQUITTO, BrokerOptions, BrokerProcess

pytestmark = pytest.mark.skipif(IS_MOSQUITTO, reason="the pull gateway is SkipMQ's")

MAX_EXAMPLES = 12
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
        excluded_checks=[positive_data_acceptance],
    )
