"""The topics reserved for the brokers themselves: ``$skipmq/...`` (MQTT 5.0 §4.7.2: "Server
implementations MAY use Topic Names that start with a leading $ character for other purposes").

The cluster carries its own state there as retained messages - the dynamic users and ACL of the
admin API (``$skipmq/auth/...``) and each broker's admin endpoint (``$skipmq/admin/...``) - so the
cluster's retained replication (last writer wins, anti-entropy; docs/cluster.md) spreads them to
every broker. No MQTT client may write or read them: a PUBLISH or a will to such a topic is
refused like an ACL denial, and a SUBSCRIBE whose filter can match one gets 0x87 Not authorized,
whatever the ACL says (docs/operations.md "Reserved topics"). Wildcards at the first level never
match a ``$`` topic (MQTT-4.7.2-1), so only filters whose first level is ``$skipmq`` can.

``$SYS/...`` is each broker's own statistics tree (broker.core.sysinfo): clients may read it but
not write it (as mosquitto: a client PUBLISH or will there is dropped; MQTT 5: PUBACK/PUBREC 0x87
Not authorized), so no client can forge a broker's figures for the dashboards that read them.
The one exception is ``$SYS/skipmq/analytics/...``, where the data pipeline publishes its retained
findings over MQTT (pipeline.sinks): it is governed by the ACL like any topic (an ACL rule must
name it, since ``#`` never matches ``$`` topics; docs/security.md "The $SYS tree").
"""

from __future__ import annotations

RESERVED_ROOT = "$skipmq"
RESERVED_PREFIX = RESERVED_ROOT + "/"


def is_reserved_topic(topic: str) -> bool:
    """Whether ``topic`` (a topic name) is one of the brokers' own."""
    return topic.startswith(RESERVED_ROOT) and (topic == RESERVED_ROOT or topic.startswith(RESERVED_PREFIX))


def is_reserved_filter(match_filter: str) -> bool:
    """Whether ``match_filter`` (a topic filter without any ``$share/group/`` prefix) can match a
    reserved topic: its first level is ``$skipmq``."""
    return is_reserved_topic(match_filter)


SYS_ROOT = "$SYS"
SYS_PREFIX = SYS_ROOT + "/"
ANALYTICS_PREFIX = "$SYS/skipmq/analytics/"  # the pipeline's findings (pipeline.sinks)


def is_broker_only_topic(topic: str) -> bool:
    """Whether no client PUBLISH or will may write ``topic``, whatever the ACL says: the reserved
    ``$skipmq/...`` topics, and ``$SYS`` and ``$SYS/...`` except the pipeline's
    ``$SYS/skipmq/analytics/...`` (left to the ACL)."""
    if not topic.startswith("$"):
        return False
    if topic == SYS_ROOT or topic.startswith(SYS_PREFIX):
        return not topic.startswith(ANALYTICS_PREFIX)
    return is_reserved_topic(topic)
