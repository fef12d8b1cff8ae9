"""The authenticator and the ACL that a broker's ``auth`` configuration describes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.auth.acl import Acl
from broker.auth.users import Authenticator

if TYPE_CHECKING:
    from broker.config import AuthConfig


def build_access(auth: AuthConfig) -> tuple[Authenticator, Acl | None]:
    """The authenticator and the ACL (None when no ACL file is configured) of ``auth``."""
    authenticator = Authenticator(
        allow_anonymous=auth.allow_anonymous, password_file=auth.password_file or None
    )
    return authenticator, (Acl.load(auth.acl_file) if auth.acl_file else None)
