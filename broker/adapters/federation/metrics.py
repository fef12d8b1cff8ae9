"""Prometheus families of a federated broker (``skipmq_federation_*``; docs/observability.md
"Federation"), built from the router's and the node's plain counters only when ``/metrics`` is
scraped - nothing on the event path, like ``broker.metrics``' collectors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from broker.adapters.federation.node import FederationNode

# the statuses a LinkRequest stream is refused with before a link (FederationNode._refuse)
LINK_REFUSAL_CODES = ("PERMISSION_DENIED", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "UNAVAILABLE")
CUSTODY_OUTCOMES = ("held", "completed", "given_up", "rerouted", "duplicates", "evicted", "restored")


class FederationCollector(Collector):
    """See the module docstring; ``node`` is read at each scrape."""

    def __init__(self, node: FederationNode) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node = self.node
        router = node.router
        links = GaugeMetricFamily(
            "skipmq_federation_links",
            "Shared links up, by role (parent: requested; child: accepted)",
            labels=["role"],
        )
        links.add_metric(["parent"], 0 if router is None or router.parent is None else 1)
        links.add_metric(["child"], 0 if router is None else len(router.children))
        yield links
        registered = GaugeMetricFamily(
            "skipmq_federation_link_filters",
            "Keys (filters or topic classes) on each shared link: registered toward the neighbour "
            "(direction=out, a counter above 0) or registered by it (direction=in)",
            labels=["peer", "direction"],
        )
        counted = GaugeMetricFamily(
            "skipmq_federation_link_filter_sources",
            "Sum over the keys of a link of the counters of seed 000 Table 1 (sources wanting each key "
            "registered toward that neighbour)",
            labels=["peer"],
        )
        if router is not None:
            counters = router.counters()
            for peer in router.links():
                registered.add_metric([peer, "out"], len(router.registered_toward(peer)))
                registered.add_metric([peer, "in"], len(router.received_from(peer)))
                counted.add_metric([peer], sum(counters.get(peer, {}).values()))
        yield registered
        yield counted
        sent = CounterMetricFamily(
            "skipmq_federation_messages_sent",
            "Messages sent on shared links, by kind (Register, Unregister, Event, EventAck, Probe, ...)",
            labels=["kind"],
        )
        if router is not None:
            for kind, count in sorted(router.stats.sent.items()):
                sent.add_metric([kind], count)
        yield sent
        stats = router.stats if router is not None else None
        yield CounterMetricFamily(
            "skipmq_federation_events_forwarded",
            "Events sent on shared links (published here or relayed)",
            node.events_forwarded,
        )
        yield CounterMetricFamily(
            "skipmq_federation_events_received",
            "Events that came over shared links",
            stats.events_in if stats is not None else 0,
        )
        yield CounterMetricFamily(
            "skipmq_federation_events_delivered",
            "Events that came over shared links and were delivered to this site's subscribers",
            stats.events_delivered if stats is not None else 0,
        )
        yield CounterMetricFamily(
            "skipmq_federation_events_wasted",
            "Events that came over a shared link, matched no local subscription and went nowhere else "
            "(type-only routing's cost)",
            stats.events_wasted if stats is not None else 0,
        )
        yield CounterMetricFamily(
            "skipmq_federation_registrations_stopped_by_ttl",
            "Filter registrations received with TTL 1: this broker is the last they reach (Fig. 16)",
            stats.registrations_stopped_by_ttl if stats is not None else 0,
        )
        custody = router.custody_stats() if router is not None else {}
        yield GaugeMetricFamily(
            "skipmq_federation_custody_events",
            "QoS>=1 events in custody (waiting for acknowledgements, or held for a re-link)",
            value=custody.get("in_custody", 0),
        )
        outcomes = CounterMetricFamily(
            "skipmq_federation_custody",
            "Custody entries by outcome: held (entered), completed, given_up (dropped while a site "
            "may miss it: a link broke and no re-route was acknowledged within the grace, or "
            "evicted), rerouted (sent again after a re-link), duplicates (copies acknowledged, not "
            "delivered again), evicted (over the limit: given up), restored (taken back from the "
            "store after a restart)",
            labels=["outcome"],
        )
        for outcome in CUSTODY_OUTCOMES:
            outcomes.add_metric([outcome], custody.get(outcome, 0))
        yield outcomes
        accepted_refused = CounterMetricFamily(
            "skipmq_federation_link_refused",
            "LinkRequest streams this broker refused before a link, by the gRPC status it ended them "
            "with: PERMISSION_DENIED (the client certificate does not name the requester), "
            "INVALID_ARGUMENT (a first frame that is not one LinkRequest), DEADLINE_EXCEEDED (no "
            "LinkRequest within 5 s), UNAVAILABLE (federation still starting)",
            labels=["code"],
        )
        for code in sorted({*LINK_REFUSAL_CODES, *node.refusals}):  # every code from 0: rate() works
            accepted_refused.add_metric([code], node.refusals.get(code, 0))
        yield accepted_refused
        refused = CounterMetricFamily(
            "skipmq_federation_link_dial_refused",
            "Link requests this broker made whose acceptor did not prove it is the broker dialed "
            '(docs/federation.md "Security"), by reason: no_proof (no answer to the challenge, '
            "cluster.origin_proofs = required), wrong_peer_id (the answer's topology ends with "
            "another name), wrong_proof (an answer that does not name the dialed name, or a bad "
            "signature)",
            labels=["reason"],
        )
        for reason, count in sorted(node.dial_refusals.items()):
            refused.add_metric([reason], count)
        yield refused
        yield CounterMetricFamily(
            "skipmq_federation_link_unproven",
            "Links made to an acceptor that did not answer the challenge (cluster.origin_proofs = optional)",
            node.unproven_links,
        )
