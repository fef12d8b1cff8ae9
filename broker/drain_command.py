"""``skipmq drain``: drain this host's broker before it is removed for good (``cluster.replicas``
> 1): ``POST /drain`` on its loopback HTTP listener (``broker.adapters.replication_drain``), and
wait for the answer. The Helm chart's ``preStop`` hook runs it (``drain.enabled``). Stdlib only
(urllib), like ``skipmq ctl``, so it starts fast in the pod.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

DRAIN_DESCRIPTION = """\
Drain this host's broker before it is removed for good (cluster.replicas > 1; docs/operations.md,
"Scaling down without loss"): it refuses new clients, disconnects the connected ones (they
reconnect to another broker), hands its stored sessions and send log to the brokers that keep
copies of them, and this command returns once they have them. Then stop the broker (SIGTERM).
The Helm chart's preStop hook runs it (drain.enabled). Served on the broker's HTTP listener to
loopback clients only. Exit status: 0 drained, 1 not drained within --timeout-s (or the broker
refused: cluster.replicas is 1), 2 usage error, 3 the broker could not be reached.
"""


def drain_main(argv: list[str] | None = None) -> int:
    """``skipmq drain``: POST /drain on this host's broker and wait for its answer."""
    parser = argparse.ArgumentParser(
        prog="skipmq drain",
        description=DRAIN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--url", default="http://127.0.0.1:9090", help="the broker's HTTP listener (loopback)"
    )
    parser.add_argument(
        "--sleep-s", type=float, default=0.0, help="sleep this long first (out of the Service endpoints)"
    )
    parser.add_argument("--timeout-s", type=float, default=45.0, help="give up after this long (default 45)")
    args = parser.parse_args(argv)
    if args.sleep_s < 0 or not 0 <= args.timeout_s <= 3600:
        parser.error("--sleep-s must be >= 0 and --timeout-s between 0 and 3600")
    if args.sleep_s:
        time.sleep(args.sleep_s)
    query = urllib.parse.urlencode({"timeout_s": f"{args.timeout_s:g}"})
    request = urllib.request.Request(f"{args.url.rstrip('/')}/drain?{query}", data=b"", method="POST")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=args.timeout_s + 10) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        print(f"skipmq drain: error: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 3
    try:
        answer = json.loads(body or b"{}")
    except ValueError:
        answer = {"detail": body[:200].decode(errors="replace")}
    waited = time.monotonic() - started
    if status == 200 and answer.get("drained"):
        print(
            f"skipmq drain: drained in {waited:.1f} s (sessions held elsewhere now; stop the broker)",
            flush=True,
        )
        return 0
    detail = answer.get("detail") or (
        f"not drained within {args.timeout_s:g} s: "
        f"{answer.get('under_replicated_entries', '?')} log entries and "
        f"{answer.get('under_replicated_sessions', '?')} sessions not yet on N brokers, "
        f"{answer.get('held_entries', '?')} entries and {answer.get('held_sessions', '?')} sessions "
        "held for others"
    )
    print(f"skipmq drain: error: {status}: {detail}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(drain_main())
