"""A moved session's catch-up as data: the rows the store keeps, and the tables they restore.

When a session moves to this broker, what its old broker had not delivered is asked again from
each stream's origin for that client only (a catch-up, ``broker.cluster.streams``), and the newer
messages of those streams are held for it until the catch-up is done (order per publisher). This
broker's receive positions move on meanwhile, so a crash mid catch-up would lose both - the
messages were acknowledged to their publishers long ago. Seed 004 §3 keeps what must survive a
crash in stable storage (its SL/AL/REQ); this module is the catch-up's share of it (issue #10):

* :func:`rows_of` - one client's catch-ups as :data:`CatchUpRow` tuples, for
  ``ClusterStore.set_catch_ups`` (written in the open transaction, with the deliveries and the
  receive positions of the same commit);
* :func:`restore` - the tables of a restarted broker from the rows and held messages it loaded:
  each catch-up starts again at ``now`` (its give-up clock too) and its requests are repeated.

Pure: no I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from broker.cluster.messages import ForwardedMessage

StreamKey = tuple[str, str]  # (origin, class)
# (origin, class, next SEQ, end SEQ, counted): SEQs next..end-1 still to deliver, counted as a gap
# if given up; end 0: waiting for the stream to start here (nothing of it arrived yet)
CatchUpRow = tuple[str, str, int, int, bool]
CatchUps = dict[StreamKey, list[list[Any]]]  # key -> [[next SEQ, end SEQ, client, since, counted]]
AwaitingStart = dict[StreamKey, list[tuple[int, str, float]]]  # key -> [(next SEQ, client, since)]
Held = dict[tuple[StreamKey, str], list[ForwardedMessage]]  # (key, client) -> held messages
# topic filter -> stream key -> the SEQ from which a client's own subscription of that filter here
# got every message of the stream (its REQ here, or this broker's next SEQ, when it subscribed)
SubscribedAt = dict[str, dict[StreamKey, int]]


def rows_of(client_id: str, catch_ups: CatchUps, awaiting_start: AwaitingStart) -> list[CatchUpRow]:
    """What ``client_id`` still waits for, as store rows (empty: it waits for nothing)."""
    rows: list[CatchUpRow] = []
    for (origin, stream), entries in sorted(catch_ups.items()):
        rows += [(origin, stream, e[0], e[1], bool(e[4])) for e in entries if e[2] == client_id]
    for (origin, stream), waiting in sorted(awaiting_start.items()):
        rows += [(origin, stream, next_seq, 0, False) for next_seq, c, _since in waiting if c == client_id]
    return rows


def restore(
    rows: Iterable[tuple[str, list[CatchUpRow]]],
    held: Iterable[tuple[str, ForwardedMessage]],
    now: float,
) -> tuple[CatchUps, AwaitingStart, Held]:
    """The catch-up tables of a broker that restarted with ``rows`` (client id -> its rows) and
    ``held`` (client id, message held for it, in SEQ order per stream) in its store."""
    catch_ups: CatchUps = {}
    awaiting: AwaitingStart = {}
    for client_id, client_rows in rows:
        for origin, stream, next_seq, end, counted in client_rows:
            key = (origin, stream)
            if end:
                catch_ups.setdefault(key, []).append([next_seq, end, client_id, now, counted])
            else:
                awaiting.setdefault(key, []).append((next_seq, client_id, now))
    held_for: Held = {}
    for client_id, forwarded in held:
        held_for.setdefault(((forwarded.origin, forwarded.stream), client_id), []).append(forwarded)
    return catch_ups, awaiting, held_for


def upper_bound(
    subscribed_at: Mapping[str, Mapping[StreamKey, int]], filters: Collection[str], key: StreamKey, start: int
) -> int | None:
    """Where a late session's catch-up of ``key`` may stop: the session it merges into subscribed
    ``filters`` (every filter of the late session on the stream's class) here already, and got
    every message of ``key`` from this SEQ on through those subscriptions. ``start``: where ``key``
    started here (0: not known), the bound for a stream that reached this broker only after a
    subscription was made. None: no bound (a filter the session did not subscribe here, or no
    record): the catch-up goes to the stream's current position, as before."""
    if not filters:
        return None
    bound = 0
    for topic_filter in filters:
        recorded = subscribed_at.get(topic_filter)
        if recorded is None:
            return None
        at = recorded.get(key)
        if at is None:
            if not start:
                return None
            at = start
        bound = max(bound, at)  # the latest subscription: it got what came after
    return bound
