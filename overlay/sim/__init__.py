"""Deterministic simulation of the SkipMQ overlay (seed 003 §4): engine, checkers, baselines, experiment.

``engine`` drives ``overlay.api.OverlayCore`` nodes on a virtual clock over a seeded network;
``checkers`` verifies invariants while a simulation runs; ``scribe`` is the Scribe/Pastry
baseline; ``experiment`` reproduces the paper's path-length evaluation (docs/overlay-reproduction.md).
"""
