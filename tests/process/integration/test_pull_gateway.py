"""The HTTP pull gateway (seed 001 §4) against real broker processes, with real clients: the
package's ``PullClient`` (stdlib HTTP), ``curl``-like raw requests, paho for MQTT.

Nothing lost or duplicated across ``kill -9`` and a proxy that drops every third HTTP response;
a session alternating MQTT and HTTP pull; the 1,024 / 16 limits, body size and rate limits; auth
and ACL refusals. (A request at a broker that is not the session's home: tests/process/cluster/
test_pull_cluster.py.)
"""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from broker.pull_client import PullClient, PullFailed, payload_bytes
from tests.support.interop_broker import IS_MOSQUITTO, BrokerOptions, BrokerProcess
from tests.support.interop_clients import PahoClient
from tests.support.pull import drain

pytestmark = pytest.mark.skipif(IS_MOSQUITTO, reason="the pull gateway is SkipMQ's")

PULL = {"pull": {"enabled": True, "requests_per_s": 1000, "max_wait_s": 10}}
Factory = Callable[[BrokerOptions], BrokerProcess]
PahoFactory = Callable[..., PahoClient]


def _url(broker: BrokerProcess) -> str:
    return f"http://127.0.0.1:{broker.http_port}"


def _post(
    url: str, body: Any, *, raw: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.headers.get("Content-Type", ""), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), json.loads(error.read())


@pytest.fixture
def pull_broker(broker_factory: Factory) -> BrokerProcess:
    return broker_factory(BrokerOptions(skipmq_extra=PULL))


# ---------------------------------------------------------------------- a proxy that drops responses
class DroppingProxy(http.server.ThreadingHTTPServer):
    """Forwards each HTTP request to the broker and drops every third response (the request
    reached the broker, the answer never reaches the device), closing the connection instead."""

    daemon_threads = True

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.count = 0
        self.dropped = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    server: DroppingProxy

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            upstream = http.client.HTTPConnection("127.0.0.1", self.server.target_port, timeout=30)
            upstream.request("POST", self.path, body, {"Content-Type": "application/json"})
            response = upstream.getresponse()
            data = response.read()
            status = response.status
            upstream.close()
        except OSError:
            self.close_connection = True
            return  # the broker is down: the device sees the connection close
        with self.server.lock:
            self.server.count += 1
            drop = self.server.count % 3 == 0
            self.server.dropped += drop
        if drop:
            self.close_connection = True
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[int], DroppingProxy]]:
    made: list[DroppingProxy] = []

    def make(port: int) -> DroppingProxy:
        proxy = DroppingProxy(port)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()


# ---------------------------------------------------------------------- tests
def test_nothing_lost_or_duplicated_across_kill9_and_dropped_responses(
    pull_broker: BrokerProcess, paho_factory: PahoFactory, proxy_factory: Callable[[int], DroppingProxy]
) -> None:
    broker = pull_broker
    proxy = proxy_factory(broker.http_port)
    device = PullClient(proxy.url, "dev-kill9", timeout_s=15)
    opened = PullClient(_url(broker), "dev-kill9").open([("k9/q1/#", 1), ("k9/q2/#", 2)])
    assert opened["session_present"] is False
    total = 120
    publisher = paho_factory(broker, client_id="k9-pub", version=5)
    for n in range(total // 2):
        publisher.publish(f"k9/q{1 + n % 2}/x", f"m{n}".encode(), qos=1 + n % 2)
    publisher.close()
    got = drain(device, 25)
    assert len(got) >= 25
    broker.kill()  # kill -9 while the device holds numbers it has not had confirmed
    broker.start()
    publisher = paho_factory(broker, client_id="k9-pub2", version=5)
    for n in range(total // 2, total):
        publisher.publish(f"k9/q{1 + n % 2}/x", f"m{n}".encode(), qos=1 + n % 2)
    got += drain(device, total - len(got))
    device.acknowledge_received()
    assert proxy.dropped >= 3, "the proxy should have dropped responses"
    assert sorted(got, key=lambda p: int(p[1:])) == [f"m{n}".encode() for n in range(total)]
    assert len(got) == len(set(got)) == total  # each message once: duplicates were dropped by number
    # the session's queue is empty: everything acknowledged was deleted
    status, _type, answer = _post(_url(broker) + "/v1/pull", {"client_id": "dev-kill9"})
    assert status == 200 and answer["messages"] == [] and answer["remaining"] is False


def test_a_lost_response_brings_the_same_numbers_again(
    pull_broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    url = _url(pull_broker)
    _post(
        url + "/v1/sessions/open",
        {"client_id": "dev-same", "subscriptions": [{"filter": "same/#", "qos": 2}]},
    )
    publisher = paho_factory(pull_broker, version=5)
    for n in range(3):
        publisher.publish("same/t", f"s{n}".encode(), qos=2)
    _s, _t, first = _post(url + "/v1/pull", {"client_id": "dev-same"})
    _s, _t, again = _post(url + "/v1/pull", {"client_id": "dev-same"})  # as if `first` was lost
    seqs = [m["seq"] for m in first["messages"]]
    assert len(seqs) == 3 and [m["seq"] for m in again["messages"]] == seqs
    _s, _t, acked = _post(
        url + "/v1/pull", {"client_id": "dev-same", "acks": seqs[:2], "epoch": first["epoch"]}
    )
    assert [m["seq"] for m in acked["messages"]] == seqs[2:]
    _s, _t, stale = _post(url + "/v1/pull", {"client_id": "dev-same", "acks": seqs[2:], "epoch": "elsewhere"})
    assert stale["acks_applied"] is False and [m["seq"] for m in stale["messages"]] == seqs[2:]


def test_session_alternates_between_mqtt_and_pull(
    pull_broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    url = _url(pull_broker)
    device = PullClient(url, "dev-alt")
    assert device.open([("alt/#", 1)], session_expiry_s=600)["session_present"] is False
    publisher = paho_factory(pull_broker, version=5)
    received: list[bytes] = []
    for round_number in range(3):
        for n in range(5):
            publisher.publish("alt/t", f"a{round_number}-{n}-http".encode(), qos=1)
        received += drain(device, 5)
        device.acknowledge_received()
        for n in range(5):
            publisher.publish("alt/t", f"a{round_number}-{n}-mqtt".encode(), qos=1)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 600
        mqtt = paho_factory(pull_broker, client_id="dev-alt", version=5, clean=False, connect_props=props)
        assert mqtt.session_present, "the MQTT connection gets the pull session"
        received += [m.payload for m in mqtt.wait_messages(5)]
        mqtt.assert_no_message(0.3)
        mqtt.disconnect()
        mqtt.close()
    expected = [f"a{r}-{n}-{via}".encode() for r in range(3) for via in ("http", "mqtt") for n in range(5)]
    assert received == expected  # in order, each once, through both transports
    _s, _t, answer = _post(url + "/v1/sessions/subscriptions", {"client_id": "dev-alt"})
    assert answer["session_present"] is True and answer["subscriptions"] == [{"filter": "alt/#", "qos": 1}]


def test_limits_16_1024_body_size_rate(broker_factory: Factory, paho_factory: PahoFactory) -> None:
    broker = broker_factory(BrokerOptions(skipmq_extra={"pull": {"enabled": True, "requests_per_s": 5}}))
    url = _url(broker)
    _post(
        url + "/v1/sessions/open", {"client_id": "dev-lim", "subscriptions": [{"filter": "lim/#", "qos": 1}]}
    )
    publisher = paho_factory(broker, version=5)
    for n in range(20):
        publisher.publish("lim/t", f"{n}".encode(), qos=1)
    status, _type, answer = _post(url + "/v1/pull", {"client_id": "dev-lim", "acks": list(range(1000, 2024))})
    assert status == 200 and len(answer["messages"]) == 16 and answer["remaining"] is True
    status, content_type, problem = _post(
        url + "/v1/pull", {"client_id": "dev-lim", "acks": list(range(1, 1026))}
    )
    assert status == 400 and content_type.startswith("application/problem+json")
    assert problem["limit"] == "acks_per_request" and "1024" in problem["detail"]
    seqs = [m["seq"] for m in answer["messages"]]
    status, _type, rest = _post(url + "/v1/pull", {"client_id": "dev-lim", "acks": seqs})
    assert status == 200 and len(rest["messages"]) == 4 and rest["remaining"] is False
    status, _type, problem = _post(
        url + "/v1/pull", None, raw=b'{"client_id": "x", "pad": "' + b"a" * 70000 + b'"}'
    )
    assert status == 413 and problem["limit"] == "pull.max_body_bytes"
    status, _type, problem = _post(url + "/v1/pull", None, raw=b"{not json")
    assert status == 400 and "JSON" in problem["detail"]
    statuses = [_post(url + "/v1/pull", {"client_id": "dev-rate"})[0] for _ in range(12)]
    assert statuses.count(429) >= 1 and statuses[0] == 200
    status, _type, problem = _post(url + "/v1/pull", {"client_id": "dev-rate"})
    if status == 429:
        assert problem["limit"] == "pull.requests_per_s"


ACL = """\
user alice
topic readwrite alice/#
topic read public/#
"""


def test_auth_and_acl_refusals(broker_factory: Factory, tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    subprocess.run(
        [sys.executable, "-m", "broker.auth.passwd", "-c", "-b", "alice-pw", str(passwd), "alice"],
        check=True,
        timeout=60,
    )
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    broker = broker_factory(
        BrokerOptions(allow_anonymous=False, password_file=str(passwd), acl_file=str(acl), skipmq_extra=PULL)
    )
    url = _url(broker)
    sub = {"client_id": "alice-dev", "subscriptions": [{"filter": "alice/#", "qos": 1}]}
    status, content_type, problem = _post(url + "/v1/sessions/open", sub)
    assert status == 401 and content_type.startswith("application/problem+json")
    status, _type, problem = _post(
        url + "/v1/sessions/open", {**sub, "username": "alice", "password": "wrong"}
    )
    assert status == 401 and "password" in problem["detail"]
    alice = PullClient(url, "alice-dev", username="alice", password="alice-pw")
    assert alice.open([("alice/#", 1)])["subscriptions"] == [{"filter": "alice/#", "qos": 1}]
    with pytest.raises(PullFailed) as refused:
        alice.open([("secret/#", 1)])
    assert refused.value.status == 403 and "secret/#" in refused.value.problem["detail"]
    with pytest.raises(PullFailed) as refused:
        alice.post(
            "/v1/publish", {"client_id": "alice-dev", "topic": "public/news", "payload": "x", "qos": 1}
        )
    assert refused.value.status == 403 and "public/news" in refused.value.problem["detail"]
    ok = alice.post(
        "/v1/publish", {"client_id": "alice-dev", "topic": "alice/self", "payload": "hi", "qos": 1}
    )
    assert ok["qos"] == 1
    fresh, _ = alice.pull_once(wait_s=3)
    assert [payload_bytes(m) for m in fresh] == [b"hi"]
    # another password on the attached session's client id is checked again, not let through
    status, _type, problem = _post(
        url + "/v1/pull", {"client_id": "alice-dev", "username": "alice", "password": "x"}
    )
    assert status == 401


def _post_from(source: str, port: int, path: str, body: Any) -> tuple[int, Any]:
    """POST from the local address ``source`` (any 127.x.y.z reaches the broker on Linux)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20, source_address=(source, 0))
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_bad_credentials_flood_on_a_client_id_does_not_slow_its_device(
    broker_factory: Factory, tmp_path: Path
) -> None:
    """pull.requests_per_s counts only requests that authenticated as the client id; refused ones
    count against their source address (pull.failures_per_s)."""
    passwd = tmp_path / "passwd"
    subprocess.run(
        [sys.executable, "-m", "broker.auth.passwd", "-c", "-b", "alice-pw", str(passwd), "alice"],
        check=True,
        timeout=60,
    )
    broker = broker_factory(
        BrokerOptions(
            allow_anonymous=False,
            password_file=str(passwd),
            # 1 refused request a second: a bad password costs a password hash, which takes long
            # enough on a loaded machine that a looser limit would not be reached by 40 requests
            skipmq_extra={"pull": {"enabled": True, "requests_per_s": 5, "failures_per_s": 1}},
        )
    )
    port = broker.http_port
    victim = {"client_id": "alice-dev", "username": "alice", "password": "alice-pw"}
    status, _answer = _post_from("127.0.0.1", port, "/v1/sessions/open", victim)
    assert status == 200
    attacker_statuses: list[int] = []
    victim_statuses: list[int] = []
    for n in range(40):
        status, problem = _post_from(
            "127.0.0.2",
            port,
            "/v1/pull",
            {"client_id": "alice-dev", "username": "alice", "password": "guess"},
        )
        attacker_statuses.append(status)
        if status == 429:
            assert problem["limit"] == "pull.failures_per_s", problem
        if n % 10 == 9:  # the device pulls at its own pace, well under 5 a second
            victim_statuses.append(_post_from("127.0.0.1", port, "/v1/pull", victim)[0])
    assert attacker_statuses[0] == 401
    assert set(attacker_statuses) <= {401, 429} and attacker_statuses.count(429) >= 20, attacker_statuses
    assert victim_statuses == [200, 200, 200, 200], victim_statuses
    # the device's own rate is still limited once it authenticated
    burst = [_post_from("127.0.0.1", port, "/v1/pull", victim) for _ in range(12)]
    limited = [problem for status, problem in burst if status == 429]
    assert limited and all(problem["limit"] == "pull.requests_per_s" for problem in limited)


def test_publish_is_acknowledged_after_commit_and_survives_kill9(pull_broker: BrokerProcess) -> None:
    url = _url(pull_broker)
    device = PullClient(url, "dev-pubsub")
    device.open([("pk/#", 2)])
    for n in range(5):
        answer = device.post(
            "/v1/publish", {"client_id": "pub-http", "topic": "pk/t", "payload": f"p{n}", "qos": 2}
        )
        assert answer["matched"] is True
    pull_broker.kill()  # every 200 above was a PUBREC after the commit: nothing may be missing
    pull_broker.start()
    got = drain(device, 5)
    assert got == [f"p{n}".encode() for n in range(5)]


def test_qos0_reaches_an_attached_pull_session_and_binary_payloads_are_base64(
    pull_broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    url = _url(pull_broker)
    device = PullClient(url, "dev-q0")
    device.open([("q0/#", 0)])
    publisher = paho_factory(pull_broker, version=5)
    publisher.publish("q0/t", b"\xff\x00binary", qos=0)
    fresh, _ = device.pull_once(wait_s=3)
    assert len(fresh) == 1 and fresh[0]["seq"] is None and "payload_base64" in fresh[0]
    assert payload_bytes(fresh[0]) == b"\xff\x00binary"
    status, _type, answer = _post(url + "/v1/sessions/close", {"client_id": "dev-q0"})
    assert status == 200 and answer["closed"] is True
    status, _type, answer = _post(url + "/v1/sessions/subscriptions", {"client_id": "dev-q0"})
    assert answer["session_present"] is False and answer["subscriptions"] == []


def test_skipmq_pull_prints_messages_as_they_come(
    pull_broker: BrokerProcess, paho_factory: PahoFactory
) -> None:
    """The package's command line client, as a device script would run it."""
    command = [
        sys.executable, "-m", "broker", "pull", "--url", _url(pull_broker), "--client-id", "cli-dev",
        "-t", "cli/#", "-q", "2", "--wait", "2", "--json", "-C", "3",
    ]  # fmt: skip
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _subscriptions(pull_broker) < 1:
            time.sleep(0.1)  # the client has opened its session and subscribed (this broker's only one)
        publisher = paho_factory(pull_broker, version=5)
        for n in range(4):
            publisher.publish("cli/t", f"c{n}".encode(), qos=2)
        out, err = cli.communicate(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, err.decode()
    lines = [json.loads(line) for line in out.decode().splitlines()]
    assert [line["payload"] for line in lines] == ["c0", "c1", "c2"]
    assert all(line["qos"] == 2 and isinstance(line["seq"], int) for line in lines)
    # the fourth stays queued for the next run; the three printed were acknowledged
    device = PullClient(_url(pull_broker), "cli-dev")
    fresh, _ = device.pull_once(wait_s=2)
    assert [payload_bytes(m) for m in fresh] == [b"c3"]


def _subscriptions(broker: BrokerProcess) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "skipmq_subscriptions":
                return sample.value
    return 0.0


# ---------------------------------------------------------------------- slowloris (http.header_timeout_s)
def _closed_after(sock: socket.socket, *, trickle: bytes, budget_s: float) -> float | None:
    """Send ``trickle`` one byte every 0.5 s; the seconds after which the broker closed the
    connection (recv returns b"" or the send fails), or None if it was still open after ``budget_s``."""
    started = time.monotonic()
    sock.settimeout(0.5)
    for byte in trickle:
        if time.monotonic() - started > budget_s:
            return None
        try:
            sock.sendall(bytes([byte]))
            if sock.recv(1024) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - started
    return None


def test_a_client_trickling_headers_is_closed_but_a_long_poll_is_not(broker_factory: Factory) -> None:
    broker = broker_factory(BrokerOptions(skipmq_extra={**PULL, "http": {"header_timeout_s": 2}}))
    # slowloris: a request line and headers, one byte every 0.5 s, never finished
    trickle = b"POST /v1/pull HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200
    with socket.create_connection(("127.0.0.1", broker.http_port), timeout=5) as sock:
        closed_after = _closed_after(sock, trickle=trickle, budget_s=12)
    assert closed_after is not None, "a connection trickling headers for 12 s was not closed"
    assert 1.5 <= closed_after <= 6, closed_after
    # a connection that never sends anything is closed as well
    with socket.create_connection(("127.0.0.1", broker.http_port), timeout=8) as sock:
        started = time.monotonic()
        assert sock.recv(1024) == b""
        assert time.monotonic() - started <= 6
    # a long-poll of 5 s (longer than the 2 s header timeout) on a keep-alive connection is answered
    url = _url(broker)
    _post(
        url + "/v1/sessions/open", {"client_id": "dev-poll", "subscriptions": [{"filter": "p/#", "qos": 1}]}
    )
    connection = http.client.HTTPConnection("127.0.0.1", broker.http_port, timeout=20)
    started = time.monotonic()
    connection.request("POST", "/v1/pull", json.dumps({"client_id": "dev-poll", "wait_s": 5}))
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert response.status == 200 and answer["messages"] == []
    assert time.monotonic() - started >= 4.5
    # the same keep-alive connection serves the next request within the timeout
    connection.request("POST", "/v1/pull", json.dumps({"client_id": "dev-poll"}))
    assert connection.getresponse().status == 200
    connection.close()


def test_a_body_trickled_byte_by_byte_gets_408(broker_factory: Factory) -> None:
    broker = broker_factory(BrokerOptions(skipmq_extra={**PULL, "http": {"header_timeout_s": 2}}))
    body = json.dumps({"client_id": "dev-slow-body", "pad": "a" * 200}).encode()
    head = f"POST /v1/pull HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", broker.http_port), timeout=5) as sock:
        sock.sendall(head)
        started = time.monotonic()
        answer = b""
        sock.settimeout(0.5)
        for byte in body:  # one byte every 0.5 s: 100 s for the whole body
            if time.monotonic() - started > 12:
                break
            try:
                sock.sendall(bytes([byte]))
                answer += sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if b"\r\n\r\n" in answer:
                break
    elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), (answer[:200], elapsed)
    assert b"http.header_timeout_s" in answer and 1.5 <= elapsed <= 6


def _raw_http(port: int, request: bytes) -> tuple[int, str, bytes]:
    """One raw HTTP/1.1 request (bytes as given, a NUL in a header included); status, content
    type and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers.get("Content-Type", ""), body


def test_trials_capped_max_messages_closed_long_poll_nul_header_and_plain_details(
    broker_factory: Factory, paho_factory: PahoFactory
) -> None:
    """What trying the gateway as a user turned up: max_messages above 16 is capped (seed 001
    §4.6: at most 16 per response), not refused; a long-poll whose session /v1/sessions/close
    ended gets 410 (documented), and the next pull says session_present false; a NUL in a
    request header gets a problem+json 400 without an error-level traceback per request; error
    details show JSON values, not Python reprs; /v1/openapi.json with the gateway off is a 404
    problem document that says so."""
    broker = broker_factory(BrokerOptions(skipmq_extra=PULL))
    url = _url(broker)
    _post(url + "/v1/sessions/open", {"client_id": "dev-t", "subscriptions": [{"filter": "t/#", "qos": 1}]})
    publisher = paho_factory(broker, version=5)
    for n in range(20):
        publisher.publish("t/x", f"{n}".encode(), qos=1)
    status, _type, answer = _post(url + "/v1/pull", {"client_id": "dev-t", "max_messages": 100, "wait_s": 5})
    assert status == 200 and len(answer["messages"]) == 16 and answer["remaining"] is True

    status, content_type, problem = _post(url + "/v1/pull", {"client_id": "dev-t", "wait_s": True})
    assert status == 400 and content_type.startswith("application/problem+json")
    assert "got true" in problem["detail"] and "True" not in problem["detail"], problem

    _post(url + "/v1/sessions/open", {"client_id": "dev-c", "subscriptions": [{"filter": "c/#", "qos": 1}]})
    waiting: dict[str, Any] = {}
    poll = threading.Thread(
        target=lambda: waiting.update(r=_post(url + "/v1/pull", {"client_id": "dev-c", "wait_s": 8}))
    )
    poll.start()
    time.sleep(1.0)
    status, _type, closed = _post(url + "/v1/sessions/close", {"client_id": "dev-c"})
    assert status == 200 and closed["closed"] is True
    poll.join(10)
    status, content_type, problem = waiting["r"]
    assert status == 410 and content_type.startswith("application/problem+json"), waiting
    assert "/v1/sessions/close" in problem["detail"] and "retry" not in problem["detail"]
    status, _type, answer = _post(url + "/v1/pull", {"client_id": "dev-c"})
    assert status == 200 and answer["session_present"] is False

    request = b"POST /v1/pull HTTP/1.1\r\nHost: x\r\nX-Note: a\x00b\r\nContent-Length: 2\r\n\r\n{}"
    for _ in range(20):
        status, content_type, body = _raw_http(broker.http_port, request)
        assert status == 400 and content_type.startswith("application/problem+json"), body
        assert json.loads(body)["status"] == 400
    log = broker.stderr_text()
    assert "Traceback" not in log and "Error handling request" not in log
    assert log.count("http_bad_request") <= 2, log[-3000:]  # one line, then quiet for a while

    # limits.max_queued_messages (default 1000) holds for a pull session as for any MQTT session:
    # beyond it messages PUBACKed to their publisher are dropped, counted and logged by name
    _post(url + "/v1/sessions/open", {"client_id": "dev-q", "subscriptions": [{"filter": "q/#", "qos": 1}]})
    for _ in range(1100):
        publisher.publish("q/x", b"m", qos=1)  # each PUBACKed
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    dropped = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith('skipmq_messages_dropped_total{reason="queue_full_oldest"}')
    ]
    assert dropped and dropped[0] >= 1, dropped
    wait_for = time.monotonic() + 10
    while "messages_dropped" not in broker.stderr_text() and time.monotonic() < wait_for:
        time.sleep(0.2)
    assert any("messages_dropped" in line and "dev-q" in line for line in broker.stderr_text().splitlines())

    off = broker_factory(BrokerOptions())
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"{_url(off)}/v1/openapi.json", timeout=10)
    assert caught.value.code == 404
    assert caught.value.headers["Content-Type"].startswith("application/problem+json")
    assert "pull.enabled" in json.loads(caught.value.read())["detail"]
