"""A persistent session's SUBACK with ``cluster.replicas`` = 2 (broker/cluster/engine_replication.py,
``ReplicatedClusterPort.subscriptions_ready`` with the client id): it waits until the session's
state with the subscription is on 2 brokers (seed 004's acknowledgement stage), at most
``cluster.subscribe_wait_ms``, and not at all while fewer than 2 brokers are live. Without it a
disk loss of the home right after the SUBACK left the client a session without the subscription
(seed 145 of the replication sweep, tests/sim/replication)."""

from __future__ import annotations

from broker.cluster.engine_replication import ReplicatedClusterPort
from broker.cluster.subscribe_waits import SessionCopyWaits
from broker.core.ports import Completion
from tests.unit.cluster.test_engine_replication import _deliver
from tests.unit.cluster.test_engine_replication_sessions import _pair, _snapshot


def test_the_suback_waits_until_the_holder_accepted_the_session_with_its_subscription() -> None:
    scheduler, home_engine, home, holder_engine, holder = _pair()
    home_engine.broker.sessions["dev"] = _snapshot("dev", queued=0)
    home.sessions_committed(["dev"])  # the SUBSCRIBE's commit
    copied = home.session_copied("dev")
    assert copied is not None and not copied.done(), "the SUBACK did not wait for the copy"
    # given to the core (and sent) at once, not at the next session flush (up to 50 ms later)
    assert home.gauges()["under_replicated_sessions"] == 1
    _deliver(scheduler, home_engine, home, holder_engine, holder)  # type: ignore[arg-type]
    assert copied.done() and copied.result() is True
    assert [snapshot.subscriptions for _key, snapshot, _pos in holder.store.load_sessions()] == [
        _snapshot("dev", queued=0).subscriptions
    ]
    # durable on 2 already: the next SUBACK of an unchanged session does not wait
    assert home.session_copied("dev") is None


def test_the_suback_does_not_wait_while_fewer_than_n_brokers_are_live() -> None:
    _scheduler, home_engine, home, _holder_engine, _holder = _pair()
    home.on_peer_down("b:1")
    home_engine.broker.sessions["dev"] = _snapshot("dev", queued=0)
    home.sessions_committed(["dev"])
    assert home.session_copied("dev") is None
    # it left without its copy: counted (skipmq_cluster_replication_session_acks_uncopied_total)
    assert home.acks_uncopied == {"timed_out": 0, "fewer_than_n_live": 1, "stopping": 0}
    assert home.copy_waits_total == 0


def test_a_holder_lost_meanwhile_releases_the_suback() -> None:
    scheduler, home_engine, home, _holder_engine, _holder = _pair()
    home_engine.broker.sessions["dev"] = _snapshot("dev", queued=0)
    home.sessions_committed(["dev"])
    copied = home.session_copied("dev")
    assert copied is not None
    scheduler.run_later()
    assert not copied.done()
    home.on_peer_down("b:1")  # no holder left: it cannot be on 2 until one is back
    assert copied.done() and copied.result() is True
    assert home.copy_waits_total == 1 and home.acks_uncopied["fewer_than_n_live"] == 1


def test_the_wait_is_bounded_by_subscribe_wait_ms() -> None:
    scheduler, home_engine, home, _holder_engine, _holder = _pair()
    home_engine.broker.sessions["dev"] = _snapshot("dev", queued=0)
    home.sessions_committed(["dev"])
    late = home.session_copied("dev")
    assert late is not None
    scheduler.run_later()  # the flush, and the wait's timer before its deadline
    assert not late.done()
    scheduler.now += home_engine.cluster.subscribe_wait_ms / 1000.0  # the holder never answers
    home._check_suback_waits()  # the wait's timer fires
    assert late.done() and late.result() is False and home.suback_waits_timed_out == 1
    assert home.acks_uncopied == {"timed_out": 1, "fewer_than_n_live": 0, "stopping": 0}


def test_the_port_holds_the_suback_of_a_persistent_session_only() -> None:
    scheduler, home_engine, home, holder_engine, holder = _pair()
    home_engine.subscriptions_ready = lambda topic_filters, client_id=None: None  # type: ignore[attr-defined]
    port = ReplicatedClusterPort(home_engine, home)  # type: ignore[arg-type]
    home_engine.broker.sessions["dev"] = _snapshot("dev", queued=0)
    home.sessions_committed(["dev"])
    assert port.subscriptions_ready([("t/#", None)]) is None  # a clean session: no copy to wait for
    held = port.subscriptions_ready([("t/#", None)], "dev")
    assert isinstance(held, Completion) and not held.done()
    scheduler.run_later()
    _deliver(scheduler, home_engine, home, holder_engine, holder)  # type: ignore[arg-type]
    assert held.done()
    assert home.acks_uncopied == {"timed_out": 0, "fewer_than_n_live": 0, "stopping": 0}


def test_the_port_holds_an_unsuback_with_no_filters_for_the_sessions_copy() -> None:
    """``handle_unsubscribe`` asks with no topic filters: only the session's copy is waited for."""
    scheduler, home_engine, home, holder_engine, holder = _pair()
    home_engine.subscriptions_ready = lambda topic_filters, client_id=None: None  # type: ignore[attr-defined]
    port = ReplicatedClusterPort(home_engine, home)  # type: ignore[arg-type]
    home_engine.broker.sessions["dev"] = _snapshot("dev", queued=0)
    home.sessions_committed(["dev"])
    held = port.subscriptions_ready([], "dev")
    assert isinstance(held, Completion) and not held.done()
    _deliver(scheduler, home_engine, home, holder_engine, holder)  # type: ignore[arg-type]
    assert held.done() and held.result() is True


def test_a_stopping_broker_releases_its_waits_counted() -> None:
    _scheduler, home_engine, home, _holder_engine, _holder = _pair()
    home_engine.broker.sessions["dev"] = _snapshot("dev", queued=0)
    home.sessions_committed(["dev"])
    copied = home.session_copied("dev")
    assert copied is not None and not copied.done()
    home.stop()
    assert copied.done() and copied.result() is False
    assert home.acks_uncopied == {"timed_out": 0, "fewer_than_n_live": 0, "stopping": 1}


def test_session_copy_waits_number_pending_states_and_time_out() -> None:
    waits = SessionCopyWaits(timeout_s=0.5)
    first = waits.add("a", None, now=10.0)  # not numbered yet: never finished by a poll
    second = waits.add("b", 3, now=10.1)
    assert waits.poll(lambda _c, _v: True) == [(second, True)]
    waits.numbered({"a": 7}.get)  # type: ignore[arg-type]
    assert waits.poll(lambda client, version: version <= 6) == []
    assert waits.tick(10.4) == [] and waits.tick(10.5) == [(first, False)]
    gone = waits.add("c", None, now=11.0)
    waits.numbered(lambda _c: 0)  # not a replicated session: nothing to wait for
    assert waits.poll(lambda _c, _v: False) == [(gone, True)] and not waits.waiting()
