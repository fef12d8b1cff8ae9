"""Scripted tests of causal groups (issue #10; seed 004 §3.2-§3.4 on the reliable streams):
``causal_clock`` (the ACK vector a message carries, merged along acceptance, with the SEQ of every
copy) and the receiving side's causal acceptance in ``stream_receiver`` (held until the
dependencies it receives are accepted, failure condition (2) -> RET, a stream never heard of asked
from the dependency, "gone" answers, the bounded wait, positions not moved while held).
Events with an explicit ``now`` go in; the exact outputs are asserted.
"""

from __future__ import annotations

import pytest

from broker.adapters.transport.wire import decode_forwarded, encode_forwarded
from broker.cluster.causal_clock import CausalClock
from broker.cluster.messages import ForwardedMessage, StreamPosition, StreamRet
from broker.cluster.stream_receiver import SendRet, StreamReceiver
from broker.config import ConfigError, load_config
from broker.core.session import Message

A = "a:1/inc1"
B = "b:1/inc1"
C = "c:1/inc1"


def _msg(topic: str, n: int) -> Message:
    return Message(topic, str(n).encode(), qos=1)


def _fwd(
    origin: str,
    cls: str,
    seq: int,
    *,
    deps: tuple[StreamPosition, ...] = (),
    copies: tuple[tuple[str, int], ...] | None = None,
    topic: str = "f/x",
) -> ForwardedMessage:
    return ForwardedMessage(
        origin, cls, seq, _msg(topic, seq), 0, deps, ((cls, seq),) if copies is None else copies
    )


def _receiver(wants: frozenset[str] = frozenset({"=f", "*0:"}), wait_s: float = 30.0) -> StreamReceiver:
    receiver = StreamReceiver(ret_delay_s=0.2, retransmit_s=1.0, ack_delay_s=0.05)
    receiver.set_causal("c:1", wants.__contains__, wait_s)
    return receiver


def _got(ready: list[tuple[ForwardedMessage, int]]) -> list[tuple[str, str, int]]:
    return [(f.origin, f.stream, f.seq) for f, _hops in ready]


# ============================================================================ the clock
def test_clock_stamps_what_this_broker_sent_and_accepted_and_merges_transitively() -> None:
    clock = CausalClock(["f/#", "g/#"])
    assert clock.groups_of("f/a") == (0,) and clock.groups_of("h/a") == ()
    assert clock.stamp((0,)) == ()
    clock.sent((0,), C, (("=f", 4), ("*0:", 9)))
    # B's message accepted here depended on A's =f up to 7 (B had accepted it)
    clock.accepted(_fwd(B, "=f", 3, deps=(StreamPosition(A, "=f", 7),)))
    assert clock.stamp((0,)) == (
        StreamPosition(A, "=f", 7),
        StreamPosition(B, "=f", 4),
        StreamPosition(C, "*0:", 10),
        StreamPosition(C, "=f", 5),
    )
    assert clock.stamp((1,)) == ()  # another group: nothing of f/#
    # positions only rise
    clock.accepted(_fwd(B, "=f", 2, deps=(StreamPosition(A, "=f", 3),)))
    assert StreamPosition(A, "=f", 7) in clock.stamp((0,))
    clock.forget([(A, "=f")])
    assert StreamPosition(A, "=f", 7) not in clock.stamp((0,))


def test_clock_records_every_copy_of_a_message_so_another_class_sees_the_dependency() -> None:
    """A's f/x went out on =f (SEQ 3) and on *0: (SEQ 8); this broker got the =f copy. A broker
    that subscribes only '#' (class *0:) must wait for SEQ 8 of A's *0: stream."""
    clock = CausalClock(["f/#"])
    clock.accepted(_fwd(A, "=f", 3, copies=(("=f", 3), ("*0:", 8))))
    assert StreamPosition(A, "*0:", 9) in clock.stamp((0,))


def test_a_message_outside_every_group_changes_no_clock() -> None:
    clock = CausalClock(["f/#"])
    clock.accepted(ForwardedMessage(A, "=f", 1, _msg("f/x", 1)))  # no copies: not a group message
    assert clock.stamp((0,)) == () and clock.size() == 0


# ============================================================================ causal acceptance
def test_a_message_waits_for_the_one_it_depends_on_then_both_are_accepted_in_order() -> None:
    receiver = _receiver()
    assert _got(receiver.receive(_fwd(A, "=f", 1), 1, now=0.0)) == [(A, "=f", 1)]
    # B's message depends on A's =f up to SEQ 2, which is still on its way here
    reply = _fwd(B, "=f", 1, deps=(StreamPosition(A, "=f", 3),))
    assert receiver.receive(reply, 1, now=0.1) == []
    assert receiver.blocked_count() == 1 and receiver.stats.causal_held == 1
    assert receiver.position((B, "=f")) == 1  # REQ still at the waiting message: not accepted
    assert receiver.changed.get((B, "=f")) is None  # nothing to persist: a crash now loses nothing
    assert _got(receiver.receive(_fwd(A, "=f", 2), 1, now=0.2)) == [(A, "=f", 2), (B, "=f", 1)]
    assert receiver.blocked_count() == 0
    assert receiver.position((B, "=f")) == 2


def test_a_missing_dependency_is_asked_for_with_ret_and_the_messages_behind_it_wait() -> None:
    """Failure condition (2) of §3.3: the dependency reveals a loss nothing else shows (A's
    SEQ 2 was the last message of its stream). FIFO holds behind the waiting message."""
    receiver = _receiver()
    receiver.receive(_fwd(A, "=f", 1), 1, now=0.0)
    receiver.receive(_fwd(B, "=f", 1, deps=(StreamPosition(A, "=f", 3),)), 1, now=0.0)
    assert receiver.receive(_fwd(B, "=f", 2), 1, now=0.05) == []  # behind the waiting one
    assert not [a for a in receiver.tick(now=0.1) if isinstance(a, SendRet)]  # within ret_delay
    rets = [a for a in receiver.tick(now=0.25) if isinstance(a, SendRet)]
    assert rets == [SendRet("a:1", StreamRet(A, "=f", 2, 3))]
    assert [a for a in receiver.tick(now=0.5) if isinstance(a, SendRet)] == []  # not before retransmit
    assert [a for a in receiver.tick(now=1.3) if isinstance(a, SendRet)] == rets  # asked again
    ready = receiver.receive(_fwd(A, "=f", 2), 1, now=1.4)
    assert _got(ready) == [(A, "=f", 2), (B, "=f", 1), (B, "=f", 2)]


def test_a_dependency_on_a_stream_never_heard_of_is_asked_for_and_a_gone_answer_settles_it() -> None:
    """This broker subscribes =f but never got A's stream (it subscribed after A's message): RET
    asks for the dependency itself; A answers that it no longer has it."""
    receiver = _receiver()
    receiver.receive(_fwd(B, "=f", 1, deps=(StreamPosition(A, "=f", 5),)), 1, now=0.0)
    rets = [a for a in receiver.tick(now=0.3) if isinstance(a, SendRet)]
    assert rets == [SendRet("a:1", StreamRet(A, "=f", 4, 5))]
    assert _got(receiver.gone(A, "=f", 5, now=0.4)) == [(B, "=f", 1)]
    # remembered: the next message with the same dependency does not wait
    assert _got(receiver.receive(_fwd(B, "=f", 2, deps=(StreamPosition(A, "=f", 5),)), 1, now=0.5)) == [
        (B, "=f", 2)
    ]


def test_a_dependency_on_a_stream_never_heard_of_is_resent_and_delivered_first() -> None:
    receiver = _receiver()
    receiver.receive(_fwd(B, "=f", 1, deps=(StreamPosition(A, "=f", 5),)), 1, now=0.0)
    assert _got(receiver.receive(_fwd(A, "=f", 4), 1, now=0.3)) == [(A, "=f", 4), (B, "=f", 1)]


def test_dependencies_on_unsubscribed_classes_and_on_our_own_streams_hold_nothing() -> None:
    receiver = _receiver(wants=frozenset({"=f"}))
    deps = (
        StreamPosition(A, "=g", 9),
        StreamPosition("c:1/old", "=f", 4),
        StreamPosition("c:1/inc1", "=f", 7),
    )
    assert _got(receiver.receive(_fwd(B, "=f", 1, deps=deps), 1, now=0.0)) == [(B, "=f", 1)]
    assert receiver.stats.causal_held == 0


def test_a_dependency_whose_broker_never_answers_is_given_up_after_the_wait_counted() -> None:
    receiver = _receiver(wait_s=5.0)
    receiver.receive(_fwd(A, "=f", 1), 1, now=0.0)
    receiver.receive(_fwd(B, "=f", 1, deps=(StreamPosition(A, "=f", 3),)), 1, now=0.0)
    assert receiver.give_up_waits(now=4.9) == []
    assert _got(receiver.give_up_waits(now=5.0)) == [(B, "=f", 1)]
    assert receiver.stats.causal_given_up == 1 and receiver.blocked_count() == 0
    # A's stream itself is not skipped: its SEQ 2 is still asked for when a later one shows the gap
    assert receiver.position((A, "=f")) == 2


def test_chains_of_waits_release_together() -> None:
    """C's message depends on B's, which depends on A's: the last arrival releases all."""
    receiver = _receiver()
    receiver.receive(_fwd(C.replace("c:1", "d:1"), "=f", 1, deps=(StreamPosition(B, "=f", 2),)), 1, now=0.0)
    receiver.receive(_fwd(B, "=f", 1, deps=(StreamPosition(A, "=f", 2),)), 1, now=0.0)
    assert receiver.blocked_count() == 2
    assert _got(receiver.receive(_fwd(A, "=f", 1), 1, now=0.1)) == [
        (A, "=f", 1),
        (B, "=f", 1),
        ("d:1/inc1", "=f", 1),
    ]


# ============================================================================ wire and config
def test_the_dependencies_and_copies_cross_the_wire_and_the_store() -> None:
    forwarded = _fwd(
        B,
        "=f",
        3,
        deps=(StreamPosition(A, "=f", 7), StreamPosition(B, "*0:", 2)),
        copies=(("=f", 3), ("*0:", 5)),
    )
    assert decode_forwarded(encode_forwarded(forwarded)) == forwarded
    plain = ForwardedMessage(A, "=f", 1, _msg("f/x", 1))
    assert decode_forwarded(encode_forwarded(plain)) == plain


@pytest.mark.parametrize("bad", ["f/#/x", "$share/g/f/#", "f/a+"])
def test_a_bad_causal_group_refuses_to_start_naming_the_key(bad: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(env={}, overrides={"cluster.causal_groups": f"factory/#,{bad}"})
    assert error.value.key == "cluster.causal_groups"
