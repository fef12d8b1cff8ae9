"""The federation router replays seed 000 §3.7's examples: Table 1's counters, Fig. 16's TTL,
Fig. 17's leave, Fig. 18's crash recovery by n-hop discovery, and the §3.7.1 link rules."""

from __future__ import annotations

import dataclasses

import pytest

from broker.federation.keys import RoutingMode
from broker.federation.messages import (
    Event,
    LinkAccepted,
    LinkRefused,
    LinkRequest,
    Note,
    ProbeReply,
    Register,
    Send,
)
from broker.federation.router import FederationRouter, LinkError, PlaceSettings
from simulation.federation import FederationNet

PLACE = PlaceSettings("factory", description="plant telemetry", probe_hops=3)


def net_of(
    parents: dict[str, str], settings: PlaceSettings = PLACE, extra: tuple[str, ...] = ()
) -> FederationNet:
    net = FederationNet(settings)
    for name in sorted(set(parents) | set(parents.values()) | set(extra)):
        net.add(name)
    net.build_tree(parents)
    return net


def counters(net: FederationNet, key: str) -> dict[str, int]:
    """Table 1's notation: SI-R(i,j) -> counter of ``key`` at router i toward link j."""
    table = {}
    for name, router in net.routers.items():
        for link in router.links():
            table[f"{name},{link}"] = router.counter(link, key)
    return {cell: value for cell, value in table.items() if value}


# ---------------------------------------------------------------- §3.7.4 Table 1
def test_table1_counters_and_only_transitions_reach_the_wire() -> None:
    # Fig. 22's shape as §3.7.4 describes it: 5 - 3 - 2 - {1, 4}
    net = net_of({"3": "2", "1": "2", "4": "2", "5": "3"})
    key = net.routers["3"].key_of("temp/#")
    registers_before = net.sent["Register"]

    net.do("3", net.routers["3"].subscribe("temp/#"))  # SE3+
    assert counters(net, key) == {"3,2": 1, "2,1": 1, "2,4": 1, "3,5": 1}
    after_se3 = net.sent["Register"]
    assert after_se3 - registers_before == 4

    net.do("5", net.routers["5"].subscribe("temp/#"))  # SE5+: R3,2 only counts 1 -> 2
    # (the links are two-way, §3.7.4's note: 3 also registers its own SE3 toward 5)
    assert counters(net, key) == {"3,2": 2, "2,1": 1, "2,4": 1, "5,3": 1, "3,5": 1}
    assert net.sent["Register"] - after_se3 == 1  # only SI-R5,3's 0->1

    net.do("3", net.routers["3"].unsubscribe("temp/#"))  # SE3-: 2 -> 1, nothing sent upstream
    assert counters(net, key) == {"3,2": 1, "2,1": 1, "2,4": 1, "5,3": 1}
    assert net.sent["Unregister"] == 1  # 3 stops registering toward 5 (5's own filter remains)

    net.do("5", net.routers["5"].unsubscribe("temp/#"))  # SE5-: 1 -> 0 everywhere
    assert counters(net, key) == {}
    assert net.sent["Unregister"] == 1 + 4


def test_events_flow_back_along_the_paths_and_never_back() -> None:
    net = net_of({"3": "2", "1": "2", "4": "2", "5": "3"})
    net.do("5", net.routers["5"].subscribe("temp/+"))
    net.do("1", net.routers["1"].publish(Event("temp/a", b"21.5", 1)))
    assert [e.payload for e in net.delivered["5"]] == [b"21.5"]
    assert all(not net.delivered[n] for n in ("1", "2", "3", "4"))
    assert net.sent["Event"] == 3  # 1->2->3->5; nothing to 4 and nothing back to 1
    net.do("5", net.routers["5"].publish(Event("temp/a", b"x")))
    assert net.sent["Event"] == 3  # 5's own event does not come back to it
    net.do("1", net.routers["1"].publish(Event("humidity/a", b"40")))
    assert net.sent["Event"] == 3


def test_a_clustered_site_never_sends_its_own_events_out_and_back() -> None:
    """Site S is a cluster of a1 and a2, both children of r (cloud c above). A filter only inside
    S is registered toward no broker of S, so S's events never leave it; a subscriber outside
    draws S's events out, and they do not come back in; an outside subscriber behind a broker of S
    (x under a2) still gets them through a2, which does not deliver them a second time."""
    net = FederationNet(PLACE)
    site = dataclasses.replace(PLACE, site="S")
    net.add("c")
    net.add("r")
    net.add("a1", site)
    net.add("a2", site)
    net.add("x")
    net.build_tree({"r": "c", "a1": "r", "a2": "r", "x": "a2"})
    key = net.routers["a2"].key_of("plant/#")
    net.do("a2", net.routers["a2"].subscribe("plant/#"))
    assert key in net.routers["r"].received_from("a2")
    assert net.routers["r"].registered_toward("a1") == {}  # the same site: the cluster serves it
    assert key in net.routers["c"].received_from("r")
    before = net.sent["Event"]
    net.do("a1", net.routers["a1"].publish(Event("plant/t", b"in S", 1)))
    assert net.sent["Event"] == before  # never leaves the site
    assert not any(net.delivered.values())

    net.do("c", net.routers["c"].subscribe("plant/#"))  # an outside subscriber
    assert key in net.routers["a1"].received_from("r")
    net.do("a1", net.routers["a1"].publish(Event("plant/t", b"out", 1)))
    assert [e.payload for e in net.delivered["c"]] == [b"out"]
    assert net.routers["a2"].stats.events_in == 0  # not back into the site
    assert net.sent["Event"] == before + 2  # a1 -> r -> c

    net.do("x", net.routers["x"].subscribe("plant/#"))  # behind a2, outside S
    assert net.routers["a2"].registered_toward("r")[key] >= 1
    net.do("a1", net.routers["a1"].publish(Event("plant/t", b"to x", 1)))
    assert [e.payload for e in net.delivered["x"]] == [b"to x"]
    assert net.delivered["a2"] == []  # a2 carries it to x; its cluster already delivered it
    net.do("c", net.routers["c"].unsubscribe("plant/#"))
    net.do("x", net.routers["x"].unsubscribe("plant/#"))
    assert net.routers["r"].registered_toward("a1") == {}


def test_anonymity_registrations_carry_no_origin() -> None:
    # own_site says only whether every source lies in the sender's own site, which its link
    # already names (clustered sites: test_a_clustered_site_never_sends_its_own_events_out_and_back)
    assert [f.name for f in dataclasses.fields(Register)] == ["key", "ttl", "own_site"]
    a = net_of({"3": "2", "1": "2", "4": "2"})
    a.do("3", a.routers["3"].subscribe("temp/#"))
    b = net_of({"3": "2", "1": "2", "4": "2"})
    b.do("4", b.routers["4"].subscribe("temp/#"))
    # what router 1 holds is the same whether site 3 or site 4 subscribed (the TTL tells only
    # how many more hops the filter may travel)
    assert a.routers["1"].received_from("2") == b.routers["1"].received_from("2")


# ---------------------------------------------------------------- §3.7.2 Fig. 16 TTL
FIG16 = {
    "1": "2",
    "3": "2",
    "4": "2",
    "5": "4",
    "6": "5",
    "7": "5",
    "9": "5",
    "11": "9",
    "10": "11",
    "8": "10",
}


def _holders(net: FederationNet, key: str) -> set[str]:
    """The routers holding an event path of ``key``: registered on them by a neighbour or local."""
    return {
        name
        for name, router in net.routers.items()
        if key in router.local_keys() or any(key in router.received_from(link) for link in router.links())
    }


def test_fig16_ttl_limits_how_far_a_filter_travels() -> None:
    net = net_of(FIG16, dataclasses.replace(PLACE, ttl=2))
    key = net.routers["2"].key_of("stock/#")
    net.do("2", net.routers["2"].subscribe("stock/#"))  # (a) TTL 2: 1, 3 and 4 only
    assert _holders(net, key) == {"1", "2", "3", "4"}
    net.do("11", net.routers["11"].subscribe("stock/#"))  # 10 and 9
    assert _holders(net, key) == {"1", "2", "3", "4", "9", "10", "11"}
    net.do("4", net.routers["4"].publish(Event("stock/x", b"")))
    assert [n for n, got in net.delivered.items() if got] == ["2"]  # 2 and 11 share nothing
    net.do("5", net.routers["5"].subscribe("stock/#"))  # (b) -> (c): everyone but 8
    assert _holders(net, key) == set(net.routers) - {"8"}
    # multiplicity 2 on 4 (the numbers on Fig. 16's paths): registered by 2 and by 5
    assert net.routers["4"].received_from("2") == {key: 1} and net.routers["4"].received_from("5") == {key: 1}
    assert net.routers["4"].counter("2", key) == 0  # TTL spent: 4 passes neither on


def test_ttl_one_keeps_a_filter_in_its_site() -> None:
    net = net_of({"b": "a"}, dataclasses.replace(PLACE, ttl=1))
    net.do("b", net.routers["b"].subscribe("x"))
    assert net.sent["Register"] == 0
    net.do("a", net.routers["a"].publish(Event("x", b"")))
    assert net.delivered["b"] == []


def test_ttl_update_when_a_longer_reaching_source_appears() -> None:
    net = net_of({"b": "a", "c": "b"}, dataclasses.replace(PLACE, ttl=2))
    net.do("c", net.routers["c"].subscribe("x"))
    key = net.routers["c"].key_of("x")
    assert net.routers["b"].received_from("c") == {key: 1} and net.routers["a"].received_from("b") == {}
    net.do("c", net.routers["c"].subscribe("x", ttl=3))  # reaches a now: b passes it on with 1
    assert net.routers["b"].received_from("c") == {key: 2} and net.routers["a"].received_from("b") == {key: 1}
    net.do("c", net.routers["c"].unsubscribe("x", ttl=3))
    assert net.routers["b"].received_from("c") == {key: 1} and net.routers["a"].received_from("b") == {}


# ---------------------------------------------------------------- §3.7.2 routing modes
@pytest.mark.parametrize(
    ("mode", "registers", "wasted"), [(RoutingMode.FULL_FILTER, 4, 0), (RoutingMode.TYPE_ONLY, 1, 1)]
)
def test_routing_modes_trade_setup_messages_for_wasted_events(
    mode: RoutingMode, registers: int, wasted: int
) -> None:
    net = net_of({"edge": "cloud"}, dataclasses.replace(PLACE, mode=mode))
    for topic_filter in ("plant/a", "plant/b", "plant/c", "plant/d"):
        net.do("edge", net.routers["edge"].subscribe(topic_filter))
    assert net.sent["Register"] == registers
    for topic in ("plant/a", "plant/z"):
        net.do("cloud", net.routers["cloud"].publish(Event(topic, b"")))
    assert [e.topic for e in net.delivered["edge"]] == ["plant/a"] + (["plant/z"] if wasted else [])
    assert net.routers["edge"].stats.events_delivered == 1 + wasted  # the broker's exact match drops plant/z


# ---------------------------------------------------------------- §3.7.1 establishment
def test_accepting_side_returns_place_mode_description_and_topology() -> None:
    net = net_of({"regional": "cloud"})
    edge = net.add("edge")
    actions = edge.set_upstream("regional", 0.0)
    assert actions == [Send("regional", LinkRequest("factory", "edge"))]
    answer = net.routers["regional"].on_message("edge", actions[0].message, 0.0)  # type: ignore[attr-defined]
    accepted = [a.message for a in answer if isinstance(a, Send) and isinstance(a.message, LinkAccepted)]
    assert accepted == [LinkAccepted("factory", "full_filter", "plant telemetry", ("cloud", "regional"))]


def test_a_second_request_in_one_place_is_refused_with_a_reason() -> None:
    net = net_of({"edge": "regional"}, extra=("cloud",))
    with pytest.raises(LinkError, match="already holds its link of event place 'factory'"):
        net.routers["edge"].request_link("cloud", 0.0)
    fresh = FederationRouter("lone", PLACE)
    fresh.request_link("cloud", 0.0)
    with pytest.raises(LinkError, match="already requested"):
        fresh.request_link("regional", 0.0)


@pytest.mark.parametrize(
    ("requester", "link_request", "reason"),
    [
        ("edge", LinkRequest("factory", "edge"), "already holds a shared link"),
        ("cloud", LinkRequest("factory", "cloud"), "upstream of edge: the link would close a loop"),
        ("other", LinkRequest("hospital", "other"), "unknown event place 'hospital'"),
    ],
)
def test_the_accepting_side_refuses_with_a_reason(
    requester: str, link_request: LinkRequest, reason: str
) -> None:
    net = net_of({"edge": "regional", "regional": "cloud", "leaf": "edge"})
    target = "regional" if requester == "edge" else "edge"
    answer = net.routers[target].on_message(requester, link_request, 0.0)
    refusals = [a.message for a in answer if isinstance(a, Send) and isinstance(a.message, LinkRefused)]
    assert len(refusals) == 1 and reason in refusals[0].reason


def test_one_way_link_publishes_up_and_receives_nothing() -> None:
    net = net_of({}, extra=("cloud", "sensor"))
    net.do("sensor", net.routers["sensor"].set_upstream("cloud", 0.0, one_way=True))
    net.do("sensor", net.routers["sensor"].subscribe("cmd/#"))
    net.do("cloud", net.routers["cloud"].subscribe("data/#"))
    net.do("sensor", net.routers["sensor"].publish(Event("data/t", b"1")))
    net.do("cloud", net.routers["cloud"].publish(Event("cmd/reboot", b"")))
    assert [e.topic for e in net.delivered["cloud"]] == ["data/t"]
    assert net.delivered["sensor"] == []


# ---------------------------------------------------------------- §3.7.3 leave and crash
def test_fig17_leave_hands_the_children_the_parent_and_filters_follow() -> None:
    net = net_of({"2": "1", "3": "2", "4": "2"})
    net.do("3", net.routers["3"].subscribe("a/#"))
    net.do("2", net.routers["2"].leave())
    assert net.routers["1"].children == {"3", "4"}
    assert net.routers["3"].parent == "1" and net.routers["4"].parent == "1"
    assert net.routers["3"].topology == ("1", "3")
    net.do("4", net.routers["4"].publish(Event("a/b", b"after leave")))
    assert [e.payload for e in net.delivered["3"]] == [b"after leave"]


def test_a_leaving_root_hands_its_children_one_of_them() -> None:
    net = net_of({"a": "root", "b": "root", "c": "root"})
    net.do("b", net.routers["b"].subscribe("t"))
    net.do("root", net.routers["root"].leave())
    assert net.routers["a"].parent is None and net.routers["a"].children == {"b", "c"}
    net.do("c", net.routers["c"].publish(Event("t", b"")))
    assert len(net.delivered["b"]) == 1


def test_fig18_crash_children_relink_to_a_replacement_found_by_upstream_discovery() -> None:
    net = net_of({"2": "1", "3": "2", "4": "2", "5": "3", "6": "3"})
    assert net.routers["6"].upstream_known() == {"3": 1, "2": 2, "1": 3}  # hop attribute UPSTREAM, n = 3
    assert net.routers["6"]._discovery.siblings() == {"5"}  # hop attribute ALL, n = 2
    assert net.routers["4"].upstream_known() == {"2": 1, "1": 2}  # downstream entities are not probed
    net.do("6", net.routers["6"].subscribe("alarm/#"))
    net.do("1", net.routers["1"].subscribe("alarm/#"))
    net.crash("3")
    assert net.routers["6"].parent == "2" and net.routers["5"].parent == "2"
    assert net.routers["2"].children == {"4", "5", "6"}
    key = net.routers["6"].key_of("alarm/#")
    assert net.routers["2"].received_from("6") == {key: PLACE.ttl - 1}  # re-registered after the re-link
    net.do("4", net.routers["4"].publish(Event("alarm/fire", b"!")))
    assert len(net.delivered["6"]) == 1 and len(net.delivered["1"]) == 1
    net.do("6", net.routers["6"].publish(Event("alarm/smoke", b"")))
    assert [e.topic for e in net.delivered["1"]] == ["alarm/fire", "alarm/smoke"]


def test_unlinked_router_retries_its_upstream_until_it_is_there() -> None:
    net = FederationNet(PLACE)
    edge = net.add("edge")
    net.do("edge", edge.set_upstream("cloud", net.now))
    assert edge.parent is None
    net.add("cloud")
    net.tick(PLACE.retry_interval_s)
    assert edge.parent == "cloud"


def test_an_event_of_a_routers_own_site_is_forwarded_but_not_delivered_again() -> None:
    """Two brokers of one cluster (site "edge") link separately: the cluster delivers in-site."""
    net = FederationNet(PLACE)
    net.add("regional")
    for name in ("e1", "e2"):
        net.add(name, dataclasses.replace(PLACE, site="edge"))
    net.add("other")
    net.build_tree({"e1": "regional", "e2": "regional", "other": "regional"})
    for name in ("e2", "other"):
        net.do(name, net.routers[name].subscribe("x/#"))
    net.do("e1", net.routers["e1"].publish(Event("x/1", b"")))
    assert net.delivered["e2"] == [] and [e.site for e in net.delivered["other"]] == ["edge"]
    net.do("other", net.routers["other"].publish(Event("x/2", b"")))
    assert [e.topic for e in net.delivered["e2"]] == ["x/2"]


def test_a_requester_configured_for_another_routing_mode_drops_the_link_with_a_reason() -> None:
    net = FederationNet(PLACE)
    net.add("cloud")
    edge = net.add("edge", dataclasses.replace(PLACE, mode=RoutingMode.TYPE_ONLY))
    net.do("edge", edge.set_upstream("cloud", net.now))
    assert edge.parent is None and net.routers["cloud"].children == set()
    rejected = [
        note for name, note in net.notes if name == "edge" and note.event == "federation_link_rejected"
    ]
    assert rejected and "routes full_filter, this broker type_only" in dict(rejected[0].fields)["reason"]


def test_when_the_root_crashes_its_children_elect_the_smallest_of_them_as_the_new_root() -> None:
    net = net_of({"c": "root", "a": "root", "b": "root", "leaf": "b"})
    net.tick(PLACE.probe_interval_s)  # the next discovery round: c, linked first, learns a and b
    assert net.routers["c"]._discovery.siblings() == {"a", "b"}
    net.do("leaf", net.routers["leaf"].subscribe("x/#"))
    net.crash("root")
    assert net.routers["a"].parent is None and net.routers["a"].children == {"b", "c"}
    assert net.routers["leaf"].topology == ("a", "b", "leaf")
    assert any(n.event == "federation_new_root" for name, n in net.notes if name == "a")
    net.do("c", net.routers["c"].publish(Event("x/1", b"")))
    assert [e.topic for e in net.delivered["leaf"]] == ["x/1"]


def test_a_crash_half_way_through_a_discovery_round_keeps_the_ancestors_of_the_round_before() -> None:
    """The process test's race (CI, stop 25): the parent answered the new UPSTREAM round and
    died before the grandparent's answer came back through it. The child still knew the
    grandparent from the round before and re-links there; it does not take the grandparent
    for a sibling and elect itself a root."""
    net = net_of({"regional": "cloud", "a": "regional", "b": "regional"})
    child = net.routers["b"]  # named before "cloud": an election would not pick the cloud
    assert child.upstream_known() == {"regional": 1, "cloud": 2}
    net.now += PLACE.probe_interval_s
    net.apply("b", child.tick(net.now))  # the next round's probes
    new_round = child._discovery.round

    def parents_answer_queued() -> bool:
        return any(
            isinstance(message, ProbeReply) and message.round == new_round and message.responder == "regional"
            for _source, target, message in net._queue
            if target == "b"
        )

    while not parents_answer_queued():
        assert net.step(1) == 1, "the parent never answered the new round"
    while parents_answer_queued():  # until it arrives; the grandparent's is still on its way
        net.step(1)
    net.crash("regional", drop_outgoing=True)  # the grandparent's answer dies with it
    assert child.parent == "cloud" and net.routers["a"].parent == "cloud"
    assert "federation_new_root" not in [note.event for _name, note in net.notes]


# ---------------------------------------------------------------- custody outcomes
def test_events_dropped_at_the_end_of_the_grace_are_given_up_not_completed() -> None:
    """A subscriber site crashes for good: the QoS 1 events that matched its ghost wait for the
    grace period, then are dropped - counted ``given_up``, not ``completed``; an event delivered
    before the crash is ``completed``."""
    net = net_of({"sub": "pub"})
    net.do("sub", net.routers["sub"].subscribe("t/#"))
    net.do("pub", net.routers["pub"].publish(Event("t/1", b"delivered", 1)))
    assert [e.payload for e in net.delivered["sub"]] == [b"delivered"]
    stats = net.routers["pub"].custody_stats()
    assert (stats["completed"], stats["given_up"]) == (1, 0)
    net.crash("sub")
    for n in range(3):
        net.do("pub", net.routers["pub"].publish(Event(f"t/{n}", b"lost", 1)))
    assert net.routers["pub"].custody_stats()["in_custody"] == 3  # held for the ghost's grace
    net.tick(PLACE.custody_grace_s + 1)
    stats = net.routers["pub"].custody_stats()
    assert stats["in_custody"] == 0
    assert (stats["completed"], stats["given_up"]) == (1, 3), stats
    assert ("pub", Note("federation_custody_given_up", (("events", "3"),))) in net.notes
