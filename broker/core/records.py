"""The records the broker core keeps in its store (seed 001 §4.1, DB-backed per-session queues).

Plain data exchanged through the durability port (``broker.core.ports.StorePort``); the SQLite
adapter (``broker.adapters.sqlite_store``) persists them, the core builds and reads them
(``broker.core.durability``). Every message queued for a persistent session carries a
per-session sequence number and is deleted only when that number is acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QUEUED = 0  # QueueEntry.state: waiting to be sent
PUBLISH_SENT = 1  # PUBLISH sent, waiting for PUBACK (QoS 1) / PUBREC (QoS 2)
PUBREL_SENT = 2  # QoS 2: PUBREC received, PUBREL sent, waiting for PUBCOMP


class StoreError(Exception):
    """The store was used wrongly, failed, or its file is not a SkipMQ store of a known schema."""


@dataclass(slots=True)
class StoredMessage:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[str, Any]  # MQTT 5 publish properties, serialized losslessly
    expiry_at: float | None = None  # absolute unix time, or None for no expiry
    origin: str = ""  # node id of the broker that accepted the message


@dataclass(slots=True)
class QueueEntry:
    seq: int
    message: StoredMessage
    packet_id: int | None
    state: int  # QUEUED, PUBLISH_SENT or PUBREL_SENT
    subscription_identifiers: list[int]


@dataclass(slots=True)
class StoredSubscription:
    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_identifier: int | None = None


@dataclass(slots=True)
class SessionRecord:
    client_id: str
    protocol_level: int
    expiry_interval_s: int
    username: str | None
    disconnected_at: float | None
    subscriptions: list[StoredSubscription]
    next_seq: int
    incoming_qos2: set[int]
    will: bytes | None  # opaque, encoded by the core
    will_fire_at: float | None = None  # absolute unix time of a delayed will, or None
