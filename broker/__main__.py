"""The ``skipmq`` command (also ``python -m broker``): run the broker, or manage password files.

``skipmq [run] [options]`` runs a broker; every option is a configuration override (dotted keys
as documented in docs/configuration.md). ``skipmq passwd ...`` is ``broker.auth.passwd.main``,
``skipmq ctl ...`` is ``broker.ctl.main`` (the admin API from the shell).
A bad configuration exits with status 2 and the ConfigError message on stderr; a broker that
cannot start (a port in use, an unusable data directory, a bad certificate) exits with status 1
and one ``skipmq: cannot start: ...`` line on stderr, without a traceback. ``--version`` prints
the version.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

DESCRIPTION = """\
SkipMQ MQTT 3.1.1/5.0 broker.

Commands:
  skipmq [run] [options]    run the broker (the default command)
  skipmq passwd ...         create/update password files (see: skipmq passwd --help)
  skipmq pull ...           receive messages over the HTTP pull gateway (see: skipmq pull --help)
  skipmq cluster ...        start N brokers on loopback as one cluster (see: skipmq cluster --help)
  skipmq certs ...          make the cluster CA and broker certificates (see: skipmq certs --help)
  skipmq ctl ...            administer the cluster through the admin API (see: skipmq ctl --help)
  skipmq drain ...          hand this host's broker's sessions and log over before removal (--help)

Configuration precedence: built-in defaults < --config TOML file < SKIPMQ_* environment
variables < command-line flags. Each flag below is a shorthand for one configuration key
(shown in brackets); --set KEY=VALUE sets any key (docs/configuration.md lists them all).
On start the broker logs one event="listening" line with every bound port (the real port
when 0 was asked for). SIGTERM/SIGINT stop it gracefully (exit status 0).
"""

# flag dest -> dotted configuration key
FLAG_KEYS: dict[str, str] = {
    "bind": "listeners.tcp.host",
    "port": "listeners.tcp.port",
    "tls_port": "listeners.tls.port",
    "ws_port": "listeners.websocket.port",
    "http_port": "http.port",
    "data_dir": "data_dir",
    "node_id": "node_id",
    "log_level": "logging.level",
    "log_format": "logging.format",
    "allow_anonymous": "auth.allow_anonymous",
    "password_file": "auth.password_file",
    "acl_file": "auth.acl_file",
    "uvloop": "uvloop",
    "join": "cluster.join",
    "cluster_port": "cluster.port",
    "cluster_host": "cluster.host",
    "advertise_host": "cluster.advertise_host",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skipmq", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    from broker import __version__

    parser.add_argument(
        "--version", action="version", version=f"skipmq {__version__}", help="print the version and exit"
    )
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file (default: $SKIPMQ_CONFIG)")
    parser.add_argument("--bind", metavar="HOST", help="address of the TCP listener [listeners.tcp.host]")
    parser.add_argument(
        "--port", type=int, metavar="N", help="MQTT TCP port, 0 = ephemeral [listeners.tcp.port]"
    )
    parser.add_argument(
        "--tls-port",
        type=int,
        metavar="N",
        help="MQTT over TLS port [listeners.tls.port]; enables TLS (needs listeners.tls.certfile, keyfile)",
    )
    parser.add_argument(
        "--ws-port",
        type=int,
        metavar="N",
        help="MQTT over WebSocket port [listeners.websocket.port]; enables the listener",
    )
    parser.add_argument("--http-port", type=int, metavar="N", help="/metrics and /healthz port [http.port]")
    parser.add_argument("--data-dir", metavar="DIR", help="directory of the store [data_dir]")
    parser.add_argument("--node-id", metavar="ID", help="this broker's cluster id [node_id]")
    parser.add_argument("--log-level", metavar="L", help="debug|info|warning|error [logging.level]")
    parser.add_argument("--log-format", choices=("json", "text"), help="log line format [logging.format]")
    parser.add_argument(
        "--allow-anonymous",
        dest="allow_anonymous",
        action="store_true",
        default=None,
        help="accept clients without a username [auth.allow_anonymous=true]",
    )
    parser.add_argument(
        "--no-allow-anonymous",
        dest="allow_anonymous",
        action="store_false",
        help="require a username and password [auth.allow_anonymous=false]",
    )
    parser.add_argument(
        "--password-file", metavar="F", help="password file made by skipmq passwd [auth.password_file]"
    )
    parser.add_argument("--acl-file", metavar="F", help="mosquitto-style ACL file [auth.acl_file]")
    parser.add_argument(
        "--no-uvloop",
        dest="uvloop",
        action="store_false",
        default=None,
        help="use the standard asyncio event loop even if uvloop is installed [uvloop=false]",
    )
    parser.add_argument(
        "--join",
        metavar="HOST:PORT,...",
        help="join the cluster through these brokers' cluster ports (a DNS name may resolve to several)"
        " [cluster.join]; enables clustering",
    )
    parser.add_argument(
        "--cluster-port",
        type=int,
        metavar="N",
        help="cluster gRPC port, 0 = ephemeral [cluster.port]; enables clustering",
    )
    parser.add_argument(
        "--cluster-host", metavar="HOST", help="address of the cluster listener [cluster.host]"
    )
    parser.add_argument(
        "--advertise-host",
        metavar="HOST",
        help="host other brokers dial for this one [cluster.advertise_host]",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set any configuration key, e.g. --set limits.max_queued_messages=10 (repeatable)",
    )
    return parser


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    from broker.config import parse_override

    overrides: dict[str, Any] = {}
    for dest, key in FLAG_KEYS.items():
        value = getattr(args, dest, None)
        if value is not None:
            overrides[key] = value
    if args.ws_port is not None:
        overrides["listeners.websocket.enabled"] = True
    if args.join is not None or args.cluster_port is not None:
        overrides["cluster.enabled"] = True
    if args.tls_port is not None:  # needs listeners.tls.certfile / keyfile (the error names them)
        overrides["listeners.tls.enabled"] = True
    for text in args.settings:
        key, value = parse_override(text)
        overrides[key] = value
    return overrides


def run(argv: list[str]) -> int:
    from broker.config import ConfigError, load_config, validate_cluster_links, validate_federation_links

    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config, overrides=overrides_from_args(args))
        validate_cluster_links(config)
        validate_federation_links(config)
        from broker.certs import validate_cluster_identity

        validate_cluster_identity(config)  # the files make a usable identity (docs/security.md)
    except (ConfigError, OSError) as exc:
        print(f"skipmq: configuration error: {exc}", file=sys.stderr)
        return 2
    import logging

    from broker.logs import log_event, setup_logging

    setup_logging(config.logging.level, config.logging.format)
    for warning in config.warnings:  # ignored SKIPMQ_* variables (Kubernetes service links, ...)
        log_event(logging.getLogger("skipmq.config"), logging.WARNING, "config_warning", message=warning)
    from broker.adapters.server import StartupError, serve_until_signal

    try:
        if config.uvloop:
            try:
                import uvloop
            except ImportError:
                uvloop = None  # type: ignore[assignment]
            if uvloop is not None:
                return int(uvloop.run(serve_until_signal(config)))
        return asyncio.run(serve_until_signal(config))
    except StartupError as exc:
        print(f"skipmq: cannot start: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments and arguments[0] == "passwd":
        from broker.auth.passwd import main as passwd_main

        return passwd_main(arguments[1:])
    if arguments and arguments[0] == "pull":
        from broker.pull_client import main as pull_main

        return pull_main(arguments[1:])
    if arguments and arguments[0] == "certs":
        from broker.certs import main as certs_main

        return certs_main(arguments[1:])
    if arguments and arguments[0] == "ctl":
        from broker.ctl import main as ctl_main

        return ctl_main(arguments[1:])
    if arguments and arguments[0] == "drain":
        from broker.drain_command import drain_main

        return drain_main(arguments[1:])
    if arguments and arguments[0] == "cluster":
        from tools.launcher import main as cluster_main

        return cluster_main(arguments[1:])
    if arguments and arguments[0] == "run":
        arguments = arguments[1:]
    return run(arguments)


if __name__ == "__main__":
    sys.exit(main())
