"""``skipmq pull``: a device-side client of the HTTP pull gateway (seed 001 §4.4, PullRequester).

Opens the session (subscribing to the ``-t`` filters), then long-polls ``POST /v1/pull`` in a
loop, carrying the sequence numbers received so far (:class:`broker.core.pull.PullReceiver`)
and printing each new message as it comes (one JSON object a line with ``--json``, else
``topic payload``). A failed request (network error, 5xx, 429) is retried after a short pause
with the same numbers, so nothing is lost and nothing is printed twice. Standard library HTTP
only, so a device script can import :class:`PullClient` without the broker's dependencies.
"""

from __future__ import annotations

import argparse
import base64
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from broker.core.pull import MAX_MESSAGES, PullReceiver


class PullFailed(Exception):
    """The gateway refused the request (4xx other than 429): ``problem`` is its problem document."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {problem.get('detail') or problem.get('title') or problem}")
        self.status = status
        self.problem = problem


class PullClient:
    """One device's pull session at ``url`` (the broker's HTTP listener, e.g. http://host:9090)."""

    def __init__(
        self,
        url: str,
        client_id: str,
        *,
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 40.0,
        cafile: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.receiver = PullReceiver()
        self._headers = {"Content-Type": "application/json"}
        if username is not None:
            token = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._context = ssl.create_default_context(cafile=cafile) if cafile else None

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a JSON body; the JSON answer, or :class:`PullFailed` / an ``OSError``."""
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers=self._headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._context) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer
        except urllib.error.HTTPError as error:
            try:
                problem = json.loads(error.read())
            except ValueError:
                problem = {"detail": error.reason}
            raise PullFailed(error.code, problem) from None

    def open(self, filters: list[tuple[str, int]], *, session_expiry_s: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "client_id": self.client_id,
            "subscriptions": [{"filter": f, "qos": q} for f, q in filters],
        }
        if session_expiry_s is not None:
            body["session_expiry_s"] = session_expiry_s
        return self.post("/v1/sessions/open", body)

    def pull_once(
        self, wait_s: float = 0.0, max_messages: int = MAX_MESSAGES
    ) -> tuple[list[dict[str, Any]], bool]:
        """One request: acknowledge what was received, get the new messages and ``remaining``."""
        acks, epoch = self.receiver.next_acks()
        body: dict[str, Any] = {"client_id": self.client_id, "acks": acks, "wait_s": wait_s}
        if max_messages != MAX_MESSAGES:
            body["max_messages"] = max_messages
        if epoch is not None:
            body["epoch"] = epoch
        answer = self.post("/v1/pull", body)
        return self.receiver.accept(acks, answer), bool(answer.get("remaining"))

    def messages(
        self,
        *,
        wait_s: float = 20.0,
        retry_s: float = 1.0,
        count: int = 0,
        on_error: Callable[[Exception], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """New messages as they come (``count`` of them, 0 = forever), retrying a failed request
        with the same numbers; with ``count``, the numbers of the last ones are acknowledged
        before it ends and no message beyond ``count`` is taken."""
        taken = 0
        while not count or taken < count:
            limit = MAX_MESSAGES if not count else min(MAX_MESSAGES, count - taken)
            try:
                fresh, _remaining = self.pull_once(wait_s, limit)
            except PullFailed as exc:
                if exc.status not in (429, 503):
                    raise
                if on_error is not None:
                    on_error(exc)
                time.sleep(retry_s)
                continue
            except OSError as exc:
                if on_error is not None:
                    on_error(exc)
                time.sleep(retry_s)
                continue
            taken += len(fresh)
            yield from fresh
        self.acknowledge_received()

    def acknowledge_received(self) -> None:
        """Send the received numbers without taking anything new for the application."""
        acks, epoch = self.receiver.next_acks()
        if not acks:
            return
        body: dict[str, Any] = {"client_id": self.client_id, "acks": acks, "max_messages": 1}
        if epoch is not None:
            body["epoch"] = epoch
        answer = self.post("/v1/pull", body)
        # a message that comes with it stays queued (its number is not acknowledged): forget it
        answer["messages"] = []
        self.receiver.accept(acks, answer)


def payload_bytes(message: dict[str, Any]) -> bytes:
    if "payload_base64" in message:
        return base64.b64decode(message["payload_base64"])
    return str(message.get("payload", "")).encode()


def _filter(text: str, qos: int) -> tuple[str, int]:
    return text, qos


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skipmq pull",
        description="Receive messages over the SkipMQ HTTP pull gateway (docs/pull.md): open the session "
        "with the -t filters, then long-poll POST /v1/pull, acknowledging received sequence numbers "
        "in the next request, and print each message once as it comes. Ctrl-C stops; the session "
        "keeps the messages that arrive meanwhile (until its expiry).",
    )
    parser.add_argument("--url", required=True, help="the broker's HTTP listener, e.g. http://127.0.0.1:9090")
    parser.add_argument("--client-id", "-i", required=True, help="the session's client id")
    parser.add_argument(
        "-t", "--topic", action="append", default=[], metavar="FILTER", help="topic filter (repeatable)"
    )
    parser.add_argument("-q", "--qos", type=int, choices=(0, 1, 2), default=1, help="QoS of the -t filters")
    parser.add_argument("-u", "--username", help="user name (the broker's password file)")
    parser.add_argument("-P", "--password", help="password")
    parser.add_argument("--cafile", help="CA bundle for an https:// URL")
    parser.add_argument("--wait", type=float, default=20.0, help="long-poll seconds per request (default 20)")
    parser.add_argument("--session-expiry", type=int, help="session expiry interval in seconds")
    parser.add_argument("-C", "--count", type=int, default=0, help="exit after this many messages")
    parser.add_argument("--json", action="store_true", help="print each message as one JSON line")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    client = PullClient(
        args.url,
        args.client_id,
        username=args.username,
        password=args.password,
        timeout_s=args.wait + 20.0,
        cafile=args.cafile,
    )
    try:
        if args.topic or args.session_expiry is not None:
            client.open([_filter(t, args.qos) for t in args.topic], session_expiry_s=args.session_expiry)

        def report(exc: Exception) -> None:
            print(f"skipmq pull: {exc}; retrying", file=sys.stderr, flush=True)

        for message in client.messages(wait_s=args.wait, count=args.count, on_error=report):
            if args.json:
                print(json.dumps(message), flush=True)
            else:
                sys.stdout.buffer.write(message["topic"].encode() + b" " + payload_bytes(message) + b"\n")
                sys.stdout.flush()
    except PullFailed as exc:
        print(f"skipmq pull: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
