"""Concurrent bootstraps at one end of the key space (docs/overlay.md §10; seed 003 §3.5.2).

Peers bootstrap 2 ms apart, each through a random earlier peer, while a join search takes about
100 ms: every new anchor ``("", PUBLISHER, peer)`` is the largest key so far, so dozens of
joiners insert at the same end at once. Before the position check (``join_verify_rounds``) the
searches ended at nodes that did not yet know the joiners before them, the joiners formed
interleaved chains that each looked right locally, and the NEW/LINK notices merged them one
node per round trip: at 5,000 peers (SG-TBPS tables, seed 1) 5,367 wrong level-0 links 10 s
after the last bootstrap, 2,927 after 30 s. The fix: each joined virtual node searches its own
key once more a second later, and the search never hops to its target, so it ends at the node
the rest of the graph takes for the joiner's neighbour; its answer starts the corrections at
every misplaced joiner at once. It is on by default (``join_verify_rounds`` = 1), and this test
runs the default: it fails with ``join_verify_rounds`` = 0.
"""

from __future__ import annotations

import random

import pytest

from overlay.config import OverlayConfig
from overlay.node import OverlayNode
from overlay.sim.checkers import check_level0_ring
from overlay.sim.engine import NetworkConfig, Simulator, derive_seed

QUIET_TIMERS = {"rexp_interval_s": 600.0, "ping_interval_s": 300.0, "failure_timeout_s": 900.0}


def bootstrap_burst(peers: int, seed: int, config: OverlayConfig, spacing_s: float = 0.002) -> Simulator:
    """``peers`` bootstraps ``spacing_s`` apart, each through a random earlier peer (as the
    paper sweep builds its overlay); returns the simulator at the last bootstrap."""
    sim = Simulator(seed, NetworkConfig(), count_per_peer=False)
    plan = random.Random(derive_seed(seed, "experiment-plan", peers))
    for peer in range(peers):
        contacts = () if peer == 0 else (plan.randrange(peer),)
        sim.add_node(OverlayNode(peer, rng=sim.node_rng(peer), config=config), contacts, at=peer * spacing_s)
    sim.run_until(peers * spacing_s)
    return sim


@pytest.mark.slow
def test_level0_list_exact_5_s_after_5000_bootstraps_2_ms_apart() -> None:
    # the default position check; SG-TBPS tables (the fewest entries, so the slowest repair) and
    # no periodic REXP to help
    config = OverlayConfig(frt_enabled=False, **QUIET_TIMERS)
    sim = bootstrap_burst(5000, 1, config)
    sim.run_for(5.0)
    assert check_level0_ring(sim) == 5000  # raises InvariantViolation (naming the seed) otherwise
