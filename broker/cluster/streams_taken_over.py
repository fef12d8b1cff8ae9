"""A replicated log taken over, on the reliable streams (``cluster.replicas`` > 1): the answer
``LOG_TAKEN_OVER`` to a RET, and what a receiver does with it (docs/notes/replication.md,
2026-11-29).

A broker back with its disk lost keeps no log of its earlier incarnation; its replica holders
publish what that log held and was acknowledged again, in log order, as their own publishes. A
receiver that still waits for a gap in one of that incarnation's streams used to be answered
"gone" and deliver what it held behind the gap at once - ahead of the gap's messages, which came
a moment later from a holder (seed 004 §3.3's retransmission cannot fill them: the origin has
none). Now:

* **the origin's new incarnation** answers such a RET with ``gone_below = LOG_TAKEN_OVER`` when
  ``cluster.replicas`` > 1 and it keeps no log of that stream at all;
* **the receiver** drops what it holds of that incarnation, and whatever of it still arrives (a
  relay's copy, a late resend), instead of delivering it: the holders' copies bring it, in order
  (``StreamReceiver.taken_over``).

What is dropped is what the receiver had not acknowledged, so the origin's send log still held
it and so did its holders (the replication releases an entry only once every receiver broker
took it): nothing acknowledged to a publisher is lost; what was never durable on N was never
acknowledged. Mixed into the engine beside ``StreamsMixin`` (whose RET and resend handling call
it), so that module keeps its size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.cluster.messages import ForwardedMessage, StreamAck, StreamResend, StreamRet
from broker.cluster.replication_messages import LOG_TAKEN_OVER
from broker.cluster.stream_receiver import StreamReceiver, origin_peer

if TYPE_CHECKING:
    from broker.cluster.stream_sender import StreamSender
    from broker.config import ClusterConfig

log = logging.getLogger("skipmq.cluster")


class LogTakenOverMixin:
    """See the module docstring."""

    # owned by the engine
    peer_id: str
    cluster: ClusterConfig
    sender: StreamSender | None
    receiver: StreamReceiver
    _catch_ups: dict[tuple[str, str], list[list[Any]]]
    _now: Callable[[], float]
    _send_stream: Callable[[str, StreamAck | StreamRet | StreamResend], None]
    _deliver: Callable[[list[tuple[ForwardedMessage, int]]], None]
    _persist_positions: Callable[[], None]
    _catch_ups_gone: Callable[[tuple[str, str], int], None]

    def _answer_log_taken_over(self, peer: str, request: StreamRet) -> bool:
        """A RET from ``peer`` for a stream of an earlier incarnation of this broker that this
        sender keeps no log of, with ``cluster.replicas`` > 1: answered ``LOG_TAKEN_OVER`` (True)."""
        sender = self.sender
        if (
            sender is None
            or self.cluster.replicas <= 1
            or origin_peer(request.origin) != self.peer_id
            or request.origin == sender.origin
            or sender.next_seq_of((request.origin, request.stream)) is not None
        ):
            return False
        self._send_stream(peer, StreamResend(request.origin, request.stream, (), LOG_TAKEN_OVER))
        return True

    def _receive_log_taken_over(self, body: StreamResend) -> bool:
        """``body`` says its origin's log is published again by the origin's replica holders
        (True): what is held here of that incarnation is dropped, not delivered ahead of the gap."""
        if body.gone_below < LOG_TAKEN_OVER:
            return False
        now = self._now()
        key = (body.origin, body.stream)
        if self._catch_ups:
            self._catch_ups_gone(key, body.gone_below)  # moved sessions get it from the holders too
        if not self.receiver.has_stream(key):  # a dependency on a stream never received here
            self._deliver(self.receiver.gone(body.origin, body.stream, body.gone_below, now))
        dropped, ready = self.receiver.taken_over(body.origin, now)
        self._deliver(ready)
        self._persist_positions()
        log.info("cluster_log_taken_over origin=%s stream=%s dropped=%d", body.origin, body.stream, dropped)
        return True
