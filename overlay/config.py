"""OverlayConfig: every tunable of the SG-TBPS + FRT core (seed 003 §3.4-§3.5; docs/overlay.md).

The paper fixes the table size L (60 or 120 in §4) and the queries; it is silent on timer
periods, counts and membership-vector length, which are decided here (see docs/overlay.md,
"Decisions where the paper is silent").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OverlayConfig:
    table_size: int = 60  # L: routing-table size per virtual node (§3.3, §4)
    frt_enabled: bool = True  # False: plain SG-TBPS baseline (per-level neighbours only)
    mv_bits: int = 32  # membership-vector length (levels 0..mv_bits)
    anchor_enabled: bool = True  # one ("", PUBLISHER, peer) virtual node per peer (bootstrap anchor)
    rexp_interval_s: float = 30.0  # §3.5.5 periodic REXP period (jittered by +-10 %)
    eexp_delay_s: float = 2.0  # §3.5.2 delay after join before the subscriber-range EEXP
    eexp_random_delay_s: float = 4.0  # §3.5.2 further delay before random-target EEXP
    eexp_random_interval_s: float = 10.0  # repeat period of random-target EEXP while below L
    eexp_random_max_rounds: int = 5  # bound on random-target EEXP rounds per join
    eexp_publish_min_interval_s: float = 10.0  # rate limit of the §3.5.4 EEXP at publish (0: every publish)
    # How EEXP's missing-entry count is used (docs/overlay.md §5, "EEXP rules", with each
    # alternative measured). The seed's wording: below_l, every, and (its reading) whole.
    # trigger and decrement are SkipMQ's (the seed's trigger never explores from a publisher whose
    # table is full of background entries; sub_deficit without a rate limit means an EEXP per
    # publish); the split is the seed's since 2026-11-25 (single hop to 80 subscribers at L=120;
    # it used to fail the churn tests because of stale level-0 corrections, docs/overlay.md §10):
    eexp_trigger: str = "sub_deficit"  # "below_l": only while |E| < L (§3.5.2, §3.5.4); "sub_deficit":
    #   also while L - |SUB(E)| - |sticky| >= 1 (a full table of non-subscribers still explores)
    eexp_decrement: str = "supplied"  # "every": each receiver decrements (§3.5.6); "supplied": only
    #   a receiver that answers NEW spends one
    eexp_split: str = "whole"  # "whole": every delegate of a range EEXP gets the decremented count
    #   (§3.5.6 "forward to the next destination"); "even": the count is divided among delegates
    search_timeout_s: float = 5.0  # join search retried after this (no per-hop acknowledgement)
    # after a join the vnode searches its own key again, join_verify_rounds times, first after
    # join_verify_delay_s, each next after twice the previous wait (docs/overlay.md §10, concurrent
    # joins; 0: never). On by default since join searches are routed from the best of all the
    # peer's virtual nodes (docs/overlay.md §5 "Search routing"): before that, slow searches at
    # small L left the 1,000-peer churn test (L=8) with joins still pending at its check
    join_verify_rounds: int = 1
    join_verify_delay_s: float = 1.0
    formation_round_s: float = 1.0  # a seed's formation round (overlay.formation): answers awaited
    formation_rounds: int = 2  # consecutive rounds as the lowest reachable seed before founding
    link_retry_s: float = 1.0  # an unconfirmed new level-0 link is re-announced after this
    link_max_retries: int = 3  # then the periodic REXP takes over
    ping_interval_s: float = 10.0  # liveness probe of peers hosting level-0 neighbours
    failure_timeout_s: float = 30.0  # silence after which such a peer is declared crashed
    dead_peer_memory_s: float = 60.0  # a crashed peer is not re-learned from hearsay for this long
    pub_ack_timeout_s: float = 2.0  # an unacknowledged PUB/UNSUB delegation is re-delegated
    pub_ack_enabled: bool = True  # per-hop PUB/UNSUB acknowledgement (crash-safe delegation)
    pub_ack_retries: int = 1  # retransmissions to the same receiver before delegating around it
    dedup_window: int = 4096  # per subscriber: remembered (publisher, publication id) pairs
    max_pending_publishes: int = 1024  # publishes queued while the publisher vnode is joining
    publish_done_enabled: bool = False  # DONE per delegation + api.PublishDone per Publish (end to end)
    publish_done_timeout_s: float = 5.0  # PublishDone(complete=False) if the tree is not done by then

    def __post_init__(self) -> None:
        if self.table_size < 2:
            raise ValueError(
                f"table_size (L) must be >= 2 to hold both level-0 neighbours, got {self.table_size}"
            )
        if not 1 <= self.mv_bits <= 64:
            raise ValueError(f"mv_bits must be in 1..64, got {self.mv_bits}")
        for name in (
            "rexp_interval_s",
            "eexp_delay_s",
            "eexp_random_delay_s",
            "eexp_random_interval_s",
            "search_timeout_s",
            "join_verify_delay_s",
            "formation_round_s",
            "link_retry_s",
            "ping_interval_s",
            "failure_timeout_s",
            "pub_ack_timeout_s",
            "publish_done_timeout_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.failure_timeout_s <= self.ping_interval_s:
            raise ValueError("failure_timeout_s must exceed ping_interval_s")
        if self.formation_rounds < 1:
            raise ValueError(f"formation_rounds must be >= 1, got {self.formation_rounds}")
        if self.pub_ack_retries < 0:
            raise ValueError(f"pub_ack_retries must be >= 0, got {self.pub_ack_retries}")
        if self.publish_done_enabled and not self.pub_ack_enabled:
            raise ValueError(
                "publish_done_enabled needs pub_ack_enabled (DONE completes acknowledged delegations)"
            )
        for name, allowed in (
            ("eexp_trigger", ("below_l", "sub_deficit")),
            ("eexp_decrement", ("every", "supplied")),
            ("eexp_split", ("whole", "even")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.join_verify_rounds < 0:
            raise ValueError(f"join_verify_rounds must be >= 0, got {self.join_verify_rounds}")
        if self.eexp_publish_min_interval_s < 0:
            raise ValueError(
                f"eexp_publish_min_interval_s must be >= 0, got {self.eexp_publish_min_interval_s}"
            )
        if self.dedup_window < 1:
            raise ValueError(f"dedup_window must be >= 1, got {self.dedup_window}")
