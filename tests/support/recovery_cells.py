"""One cell of the recovery matrix: a fault under a fast QoS 1 or QoS 2 stream, real processes.

Used by bench/recovery_matrix.py (every cell at >= 2,000 msg/s, >= 5,000 messages, by hand) and
tests/process/cluster/test_recovery_matrix.py (the cells test_zero_loss.py / test_netsplit.py do
not cover, at CI size). The counting is tests/support/zeroloss.py's (IdStream, Inbox, tally).

A cell: 3 brokers (tools/launcher.LocalCluster: real ``python -m broker`` processes, mutual TLS
between them, the default limits; ``settings`` adds only what the caller passes, e.g. the cluster
tests' faster failure detection), a persistent paho publisher on A (0) and a persistent
subscriber on B (1) at ``qos``, both MQTT 5, clean start 0, session expiry 600 s. The subscriber
(``CellParams.subscriber``, tests/support/subscriber_process.py) is mosquitto_sub by default: a
paho client in this process drained QoS 2 slower than 2,000 msg/s beside the publisher (the
control dropped 1,898 of 10,778), mosquitto_sub did not (0 of 12,222 at 1,933 msg/s, load 12);
a cell with a session move uses paho in a process of its own (mosquitto_sub cannot change
broker without a restart, which loses its QoS 2 messages between PUBREC and PUBREL). The stream
publishes ``rate_per_s`` with ``window`` unacknowledged at most; half of ``messages`` is
acknowledged before the fault and as many again after it (the stream goes on during the fault, so
a long fault makes the stream longer). Faults (``FAULTS``):

* ``none``: the control - no fault (``down_s`` of stream where the fault would be): does the
  subscriber keep up with the live stream on this machine now? If it does not, it drops by its
  queue policy as on one broker, and a fault cell at that rate measures the machine, not recovery.

* ``kill-sub``: kill -9 of B (the subscriber's broker); restarted after ``down_s`` on its data,
  the subscriber comes back to it (session present).
* ``kill-pub``: kill -9 of A (the publisher's broker); QoS 1: the publisher goes on at C at once
  (a new session; paho sends again what was not acknowledged); QoS 2: it comes back to A after the
  restart (its session holds the QoS 2 packet ids: docs/cluster.md "Known limits").
* ``kill-third``: kill -9 of C (neither's broker), restarted after ``down_s``.
* ``move``: the subscriber disconnects (normal DISCONNECT: its session queues on B) and after
  ``down_s`` connects to C (session present): the session moves under the stream.
* ``netsplit``: each broker in its own network namespace (tools/netns.py, root needed); the
  cluster net is cut into A, C | B for ``split_s`` and healed; the clients stay connected.

Result (``CellResult``): acknowledged, lost (acknowledged, never received), duplicates, the
acknowledged rate outside the fault, the publisher's most unacknowledged publishes seen, the
QoS 1 duplicate bound (``duplicate_bound``), and what the brokers dropped by queue policy
(``PolicyDrops``; the ``none`` control shows whether the subscriber keeps up at all).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.support.cluster import ClusterClient, metric_total, probe_route, unique_id, wait_until
from tests.support.in_flight import duplicate_bound
from tests.support.subscriber_process import MosquittoSubscriber, ProcessSubscriber
from tests.support.zeroloss import IdStream, Inbox, tally
from tools.launcher import LocalCluster
from tools.netns import NetnsLab

A, B, C = 0, 1, 2
FAULTS = ("none", "kill-sub", "kill-pub", "kill-third", "move", "netsplit")
SESSION_EXPIRY_S = 600
READY_TIMEOUT_S = 30.0


SUBSCRIBERS = ("auto", "mosquitto", "paho-process", "paho")


def subscriber_kind(wanted: str, steps: list[str], qos: int = 1) -> str:
    """The subscriber client a cell uses: ``wanted``, except that mosquitto_sub cannot move;
    ``auto``: paho in a process of its own at QoS 2 (libmosquitto 2.0.11 mishandles a QoS 2
    PUBLISH sent again after a kill of its broker, docs/cluster.md "Known limits"), mosquitto_sub
    at QoS 1."""
    if wanted not in SUBSCRIBERS:
        raise ValueError(f"unknown subscriber {wanted!r}; one of {', '.join(SUBSCRIBERS)}")
    if wanted == "auto":
        wanted = "paho-process" if qos == 2 else "mosquitto"
    return "paho-process" if wanted == "mosquitto" and "move" in steps else wanted


@dataclass
class CellParams:
    messages: int = 5_000
    rate_per_s: float = 2_000.0
    window: int = 100
    down_s: float = 3.0  # a killed broker stays down / a moving session stays away this long
    split_s: float = 30.0
    drain_s: float = 60.0
    stream_s: float = 120.0  # bound on each stage of the stream
    settings: dict[str, str] = field(default_factory=dict)
    data_root: str | None = None
    # the subscriber client (SUBSCRIBERS, tests/support/subscriber_process.py): "mosquitto" (mosquitto_sub,
    # in C: drains 2,000 QoS 2 msg/s on this machine; a cell with a session move takes paho-process,
    # since mosquitto_sub cannot change broker), "paho-process" (paho in a process of its own),
    # "paho" (a paho ClusterClient in this process, beside the publisher)
    subscriber: str = "mosquitto"
    # a cell counts only with at least this many acknowledged and this rate outside the fault
    # (CellResult.shortfalls; 0: not checked)
    min_messages: int = 0
    min_rate_per_s: float = 0.0


@dataclass
class CellResult:
    fault: str
    qos: int
    acknowledged: int
    lost: int
    duplicates: int
    duplicated_ids: int
    most_copies: int
    duplicate_bound: int
    max_unacknowledged: int
    rate_outside_fault_per_s: float
    rate_overall_per_s: float
    fault_s: float
    stream_s: float
    session_present: bool
    dropped_by_policy: int
    load_before: float
    load_after: float
    lost_sample: list[int]
    error: str = ""
    subscriber: str = ""
    # what the cell had to reach to count (bench/recovery_matrix.py: the issue's ">= 5,000 messages
    # at >= 2,000 msg/s"); 0: not checked (the CI cells check only loss and duplicates)
    min_messages: int = 0
    min_rate_per_s: float = 0.0
    # the ids the publisher had handed to paho when the (first) fault began, and the highest lost
    # id: a loss wholly below ``sent_at_fault`` was published before the fault (a subscriber that
    # was already behind the live stream drops so by its queue policy, also in an incarnation
    # killed before its counter could be read to the end); -1: nothing lost
    sent_at_fault: int = 0
    lost_max: int = -1

    @property
    def shortfalls(self) -> list[str]:
        """Why the cell does not count, one phrase each (empty: it passes)."""
        out = [self.error] if self.error else []
        if self.lost:
            out.append(f"{self.lost} lost")
        if not self.session_present:
            out.append("no session present")
        if self.qos == 2 and self.duplicates:
            out.append(f"{self.duplicates} duplicates at QoS 2")
        if self.qos == 1 and self.duplicates > self.duplicate_bound:
            out.append(f"{self.duplicates} duplicates > {self.duplicate_bound} in flight")
        if self.acknowledged < self.min_messages:
            out.append(f"{self.acknowledged} acknowledged < {self.min_messages}")
        if self.rate_outside_fault_per_s < self.min_rate_per_s:
            out.append(f"{self.rate_outside_fault_per_s:.0f} msg/s < {self.min_rate_per_s:.0f}")
        return out

    @property
    def passed(self) -> bool:
        return not self.shortfalls

    @property
    def lost_beyond_policy(self) -> int:
        """Lost and not counted as dropped by a queue policy: what the cluster itself lost (drops of
        a killed broker's last, unlogged 10 s interval count here too)."""
        return max(0, self.lost - self.dropped_by_policy)

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self), "lost_beyond_policy": self.lost_beyond_policy, "passed": self.passed,
            "shortfalls": self.shortfalls,
        }  # fmt: skip


class _PendingWatch(threading.Thread):
    """Samples the publisher's unacknowledged publishes every 5 ms (the most is reported), and
    when the stream's first id was handed to paho and its last one acknowledged (``first_at``,
    ``done_at``: the stream's own length, without the 50 ms polls of ``wait_done``)."""

    def __init__(self, client: ClusterClient, stream: IdStream) -> None:
        super().__init__(daemon=True, name="pending-watch")
        self.client = client
        self.stream = stream
        self.most = 0
        self.first_at: float | None = None
        self.done_at: float | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.005):
            pending = len(self.client.pending)
            self.most = max(self.most, pending)
            if self.first_at is None and self.stream.sent:
                self.first_at = time.monotonic()
            if self.done_at is None and self.stream.sent >= self.stream.limit and not pending:
                self.done_at = time.monotonic()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(2)


@contextlib.contextmanager
def cell_cluster(
    fault: str, params: CellParams, root: Path, shared: LocalCluster | None = None
) -> Iterator[tuple[LocalCluster, NetnsLab | None]]:
    """A ready 3-broker cluster for ``fault`` (in network namespaces for a netsplit), closed after;
    or ``shared`` (not for a netsplit), every broker of it up and joined, left running after."""
    if shared is not None:
        if "netsplit" in fault.split("+"):
            raise ValueError("a netsplit cell needs a cluster of its own (network namespaces)")
        for index, broker in enumerate(shared.brokers):
            if not broker.alive():
                shared.restart_broker(index)
        shared.wait_ready(READY_TIMEOUT_S)
        yield shared, None
        return
    lab = NetnsLab(3) if "netsplit" in fault.split("+") else None
    with lab if lab is not None else contextlib.nullcontext():
        cluster = LocalCluster(
            3, settings=dict(params.settings), data_root=str(root),
            placement=lab.placement if lab is not None else None,
        )  # fmt: skip
        try:
            cluster.start()
            cluster.wait_ready(READY_TIMEOUT_S)
            yield cluster, lab
        finally:
            cluster.close()  # every broker stopped before its namespace goes away


def _client(cluster: LocalCluster, index: int, made: list[Any], **kwargs: Any) -> ClusterClient:
    broker = cluster.brokers[index]
    client = ClusterClient(broker.mqtt_port, host=broker.host, **kwargs)
    made.append(client)
    return client


POLICY_REASONS = ("queue_full_oldest", "queue_full_new")


class PolicyDrops:
    """Messages the brokers dropped by a session's queue policy (``skipmq_messages_dropped_total``
    with a queue-full reason: a subscriber slower than the live stream, as on one broker, or set
    aside in a catch-up), summed over every incarnation: a broker's counter is read just before
    it is killed (its log's last 10 s interval is never written) and at the end."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        # less what the brokers had counted before (a cluster shared by several cells)
        self.counted = -sum(self.read(i) for i, broker in enumerate(cluster.brokers) if broker.alive())

    def read(self, index: int) -> int:
        try:
            text = self.cluster.metrics_text(index)
        except Exception:  # a broker that does not answer: its drops are not counted
            return 0
        return int(sum(metric_total(text, "skipmq_messages_dropped_total", reason=r) for r in POLICY_REASONS))

    def before_kill(self, index: int) -> None:
        self.counted += self.read(index)

    def total(self) -> int:
        return self.counted + sum(
            self.read(i) for i in range(len(self.cluster.brokers)) if self.cluster.brokers[i].alive()
        )


def _load() -> float:
    return os.getloadavg()[0]


def run_cell(
    fault: str,
    qos: int,
    params: CellParams,
    root: Path,
    progress: Callable[[str], None] = lambda _text: None,
    cluster: LocalCluster | None = None,
) -> CellResult:
    """Run one cell on a fresh cluster under ``root`` and return what was counted. ``fault`` may
    chain faults with ``+`` (``kill-third+move``: one after the other under one stream).
    ``cluster``: run it on this one instead (its brokers restarted where down; a killed broker is
    restarted by the cell itself), as tests do that share one cluster among several cells; its
    settings are the cluster's, not ``params.settings``."""
    steps = fault.split("+")
    for step in steps:
        if step not in FAULTS:
            raise ValueError(f"unknown fault {step!r}; one of {', '.join(FAULTS)}")
    made: list[Any] = []
    load_before = _load()
    with cell_cluster(fault, params, root, cluster) as (cluster, lab):
        try:
            topic = f"{unique_id(f'rm-{steps[0]}-q{qos}')}/stream"
            sub: Any
            kind = subscriber_kind(params.subscriber, steps, qos)
            if kind == "mosquitto":
                sub = MosquittoSubscriber(cluster, B, client_id=unique_id("rm-sub"), topic=topic, qos=qos,
                                          session_expiry_s=SESSION_EXPIRY_S)  # fmt: skip
                made.append(sub)
            elif kind == "paho-process":
                broker_b = cluster.brokers[B]
                sub = ProcessSubscriber(broker_b.mqtt_port, client_id=unique_id("rm-sub"), host=broker_b.host,
                                        session_expiry_s=SESSION_EXPIRY_S)  # fmt: skip
                made.append(sub)
            else:
                sub = _client(cluster, B, made, client_id=unique_id("rm-sub"), clean=False,
                              session_expiry_s=SESSION_EXPIRY_S)  # fmt: skip
            assert sub.subscribe(topic, qos) == [qos]
            probe_route(cluster, A, [sub], topic)
            pub = _client(cluster, A, made, client_id=unique_id("rm-pub"), clean=False,
                          session_expiry_s=SESSION_EXPIRY_S, max_inflight=params.window)  # fmt: skip
            inbox = Inbox([sub])
            drops = PolicyDrops(cluster)
            stream = IdStream(
                pub, topic, qos=qos, limit=10**9, window=params.window, rate_per_s=params.rate_per_s
            )
            watch = _PendingWatch(pub, stream)
            half = params.messages // 2
            session_present = True
            fault_s, acked_in_faults, sent_at_fault = 0.0, 0, -1
            started = time.monotonic()
            stream.start()
            watch.start()
            try:
                stream.wait_acked(half, params.stream_s)
                for step in steps:
                    fault_at, acked_at_fault = time.monotonic(), len(stream.acked_ids())
                    sent_at_fault = stream.sent if sent_at_fault < 0 else sent_at_fault
                    progress(f"{fault} QoS {qos}: {acked_at_fault} acknowledged, {step}")
                    session_present = (
                        _inject(step, qos, cluster, lab, pub, sub, params, progress, drops)
                        and session_present
                    )
                    fault_end, acked_at_end = time.monotonic(), len(stream.acked_ids())
                    fault_s += fault_end - fault_at
                    acked_in_faults += acked_at_end - acked_at_fault
                    progress(
                        f"{fault} QoS {qos}: {step} over after {fault_end - fault_at:.1f} s,"
                        f" {acked_at_end} acknowledged"
                    )
                    stream.wait_acked(acked_at_end + half, params.stream_s)
                stream.limit = max(stream.sent, params.messages)
                stream.wait_done(params.stream_s)
                ended = time.monotonic()
            finally:
                stream.stop()
                watch.stop()
            acked = stream.acked_ids()
            # the rate outside the faults: from the first publish to the last acknowledgement
            span_s = (watch.done_at or ended) - (watch.first_at or started)
            outside_s = max(span_s - fault_s, 1e-3)
            progress(f"{fault} QoS {qos}: {len(acked)} acknowledged in {ended - started:.1f} s, draining")
            result = tally(f"{fault} QoS {qos}", inbox, acked, params.drain_s)
            return CellResult(
                fault=fault, qos=qos, acknowledged=len(acked), lost=len(result.lost),
                duplicates=result.duplicates, duplicated_ids=result.duplicated_ids,
                most_copies=max(result.counts.values(), default=0),
                duplicate_bound=duplicate_bound(3, len(steps), params.window), max_unacknowledged=watch.most,
                rate_outside_fault_per_s=round((len(acked) - acked_in_faults) / outside_s, 1),
                rate_overall_per_s=round(len(acked) / max(span_s, 1e-3), 1),
                fault_s=round(fault_s, 2), stream_s=round(span_s, 2),
                session_present=session_present, dropped_by_policy=drops.total(),
                load_before=round(load_before, 2), load_after=round(_load(), 2),
                lost_sample=sorted(result.lost)[:20], subscriber=kind,
                min_messages=params.min_messages, min_rate_per_s=params.min_rate_per_s,
                sent_at_fault=sent_at_fault, lost_max=max(result.lost, default=-1),
            )  # fmt: skip
        finally:
            for client in made:
                with contextlib.suppress(Exception):
                    client.close()


def _inject(
    fault: str,
    qos: int,
    cluster: LocalCluster,
    lab: NetnsLab | None,
    pub: ClusterClient,
    sub: Any,
    params: CellParams,
    progress: Callable[[str], None],
    drops: PolicyDrops,
) -> bool:
    """Do ``fault`` while the stream runs; returns whether the sessions that had to reconnect
    found their session (True when none had to)."""
    present = True
    if fault == "none":
        time.sleep(params.down_s)
    elif fault == "kill-sub":
        drops.before_kill(B)
        cluster.kill_broker(B)
        sub.wait_disconnected(10)
        time.sleep(params.down_s)  # the stream goes on into B's send logs
        cluster.restart_broker(B)
        sub.connect()
        present = sub.session_present
    elif fault == "kill-pub":
        drops.before_kill(A)
        cluster.kill_broker(A)
        pub.wait_disconnected(10)
        if qos == 1:
            pub.connect(cluster.brokers[C].mqtt_port, host=cluster.brokers[C].host)
            time.sleep(params.down_s)
            cluster.restart_broker(A)
        else:
            time.sleep(params.down_s)
            cluster.restart_broker(A)
            pub.connect()
            present = pub.session_present
    elif fault == "kill-third":
        drops.before_kill(C)
        cluster.kill_broker(C)
        time.sleep(params.down_s)
        cluster.restart_broker(C)
    elif fault == "move":
        sub.disconnect()  # its session (expiry 600 s) stays on B and queues the stream
        time.sleep(params.down_s)
        sub.connect(cluster.brokers[C].mqtt_port, host=cluster.brokers[C].host)
        present = sub.session_present
    elif fault == "netsplit":
        assert lab is not None
        lab.partition([[A, C], [B]])
        progress(f"netsplit: A, C | B for {params.split_s:g} s")
        wait_until(lambda: not lab.reachable(A, B), 10, what="the split in place")
        time.sleep(params.split_s)  # the split lasts split_s while the stream runs (not a sync point)
        lab.heal()
    if not present:
        progress(f"{fault} QoS {qos}: a reconnecting client found no session")
    return present
