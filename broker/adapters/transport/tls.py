"""Mutual TLS between brokers (issue #12; docs/security.md "Cluster links").

A cluster CA signs one certificate per broker. The certificate names the broker's peer id
(``host:port``, what it says in its ``Hello``) as a URI subject alternative name
``skipmq://host:port``, and its host as a DNS or IP SAN (what a dialer's hostname check uses).

* The gRPC server requires a client certificate signed by the CA (``require_client_auth``): a
  process without one is refused in the TLS handshake, before any frame is read.
* The dialer checks the acceptor's certificate against the CA and the dialed host.
* :func:`peer_ids_of` reads the authenticated certificate's peer ids: the link layer refuses a
  ``Hello`` whose peer id the certificate does not name (a certified broker cannot pose as another).
* Rotation without a restart: the server's credentials are fetched again for each new handshake
  when the files changed (``grpc.dynamic_ssl_server_credentials``), a dial reads the files when
  they changed; established links keep their session.

:func:`make_ca` and :func:`issue_broker_cert` (the ``cryptography`` package, which the
``skipmq certs`` command and the launcher use) make the CA and the broker certificates.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger("skipmq.transport")

URI_SCHEME = "skipmq://"


class PeerIdentityError(ConnectionError):
    """The answering broker's certificate does not name the peer id that was dialed."""

    def __init__(self, dialed: str, names: set[str]) -> None:
        super().__init__(f"the certificate of the broker at {dialed} names {sorted(names)}, not {dialed!r}")
        self.dialed = dialed
        self.names = names


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of one broker: the cluster CA, its certificate (chain) and private key."""

    ca_file: str
    cert_file: str
    key_file: str

    def read(self) -> tuple[bytes, bytes, bytes]:
        return (
            Path(self.ca_file).read_bytes(),
            Path(self.cert_file).read_bytes(),
            Path(self.key_file).read_bytes(),
        )

    def mtimes(self) -> tuple[int, ...]:
        return tuple(os.stat(path).st_mtime_ns for path in (self.ca_file, self.cert_file, self.key_file))


class ClusterTls:
    """The credentials of one broker's cluster links, re-read when the files change."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._mtimes = files.mtimes()
        self._pem = files.read()
        check_pair(self._pem[1], self._pem[2], files)
        self._served: tuple[int, ...] = self._mtimes
        self._client_context: tuple[tuple[int, ...], ssl.SSLContext] | None = None

    def _current(self) -> tuple[bytes, bytes, bytes]:
        try:
            mtimes = self.files.mtimes()
            if mtimes != self._mtimes:
                pem = self.files.read()
                check_pair(pem[1], pem[2], self.files)
                self._pem, self._mtimes = pem, mtimes
                log.info("cluster TLS files re-read: %s", self.files.cert_file)
        except (OSError, ValueError) as exc:  # half-written files during a rotation: keep the old ones
            log.warning("cluster TLS files not re-read (%s); keeping the previous ones", exc)
        return self._pem

    def server_credentials(self) -> grpc.ServerCredentials:
        ca, cert, key = self._pem

        def fetch() -> Any:
            current = self._current()
            if self._mtimes == self._served:
                return None  # unchanged: gRPC keeps the configuration it has
            self._served = self._mtimes
            return grpc.ssl_server_certificate_configuration([(current[2], current[1])], current[0])

        initial = grpc.ssl_server_certificate_configuration([(key, cert)], ca)
        return grpc.dynamic_ssl_server_credentials(initial, fetch, require_client_authentication=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        ca, cert, key = self._current()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    # ssl.SSLContext for the h2 runtime (h2_runtime.py): ALPN h2, certificates required both ways

    def server_ssl_context(self) -> ssl.SSLContext:
        """The listener's context; each handshake swaps in a fresh one when the files changed
        (the SNI callback runs for every ClientHello, with or without a server name)."""
        contexts: dict[str, Any] = {"mtimes": self._mtimes, "context": _ssl_context(self._pem, server=True)}

        def select(sslobj: ssl.SSLObject, _name: str | None, _context: ssl.SSLContext) -> None:
            pem = self._current()
            if self._mtimes != contexts["mtimes"]:
                try:
                    contexts["context"] = _ssl_context(pem, server=True, reload=select)
                    contexts["mtimes"] = self._mtimes
                except (OSError, ValueError, ssl.SSLError) as exc:
                    log.warning("cluster TLS context not rebuilt (%s); keeping the previous one", exc)
            sslobj.context = contexts["context"]

        first = _ssl_context(self._pem, server=True, reload=select)
        contexts["context"] = first
        return first

    def client_ssl_context(self) -> ssl.SSLContext:
        """A dial's context from the current files (the acceptor's certificate must chain to the
        CA and name the dialed host; the peer id is checked by the caller)."""
        pem = self._current()
        cached = self._client_context
        if cached is None or cached[0] != self._mtimes:
            cached = self._client_context = (self._mtimes, _ssl_context(pem, server=False))
        return cached[1]


def _ssl_context(pem: tuple[bytes, bytes, bytes], *, server: bool, reload: Any = None) -> ssl.SSLContext:
    import tempfile

    ca, cert, key = pem
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=ca.decode())
    with tempfile.TemporaryDirectory() as directory:  # load_cert_chain reads files only
        chain, private = Path(directory, "cert.pem"), Path(directory, "key.pem")
        chain.write_bytes(cert)
        _write_private(private, key)
        context.load_cert_chain(str(chain), str(private))
    context.set_alpn_protocols(["h2"])
    if reload is not None:
        context.sni_callback = reload
    return context


def check_pair(cert_pem: bytes, key_pem: bytes, files: TlsFiles | None = None) -> None:
    """ValueError unless ``key_pem`` is the private key of ``cert_pem``'s first certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    where = f" ({files.cert_file}, {files.key_file})" if files is not None else ""
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(serialization.Encoding.DER, public) != key.public_key().public_bytes(
        serialization.Encoding.DER, public
    ):
        raise ValueError(f"the private key does not belong to the certificate{where}")


def peer_ids_of(cert_pem: bytes) -> set[str]:
    """The peer ids a broker certificate names (its ``skipmq://host:port`` URI SANs)."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {
        uri[len(URI_SCHEME) :]
        for uri in san.get_values_for_type(x509.UniformResourceIdentifier)
        if uri.startswith(URI_SCHEME)
    }


def authenticated_peer_ids(context: Any) -> set[str] | None:
    """The peer ids of the client certificate of an accepted gRPC call; None without TLS."""
    auth = context.auth_context()
    pems = auth.get("x509_pem_cert")
    if not pems:
        return None
    return peer_ids_of(pems[0])


def identity_refusal(context: Any, claimed: str, what: str) -> str | None:
    """Why a stream whose first message (``what``: "Hello", "LinkRequest") claims the name
    ``claimed`` is refused, or None: the client certificate, verified against the CA in the
    handshake, must name it (``skipmq://host:port``), so a certified broker cannot pose as
    another. Only for TLS links (the caller checks)."""
    names = authenticated_peer_ids(context)
    if names is None:
        return "no client certificate on a TLS link"
    if claimed not in names:
        return f"{what} claims {claimed!r}; the certificate names {sorted(names)}"
    return None


# ---------------------------------------------------------------------------------------------
# making certificates (skipmq certs, tools/launcher)

_CA_DAYS = 3650
_BROKER_DAYS = 365


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _check_days(days: int) -> None:
    if days < 1:
        raise ValueError(f"validity must be at least 1 day, got {days} (--days)")


def make_ca(
    directory: str | Path, *, name: str = "SkipMQ cluster CA", days: int = _CA_DAYS
) -> tuple[Path, Path]:
    """A new cluster CA: ``ca.pem`` and ``ca.key`` (mode 0600) in ``directory``; refuses to
    overwrite an existing CA. Returns (certificate, key) paths.

    Every CA gets a name of its own - ``name``, the day it was made and a random serial in its
    subject (CN and serialNumber) - and a subject key identifier, which the certificates it issues
    name as their authority key identifier: with a bundle [old CA, new CA] during a rotation, a
    verifier (OpenSSL, gRPC, origin proofs) finds each certificate's own CA, not the first one of
    the same name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    _check_days(days)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / "ca.pem", out / "ca.key"
    if cert_path.exists() or key_path.exists():
        raise FileExistsError(f"{cert_path} or {key_path} exists; not overwriting a CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    unique = f"{x509.random_serial_number():x}"[:16]
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, f"{name} {now:%Y-%m-%d} {unique[:8]}"),
            x509.NameAttribute(NameOID.SERIAL_NUMBER, unique),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def split_peer_id(peer_id: str) -> tuple[str, int]:
    host, sep, port = peer_id.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"a peer id is host:port, not {peer_id!r}")
    return host.strip("[]"), int(port)


def issue_broker_cert(
    ca_dir: str | Path,
    peer_id: str,
    *,
    out_dir: str | Path | None = None,
    name: str | None = None,
    days: int = _BROKER_DAYS,
) -> tuple[Path, Path]:
    """A certificate and key for the broker with ``peer_id`` (``host:port``), signed by the CA in
    ``ca_dir``: ``<name>.pem`` / ``<name>.key`` (mode 0600) in ``out_dir`` (default ``ca_dir``).
    SANs: ``skipmq://<peer id>`` and the host as an IP or DNS name. Returns (cert, key) paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    _check_days(days)
    host, _port = split_peer_id(peer_id)
    ca_path = Path(ca_dir)
    ca_cert = x509.load_pem_x509_certificate((ca_path / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_path / "ca.key").read_bytes(), password=None)
    out = Path(out_dir) if out_dir is not None else ca_path
    out.mkdir(parents=True, exist_ok=True)
    stem = name or peer_id.replace(":", "_").replace("[", "").replace("]", "")
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        host_name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        host_name = x509.DNSName(host)
    try:  # the CA's own key identifier (a CA made elsewhere may have none: computed from its key)
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        authority = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
    except x509.ExtensionNotFound:
        authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key())  # type: ignore[arg-type]
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, peer_id)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(URI_SCHEME + peer_id), host_name]),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(authority, critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    cert_path, key_path = out / f"{stem}.pem", out / f"{stem}.key"
    _write_private(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path
