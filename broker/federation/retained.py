"""Retained messages shared by every site of an event place (``federation.retained = "place"``;
SkipMQ's addition to seed 000 §3.7, which has no retained state; docs/federation.md).

A retained write accepted at a site (a payload, or an empty payload = delete, MQTT §3.3.1.3) is
flooded over the place's tree - on every link but the one it came from, whoever subscribes - and
stored by every broker, so a subscriber that appears later at any site gets it from its own
broker. Last writer wins on ``(version_ms, origin)`` (the accepting broker's wall clock in ms,
ties broken by its name), the rule and the version stamping of the cluster's retained sync
(``broker.cluster.retained_sync``): a router stores and passes on only a write newer than what
it has for the topic, so every broker ends with the same value whatever the order writes
arrive in, and a flood stops where it is old news. After a (re-)link both ends send each other
everything they hold (deletions included), which brings a site that was cut off, or restarted,
up to date. What a broker's store held before it started counts as the oldest version, ``(0,
its name)``: any write made in the place since wins.

Pure: writes and ``wall_ms`` in (the adapter reads the clock), ``Retained`` messages out.
"""

from __future__ import annotations

from broker.federation.messages import Retained

Version = tuple[int, str]


class PlaceRetained:
    """The newest retained write per topic this router knows (tombstones included)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._latest: dict[str, Retained] = {}

    def local_write(self, topic: str, payload: bytes, qos: int, wall_ms: int) -> Retained:
        """A retained write accepted in this site: stamped above every version seen for its topic."""
        current = self._latest.get(topic)
        if current is not None and current.version_ms >= wall_ms:
            wall_ms = current.version_ms + 1
        write = Retained(topic, payload, qos, wall_ms, self.name)
        self._latest[topic] = write
        return write

    def accept(self, write: Retained) -> bool:
        """Whether ``write`` is newer than what this router has for its topic (then kept)."""
        current = self._latest.get(write.topic)
        if current is not None and _version(current) >= _version(write):
            return False
        self._latest[write.topic] = write
        return True

    def seed(self, topic: str, payload: bytes, qos: int) -> None:
        """A retained message the broker's store held at start: the oldest version."""
        if topic not in self._latest:
            self._latest[topic] = Retained(topic, payload, qos, 0, self.name)

    def everything(self) -> list[Retained]:
        """What a new neighbour gets after a (re-)link."""
        return [self._latest[topic] for topic in sorted(self._latest)]

    def __len__(self) -> int:
        return len(self._latest)


def _version(write: Retained) -> Version:
    return (write.version_ms, write.origin)
