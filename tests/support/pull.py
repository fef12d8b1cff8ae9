"""Helpers of the pull gateway's process tests (tests/process/integration/test_pull_gateway.py,
tests/process/cluster/test_pull_cluster.py)."""

from __future__ import annotations

import time

from broker.pull_client import PullClient, PullFailed, payload_bytes


def drain(client: PullClient, want: int, *, timeout_s: float = 30.0) -> list[bytes]:
    """Pull (long-polls of 1 s) until ``want`` payloads came or ``timeout_s`` passed; a refused or
    failed pull (a broker restarting) is tried again 0.2 s later. The payloads, in order."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        try:
            fresh, _ = client.pull_once(wait_s=1.0)
        except (OSError, PullFailed):
            time.sleep(0.2)
            continue
        got.extend(payload_bytes(m) for m in fresh)
    return got
