"""A pull session asked for at a broker that is not its home (2-broker cluster, real processes).

The design (docs/pull.md): the request's CONNECT moves the session to the broker that got the
request through the cluster's session takeover (broker/cluster/takeover.py), queued messages
included; nothing is routed. The device's numbers from the old home are of another epoch: they
are not applied at the new home (the messages they stood for come again, renumbered: at least
once across a move), and nothing acknowledged by a publisher is lost.
"""

from __future__ import annotations

from broker.pull_client import PullClient
from tests.support.cluster import ClientFactory, ClusterFactory, numbers
from tests.support.pull import drain


def test_pull_at_a_broker_that_is_not_the_sessions_home(
    cluster_factory: ClusterFactory, client_factory: ClientFactory
) -> None:
    cluster = cluster_factory(2, {"pull.enabled": "true"})
    home, other = cluster.brokers
    at_home = PullClient(f"http://{home.host}:{home.http_port}", "roamer")
    assert at_home.open([("roam/#", 1)], session_expiry_s=600)["session_present"] is False
    publisher = client_factory(cluster, 1)  # publishes at the other broker
    for n in range(30):
        publisher.publish("roam/t", f"r{n}".encode(), qos=1)
    first = drain(at_home, 10)
    at_home.acknowledge_received()  # confirmed deleted at home
    assert len(first) >= 10
    # the device now reaches the other broker (say, another load-balancer target)
    roaming = PullClient(f"http://{other.host}:{other.http_port}", "roamer")
    roaming.receiver = at_home.receiver  # same device, same table of numbers
    answer = roaming.post("/v1/sessions/subscriptions", {"client_id": "roamer"})
    assert answer["session_present"] is True, "the session moved here with its subscriptions"
    assert answer["subscriptions"] == [{"filter": "roam/#", "qos": 1}]
    for n in range(30, 40):
        publisher.publish("roam/t", f"r{n}".encode(), qos=1)
    rest = drain(roaming, 40 - len(first))
    roaming.acknowledge_received()
    got = numbers(first + rest, b"r")
    assert sorted(set(got)) == list(range(40)), f"missing {sorted(set(range(40)) - set(got))}"
    assert len(got) == 40, "acknowledged at home, nothing came twice"
    # and back home: the session returns, empty
    fresh, remaining = at_home.pull_once(wait_s=0)
    assert fresh == [] and remaining is False
