"""A forwarded QoS 0 message needs no durable send-log entry (issue #31, "less work per message";
broker/cluster/streams.py ``_forward``, broker/cluster/stream_sender.py ``append``).

QoS 0 is at most once: nothing of it has to survive a crash of the publisher's broker, so it is
never written to the durable send log (the store's ``cluster_send_log``) and its publish waits for
no commit; a QoS 1 message of the same stream is written before its PUBACK (the control: the
same class, the same subscriber broker, the same run). While the broker runs, a QoS 0 message
stays in the in-memory log until its receivers acknowledged it, so a receiver that missed it
asks for it again (RET) and gets it; what that in-memory entry costs is measured in
docs/benchmarks-cluster.md ("Cost breakdown").

Real brokers (the 3-broker cluster over mutual-TLS gRPC), paho clients, the publisher's broker's
own SQLite file, read while it runs.
"""

from __future__ import annotations

from tests.support.cluster import ClientFactory, numbers, probe_route, send_log_rows, unique_id, wait_until
from tools.launcher import LocalCluster

QOS0_MESSAGES = 300
QOS1_MESSAGES = 50


def test_forwarded_qos0_messages_write_no_send_log_row_while_qos1_ones_do(
    cluster3: LocalCluster, client_factory: ClientFactory
) -> None:
    prefix = unique_id("q0log")
    topic, cls = f"{prefix}/t", f"={prefix}"
    remote = client_factory(cluster3, 1)
    assert remote.subscribe(topic, 1) == [1]
    probe_route(cluster3, 0, remote, topic)  # the subscription reached broker 0
    publisher = client_factory(cluster3, 0)

    before = send_log_rows(cluster3, 0, cls)
    for n in range(QOS0_MESSAGES):
        publisher.publish_nowait(topic, b"z" + str(n).encode(), 0)
    got = remote.wait_messages(QOS0_MESSAGES, timeout_s=30.0)
    assert numbers((m.payload for m in got), b"z") == list(range(QOS0_MESSAGES))
    assert send_log_rows(cluster3, 0, cls) == before, "a forwarded QoS 0 message was written to the store"

    # the control, on the same stream: QoS 1 is durable before its PUBACK (kept at least
    # cluster.send_log_min_retention_ms, 10 s by default: past the count below)
    for n in range(QOS1_MESSAGES):
        publisher.publish_nowait(topic, b"o" + str(n).encode(), 1)
    wait_until(lambda: not publisher.pending, 30.0, what="every QoS 1 publish acknowledged")
    got = remote.wait_messages(QOS1_MESSAGES, timeout_s=30.0)
    assert numbers((m.payload for m in got), b"o") == list(range(QOS1_MESSAGES))
    written = send_log_rows(cluster3, 0, cls) - before
    assert written >= QOS1_MESSAGES, f"only {written} of {QOS1_MESSAGES} QoS 1 messages in the store"
