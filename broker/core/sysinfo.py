"""``$SYS``: the broker's own statistics as retained messages under ``$SYS/broker/...``.

Published every ``sys.interval_s`` seconds (0 disables it), locally only: every broker of a
cluster has its own ``$SYS`` tree (the cluster never forwards ``$SYS`` topics). Topic names
follow mosquitto's so existing dashboards work; ``$SYS/broker/messages/dropped`` (the total) and
``$SYS/broker/messages/dropped/<reason>`` are SkipMQ's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker import __version__
from broker.core.session import Message

if TYPE_CHECKING:
    from broker.core.routing import Router
    from broker.core.stats import BrokerStats


def sys_values(stats: BrokerStats, *, connected: int, uptime_s: float) -> dict[str, str]:
    """The ``$SYS`` topics and their values (``stats`` freshly refreshed)."""
    dropped = dict(stats.messages_dropped)
    values = {
        "$SYS/broker/version": f"skipmq {__version__}",
        "$SYS/broker/uptime": f"{int(uptime_s)} seconds",
        "$SYS/broker/clients/connected": str(connected),
        "$SYS/broker/messages/received": str(sum(stats.messages_received)),
        "$SYS/broker/messages/sent": str(sum(stats.messages_sent)),
        "$SYS/broker/subscriptions/count": str(stats.subscriptions),
        "$SYS/broker/retained messages/count": str(stats.retained_messages),
        "$SYS/broker/load/bytes/received": str(stats.bytes_received),
        "$SYS/broker/load/bytes/sent": str(stats.bytes_sent),
        # every message dropped instead of being delivered (skipmq_messages_dropped_total)
        "$SYS/broker/messages/dropped": str(sum(dropped.values())),
    }
    for reason, count in sorted(dropped.items()):
        values[f"$SYS/broker/messages/dropped/{reason}"] = str(count)
    return values


def publish_sys(router: Router, values: dict[str, str], node_id: str) -> None:
    """Retain and route each ``$SYS`` value locally (never through the cluster)."""
    for topic, value in values.items():
        message = Message(topic, value.encode(), 0, True, {}, None, node_id, None)
        router.retain(message)
        router.route(message, None)
