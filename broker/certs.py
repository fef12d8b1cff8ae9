"""``skipmq certs``: make the cluster CA and the brokers' certificates for mutual TLS between
brokers (docs/security.md "Making and rotating certificates").

    skipmq certs init DIR                      # DIR/ca.pem, DIR/ca.key (0600); never overwrites
    skipmq certs issue DIR HOST:PORT [--name N] [--out OUT] [--days D]
                                               # OUT/N.pem, OUT/N.key signed by DIR's CA

The peer id ``HOST:PORT`` is what the broker advertises (``cluster.advertise_host`` and
``cluster.port``); its certificate names it as ``skipmq://HOST:PORT`` and HOST as an IP/DNS name.
Then set ``cluster.tls_ca_file``, ``cluster.tls_cert_file`` and ``cluster.tls_key_file``.

:func:`validate_cluster_identity` checks those files when a broker process starts (``skipmq``):
a certificate that does not parse, a key that is not its key, a certificate that is expired,
not issued by a CA of the bundle or not naming the broker's own peer id is a configuration error
naming the key (exit status 2), not a broker that starts and is never let in.
"""

from __future__ import annotations

import argparse
import datetime
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.config import BrokerConfig


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number of days, not {text!r}") from None
    if days < 1:
        raise argparse.ArgumentTypeError(f"a certificate must be valid for at least 1 day, got {days}")
    return days


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
    init.add_argument("--days", type=_days, default=3650, help="validity in days, >= 1 (default 3650)")
    issue = sub.add_parser("issue", help="make a broker certificate signed by the CA in DIR")
    issue.add_argument("dir", metavar="DIR", help="directory holding ca.pem and ca.key")
    issue.add_argument("peer_id", metavar="HOST:PORT", help="the broker's peer id (advertised host:port)")
    issue.add_argument("--name", help="file name stem (default: the peer id with ':' as '_')")
    issue.add_argument("--out", help="output directory (default: DIR)")
    issue.add_argument("--days", type=_days, default=365, help="validity in days, >= 1 (default 365)")
    return parser


def main(argv: list[str] | None = None) -> int:
    # here, not at the top: `skipmq` imports this module to check the cluster's files, and the
    # transport package brings grpc, protobuf and cryptography (~28 MiB) into a broker that may not cluster
    from broker.adapters.transport.tls import issue_broker_cert, make_ca, split_peer_id

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


def advertised_peer_id(config: BrokerConfig) -> str | None:
    """The peer id the broker will advertise (``cluster.advertise_host:cluster.port``, as the
    cluster runtime computes it); None while the port is chosen at start (0)."""
    cluster = config.cluster
    if not cluster.port:
        return None
    host = cluster.advertise_host or (
        cluster.host if cluster.host not in ("0.0.0.0", "::", "") else socket.gethostname()
    )
    return (
        f"[{host}]:{cluster.port}" if ":" in host and not host.startswith("[") else f"{host}:{cluster.port}"
    )


def validate_cluster_identity(config: BrokerConfig) -> None:
    """ConfigError naming the key unless the cluster's TLS files make a usable identity: the CA
    bundle holds a CA, the certificate and key parse and belong together, the certificate is valid
    now, was issued by a CA of the bundle (what the other brokers check) and names this broker's
    peer id (``skipmq://host:port``, what they check against its Hello). Federation's pair too."""
    from broker.config import ConfigError

    cluster = config.cluster
    if cluster.enabled and not cluster.insecure:
        problem = _identity_problem(
            "cluster",
            cluster.tls_ca_file,
            cluster.tls_cert_file,
            cluster.tls_key_file,
            advertised_peer_id(config),
            check_chain=True,
        )
        if problem is not None:
            raise ConfigError(problem[1], key=problem[0])
    federation = config.federation
    if federation.enabled and not federation.insecure:
        problem = _identity_problem(
            "federation", federation.tls_ca_file, federation.tls_cert_file, federation.tls_key_file, None
        )
        if problem is not None:
            raise ConfigError(problem[1], key=problem[0])


def _identity_problem(
    section: str,
    ca_file: str,
    cert_file: str,
    key_file: str,
    peer_id: str | None,
    *,
    check_chain: bool = False,
) -> tuple[str, str] | None:
    """(key, message) of the first problem of one section's TLS files, or None. ``check_chain``:
    the certificate must come from a CA of the section's own bundle (true in a cluster, whose
    brokers share the bundle; a federation peer may trust another place's CA)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from broker.cluster.origin_proof import Signer, Verifier, peer_ids_named

    def read(name: str, path: str) -> bytes:
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except OSError as exc:
            raise _Problem(
                f"{section}.{name}", f"{section}.{name}: cannot read {path!r}: {exc.strerror}"
            ) from None

    try:
        ca_pem, cert_pem, key_pem = (
            read("tls_ca_file", ca_file),
            read("tls_cert_file", cert_file),
            read("tls_key_file", key_file),
        )
        try:
            verifier = Verifier(ca_pem)
        except ValueError as exc:
            raise _Problem(f"{section}.tls_ca_file", f"{section}.tls_ca_file: {ca_file!r}: {exc}") from None
        try:
            certificate = x509.load_pem_x509_certificate(cert_pem)
        except ValueError:
            raise _Problem(
                f"{section}.tls_cert_file", f"{section}.tls_cert_file: {cert_file!r} is not a PEM certificate"
            ) from None
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError) as exc:
            raise _Problem(
                f"{section}.tls_key_file",
                f"{section}.tls_key_file: {key_file!r} is not an unencrypted PEM private key ({exc})",
            ) from None
        try:
            Signer(certificate, key)
        except ValueError as exc:
            raise _Problem(
                f"{section}.tls_key_file",
                f"{section}.tls_key_file: the key in {key_file!r} does not belong to the certificate "
                f"in {cert_file!r} ({exc})",
            ) from None
        now = datetime.datetime.now(datetime.UTC)
        valid_from, valid_to = certificate.not_valid_before_utc, certificate.not_valid_after_utc
        if not valid_from <= now <= valid_to:
            raise _Problem(
                f"{section}.tls_cert_file",
                f"{section}.tls_cert_file: {cert_file!r} is valid from {valid_from:%Y-%m-%d %H:%M} to "
                f"{valid_to:%Y-%m-%d %H:%M} UTC, not now (issue a new one: skipmq certs issue)",
            )
        chained = verifier.issued_by_bundle(certificate, now.timestamp()) if check_chain else None
        if chained is not None:
            raise _Problem(
                f"{section}.tls_cert_file", f"{section}.tls_cert_file: {cert_file!r}: {chained} {ca_file!r}"
            )
        if peer_id is not None and peer_id not in peer_ids_named(certificate):
            names = sorted(peer_ids_named(certificate))
            raise _Problem(
                f"{section}.tls_cert_file",
                f"{section}.tls_cert_file: {cert_file!r} names the peer ids {names}, not this broker's "
                f"{peer_id!r} ({section}.advertise_host:{section}.port); the other brokers would refuse "
                f"its links (skipmq certs issue DIR {peer_id})",
            )
    except _Problem as problem:
        return problem.key, problem.message
    return None


class _Problem(Exception):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


if __name__ == "__main__":
    sys.exit(main())
