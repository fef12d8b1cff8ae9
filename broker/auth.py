"""Authentication (password file, salted slow hashes) and authorization (mosquitto-style ACL file).

Implements the CONNECT checks of MQTT 3.1.1 §3.1.3.4-5 / MQTT 5.0 §3.1.3.5-6 (user name,
password) with the CONNACK reason codes of MQTT 5.0 §3.2.2.2 (0x86 BAD_USER_NAME_OR_PASSWORD,
0x87 NOT_AUTHORIZED), and topic authorization as mosquitto's ``acl_file`` (MQTT 5.0 §5.4.2).

Password hashes are "$scrypt$n=16384,r=8,p=1$<salt b64>$<hash b64>" (hashlib.scrypt, stdlib).
For migration, mosquitto_passwd's "$7$" (PBKDF2-SHA512) and "$6$" (salted SHA-512) hashes are
verified too, so an existing mosquitto password file can be used as is.

Size: three parts that share the hashing and the rule types - password hashes, the users (the
file's and the admin API's dynamic ones) and the ACL with its sections (file format, composition
with the dynamic sections, export) - over the 600-line guideline since the dynamic users and ACL.

``verify_password`` costs ~50 ms of CPU by design (scrypt releases the GIL: an asyncio broker
should call ``Authenticator.authenticate`` via ``asyncio.to_thread``). A successful verification
is remembered (keyed HMAC of the password with a per-process random key, bounded), so a client
reconnecting with the same credentials does not pay the slow hash again.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import secrets
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.mqtt.packets import ReasonCode
from broker.mqtt.topics import (
    SubscriptionTrie,
    TopicError,
    filter_covers,
    parse_shared,
    validate_topic_filter,
)

if TYPE_CHECKING:
    from broker.config import AuthConfig

SCRYPT_N = 16384
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
KEY_BYTES = 32
_MAX_SCRYPT_N = 1 << 20
_MAX_PBKDF2_ITERATIONS = 10_000_000
_VERIFIED_CACHE_SIZE = 10_000


class AuthFileError(ValueError):
    """A password or ACL file could not be read; the message names the file, line and problem."""

    def __init__(self, path: str, line_no: int | None, problem: str) -> None:
        where = path if line_no is None else f"{path}:{line_no}"
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line_no = line_no
        self.problem = problem


# ---------------------------------------------------------------------------------------------
# password hashes


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
def _dummy_hash() -> str:
    """A real hash to verify against for unknown users, so they cost as much as known ones."""
    return hash_password(secrets.token_urlsafe(16))


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
        try:
            with open(path, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except FileNotFoundError:
            raise AuthFileError(path, None, "password file does not exist")
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthFileError(path, None, f"cannot read password file: {exc}")
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
            verify_password(password or b"", _dummy_hash())  # same cost: do not reveal unknown users
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
    (``set_dynamic_user``; ``broker.dynamic_auth``): a dynamic user replaces the file's entry of
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
            verify_password(password or b"", _dummy_hash())  # same cost: do not reveal unknown users
            return ReasonCode.BAD_USER_NAME_OR_PASSWORD
        if table.check(username, password):
            return ReasonCode.SUCCESS
        return ReasonCode.BAD_USER_NAME_OR_PASSWORD

    def reload(self) -> None:
        """Re-read the password file. On error the old users stay in force and AuthFileError is raised."""
        if self.password_file:
            self._passwords = PasswordFile.load(self.password_file)


# ---------------------------------------------------------------------------------------------
# ACL

_READ = 1
_WRITE = 2
_DENY = 4
_ACCESS = {"read": _READ, "write": _WRITE, "readwrite": _READ | _WRITE, "deny": _DENY}
ACCESS_NAMES = {value: name for name, value in _ACCESS.items()}  # access bits -> the file's word
_UNSAFE_SUBSTITUTION = ("+", "#", "/")
_CLIENT_CACHE_SIZE = 10_000
_DECISION_CACHE_SIZE = 1024


@dataclass(frozen=True, slots=True)
class _Rule:
    access: int
    topic_filter: str


class _FilterSet:
    """A set of topic filters answering "does any filter match this topic / cover this filter"."""

    __slots__ = ("_filters", "_trie")

    def __init__(self, filters: list[str]) -> None:
        self._filters = list(dict.fromkeys(filters))
        self._trie: SubscriptionTrie[int, None] = SubscriptionTrie(cache_size=256)
        for topic_filter in self._filters:
            self._trie.add(topic_filter, 0, None)

    def matches(self, topic: str) -> bool:
        return bool(self._filters) and self._trie.has_match(topic)

    def covers(self, topic_filter: str) -> bool:
        return any(filter_covers(rule, topic_filter) for rule in self._filters)


class _ClientRules:
    """The rules of one (client id, user name), compiled, with small per-topic decision caches."""

    __slots__ = ("_deny", "_publish_cache", "_read", "_receive_cache", "_write", "deny_all")

    def __init__(self, rules: list[_Rule], *, deny_all: bool = False) -> None:
        self.deny_all = deny_all
        self._read = _FilterSet([r.topic_filter for r in rules if r.access & _READ])
        self._write = _FilterSet([r.topic_filter for r in rules if r.access & _WRITE])
        self._deny = _FilterSet([r.topic_filter for r in rules if r.access & _DENY])
        self._publish_cache: dict[str, bool] = {}
        self._receive_cache: dict[str, bool] = {}

    def can_publish(self, topic: str) -> bool:
        decision = self._publish_cache.get(topic)
        if decision is None:
            decision = not self.deny_all and self._write.matches(topic) and not self._deny.matches(topic)
            if len(self._publish_cache) >= _DECISION_CACHE_SIZE:
                self._publish_cache.clear()
            self._publish_cache[topic] = decision
        return decision

    def can_receive(self, topic: str) -> bool:
        decision = self._receive_cache.get(topic)
        if decision is None:
            decision = not self.deny_all and self._read.matches(topic) and not self._deny.matches(topic)
            if len(self._receive_cache) >= _DECISION_CACHE_SIZE:
                self._receive_cache.clear()
            self._receive_cache[topic] = decision
        return decision

    def can_subscribe(self, topic_filter: str) -> bool:
        return not self.deny_all and self._read.covers(topic_filter) and not self._deny.covers(topic_filter)


class Acl:
    """Topic authorization in the shape of mosquitto's ``acl_file``.

    ``topic [read|write|readwrite|deny] <filter>`` lines before any ``user`` line apply to
    anonymous clients; ``user <name>`` starts that user's section; ``pattern [access] <filter>``
    lines (anywhere) apply to every client with %c -> client id and %u -> user name (a pattern
    using %u never applies to an anonymous client). The access defaults to readwrite. Anything
    not granted is denied; ``deny`` wins over grants. As in mosquitto, '#' and '+' filters do not
    match '$' topics unless the rule starts with '$'.

    Like mosquitto (CVE-2017-7650), a client whose id or user name contains '+', '#' (or, stricter,
    '/') is denied everything when a pattern would substitute that value: it could otherwise widen
    a pattern into another client's topics.

    Subscribing to a filter needs a read rule whose filter covers it ("a/#" covers "a/b/+",
    "a/+" does not cover "a/#") and no deny rule covering it; a subscription partly overlapping
    a deny rule is allowed and ``can_receive`` then withholds the denied topics.
    """

    def __init__(
        self,
        *,
        anonymous_rules: list[_Rule] | None = None,
        user_rules: dict[str, list[_Rule]] | None = None,
        pattern_rules: list[_Rule] | None = None,
        allow_everything: bool = False,
    ) -> None:
        self._allow_everything = allow_everything
        self._anonymous_rules = anonymous_rules or []
        self._user_rules = user_rules or {}
        self._pattern_rules = pattern_rules or []
        self._clients: dict[tuple[str, str | None], _ClientRules] = {}

    @classmethod
    def allow_all(cls) -> Acl:
        return cls(allow_everything=True)

    @classmethod
    def load(cls, path: str) -> Acl:
        try:
            with open(path, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except FileNotFoundError:
            raise AuthFileError(path, None, "ACL file does not exist")
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthFileError(path, None, f"cannot read ACL file: {exc}")
        return cls.parse(lines, path=path)

    @classmethod
    def parse(cls, lines: list[str], *, path: str = "<acl>") -> Acl:
        anonymous: list[_Rule] = []
        users: dict[str, list[_Rule]] = {}
        patterns: list[_Rule] = []
        current = anonymous
        for line_no, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            keyword, _, rest = line.partition(" ")
            if "\t" in keyword:
                keyword, _, more = keyword.partition("\t")
                rest = more + " " + rest
            rest = rest.strip()
            if keyword == "user":
                if not rest:
                    raise AuthFileError(path, line_no, "expected a user name after 'user'")
                current = users.setdefault(rest, [])
            elif keyword in ("topic", "pattern"):
                rule = _parse_rule(keyword, rest, path, line_no)
                (patterns if keyword == "pattern" else current).append(rule)
            else:
                raise AuthFileError(path, line_no, f"expected 'topic', 'user' or 'pattern', got {keyword!r}")
        return cls(anonymous_rules=anonymous, user_rules=users, pattern_rules=patterns)

    def _rules_for(self, client_id: str, username: str | None) -> _ClientRules:
        key = (client_id, username)
        compiled = self._clients.get(key)
        if compiled is None:
            compiled = self._compile(client_id, username)
            if len(self._clients) >= _CLIENT_CACHE_SIZE:
                del self._clients[next(iter(self._clients))]
            self._clients[key] = compiled
        return compiled

    def _compile(self, client_id: str, username: str | None) -> _ClientRules:
        rules = list(self._anonymous_rules if username is None else self._user_rules.get(username, ()))
        for pattern in self._pattern_rules:
            text = pattern.topic_filter
            if "%u" in text:
                if username is None:
                    continue
                if any(ch in username for ch in _UNSAFE_SUBSTITUTION):
                    return _ClientRules([], deny_all=True)
                text = text.replace("%u", username)
            if "%c" in text:
                if any(ch in client_id for ch in _UNSAFE_SUBSTITUTION):
                    return _ClientRules([], deny_all=True)
                text = text.replace("%c", client_id)
            try:
                validate_topic_filter(text)
            except TopicError:
                return _ClientRules([], deny_all=True)  # e.g. NUL in an id: refuse rather than guess
            rules.append(_Rule(pattern.access, text))
        return _ClientRules(rules)

    # ------------------------------------------------------------ sections (admin API)
    def sections(self) -> dict[tuple[str, str], list[_Rule]]:
        """The rules by section: ("anonymous", ""), ("user", name), ("patterns", "")."""
        result: dict[tuple[str, str], list[_Rule]] = {}
        if self._anonymous_rules:
            result[("anonymous", "")] = list(self._anonymous_rules)
        for name, rules in self._user_rules.items():
            result[("user", name)] = list(rules)
        if self._pattern_rules:
            result[("patterns", "")] = list(self._pattern_rules)
        return result

    @classmethod
    def from_sections(cls, sections: dict[tuple[str, str], list[_Rule]]) -> Acl:
        return cls(
            anonymous_rules=list(sections.get(("anonymous", ""), ())),
            user_rules={name: list(rules) for (kind, name), rules in sections.items() if kind == "user"},
            pattern_rules=list(sections.get(("patterns", ""), ())),
        )

    @classmethod
    def compose(cls, base: Acl | None, overrides: dict[tuple[str, str], list[_Rule]]) -> Acl | None:
        """``base`` (the ACL file's, None without one) with ``overrides`` (the admin API's
        sections) replacing its sections of the same key. None when neither has any rule: without
        an ACL file and dynamic rules every client may do everything, as before."""
        if base is None and not overrides:
            return None
        sections = base.sections() if base is not None else {}
        sections.update(overrides)
        return cls.from_sections(sections)

    def to_text(self) -> str:
        """The rules in the ACL file's format (export); ``Acl.parse`` reads it back."""
        lines: list[str] = []
        for rule in self._anonymous_rules:
            lines.append(f"topic {ACCESS_NAMES[rule.access]} {rule.topic_filter}")
        for rule in self._pattern_rules:
            lines.append(f"pattern {ACCESS_NAMES[rule.access]} {rule.topic_filter}")
        for name, rules in self._user_rules.items():
            lines.append("")
            lines.append(f"user {name}")
            lines.extend(f"topic {ACCESS_NAMES[rule.access]} {rule.topic_filter}" for rule in rules)
        return "\n".join(lines).lstrip("\n") + "\n"

    def forget(self, client_id: str, username: str | None) -> None:
        """Drop the compiled rules of a client (e.g. when its session ends)."""
        self._clients.pop((client_id, username), None)

    def can_publish(self, client_id: str, username: str | None, topic: str) -> bool:
        if self._allow_everything:
            return True
        return self._rules_for(client_id, username).can_publish(topic)

    def can_subscribe(self, client_id: str, username: str | None, topic_filter: str) -> bool:
        """May the client subscribe to ``topic_filter`` ("$share/group/filter" checks the filter)?"""
        if self._allow_everything:
            return True
        try:
            _group, inner = parse_shared(topic_filter)
        except TopicError:
            return False
        return self._rules_for(client_id, username).can_subscribe(inner)

    def can_receive(self, client_id: str, username: str | None, topic: str) -> bool:
        if self._allow_everything:
            return True
        return self._rules_for(client_id, username).can_receive(topic)


def _parse_rule(keyword: str, rest: str, path: str, line_no: int) -> _Rule:
    expected = f"expected '{keyword} [read|write|readwrite|deny] <topic filter>'"
    if not rest:
        raise AuthFileError(path, line_no, expected)
    first, _, remainder = rest.partition(" ")
    if "\t" in first:
        first, _, more = first.partition("\t")
        remainder = more + " " + remainder
    if first in _ACCESS:
        access = _ACCESS[first]
        topic_filter = remainder.strip()
        if not topic_filter:
            raise AuthFileError(path, line_no, f"expected a topic filter after '{keyword} {first}'")
    else:
        access = _READ | _WRITE
        topic_filter = rest
    try:
        validate_topic_filter(topic_filter)
    except TopicError as exc:
        raise AuthFileError(path, line_no, f"invalid topic filter: {exc}")
    return _Rule(access, topic_filter)


AclRule = _Rule


def parse_acl_rule(keyword: str, rest: str) -> _Rule:
    """One rule as an ACL file line after its keyword (``topic`` or ``pattern``) states it, e.g.
    ``parse_acl_rule("topic", "read a/#")``; ValueError naming what is wrong."""
    try:
        return _parse_rule(keyword, rest, "rule", 0)
    except AuthFileError as exc:
        raise ValueError(exc.problem) from None


def build_access(auth: AuthConfig) -> tuple[Authenticator, Acl | None]:
    """The authenticator and the ACL (None when no ACL file is configured) of ``auth``."""
    authenticator = Authenticator(
        allow_anonymous=auth.allow_anonymous, password_file=auth.password_file or None
    )
    return authenticator, (Acl.load(auth.acl_file) if auth.acl_file else None)
