"""The users: the password file and the CONNECT decision (``Authenticator``).

Implements the CONNECT checks of MQTT 3.1.1 §3.1.3.4-5 / MQTT 5.0 §3.1.3.5-6 (user name,
password) with the CONNACK reason codes of MQTT 5.0 §3.2.2.2 (0x86 BAD_USER_NAME_OR_PASSWORD,
0x87 NOT_AUTHORIZED). The users are the password file's and the admin API's dynamic ones.

Passwords are checked against salted slow hashes (``broker.auth.password_hashes``). A successful
verification is remembered (keyed HMAC of the password with a per-process random key, bounded),
so a client reconnecting with the same credentials does not pay the slow hash again.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile
import threading

from broker.auth.files import AuthFileError, read_lines
from broker.auth.password_hashes import check_encoded, dummy_hash, hash_password, verify_password
from broker.mqtt.packets import ReasonCode

_VERIFIED_CACHE_SIZE = 10_000


def check_username(username: str) -> None:
    if not username:
        raise ValueError("user name must not be empty")
    if ":" in username:
        raise ValueError(f"user name {username!r} must not contain ':'")
    if any(ch in username for ch in "\r\n\x00"):
        raise ValueError(f"user name {username!r} must not contain line breaks or NUL")


class PasswordFile:
    """Users and password hashes, one "username:encoded" per line ('#' starts a comment line).

    Comments and the order of users are preserved by ``save``.
    """

    def __init__(self) -> None:
        self._hashes: dict[str, str] = {}
        self._layout: list[tuple[bool, str]] = []  # (is_user, user name or comment text)
        self._verified: dict[str, tuple[str, bytes]] = {}  # user -> (encoded, keyed HMAC of password)
        self._cache_key = secrets.token_bytes(32)
        self._verified_lock = threading.Lock()  # check() may run in worker threads

    @classmethod
    def load(cls, path: str) -> PasswordFile:
        lines = read_lines(path, "password file")
        result = cls()
        first_seen: dict[str, int] = {}
        for line_no, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                result._layout.append((False, raw))
                continue
            username, colon, encoded = line.partition(":")
            if not colon or not username or not encoded:
                raise AuthFileError(path, line_no, "expected 'username:password-hash'")
            try:
                check_encoded(encoded)
            except ValueError as exc:
                raise AuthFileError(path, line_no, f"user {username!r}: {exc}")
            if username in first_seen:
                raise AuthFileError(
                    path, line_no, f"user {username!r} appears twice (first on line {first_seen[username]})"
                )
            first_seen[username] = line_no
            result._hashes[username] = encoded
            result._layout.append((True, username))
        return result

    def __contains__(self, username: object) -> bool:
        return username in self._hashes

    def __len__(self) -> int:
        return len(self._hashes)

    def usernames(self) -> list[str]:
        return list(self._hashes)

    def _fingerprint(self, password: bytes) -> bytes:
        return hmac.new(self._cache_key, password, hashlib.sha256).digest()

    def check(self, username: str, password: bytes | None) -> bool:
        """True if ``username`` is known and ``password`` is its password."""
        encoded = self._hashes.get(username)
        if encoded is None or password is None:
            verify_password(password or b"", dummy_hash())  # same cost: do not reveal unknown users
            return False
        fingerprint = self._fingerprint(password)
        with self._verified_lock:
            remembered = self._verified.get(username)
        if (
            remembered is not None
            and remembered[0] == encoded
            and hmac.compare_digest(remembered[1], fingerprint)
        ):
            return True
        if not verify_password(password, encoded):
            return False
        with self._verified_lock:
            if len(self._verified) >= _VERIFIED_CACHE_SIZE:
                del self._verified[next(iter(self._verified))]
            self._verified[username] = (encoded, fingerprint)
        return True

    def set(self, username: str, password: str) -> None:
        """Add ``username`` or change its password."""
        check_username(username)
        if username not in self._hashes:
            self._layout.append((True, username))
        self._hashes[username] = hash_password(password)
        with self._verified_lock:
            self._verified.pop(username, None)

    def set_encoded(self, username: str, encoded: str) -> None:
        """Add ``username`` or change its password, given as a hash (``check_encoded``)."""
        check_encoded(encoded)
        if username not in self._hashes:
            self._layout.append((True, username))
        self._hashes[username] = encoded
        with self._verified_lock:
            self._verified.pop(username, None)

    def encoded(self, username: str) -> str | None:
        return self._hashes.get(username)

    def delete(self, username: str) -> bool:
        """Remove ``username``; returns whether it existed."""
        if self._hashes.pop(username, None) is None:
            return False
        self._layout = [item for item in self._layout if item != (True, username)]
        with self._verified_lock:
            self._verified.pop(username, None)
        return True

    def save(self, path: str) -> None:
        """Write atomically (temporary file + rename), readable by the owner only."""
        lines = []
        for is_user, text in self._layout:
            if is_user:
                lines.append(f"{text}:{self._hashes[text]}")
            else:
                lines.append(text)
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp_path = tempfile.mkstemp(prefix=".passwd-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write("".join(line + "\n" for line in lines))
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp_path, 0o600)
            os.replace(tmp_path, path)
        except BaseException:
            try:
                os.unlink(tmp_path)
            except OSError:
                pass
            raise


class Authenticator:
    """Decides CONNECT: anonymous access, or user name + password checked against the users.

    The users are the password file's, overridden by the dynamic users of the admin API
    (``set_dynamic_user``; ``broker.auth.dynamic_auth``): a dynamic user replaces the file's entry of
    that name, a removed one hides it.

    - no user name: SUCCESS if ``allow_anonymous`` else NOT_AUTHORIZED;
    - user name while there are users (a password file, or any dynamic user): SUCCESS only for a
      known user with the right password, otherwise BAD_USER_NAME_OR_PASSWORD (even when
      anonymous access is allowed);
    - user name without any users: SUCCESS if ``allow_anonymous`` (nothing to check it against),
      else NOT_AUTHORIZED.
    """

    def __init__(self, *, allow_anonymous: bool, password_file: str | None) -> None:
        self.allow_anonymous = allow_anonymous
        self.password_file = password_file
        self._passwords: PasswordFile | None = PasswordFile.load(password_file) if password_file else None
        self._dynamic = PasswordFile()  # users of the admin API (their hashes), checked first
        self._removed: set[str] = set()  # removed through the admin API: file users hidden

    def set_dynamic_user(self, username: str, encoded: str | None) -> None:
        """The admin API's record of ``username``: its password hash, or None (removed: a
        password-file user of that name is refused too)."""
        if encoded is None:
            self._dynamic.delete(username)
            self._removed.add(username)
        else:
            self._dynamic.set_encoded(username, encoded)
            self._removed.discard(username)

    def forget_dynamic_user(self, username: str) -> None:
        """The admin API's record of ``username`` is gone: the password file decides again."""
        self._dynamic.delete(username)
        self._removed.discard(username)

    def _has_users(self) -> bool:
        return self._passwords is not None or len(self._dynamic) > 0 or bool(self._removed)

    def users(self) -> dict[str, str]:
        """Every user that can log in, with where it comes from (``file`` or ``dynamic``)."""
        result = {name: "file" for name in (self._passwords.usernames() if self._passwords else [])}
        for name in self._removed:
            result.pop(name, None)
        result.update({name: "dynamic" for name in self._dynamic.usernames()})
        return result

    def encoded_of(self, username: str) -> str | None:
        """The hash ``username`` logs in with (export), None when it cannot log in."""
        if username in self._dynamic:
            return self._dynamic.encoded(username)
        if username in self._removed or self._passwords is None:
            return None
        return self._passwords.encoded(username)

    def needs_password_check(self, username: str | None) -> bool:
        """True when ``authenticate`` will run the slow (scrypt) hash: callers on an event loop
        should then run it in a worker thread (hashlib.scrypt releases the GIL)."""
        return username is not None and self._has_users()

    def authenticate(self, username: str | None, password: bytes | None) -> int:
        if username is None:
            return ReasonCode.SUCCESS if self.allow_anonymous else ReasonCode.NOT_AUTHORIZED
        if not self._has_users():
            return ReasonCode.SUCCESS if self.allow_anonymous else ReasonCode.NOT_AUTHORIZED
        if username in self._dynamic:
            table: PasswordFile | None = self._dynamic
        elif username in self._removed:
            table = None
        else:
            table = self._passwords
        if table is None:
            verify_password(password or b"", dummy_hash())  # same cost: do not reveal unknown users
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        if table.check(username, password):
            return ReasonCode.SUCCESS
        return ReasonCode.BAD_USER_NAME_OR_PASSWORD

    def reload(self) -> None:
        """Re-read the password file. On error the old users stay in force and AuthFileError is raised."""
        if self.password_file:
            self._passwords = PasswordFile.load(self.password_file)
