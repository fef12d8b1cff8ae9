"""The broker core: sessions, subscriptions, routing, outbound queues, durability (no I/O).

``broker.core.broker.Broker`` composes the parts; ``broker.core.ports`` is every interface to the
outside. See docs/architecture.md for who owns which state.
"""
