"""A bounded fuzz run over the MQTT codec and the connection handler (issue #12).

hypothesis drives hostile bytes - random, and mutations of well-formed packets - into fresh
connections of one real broker core (``tools.fuzz_mqtt``); none may crash it (an exception out of
``receive`` or a logged internal error), and an honest client must still get its message after.
The by-hand run (``python -m tools.fuzz_mqtt --inputs 1000000``) is reported in docs/security.md.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tools.fuzz_mqtt import ConnectionFuzzer, mutate, run, seed_packets

CORPUS = seed_packets()


@pytest.fixture(scope="module")
def fuzzer() -> Iterator[ConnectionFuzzer]:
    target = ConnectionFuzzer(seed=7)
    yield target
    target.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    base=st.sampled_from(CORPUS),
    noise=st.binary(max_size=64),
    seed=st.integers(0, 2**32 - 1),
    raw=st.booleans(),
)
def test_hostile_bytes_never_crash_the_connection_handler(
    fuzzer: ConnectionFuzzer, base: bytes, noise: bytes, seed: int, raw: bool
) -> None:
    data = noise if raw else mutate(base, random.Random(seed), CORPUS) + noise
    assert fuzzer.feed(data) is None
    assert fuzzer.honest_client_works()


def test_a_seeded_mutation_run_finds_no_crash() -> None:
    result = run(seed=3, count=3000, check_every=500)
    assert result.inputs == 3000 and result.health_checks == 6
    assert result.crashes == []


def test_the_fuzzer_sees_a_crash_when_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The crash detector works: a handler that raises is reported (the assertion above could fail)."""
    target = ConnectionFuzzer(seed=1)
    try:
        from broker.core import client as client_module

        def broken(self: object, packet: object) -> None:
            raise RuntimeError("planted bug")

        monkeypatch.setitem(client_module._HANDLERS, client_module.Pingreq, broken)
        crash = target.feed(CORPUS[0] + bytes((0xC0, 0)))
        assert crash is not None and "internal error" in crash
    finally:
        target.close()
