"""The federation adapter: SIONet shared links (seed 000 §3.7) over gRPC.

``wire`` maps ``broker.federation.messages`` to the ``skipmq.v1.Federation`` protobuf messages
(protos/skipmq/v1/federation.proto); ``node.FederationNode`` serves and dials the link streams
and drives the pure ``broker.federation.router.FederationRouter``; ``port.FederatedClusterPort``
tells it about local subscriptions and publications. Kept apart from
``broker.adapters.transport`` (the cluster's PeerLink), whose generated code it shares.
"""
