"""Whole-cluster simulation (TigerBeetle VOPR style): N SkipMQ brokers on a seeded virtual network.

Each simulated broker runs the real, unchanged code of a broker process - the broker core
(``broker.core``), the cluster engine and its pure protocol cores (``broker.cluster``), the
overlay (``overlay``) and a real SQLite store - on a virtual clock instead of asyncio, with
simulated MQTT clients that speak real MQTT bytes. The network between brokers has latency,
jitter, loss, duplication, reordering and partitions; brokers crash (kill -9: everything not
committed to the store is gone) and restart from their store. Invariant checkers
(``simulation.checkers``) look for lost acknowledged messages, order violations, two owners of one
client id and retained values that do not converge. Every run is a pure function of its seed, so
a failing seed replays exactly (``python -m simulation --seed N``).
"""
