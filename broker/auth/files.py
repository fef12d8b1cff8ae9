"""The password and ACL files as text: reading one (``read_lines``) and ``AuthFileError``, the
error of a file that cannot be read or parsed (``users``, ``acl``).

A broker refuses to start with it; the message names the file, the line and the problem.
"""

from __future__ import annotations


class AuthFileError(ValueError):
    """A password or ACL file could not be read; the message names the file, line and problem."""

    def __init__(self, path: str, line_no: int | None, problem: str) -> None:
        where = path if line_no is None else f"{path}:{line_no}"
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line_no = line_no
        self.problem = problem


def read_lines(path: str, kind: str) -> list[str]:
    """The lines of the ``kind`` file at ``path`` ("password file", "ACL file"); AuthFileError
    when it does not exist or cannot be read as UTF-8."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().splitlines()
    except FileNotFoundError:
        raise AuthFileError(path, None, f"{kind} does not exist")
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthFileError(path, None, f"cannot read {kind}: {exc}")
