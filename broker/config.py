"""Validated broker configuration: defaults < TOML file < environment < CLI overrides.

Every key is a field of a frozen dataclass below; its type, default, range or allowed values live
in the field's metadata, so this module is the single source for validation, environment
variable names (``SKIPMQ_<DOTTED_KEY_UPPERCASED_WITH_UNDERSCORES>``) and the reference in
docs/configuration.md (a test checks the document lists every key).

Errors raise ``ConfigError`` naming the dotted key, the bad value, where it came from and what
is allowed. Unknown keys in the file or in overrides are errors with the closest known key
suggested, and so are unknown ``SKIPMQ_*`` environment variables (the closest valid variable
named), except Kubernetes service-link variables (``SKIPMQ_PORT=tcp://...``,
``SKIPMQ_SERVICE_HOST``, ``SKIPMQ_PEERS_PORT_7883_TCP_ADDR``, ... injected for services whose
name starts with ``skipmq``) and the knobs of SkipMQ's own test tools (``SKIPMQ_TEST_*``,
``SKIPMQ_ZL_*``, which brokers started by those tests inherit): those are listed in
``BrokerConfig.warnings`` for the broker to log.

Size: one frozen dataclass per configuration section with every key's help, range and default
(the single source of truth the docs test reads), and the loader; splitting the sections apart
would scatter that one table.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from broker.mqtt.topics import TopicError, validate_topic_filter

ENV_PREFIX = "SKIPMQ_"
CONFIG_FILE_ENV = "SKIPMQ_CONFIG"  # path of the TOML file when load_config(path=None)

_TRUE_WORDS = ("true", "1", "yes")
_FALSE_WORDS = ("false", "0", "no")
_NODE_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_UINT32_MAX = 4_294_967_295


class ConfigError(ValueError):
    """A configuration problem; the message names the key, the bad value and what is allowed."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


def _key(
    default: Any,
    doc: str,
    *,
    min_value: int | None = None,
    max_value: int | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A configuration field: default plus validation metadata."""
    return field(
        default=default,
        metadata={"doc": doc, "min": min_value, "max": max_value, "choices": choices},
    )


# --- the configuration schema --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreConfig:
    path: str = _key("", 'SQLite database file; "" means <data_dir>/skipmq.db')
    synchronous: str = _key(
        "normal",
        "SQLite synchronous mode: normal (a process crash loses nothing committed; power loss may "
        "lose the last commits) or full (fsync per commit, survives power loss)",
        choices=("normal", "full"),
    )
    persistence: bool = _key(True, "keep persistent sessions, queues and retained messages in the store")


@dataclass(frozen=True, slots=True)
class TcpListenerConfig:
    enabled: bool = _key(True, "accept plain MQTT over TCP")
    host: str = _key("0.0.0.0", "address to bind")
    port: int = _key(1883, "TCP port (0 = an ephemeral port)", min_value=0, max_value=65535)


@dataclass(frozen=True, slots=True)
class TlsListenerConfig:
    enabled: bool = _key(False, "accept MQTT over TLS (requires certfile and keyfile)")
    host: str = _key("0.0.0.0", "address to bind")
    port: int = _key(8883, "TLS port (0 = an ephemeral port)", min_value=0, max_value=65535)
    certfile: str = _key("", "PEM server certificate (chain)")
    keyfile: str = _key("", "PEM private key of certfile")
    cafile: str = _key("", "PEM CA bundle to verify client certificates")
    require_client_cert: bool = _key(
        False,
        "require a client certificate signed by cafile (false with cafile set: a certificate is "
        "optional, but one that is presented must verify)",
    )
    use_identity_as_username: bool = _key(
        False,
        "a client with a verified certificate is authenticated by it: its identity "
        "(listeners.tls.identity_field) is the MQTT user name, the CONNECT's user name and password "
        "are ignored; without require_client_cert, clients without a certificate use the password "
        "file as on TCP",
    )
    identity_field: str = _key(
        "cn",
        "which part of the client certificate is the user name: cn (subject common name), "
        "san_dns, san_email or san_uri (the first subject alternative name of that type); a "
        "certificate without it is refused with 0x87",
        choices=("cn", "san_dns", "san_email", "san_uri"),
    )


@dataclass(frozen=True, slots=True)
class WebSocketListenerConfig:
    enabled: bool = _key(False, 'accept MQTT over WebSocket (subprotocol "mqtt")')
    host: str = _key("0.0.0.0", "address to bind")
    port: int = _key(8080, "WebSocket port (0 = an ephemeral port)", min_value=0, max_value=65535)
    path: str = _key("/mqtt", "HTTP path of the WebSocket endpoint (starts with /)")


@dataclass(frozen=True, slots=True)
class ListenersConfig:
    tcp: TcpListenerConfig = field(default_factory=TcpListenerConfig)
    tls: TlsListenerConfig = field(default_factory=TlsListenerConfig)
    websocket: WebSocketListenerConfig = field(default_factory=WebSocketListenerConfig)


@dataclass(frozen=True, slots=True)
class HttpConfig:
    enabled: bool = _key(True, "serve GET /metrics (Prometheus) and GET /healthz")
    host: str = _key("127.0.0.1", "address to bind")
    port: int = _key(9090, "HTTP port (0 = an ephemeral port)", min_value=0, max_value=65535)
    certfile: str = _key("", "PEM server certificate (chain): set with keyfile to serve HTTPS")
    keyfile: str = _key("", "PEM private key of certfile")
    cafile: str = _key("", "PEM CA bundle to verify client certificates (optional)")
    header_timeout_s: int = _key(
        10,
        "a connection that has not sent a whole request's headers this long after it opened or after"
        " its previous response is closed (slowloris guard and keep-alive idle timeout); a /v1/* body must"
        " also arrive within this time (else 408)",
        min_value=1,
        max_value=3600,
    )


@dataclass(frozen=True, slots=True)
class AdminConfig:
    enabled: bool = _key(
        False,
        "serve the admin API /admin/v1/* and the web console /console/ on the HTTP listener "
        "(docs/operations.md); needs admin.users_file",
    )
    users_file: str = _key(
        "",
        "admin users, one name:role:hash per line (role admin or readonly), made with "
        "`skipmq ctl admin-user`; separate from the MQTT users",
    )
    advertise_url: str = _key(
        "",
        'the URL other brokers reach this broker\'s admin API at; "" = http(s)://<http.host, or '
        "cluster.advertise_host when http.host is a wildcard>:<http port>",
    )
    fanout_timeout_ms: int = _key(
        3000,
        "how long a cluster-wide admin answer waits for each other broker's part (a broker that "
        "does not answer in time is named in the answer)",
        min_value=100,
        max_value=60000,
    )
    peer_cafile: str = _key(
        "",
        "PEM CA bundle to verify other brokers' HTTPS admin endpoints; \"\" = the system's trust store",
    )
    console: bool = _key(True, "serve the web console at /console/ (with admin.enabled)")


@dataclass(frozen=True, slots=True)
class PullConfig:
    enabled: bool = _key(False, "serve the HTTP pull gateway /v1/* on the HTTP listener (docs/pull.md)")
    max_body_bytes: int = _key(
        65536, "largest request body of /v1/* (413 names this key)", min_value=1024, max_value=16777216
    )
    max_wait_s: int = _key(
        30, "longest long-poll a client may ask for in POST /v1/pull", min_value=0, max_value=300
    )
    requests_per_s: int = _key(
        50,
        "authenticated requests per second per client id (bucket of the same size; 429 names this key)",
        min_value=1,
    )
    failures_per_s: int = _key(
        10,
        "refused requests (bad credentials, malformed) per second per source address; beyond it the"
        " address gets 429 naming this key before its credentials are checked",
        min_value=1,
    )
    lease_s: int = _key(
        30,
        "a pull session stays attached (receiving into its buffer) this long after its last request",
        min_value=1,
        max_value=3600,
    )
    session_expiry_s: int = _key(
        86400, "session expiry of a pull session when the request does not give one", min_value=1
    )


@dataclass(frozen=True, slots=True)
class AuthConfig:
    allow_anonymous: bool = _key(True, "accept clients that send no username")
    password_file: str = _key("", "password file (skipmq passwd); must exist when set")
    acl_file: str = _key("", "ACL file; must exist when set")


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_packet_size_bytes: int = _key(
        1_048_576,
        "largest MQTT packet accepted (larger: DISCONNECT 0x95)",
        min_value=1,
        max_value=268_435_455,
    )
    receive_maximum: int = _key(
        100,
        "QoS>0 PUBLISH a client may have unacknowledged towards the broker (MQTT 5 Receive Maximum)",
        min_value=1,
        max_value=65535,
    )
    max_inflight_messages: int = _key(
        20,
        "outgoing QoS>0 window per client (capped by the client's receive maximum)",
        min_value=1,
        max_value=65535,
    )
    max_queued_messages: int = _key(
        1000,
        "QoS>0 messages queued per client beyond the in-flight window",
        min_value=1,
        max_value=2**31 - 1,
    )
    queue_overflow: str = _key(
        "drop_oldest", "what a full queue does with a new message", choices=("drop_oldest", "drop_new")
    )
    max_keepalive_s: int = _key(
        0,
        "0 = accept the client's keep alive; else the server keep alive caps it",
        min_value=0,
        max_value=65535,
    )
    topic_alias_maximum: int = _key(
        10, "topic aliases a client may use towards the broker (0 = none)", min_value=0, max_value=65535
    )
    max_session_expiry_s: int = _key(
        604_800,
        "cap on session expiry, also for MQTT 3.1.1 persistent sessions (0 = no cap)",
        min_value=0,
        max_value=_UINT32_MAX,
    )
    maximum_qos: int = _key(2, "highest QoS granted and accepted", min_value=0, max_value=2)
    retain_available: bool = _key(True, "accept retained messages")
    max_client_id_length: int = _key(
        65535, "longest client identifier accepted", min_value=23, max_value=65535
    )
    max_connections: int = _key(
        0, "concurrent client connections (0 = unlimited)", min_value=0, max_value=2**31 - 1
    )
    connect_timeout_s: int = _key(
        10, "seconds a new connection has to send CONNECT", min_value=1, max_value=3600
    )
    max_connect_packet_bytes: int = _key(
        65_536,
        "largest packet accepted before a CONNECT succeeded (the CONNECT itself and what is "
        "pipelined behind it; larger: CONNACK 0x95); caps the memory of unauthenticated sockets",
        min_value=64,
        max_value=268_435_455,
    )
    max_connections_per_ip: int = _key(
        0,
        "concurrent sockets from one IP address (0 = unlimited); beyond: CONNACK 0x97 Quota exceeded",
        min_value=0,
        max_value=2**31 - 1,
    )
    connect_rate_per_ip: int = _key(
        0,
        "new connections per second from one IP address, bursts up to twice that (0 = unlimited); "
        "beyond: CONNACK 0x9F Connection rate exceeded",
        min_value=0,
        max_value=1_000_000,
    )
    max_publish_rate: int = _key(
        0,
        "PUBLISH packets per second one connection may send, bursts up to twice that (0 = "
        "unlimited); beyond: DISCONNECT 0x96 Message rate too high (3.1.1: closed)",
        min_value=0,
        max_value=10_000_000,
    )
    max_output_buffer_bytes: int = _key(
        4_194_304,
        "slow consumers: a client whose unsent output is above this gets no QoS 0 messages "
        "(dropped, counted as reason slow_consumer); QoS 1/2 wait in its session queue",
        min_value=1024,
        max_value=2**31 - 1,
    )
    memory_high_water_bytes: int = _key(
        0,
        "the broker process's resident memory (RSS) above which it refuses new connections "
        "(CONNACK 0x89 Server busy), drops incoming QoS 0 PUBLISHes (counted as reason "
        "memory_high_water) and stops reading from clients that publish QoS 1/2, until RSS is "
        "below limits.memory_low_water_bytes (0 = off; docs/security.md)",
        min_value=0,
        max_value=2**62,
    )
    memory_low_water_bytes: int = _key(
        0,
        "RSS below which the broker recovers from the memory high-water mark (0 = 80% of "
        "limits.memory_high_water_bytes)",
        min_value=0,
        max_value=2**62,
    )
    memory_trim_heap: bool = _key(
        True,
        "while above limits.memory_high_water_bytes, ask glibc to return freed heap memory to the "
        "system (malloc_trim) before each RSS reading, so that RSS falls when buffers are freed",
    )
    memory_check_interval_ms: int = _key(
        500,
        "how often RSS is read (/proc/self/statm) while a memory high-water mark is set",
        min_value=10,
        max_value=60_000,
    )


@dataclass(frozen=True, slots=True)
class SysConfig:
    interval_s: int = _key(
        10, "seconds between $SYS publications (0 disables $SYS)", min_value=0, max_value=86400
    )


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    level: str = _key("info", "log level", choices=("debug", "info", "warning", "error"))
    format: str = _key("json", "json (one object per line) or text", choices=("json", "text"))
    dropped_messages_interval_s: int = _key(
        10,
        "at most one messages_dropped warning per client per this many seconds (the rest are summed)",
        min_value=1,
        max_value=86400,
    )


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    enabled: bool = _key(
        False, "join a SkipMQ cluster (the overlay over gRPC); --join or --cluster-port set it"
    )
    host: str = _key("127.0.0.1", "address the cluster gRPC listener binds")
    port: int = _key(7883, "cluster gRPC port (0 = an ephemeral port)", min_value=0, max_value=65535)
    advertise_host: str = _key(
        "", 'host other brokers dial to reach this one; "" = cluster.host (or the hostname if it is 0.0.0.0)'
    )
    join: str = _key(
        "",
        "comma-separated host:port of brokers to join through; a DNS name resolving to several "
        "addresses (Kubernetes headless service) contacts each of them",
    )
    class_levels: int = _key(
        1,
        "topic levels that form a topic class, the overlay's routing unit (docs/cluster.md)",
        min_value=1,
        max_value=16,
    )
    table_size: int = _key(
        60, "L: routing-table entries per overlay virtual node (seed 003 §3.3)", min_value=2, max_value=10_000
    )
    class_snapshot_interval_s: int = _key(
        10,
        "seconds between the per-class snapshots published locally on $SYS/skipmq/<broker-id>/classes "
        "(docs/pipeline.md; 0 disables them)",
        min_value=0,
        max_value=86400,
    )
    takeover_wait_ms: int = _key(
        500,
        "longest a CONNECT with clean start 0 waits for another broker to hand over the session",
        min_value=0,
        max_value=60_000,
    )
    publish_ack_wait_ms: int = _key(
        5000,
        "longest the overlay waits for a forwarded publication's completion (every subscriber "
        "broker stored it) before the send log publishes it again; PUBACKs never wait for it",
        min_value=0,
        max_value=600_000,
    )
    reorder_hold_ms: int = _key(
        200,
        "how long a forwarded message waits for an earlier one of its stream before the receiver "
        "asks the sender for it (RET); a gap is never skipped on a timer",
        min_value=0,
        max_value=600_000,
    )
    retransmit_ms: int = _key(
        1000,
        "the send log resends what a receiver broker has not acknowledged, and a receiver repeats "
        "its RET, after this long",
        min_value=10,
        max_value=600_000,
    )
    ack_delay_ms: int = _key(
        20,
        "a receiver broker acknowledges its streams this long after the first change, and holds "
        "the overlay's per-hop ACK and DONE of what it received as long, to send them all in one "
        "frame (0: each at once)",
        min_value=0,
        max_value=60_000,
    )
    send_log_retention_s: int = _key(
        3600,
        "a receiver broker silent this long (removed from the cluster) is given up: the send log "
        "stops keeping messages for it (counted in skipmq_cluster_receivers_given_up_total)",
        min_value=1,
        max_value=30 * 86400,
    )
    send_log_min_retention_ms: int = _key(
        10000,
        "a QoS>=1 message stays in the send log at least this long after it was delivered everywhere "
        "known, for a receiver broker that was cut off before the sender learned of it",
        min_value=0,
        max_value=3_600_000,
    )
    local_qos1_in_memory: bool = _key(
        False,
        "a QoS>=1 publish that only local subscribers receive (every known broker connected) is "
        "acknowledged without a send-log commit: faster, but an unnoticed partition plus a crash of "
        "this broker can lose it for a broker that subscribed meanwhile (docs/cluster.md)",
    )
    presence_grace_ms: int = _key(
        2000,
        "messages of a class without subscribers are kept this long and forwarded if a subscription "
        "appears meanwhile (the rendezvous point's notification delay)",
        min_value=0,
        max_value=600_000,
    )
    retained_anti_entropy_ms: int = _key(
        2000,
        "every this long a broker compares a digest of its retained versions with the next peer "
        "and copies the peer's retained store when they differ (0 = off)",
        min_value=0,
        max_value=3_600_000,
    )
    subscribe_wait_ms: int = _key(
        3000,
        "longest a SUBACK (and the CONNACK of a session that moved here) waits for its topic classes "
        "to be reachable in the overlay",
        min_value=0,
        max_value=600_000,
    )
    causal_groups: str = _key(
        "",
        "comma-separated MQTT topic filters whose messages are delivered in causal order at every "
        "broker (seed 004's CO service; set the same on every broker, docs/cluster.md)",
    )
    causal_wait_ms: int = _key(
        30000,
        "longest a message of a causal group waits for one it depends on whose broker does not "
        "answer (then delivered without it, counted in skipmq_cluster_causal_given_up_total)",
        min_value=1,
        max_value=3_600_000,
    )
    ping_interval_ms: int = _key(
        2000, "liveness probe period of overlay neighbours", min_value=100, max_value=600_000
    )
    failure_timeout_ms: int = _key(
        6000,
        "silence after which a neighbour broker is declared crashed (> ping_interval_ms)",
        min_value=200,
        max_value=3_600_000,
    )
    tls_ca_file: str = _key(
        "", "PEM cluster CA (skipmq certs init): peers must present a certificate it signed"
    )
    tls_cert_file: str = _key(
        "", "PEM certificate of this broker naming its peer id (skipmq certs issue); re-read when it changes"
    )
    tls_key_file: str = _key("", "PEM private key of cluster.tls_cert_file")
    insecure: bool = _key(
        False,
        "plaintext, unauthenticated cluster links (anyone reaching the cluster port is a broker); "
        "without it a clustered broker needs cluster.tls_ca_file, tls_cert_file and tls_key_file",
    )
    origin_proofs: str = _key(
        "required",
        "what this broker originates (stream items, retained updates, claims, directed messages) is "
        "signed with the key of cluster.tls_cert_file and checked by every receiver: 'required' "
        "refuses items without a valid proof, 'optional' only invalid ones (a rolling upgrade from "
        "a version without proofs), 'off' signs and checks nothing (always off with cluster.insecure)",
        choices=("required", "optional", "off"),
    )
    max_frame_bytes: int = _key(
        67_108_864,
        "largest gRPC message (frame of items) sent or accepted on a cluster link; a larger one "
        "closes that link only",
        min_value=65_536,
        max_value=2**31 - 1,
    )
    max_batch_items: int = _key(
        256,
        "items per frame sent; a received frame with more closes that link only (set the same "
        "on every broker)",
        min_value=1,
        max_value=1_000_000,
    )


@dataclass(frozen=True, slots=True)
class FederationConfig:
    enabled: bool = _key(
        False, "federate this broker's site with other sites over SIONet shared links (docs/federation.md)"
    )
    host: str = _key("127.0.0.1", "address the federation gRPC listener binds")
    port: int = _key(7990, "federation gRPC port (0 = an ephemeral port)", min_value=0, max_value=65535)
    advertise_host: str = _key(
        "", 'host other sites dial to reach this broker; "" = federation.host; host:port is its name'
    )
    place: str = _key("", "event place name (seed 000 §3.7.5); every broker of a federation names the same")
    description: str = _key("", "the event place's description, returned to brokers that link here")
    site: str = _key(
        "",
        "name of this broker's site; the brokers of one cluster that each link into the place set the "
        "same name, so an event published in the site is not delivered there twice",
    )
    mode: str = _key(
        "full_filter",
        "routing mode: full_filter (filters travel: no wasted events) or type_only (topic classes "
        "travel: fewer set-up messages, matched at the destination)",
        choices=("full_filter", "type_only"),
    )
    class_levels: int = _key(
        1, "topic levels that form an event type (topic class) in type_only mode", min_value=1, max_value=16
    )
    ttl: int = _key(
        16,
        "how many sites a filter reaches, counting its own (1 = stays in the site, 2 = the neighbours)",
        min_value=1,
        max_value=255,
    )
    upstream: str = _key("", 'host:port of the broker to request the place\'s one shared link to; "" = root')
    one_way: bool = _key(False, "register no filter upstream: this site only publishes into the place")
    accept_links: bool = _key(True, "accept shared links from other sites (children)")
    probe_hops: int = _key(
        3,
        "n of the n-hop upstream discovery that finds re-link targets after a crash",
        min_value=0,
        max_value=64,
    )
    probe_interval_ms: int = _key(
        10_000, "how often the upstream discovery is repeated", min_value=100, max_value=3_600_000
    )
    retry_ms: int = _key(
        2000, "an unlinked broker requests its link again after this long", min_value=50, max_value=600_000
    )
    link_timeout_ms: int = _key(
        5000, "a link request unanswered this long has failed", min_value=100, max_value=600_000
    )
    custody_grace_ms: int = _key(
        10_000,
        "a QoS>=1 event whose link broke (or published while unlinked) waits this long for the "
        "re-linked paths before it is given up",
        min_value=0,
        max_value=3_600_000,
    )
    retained: str = _key(
        "site",
        "site: retained messages stay in the site where they were published (a retained publish "
        "crosses as a live event); place: every retained write is stored by every broker of the "
        "place, last writer wins (docs/federation.md)",
        choices=("site", "place"),
    )
    tls_ca_file: str = _key(
        "",
        "PEM CA of the event place (skipmq certs init): linking brokers must present a certificate it signed",
    )
    tls_cert_file: str = _key(
        "",
        "PEM certificate naming this broker's federation name host:port (skipmq certs issue); "
        "re-read when it changes",
    )
    tls_key_file: str = _key("", "PEM private key of federation.tls_cert_file")
    insecure: bool = _key(
        False,
        "plaintext, unauthenticated federation links (anyone reaching the federation port can link "
        "as any broker); without it a federated broker needs federation.tls_ca_file, tls_cert_file "
        "and tls_key_file",
    )


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    node_id: str = _key("", 'this broker\'s id in the cluster; "" = derived from the hostname by the broker')
    data_dir: str = _key("./data", "directory for the store and other state")
    uvloop: bool = _key(True, "use uvloop as the event loop when it is installed")
    store: StoreConfig = field(default_factory=StoreConfig)
    listeners: ListenersConfig = field(default_factory=ListenersConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    pull: PullConfig = field(default_factory=PullConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    sys: SysConfig = field(default_factory=SysConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    # Not a key: notes about ignored SKIPMQ_* environment variables, for the broker to log.
    warnings: tuple[str, ...] = field(default=(), metadata={"internal": True})

    @property
    def store_path(self) -> str:
        """The SQLite file: ``store.path`` or ``<data_dir>/skipmq.db``."""
        return self.store.path or os.path.join(self.data_dir, "skipmq.db")


# --- key table derived from the dataclasses ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeySpec:
    """One configuration key (derived from the dataclass fields above)."""

    name: str  # dotted, e.g. "listeners.tcp.port"
    kind: type  # int, bool or str
    default: Any
    doc: str
    min_value: int | None
    max_value: int | None
    choices: tuple[str, ...] | None

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + self.name.upper().replace(".", "_")

    def allowed(self) -> str:
        """Human description of the allowed values."""
        if self.choices:
            return "one of " + ", ".join(repr(choice) for choice in self.choices)
        if self.kind is bool:
            return "a boolean (true/false; in env/CLI also 1/0/yes/no)"
        if self.kind is int:
            low = "" if self.min_value is None else str(self.min_value)
            high = "" if self.max_value is None else str(self.max_value)
            return f"an integer in {low}..{high}"
        return "a string"


def _walk(cls: type, prefix: str) -> Iterator[KeySpec]:
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.metadata.get("internal"):
            continue
        kind = hints[f.name]
        name = prefix + f.name
        if is_dataclass(kind):
            yield from _walk(typing.cast(type, kind), name + ".")
        else:
            yield KeySpec(
                name=name,
                kind=kind,
                default=f.default,
                doc=f.metadata["doc"],
                min_value=f.metadata["min"],
                max_value=f.metadata["max"],
                choices=f.metadata["choices"],
            )


KEYS: dict[str, KeySpec] = {spec.name: spec for spec in _walk(BrokerConfig, "")}
SECTIONS: frozenset[str] = frozenset(
    name.rsplit(".", depth)[0] for name in KEYS for depth in range(1, name.count(".") + 1)
)
_ENV_TO_KEY: dict[str, str] = {spec.env_var: name for name, spec in KEYS.items()}


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


def _flatten_file(data: Mapping[str, Any], prefix: str, source: str, out: dict[str, tuple[Any, str]]) -> None:
    for raw_key, value in data.items():
        name = prefix + raw_key
        if name in KEYS:
            if isinstance(value, dict):
                raise _bad_value(KEYS[name], value, source, f"must be {KEYS[name].allowed()}, not a table")
            out[name] = (value, source)
        elif name in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{name}: must be a table ([{name}]), got {value!r} (from {source})", key=name
                )
            _flatten_file(value, name + ".", source, out)
        else:
            while isinstance(value, dict) and len(value) == 1:  # [listener.tcp] port=1 -> listener.tcp.port
                ((leaf, value),) = value.items()
                name = f"{name}.{leaf}"
            raise _unknown_key_error(name, source)


def _read_file(path: str) -> dict[str, tuple[Any, str]]:
    source = f"file {path}"
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path!r} is not valid TOML: {exc}") from None
    out: dict[str, tuple[Any, str]] = {}
    _flatten_file(data, "", source, out)
    return out


# Kubernetes service links ("<SERVICE>_SERVICE_HOST", "<SERVICE>_PORT=tcp://...", ...)
_SERVICE_LINK = re.compile(
    r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$"
)
_SERVICE_LINK_URL = re.compile(r"^(tcp|udp|sctp)://")


TOOL_ENV_PREFIXES = ("SKIPMQ_TEST_", "SKIPMQ_ZL_")  # the test suite's knobs, not broker keys


def _is_service_link(var: str, value: str) -> bool:
    if var.endswith("_PORT") and not var.endswith("_SERVICE_PORT"):
        return bool(_SERVICE_LINK_URL.match(value))  # SKIPMQ_PORT=tcp://10.0.0.1:1883
    return bool(_SERVICE_LINK.match(var))


def _read_env(env: Mapping[str, str]) -> tuple[dict[str, tuple[Any, str]], list[str]]:
    values: dict[str, tuple[Any, str]] = {}
    warnings: list[str] = []
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var == CONFIG_FILE_ENV:
            continue
        name = _ENV_TO_KEY.get(var)
        if name is None:
            if var.startswith(TOOL_ENV_PREFIXES):
                warnings.append(f"ignored environment variable {var}: a test tool's setting, not a key")
                continue
            if not _is_service_link(var, env[var]):
                raise ConfigError(
                    f"unknown environment variable {var}: not a configuration key"
                    f"{_suggest(var, sorted(_ENV_TO_KEY))}",
                    key=var,
                )
            warnings.append(f"ignored environment variable {var}: a Kubernetes service link, not a key")
            continue
        source = f"environment variable {var}"
        values[name] = (_from_text(KEYS[name], env[var], source), source)
    return values, warnings


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a ``--set KEY=VALUE`` argument into (dotted key, typed value)."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"--set expects KEY=VALUE (e.g. limits.max_queued_messages=10), got {text!r}")
    if name not in KEYS:
        raise _unknown_key_error(name, "--set")
    spec = KEYS[name]
    return name, _check(spec, _from_text(spec, raw, "--set"), "--set")


def _read_overrides(overrides: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    values: dict[str, tuple[Any, str]] = {}
    for name, value in overrides.items():
        if name not in KEYS:
            raise _unknown_key_error(name, "command-line overrides")
        spec = KEYS[name]
        source = f"command-line override {name}"
        if isinstance(value, str) and spec.kind is not str:
            value = _from_text(spec, value, source)
        values[name] = (value, source)
    return values


def _build(cls: type, prefix: str, flat: Mapping[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.metadata.get("internal"):
            continue
        kind = hints[f.name]
        if is_dataclass(kind):
            kwargs[f.name] = _build(typing.cast(type, kind), prefix + f.name + ".", flat)
        else:
            kwargs[f.name] = flat[prefix + f.name]
    return cls(**kwargs)


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


def load_config(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> BrokerConfig:
    """Load and validate the configuration.

    ``path``: TOML file (None: ``$SKIPMQ_CONFIG`` if set, else no file). ``env``: environment
    (None: ``os.environ``). ``overrides``: dotted key -> value from the command line; string values
    are converted like environment values.
    """
    environ = os.environ if env is None else env
    if path is None:
        path = environ.get(CONFIG_FILE_ENV) or None
    layered: dict[str, tuple[Any, str]] = {name: (spec.default, "defaults") for name, spec in KEYS.items()}
    if path is not None:
        layered.update(_read_file(path))
    env_values, warnings = _read_env(environ)
    layered.update(env_values)
    layered.update(_read_overrides(overrides or {}))

    flat = {name: _check(KEYS[name], value, source) for name, (value, source) in layered.items()}
    _validate_together(flat, {name: source for name, (_value, source) in layered.items()})
    config: BrokerConfig = _build(BrokerConfig, "", flat)
    return BrokerConfig(**{**_shallow(config), "warnings": tuple(warnings)})


def _shallow(config: BrokerConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(config)}


def config_to_flat(config: BrokerConfig) -> dict[str, Any]:
    """The effective configuration as dotted key -> value (e.g. to log it at startup)."""
    out: dict[str, Any] = {}
    for name in KEYS:
        value: Any = config
        for part in name.split("."):
            value = getattr(value, part)
        out[name] = value
    return out
