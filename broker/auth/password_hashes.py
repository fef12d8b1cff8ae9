"""Salted slow password hashes: make, verify and validate them.

New hashes are "$scrypt$n=16384,r=8,p=1$<salt b64>$<hash b64>" (hashlib.scrypt, stdlib). For
migration, mosquitto_passwd's "$7$" (PBKDF2-SHA512) and "$6$" (salted SHA-512) hashes are verified
too, so an existing mosquitto password file can be used as is.

``verify_password`` costs ~50 ms of CPU by design (scrypt releases the GIL: an asyncio broker
should call ``Authenticator.authenticate`` via ``asyncio.to_thread``).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import secrets
from dataclasses import dataclass

SCRYPT_N = 16384
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
KEY_BYTES = 32
_MAX_SCRYPT_N = 1 << 20
_MAX_PBKDF2_ITERATIONS = 10_000_000


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ValueError(f"password hash: {what} is not valid base64")


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """Salted scrypt hash of ``password`` as "$scrypt$n=16384,r=8,p=1$<salt b64>$<hash b64>"."""
    if salt is None:
        salt = secrets.token_bytes(SALT_BYTES)
    if not salt:
        raise ValueError("password hash salt must not be empty")
    digest = _scrypt(password.encode("utf-8"), salt, SCRYPT_N, SCRYPT_R, SCRYPT_P, KEY_BYTES)
    return f"$scrypt$n={SCRYPT_N},r={SCRYPT_R},p={SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def _scrypt(password: bytes, salt: bytes, n: int, r: int, p: int, dklen: int) -> bytes:
    maxmem = 128 * r * (n + p + 2) + (1 << 20)
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=dklen, maxmem=maxmem)


@dataclass(frozen=True, slots=True)
class _Encoded:
    scheme: str  # "scrypt", "pbkdf2-sha512" ($7$) or "sha512" ($6$)
    salt: bytes
    digest: bytes
    n: int = 0
    r: int = 0
    p: int = 0
    iterations: int = 0

    def compute(self, password: bytes) -> bytes:
        if self.scheme == "scrypt":
            return _scrypt(password, self.salt, self.n, self.r, self.p, len(self.digest))
        if self.scheme == "pbkdf2-sha512":
            return hashlib.pbkdf2_hmac("sha512", password, self.salt, self.iterations, len(self.digest))
        return hashlib.sha512(password + self.salt).digest()


def _decode(encoded: str) -> _Encoded:
    """Parse an encoded hash; raises ValueError naming what is wrong."""
    parts = encoded.split("$")
    if len(parts) < 2 or parts[0] != "":
        raise ValueError("password hash must start with '$scrypt$', '$7$' or '$6$'")
    scheme = parts[1]
    if scheme == "scrypt":
        if len(parts) != 5:
            raise ValueError("password hash: expected '$scrypt$n=N,r=R,p=P$<salt>$<hash>'")
        params: dict[str, int] = {}
        for item in parts[2].split(","):
            name, eq, value = item.partition("=")
            if not eq or name not in ("n", "r", "p") or not value.isdigit():
                raise ValueError(f"password hash: bad scrypt parameter {item!r} (expected n=,r=,p=)")
            params[name] = int(value)
        if set(params) != {"n", "r", "p"}:
            raise ValueError("password hash: scrypt parameters n, r and p are all required")
        n, r, p = params["n"], params["r"], params["p"]
        if n < 2 or n & (n - 1) or n > _MAX_SCRYPT_N:
            raise ValueError(f"password hash: scrypt n={n} must be a power of two <= {_MAX_SCRYPT_N}")
        if not 1 <= r <= 64 or not 1 <= p <= 16:
            raise ValueError(f"password hash: scrypt r={r} p={p} out of range (1..64, 1..16)")
        salt = _unb64(parts[3], "salt")
        digest = _unb64(parts[4], "hash")
        if not salt or not digest:
            raise ValueError("password hash: empty salt or hash")
        return _Encoded("scrypt", salt, digest, n=n, r=r, p=p)
    if scheme == "7":
        if len(parts) != 5 or not parts[2].isdigit():
            raise ValueError("password hash: expected '$7$<iterations>$<salt>$<hash>' (mosquitto)")
        iterations = int(parts[2])
        if not 1 <= iterations <= _MAX_PBKDF2_ITERATIONS:
            raise ValueError(f"password hash: iterations {iterations} out of range")
        salt, digest = _unb64(parts[3], "salt"), _unb64(parts[4], "hash")
        if not salt or not digest:
            raise ValueError("password hash: empty salt or hash")
        return _Encoded("pbkdf2-sha512", salt, digest, iterations=iterations)
    if scheme == "6":
        if len(parts) != 4:
            raise ValueError("password hash: expected '$6$<salt>$<hash>' (mosquitto)")
        salt, digest = _unb64(parts[2], "salt"), _unb64(parts[3], "hash")
        if not salt or len(digest) != 64:
            raise ValueError("password hash: '$6$' needs a salt and a 64-byte SHA-512 hash")
        return _Encoded("sha512", salt, digest)
    raise ValueError(f"password hash: unknown scheme {scheme!r} (supported: scrypt, 7, 6)")


def check_encoded(encoded: str) -> None:
    """Raise ValueError if ``encoded`` is not a hash this module can verify."""
    _decode(encoded)


def verify_password(password: bytes, encoded: str) -> bool:
    """True if ``password`` hashes to ``encoded`` (constant-time comparison).

    Raises ValueError if ``encoded`` is malformed or of an unknown scheme.
    """
    parsed = _decode(encoded)
    return hmac.compare_digest(parsed.compute(password), parsed.digest)


@functools.cache
def dummy_hash() -> str:
    """A real hash to verify against for unknown users, so they cost as much as known ones."""
    return hash_password(secrets.token_urlsafe(16))
