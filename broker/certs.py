"""``skipmq certs``: make the cluster CA and the brokers' certificates for mutual TLS between
brokers (docs/security.md "Making and rotating certificates").

    skipmq certs init DIR                      # DIR/ca.pem, DIR/ca.key (0600); never overwrites
    skipmq certs issue DIR HOST:PORT [--name N] [--out OUT] [--days D]
                                               # OUT/N.pem, OUT/N.key signed by DIR's CA

The peer id ``HOST:PORT`` is what the broker advertises (``cluster.advertise_host`` and
``cluster.port``); its certificate names it as ``skipmq://HOST:PORT`` and HOST as an IP/DNS name.
Then set ``cluster.tls_ca_file``, ``cluster.tls_cert_file`` and ``cluster.tls_key_file``.
"""

from __future__ import annotations

import argparse
import sys

from broker.adapters.transport.tls import issue_broker_cert, make_ca, split_peer_id


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skipmq certs",
        description="Make the cluster CA and per-broker certificates (mutual TLS between brokers).",
        epilog="Rotation: issue a new certificate into the same files (write to a temporary name and "
        "rename): a broker re-reads them for new links without a restart. docs/security.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="make a new cluster CA (ca.pem, ca.key) in DIR")
    init.add_argument("dir", metavar="DIR")
    init.add_argument("--days", type=int, default=3650, help="validity in days (default 3650)")
    issue = sub.add_parser("issue", help="make a broker certificate signed by the CA in DIR")
    issue.add_argument("dir", metavar="DIR", help="directory holding ca.pem and ca.key")
    issue.add_argument("peer_id", metavar="HOST:PORT", help="the broker's peer id (advertised host:port)")
    issue.add_argument("--name", help="file name stem (default: the peer id with ':' as '_')")
    issue.add_argument("--out", help="output directory (default: DIR)")
    issue.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "init":
            cert, key = make_ca(args.dir, days=args.days)
        else:
            split_peer_id(args.peer_id)
            cert, key = issue_broker_cert(
                args.dir, args.peer_id, out_dir=args.out, name=args.name, days=args.days
            )
    except (OSError, ValueError) as exc:
        print(f"skipmq certs: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {cert} and {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
