"""Configuration errors and validation: ``ConfigError`` (names the dotted key, the bad value,
where it came from and what is allowed), the per-key type, range and choice check, the
text-to-value conversion of environment and ``--set`` values, the unknown-key suggestion, the
rules that involve several keys or the file system (``validate_together``), and the checks a
broker process makes when it starts (``validate_cluster_links``, ``validate_federation_links``).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from typing import Any

from broker.config.schema import KEYS, BrokerConfig, KeySpec
from broker.mqtt.topics import TopicError, validate_topic_filter

_TRUE_WORDS = ("true", "1", "yes")
_FALSE_WORDS = ("false", "0", "no")
_NODE_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class ConfigError(ValueError):
    """A configuration problem; the message names the key, the bad value and what is allowed."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


# --- value handling ------------------------------------------------------------------------------


def _suggest(name: str, candidates: list[str]) -> str:
    matches = [candidate for candidate in candidates if candidate.endswith("." + name)][:1]  # "tcp.port"
    matches = matches or difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if not matches:  # try the last component alone ("prot" -> "listeners.tcp.port")
        leaf = name.rsplit(".", 1)[-1]
        by_leaf = {candidate.rsplit(".", 1)[-1]: candidate for candidate in candidates}
        leaf_matches = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)
        matches = [by_leaf[leaf_matches[0]]] if leaf_matches else []
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def _unknown_key_error(name: str, source: str) -> ConfigError:
    return ConfigError(
        f"unknown configuration key {name!r} in {source}{_suggest(name, sorted(KEYS))}", key=name
    )


def _bad_value(spec: KeySpec, value: Any, source: str, problem: str = "") -> ConfigError:
    detail = problem or f"must be {spec.allowed()}"
    return ConfigError(f"{spec.name}: {detail}, got {value!r} (from {source})", key=spec.name)


def _from_text(spec: KeySpec, text: str, source: str) -> Any:
    """Convert an environment / command-line string to the key's type."""
    if spec.kind is bool:
        word = text.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        raise _bad_value(spec, text, source, "must be one of true/false/1/0/yes/no")
    if spec.kind is int:
        try:
            return int(text.strip())
        except ValueError:
            raise _bad_value(spec, text, source) from None
    return text


def _check(spec: KeySpec, value: Any, source: str) -> Any:
    """Type, range and choice check of one (already typed) value."""
    if spec.kind is bool:
        if not isinstance(value, bool):
            raise _bad_value(spec, value, source)
    elif spec.kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad_value(spec, value, source)
        if (spec.min_value is not None and value < spec.min_value) or (
            spec.max_value is not None and value > spec.max_value
        ):
            raise _bad_value(spec, value, source)
    elif not isinstance(value, str):
        raise _bad_value(spec, value, source)
    if spec.choices is not None and value not in spec.choices:
        raise _bad_value(spec, value, source)
    return value


def _wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::")


def _validate_together(flat: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """Rules that involve more than one key, or the file system."""

    def error(name: str, problem: str) -> ConfigError:
        return ConfigError(f"{name}: {problem} (from {sources.get(name, 'defaults')})", key=name)

    node_id = flat["node_id"]
    if node_id and not _NODE_ID_RE.fullmatch(node_id):
        raise error("node_id", f"must be 1..128 characters of A-Z a-z 0-9 . _ : -, got {node_id!r}")
    if not flat["data_dir"]:
        raise error("data_dir", "must not be empty")
    if flat["cluster.failure_timeout_ms"] <= flat["cluster.ping_interval_ms"]:
        raise error("cluster.failure_timeout_ms", "must be greater than cluster.ping_interval_ms")
    for contact in (item.strip() for item in flat["cluster.join"].split(",")):
        if contact:
            host, sep, port_text = contact.rpartition(":")
            if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise error(
                    "cluster.join", f"each entry must be host:port with a port in 1..65535, got {contact!r}"
                )
    for group in (item.strip() for item in flat["cluster.causal_groups"].split(",")):
        if not group:
            continue
        if group.startswith("$share/"):
            raise error("cluster.causal_groups", f"a causal group is a plain topic filter, got {group!r}")
        try:
            validate_topic_filter(group)
        except TopicError as exc:
            raise error("cluster.causal_groups", str(exc)) from None
    if flat["federation.enabled"] and not flat["federation.place"].strip():
        raise error("federation.place", "must name the event place when federation.enabled is true")
    upstream = flat["federation.upstream"].strip()
    if upstream:
        host, sep, port_text = upstream.rpartition(":")
        if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise error("federation.upstream", f"must be host:port with a port in 1..65535, got {upstream!r}")
    for name in ("listeners.tcp.host", "listeners.tls.host", "listeners.websocket.host", "http.host"):
        if not flat[name].strip():
            raise error(name, "must not be empty (use 0.0.0.0 for all interfaces)")
    if not flat["listeners.websocket.path"].startswith("/"):
        raise error(
            "listeners.websocket.path", f"must start with '/', got {flat['listeners.websocket.path']!r}"
        )

    high, low = flat["limits.memory_high_water_bytes"], flat["limits.memory_low_water_bytes"]
    if low and (not high or low >= high):
        raise error(
            "limits.memory_low_water_bytes",
            f"must be below limits.memory_high_water_bytes ({high}), got {low}",
        )
    if flat["listeners.tls.enabled"]:
        missing = [name for name in ("listeners.tls.certfile", "listeners.tls.keyfile") if not flat[name]]
        if missing:
            raise error(
                "listeners.tls.enabled",
                f"TLS is enabled but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set",
            )
        if flat["listeners.tls.require_client_cert"] and not flat["listeners.tls.cafile"]:
            raise error("listeners.tls.require_client_cert", "requires listeners.tls.cafile to be set")
        for name in ("listeners.tls.certfile", "listeners.tls.keyfile", "listeners.tls.cafile"):
            if flat[name] and not os.path.isfile(flat[name]):
                raise error(name, f"file {flat[name]!r} does not exist")
        if flat["listeners.tls.use_identity_as_username"] and not flat["listeners.tls.cafile"]:
            raise error(
                "listeners.tls.use_identity_as_username",
                "requires listeners.tls.cafile (the CA that signs the client certificates)",
            )

    if bool(flat["http.certfile"]) != bool(flat["http.keyfile"]):
        raise error("http.certfile", "HTTPS needs both http.certfile and http.keyfile")
    for name in ("http.certfile", "http.keyfile", "http.cafile"):
        if flat[name] and not os.path.isfile(flat[name]):
            raise error(name, f"file {flat[name]!r} does not exist")
    if flat["pull.enabled"] and not flat["http.enabled"]:
        raise error(
            "pull.enabled", "the pull gateway is served on the HTTP listener: set http.enabled = true"
        )

    if flat["admin.enabled"]:
        if not flat["http.enabled"]:
            raise error(
                "admin.enabled", "the admin API is served on the HTTP listener: set http.enabled = true"
            )
        if not flat["admin.users_file"]:
            raise error(
                "admin.users_file",
                "the admin API needs admin credentials (make the file with `skipmq ctl admin-user add`); "
                f"it is never served without them, on {flat['http.host']} or any other address",
            )
    for name in ("admin.users_file", "admin.peer_cafile"):
        if flat[name] and not os.path.isfile(flat[name]):
            raise error(name, f"file {flat[name]!r} does not exist")
    url = flat["admin.advertise_url"]
    if url and not re.fullmatch(r"https?://[^/\s]+", url):
        raise error("admin.advertise_url", f"must be http(s)://host:port without a path, got {url!r}")
    for name in ("auth.password_file", "auth.acl_file"):
        if flat[name] and not os.path.isfile(flat[name]):
            raise error(name, f"file {flat[name]!r} does not exist")

    bound: dict[int, tuple[str, str]] = {}
    for section in ("listeners.tcp", "listeners.tls", "listeners.websocket", "http", "cluster", "federation"):
        port = flat[section + ".port"]
        if not flat[section + ".enabled"] or port == 0:
            continue
        host = flat[section + ".host"]
        if port in bound:
            other_section, other_host = bound[port]
            if host == other_host or _wildcard(host) or _wildcard(other_host):
                raise error(
                    section + ".port", f"port {port} is also used by {other_section}.port on {other_host}"
                )
        bound[port] = (section, host)


def validate_cluster_links(config: BrokerConfig) -> None:
    """A broker process that clusters needs its mutual-TLS files, unless ``cluster.insecure``
    asks for plaintext links explicitly (docs/security.md). Checked when a broker process
    starts (``skipmq``), not by ``load_config``: in-process engines (the simulation, tests) have
    no links."""
    cluster = config.cluster
    if cluster.replicas > 1 and not cluster.enabled:
        raise ConfigError(
            f"cluster.replicas: {cluster.replicas} copies need a cluster (cluster.enabled); use 1",
            key="cluster.replicas",
        )
    if cluster.replicas > 1 and (not config.store.persistence or config.store.path == ":memory:"):
        raise ConfigError(
            f"cluster.replicas: {cluster.replicas} copies need this broker's own copy on disk "
            "(store.persistence, a store file); use 1",
            key="cluster.replicas",
        )
    if not cluster.enabled or cluster.insecure:
        return
    names = ("tls_ca_file", "tls_cert_file", "tls_key_file")
    for name in names:
        value = getattr(cluster, name)
        if not value:
            raise ConfigError(
                f"cluster.{name}: a clustered broker needs cluster.tls_ca_file, cluster.tls_cert_file "
                "and cluster.tls_key_file (make them with `skipmq certs`; docs/security.md), or "
                "cluster.insecure = true for plaintext, unauthenticated links",
                key=f"cluster.{name}",
            )
        if not os.path.isfile(value):
            raise ConfigError(f"cluster.{name}: file {value!r} does not exist", key=f"cluster.{name}")


def validate_federation_links(config: BrokerConfig) -> None:
    """A federated broker process needs its mutual-TLS files, unless ``federation.insecure``
    asks for plaintext links explicitly (docs/federation.md "Security"); checked when a broker
    process starts, like ``validate_cluster_links``."""
    federation = config.federation
    if not federation.enabled or federation.insecure:
        return
    for name in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        value = getattr(federation, name)
        if not value:
            raise ConfigError(
                f"federation.{name}: a federated broker needs federation.tls_ca_file, "
                "federation.tls_cert_file and federation.tls_key_file (make them with `skipmq certs`; "
                "docs/federation.md), or federation.insecure = true for plaintext, unauthenticated links",
                key=f"federation.{name}",
            )
        if not os.path.isfile(value):
            raise ConfigError(f"federation.{name}: file {value!r} does not exist", key=f"federation.{name}")
