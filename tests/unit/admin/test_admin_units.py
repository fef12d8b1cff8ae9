"""The admin API's pure parts: packet framing for traces, filter overlap, the dynamic user and
ACL records, the authenticator and ACL with dynamic entries, signed broker requests, the route
table against the OpenAPI document, and the reserved-topic rules."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from broker.adapters.admin.access import BrokerSigner, BrokerVerifier, Principal, canonical_target
from broker.adapters.admin.api import decode_cursor, encode_cursor
from broker.adapters.admin.local import filters_overlap
from broker.adapters.admin.openapi import document
from broker.adapters.admin.responses import ApiError
from broker.adapters.admin.routes import ROUTES
from broker.adapters.admin.traces import PacketFramer
from broker.auth.acl import Acl, parse_acl_rule
from broker.auth.dynamic_auth import (
    AclRecord,
    RecordError,
    UserRecord,
    acl_payload,
    parse_record,
    user_payload,
    user_topic,
)
from broker.auth.password_hashes import hash_password
from broker.auth.users import Authenticator
from broker.certs import main as certs_main
from broker.core.reserved import is_reserved_filter, is_reserved_topic
from broker.mqtt.packets import ReasonCode
from tools.mqtt_raw import connect_packet, publish_packet


def test_the_framer_splits_packets_across_reads_and_reads_publish_topics() -> None:
    stream = connect_packet("c1") + publish_packet("a/b", b"x" * 300, qos=1, packet_id=7) + bytes((0xC0, 0))
    framer = PacketFramer()
    seen = []
    for index in range(0, len(stream), 5):  # five bytes at a time
        seen += framer.feed(stream[index : index + 5])
    assert [(kind, topic) for kind, _size, topic in seen] == [
        ("CONNECT", None),
        ("PUBLISH", "a/b"),
        ("PINGREQ", None),
    ]
    assert sum(size for _kind, size, _topic in seen) == len(stream)


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("plant7/#", "plant7/a/temp", True),
        ("plant7/#", "#", True),
        ("plant7/#", "+/x", True),
        ("plant7/+/temp", "plant7/#", True),
        ("plant7/a", "plant8/#", False),
        ("a/b", "a/b/c", False),
        ("a/#", "a", True),
        ("#", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
    ],
)
def test_filters_overlap(a: str, b: str, overlap: bool) -> None:
    assert filters_overlap(a, b) is overlap and filters_overlap(b, a) is overlap


def test_user_and_acl_records_round_trip_and_bad_ones_are_refused() -> None:
    encoded = hash_password("pw")
    record = parse_record(user_topic("a/b+c"), user_payload(encoded, 5, "root"))
    assert record == UserRecord("a/b+c", encoded, 5, "root")
    assert parse_record(user_topic("x"), user_payload(None, 6, "root")) == UserRecord("x", None, 6, "root")
    assert parse_record(user_topic("x"), b"") == "x"
    rules = [parse_acl_rule("topic", "read a/#"), parse_acl_rule("topic", "deny a/secret")]
    acl = parse_record("$skipmq/auth/acl/users/bob", acl_payload(rules, 1, "root"))
    assert isinstance(acl, AclRecord) and acl.section == ("user", "bob") and list(acl.rules) == rules
    with pytest.raises(RecordError):
        parse_record(user_topic("x"), b'{"v":1,"hash":"plaintext"}')
    with pytest.raises(RecordError):
        parse_record("$skipmq/auth/acl/anonymous", b'{"v":1,"rules":[{"access":"all","filter":"#"}]}')
    assert parse_record("$skipmq/admin/brokers/x", b"{}") is None


def test_dynamic_users_override_and_hide_file_users(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text(f"alice:{hash_password('file-pw')}\n")
    auth = Authenticator(allow_anonymous=True, password_file=str(passwd))
    assert auth.authenticate("alice", b"file-pw") == ReasonCode.SUCCESS
    auth.set_dynamic_user("alice", hash_password("new-pw"))
    assert auth.authenticate("alice", b"file-pw") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert auth.authenticate("alice", b"new-pw") == ReasonCode.SUCCESS
    auth.set_dynamic_user("alice", None)  # removed through the API: the file's alice is hidden too
    assert auth.authenticate("alice", b"file-pw") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    auth.forget_dynamic_user("alice")
    assert auth.authenticate("alice", b"file-pw") == ReasonCode.SUCCESS
    # without a password file, a first dynamic user turns the check on for every user name
    open_auth = Authenticator(allow_anonymous=True, password_file=None)
    assert open_auth.authenticate("anyone", b"x") == ReasonCode.SUCCESS
    open_auth.set_dynamic_user("bob", hash_password("pw"))
    assert open_auth.authenticate("anyone", b"x") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert open_auth.authenticate(None, None) == ReasonCode.SUCCESS


def test_acl_sections_compose_with_the_file() -> None:
    base = Acl.parse(["topic read public/#", "user bob", "topic readwrite bob/#"])
    assert Acl.compose(None, {}) is None
    composed = Acl.compose(base, {("user", "bob"): [parse_acl_rule("topic", "read other/#")]})
    assert composed is not None
    assert not composed.can_subscribe("c", "bob", "bob/#") and composed.can_subscribe("c", "bob", "other/x")
    assert composed.can_subscribe("c", None, "public/x")  # the file's anonymous section stays
    assert Acl.parse(composed.to_text().splitlines()).sections() == composed.sections()


def test_reserved_topics() -> None:
    assert is_reserved_topic("$skipmq/auth/users/x") and is_reserved_topic("$skipmq")
    assert (
        not is_reserved_topic("$skipmqx/a")
        and not is_reserved_topic("skipmq/a")
        and not is_reserved_topic("$SYS/x")
    )
    assert (
        is_reserved_filter("$skipmq/#") and not is_reserved_filter("#") and not is_reserved_filter("+/auth/#")
    )


def test_cursors_round_trip_and_foreign_ones_are_refused() -> None:
    after = {"node-0": ["c-7"], "node-1": None}
    assert decode_cursor(encode_cursor(after)) == {"node-0": ("c-7",), "node-1": None}
    for bad in ("!!", "eyJ2IjogMn0", encode_cursor({"n": ["a"]})[:-3] + "xyz"):
        with pytest.raises(ApiError):
            decode_cursor(bad)


def test_every_route_is_documented_and_every_documented_operation_routed() -> None:
    documented = {(method.upper(), path) for path, ops in document()["paths"].items() for method in ops}
    routed = {(route.method, re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.path)) for route in ROUTES}
    assert routed == documented


def test_signed_broker_requests_verify_and_forgeries_do_not(tmp_path: Path) -> None:
    assert certs_main(["init", str(tmp_path)]) == 0
    assert certs_main(["issue", str(tmp_path), "127.0.0.1:7001"]) == 0
    assert certs_main(["init", str(tmp_path / "other")]) == 0
    assert certs_main(["issue", str(tmp_path / "other"), "127.0.0.1:7001"]) == 0
    signer = BrokerSigner(
        "127.0.0.1:7001", str(tmp_path / "127.0.0.1_7001.pem"), str(tmp_path / "127.0.0.1_7001.key")
    )
    verifier = BrokerVerifier(str(tmp_path / "ca.pem"))
    target = canonical_target("/admin/v1/clients", {"prefix": "a/#", "limit": "2"})
    who = Principal("root", "admin")
    headers = signer.headers("GET", target, who)
    args = ("GET", target, headers["X-SkipMQ-Broker-Signature"], headers["X-SkipMQ-Broker-Cert"], b"")
    assert verifier.verify(*args, time.time()) == Principal("root", "admin", via="127.0.0.1:7001")
    with pytest.raises(ValueError, match="replay"):
        verifier.verify(*args, time.time())
    again = signer.headers("GET", target, who)
    with pytest.raises(ValueError, match="does not verify"):  # another path, same signature
        verifier.verify(
            "GET",
            target + "&x=1",
            again["X-SkipMQ-Broker-Signature"],
            again["X-SkipMQ-Broker-Cert"],
            b"",
            time.time(),
        )
    escalated = signer.headers("GET", target, Principal("viewer", "readonly"))
    forged = escalated["X-SkipMQ-Broker-Signature"].replace("role=readonly", "role=admin")
    with pytest.raises(ValueError, match="does not verify"):
        verifier.verify("GET", target, forged, escalated["X-SkipMQ-Broker-Cert"], b"", time.time())
    stranger = BrokerSigner(
        "127.0.0.1:7001",
        str(tmp_path / "other" / "127.0.0.1_7001.pem"),
        str(tmp_path / "other" / "127.0.0.1_7001.key"),
    )
    outside = stranger.headers("GET", target, who)
    with pytest.raises(ValueError, match="not issued by the cluster CA"):
        verifier.verify(
            "GET",
            target,
            outside["X-SkipMQ-Broker-Signature"],
            outside["X-SkipMQ-Broker-Cert"],
            b"",
            time.time(),
        )
    late = signer.headers("GET", target, who)
    with pytest.raises(ValueError, match="window"):
        verifier.verify(
            "GET",
            target,
            late["X-SkipMQ-Broker-Signature"],
            late["X-SkipMQ-Broker-Cert"],
            b"",
            time.time() + 120,
        )
