"""Tests for broker/auth/ (hashes, password file, Authenticator, ACL) and the passwd CLI
(broker/auth/passwd.py, run as a real subprocess). Reason codes per MQTT 5.0 §3.2.2.2."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
from broker.auth import acl as acl_module  # noqa: E402
from broker.auth.acl import Acl  # noqa: E402
from broker.auth.files import AuthFileError  # noqa: E402
from broker.auth.password_hashes import hash_password, verify_password  # noqa: E402
from broker.auth.users import Authenticator, PasswordFile  # noqa: E402
from broker.mqtt.packets import ReasonCode  # noqa: E402

PYTHON = sys.executable
if not os.path.exists(PYTHON):
    PYTHON = sys.executable

# -- hashes -------------------------------------------------------------------------------------


def test_hash_format_and_verify() -> None:
    encoded = hash_password("s3cret")
    assert re.fullmatch(r"\$scrypt\$n=16384,r=8,p=1\$[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+", encoded), encoded
    assert verify_password(b"s3cret", encoded)
    assert not verify_password(b"s3cret ", encoded)
    assert not verify_password(b"", encoded)


def test_hash_is_salted_and_deterministic_for_a_given_salt() -> None:
    assert hash_password("pw") != hash_password("pw")
    salt = b"0123456789abcdef"
    assert hash_password("pw", salt=salt) == hash_password("pw", salt=salt)
    assert hash_password("pw", salt=salt) != hash_password("pX", salt=salt)


def test_unicode_password_is_utf8() -> None:
    encoded = hash_password("pässwörd✓")
    assert verify_password("pässwörd✓".encode(), encoded)
    assert not verify_password(b"passwo:rd", encoded)


@pytest.mark.parametrize(
    ("encoded", "fragment"),
    [
        ("plaintext", "must start with"),
        ("$md5$abc$def", "unknown scheme 'md5'"),
        ("$scrypt$n=16384,r=8$c2FsdA==$aGFzaA==", "n, r and p"),
        ("$scrypt$n=1000,r=8,p=1$c2FsdA==$aGFzaA==", "power of two"),
        ("$scrypt$n=16384,r=8,p=1$not base64!$aGFzaA==", "salt is not valid base64"),
        ("$scrypt$n=16384,r=8,p=1$c2FsdA==", "expected '$scrypt$"),
        ("$7$abc$c2FsdA==$aGFzaA==", "expected '$7$"),
    ],
)
def test_malformed_hashes_name_the_problem(encoded: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        verify_password(b"x", encoded)
    assert fragment in str(info.value)


@pytest.mark.parametrize("algorithm", ["sha512-pbkdf2", "sha512"])
def test_mosquitto_passwd_hashes_are_accepted(tmp_path: Path, algorithm: str) -> None:
    """A password file written by the real mosquitto_passwd works unchanged."""
    tool = shutil.which("mosquitto_passwd")
    assert tool is not None, "mosquitto_passwd must be installed (Debian package mosquitto)"
    path = tmp_path / "mosquitto.pw"
    subprocess.run(
        [tool, "-H", algorithm, "-c", "-b", str(path), "alice", "wonder land"], check=True, timeout=30
    )
    passwords = PasswordFile.load(str(path))
    assert passwords.check("alice", b"wonder land")
    assert not passwords.check("alice", b"wonderland")
    encoded = path.read_text().strip().split(":", 1)[1]
    assert encoded.startswith("$7$" if algorithm == "sha512-pbkdf2" else "$6$")


# -- password file ------------------------------------------------------------------------------


def test_password_file_round_trip_keeps_comments(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    passwords = PasswordFile()
    passwords.set("alice", "a-pass")
    passwords.set("bob", "b-pass")
    passwords.save(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("# managed by ops\n" + path.read_text() + "\n# end\n")

    loaded = PasswordFile.load(str(path))
    assert loaded.usernames() == ["alice", "bob"]
    assert loaded.check("alice", b"a-pass")
    assert loaded.check("bob", b"b-pass")
    assert not loaded.check("alice", b"b-pass")
    assert not loaded.check("carol", b"a-pass")
    assert not loaded.check("alice", None)

    assert loaded.delete("alice") is True
    assert loaded.delete("alice") is False
    loaded.set("carol", "c-pass")
    loaded.save(str(path))
    lines = path.read_text().splitlines()
    assert lines[0] == "# managed by ops"
    assert "# end" in lines
    assert [line.split(":")[0] for line in lines if line and not line.startswith("#")] == ["bob", "carol"]
    again = PasswordFile.load(str(path))
    assert again.check("carol", b"c-pass")
    assert "alice" not in again


def test_changed_password_invalidates_remembered_verification() -> None:
    passwords = PasswordFile()
    passwords.set("alice", "old")
    assert passwords.check("alice", b"old")
    assert passwords.check("alice", b"old")  # remembered
    passwords.set("alice", "new")
    assert not passwords.check("alice", b"old")
    assert passwords.check("alice", b"new")


def test_remembered_verification_is_fast() -> None:
    passwords = PasswordFile()
    passwords.set("alice", "pw")
    started = time.perf_counter()
    assert passwords.check("alice", b"pw")
    slow_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(100):
        assert passwords.check("alice", b"pw")
    fast_s = (time.perf_counter() - started) / 100
    assert not passwords.check("alice", b"wrong")
    assert fast_s < slow_s / 20, (fast_s, slow_s)


@pytest.mark.parametrize(
    ("content", "line_no", "fragment"),
    [
        ("alice\n", 1, "expected 'username:password-hash'"),
        ("# c\n\nalice:\n", 3, "expected 'username:password-hash'"),
        (":$6$x$y\n", 1, "expected 'username:password-hash'"),
        ("alice:plain\n", 1, "user 'alice': password hash must start with"),
        ("alice:$sha1$a$b\n", 1, "unknown scheme 'sha1'"),
        ("alice:{h}\nbob:{h}\nalice:{h}\n", 3, "user 'alice' appears twice (first on line 1)"),
    ],
)
def test_password_file_errors_name_file_and_line(
    tmp_path: Path, content: str, line_no: int, fragment: str
) -> None:
    path = tmp_path / "bad.pw"
    path.write_text(content.replace("{h}", hash_password("x", salt=b"fixed-salt")))
    with pytest.raises(AuthFileError) as info:
        PasswordFile.load(str(path))
    assert str(info.value).startswith(f"{path}:{line_no}: ")
    assert fragment in str(info.value)
    assert info.value.line_no == line_no


def test_missing_password_file(tmp_path: Path) -> None:
    with pytest.raises(AuthFileError) as info:
        PasswordFile.load(str(tmp_path / "nope"))
    assert "does not exist" in str(info.value)
    assert str(tmp_path / "nope") in str(info.value)


@pytest.mark.parametrize("username", ["", "a:b", "a\nb"])
def test_bad_usernames_are_refused(username: str) -> None:
    with pytest.raises(ValueError):
        PasswordFile().set(username, "pw")


# -- Authenticator --------------------------------------------------------------------------------


@pytest.fixture
def password_path(tmp_path: Path) -> str:
    passwords = PasswordFile()
    passwords.set("alice", "a-pass")
    path = str(tmp_path / "passwd")
    passwords.save(path)
    return path


def test_authenticator_with_password_file(password_path: str) -> None:
    strict = Authenticator(allow_anonymous=False, password_file=password_path)
    assert strict.authenticate("alice", b"a-pass") == ReasonCode.SUCCESS
    assert strict.authenticate("alice", b"wrong") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert strict.authenticate("alice", None) == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert strict.authenticate("mallory", b"a-pass") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert strict.authenticate(None, None) == ReasonCode.NOT_AUTHORIZED
    assert strict.authenticate(None, b"a-pass") == ReasonCode.NOT_AUTHORIZED

    lenient = Authenticator(allow_anonymous=True, password_file=password_path)
    assert lenient.authenticate(None, None) == ReasonCode.SUCCESS
    assert lenient.authenticate("alice", b"a-pass") == ReasonCode.SUCCESS
    # a known user with a wrong password is refused even though anonymous access is allowed
    assert lenient.authenticate("alice", b"wrong") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert lenient.authenticate("mallory", b"x") == ReasonCode.BAD_USER_NAME_OR_PASSWORD


def test_authenticator_without_password_file() -> None:
    assert Authenticator(allow_anonymous=True, password_file=None).authenticate(None, None) == 0
    assert Authenticator(allow_anonymous=True, password_file=None).authenticate("any", b"x") == 0
    closed = Authenticator(allow_anonymous=False, password_file=None)
    assert closed.authenticate(None, None) == ReasonCode.NOT_AUTHORIZED
    assert closed.authenticate("any", b"x") == ReasonCode.NOT_AUTHORIZED


def test_authenticator_reload(password_path: str) -> None:
    auth = Authenticator(allow_anonymous=False, password_file=password_path)
    assert auth.authenticate("bob", b"b-pass") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    passwords = PasswordFile.load(password_path)
    passwords.set("bob", "b-pass")
    passwords.save(password_path)
    auth.reload()
    assert auth.authenticate("bob", b"b-pass") == ReasonCode.SUCCESS
    # a broken file: reload fails loudly and the users loaded before stay in force
    with open(password_path, "a", encoding="utf-8") as handle:
        handle.write("garbage line\n")
    with pytest.raises(AuthFileError) as info:
        auth.reload()
    assert f"{password_path}:3:" in str(info.value)
    assert auth.authenticate("bob", b"b-pass") == ReasonCode.SUCCESS


def test_authenticator_refuses_to_start_with_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("alice:nohash\n")
    with pytest.raises(AuthFileError):
        Authenticator(allow_anonymous=True, password_file=str(path))


# -- passwd CLI as a real subprocess --------------------------------------------------------------


def run_passwd(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "broker.auth.passwd", *args],
        cwd=REPO_ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # no controlling terminal: getpass reads the piped stdin
    )


def test_cli_create_add_change_delete(tmp_path: Path) -> None:
    path = str(tmp_path / "passwd")
    result = run_passwd("-c", "-b", "alice-pw", path, "alice")
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert PasswordFile.load(path).check("alice", b"alice-pw")

    result = run_passwd("--batch", "bob-pw", path, "bob")
    assert result.returncode == 0, result.stderr
    result = run_passwd("-b", "alice-new", path, "alice")
    assert result.returncode == 0, result.stderr
    loaded = PasswordFile.load(path)
    assert loaded.usernames() == ["alice", "bob"]
    assert loaded.check("alice", b"alice-new")
    assert not loaded.check("alice", b"alice-pw")
    assert loaded.check("bob", b"bob-pw")

    result = run_passwd("-D", path, "alice")
    assert result.returncode == 0, result.stderr
    assert PasswordFile.load(path).usernames() == ["bob"]

    result = run_passwd("-D", path, "alice")
    assert result.returncode == 1
    assert "user 'alice' is not in" in result.stderr

    result = run_passwd("-c", "-b", "fresh", path, "carol")  # -c overwrites
    assert result.returncode == 0, result.stderr
    assert PasswordFile.load(path).usernames() == ["carol"]
    auth = Authenticator(allow_anonymous=False, password_file=path)
    assert auth.authenticate("carol", b"fresh") == ReasonCode.SUCCESS


def test_cli_prompts_twice(tmp_path: Path) -> None:
    path = str(tmp_path / "passwd")
    result = run_passwd("-c", path, "dave", stdin="typed pw\ntyped pw\n")
    assert result.returncode == 0, result.stderr
    assert PasswordFile.load(path).check("dave", b"typed pw")

    result = run_passwd(path, "dave", stdin="one\ntwo\n")
    assert result.returncode == 1
    assert "passwords do not match" in result.stderr
    assert PasswordFile.load(path).check("dave", b"typed pw")  # unchanged

    result = run_passwd(path, "dave", stdin="")
    assert result.returncode == 1
    assert "no password entered" in result.stderr


def test_cli_errors(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    result = run_passwd("-b", "pw", missing, "alice")
    assert result.returncode == 1
    assert "does not exist (use -c to create it)" in result.stderr
    assert not os.path.exists(missing)

    result = run_passwd("-c", "-D", missing, "alice")
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr

    result = run_passwd("-c", "-b", "pw", missing, "bad:name")
    assert result.returncode == 1
    assert "must not contain ':'" in result.stderr

    result = run_passwd("-c", "-b", "", missing, "alice")
    assert result.returncode == 1
    assert "must not be empty" in result.stderr

    broken = tmp_path / "broken"
    broken.write_text("alice:plaintext\n")
    result = run_passwd("-b", "pw", str(broken), "bob")
    assert result.returncode == 1
    assert f"{broken}:1:" in result.stderr


def test_cli_help() -> None:
    result = run_passwd("--help")
    assert result.returncode == 0
    assert "usage: skipmq passwd" in result.stdout
    for option in ("-c", "-D", "-b PASSWORD", "FILE", "USER"):
        assert option in result.stdout


# -- ACL ----------------------------------------------------------------------------------------

ACL_TEXT = """\
# anonymous clients
topic read public/#
topic deny public/secret

user alice
topic readwrite alice/#
topic write shared/in
topic read shared/+/out
topic deny alice/private/#

user bob
topic bob/#

user root
topic #
topic\tread\t$SYS/#

user spaced
topic read with space/x

pattern readwrite devices/%c/#
pattern read users/%u/inbox/#
"""


@pytest.fixture
def acl(tmp_path: Path) -> Acl:
    path = tmp_path / "acl"
    path.write_text(ACL_TEXT)
    return Acl.load(str(path))


def test_acl_anonymous_section(acl: Acl) -> None:
    assert acl.can_receive("c1", None, "public/news")
    assert acl.can_subscribe("c1", None, "public/#")
    assert acl.can_subscribe("c1", None, "public/+/x")
    assert not acl.can_publish("c1", None, "public/news")  # read only
    assert not acl.can_receive("c1", None, "public/secret")  # deny wins
    assert not acl.can_subscribe("c1", None, "public/secret")
    assert not acl.can_subscribe("c1", None, "#")
    assert not acl.can_receive("c1", None, "alice/x")
    assert not acl.can_receive("c1", None, "users/None/inbox/x")  # %u never for anonymous


def test_acl_user_sections(acl: Acl) -> None:
    assert acl.can_publish("c", "alice", "alice/x")
    assert acl.can_receive("c", "alice", "alice/x/y")
    assert not acl.can_publish("c", "alice", "alice/private/x")
    assert not acl.can_receive("c", "alice", "alice/private/x")
    assert acl.can_subscribe("c", "alice", "alice/#")  # overlaps the deny, withheld on receive
    assert not acl.can_subscribe("c", "alice", "alice/private/#")
    assert not acl.can_subscribe("c", "alice", "alice/private/+")
    assert acl.can_publish("c", "alice", "shared/in")
    assert not acl.can_receive("c", "alice", "shared/in")  # write only
    assert not acl.can_subscribe("c", "alice", "shared/in")
    assert acl.can_subscribe("c", "alice", "shared/+/out")
    assert acl.can_subscribe("c", "alice", "shared/x/out")
    assert not acl.can_subscribe("c", "alice", "shared/#")
    assert not acl.can_publish("c", "alice", "bob/x")
    assert not acl.can_publish("c", "alice", "public/news")  # the anonymous section is not alice's
    # readwrite is the default access
    assert acl.can_publish("c", "bob", "bob/x")
    assert acl.can_receive("c", "bob", "bob/x")
    # an unknown user gets only the patterns
    assert not acl.can_receive("c", "carol", "public/news")
    assert acl.can_receive("c", "carol", "users/carol/inbox/1")
    # filters may contain spaces; tabs separate like spaces
    assert acl.can_receive("c", "spaced", "with space/x")
    assert acl.can_receive("c", "root", "$SYS/broker/uptime")


def test_acl_dollar_rule(acl: Acl) -> None:
    assert acl.can_publish("c", "root", "anything/at/all")
    assert not acl.can_publish("c", "root", "$SYS/broker/uptime")  # '#' does not match '$' topics
    assert acl.can_subscribe("c", "root", "$SYS/#")  # granted by the $SYS/# read rule
    assert not acl.can_subscribe("c", "bob", "$SYS/#")


def test_acl_patterns(acl: Acl) -> None:
    assert acl.can_publish("sensor-7", None, "devices/sensor-7/temp")
    assert acl.can_subscribe("sensor-7", "alice", "devices/sensor-7/#")
    assert not acl.can_publish("sensor-7", None, "devices/sensor-8/temp")
    assert not acl.can_subscribe("sensor-7", None, "devices/+/temp")
    assert acl.can_receive("x", "alice", "users/alice/inbox/1")
    assert not acl.can_receive("x", "alice", "users/bob/inbox/1")
    # the same client id under another user name gets that user's rules
    assert acl.can_receive("x", "bob", "users/bob/inbox/1")
    assert not acl.can_receive("x", "bob", "users/alice/inbox/1")


@pytest.mark.parametrize(
    ("client_id", "username"),
    [("a+b", None), ("x#", "alice"), ("up/../x", None), ("c", "eve/x"), ("c", "eve+"), ("c", "#")],
)
def test_acl_dangerous_substitutions_deny_everything(acl: Acl, client_id: str, username: str | None) -> None:
    assert not acl.can_publish(client_id, username, f"devices/{client_id}/x")
    assert not acl.can_receive(client_id, username, "public/news")
    assert not acl.can_subscribe(client_id, username, "public/#")


def test_acl_shared_subscriptions_check_the_inner_filter(acl: Acl) -> None:
    assert acl.can_subscribe("c", "alice", "$share/workers/alice/jobs")
    assert not acl.can_subscribe("c", "alice", "$share/workers/bob/jobs")
    assert not acl.can_subscribe("c", "alice", "$share/workers")


def test_acl_without_patterns_allows_odd_client_ids(tmp_path: Path) -> None:
    path = tmp_path / "acl"
    path.write_text("topic read a/#\n")
    acl = Acl.load(str(path))
    assert acl.can_receive("weird/+#id", None, "a/b")


def test_acl_allow_all() -> None:
    acl = Acl.allow_all()
    assert acl.can_publish("c", None, "$SYS/x")
    assert acl.can_subscribe("c", "u", "#")
    assert acl.can_receive("c", "u", "a")


def test_empty_acl_denies_everything(tmp_path: Path) -> None:
    path = tmp_path / "acl"
    path.write_text("# nothing granted\n")
    acl = Acl.load(str(path))
    assert not acl.can_publish("c", None, "a")
    assert not acl.can_subscribe("c", "u", "a")
    assert not acl.can_receive("c", "u", "a")


@pytest.mark.parametrize(
    ("content", "line_no", "fragment"),
    [
        ("topic\n", 1, "expected 'topic [read|write|readwrite|deny] <topic filter>'"),
        ("# c\ntopic read\n", 2, "expected a topic filter after 'topic read'"),
        ("pattern deny \n", 1, "expected a topic filter after 'pattern deny'"),
        ("user\n", 1, "expected a user name after 'user'"),
        ("topic read a\nuser x\nbogus a/b\n", 3, "expected 'topic', 'user' or 'pattern', got 'bogus'"),
        ("topic read a/#/b\n", 1, "invalid topic filter"),
        ("topic write a+\n", 1, "'+' must occupy a whole level"),
    ],
)
def test_acl_parse_errors(tmp_path: Path, content: str, line_no: int, fragment: str) -> None:
    path = tmp_path / "acl"
    path.write_text(content)
    with pytest.raises(AuthFileError) as info:
        Acl.load(str(path))
    assert str(info.value).startswith(f"{path}:{line_no}: ")
    assert fragment in str(info.value)


def test_acl_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AuthFileError) as info:
        Acl.load(str(tmp_path / "none"))
    assert "ACL file does not exist" in str(info.value)


def test_acl_check_is_cheap(acl: Acl, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work counted, not timed: a client's rules are compiled once, a topic is matched against
    them once per kind of check, and repeated checks are answered from the decision cache."""
    matched: list[str] = []
    compiled: list[tuple[str, str | None]] = []
    original_matches = acl_module._FilterSet.matches
    original_compile = Acl._compile

    def counting_matches(self: Any, topic: str) -> bool:
        matched.append(topic)
        return original_matches(self, topic)

    def counting_compile(self: Acl, client_id: str, username: str | None) -> Any:
        compiled.append((client_id, username))
        return original_compile(self, client_id, username)

    monkeypatch.setattr(acl_module._FilterSet, "matches", counting_matches)
    monkeypatch.setattr(Acl, "_compile", counting_compile)
    topics = [f"alice/room/{index}" for index in range(100)]
    for topic in topics:
        assert acl.can_publish("c", "alice", topic)
    first_pass = len(matched)
    assert 0 < first_pass <= 2 * len(topics)  # the write set, then the deny set
    for _ in range(200):
        for topic in topics:
            assert acl.can_publish("c", "alice", topic)
    assert len(matched) == first_pass  # 20,000 checks, no match work
    assert compiled == [("c", "alice")]
    for index in range(1000):  # new topics: one pass each, still no recompiling
        assert acl.can_receive("c", "alice", f"alice/new/{index}")
    assert len(matched) - first_pass <= 2 * 1000
    assert compiled == [("c", "alice")]


def test_authenticate_from_worker_threads(password_path: str) -> None:
    """The broker runs the slow hash off the event loop (asyncio.to_thread); results stay right."""
    auth = Authenticator(allow_anonymous=False, password_file=password_path)
    attempts = [("alice", b"a-pass"), ("alice", b"wrong"), ("mallory", b"a-pass"), ("alice", None)] * 3

    async def run_all() -> list[int]:
        return list(await asyncio.gather(*(asyncio.to_thread(auth.authenticate, u, p) for u, p in attempts)))

    results = asyncio.run(asyncio.wait_for(run_all(), timeout=60))
    expected = [
        ReasonCode.SUCCESS,
        ReasonCode.BAD_USER_NAME_OR_PASSWORD,
        ReasonCode.BAD_USER_NAME_OR_PASSWORD,
        ReasonCode.BAD_USER_NAME_OR_PASSWORD,
    ] * 3
    assert results == expected
