"""MQTT over TLS with client certificates as an authentication method (issue #12;
docs/security.md "Client certificates").

A real broker process with a TLS listener whose client certificates are verified against a CA;
the certificate's identity (its CN, or a subject alternative name: ``listeners.tls.identity_field``)
is the MQTT user name, alongside a password file and an ACL. Clients written outside the project:
paho-mqtt and mosquitto_pub / mosquitto_sub with ``--cert`` / ``--key``. Certificates are made
here with the ``cryptography`` package: the listener's CA, another CA nobody trusts, and client
certificates for alice (CN), bob (CN), a certificate without a CN and one with an e-mail SAN.

SkipMQ-only keys (``identity_field``, an optional certificate with identity): skipped when the
interop suite targets mosquitto.
"""

from __future__ import annotations

import datetime
import shutil
import ssl
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker.adapters.transport.tls import issue_broker_cert, make_ca
from broker.auth.users import PasswordFile
from tests.support.interop_broker import TARGET, BrokerOptions, BrokerProcess
from tests.support.interop_clients import MosquittoSub, PahoClient, mosquitto_pub, unique_id, v5_props

pytestmark = pytest.mark.skipif(TARGET != "skipmq", reason="SkipMQ's certificate identity keys")

PahoFactory = Callable[..., PahoClient]
NOT_AUTHORIZED = 0x87
BAD_USER_NAME_OR_PASSWORD = 0x86
ACL = """\
user alice
topic readwrite secret/#
topic readwrite public/#

user bob
topic readwrite public/#

user dave@example.org
topic readwrite dave/#

user carol
topic readwrite carol/#
"""


@dataclass
class Pki:
    directory: Path
    ca: Path
    server_cert: Path
    server_key: Path

    def client(self, name: str) -> tuple[Path, Path]:
        return self.directory / f"{name}.pem", self.directory / f"{name}.key"


def _client_cert(ca_dir: Path, out: Path, stem: str, *, cn: str | None, email: str | None = None) -> None:
    ca_cert = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "SkipMQ tests")]
    if cn is not None:
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if email is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.RFC822Name(email)]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    (out / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / f"{stem}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("client-pki")
    ca_dir, other_dir = root / "ca", root / "other-ca"
    ca, _ = make_ca(ca_dir, name="SkipMQ client CA")
    make_ca(other_dir, name="Someone else's CA")
    server_cert, server_key = issue_broker_cert(ca_dir, "127.0.0.1:8883", out_dir=root, name="server")
    _client_cert(ca_dir, root, "alice", cn="alice")
    _client_cert(ca_dir, root, "bob", cn="bob")
    _client_cert(ca_dir, root, "no-cn", cn=None)
    _client_cert(ca_dir, root, "dave", cn="not-dave", email="dave@example.org")
    _client_cert(other_dir, root, "forged-alice", cn="alice")
    return Pki(root, ca, server_cert, server_key)


def _auth_files(directory: Path) -> tuple[str, str]:
    passwords = PasswordFile()
    passwords.set("alice", "alice-pw")
    passwords.set("carol", "carol-pw")
    passwd, acl = directory / "passwd", directory / "acl"
    passwords.save(str(passwd))
    acl.write_text(ACL)
    return str(passwd), str(acl)


def _options(pki: Pki, *, require: bool, identity_field: str = "cn") -> BrokerOptions:
    passwd, acl = _auth_files(pki.directory)
    return BrokerOptions(
        tls=True,
        tls_certfile=str(pki.server_cert),
        tls_keyfile=str(pki.server_key),
        tls_cafile=str(pki.ca),
        tls_require_client_cert=require,
        tls_use_identity_as_username=True,
        allow_anonymous=False,
        password_file=passwd,
        acl_file=acl,
        skipmq_extra={"listeners.tls": {"identity_field": identity_field}},
    )


def _context(pki: Pki, client: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(pki.ca))
    if client is not None:
        cert, key = pki.client(client)
        context.load_cert_chain(str(cert), str(key))
    return context


def _refused_at_handshake(make: Callable[[], PahoClient]) -> None:
    """No CONNACK: the TLS handshake fails (TLS 1.2) or the first read after it (TLS 1.3)."""
    try:
        client = make()
    except (ssl.SSLError, OSError, TimeoutError):
        return
    assert client.connack_reason is None, f"connected without a valid certificate: {client.connack_reason}"


def _mosquitto_pub_args(broker: BrokerProcess, pki: Pki, client: str, *args: str) -> list[str]:
    cert, key = pki.client(client)
    return [
        "mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.tls_port), "--cafile", str(pki.ca),
        "--cert", str(cert), "--key", str(key), "-V", "mqttv5", *args,
    ]  # fmt: skip


@pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto clients not installed")
def test_a_certificate_of_the_ca_authenticates_its_cn_and_the_acl_applies_to_it(
    pki: Pki, broker_factory: Callable[[BrokerOptions], BrokerProcess], paho_factory: PahoFactory
) -> None:
    broker = broker_factory(_options(pki, require=True))
    cert, key = pki.client("alice")
    tls_args = ["--cafile", str(pki.ca), "--cert", str(cert), "--key", str(key)]
    # alice by certificate (no password; anonymous access is off), with mosquitto_sub
    with MosquittoSub("127.0.0.1", broker.tls_port, "secret/#", qos=1, version=5, extra=tls_args) as sub:
        # bob by certificate, with paho: his CONNECT names alice and her password; the certificate wins
        bob = paho_factory(
            broker, port=broker.tls_port, version=5, tls_context=_context(pki, "bob"),
            username="alice", password="alice-pw",
        )  # fmt: skip
        assert [int(code.value) for code in bob.subscribe("secret/#", 1)] == [NOT_AUTHORIZED]
        assert [int(code.value) for code in bob.subscribe("public/#", 1)] == [1]
        bob.publish("secret/x", b"from-bob", 1)  # bob may not write secret/#: dropped
        mosquitto_pub(
            "127.0.0.1", broker.tls_port, "secret/x", "from-alice", qos=1, version=5, extra=tls_args
        )
        assert sub.wait_message().payload == "from-alice"
        with pytest.raises(TimeoutError):
            sub.wait_message(0.5)
    bob.publish("public/y", b"bob-public", 1)
    assert bob.wait_message().payload == b"bob-public"
    bob.assert_no_message(0.3)


def test_no_certificate_or_one_of_another_ca_is_refused(
    pki: Pki, broker_factory: Callable[[BrokerOptions], BrokerProcess], paho_factory: PahoFactory
) -> None:
    broker = broker_factory(_options(pki, require=True))
    port = broker.tls_port
    no_cert = {"tls_context": _context(pki, None), "username": "alice", "password": "alice-pw"}
    _refused_at_handshake(lambda: paho_factory(broker, port=port, version=5, expect_success=False, **no_cert))
    forged = {"tls_context": _context(pki, "forged-alice")}
    _refused_at_handshake(lambda: paho_factory(broker, port=port, version=5, expect_success=False, **forged))
    result = subprocess.run(
        _mosquitto_pub_args(broker, pki, "forged-alice", "-t", "secret/x", "-m", "forged", "-q", "1"),
        capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    # a certificate of the CA without the configured identity (no CN) is refused with 0x87,
    # it does not fall back to the user name and password in its CONNECT
    no_cn = paho_factory(
        broker, port=port, version=5, tls_context=_context(pki, "no-cn"),
        username="alice", password="alice-pw", expect_success=False,
    )  # fmt: skip
    assert no_cn.connack_reason is not None and int(no_cn.connack_reason.value) == NOT_AUTHORIZED
    assert "client certificate has no cn identity" in broker.stderr_tail(40)
    # the broker is fine: alice with her certificate still connects
    paho_factory(broker, port=port, version=5, tls_context=_context(pki, "alice"))


def test_a_certificate_user_cannot_take_over_another_users_session(
    pki: Pki, broker_factory: Callable[[BrokerOptions], BrokerProcess], paho_factory: PahoFactory
) -> None:
    broker = broker_factory(_options(pki, require=True))
    port = broker.tls_port
    client_id = unique_id("alice-session")
    alice = paho_factory(
        broker, port=port, version=5, client_id=client_id, clean=False,
        tls_context=_context(pki, "alice"), connect_props=v5_props(1, SessionExpiryInterval=300),
    )  # fmt: skip
    alice.subscribe("secret/#", 1)
    alice.close()
    sender = paho_factory(broker, port=port, version=5, tls_context=_context(pki, "alice"))
    sender.publish("secret/queued", b"for-alice-only", 1)
    for clean in (False, True):
        bob = paho_factory(
            broker, port=port, version=5, client_id=client_id, clean=clean,
            tls_context=_context(pki, "bob"), username="alice", password="alice-pw",
            connect_props=v5_props(1, SessionExpiryInterval=300), expect_success=False,
        )  # fmt: skip
        assert bob.connack_reason is not None and int(bob.connack_reason.value) == NOT_AUTHORIZED
        assert bob.messages.empty()
    again = paho_factory(
        broker, port=port, version=5, client_id=client_id, clean=False,
        tls_context=_context(pki, "alice"), connect_props=v5_props(1, SessionExpiryInterval=300),
    )  # fmt: skip
    assert again.session_present
    assert again.wait_message().payload == b"for-alice-only"


def test_optional_certificate_alongside_the_password_file_with_san_identity(
    pki: Pki, broker_factory: Callable[[BrokerOptions], BrokerProcess], paho_factory: PahoFactory
) -> None:
    broker = broker_factory(_options(pki, require=False, identity_field="san_email"))
    port = broker.tls_port
    # dave by his certificate's e-mail SAN (its CN "not-dave" is not used)
    dave = paho_factory(broker, port=port, version=5, tls_context=_context(pki, "dave"))
    assert [int(code.value) for code in dave.subscribe("dave/#", 1)] == [1]
    assert [int(code.value) for code in dave.subscribe("carol/#", 1)] == [NOT_AUTHORIZED]
    # carol without a certificate: the password file decides
    carol = paho_factory(
        broker, port=port, version=5, tls_context=_context(pki, None), username="carol", password="carol-pw"
    )
    assert [int(code.value) for code in carol.subscribe("carol/#", 1)] == [1]
    wrong = paho_factory(
        broker, port=port, version=5, tls_context=_context(pki, None), username="carol",
        password="guess", expect_success=False,
    )  # fmt: skip
    assert wrong.connack_reason is not None and int(wrong.connack_reason.value) == BAD_USER_NAME_OR_PASSWORD
    anonymous = paho_factory(
        broker, port=port, version=5, tls_context=_context(pki, None), expect_success=False
    )
    assert anonymous.connack_reason is not None and int(anonymous.connack_reason.value) == NOT_AUTHORIZED
    # a certificate is optional, but one that is presented must verify
    forged = {"tls_context": _context(pki, "forged-alice")}
    _refused_at_handshake(lambda: paho_factory(broker, port=port, version=5, expect_success=False, **forged))
    # alice's certificate has no e-mail SAN: refused, although her password would be right
    alice = paho_factory(
        broker, port=port, version=5, tls_context=_context(pki, "alice"), username="alice",
        password="alice-pw", expect_success=False,
    )  # fmt: skip
    assert alice.connack_reason is not None and int(alice.connack_reason.value) == NOT_AUTHORIZED
    dave.publish("dave/x", b"hi", 1)
    assert dave.wait_message().payload == b"hi"
