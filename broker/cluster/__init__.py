"""The cluster: MQTT semantics across brokers on the SG-TBPS overlay (seed 003), I/O-free.

``engine.ClusterEngine`` is the broker core's cluster port; it composes the overlay node and the
pure protocol cores (``interest``, ``interest_table``, ``stream_sender``, ``stream_receiver``,
``subscribe_waits``, ``takeover``, ``retained_sync``; ``causal`` is seed 004's CO protocol as written).
The gRPC runtime that drives it in a broker process is ``broker.adapters.cluster_runtime``.
"""
