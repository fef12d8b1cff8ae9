"""Causal groups in the whole-cluster simulation: a conversation across brokers, and an independent
vector-clock oracle that checks what every observer saw (issue #10, ``cluster.causal_groups``).

The scenario: a publisher on one broker sends numbered QoS 1 messages; a *responder* on a second
broker answers each one it receives with a message of its own; a second responder on a third broker
answers the answers; observers on other brokers subscribe everything (one through ``plant/#``, the
exact class, one through ``#``, the wildcard class: the two reach them on different streams). With
links that delay some messages (reordering), an observer can get an answer before the message it
answers - unless the topics are a causal group.

The oracle knows nothing of the broker: it rebuilds happened-before from what the clients did on
each connection (its publishes in order; a message it received before it published another; the
cluster keeps no causal state for a client across connections, docs/cluster.md), as a vector
clock per message (publishing connection -> the highest SEQ of its messages that precede it), and
checks every observer's first receipts against it: a message received before one that precedes it
is a violation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from broker.mqtt.topics import topic_matches
from simulation.checkers import History, Received, Violation
from simulation.clients import SimClient
from simulation.network import NetworkConfig
from simulation.scenario import Result, Run, Scenario

MessageId = tuple[str, int, int]  # (publisher, epoch, seq)
GROUP_FILTER = "plant/#"


def causal_order(history: History, group_filters: Iterable[str] = (GROUP_FILTER,)) -> list[Violation]:
    """Every observer's first receipts respect happened-before among the group's messages."""
    filters = tuple(group_filters)

    def in_group(topic: str) -> bool:
        return any(topic_matches(f, topic) for f in filters)

    # happened-before, from the clients' own events in time order, per connection: what a client
    # publishes on a connection follows what that connection published and received before
    events: list[tuple[float, int, tuple[str, int], MessageId, str]] = []
    for a in history.acked:
        events.append((a.published_at, 1, (a.publisher, a.epoch), (a.publisher, a.epoch, a.seq), a.topic))
    first: dict[tuple[str, MessageId], float] = {}
    for r in history.received:
        key = (r.subscriber, (r.publisher, r.epoch, r.seq))
        if key not in first:
            first[key] = r.at
            events.append((r.at, 0, (r.subscriber, r.connection), key[1], r.topic))
    events.sort(key=lambda e: (e[0], e[1]))
    # connection -> publishing connection -> the highest SEQ of its messages known to precede
    knows: dict[tuple[str, int], dict[tuple[str, int], int]] = {}
    clock: dict[MessageId, dict[tuple[str, int], int]] = {}  # message -> its dependencies
    for _at, kind, client, message, topic in events:
        if not in_group(topic):
            continue
        mine = knows.setdefault(client, {})
        if kind == 1:  # publish: depends on everything the publisher knows
            clock[message] = dict(mine)
            mine[client] = max(mine.get(client, 0), message[2])
        else:  # receipt: the receiver now knows the message and what precedes it
            for sender, seq in clock.get(message, {}).items():
                if seq > mine.get(sender, 0):
                    mine[sender] = seq
            sender = (message[0], message[1])
            if message[2] > mine.get(sender, 0):
                mine[sender] = message[2]
    # every observer's first receipts in order
    violations = []
    by_subscriber: dict[str, list[MessageId]] = {}
    for r in sorted(history.received, key=lambda r: r.at):
        message = (r.publisher, r.epoch, r.seq)
        if in_group(r.topic) and first.get((r.subscriber, message)) == r.at:
            order = by_subscriber.setdefault(r.subscriber, [])
            if message not in order:
                order.append(message)
    for subscriber, order in sorted(by_subscriber.items()):
        for index, message in enumerate(order):
            for (publisher, epoch), seq in clock.get(message, {}).items():
                later = [m for m in order[index + 1 :] if m[:2] == (publisher, epoch) and m[2] <= seq]
                if later:
                    violations.append(
                        Violation(
                            "causal",
                            f"{subscriber} got {':'.join(map(str, message))} before "
                            f"{':'.join(map(str, later[0]))}, which precedes it",
                        )
                    )
    return violations


def causal_conversation(
    seed: int,
    *,
    causal: bool = True,
    messages: int = 30,
    loss: float = 0.0,
    reorder: float = 0.3,
    crash: bool = False,
) -> Result:
    """The conversation on 5 brokers (see the module docstring); ``causal``: ``plant/#`` is a
    causal group; ``crash``: one broker is killed (-9) mid-conversation and restarted. Checked by
    the usual invariants and by :func:`causal_order`."""
    settings: tuple[tuple[str, object], ...] = (("cluster.causal_groups", GROUP_FILTER),) if causal else ()
    network = NetworkConfig(
        latency_s=0.002, jitter_s=0.002, loss_rate=loss, reorder_rate=reorder, reorder_delay_s=0.03
    )
    scenario = Scenario(
        brokers=5, quiet_s=10.0, network=network, settings=settings, title="causal conversation"
    )
    run = Run(seed, scenario)
    b0, b1, b2, b3, b4 = run.peer_ids
    run.start_brokers()

    def subscribe(client: SimClient, topic_filter: str) -> None:
        def on_connack(client: SimClient, session_present: bool) -> None:
            if not session_present:
                client.subscribe(topic_filter)

        client.on_connack = on_connack

    def answer_on(topic: str, to_prefix: str) -> Callable[[SimClient, Received], None]:
        def on_message(client: SimClient, received: Received) -> None:
            if received.topic.startswith(to_prefix):
                client.publish(topic)

        return on_message

    run.add_client("pub", b0, persistent=False)
    first = run.add_client("answer1", b1, persistent=True)
    subscribe(first, "plant/q/#")
    first.on_message = answer_on("plant/a1/x", "plant/q/")
    second = run.add_client("answer2", b2, persistent=True)
    subscribe(second, "plant/a1/#")
    second.on_message = answer_on("plant/a2/x", "plant/a1/")
    subscribe(run.add_client("watch-exact", b3, persistent=True), "plant/#")
    subscribe(run.add_client("watch-all", b4, persistent=True), "#")
    subscribe(run.add_client("watch-near", b0, persistent=True), "plant/#")
    for index, client_id in enumerate(("answer1", "answer2", "watch-exact", "watch-all", "watch-near")):
        run.world.at(scenario.join_s + 0.05 * index, run.connect, client_id)
    run.world.at(scenario.settle_s - 0.5, run.connect, "pub")
    run.publish_stream("pub", messages, 0.04, scenario.settle_s, "plant/q/x")
    if crash:
        victim = run.rng.choice(run.peer_ids)
        at = scenario.settle_s + run.rng.uniform(0.1, messages * 0.04)
        run.world.at(at, run.crash, victim)
        run.world.at(at + run.rng.uniform(0.5, 2.0), run.restart, victim)
    result = run.finish()
    result.violations = [*result.violations, *causal_order(result.history)]
    return result
