"""The cluster engine: MQTT semantics across brokers on the overlay (issue #4; docs/cluster.md).

One object per broker composes the pure overlay core (``overlay.node.OverlayNode``, seed 003
SG-TBPS + FRT) with the cluster's pure protocol cores - ``interest`` (which classes to subscribe),
``interest_table`` (which classes the others subscribe), ``stream_sender`` / ``stream_receiver``
(the reliable streams of seed 004: SEQ, send log, ACK vectors, RET), ``subscribe_waits`` (SUBACKs
held until reachable), ``takeover`` (session claims) and ``retained_sync`` (last writer wins,
anti-entropy) - and the broker core, reached only through ``broker.core.ports.BrokerApi``. It is the
core's ``ClusterPort``.

It does no I/O: messages to other brokers go to a :class:`PeerTransport`, time and its single
timer come from the core's ``Scheduler`` (armed at the earliest ``next_deadline()`` of the overlay
and the cores - the aioquic / etcd-raft driver shape). The same engine runs in a broker process
(``broker.adapters.cluster_runtime`` over gRPC, on asyncio) and in the whole-cluster simulation
(``simulation``, on a seeded virtual network).

Mapping MQTT onto the overlay:

* **Topic classes** (``broker.cluster.classes``): the overlay routes on classes, each broker
  matches filters exactly; local subscriptions aggregate per class (SIONet, seed 000).
* **Forwarding with store and forward** (seed 004, ``stream_sender`` / ``stream_receiver``): a
  local publish is published on each of its classes whose rendezvous point reports subscribers,
  as a ``ForwardedMessage`` numbered per (this broker incarnation, class) and kept in the durable
  send log until the overlay completed it and every receiver broker acknowledged it; receivers
  restore the order, drop duplicates and ask for gaps (RET) instead of skipping them.
* **QoS 1/2**: the publisher's PUBACK/PUBREC leaves once the message is committed here, in the
  send log included: this broker then owns its delivery (docs/cluster.md).
* **Subscriptions and moved sessions**: a SUBACK, and the CONNACK of a session that moved here,
  wait until their classes' virtual nodes joined the overlay (``subscriptions_ready``).
* **Control class** ``!ctl``: every broker subscribes it; retained updates and session claims.
* **Session takeover**: a CONNECT publishes a claim; the holder answers with a directed
  ``Envelope`` carrying the session (seed 002 envelope).
* **Shared subscriptions**: the broker whose virtual node heads the group's run at level 0
  delivers the group's copy (one delivery per group cluster-wide).

The class is split by concern into a chain of bases, one module each, every method a direct method
of ``ClusterEngine`` (no call added on the per-message path): ``engine_base`` (the state, constants,
``PeerTransport``), ``streams`` (the reliable-stream plumbing), ``engine_driver`` (the driver loop:
one timer, actions carried out in order, sending and commits), the glue of each protocol core
(``engine_origin``, ``engine_interest``, ``engine_retained``, ``engine_takeover``),
``engine_receiving`` (what the transport reports: items received, peers down, back or gone) and
``engine_entry`` (the ``ClusterPort`` methods the core calls). This module keeps the composition
(``bind``, ``start``, ``stop``) and the introspection read by /cluster and /metrics; each decision
lives in a core, the durable-state port in ``store_port.py``.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from broker.cluster.class_stats import SnapshotBuilder
from broker.cluster.engine_base import (
    DOWN_PEER_MEMORY_S,
    INTEREST_REFRESH_RETRANSMITS,
    RETAINED_SYNC_TIMEOUT_S,
    SWEEP_INTERVAL_S,
    PeerTransport,
    overlay_config_for,
)
from broker.cluster.engine_entry import EngineEntryPoints
from broker.cluster.interest import SHARE_PREFIX
from broker.cluster.messages import ClassInterest
from broker.cluster.overlay_figures import OverlayFigures, peer_suspicion, published_classes, routing_entries
from broker.cluster.retained_sync import RetainedSync
from broker.cluster.store_port import ClusterStore
from broker.cluster.stream_sender import StreamSender
from broker.cluster.streams import CONTROL_CLASS
from broker.cluster.takeover import Takeover
from overlay import api
from overlay.api import Role
from overlay.keys import ANCHOR_TOPIC, PUBLISHER, SUBSCRIBER, make_key
from overlay.node import OverlayNode

if TYPE_CHECKING:
    from broker.core.ports import BrokerApi

log = logging.getLogger("skipmq.cluster")

__all__ = ["CONTROL_CLASS", "SHARE_PREFIX", "ClusterEngine", "PeerTransport", "overlay_config_for"]


class ClusterEngine(EngineEntryPoints):
    """See the module docstring. Construct, pass as the core's cluster port, ``bind`` the core and
    a transport, ``start``; ``stop`` before the core closes."""

    # ================================================================== lifecycle
    def bind(
        self, broker: BrokerApi, transport: PeerTransport, peer_id: str, store: ClusterStore | None = None
    ) -> None:
        """Attach the core, the transport and the cluster's durable state; ``peer_id`` is this
        broker's address in the cluster."""
        if self.broker is not None:
            raise RuntimeError("ClusterEngine.bind() called twice")
        self.broker = broker
        self.transport = transport
        self.peer_id = peer_id
        if store is not None:
            self.store = store
        cluster = self.cluster
        self.sender = StreamSender(
            f"{peer_id}/{self.incarnation}",
            retransmit_s=self.retransmit_s,
            retention_s=float(cluster.send_log_retention_s),
            presence_grace_s=cluster.presence_grace_ms / 1000.0,
            min_retention_s=cluster.send_log_min_retention_ms / 1000.0,
            receivers_of=self.interest_table.peers_of,
            absent_since=self._absent_since,
        )
        self.sender.confirm_seconds = self.stats.publish_confirm_seconds
        self.receiver.budget = self._room_with_holds  # the flow condition of catch-up (stream_receiver)
        self.receiver.window_closed = self._catch_up_window_closed  # ... without head-of-line blocking
        self.receiver.caught_up = self._catch_up_over
        self.receiver.stalled = self._stalled_unless_held
        self.receiver.hold_live = self._held_or_absent  # ... and for sessions all away
        if self.origin_checks is not None:
            self.origin_checks.stats = self.stats  # (its counters are the engine's)
        self.receiver.set_causal(peer_id, self.interest.subscribes, cluster.causal_wait_ms / 1000.0)
        seed = self.rng.getrandbits(64)
        self.node = OverlayNode(peer_id, rng=random.Random(seed), config=overlay_config_for(self.cluster))
        self.takeover = Takeover(
            peer_id,
            wait_s=self.cluster.takeover_wait_ms / 1000.0,
            repeat_s=self.retransmit_s,
        )
        self.retained_sync = RetainedSync(
            peer_id,
            request_timeout_s=RETAINED_SYNC_TIMEOUT_S,
            anti_entropy_s=self.cluster.retained_anti_entropy_ms / 1000.0,
        )

    def start(self, contacts: list[str]) -> None:
        """Enter the overlay through ``contacts`` (none: found a new cluster). Listing this broker
        itself among them makes it a seed: with its fellow seeds it founds the overlay when none
        is reachable (the lowest reachable seed founds, overlay.formation)."""
        assert self.broker is not None and self.retained_sync is not None, "bind() first"
        assert self.sender is not None
        self.stopped = False
        self._founded_alone = all(peer == self.peer_id for peer in contacts)
        now = self._now()
        self._unheard_contacts = {peer for peer in contacts if peer != self.peer_id}
        self._unheard_until = now + DOWN_PEER_MEMORY_S
        # resume the streams a previous incarnation left: what it had not delivered everywhere is
        # published again, and our positions tell the senders what we missed while down
        logged = self.store.load_log()
        positions = self.store.load_positions()
        self.sender.restore(logged, self.store.load_receivers(), now)
        assert self.takeover is not None
        self.takeover.restore_handed_over(self.store.load_handed_over(), now)
        # claims of ours whose session had not arrived when this broker went down: asked again
        # (``recover``) of every broker that talks to us (``_peer_back``)
        self.takeover.restore_pending(self.store.load_pending_claims(), now)
        self.receiver.restore(positions, now)
        self._restore_catch_ups(now)  # moved sessions caught up when this broker went down
        # our announcements of interest are ordered across restarts: a durable epoch, one more
        # at each start (an older incarnation's announcement still in flight is then ignored);
        # at least the wall clock's milliseconds, for a broker without persistence (its store
        # starts from 0 every time)
        epoch = max(self.store.load_interest_epoch() + 1, int(self.scheduler.wall_time() * 1000))
        self.store.set_interest_epoch(epoch)
        self.announcer.begin(epoch)
        if self.causal is not None:
            self.causal.restore([*positions, *(((f.origin, f.stream), f.seq + 1) for f in logged)])
        self._handle(api.Bootstrap(tuple(contacts)))
        self._handle(api.JoinTopic(CONTROL_CLASS, Role.SUBSCRIBER))
        self._handle(api.JoinTopic(CONTROL_CLASS, Role.PUBLISHER))
        for topic in self.interest.topics():  # subscriptions restored from the store before start
            self._handle(api.JoinTopic(topic, Role.SUBSCRIBER))
        self._next_sweep = self._now() + SWEEP_INTERVAL_S
        self._next_interest = self._now() + self.retransmit_s * INTEREST_REFRESH_RETRANSMITS
        retained_sync = self.retained_sync
        retained_sync.restore(
            self.store.load_retained_versions(),
            [m.topic for m in self.broker.retained_messages()],
            self.store.load_retained_proofs(),
        )
        self._persist_retained_versions()
        others = [peer for peer in contacts if peer != self.peer_id]
        self._send_copy_request(retained_sync.start_copy(others, now))
        self.retained_sync.anti_entropy((), now)  # arms the first round
        self._arm_timer()
        self.broker.log_event(logging.INFO, "cluster_started", peer_id=self.peer_id, contacts=contacts)

    def stop(self) -> None:
        """Graceful leave (UNSUB/LEAVE every virtual node); nothing is delivered afterwards."""
        if self.stopped:
            return
        self._flush_outbox()
        self._send_held_replies(self._replies.take_all() if self._replies is not None else [])
        try:
            self._handle(api.Shutdown())
        except Exception:
            log.exception("cluster: overlay shutdown failed")
        if self.transport is not None:  # (after the overlay's LEAVEs: the last thing they get)
            # the others stop contacting us until we talk again
            for peer in sorted(self.transport.connected_peers()):
                self._send_envelope(peer, "", 0, ClassInterest((), leaving=True))
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_at = None
        self._finish_ready_waits(self.subscribe_waits.abort_all())
        if self.takeover is not None:
            self._finish_claims(self.takeover.abort_all())
        if self.retained_sync is not None:
            self.retained_sync.stop()
        self.receiver.clear_deadlines()

    # ================================================================== introspection
    def joined(self) -> bool:
        """In the overlay (found or founded; see overlay.formation) with the virtual nodes every
        broker holds: the anchor and both sides of the control class (readiness, /readyz)."""
        node = self.node
        if node is None or self.stopped:
            return False
        peer = self.peer_id
        keys = (
            make_key(ANCHOR_TOPIC, PUBLISHER, peer),
            make_key(CONTROL_CLASS, SUBSCRIBER, peer),
            make_key(CONTROL_CLASS, PUBLISHER, peer),
        )
        return all(key in node.vnodes for key in keys)

    def state(self) -> dict[str, Any]:
        node = self.node
        joined = self.joined()
        presence: dict[str, bool | None] = {}
        vnodes = 0
        if node is not None:
            vnodes = len(node.vnodes)
            for cls in self._published:
                presence[cls] = node.subscriber_presence(cls)
        transport = self.transport
        return {
            "peer_id": self.peer_id,
            "joined": joined,
            "connected_peers": sorted(transport.connected_peers()) if transport is not None else [],
            "subscribed_classes": self.interest.classes(),
            "published_classes": sorted(self._published),
            "presence": presence,
            "vnodes": vnodes,
        }

    def subscriber_brokers(self, cls: str) -> int:
        """How many brokers subscribe ``cls``, this one included, as this broker knows it."""
        return len(self.interest_table.peers_of(cls)) + (1 if self.interest.subscribes(cls) else 0)

    def class_snapshot(self, now_s: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The next per-class snapshot (``broker.cluster.class_stats``) at wall time ``now_s``:
        every class this broker counted, subscribes or knows a subscriber of (not the control
        class)."""
        if self._snapshots is None:
            self._snapshots = SnapshotBuilder(self.peer_id, self.class_counters, self.cluster.table_size)
        counters = self.class_counters.by_class
        for cls in [cls for cls in counters if cls == CONTROL_CLASS or cls.startswith("=$")]:
            del counters[cls]  # the control class, and $-topics (never forwarded)
        known = {
            cls
            for cls in set(self.interest.classes()) | self.interest_table.classes()
            if cls != CONTROL_CLASS and not cls.startswith("=$")
        }
        return self._snapshots.build(now_s, self.subscriber_brokers, known, extra)

    def sender_counters(self) -> dict[str, int]:
        """Counters the send log keeps (scrape time): publishes suppressed, RETs answered."""
        sender = self.sender
        return {
            "publishes_suppressed": sender.skipped_total if sender is not None else 0,
            "rets_received": sender.rets_received if sender is not None else 0,
        }

    def overlay_figures(self) -> OverlayFigures:
        """The overlay's figures for /metrics (``broker.cluster.overlay_figures``; scrape time)."""
        figures = OverlayFigures()
        node = self.node
        if node is None:
            return figures
        figures.routing_entries = routing_entries(node)
        published = [cls for cls in self._published if cls != CONTROL_CLASS and not cls.startswith("=$")]
        figures.published_classes = published_classes(node, published, self.interest_table.peers_of)
        transport = self.transport
        connected = transport.connected_peers() if transport is not None else frozenset()
        figures.peer_suspected, figures.peer_silence_s = peer_suspicion(
            node, self._now(), connected | self._heard_from, self._down_peers
        )
        return figures

    def gauges(self) -> dict[str, int]:
        node = self.node
        transport = self.transport
        return {
            "peers_connected": len(transport.connected_peers()) if transport is not None else 0,
            "virtual_nodes": len(node.vnodes) if node is not None else 0,
            "subscribed_classes": len(self.interest.classes()),
            "published_classes": len(self._published),
            "held_messages": self.receiver.held_count(),
            "causal_blocked_streams": self.receiver.blocked_count(),
            "causal_held_messages": self.receiver.causal_held_count(),
            "routing_table_capacity": self.cluster.table_size,
            "causal_clock_entries": self.causal.size() if self.causal is not None else 0,
            "send_log_messages": self.sender.logged_count() if self.sender is not None else 0,
            "send_log_receivers": self.sender.receiver_count() if self.sender is not None else 0,
        }
