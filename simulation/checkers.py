"""Invariant checkers of the whole-cluster simulation, over a recorded :class:`History`.

What a user of a production MQTT cluster relies on, checked after the run has gone quiet:

* **no acknowledged message lost** - a QoS 1 message whose publisher got a PUBACK, published
  (PUBLISH sent) after a subscriber got the SUBACK of a matching filter, reaches that subscriber
  (its session is persistent and never ends in these runs);
* **per-publisher order** - the first receipts of one publisher connection's messages at one
  subscriber come in publish order (QoS 1 may duplicate; MQTT §4.6), within one session of the
  subscriber: a message published before the subscriber's current session began (its CONNACK
  said "no session present", its old session's broker was down or cut off) reaches it only when
  that old session is merged in later, and is not ordered against the new session's messages;
* **one owner per client id** - at the end at most one broker has the client id connected;
* **retained converges** - at the end every live broker holds the same retained value per topic;
* **CONNACK first** - the first packet a client gets on a connection is its CONNACK (MQTT-3.2.0-1):
  a PUBLISH before it is a protocol error a real client closes the connection for.

The checkers only read plain data (:class:`History`, and the brokers' end state passed in as
dicts), so tests feed them fabricated histories to show each one fails when it should.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from broker.mqtt.topics import topic_matches


@dataclass
class Acked:
    """A QoS 1 message a publisher sent; ``acked_at`` is set when its PUBACK came back."""

    publisher: str
    epoch: int
    seq: int
    topic: str
    published_at: float
    acked_at: float | None = None
    step: int = 0  # the client's action number in the whole run (History.next_step): ties in time


@dataclass(frozen=True)
class Received:
    subscriber: str
    topic: str
    publisher: str
    epoch: int
    seq: int
    at: float
    connection: int = 0  # the subscriber's connection (its epoch) that received it
    step: int = 0  # the client's action number in the whole run (History.next_step): ties in time


@dataclass
class History:
    """Everything the clients did and saw, in virtual time."""

    acked: list[Acked] = field(default_factory=list)  # the publishes whose PUBACK came back
    published: list[Acked] = field(default_factory=list)  # every PUBLISH a client sent, acked or not
    received: list[Received] = field(default_factory=list)
    # subscriber -> [(filter, virtual time of its first SUBACK)]
    subscriptions: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    # subscriber -> virtual times of its CONNACKs that said "no session present"
    sessions: dict[str, list[float]] = field(default_factory=dict)
    events: list[tuple[object, ...]] = field(default_factory=list)
    clock: Callable[[], float] = lambda: 0.0  # the virtual clock the trace is stamped with
    steps: int = 0  # client actions (publishes, receipts) so far, in the order they happened
    # what a client saw that breaks the protocol (a packet before the CONNACK), with its time
    protocol_errors: list[tuple[float, str]] = field(default_factory=list)

    def next_step(self) -> int:
        self.steps += 1
        return self.steps

    def subscribed(self, subscriber: str, topic_filter: str, at: float) -> None:
        filters = self.subscriptions.setdefault(subscriber, [])
        if all(existing != topic_filter for existing, _at in filters):
            filters.append((topic_filter, at))

    def new_session(self, client_id: str, at: float) -> None:
        self.sessions.setdefault(client_id, []).append(at)

    def trace(self, *event: object) -> None:
        self.events.append((round(self.clock(), 6), *event))

    def digest(self) -> str:
        """A fingerprint of the whole trace: two runs of one seed must give the same."""
        text = "\n".join(repr(event) for event in self.events)
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class Violation:
    kind: str  # "lost" | "order" | "owners" | "retained" | "protocol"
    detail: str


def lost_acknowledged(history: History) -> list[Violation]:
    got = {(r.subscriber, r.publisher, r.epoch, r.seq) for r in history.received}
    violations = []
    for message in history.acked:
        if message.acked_at is None:
            continue
        for subscriber, filters in sorted(history.subscriptions.items()):
            if not any(
                topic_matches(flt, message.topic) and at <= message.published_at for flt, at in filters
            ):
                continue
            if (subscriber, message.publisher, message.epoch, message.seq) not in got:
                violations.append(
                    Violation(
                        "lost",
                        f"{message.publisher}:{message.epoch}:{message.seq} on {message.topic} "
                        f"(published {message.published_at:.3f}, PUBACK {message.acked_at:.3f}) "
                        f"never reached {subscriber}",
                    )
                )
    return violations


def publisher_order(history: History) -> list[Violation]:
    last: dict[tuple[str, str, int], int] = {}
    seen: set[tuple[str, str, int, int]] = set()
    published = {(a.publisher, a.epoch, a.seq): a.published_at for a in history.acked}
    violations = []
    for r in history.received:
        key = (r.subscriber, r.publisher, r.epoch)
        if (*key, r.seq) in seen:
            continue  # a QoS 1 duplicate
        seen.add((*key, r.seq))
        started = [at for at in history.sessions.get(r.subscriber, ()) if at <= r.at]
        sent = published.get((r.publisher, r.epoch, r.seq))
        if len(started) > 1 and sent is not None and sent < started[-1]:
            continue  # from an older session of the subscriber, merged into the current one
        previous = last.get(key, 0)
        if r.seq < previous:
            violations.append(
                Violation(
                    "order",
                    f"{r.subscriber} got {r.publisher}:{r.epoch}:{r.seq} after :{previous} at {r.at:.3f}",
                )
            )
        last[key] = max(previous, r.seq)
    return violations


def one_owner(connected: Mapping[str, Iterable[str]]) -> list[Violation]:
    """``connected``: client id -> the brokers that have it connected at the end."""
    return [
        Violation("owners", f"{client_id} is connected to {sorted(brokers)}")
        for client_id, brokers in sorted(connected.items())
        if len(list(brokers)) > 1
    ]


def retained_converged(retained: Mapping[str, Mapping[str, bytes]]) -> list[Violation]:
    """``retained``: broker -> its retained store (topic -> payload) at the end."""
    topics = sorted({topic for store in retained.values() for topic in store})
    violations = []
    for topic in topics:
        values = {broker: store.get(topic) for broker, store in sorted(retained.items())}
        if len(set(values.values())) > 1:
            violations.append(Violation("retained", f"{topic}: {values}"))
    return violations


def protocol_kept(history: History) -> list[Violation]:
    return [Violation("protocol", f"{detail} at {at:.3f}") for at, detail in history.protocol_errors]


def check_all(
    history: History,
    connected: Mapping[str, Iterable[str]],
    retained: Mapping[str, Mapping[str, bytes]],
) -> list[Violation]:
    return [
        *lost_acknowledged(history),
        *publisher_order(history),
        *one_owner(connected),
        *retained_converged(retained),
        *protocol_kept(history),
    ]
