"""Causal groups in the whole-cluster simulation: a conversation across brokers, and an independent
vector-clock oracle that checks what every observer saw (issue #10, ``cluster.causal_groups``).

The scenario: a publisher on one broker sends numbered QoS 1 messages; a *responder* on a second
broker answers each one it receives with a message of its own; a second responder on a third broker
answers the answers; observers on other brokers subscribe everything (one through ``plant/#``, the
exact class, one through ``#``, the wildcard class: the two reach them on different streams). With
links that delay some messages (reordering), an observer can get an answer before the message it
answers - unless the topics are a causal group. On top: message loss and duplication between
brokers, a broker killed and restarted, a partition that heals (:func:`causal_conversation`).

The oracle knows nothing of the broker (it reads no broker, cluster or ``causal_clock`` state):
it rebuilds happened-before from what the clients did on each connection, in the order they did
it (its publishes in order; a message it received before it published another; the cluster keeps
no causal state for a client across connections, docs/cluster.md), as a vector clock per message
(publishing connection -> the highest SEQ of its messages that precede it), and checks every
subscriber's first receipts against it: a message received before one that precedes it is a
violation (:func:`vector_clocks`, :func:`causal_order`). Every PUBLISH a client sent counts, with
or without its PUBACK: a message the broker took before a crash cut the PUBACK off still orders
what follows it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from broker.mqtt.topics import topic_matches
from simulation.checkers import History, Received, Violation
from simulation.clients import SimClient
from simulation.network import NetworkConfig
from simulation.scenario import Result, Run, Scenario

MessageId = tuple[str, int, int]  # (publisher, connection epoch, seq): what the payload carries
Connection = tuple[str, int]  # (client id, connection epoch)
VectorClock = dict[Connection, int]  # publishing connection -> the highest SEQ of its messages
GROUP_FILTER = "plant/#"


def vector_clocks(
    history: History, group_filters: Iterable[str] = (GROUP_FILTER,)
) -> dict[MessageId, VectorClock]:
    """Happened-before among the group's messages, from the clients' own actions only.

    Every client connection keeps a vector clock: for each publishing connection, the highest SEQ
    of its group messages this connection has *seen* (published itself, or received - with
    everything that message had seen when it was published: transitivity). A publish takes a copy
    of its connection's clock (what precedes it), then counts itself. Actions are replayed in the
    order they happened (``step``; virtual time for histories without steps). Nothing here reads
    a broker: the messages' identities come from the payloads the clients wrote and decoded
    (``publisher:epoch:seq``), the clocks from the order of their actions."""
    filters = tuple(group_filters)

    def in_group(topic: str) -> bool:
        return any(topic_matches(f, topic) for f in filters)

    # (at, step, kind, connection, message): kind 0 = a receipt, 1 = a publish (a receipt and a
    # publish at one virtual instant without steps: the receipt first, as a responder answers)
    actions: list[tuple[float, int, int, Connection, MessageId]] = []
    for p in history.published:
        if in_group(p.topic):
            actions.append((p.published_at, p.step, 1, (p.publisher, p.epoch), (p.publisher, p.epoch, p.seq)))
    for r in history.received:
        if in_group(r.topic):
            actions.append((r.at, r.step, 0, (r.subscriber, r.connection), (r.publisher, r.epoch, r.seq)))
    actions.sort(key=lambda a: (a[0], a[1], a[2]))
    seen: dict[Connection, VectorClock] = {}
    clocks: dict[MessageId, VectorClock] = {}
    for _at, _step, kind, connection, message in actions:
        mine = seen.setdefault(connection, {})
        if kind == 1:
            clocks[message] = dict(mine)
            mine[connection] = max(mine.get(connection, 0), message[2])
            continue
        for origin, seq in clocks.get(message, {}).items():
            if seq > mine.get(origin, 0):
                mine[origin] = seq
        origin = (message[0], message[1])
        if message[2] > mine.get(origin, 0):
            mine[origin] = message[2]
    return clocks


def causal_order(history: History, group_filters: Iterable[str] = (GROUP_FILTER,)) -> list[Violation]:
    """Every subscriber's first receipts of the group's messages respect happened-before
    (:func:`vector_clocks`): a message received after one whose clock says it precedes is a
    violation. A message never received is not ordered here (``lost_acknowledged`` asks for
    every acknowledged one)."""
    filters = tuple(group_filters)
    clocks = vector_clocks(history, filters)
    by_subscriber: dict[str, list[MessageId]] = {}
    got: set[tuple[str, MessageId]] = set()
    for r in sorted(history.received, key=lambda r: (r.at, r.step)):
        message = (r.publisher, r.epoch, r.seq)
        if (r.subscriber, message) in got or not any(topic_matches(f, r.topic) for f in filters):
            continue  # a duplicate (QoS 1) or outside the group
        got.add((r.subscriber, message))
        by_subscriber.setdefault(r.subscriber, []).append(message)
    violations = []
    for subscriber, order in sorted(by_subscriber.items()):
        for index, message in enumerate(order):
            before = clocks.get(message, {})
            for later in order[index + 1 :]:
                if later[2] <= before.get((later[0], later[1]), 0):
                    violations.append(
                        Violation(
                            "causal",
                            f"{subscriber} got {':'.join(map(str, message))} before "
                            f"{':'.join(map(str, later))}, which precedes it",
                        )
                    )
                    break
    return violations


def causal_conversation(
    seed: int,
    *,
    causal: bool = True,
    messages: int = 30,
    loss: float = 0.0,
    duplicate: float = 0.0,
    reorder: float = 0.3,
    crash: bool = False,
    partition: bool = False,
) -> Result:
    """The conversation on 5 brokers (see the module docstring); ``causal``: ``plant/#`` is a
    causal group; ``loss``, ``duplicate``, ``reorder``: the rates of every inter-broker link;
    ``crash``: one broker is killed (-9) mid-conversation and restarted 0.5-2 s later;
    ``partition``: two of the five brokers are cut off from the other three mid-conversation and
    the network heals 1-5 s later. Checked by the usual invariants (``check_all``: nothing
    acknowledged lost at any subscriber, per-publisher order, one owner, retained) and by the
    vector-clock oracle :func:`causal_order`."""
    settings: tuple[tuple[str, object], ...] = (("cluster.causal_groups", GROUP_FILTER),) if causal else ()
    network = NetworkConfig(
        latency_s=0.002,
        jitter_s=0.002,
        loss_rate=loss,
        duplicate_rate=duplicate,
        reorder_rate=reorder,
        reorder_delay_s=0.03,
    )
    faults = [f"loss {loss:.0%} dup {duplicate:.0%} reorder {reorder:.0%}"]
    faults += ["a crash"] * crash + ["a partition"] * partition + ["no causal group"] * (not causal)
    title = f"causal conversation: {', '.join(faults)}"
    scenario = Scenario(brokers=5, quiet_s=10.0, network=network, settings=settings, title=title)
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
    if partition:
        side = run.rng.sample(run.peer_ids, 2)
        at = scenario.settle_s + run.rng.uniform(0.1, messages * 0.04)
        run.world.at(at, run.partition, side)
        run.world.at(at + run.rng.uniform(1.0, 5.0), run.heal)
    result = run.finish()
    result.violations = [*result.violations, *causal_order(result.history)]
    return result
