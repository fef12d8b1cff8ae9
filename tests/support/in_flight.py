"""How many QoS 1 copies a subscriber may get again after faults: the bound that the duplicate
tests assert (process, simulation and the recovery matrix), read from the code's defaults, so
that a change of a default changes the bound - and the figure docs/cluster.md cites with it.

After a kill -9 a QoS 1 subscriber may get again what was in flight: its broker's outgoing window
per client (``limits.max_inflight_messages``, default), one unacknowledged batch that each other
broker's stream sender sends unasked (``stream_sender.RESEND_BATCH``), and, once, the
publisher's own window, which paho sends again when it reconnects.
"""

from __future__ import annotations

from broker.cluster.stream_sender import RESEND_BATCH
from broker.config.schema import LimitsConfig

INFLIGHT_DEFAULT = LimitsConfig().max_inflight_messages
SENDER_BATCH = RESEND_BATCH


def duplicate_bound(brokers: int, faults: int, window: int) -> int:
    """QoS 1 copies a subscriber may get again after ``faults`` faults in a cluster of
    ``brokers``: per fault its broker's outgoing window and a batch from every other broker, and
    the publisher's ``window`` once (0: a publisher that sends nothing again)."""
    return faults * (INFLIGHT_DEFAULT + (brokers - 1) * SENDER_BATCH) + window
