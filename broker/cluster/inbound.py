"""Validation of inbound cluster messages against the broker that sent them (issue #12; pure core).

With mutual TLS (``broker.adapters.transport.tls``) the transport knows which broker sent each
item: the peer id its certificate names. These checks make sure a broker speaks only for itself:

* an :class:`Envelope` (seed 002 directed message) comes straight from its ``orig`` to its
  ``dest``: brokers always send envelopes directly, so one addressed to another broker, or
  claiming another origin, is forged (relaying it would also let a sender make this broker dial
  any address: server-side request forgery);
* a session claim or a resend of a stream names the sender as its origin;
* a payload the overlay delivers (PUB, seed 003 §3.5.4) - a forwarded message or a batch of them
  (all of one stream), a retained update, a session claim - names the publisher of the PUB as its
  origin.

Each check returns why the message is rejected, or None. Pure: no I/O.
"""

from __future__ import annotations

from broker.cluster.messages import (
    Envelope,
    ForwardedBatch,
    ForwardedMessage,
    RetainedUpdate,
    SessionClaim,
    StreamResend,
)


def origin_peer(origin: str) -> str:
    """The peer id in a stream origin ``"<peer id>/<incarnation>"``."""
    return origin.rpartition("/")[0] or origin


def envelope_problem(sender: str, self_id: str, envelope: Envelope) -> str | None:
    if envelope.dest != self_id:
        return f"Envelope for {envelope.dest!r} sent to {self_id!r} (envelopes are never relayed)"
    if envelope.orig != sender:
        return f"Envelope claims origin {envelope.orig!r}"
    body = envelope.body
    if isinstance(body, SessionClaim) and body.origin != sender:
        return f"SessionClaim claims origin {body.origin!r}"
    if isinstance(body, StreamResend):
        if origin_peer(body.origin) != sender:
            return f"StreamResend of another broker's stream {body.origin!r}"
        if any(message.origin != body.origin for message in body.messages):
            return "StreamResend holds messages of another stream"
    return None


def payload_problem(publisher: str, payload: object) -> str | None:
    if isinstance(payload, SessionClaim) and payload.origin != publisher:
        return f"SessionClaim from {payload.origin!r} published by {publisher!r}"
    if isinstance(payload, RetainedUpdate) and payload.origin != publisher:
        return f"RetainedUpdate from {payload.origin!r} published by {publisher!r}"
    if isinstance(payload, ForwardedMessage) and origin_peer(payload.origin) != publisher:
        return f"ForwardedMessage of stream {payload.origin!r} published by {publisher!r}"
    if isinstance(payload, ForwardedBatch):
        messages = payload.messages
        if not messages:
            return "empty ForwardedBatch"
        first = messages[0]
        if origin_peer(first.origin) != publisher:
            return f"ForwardedBatch of stream {first.origin!r} published by {publisher!r}"
        if any(m.origin != first.origin or m.stream != first.stream for m in messages):
            return "ForwardedBatch holds messages of more than one stream"
    return None
