"""Applies the dynamic users and ACL (``broker.auth.dynamic_auth``) on this broker, and writes them.

Every broker runs one (whether or not it serves the admin API): at start it reads the records in
its retained store (restored from its SQLite store, or copied from the cluster when it joins),
then the core tells it of every record another broker's update sets here
(``Broker.reserved_observer``). Users go to the authenticator at once; ACL sections are composed
with the ACL file's (``Acl.compose``) and installed with ``Broker.set_acl`` - one ACL object per
change, as SIGHUP does, so the per-client rule caches start afresh.

Writes (from the admin API) are retained publishes through the core's router: stored here (the
retained row in the store), replicated to every broker by the cluster (last writer wins;
anti-entropy after a partition), and applied here at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.auth.acl import Acl, AclRule
from broker.auth.dynamic_auth import (
    AUTH_PREFIX,
    AclRecord,
    RecordError,
    SectionKey,
    UserRecord,
    acl_payload,
    acl_topic,
    parse_record,
    user_payload,
    user_topic,
)
from broker.auth.users import Authenticator
from broker.core.session import Message

if TYPE_CHECKING:
    from broker.core.broker import Broker
    from broker.core.ports import AclPort

log = logging.getLogger("skipmq.admin")

AclWrapper = Callable[["AclPort | None"], "AclPort | None"]


class DynamicAuth:
    """The dynamic users and ACL of one broker (see the module docstring)."""

    def __init__(self, broker: Broker, base_acl: Acl | None) -> None:
        self.broker = broker
        self.base_acl = base_acl  # the ACL file's (None without one); SIGHUP replaces it
        self.users: dict[str, UserRecord] = {}
        self.sections: dict[SectionKey, AclRecord] = {}
        self.acl_wrappers: list[AclWrapper] = []  # active traces watch the ACL checks
        self.applied = 0  # records applied (tests and /metrics-style counters)
        self.rejected = 0

    def start(self) -> None:
        broker = self.broker
        for _topic, message in broker.retained.match(AUTH_PREFIX + "#"):
            self._apply(message.topic, message.payload, install=False)
        broker.reserved_observer = self.observe
        self.install_acl()

    # ------------------------------------------------------------------ applying
    def observe(self, message: Message) -> None:
        """A retained ``$skipmq/`` message was set here by the cluster (or by ``write``)."""
        if message.topic.startswith(AUTH_PREFIX):
            self._apply(message.topic, message.payload, install=True)

    def _apply(self, topic: str, payload: bytes, *, install: bool) -> None:
        try:
            record = parse_record(topic, payload)
        except RecordError as exc:
            self.rejected += 1
            self.broker.log_event(
                logging.WARNING, "dynamic_auth_record_rejected", topic=topic, reason=str(exc)
            )
            return
        authenticator = self.broker.authenticator
        acl_changed = False
        if isinstance(record, UserRecord):
            self.users[record.name] = record
            if isinstance(authenticator, Authenticator):
                authenticator.set_dynamic_user(record.name, record.encoded)
        elif isinstance(record, AclRecord):
            self.sections[record.section] = record
            acl_changed = True
        elif isinstance(record, str):  # a user record deleted
            self.users.pop(record, None)
            if isinstance(authenticator, Authenticator):
                authenticator.forget_dynamic_user(record)
        elif isinstance(record, tuple):  # an ACL record deleted
            acl_changed = self.sections.pop(record, None) is not None
        else:
            return
        self.applied += 1
        if acl_changed and install:
            self.install_acl()

    def effective_acl(self) -> Acl | None:
        return Acl.compose(self.base_acl, {key: list(record.rules) for key, record in self.sections.items()})

    def install_acl(self) -> None:
        acl: AclPort | None = self.effective_acl()
        for wrap in self.acl_wrappers:
            acl = wrap(acl)
        self.broker.set_acl(acl)

    def set_base_acl(self, acl: Acl | None) -> None:
        """The ACL file was re-read (SIGHUP): compose it with the dynamic sections again."""
        self.base_acl = acl
        self.install_acl()

    # ------------------------------------------------------------------ writing
    def _publish(self, topic: str, payload: bytes) -> None:
        broker = self.broker
        message = Message(topic, payload, 1, True, {}, None, broker.node_id, None)
        broker.router.publish(message, None)  # retained here and replicated by the cluster
        broker.after_batch()
        self._apply(topic, payload, install=True)

    def write_user(self, name: str, encoded: str | None, by: str) -> None:
        """Set ``name``'s password hash, or (None) remove the user everywhere."""
        self._publish(user_topic(name), user_payload(encoded, int(time.time() * 1000), by))

    def write_section(self, section: SectionKey, rules: list[AclRule], by: str) -> None:
        self._publish(acl_topic(section), acl_payload(rules, int(time.time() * 1000), by))

    def drop_section(self, section: SectionKey) -> bool:
        """Remove the dynamic rules of ``section`` (the ACL file's apply again)."""
        if section not in self.sections:
            return False
        self._publish(acl_topic(section), b"")
        return True
