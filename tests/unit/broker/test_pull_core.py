"""The pull protocol core (seed 001 §4.6): scripted, no I/O."""

from __future__ import annotations

from broker.core.pull import (
    MAX_ACKS,
    MAX_MESSAGES,
    PUBACK,
    PUBCOMP,
    PUBREC,
    Problem,
    PullBuffer,
    PulledMessage,
    PullReceiver,
    PullRequest,
    RateLimiter,
    parse_open,
    parse_publish,
    parse_pull,
)


def _msg(seq: int | None, qos: int = 1, packet_id: int | None = None, payload: bytes = b"x") -> PulledMessage:
    return PulledMessage(seq, packet_id if packet_id is not None else seq, f"t/{seq}", payload, qos, False)


def test_a_response_carries_at_most_16_and_says_more_remain() -> None:
    buffer = PullBuffer()
    for seq in range(1, 21):
        buffer.delivered(_msg(seq))
    messages, remaining = buffer.take()
    assert [m.seq for m in messages] == list(range(1, 17)) and len(messages) == MAX_MESSAGES
    assert remaining
    messages, remaining = buffer.take(50)  # a bigger limit is still 16
    assert len(messages) == 16 and remaining


def test_nothing_is_deleted_before_its_number_comes_back() -> None:
    buffer = PullBuffer()
    for seq in (1, 2, 3):
        buffer.delivered(_msg(seq))
    first, _ = buffer.take()
    again, remaining = buffer.take()  # the response was lost: the same messages, same numbers
    assert [m.seq for m in again] == [m.seq for m in first] == [1, 2, 3] and not remaining
    assert buffer.acknowledge([2]) == [(PUBACK, 2)]
    assert [m.seq for m in buffer.take()[0]] == [1, 3]
    assert buffer.acknowledge([2, 99]) == []  # a number twice, or unknown: nothing more happens
    assert buffer.acknowledge([1, 3]) == [(PUBACK, 1), (PUBACK, 3)]
    assert buffer.take() == ([], False)


def test_qos2_acknowledged_by_number_is_pubrec_then_pubcomp() -> None:
    buffer = PullBuffer()
    buffer.delivered(_msg(7, qos=2, packet_id=40))
    assert buffer.acknowledge([7]) == [(PUBREC, 40)]
    assert buffer.released(40) == [(PUBCOMP, 40)]
    assert buffer.take() == ([], False)


def test_a_resent_publish_replaces_its_copy() -> None:
    buffer = PullBuffer()
    buffer.delivered(_msg(5, packet_id=1))
    buffer.delivered(_msg(5, packet_id=9))  # re-sent after a reconnect with another packet id
    messages, _ = buffer.take()
    assert len(messages) == 1 and buffer.acknowledge([5]) == [(PUBACK, 9)]


def test_qos0_goes_out_once_after_the_numbered_ones() -> None:
    buffer = PullBuffer()
    buffer.delivered(_msg(None, qos=0))
    buffer.delivered(_msg(1))
    messages, remaining = buffer.take()
    assert [m.seq for m in messages] == [1, None] and not remaining
    assert [m.seq for m in buffer.take()[0]] == [1]


def test_request_limits_name_the_limit() -> None:
    ok = parse_pull({"client_id": "d", "acks": list(range(1, MAX_ACKS + 1))}, max_wait_s=30)
    assert isinstance(ok, PullRequest) and len(ok.acks) == MAX_ACKS
    too_many = parse_pull({"client_id": "d", "acks": list(range(1, MAX_ACKS + 2))}, max_wait_s=30)
    assert isinstance(too_many, Problem) and too_many.status == 400 and too_many.limit == "acks_per_request"
    assert "1024" in too_many.detail
    long_wait = parse_pull({"client_id": "d", "wait_s": 1e16}, max_wait_s=30)
    assert isinstance(long_wait, PullRequest) and long_wait.wait_s == 30  # bounded by pull.max_wait_s
    many = parse_pull({"client_id": "d", "max_messages": 17}, max_wait_s=30)
    assert isinstance(many, PullRequest) and many.max_messages == 16  # capped (seed 001 §4.6), not refused
    for bad in (
        [],
        {"acks": []},
        {"client_id": ""},
        {"client_id": "d", "acks": "1"},
        {"client_id": "d", "acks": [0]},
        {"client_id": "d", "acks": [True]},
        {"client_id": "d", "acks": [1.5]},
        {"client_id": "d", "max_messages": 0},
        {"client_id": "d", "wait_s": -1},
        {"client_id": "d", "epoch": 3},
        {"client_id": "\ud800"},  # a lone surrogate: not UTF-8
    ):
        problem = parse_pull(bad, max_wait_s=30)
        assert isinstance(problem, Problem) and problem.status == 400, bad
    shown = parse_pull({"client_id": "d", "wait_s": True}, max_wait_s=30)
    assert isinstance(shown, Problem) and shown.detail.endswith("got true")  # JSON, not Python's True
    dup = parse_pull({"client_id": "d", "acks": [3, 3, 1]}, max_wait_s=30)
    assert isinstance(dup, PullRequest) and dup.acks == (3, 1)


def test_publish_and_open_bodies() -> None:
    publish = parse_publish(
        {
            "client_id": "d",
            "topic": "a/b",
            "payload_base64": "AAE=",
            "qos": 2,
            "properties": {"content_type": "x"},
        }
    )
    assert not isinstance(publish, Problem) and publish.payload == b"\x00\x01" and publish.qos == 2
    for bad in (
        {"client_id": "d", "topic": "a/#"},
        {"client_id": "d", "topic": "a", "payload": "x", "payload_base64": "eA=="},
        {"client_id": "d", "topic": "a", "payload_base64": "!!"},
        {"client_id": "d", "topic": "a", "qos": 3},
        {"client_id": "d", "topic": "a", "properties": {"nope": 1}},
    ):
        assert isinstance(parse_publish(bad), Problem), bad
    opened = parse_open({"client_id": "d", "subscriptions": [{"filter": "a/#", "qos": 2}]})
    assert not isinstance(opened, Problem) and opened.subscriptions == (("a/#", 2),)
    assert isinstance(parse_open({"client_id": "d", "subscriptions": [{"filter": "a", "qos": 5}]}), Problem)


def test_receiver_acknowledges_until_confirmed_and_drops_repeats() -> None:
    receiver = PullReceiver()
    acks, epoch = receiver.next_acks()
    assert acks == [] and epoch is None
    first = {"epoch": "b1", "session_present": True, "messages": [{"seq": 1}, {"seq": 2}]}
    assert [m["seq"] for m in receiver.accept([], first)] == [1, 2]
    acks, epoch = receiver.next_acks()
    assert acks == [1, 2] and epoch == "b1"
    # that request's response was lost; the retry carries the same numbers; the broker had not
    # seen the first one, so 2 comes again: the application does not get it twice
    again = {"epoch": "b1", "session_present": True, "messages": [{"seq": 2}, {"seq": 3}]}
    assert [m["seq"] for m in receiver.accept([], again)] == [3]
    assert receiver.next_acks()[0] == [1, 2, 3]
    confirmed = {"epoch": "b1", "session_present": True, "messages": []}
    receiver.accept([1, 2, 3], confirmed)
    assert receiver.pending == 0
    # another broker numbers the session anew: old numbers mean nothing there
    receiver.accept([], {"epoch": "b1", "session_present": True, "messages": [{"seq": 4}]})
    moved = {"epoch": "b2", "session_present": True, "messages": [{"seq": 1}]}
    assert [m["seq"] for m in receiver.accept([4], moved)] == [1]
    assert receiver.next_acks() == ([1], "b2")


def test_rate_limiter_refills() -> None:
    limiter = RateLimiter(2)
    assert limiter.allow("a", 0.0) and limiter.allow("a", 0.0)
    assert not limiter.allow("a", 0.0)
    assert limiter.allow("b", 0.0)  # per key
    assert limiter.allow("a", 0.5)  # one token back after half a second
    assert not limiter.allow("a", 0.5)


def test_exhausted_looks_without_taking_a_token() -> None:
    limiter = RateLimiter(2)
    assert not limiter.exhausted("ip", 0.0)  # an unknown key has its whole bucket
    assert limiter.allow("ip", 0.0) and not limiter.exhausted("ip", 0.0)
    assert limiter.allow("ip", 0.0) and limiter.exhausted("ip", 0.0)
    assert limiter.exhausted("ip", 0.4) and not limiter.exhausted("ip", 0.5)
    assert limiter.allow("ip", 0.5)  # looking took nothing


def test_properties_use_the_codecs_names_and_null_is_refused() -> None:
    publish = parse_publish(
        {"client_id": "d", "topic": "a", "properties": {"user_properties": [["k", "v"]], "content_type": ""}}
    )
    assert not isinstance(publish, Problem)
    assert publish.properties == {"user_property": [("k", "v")], "content_type": ""}
    empty = parse_publish({"client_id": "d", "topic": "a", "properties": {"user_properties": []}})
    assert not isinstance(empty, Problem) and empty.properties == {}
    message = PulledMessage(1, 1, "a", b"x", 1, False, {"user_property": [("k", "v")]})
    assert message.as_json()["properties"] == {"user_properties": [["k", "v"]]}
    for body in (
        {"client_id": "d", "topic": "a", "payload_base64": None},
        {"client_id": "d", "password": None},
    ):
        assert isinstance(parse_publish(body), Problem)
    assert isinstance(parse_pull({"client_id": "d", "epoch": None}, max_wait_s=1), Problem)
