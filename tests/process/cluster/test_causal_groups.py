"""Causal groups with real processes (issue #10, ``cluster.causal_groups``; seed 004's CO service).

Three ``python -m broker`` processes (tools/launcher.py) with ``cluster.causal_groups = "conv/#"``
and real paho-mqtt clients: a publisher on A asks numbered questions (QoS 1), a responder on B
answers each one as it receives it, an observer on C subscribes ``conv/#`` and must see every
question before its answer, every question and answer once at least, and each publisher's messages
in order. The brokers' metrics show the dependency vectors went over the real gRPC links (a clock
at B that holds A's stream, dependency counters). On loopback the direct path A -> C is nearly
always faster than A -> B -> responder -> B -> C, so this test checks the guarantee end to end and
the wiring; the simulation (tests/sim/cluster/test_causal_sim.py) delays links to show the order
breaks without the group.
"""

from __future__ import annotations

import queue
import threading

from tests.support.cluster import ClientFactory, ClusterFactory, metric_total, probe_route, unique_id
from tools.launcher import http_get

QUESTIONS = 300


def test_an_answer_is_never_seen_before_its_question(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    prefix = unique_id("conv")
    cluster = cluster_factory(3, {"cluster.causal_groups": f"{prefix}/#,other/+/x"})
    observer = client_factory(cluster, 2, version=5)
    assert observer.subscribe(f"{prefix}/#", 1) == [1]
    responder = client_factory(cluster, 1, version=5)
    assert responder.subscribe(f"{prefix}/q/#", 1) == [1]
    probe_route(cluster, 0, observer, f"{prefix}/q/probe")
    probe_route(cluster, 0, responder, f"{prefix}/q/probe")
    probe_route(cluster, 1, observer, f"{prefix}/a/probe")
    stop = threading.Event()

    def answer() -> None:  # answers each question as it arrives, in its own thread
        while not stop.is_set():
            try:
                question = responder.messages.get(timeout=0.2)
            except queue.Empty:
                continue
            number = question.topic.rsplit("/", 1)[1]
            responder.publish_nowait(f"{prefix}/a/{number}", b"answer " + number.encode(), 1)

    answering = threading.Thread(target=answer, daemon=True)
    answering.start()
    publisher = client_factory(cluster, 0, version=5)
    try:
        for n in range(QUESTIONS):
            publisher.publish_nowait(f"{prefix}/q/{n}", f"question {n}".encode(), 1)
        got = observer.wait_messages(2 * QUESTIONS, timeout_s=60)
        got += observer.drain(1.0)
    finally:
        stop.set()
        answering.join(timeout=5)
    order: list[tuple[str, int]] = []
    for message in got:
        kind, number = message.topic.split("/")[-2:]
        if (kind, int(number)) not in order:
            order.append((kind, int(number)))
    position = {item: index for index, item in enumerate(order)}
    expected = [(kind, n) for kind in ("a", "q") for n in range(QUESTIONS)]
    assert sorted(order) == expected
    early = [n for n in range(QUESTIONS) if position[("a", n)] < position[("q", n)]]
    assert early == [], f"answers seen before their question: {early[:10]}"
    assert [n for kind, n in order if kind == "q"] == list(range(QUESTIONS))  # per-publisher order
    assert [n for kind, n in order if kind == "a"] == list(range(QUESTIONS))
    # the dependency vectors crossed the real gRPC links: B's clock holds A's and its own streams
    # of the group, and the brokers that received the group's messages counted what waited
    _status, metrics_b = http_get(cluster.brokers[1].http_port, "/metrics")
    assert metric_total(metrics_b.decode(), "skipmq_cluster_causal_clock_entries") >= 2
    for broker in cluster.brokers:
        _status, body = http_get(broker.http_port, "/metrics")
        assert metric_total(body.decode(), "skipmq_cluster_causal_given_up_total") == 0
        assert metric_total(body.decode(), "skipmq_cluster_causal_blocked_streams") == 0
