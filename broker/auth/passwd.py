"""``skipmq passwd``: manage a SkipMQ password file (the mosquitto_passwd workflow).

    skipmq passwd FILE USER            add USER or change its password (asks twice)
    skipmq passwd -b PASSWORD FILE USER   same, password given on the command line
    skipmq passwd -c FILE USER         create (or overwrite) FILE with just USER
    skipmq passwd -D FILE USER         delete USER from FILE

Hashes are scrypt as described in ``broker.auth.password_hashes``; the file format is "user:hash" per line.
The user names are those clients send in CONNECT (MQTT 3.1.1 §3.1.3.4, MQTT 5.0 §3.1.3.5).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from broker.auth.files import AuthFileError
from broker.auth.users import PasswordFile, check_username

_DESCRIPTION = """\
Manage a SkipMQ password file (one 'username:scrypt-hash' per line; lines starting
with '#' are comments and are kept). Works like mosquitto_passwd; existing mosquitto
'$7$'/'$6$' hashes in the file are kept and still accepted by the broker."""

_EPILOG = """\
examples:
  skipmq passwd -c /etc/skipmq/passwd alice      create the file with user alice (prompts)
  skipmq passwd /etc/skipmq/passwd bob           add bob or change his password (prompts)
  skipmq passwd -b s3cret /etc/skipmq/passwd bob non-interactive (password visible to ps!)
  skipmq passwd -D /etc/skipmq/passwd bob        delete bob

Point the broker at the file with its password_file setting; it re-reads it on reload."""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skipmq passwd",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "-c", "--create", action="store_true", help="create a new password file, overwriting an existing one"
    )
    mode.add_argument("-D", "--delete", action="store_true", help="delete USER instead of setting a password")
    parser.add_argument(
        "-b",
        "--batch",
        metavar="PASSWORD",
        help="take the password from the command line instead of prompting",
    )
    parser.add_argument("file", metavar="FILE", help="the password file")
    parser.add_argument("username", metavar="USER", help="the user name")
    return parser


def _fail(message: str) -> int:
    print(f"skipmq passwd: error: {message}", file=sys.stderr)
    return 1


def _ask_password() -> str:
    first = getpass.getpass("Password: ")
    second = getpass.getpass("Reenter password: ")
    if first != second:
        raise ValueError("passwords do not match")
    return first


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the process exit status (0 ok, 1 error, 2 usage error)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    path: str = args.file
    username: str = args.username
    if args.delete and args.batch is not None:
        parser.error("-D deletes a user; it takes no password (-b)")
    try:
        check_username(username)
    except ValueError as exc:
        return _fail(str(exc))

    if args.create:
        passwords = PasswordFile()
    else:
        if not os.path.exists(path):
            return _fail(f"password file {path!r} does not exist (use -c to create it)")
        try:
            passwords = PasswordFile.load(path)
        except AuthFileError as exc:
            return _fail(str(exc))

    if args.delete:
        if not passwords.delete(username):
            return _fail(f"user {username!r} is not in {path!r}")
    else:
        if args.batch is not None:
            password = args.batch
        else:
            try:
                password = _ask_password()
            except ValueError as exc:
                return _fail(str(exc))
            except (EOFError, KeyboardInterrupt):
                return _fail("no password entered")
        if not password:
            return _fail("the password must not be empty")
        passwords.set(username, password)

    try:
        passwords.save(path)
    except OSError as exc:
        return _fail(f"cannot write {path!r}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
