"""Who may use the admin API: admin users with roles, and brokers speaking for an admin.

* **Admin users** are separate from MQTT users: ``admin.users_file`` holds one
  ``name:role:hash`` per line (role ``admin`` or ``readonly``; the hash is the password file's
  salted scrypt, ``broker.auth.password_hashes.hash_password``), made with ``skipmq ctl admin-user``. Requests
  carry HTTP Basic credentials. ``readonly`` may read (GET) everything but the password-hash
  export; ``admin`` may also change things. The file is re-read when it changes.
* **Brokers** ask each other for their part of a cluster-wide answer (``fanout``). Such a request
  is signed with the calling broker's cluster key (``cluster.tls_key_file``): a header carries
  its certificate (issued by the cluster CA for ``skipmq://<peer id>``, as its links' TLS
  identity) and an ECDSA/RSA/Ed25519 signature over the method, path and query, a timestamp, a
  nonce, the body's digest and the admin user and role it acts for. The called broker checks the
  certificate against ``cluster.tls_ca_file``, the signature, a 60 s window and that the nonce is
  new: no open internal endpoint, no shared secret to configure. With ``cluster.insecure`` there
  is no cluster key: the caller's own ``Authorization`` header is forwarded instead (every broker
  then needs the same admin users file).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime
import hashlib
import hmac
import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from broker.auth.password_hashes import check_encoded, dummy_hash, hash_password, verify_password
from broker.auth.users import check_username

ROLES = ("readonly", "admin")
SIGNATURE_HEADER = "X-SkipMQ-Broker-Signature"
CERT_HEADER = "X-SkipMQ-Broker-Cert"
SIGNATURE_WINDOW_S = 60.0
_VERIFIED_CACHE_SIZE = 1000
_NONCE_CACHE_SIZE = 100_000


class AdminUsersError(ValueError):
    """The admin users file cannot be used (names the file and line)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for: an admin user and its role; ``via``: the broker that asked for it
    on the user's behalf (None: the user asked this broker directly)."""

    user: str
    role: str
    via: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def parse_admin_users(text: str, path: str = "<admin users>") -> dict[str, tuple[str, str]]:
    """name -> (role, hash) of an admin users file's text; AdminUsersError naming the line."""
    users: dict[str, tuple[str, str]] = {}
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition(":")
        role, _, encoded = rest.partition(":")
        if not name or not role or not encoded:
            raise AdminUsersError(f"{path}:{line_no}: expected 'name:role:password-hash'")
        if role not in ROLES:
            raise AdminUsersError(f"{path}:{line_no}: role {role!r} is not one of {', '.join(ROLES)}")
        try:
            check_username(name)
            check_encoded(encoded)
        except ValueError as exc:
            raise AdminUsersError(f"{path}:{line_no}: {exc}") from None
        if name in users:
            raise AdminUsersError(f"{path}:{line_no}: admin user {name!r} appears twice")
        users[name] = (role, encoded)
    return users


def render_admin_users(users: dict[str, tuple[str, str]]) -> str:
    return "".join(f"{name}:{role}:{encoded}\n" for name, (role, encoded) in users.items())


def write_admin_users(path: str, users: dict[str, tuple[str, str]]) -> None:
    """Write atomically (temporary file + rename), readable by the owner only."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".admin-users-{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(render_admin_users(users))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def set_admin_user(users: dict[str, tuple[str, str]], name: str, role: str, password: str) -> None:
    check_username(name)
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
    if not password:
        raise ValueError("the password must not be empty")
    users[name] = (role, hash_password(password))


class AdminUsers:
    """The admin users file, re-read when its modification time changes; ``check`` verifies a
    password (scrypt: call it off the event loop) and remembers a success (keyed HMAC, bounded)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._users: dict[str, tuple[str, str]] = {}
        self._mtime_ns = -1
        self._checked_at = 0.0
        self._key = secrets.token_bytes(32)
        self._verified: OrderedDict[tuple[str, str, bytes], None] = OrderedDict()
        self._lock = threading.Lock()
        self.load()

    def load(self) -> None:
        try:
            stat = os.stat(self.path)
            with open(self.path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise AdminUsersError(f"{self.path}: cannot read the admin users file: {exc}") from None
        users = parse_admin_users(text, self.path)
        with self._lock:
            self._users = users
            self._mtime_ns = stat.st_mtime_ns

    def refresh(self) -> None:
        """Re-read the file if it changed (at most once a second); a broken file keeps the old users."""
        now = time.monotonic()
        if now - self._checked_at < 1.0:
            return
        self._checked_at = now
        try:
            mtime_ns = os.stat(self.path).st_mtime_ns
        except OSError:
            return
        if mtime_ns != self._mtime_ns:
            try:
                self.load()
            except AdminUsersError:
                pass

    def __len__(self) -> int:
        return len(self._users)

    def check(self, name: str, password: str) -> Principal | None:
        """The principal of (name, password), or None. Costs one scrypt unless remembered."""
        with self._lock:
            entry = self._users.get(name)
        if entry is None:
            verify_password(password.encode(), dummy_hash())  # unknown users cost the same
            return None
        role, encoded = entry
        fingerprint = hmac.new(self._key, password.encode(), hashlib.sha256).digest()
        remembered = (name, encoded, fingerprint)
        with self._lock:
            if remembered in self._verified:
                return Principal(name, role)
        if not verify_password(password.encode(), encoded):
            return None
        with self._lock:
            self._verified[remembered] = None
            while len(self._verified) > _VERIFIED_CACHE_SIZE:
                self._verified.popitem(last=False)
        return Principal(name, role)


def basic_credentials(header: str | None) -> tuple[str, str] | str:
    """(user, password) of an ``Authorization: Basic`` header, or why it is not usable."""
    if not header:
        return "no credentials (HTTP Basic with an admin user is required)"
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return "only HTTP Basic authentication is supported"
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return "the Authorization header is not valid Basic credentials"
    if not sep or not user:
        return "Basic credentials need user:password"
    return user, password


# ------------------------------------------------------------------------------------------
# broker-to-broker requests signed with the cluster key


def canonical_target(path: str, query: Any) -> str:
    """The path and the (decoded) query parameters in one canonical form, as signed: the same
    on both ends whatever percent-encoding the HTTP libraries chose."""
    from urllib.parse import urlencode

    return path + "?" + urlencode(sorted((str(k), str(v)) for k, v in query.items()))


def _signed_text(
    method: str, target: str, ts_ms: int, nonce: str, principal: Principal, body: bytes
) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join(
        ("skipmq-admin-v1", method.upper(), target, str(ts_ms), nonce, principal.user, principal.role, digest)
    ).encode()


class BrokerSigner:
    """Signs this broker's admin requests to other brokers with its cluster key (re-read when
    the files change, as the links do)."""

    def __init__(self, peer_id: str, cert_file: str, key_file: str) -> None:
        self.peer_id = peer_id
        self.cert_file = cert_file
        self.key_file = key_file
        self._loaded: tuple[int, int, str, Any] | None = None

    def _material(self) -> tuple[str, Any]:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        stamps = (os.stat(self.cert_file).st_mtime_ns, os.stat(self.key_file).st_mtime_ns)
        if self._loaded is None or self._loaded[:2] != stamps:
            with open(self.cert_file, "rb") as handle:
                cert = x509.load_pem_x509_certificate(handle.read())
            with open(self.key_file, "rb") as handle:
                key = serialization.load_pem_private_key(handle.read(), password=None)
            der = cert.public_bytes(serialization.Encoding.DER)
            self._loaded = (stamps[0], stamps[1], base64.b64encode(der).decode(), key)
        return self._loaded[2], self._loaded[3]

    def headers(self, method: str, target: str, principal: Principal, body: bytes = b"") -> dict[str, str]:
        cert_b64, key = self._material()
        ts_ms = int(time.time() * 1000)
        nonce = secrets.token_hex(16)
        signature = _sign(key, _signed_text(method, target, ts_ms, nonce, principal, body))
        value = ";".join(
            (
                f"peer={self.peer_id}",
                f"ts={ts_ms}",
                f"nonce={nonce}",
                f"user={base64.urlsafe_b64encode(principal.user.encode()).decode()}",
                f"role={principal.role}",
                f"sig={base64.b64encode(signature).decode()}",
            )
        )
        return {SIGNATURE_HEADER: value, CERT_HEADER: cert_b64}


def _sign(key: Any, data: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(data, ec.ECDSA(hashes.SHA256()))
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(data)
    raise ValueError(f"unsupported cluster key type {type(key).__name__}")


def _verify_signature(public_key: Any, signature: bytes, data: bytes) -> None:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

    if isinstance(public_key, ec.EllipticCurvePublicKey):
        public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    elif isinstance(public_key, rsa.RSAPublicKey):
        public_key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
    elif isinstance(public_key, ed25519.Ed25519PublicKey):
        public_key.verify(signature, data)
    else:
        raise ValueError(f"unsupported key type {type(public_key).__name__}")


class BrokerVerifier:
    """Checks a signed broker request against the cluster CA (``cluster.tls_ca_file``)."""

    def __init__(self, ca_file: str) -> None:
        self.ca_file = ca_file
        self._cas: tuple[int, list[Any]] | None = None
        self._certs: OrderedDict[str, tuple[str, Any]] = OrderedDict()  # cert b64 -> (peer, key)
        self._nonces: OrderedDict[str, float] = OrderedDict()

    def _ca_certs(self) -> list[Any]:
        from cryptography import x509

        stamp = os.stat(self.ca_file).st_mtime_ns
        if self._cas is None or self._cas[0] != stamp:
            with open(self.ca_file, "rb") as handle:
                self._cas = (stamp, x509.load_pem_x509_certificates(handle.read()))
            self._certs.clear()
        return self._cas[1]

    def _certificate(self, cert_b64: str) -> tuple[str, Any]:
        """(peer id the certificate names, its public key); ValueError if not a cluster broker's."""
        from cryptography import x509

        cas = self._ca_certs()
        known = self._certs.get(cert_b64)
        if known is not None:
            return known
        try:
            cert = x509.load_der_x509_certificate(base64.b64decode(cert_b64, validate=True))
        except (ValueError, binascii.Error) as exc:
            raise ValueError(f"the broker certificate cannot be read: {exc}") from None
        now = datetime.datetime.now(datetime.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise ValueError("the broker certificate is not valid now")
        for ca in cas:
            try:
                cert.verify_directly_issued_by(ca)
                break
            except Exception:
                continue
        else:
            raise ValueError("the broker certificate is not issued by the cluster CA")
        try:
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            raise ValueError("the broker certificate names no peer id") from None
        peers = [
            uri[len("skipmq://") :]
            for uri in sans.get_values_for_type(x509.UniformResourceIdentifier)
            if uri.startswith("skipmq://")
        ]
        if not peers:
            raise ValueError("the broker certificate names no skipmq:// peer id")
        entry = (peers[0], cert.public_key())
        self._certs[cert_b64] = entry
        while len(self._certs) > _VERIFIED_CACHE_SIZE:
            self._certs.popitem(last=False)
        return entry

    def verify(
        self, method: str, target: str, header: str, cert_b64: str, body: bytes, now_s: float
    ) -> Principal:
        """The principal a signed request acts for; ValueError saying why it is refused."""
        fields: dict[str, str] = {}
        for part in header.split(";"):
            name, sep, value = part.partition("=")
            if sep:
                fields[name.strip()] = value.strip()
        try:
            peer, ts_ms, nonce = fields["peer"], int(fields["ts"]), fields["nonce"]
            user = base64.urlsafe_b64decode(fields["user"].encode()).decode()
            role, signature = fields["role"], base64.b64decode(fields["sig"], validate=True)
        except (KeyError, ValueError, binascii.Error, UnicodeDecodeError):
            raise ValueError("malformed broker signature header") from None
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        if abs(now_s * 1000 - ts_ms) > SIGNATURE_WINDOW_S * 1000:
            raise ValueError("the broker signature is outside the 60 s window (clocks apart?)")
        cert_peer, public_key = self._certificate(cert_b64)
        if cert_peer != peer:
            raise ValueError(f"the certificate names {cert_peer!r}, the signature claims {peer!r}")
        principal = Principal(user, role, via=peer)
        try:
            _verify_signature(
                public_key, signature, _signed_text(method, target, ts_ms, nonce, principal, body)
            )
        except Exception:
            raise ValueError("the broker signature does not verify") from None
        if nonce in self._nonces:
            raise ValueError("the broker signature was used before (replay)")
        self._nonces[nonce] = now_s
        while self._nonces and (
            len(self._nonces) > _NONCE_CACHE_SIZE
            or next(iter(self._nonces.values())) < now_s - 2 * SIGNATURE_WINDOW_S
        ):
            self._nonces.popitem(last=False)
        return principal
