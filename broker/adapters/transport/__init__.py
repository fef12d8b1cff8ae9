"""Inter-broker transport: the skipmq.v1 wire (protos/skipmq/v1) over gRPC streams.

``GrpcTransport`` carries overlay messages (seed 003 Table 1 queries and Skip Graph
maintenance, ``overlay.messages``) and seed 002 envelopes (``broker.cluster.messages``)
between brokers; ``wire`` converts them to and from protobuf.
"""

from broker.adapters.transport.link import GrpcTransport, TransportConfig, TransportStats
from broker.adapters.transport.wire import SCHEMA_VERSION, WireError, decode_item, encode_item

__all__ = [
    "SCHEMA_VERSION",
    "GrpcTransport",
    "TransportConfig",
    "TransportStats",
    "WireError",
    "decode_item",
    "encode_item",
]
