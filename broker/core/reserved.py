"""The topics reserved for the brokers themselves: ``$skipmq/...`` (MQTT 5.0 §4.7.2: "Server
implementations MAY use Topic Names that start with a leading $ character for other purposes").

The cluster carries its own state there as retained messages - the dynamic users and ACL of the
admin API (``$skipmq/auth/...``) and each broker's admin endpoint (``$skipmq/admin/...``) - so the
cluster's retained replication (last writer wins, anti-entropy; docs/cluster.md) spreads them to
every broker. No MQTT client may write or read them: a PUBLISH or a will to such a topic is
refused like an ACL denial, and a SUBSCRIBE whose filter can match one gets 0x87 Not authorized,
whatever the ACL says (docs/security.md "Reserved topics"). Wildcards at the first level never
match a ``$`` topic (MQTT-4.7.2-1), so only filters whose first level is ``$skipmq`` can.
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
