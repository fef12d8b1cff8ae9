"""``skipmq ctl``: the admin API from the shell (as ``vmq-admin`` and ``emqx ctl``).

Talks to one broker's admin API (``--url``, default ``$SKIPMQ_ADMIN_URL`` or
http://127.0.0.1:9090); every answer covers the whole cluster. Tables for people, ``--json`` for
scripts (the API's JSON as it came), errors (the API's RFC 9457 problem documents) as one
``skipmq ctl: error: <status> <title>: <detail>`` line. Exit status: 0 done, 1 the API refused
(the problem's status says why), 2 usage error, 3 the broker could not be reached.
``admin-user`` edits an admin users file locally (no broker involved). Stdlib only (urllib), so
it starts fast and runs where only the wheel is installed.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DESCRIPTION = """\
Administer a SkipMQ cluster through any broker's admin API (admin.enabled; docs/operations.md).

Credentials: --user (or $SKIPMQ_ADMIN_USER) and the password from $SKIPMQ_ADMIN_PASSWORD, or
--password-file, or a prompt. Admin users are separate from MQTT users: make them with
`skipmq ctl admin-user add FILE NAME --role admin|readonly` and point admin.users_file at FILE.

commands (each answers for the whole cluster; brokers that did not answer are named):
  brokers                         every broker: status, connections, sessions, links
  listeners                       every broker's listeners
  clients [--prefix P] [--user U] connected clients, where they are
  sessions [--connected|--disconnected]  sessions, connected or stored
  client CLIENT_ID                one client: broker, subscriptions, queued messages
  subscriptions [--client-id C] [--filter F [--exact]] [--topic T]
                                  who subscribes what (--filter: every subscription a message
                                  the filter matches can reach, e.g. plant7/#)
  retained [--filter F]           retained messages (payload previews)
  retained-delete TOPIC           delete a retained message everywhere
  classes                         topic classes: subscriber brokers, one-hop or multi-hop route
  overlay                         the Skip Graph: virtual nodes per level
  disconnect CLIENT_ID [--discard-session]
                                  disconnect a client wherever it is (and end its session)
  publish TOPIC PAYLOAD [--qos N] [--retain]
                                  publish as the broker
  trace (--client-id C | --filter F) [--seconds N]
                                  watch a client's packets or a filter's traffic for N seconds
  users | user-set NAME | user-remove NAME | users-export | users-import FILE
                                  MQTT users on every broker (user-set asks for the password,
                                  or reads it from $SKIPMQ_USER_PASSWORD)
  acl | acl-set (USER | --anonymous | --patterns) RULE... | acl-remove (USER | --anonymous |
  --patterns) | acl-export | acl-import FILE
                                  ACL rules on every broker; a RULE is access:filter, e.g.
                                  read:plant7/#, readwrite:cmd/%u/#, deny:secret/#
  admin-user add FILE NAME --role admin|readonly | admin-user remove FILE NAME
                                  edit an admin users file (local)

exit status: 0 done, 1 refused by the API, 2 usage error, 3 broker not reachable.
"""


class CtlError(Exception):
    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.exit_status = status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skipmq ctl", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("SKIPMQ_ADMIN_URL", "http://127.0.0.1:9090"),
        help="a broker's HTTP address ($SKIPMQ_ADMIN_URL, http://127.0.0.1:9090)",
    )
    parser.add_argument("--user", default=os.environ.get("SKIPMQ_ADMIN_USER"), help="admin user name")
    parser.add_argument("--password-file", help="read the admin password from this file's first line")
    parser.add_argument("--cafile", help="CA bundle to verify an https:// broker")
    parser.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for an answer (30)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    sub.add_parser("brokers", help="every broker: status, connections, links")
    sub.add_parser("listeners", help="every broker's listeners")
    for name in ("clients", "sessions"):
        p = sub.add_parser(name, help=f"{name}, cluster-wide")
        p.add_argument("--prefix", help="client ids starting with this")
        p.add_argument("--username", help="only this MQTT user's")
        p.add_argument("--broker", help="only this broker's (node id)")
        p.add_argument("--limit", type=int, default=100, help="rows per page (100)")
        p.add_argument("--all", action="store_true", help="every page, not just the first")
        if name == "sessions":
            state = p.add_mutually_exclusive_group()
            state.add_argument("--connected", action="store_true", help="only connected ones")
            state.add_argument("--disconnected", action="store_true", help="only stored ones")
    p = sub.add_parser("client", help="one client wherever it is")
    p.add_argument("client_id")
    p = sub.add_parser("subscriptions", help="who subscribes what")
    p.add_argument("--client-id")
    p.add_argument("--filter", help="subscriptions a message this filter matches can reach")
    p.add_argument("--exact", action="store_true", help="with --filter: only this very filter")
    p.add_argument("--topic", help="subscriptions a message on this topic reaches")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--all", action="store_true")
    p = sub.add_parser("retained", help="retained messages")
    p.add_argument("--filter", default="#")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--all", action="store_true")
    p = sub.add_parser("retained-delete", help="delete a retained message everywhere")
    p.add_argument("topic")
    sub.add_parser("classes", help="topic classes and their routes")
    sub.add_parser("overlay", help="the Skip Graph's virtual nodes by level")
    p = sub.add_parser("disconnect", help="disconnect a client wherever it is")
    p.add_argument("client_id")
    p.add_argument("--discard-session", action="store_true", help="end its session too")
    p = sub.add_parser("publish", help="publish a message as the broker")
    p.add_argument("topic")
    p.add_argument("payload")
    p.add_argument("--qos", type=int, choices=(0, 1, 2), default=0)
    p.add_argument("--retain", action="store_true")
    p = sub.add_parser("trace", help="watch a client id or a topic filter")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--client-id")
    target.add_argument("--filter")
    p.add_argument("--seconds", type=float, default=10.0)
    sub.add_parser("users", help="MQTT users")
    p = sub.add_parser("user-set", help="add an MQTT user or change its password")
    p.add_argument("name")
    p = sub.add_parser("user-remove", help="remove an MQTT user")
    p.add_argument("name")
    sub.add_parser("users-export", help="the users as a password file")
    p = sub.add_parser("users-import", help="import a password file")
    p.add_argument("file")
    sub.add_parser("acl", help="the ACL")
    for name in ("acl-set", "acl-remove"):
        p = sub.add_parser(name, help="set the rules of a section" if name == "acl-set" else "drop a section")
        who = p.add_mutually_exclusive_group(required=True)
        who.add_argument("--user", dest="acl_user")
        who.add_argument("--anonymous", action="store_true")
        who.add_argument("--patterns", action="store_true")
        if name == "acl-set":
            p.add_argument("rules", nargs="*", metavar="ACCESS:FILTER")
    sub.add_parser("acl-export", help="the effective ACL as an ACL file")
    p = sub.add_parser("acl-import", help="replace the dynamic ACL by an ACL file")
    p.add_argument("file")
    p = sub.add_parser("admin-user", help="edit an admin users file (local)")
    p.add_argument("action", choices=("add", "remove"))
    p.add_argument("file")
    p.add_argument("name")
    p.add_argument("--role", choices=("admin", "readonly"), default="readonly")
    return parser


class Client:
    def __init__(self, args: argparse.Namespace) -> None:
        self.base = args.url.rstrip("/")
        self.timeout = args.timeout
        self.context = (
            ssl.create_default_context(cafile=args.cafile) if self.base.startswith("https") else None
        )
        self.auth: str | None = None
        if args.user:
            password = os.environ.get("SKIPMQ_ADMIN_PASSWORD")
            if args.password_file:
                with open(args.password_file, encoding="utf-8") as handle:
                    password = handle.readline().rstrip("\n")
            if password is None:
                password = getpass.getpass(f"admin password for {args.user}: ")
            self.auth = "Basic " + base64.b64encode(f"{args.user}:{password}".encode()).decode()

    def call(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        text: str | None = None,
    ) -> Any:
        url = self.base + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None
        headers = {"X-Requested-By": "skipmq-ctl", "Accept": "application/json"}
        if self.auth:
            headers["Authorization"] = self.auth
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif text is not None:
            data = text.encode()
            headers["Content-Type"] = "text/plain"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as response:
                raw = response.read()
                kind = response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                problem = json.loads(raw)
                status, title = problem.get("status", exc.code), problem.get("title", exc.reason)
                message = f"{status} {title}: {problem.get('detail', '')}"
            except ValueError:
                message = f"{exc.code} {exc.reason}"
            raise CtlError(message, 1) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CtlError(f"cannot reach {self.base}: {reason}", 3) from None
        if kind.startswith("application/json"):
            return json.loads(raw)
        return raw.decode()

    def pages(self, path: str, query: dict[str, Any], every: bool) -> dict[str, Any]:
        answer = self.call("GET", path, query)
        items = list(answer["items"])
        missing = list(answer["missing"])
        while every and answer.get("next_cursor"):
            answer = self.call("GET", path, {**query, "cursor": answer["next_cursor"]})
            items.extend(answer["items"])
            missing.extend(m for m in answer["missing"] if m not in missing)
        return {"items": items, "next_cursor": answer.get("next_cursor"), "missing": missing}


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, list):
            return ",".join(str(v) for v in value) or "-"
        return str(value)

    cells = [[cell(row.get(col)) for col in columns] for row in rows]
    widths = [max([len(col)] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]
    lines = ["  ".join(col.upper().ljust(widths[i]) for i, col in enumerate(columns)).rstrip()]
    lines += ["  ".join(r[i].ljust(widths[i]) for i in range(len(columns))).rstrip() for r in cells]
    return "\n".join(lines)


def _missing(answer: dict[str, Any]) -> str:
    missing = answer.get("missing") or []
    return "".join(f"\nnot answered: {m['broker']}: {m['reason']}" for m in missing)


def _admin_user(args: argparse.Namespace) -> int:
    from broker.adapters.admin.access import (
        AdminUsersError,
        parse_admin_users,
        set_admin_user,
        write_admin_users,
    )

    users: dict[str, tuple[str, str]] = {}
    if os.path.exists(args.file):
        try:
            with open(args.file, encoding="utf-8") as handle:
                users = parse_admin_users(handle.read(), args.file)
        except (OSError, AdminUsersError) as exc:
            raise CtlError(str(exc), 1) from None
    if args.action == "remove":
        if users.pop(args.name, None) is None:
            raise CtlError(f"no admin user {args.name!r} in {args.file}", 1)
    else:
        password = os.environ.get("SKIPMQ_NEW_ADMIN_PASSWORD") or getpass.getpass(
            f"password for {args.name}: "
        )
        try:
            set_admin_user(users, args.name, args.role, password)
        except ValueError as exc:
            raise CtlError(str(exc), 2) from None
    write_admin_users(args.file, users)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.command == "admin-user":
        return _admin_user(args)
    client = Client(args)
    cmd = args.command
    out: str
    if cmd == "brokers":
        answer = client.call("GET", "/admin/v1/brokers")
        rows = [
            {**b, "links_up": sum(1 for link in b["links"] if link["connected"]), "links": len(b["links"])}
            for b in answer["brokers"]
        ]
        cols = [
            "node_id",
            "peer_id",
            "status",
            "connections",
            "sessions",
            "retained",
            "links_up",
            "uptime_s",
            "admin_url",
        ]
        out = table(rows, cols) + _missing(answer)
    elif cmd == "listeners":
        answer = client.call("GET", "/admin/v1/listeners")
        out = table(
            answer["listeners"], ["broker", "name", "enabled", "host", "port", "scheme", "connections"]
        )
    elif cmd in ("clients", "sessions"):
        query: dict[str, Any] = {
            "prefix": args.prefix,
            "username": args.username,
            "broker": args.broker,
            "limit": args.limit,
        }
        if cmd == "sessions" and (args.connected or args.disconnected):
            query["connected"] = "true" if args.connected else "false"
        answer = client.pages(f"/admin/v1/{cmd}", query, args.all)
        cols = [
            "client_id",
            "broker",
            "username",
            "connected",
            "protocol",
            "peer",
            "subscriptions",
            "queued",
            "inflight",
        ]
        out = table(answer["items"], cols) + _more(answer) + _missing(answer)
    elif cmd == "client":
        answer = client.call("GET", f"/admin/v1/clients/{urllib.parse.quote(args.client_id, safe='')}")
        c = answer["client"]
        head = table(
            [c], ["client_id", "broker", "username", "connected", "peer", "protocol", "queued", "inflight"]
        )
        subs = (
            table(c["subscription_list"], ["filter", "qos", "share_group"])
            if c["subscription_list"]
            else "(no subscriptions)"
        )
        queue = (
            table(c["queue_preview"], ["topic", "qos", "size"]) if c["queue_preview"] else "(nothing queued)"
        )
        elsewhere = "".join(f"\nalso a session on {e['broker']}" for e in answer["elsewhere"])
        out = f"{head}\n\nsubscriptions:\n{subs}\n\nqueued (first 20):\n{queue}{elsewhere}{_missing(answer)}"
    elif cmd == "subscriptions":
        query = {"client_id": args.client_id, "filter": args.filter, "topic": args.topic, "limit": args.limit}
        if args.exact:
            query["exact"] = "true"
        answer = client.pages("/admin/v1/subscriptions", query, args.all)
        out = (
            table(answer["items"], ["filter", "client_id", "broker", "qos", "share_group", "connected"])
            + _more(answer)
            + _missing(answer)
        )
    elif cmd == "retained":
        answer = client.pages("/admin/v1/retained", {"filter": args.filter, "limit": args.limit}, args.all)
        rows = [
            {**r, "size": r["payload"]["size"], "payload": r["payload"].get("text", "<binary>")[:60]}
            for r in answer["items"]
        ]
        out = table(rows, ["topic", "qos", "size", "origin", "payload"]) + _more(answer)
    elif cmd == "retained-delete":
        answer = client.call("DELETE", "/admin/v1/retained", {"topic": args.topic})
        out = f"deleted the retained message of {args.topic} (every broker)"
    elif cmd == "classes":
        answer = client.call("GET", "/admin/v1/classes")
        rows = [
            {
                **c,
                "routes": "; ".join(
                    f"{r['broker']}:{r['route']}"
                    + (f" via {','.join(r['via_others'])}" if r["via_others"] else "")
                    for r in c["routes"]
                ),
                "publishes": c["counters"].get("publishes", 0),
            }
            for c in answer["classes"]
        ]
        cols = [
            "class",
            "route",
            "subscriber_brokers",
            "publisher_brokers",
            "routes",
            "publishes",
            "hops_mean",
        ]
        out = f"routing table size L = {answer['table_size']}\n" + table(rows, cols) + _missing(answer)
    elif cmd == "overlay":
        answer = client.call("GET", "/admin/v1/overlay")
        rows = [
            {
                "broker": part["broker"],
                "topic": v["topic"] or "(anchor)",
                "role": v["role"],
                "mv": v["mv"][:8],
                "entries": len(v["entries"]),
            }
            for part in answer["brokers"]
            for v in part["vnodes"]
        ]
        rows.sort(key=lambda r: (r["topic"], r["role"], r["broker"]))
        out = table(rows, ["topic", "role", "broker", "mv", "entries"]) + _missing(answer)
    elif cmd == "disconnect":
        answer = client.call(
            "POST", f"/admin/v1/clients/{urllib.parse.quote(args.client_id, safe='')}/disconnect",
            body={"discard_session": args.discard_session},
        )  # fmt: skip
        out = table(answer["results"], ["client_id", "broker", "was_connected", "session_ended"]) + _missing(
            answer
        )
    elif cmd == "publish":
        answer = client.call(
            "POST",
            "/admin/v1/publish",
            body={"topic": args.topic, "payload": args.payload, "qos": args.qos, "retain": args.retain},
        )
        out = f"published {answer['size']} bytes to {answer['topic']} from {answer['broker']}"
    elif cmd == "trace":
        target = {"client_id": args.client_id} if args.client_id else {"filter": args.filter}
        start = client.call("POST", "/admin/v1/traces", body={**target, "duration_s": args.seconds})
        if not args.json:
            print(
                f"tracing {start['kind']} {start['target']} for {args.seconds:g} s "
                f"on {', '.join(start['brokers'])} ...",
                file=sys.stderr,
            )
        time.sleep(max(0.0, start["ends_at"] - time.time()) + 0.3)
        answer = client.call("GET", f"/admin/v1/traces/{start['id']}")
        out = _trace_text(answer)
    elif cmd == "users":
        answer = client.call("GET", "/admin/v1/users")
        out = table(answer["users"], ["name", "source", "updated_by"])
    elif cmd == "user-set":
        password = os.environ.get("SKIPMQ_USER_PASSWORD") or getpass.getpass(
            f"MQTT password for {args.name}: "
        )
        answer = client.call(
            "PUT", f"/admin/v1/users/{urllib.parse.quote(args.name, safe='')}", body={"password": password}
        )
        out = f"{'added' if answer['created'] else 'changed'} user {args.name} (every broker)"
    elif cmd == "user-remove":
        answer = client.call("DELETE", f"/admin/v1/users/{urllib.parse.quote(args.name, safe='')}")
        out = f"removed user {args.name} (every broker)"
    elif cmd == "users-export":
        answer = out = client.call("GET", "/admin/v1/export/users")
    elif cmd == "users-import":
        with open(args.file, encoding="utf-8") as handle:
            answer = client.call("POST", "/admin/v1/import/users", text=handle.read())
        out = f"imported {answer['imported']} users"
    elif cmd == "acl":
        answer = client.call("GET", "/admin/v1/acl")
        rows = [
            {
                **s,
                "who": s["user"] or s["kind"],
                "rules": " ".join(f"{r['access']}:{r['filter']}" for r in s["rules"]),
            }
            for s in answer["sections"]
        ]
        state = (
            "ACL active: anything not granted is denied" if answer["active"] else "no ACL: everything allowed"
        )
        out = state + "\n" + table(rows, ["who", "source", "rules"])
    elif cmd in ("acl-set", "acl-remove"):
        path = "/admin/v1/acl/" + (
            "anonymous"
            if args.anonymous
            else "patterns"
            if args.patterns
            else "users/" + urllib.parse.quote(args.acl_user, safe="")
        )
        if cmd == "acl-set":
            rules = []
            for text in args.rules:
                access, sep, topic_filter = text.partition(":")
                if not sep:
                    raise CtlError(f"rule {text!r}: expected ACCESS:FILTER, e.g. read:plant7/#", 2)
                rules.append({"access": access, "filter": topic_filter})
            answer = client.call("PUT", path, body={"rules": rules})
            out = f"set {answer['rules']} rules (every broker)"
        else:
            answer = client.call("DELETE", path)
            out = "removed the dynamic rules (every broker)"
    elif cmd == "acl-export":
        answer = out = client.call("GET", "/admin/v1/export/acl")
    elif cmd == "acl-import":
        with open(args.file, encoding="utf-8") as handle:
            answer = client.call("POST", "/admin/v1/import/acl", text=handle.read())
        out = f"imported {answer['sections']} sections"
    else:  # pragma: no cover - argparse refuses unknown commands
        raise CtlError(f"unknown command {cmd}", 2)
    if args.json and not isinstance(answer, str):
        print(json.dumps(answer, indent=2))
    else:
        print(out.rstrip("\n"))
    return 0


def _more(answer: dict[str, Any]) -> str:
    return "\n(more: --all for every page)" if answer.get("next_cursor") else ""


def _trace_text(answer: dict[str, Any]) -> str:
    lines = [
        f"trace {answer['kind']} {answer['target']} ({answer['state']}), "
        f"connected on: {', '.join(answer['connected_on']) or '-'}"
    ]
    for direction in ("in", "out"):
        counts = answer["packets"][direction]
        if counts:
            lines.append(
                f"packets {direction}: "
                + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                + f" ({answer['bytes'][direction]} bytes)"
            )
    lines.append(f"ACL checks: {answer['acl']['allowed']} allowed, {answer['acl']['denied']} denied")
    if answer["topics"]:
        rows = [{"topic": t, **counts} for t, counts in sorted(answer["topics"].items())][:30]
        cols = ["topic", *sorted({k for r in rows for k in r if k != "topic"})]
        lines.append(table(rows, cols))
    if answer["clients"]:
        rows = [{"client_id": c, **counts} for c, counts in sorted(answer["clients"].items())][:30]
        cols = ["client_id", *sorted({k for r in rows for k in r if k != "client_id"})]
        lines.append(table(rows, cols))
    return "\n".join(lines) + _missing(answer)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except CtlError as exc:
        print(f"skipmq ctl: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
