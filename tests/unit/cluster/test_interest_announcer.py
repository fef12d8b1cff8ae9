"""Filter propagation is repeated until acknowledged (``InterestAnnouncer``; seed 311 of
``python -m simulation --conversation --loss 0.05 --faults crash``).

There, the ``ClassInterest`` telling the responder's broker that the observer's broker subscribes
``=plant`` was lost, and the overlay's multicast did not reach the observer's new subscriber node
yet (its Skip Graph run was still forming): the first answers published after the observer's
SUBACK were confirmed without it and never reached it. An announcement is now repeated to each
reachable peer every ``retransmit_s`` until that peer answers its reference.
"""

from __future__ import annotations

from dataclasses import replace

from broker.cluster.interest_table import InterestAnnouncer
from broker.cluster.messages import ClassInterest


def _unversioned(interest: ClassInterest) -> ClassInterest:
    """What an announcement says, without its (epoch, version) (``test_interest_order``)."""
    return replace(interest, epoch=0, version=0)


def test_a_lost_announcement_is_repeated_until_the_peer_acknowledges_it() -> None:
    announcer = InterestAnnouncer(retransmit_s=1.0)
    [(peer, first, interest)] = announcer.announce(ClassInterest(("=plant",)), ["b:1"], now=0.0)
    assert (peer, _unversioned(interest)) == ("b:1", ClassInterest(("=plant",)))
    assert announcer.pending("b:1", "=plant")
    assert announcer.next_deadline() == 1.0
    assert announcer.tick(now=0.5) == []
    # no answer: announced again, under a new reference
    [(peer, again, interest)] = announcer.tick(now=1.0)
    assert (peer, _unversioned(interest)) == ("b:1", ClassInterest(("=plant",))) and again != first
    assert announcer.next_deadline() == 2.0
    announcer.acked("b:1", again)
    assert not announcer.pending("b:1", "=plant")
    assert announcer.next_deadline() is None and announcer.tick(now=5.0) == []


def test_an_older_answer_does_not_settle_a_newer_change() -> None:
    announcer = InterestAnnouncer(retransmit_s=1.0)
    [(_peer, joined, _interest)] = announcer.announce(ClassInterest(("=a",)), ["b:1"], now=0.0)
    announcer.announce(ClassInterest(("=b",)), ["b:1"], now=0.1)
    [(_peer, left, _interest)] = announcer.announce(ClassInterest((), ("=a",)), ["b:1"], now=0.2)
    announcer.acked("b:1", joined)  # answers the join of "=a" only: "=b" and the leave are pending
    assert announcer.pending("b:1", "=b")
    [(_peer, _ref, resent)] = announcer.tick(now=1.2)
    assert _unversioned(resent) == ClassInterest(("=b",), ("=a",))
    announcer.acked("b:1", left)  # an older answer: settles nothing the resend carried
    assert announcer.pending("b:1", "=b")


def test_a_peer_reported_down_is_forgotten_and_a_full_list_replaces_pending_changes() -> None:
    announcer = InterestAnnouncer(retransmit_s=1.0)
    announcer.announce(ClassInterest(("=a",)), ["b:1", "c:1"], now=0.0)
    announcer.forget("c:1")  # it gets the whole list when it is back
    assert not announcer.pending("c:1", "=a")
    assert [peer for peer, _ref, _interest in announcer.tick(now=1.0)] == ["b:1"]
    full = ClassInterest(("=a", "=b"), (), True)
    announcer.announce(full, ["b:1"], now=1.5)
    assert announcer.pending("b:1", "=b")
    [(_peer, again, resent)] = announcer.tick(now=2.5)
    assert _unversioned(resent) == full
    announcer.acked("b:1", again)
    assert not announcer.pending("b:1", "=a") and announcer.next_deadline() is None
