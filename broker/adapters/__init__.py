"""The broker's I/O: everything that touches sockets, threads, the clock or the disk.

Adapters drive the pure and I/O-free parts (``broker.core``, ``broker.cluster``, ``overlay``)
and stay thin: the asyncio scheduler, the TCP/TLS and WebSocket listeners, the HTTP endpoint,
the SQLite store, the gRPC transport between brokers and the cluster runtime that runs the
cluster engine over it. Nothing outside ``broker.adapters`` and ``broker.__main__`` imports them.
"""
