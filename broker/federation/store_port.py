"""Custody's durable state as the router sees it: a port, and an in-memory implementation
(SkipMQ's addition to seed 000 §3.7.3; custody.py, docs/federation.md "Delivery semantics").

``CustodyStore`` is implemented for brokers by ``broker.adapters.federation.custody_store``
(a table in the broker's SQLite store, written in its group-commit transaction, so an event is
durable in custody by the time its publisher's PUBACK leaves). It holds what a restarted router
needs to re-route the events it kept: each event in custody and the link it came from.
:class:`MemoryCustodyStore` keeps it in a dict (routers without persistence, and tests that
"restart" a router by building a new one on the same store).
"""

from __future__ import annotations

from typing import Protocol

from broker.federation.messages import Event

__all__ = ["CustodyStore", "MemoryCustodyStore"]


class CustodyStore(Protocol):
    """The events of one router's custody that must survive its crash."""

    def put(self, event: Event, came_from: str | None) -> None:
        """``event`` entered custody (joins the open transaction: the PUBACK waits for it)."""
        ...

    def forget(self, event_id: str) -> None:
        """``event_id`` left custody (complete or given up); may be written lazily."""
        ...

    def load(self) -> list[tuple[Event, str | None]]:
        """What custody held at the last commit, oldest first."""
        ...


class MemoryCustodyStore:
    """A ``CustodyStore`` in a dict: it survives a router, not the process."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[Event, str | None]] = {}

    def put(self, event: Event, came_from: str | None) -> None:
        self.rows[event.event_id] = (event, came_from)

    def forget(self, event_id: str) -> None:
        self.rows.pop(event_id, None)

    def load(self) -> list[tuple[Event, str | None]]:
        return list(self.rows.values())
