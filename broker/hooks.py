"""The cluster interface of the broker core (issue "SkipMQ broker core", part 4, items a-c).

A cluster runtime (a later issue) plugs into the :class:`broker.core.Broker` through
:class:`ClusterHooks`. Every hook is called synchronously on the broker's event-loop thread, so
an implementation must not block: it should enqueue work for its own tasks. The broker offers
the reverse direction through ``Broker.deliver_remote``, ``Broker.export_session``,
``Broker.import_session`` and ``Broker.kick``.

The internal message type :class:`Message` and the session hand-over type
:class:`SessionSnapshot` live in :mod:`broker.mqtt.session`; they are re-exported here.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from broker.mqtt.session import Message, SessionSnapshot

__all__ = ["ClusterHooks", "Message", "NullHooks", "SessionSnapshot"]


class ClusterHooks(Protocol):
    """Events the broker reports to a cluster runtime (all called on the event-loop thread)."""

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        """A local client subscribed (or replaced a subscription); topic_filter excludes $share/group."""

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        """A local subscription ended (UNSUBSCRIBE, or the session ended)."""

    def on_publish(self, message: Message, from_client_id: str | None) -> asyncio.Future[bool] | None:
        """A message was accepted locally; called after local routing, before the publisher's ack.

        A returned future holds the publisher's PUBACK/PUBREC (QoS 1/2) until it is done (the
        cluster resolves it once the subscribers' brokers stored the message)."""

    def before_attach(
        self, client_id: str, clean_start: bool
    ) -> asyncio.Future[SessionSnapshot | None] | None:
        """A CONNECT for ``client_id`` is about to attach its session. A returned future holds the
        CONNACK until it is done; a snapshot it yields is imported first (session moved here)."""

    def owns_share_group(self, group: str, topic_filter: str) -> bool:
        """Whether this broker delivers the copy of share group (group, filter) (one per cluster)."""

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        """A client finished CONNECT successfully."""

    def on_client_disconnected(self, client_id: str) -> None:
        """A client's network connection ended (its session may live on)."""


class NullHooks:
    """The default hooks of a stand-alone broker: every event is ignored."""

    __slots__ = ()

    def on_subscribe(self, client_id: str, topic_filter: str, share_group: str | None, qos: int) -> None:
        return None

    def on_unsubscribe(self, client_id: str, topic_filter: str, share_group: str | None) -> None:
        return None

    def on_publish(self, message: Message, from_client_id: str | None) -> asyncio.Future[bool] | None:
        return None

    def before_attach(
        self, client_id: str, clean_start: bool
    ) -> asyncio.Future[SessionSnapshot | None] | None:
        return None

    def owns_share_group(self, group: str, topic_filter: str) -> bool:
        return True

    def on_client_connected(self, client_id: str, session_present: bool) -> None:
        return None

    def on_client_disconnected(self, client_id: str) -> None:
        return None
