"""The error of a password or ACL file that cannot be read or parsed (``users``, ``acl``).

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
