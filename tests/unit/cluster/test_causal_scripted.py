"""Scripted tests of the CO protocol core (``broker.cluster.causal``, seed 004), etcd-raft style:
events with an explicit ``now`` in, the exact actions asserted.

Example 1 and 2 of seed 004 §3.4/§3.5 are replayed message by message with three real entities:
the senders compute Table 1's SEQ and ACK fields themselves, and E_1 (the observer) shows the REQ,
AL and PAL matrices the seed prints. Fig. 4 (a)/(b) loss detection with the seed's numbers, the
flow condition, duplicates, held messages and membership follow. Where the seed's printed text
and this core differ (a is acknowledged one step earlier) the test says so; docs/causal.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from broker.cluster.causal import (
    Action,
    Broadcast,
    CausalGroup,
    CoMessage,
    Deliver,
    Freed,
    Ret,
    SendTo,
    precedes,
)

MEMBERS = ("E1", "E2", "E3")


def _group(member: str, members: Sequence[str] = MEMBERS, **options: float) -> CausalGroup:
    return CausalGroup(member, members, cid="C", **options)  # type: ignore[arg-type]


def _sent(actions: list[Action]) -> CoMessage:
    broadcasts = [action.message for action in actions if isinstance(action, Broadcast)]
    assert len(broadcasts) == 1, actions
    return broadcasts[0]


def _vector(values: Sequence[int], members: Sequence[str] = MEMBERS) -> dict[str, int]:
    return dict(zip(members, values, strict=True))


def _matrix(rows: Sequence[Sequence[int]]) -> dict[str, dict[str, int]]:
    """The seed's matrix notation: row k = source E_k, column j = E_j (AL_kj)."""
    return {k: _vector(row) for k, row in zip(MEMBERS, rows, strict=True)}


def _names(messages: Sequence[CoMessage], names: dict[tuple[str, int], str]) -> list[str]:
    return [names[(message.src, message.seq)] for message in messages]


def _deliveries(actions: list[Action]) -> list[CoMessage]:
    return [action.message for action in actions if isinstance(action, Deliver)]


class Example:
    """Fig. 6 / Table 1: E1 sends a, c, e, f; E2 sends d, g; E3 sends b, h (REQ starts at 1)."""

    def __init__(self) -> None:
        self.e1, self.e2, self.e3 = (_group(member) for member in MEMBERS)
        self.msg: dict[str, CoMessage] = {}
        self.names: dict[tuple[str, int], str] = {}
        self.delivered: dict[str, list[CoMessage]] = {member: [] for member in MEMBERS}

    def send(self, entity: CausalGroup, name: str) -> CoMessage:
        actions = entity.send(name.encode(), now=0.0)
        self.delivered[entity.member_id] += _deliveries(actions)
        message = _sent(actions)
        self.msg[name] = message
        self.names[(message.src, message.seq)] = name
        return message

    def feed(self, entity: CausalGroup, *names: str) -> list[Action]:
        actions: list[Action] = []
        for name in names:
            actions += entity.receive(self.msg[name], now=0.0)
        self.delivered[entity.member_id] += _deliveries(actions)
        return actions

    def run_example_1_until_d(self) -> list[Action]:
        self.send(self.e1, "a")
        self.send(self.e1, "c")  # before E1 accepts b: c.ACK = <2,1,1>
        self.feed(self.e3, "a")
        self.send(self.e3, "b")
        self.feed(self.e2, "a", "c", "b")
        self.send(self.e2, "d")
        return self.feed(self.e1, "b", "d")

    def run_example_1_until_h(self) -> list[Action]:
        self.run_example_1_until_d()
        self.send(self.e1, "e")
        self.send(self.e1, "f")
        self.feed(self.e2, "e")
        self.send(self.e2, "g")  # before E2 accepts f: g.ACK_1 = 4
        self.feed(self.e2, "f")
        self.feed(self.e3, "c", "d", "e", "f", "g")
        self.send(self.e3, "h")
        assert self.feed(self.e1, "g") == []  # nothing new is pre-acknowledged before h
        return self.feed(self.e1, "h")


TABLE_1 = {  # message: (SEQ, ACK)
    "a": (1, (1, 1, 1)),
    "b": (1, (2, 1, 1)),
    "c": (2, (2, 1, 1)),
    "d": (1, (3, 1, 2)),
    "e": (3, (3, 2, 2)),
    "f": (4, (4, 2, 2)),
    "g": (2, (4, 2, 2)),
    "h": (2, (5, 3, 2)),
}


def test_example_1_table_1_seq_and_ack_fields_as_the_senders_compute_them() -> None:
    example = Example()
    example.run_example_1_until_h()
    for name, (seq, ack) in TABLE_1.items():
        message = example.msg[name]
        assert (message.seq, dict(message.ack)) == (seq, _vector(ack)), name
    assert {name: message.src for name, message in example.msg.items()} == {
        "a": "E1", "c": "E1", "e": "E1", "f": "E1", "d": "E2", "g": "E2", "b": "E3", "h": "E3",
    }  # fmt: skip


def test_example_1_when_d_is_accepted_a_is_pre_acknowledged() -> None:
    example = Example()
    actions = example.run_example_1_until_d()
    e1 = example.e1
    assert e1.req() == _vector((3, 2, 2))
    assert e1.al() == _matrix([[2, 3, 2], [1, 1, 1], [1, 2, 1]])  # AL_i2 := d.ACK
    assert e1.min_al("E1") == 2
    # a.SEQ (1) < minAL_1 (2): a is pre-acknowledged; E1 frees it from its send log
    assert actions == [Freed(example.msg["a"])]
    assert _names(e1.prl(), example.names) == ["a"]  # Fig. 6 (a)
    assert _names(e1.rrl("E1"), example.names) == ["c"]
    assert _names(e1.rrl("E2"), example.names) == ["d"]
    assert _names(e1.rrl("E3"), example.names) == ["b"]
    assert e1.pal() == _matrix([[1, 1, 1], [1, 1, 1], [1, 1, 1]])  # PAL_k1 := a.ACK_k = 1


def test_example_1_when_h_is_accepted_b_c_d_e_are_pre_acknowledged_in_cpi_order() -> None:
    example = Example()
    actions = example.run_example_1_until_h()
    e1, msg = example.e1, example.msg
    assert e1.req() == _vector((5, 3, 3))
    assert e1.al() == _matrix([[4, 4, 5], [2, 2, 3], [2, 2, 2]])
    # pre-ack procedure, j = 1..3: c, e (E1), then d (E2), then b (E3) inserted by CPI between c
    # and d; the PAL update makes minPAL_1 = 2, so a (already in PRL) enters ARL at once. The seed
    # lists a among the messages acknowledged in Example 2: it runs the ack procedure later.
    assert actions == [Freed(msg["c"]), Freed(msg["e"]), Deliver(msg["a"])]
    assert _names(e1.prl(), example.names) == ["c", "b", "d", "e"]  # PRL order a, c, b, d, e
    assert e1.pal() == _matrix([[3, 3, 2], [2, 1, 1], [2, 2, 1]])  # e.ACK, d.ACK, b.ACK
    assert _names(e1.rrl("E1"), example.names) == ["f"]
    assert _names(e1.rrl("E2"), example.names) == ["g"]
    assert _names(e1.rrl("E3"), example.names) == ["h"]


def test_theorem_1_relations_of_example_1() -> None:
    example = Example()
    example.run_example_1_until_h()
    msg = example.msg
    assert precedes(msg["a"], msg["c"]) and precedes(msg["c"], msg["e"])  # same source
    assert precedes(msg["c"], msg["d"])  # c.SEQ < d.ACK_1
    assert precedes(msg["d"], msg["e"])  # d.SEQ < e.ACK_2
    assert precedes(msg["b"], msg["d"])  # b.SEQ < d.ACK_3
    assert not precedes(msg["b"], msg["c"]) and not precedes(msg["c"], msg["b"])  # b || c
    assert not precedes(msg["f"], msg["g"]) and not precedes(msg["g"], msg["f"])  # f || g
    assert precedes(msg["f"], msg["h"]) and precedes(msg["g"], msg["h"])


def test_example_2_when_h_is_pre_acknowledged_a_to_e_are_acknowledged() -> None:
    """f, g, h are pre-acknowledged once each entity sent one more message acknowledging them
    (i, j, k: not in Table 1, the seed does not print them); PAL is then the seed's matrix."""
    example = Example()
    example.run_example_1_until_h()
    e1, msg = example.e1, example.msg
    example.send(e1, "i")
    example.feed(example.e2, "h")
    example.send(example.e2, "j")
    example.send(example.e3, "k")  # E3 already has a..h
    for name in "ijk":
        assert (msg[name].seq, dict(msg[name].ack)) == ({"i": 5, "j": 3, "k": 3}[name], _vector((5, 3, 3)))
    after_j = example.feed(e1, "j")
    assert after_j == [Freed(msg["f"])]  # f and g pre-acknowledged, h not yet (minAL_3 = 2)
    assert _names(e1.prl(), example.names) == ["c", "b", "d", "e", "f", "g"]
    after_k = example.feed(e1, "k")  # h is pre-acknowledged: PAL_i3 := h.ACK_i
    assert e1.pal() == _matrix([[4, 4, 5], [2, 2, 3], [2, 2, 2]])
    assert (e1.min_pal("E1"), e1.min_pal("E2"), e1.min_pal("E3")) == (4, 2, 2)
    assert _names(_deliveries(after_k), example.names) == ["c", "b", "d", "e"]
    assert _names(e1.prl(), example.names) == ["f", "g", "h"]  # f || g, both before h


def test_examples_then_idle_acks_deliver_everything_everywhere_in_a_causal_order() -> None:
    example = Example()
    example.run_example_1_until_h()
    entities = {"E1": example.e1, "E2": example.e2, "E3": example.e3}
    delivered = example.delivered
    inbox: list[tuple[str, CoMessage | Ret]] = [
        (member, message) for member in entities for message in example.msg.values() if message.src != member
    ]
    now = 0.0
    for _round in range(50):
        now += 0.1
        actions_by: list[tuple[str, list[Action]]] = []
        for member, message in inbox:
            actions_by.append((member, entities[member].receive(message, now)))
        inbox = []
        for member, entity in entities.items():
            actions_by.append((member, entity.tick(now)))
        for member, actions in actions_by:
            for action in actions:
                if isinstance(action, Broadcast):
                    inbox += [(other, action.message) for other in entities if other != member]
                elif isinstance(action, SendTo):
                    inbox.append((action.member, action.message))
                elif isinstance(action, Deliver):
                    delivered[member].append(action.message)
        if not inbox and all(entity.next_deadline() is None for entity in entities.values()):
            break
    for member, messages in delivered.items():
        assert sorted(_names(messages, example.names)) == sorted(TABLE_1), member
        for later_index, later in enumerate(messages):
            assert not any(precedes(later, earlier) for earlier in messages[:later_index]), member
    assert all(entity.next_deadline() is None for entity in entities.values())  # quiet at the end


# ============================================================================ §3.3, Fig. 4
def _fig4() -> tuple[CausalGroup, CausalGroup, CausalGroup, list[CoMessage]]:
    """E_j sends g1..g4 and p (SEQ 5); E_i accepted g1..g3 (REQ_j = 4) and lost g4."""
    members = ("Ei", "Ej", "Ek")
    ei, ej, ek = (_group(member, members, window=8) for member in members)
    sent = [_sent(ej.send(f"g{seq}".encode(), now=0.0)) for seq in range(1, 6)]
    for message in sent[:3]:
        ei.receive(message, now=0.0)
    assert ei.req()["Ej"] == 4
    return ei, ej, ek, sent


def test_fig_4a_a_gap_in_seq_sends_ret_and_the_sender_resends_the_lost_message() -> None:
    ei, ej, _ek, sent = _fig4()
    p = sent[4]
    actions = ei.receive(p, now=1.0)  # failure condition (1): REQ_j (4) < p.SEQ (5)
    ret = Ret("C", "Ei", {"Ei": 1, "Ej": 4, "Ek": 1}, "Ej", 5)
    assert actions == [SendTo("Ej", ret)]
    assert ei.held() == [p]  # kept, not dropped
    assert ej.receive(ret, now=1.1) == [SendTo("Ei", sent[3])]  # r.ACK_j <= g.SEQ < r.LSEQ: g4 only
    ei.receive(sent[3], now=1.2)
    assert ei.req()["Ej"] == 6 and ei.held() == []  # g4 then the held p accepted
    assert ei.stats.rets_sent == 1 and ei.stats.held_ahead == 1


def test_fig_4b_an_ack_beyond_req_sends_ret_and_holds_the_message() -> None:
    ei, ej, ek, sent = _fig4()
    for message in sent[:4]:
        ek.receive(message, now=0.0)
    q = _sent(ek.send(b"q", now=0.5))
    assert q.ack["Ej"] == 5
    actions = ei.receive(q, now=1.0)  # failure condition (2): REQ_j (4) < q.ACK_j (5)
    ret = Ret("C", "Ei", {"Ei": 1, "Ej": 4, "Ek": 1}, "Ej", 5)
    assert actions == [SendTo("Ej", ret)]
    # q meets the acceptance condition (SEQ = REQ_k) but is held until g4 is accepted (Lemma 3)
    assert ei.req()["Ek"] == 1 and ei.held() == [q]
    assert ej.receive(ret, now=1.1) == [SendTo("Ei", sent[3])]
    ei.receive(sent[3], now=1.2)
    assert ei.req() == {"Ei": 1, "Ej": 5, "Ek": 2}


def test_ret_is_not_repeated_before_the_retransmission_timeout() -> None:
    ei, _ej, _ek, sent = _fig4()
    assert len(ei.receive(sent[4], now=1.0)) == 1
    assert ei.receive(sent[4], now=1.1) == []  # duplicate of a held message
    assert ei.stats.duplicates_dropped == 1


def test_duplicates_of_accepted_messages_are_dropped() -> None:
    ei, _ej, _ek, sent = _fig4()
    assert ei.receive(sent[0], now=1.0) == []
    assert ei.stats.duplicates_dropped == 1 and ei.req()["Ej"] == 4


def test_sender_retransmits_to_members_that_did_not_acknowledge_in_time() -> None:
    e1, e2, _e3 = (_group(member, retransmit_timeout_s=1.0) for member in MEMBERS)
    m = _sent(e1.send(b"m", now=0.0))
    e2.receive(m, now=0.1)
    e1.receive(_sent(e2.tick(now=0.2)), now=0.3)  # E2's idle ACK: E2 accepted m
    assert e1.next_deadline() == 0.35  # the idle ACK (ack_delay_s after E2's message)
    _sent(e1.tick(now=0.35))
    assert e1.next_deadline() == 1.0
    assert e1.tick(now=0.9) == []
    assert e1.tick(now=1.0) == [SendTo("E3", m)]  # E3 never acknowledged m: resent to E3 only
    # no progress for retransmit_timeout_s with undelivered data: ask everyone for anything new
    probes = e1.tick(now=1.35)
    assert probes == [
        SendTo(member, Ret("C", "E1", {"E1": 3, "E2": 2, "E3": 1}, member, None)) for member in ("E2", "E3")
    ]


# ============================================================================ §3.2 flow condition
def test_flow_condition_blocks_at_the_window_and_sends_when_pre_acknowledged() -> None:
    e1, e2, e3 = (_group(member, window=3) for member in MEMBERS)
    sent = [_sent(e1.send(f"m{index}".encode(), now=0.0)) for index in range(3)]
    assert not e1.can_send()  # SEQ (4) = minAL_1 (1) + W (3)
    assert e1.send(b"m3", now=0.0) == [] and e1.queued() == 1
    acks = []
    for other in (e2, e3):
        for message in sent:
            other.receive(message, now=0.1)
        acks.append(_sent(other.tick(now=0.2)))  # idle ACK: ACK_1 = 4
    assert e1.receive(acks[0], now=0.3) == []  # E3 not yet
    actions = e1.receive(acks[1], now=0.3)
    assert [a for a in actions if isinstance(a, Freed)] == [Freed(message) for message in sent]
    queued = _sent(actions)
    assert (queued.seq, queued.data) == (4, b"m3") and e1.queued() == 0


def test_flow_window_is_limited_by_the_smallest_buffer() -> None:
    e1 = _group("E1", window=8, max_message_bytes=100, buffer_bytes=1500)
    assert e1.flow_window() == 5  # min(W, minBUF / (H n)) = min(8, 1500 / 300)
    e2 = _group("E2", window=8, max_message_bytes=100, buffer_bytes=1500)
    first, second = (_sent(e2.send(data, now=0.0)) for data in (b"x", b"y"))
    assert (first.buf, second.buf) == (1500, 1400)  # x is held in E2's logs when y is sent
    e1.receive(first, now=0.1)
    e1.receive(second, now=0.1)
    assert e1.flow_window() == 4


# ============================================================================ §3.4 / §3.5 conditions
def test_pre_ack_needs_every_member_and_ack_needs_every_pre_ack() -> None:
    """The sender's own column AL_k1 comes from its own last message (Table 1: ACK_1 = SEQ in
    E1's messages), so E1 pre-acknowledges m after its next message and acknowledges m after
    the one after that, once that one is pre-acknowledged (PAL_11 := its ACK_1)."""
    e1, e2, e3 = (_group(member) for member in MEMBERS)
    m = _sent(e1.send(b"m", now=0.0))
    for other in (e2, e3):
        other.receive(m, now=0.0)
    n2, n3 = _sent(e2.tick(now=0.1)), _sent(e3.tick(now=0.1))  # accepted m: ACK_1 = 2
    assert e1.receive(n2, now=0.2) == [] and e1.receive(n3, now=0.2) == []
    assert e1.min_al("E1") == 1  # AL_11 = m.ACK_1 = 1
    actions = e1.tick(now=0.3)  # idle ACK r1 (ACK_1 = 2): m.SEQ < minAL_1 = 2
    r1 = _sent(actions)
    assert actions[1:] == [Freed(m)] and e1.prl() == [m] and e1.min_pal("E1") == 1
    for entity, peer in ((e2, n3), (e3, n2)):
        entity.receive(peer, now=0.3)
        entity.receive(r1, now=0.3)
    r2, r3 = _sent(e2.tick(now=0.4)), _sent(e3.tick(now=0.4))
    assert e1.receive(r2, now=0.5) == []
    assert e1.receive(r3, now=0.5) == []  # n2, n3 pre-acknowledged, PAL_11 still m.ACK_1 = 1
    assert e1.pal()["E1"] == {"E1": 1, "E2": 2, "E3": 2}
    final = e1.tick(now=0.6)  # s1 makes AL_11 = 3 > r1.SEQ: r1 pre-acknowledged, PAL_11 := 2
    assert final[1:] == [Freed(r1), Deliver(m)] and e1.min_pal("E1") == 2


# ============================================================================ membership
def test_removed_member_stops_constraining_pre_ack_and_ack() -> None:
    e1, e2 = _group("E1"), _group("E2")
    m = _sent(e1.send(b"m", now=0.0))
    e2.receive(m, now=0.0)
    e1.receive(_sent(e2.tick(now=0.1)), now=0.2)
    e1.tick(now=0.3)  # E1's idle ACK: AL_11 = 2
    assert e1.prl() == [] and e1.min_al("E1") == 1  # E3 never answers
    actions = e1.remove_member("E3", now=0.3)
    assert actions == [Freed(m)] and e1.members() == ["E1", "E2"]
    with pytest.raises(ValueError):
        e1.add_member("E3")


def test_added_member_joins_the_flow() -> None:
    e1, e2 = _group("E1", ("E1", "E2")), _group("E2", ("E1", "E2"))
    old = _sent(e1.send(b"old", now=0.0))
    e2.receive(old, now=0.0)
    for entity in (e1, e2):
        entity.add_member("E3", joined_at={"E1": 2, "E2": 1})
    e3 = CausalGroup("E3", ("E1", "E2", "E3"), cid="C", start_seqs={"E1": 2, "E2": 1})
    new = _sent(e1.send(b"new", now=1.0))
    assert new.ack == {"E1": 2, "E2": 1, "E3": 1}
    assert e3.receive(new, now=1.1) == [] and e3.req()["E1"] == 3  # accepted, not owed "old"
