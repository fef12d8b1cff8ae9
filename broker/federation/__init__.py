"""SIONet federation between sites over shared links (seed 000 §3.7): pure cores.

``router.FederationRouter`` is one broker's semantic-information router for one event place
(§3.7.5): its shared links (§3.7.1, §3.7.3), the event paths built by filter propagation with
counters and a TTL (§3.7.2, §3.7.4) and the events that flow back along them. Events and
``now`` go in, actions come out; ``broker.adapters.federation`` drives it over gRPC.
"""
