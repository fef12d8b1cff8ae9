"""Virtual-node keys and membership vectors of the SG-TBPS Skip Graph (seed 003 §3.1, §3.2).

A virtual node's key is the plain tuple ``(topic, role, peer_id)``. Python's tuple order sorts
keys by topic, then role (publishers before subscribers, ``api.Role``), then peer id, so that the
publishers of a topic and its subscribers each form a connected run at Skip Graph level 0 and the
two runs touch (strong relay-free, §3.2).

Range bounds are tuples too: ``(topic, role)`` sorts before every ``(topic, role, peer)`` and
``(topic, role + 1)`` after all of them, so a run is the half-open key interval
``[(topic, role), (topic, role + 1))`` without sentinel objects (plain data for protobuf).

Membership vectors are ints of ``mv_bits`` random binary digits (Σ = {0, 1}, §3.1); digit i is
bit i. The level of one node seen from another is the length of the common prefix of their
membership vectors (FRT-Skip Graph's definition), ``common_prefix_length``.
"""

from __future__ import annotations

import random
from typing import Any

from overlay.api import Role

Key = tuple[Any, ...]  # (topic: str, role: int, peer_id) for nodes; (topic, role) for range bounds
NodeRef = tuple[Key, int]  # (key, membership vector): the "sender/forwarder information" of Table 1

ANCHOR_TOPIC = ""  # per-peer anchor virtual node (MQTT topic names are never empty)
PUBLISHER = int(Role.PUBLISHER)
SUBSCRIBER = int(Role.SUBSCRIBER)


def make_key(topic: str, role: int, peer_id: Any) -> Key:
    """The key of the virtual node (topic, role, peer)."""
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, got {type(topic).__name__}")
    if role not in (PUBLISHER, SUBSCRIBER):
        raise ValueError(f"role must be Role.PUBLISHER or Role.SUBSCRIBER, got {role!r}")
    return (topic, int(role), peer_id)


def run_bounds(topic: str, role: int) -> tuple[Key, Key]:
    """Half-open key interval [lo, hi) holding exactly the run of (topic, role) nodes."""
    return (topic, role), (topic, role + 1)


def in_range(key: Key, lo: Key, hi: Key) -> bool:
    return lo <= key < hi


def random_membership_vector(rng: random.Random, mv_bits: int) -> int:
    """``mv_bits`` independent fair binary digits drawn from the driver's generator."""
    return rng.getrandbits(mv_bits)


def random_index(rng: random.Random, n: int) -> int:
    """``rng.randrange(n)`` for n >= 1, drawn as CPython's ``Random`` draws it: ``getrandbits`` of
    n's bit length until the draw is below n. The same values (``tests/unit/overlay/test_keys.py``
    compares them), without randrange's interpreted argument handling, which a compiled sweep
    paid on every hop of a random-walk EEXP."""
    bits = n.bit_length()
    draw = rng.getrandbits(bits)
    while draw >= n:
        draw = rng.getrandbits(bits)
    return draw


def common_prefix_length(mv_a: int, mv_b: int, mv_bits: int) -> int:
    """Number of leading digits (digit 0 = bit 0) the two membership vectors share."""
    diff = mv_a ^ mv_b
    if diff == 0:
        return mv_bits
    level = (diff & -diff).bit_length() - 1
    return level if level < mv_bits else mv_bits


def peer_of(key: Key) -> Any:
    return key[2]


def is_subscriber_of(key: Key, topic: str) -> bool:
    return key[1] == SUBSCRIBER and key[0] == topic
